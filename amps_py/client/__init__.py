"""The amps-py trio client: :func:`open_client`, :class:`Client`, subscriptions, SOW
queries (:class:`SowRecord`), queue consumers (``Client.ack``, ``message.ack()``,
``subscribe(..., auto_ack=True)``: :class:`QueueSubscription`), URIs."""

from amps_py.protocol import SowRecord

from .client import (
    AMPSError,
    Client,
    CommandError,
    ConnectionLost,
    Message,
    SowResult,
    SowSubscription,
    Subscription,
    open_client,
)
from .queue import QueueSubscription
from .uri import BadURI, ServerURI, parse_uri

__all__ = [
    "AMPSError",
    "BadURI",
    "Client",
    "CommandError",
    "ConnectionLost",
    "Message",
    "QueueSubscription",
    "ServerURI",
    "SowRecord",
    "SowResult",
    "SowSubscription",
    "Subscription",
    "open_client",
    "parse_uri",
]
