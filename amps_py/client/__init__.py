"""The amps-py trio client: :func:`open_client`, :class:`Client`, subscriptions, SOW
queries (:class:`SowRecord`), queue consumers (``Client.ack``, ``message.ack()``,
``subscribe(..., auto_ack=True)``: :class:`QueueSubscription`), URIs, and the HA client
(:func:`open_ha_client`: failover, publish and bookmark stores, heartbeats, resumed
``sow_and_subscribe``, queue consumers)."""

from amps_py.protocol import SowRecord

from .bookmark_store import FileBookmarkStore, MemoryBookmarkStore
from .client import (
    AMPSError,
    Client,
    CommandError,
    ConnectionLost,
    Message,
    SowResult,
    SowSubscription,
    Subscription,
)
from .connect import open_client
from .ha import (
    CONNECTED,
    DISCONNECTED,
    FAILED_OVER,
    RESUBSCRIBED,
    HAClient,
    HAMessage,
    HASowSubscription,
    HASubscription,
    NoServerReachable,
    ServerSilent,
)
from .ha_open import open_ha_client
from .publish_store import FilePublishStore, MemoryPublishStore
from .queue import QueueSubscription
from .uri import BadURI, ServerURI, parse_uri

__all__ = [
    "CONNECTED",
    "DISCONNECTED",
    "FAILED_OVER",
    "RESUBSCRIBED",
    "AMPSError",
    "BadURI",
    "Client",
    "CommandError",
    "ConnectionLost",
    "FileBookmarkStore",
    "FilePublishStore",
    "HAClient",
    "HAMessage",
    "HASowSubscription",
    "HASubscription",
    "MemoryBookmarkStore",
    "MemoryPublishStore",
    "Message",
    "NoServerReachable",
    "QueueSubscription",
    "ServerSilent",
    "ServerURI",
    "SowRecord",
    "SowResult",
    "SowSubscription",
    "Subscription",
    "open_client",
    "open_ha_client",
    "parse_uri",
]
