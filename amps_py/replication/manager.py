"""The replication manager: an instance's destinations and accepted upstreams, and
the durable watermark that persisted acks follow.

``durable_txid`` = the highest local txid that is committed here AND acknowledged by
every destination that is currently ``sync``. Persisted acks to publishers (and
``fully_durable`` delivery) advance with it; async destinations never hold it back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from amps_py import events

from .incoming import UpstreamConnection
from .outgoing import Destination

if TYPE_CHECKING:
    from amps_py.server.instance import Instance

log = logging.getLogger("amps_py.replication")


class ReplicationManager:
    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.destinations = [Destination(instance, d) for d in instance.config.replication]
        self.upstreams: dict[str, UpstreamConnection] = {}

    @property
    def has_sync(self) -> bool:
        return any(d.sync for d in self.destinations)

    def durable_txid(self, committed: int) -> int:
        """The highest txid durable everywhere it must be (see module doc)."""
        low = committed
        for d in self.destinations:
            if d.sync and d.acked_txid < low:
                low = d.acked_txid
        return low

    async def run(self) -> None:
        """Run every outgoing destination until cancelled."""
        async with trio.open_nursery() as nursery:
            for d in self.destinations:
                nursery.start_soon(d.run)

    async def serve_incoming(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        try:
            await UpstreamConnection(self.instance, stream, peer).run()
        except Exception:
            # one bad peer must not take the instance down
            log.exception(
                "replication connection from %s failed",
                peer,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )

    def upstream_connected(self, conn: UpstreamConnection) -> None:
        old = self.upstreams.get(conn.name)
        if old is not None and old is not conn:
            log.warning(
                "instance %s connected again (%s); closing its older connection (%s)",
                conn.name,
                conn.peer,
                old.peer,
                extra=events.extra(events.REPLICATION_DISCONNECTED),
            )
            old.close()
        self.upstreams[conn.name] = conn

    def upstream_disconnected(self, conn: UpstreamConnection) -> None:
        if self.upstreams.get(conn.name) is conn:
            del self.upstreams[conn.name]
        log.info(
            "replication from %s (%s) disconnected",
            conn.name,
            conn.peer,
            extra=events.extra(events.REPLICATION_DISCONNECTED),
        )

    def statistics(self) -> dict[str, Any]:
        return {
            "destinations": [d.statistics().__dict__ for d in self.destinations],
            "upstreams": [u.statistics().__dict__ for u in self.upstreams.values()],
        }
