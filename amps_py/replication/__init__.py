"""Peer-to-peer replication: the sans-IO link protocol (:mod:`.link`), routing rules
(:mod:`.routing`), validation on connect (:mod:`.validation`), the whole-fabric
topology check (:mod:`.fabric`, pure), and the trio drivers for outgoing destinations
and incoming upstreams, tied together by :class:`ReplicationManager`.

The pure parts import no trio; :class:`ReplicationManager` (which does) is loaded on
first use, so tools such as ``amps-py config fabric`` stay trio-free.
"""

from typing import TYPE_CHECKING, Any

from .link import PROTOCOL_VERSION, DownstreamLink, LinkError, UpstreamLink
from .routing import Route

if TYPE_CHECKING:
    from .manager import ReplicationManager

__all__ = [
    "PROTOCOL_VERSION",
    "DownstreamLink",
    "LinkError",
    "ReplicationManager",
    "Route",
    "UpstreamLink",
]


def __getattr__(name: str) -> Any:
    if name == "ReplicationManager":
        from .manager import ReplicationManager

        return ReplicationManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
