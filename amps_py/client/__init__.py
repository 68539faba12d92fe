"""The amps-py trio client: :func:`open_client`, :class:`Client`, subscriptions, URIs."""

from .client import (
    AMPSError,
    Client,
    CommandError,
    ConnectionLost,
    Message,
    Subscription,
    open_client,
)
from .uri import BadURI, ServerURI, parse_uri

__all__ = [
    "AMPSError",
    "BadURI",
    "Client",
    "CommandError",
    "ConnectionLost",
    "Message",
    "ServerURI",
    "Subscription",
    "open_client",
    "parse_uri",
]
