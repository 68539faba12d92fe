"""Peer-to-peer replication: the sans-IO link protocol (:mod:`.link`), routing rules
(:mod:`.routing`), and the trio drivers for outgoing destinations and incoming upstreams,
tied together by :class:`ReplicationManager`."""

from .link import PROTOCOL_VERSION, DownstreamLink, LinkError, UpstreamLink
from .manager import ReplicationManager
from .routing import Route

__all__ = [
    "PROTOCOL_VERSION",
    "DownstreamLink",
    "LinkError",
    "ReplicationManager",
    "Route",
    "UpstreamLink",
]
