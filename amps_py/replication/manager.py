"""The replication manager: an instance's destinations and accepted upstreams, and
which of them persisted acks wait for.

A record is durable once it is committed here and acknowledged by every destination
that is currently ``sync`` *and that the record is routed to*
(:meth:`.routing.Route.accepts`: topic, message type, content filter, passthrough,
loop prevention). :meth:`ReplicationManager.sync_holders` names the sync destinations;
the server's :class:`~amps_py.server.durable_window.DurableWindow` asks each
(:meth:`.outgoing.Destination.routed`) which records it holds and follows their
``acked_txid``. Persisted acks to publishers advance per record; ``fully_durable``
delivery, bookmark replay for it and the bookmark subscriptions' persisted acks follow
the watermark below which every record is durable. Async (and downgraded)
destinations, and sync ones a record is not routed to, never hold it.

Acknowledgements to this instance's own upstreams are not held by its sync
destinations: a received record is acknowledged upstream once it is committed here
(:mod:`.incoming`).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from amps_py import events

from .incoming import UpstreamConnection, UpstreamHost
from .mux import SharedConnection
from .outgoing import Destination
from .prehello import TRIM_INTERVAL, PreHelloMemory

log = logging.getLogger("amps_py.replication")


class ReplicationManager:
    def __init__(self, instance: UpstreamHost) -> None:
        self.instance = instance
        self.destinations = [Destination(instance, d) for d in instance.config.replication]
        self.upstreams: dict[str, UpstreamConnection] = {}
        #: bytes buffered by connections to the replication port before their handshake
        self.prehello = PreHelloMemory()

    def sync_holders(self) -> list[Destination]:
        """The destinations persisted acks wait for now: sync, not downgraded (each
        holds only the records routed to it; see the module doc)."""
        return [d for d in self.destinations if d.sync]

    async def run(self) -> None:
        """Run every outgoing destination, and the return of memory left by
        connections before their handshake, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._return_memory)
            for d in self.destinations:
                nursery.start_soon(self._supervise, d)

    async def _return_memory(self) -> None:
        """Every second: hand back what connections that never completed their
        handshake left, when enough did (:meth:`PreHelloMemory.tick`)."""
        while True:
            await trio.sleep(TRIM_INTERVAL)
            self.prehello.tick()

    async def _supervise(self, destination: Destination) -> None:
        """Run one destination; an unexpected failure is logged and the destination
        starts over (it resyncs from the peer's cursor), the instance keeps serving."""
        while True:
            try:
                await destination.run()
            except Exception:
                log.exception(
                    "destination %s failed unexpectedly; restarting it in 1 s",
                    destination.name,
                    extra=events.extra(events.REPLICATION_LINK_ERROR),
                )
                destination.connected = False
                self.instance.replication_changed()
                await trio.sleep(1)

    async def serve_incoming(self, stream: trio.SocketStream) -> None:
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        await self.serve_connection(stream, peer)

    async def serve_connection(self, stream: trio.abc.Stream, peer: str) -> None:
        """Serve one connection an upstream opened (plain or TLS, handshake done)."""
        shared = SharedConnection(stream, peer, self.prehello)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(shared.run)
                # the connection lives as long as the stream of the instance that
                # opened it; a destination streaming back over it ends with it
                await UpstreamConnection(self.instance, shared.down, peer, shared).run()
                nursery.cancel_scope.cancel()
        except Exception:
            # one bad peer must not take the instance down
            log.exception(
                "replication connection from %s failed",
                peer,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )

    def upstream_connected(self, conn: UpstreamConnection) -> None:
        """``conn`` (a connection the peer opened, or a stream back over one this
        instance opened) passed its hello checks: record it, take this instance's
        stream back over it when the tie rule says so (:meth:`Destination.attach`),
        else end the reconnect back-off of the destination to that peer."""
        old = self.upstreams.get(conn.name)
        if old is not None and old is not conn:
            if conn.shared is None and old.shared is not None and self.keeps_own_link(conn.name):
                # both dialed (a pair starting together, or reconnecting at once): the
                # tie rule keeps this instance's connection, and the peer's stream now
                # comes back over it
                log.info(
                    "instance %s replicates back over this instance's connection (%s); "
                    "closing the connection it opened (%s): of the two connections a "
                    "mutually replicating pair opens, the one the lower name opened is kept",
                    conn.name,
                    conn.peer,
                    old.peer,
                    extra=events.extra(events.REPLICATION_DISCONNECTED),
                )
            else:
                log.warning(
                    "instance %s connected again (%s); closing its older connection (%s)",
                    conn.name,
                    conn.peer,
                    old.peer,
                    extra=events.extra(events.REPLICATION_DISCONNECTED),
                )
            old.close()
        self.upstreams[conn.name] = conn
        if conn.shared is None:
            return  # a stream back over a connection this instance opened
        if conn.back_offered:
            destination = self.back_destination(conn.name, conn.group)
            if destination is not None and destination.attach(conn.shared, conn.name):
                return
        # the peer opened a connection to this instance, so it is up: a destination to
        # it that waits out its reconnect back-off dials now (the tie rule keeps the
        # connection the lower name opens, so this one may not carry the stream)
        for d in self.destinations:
            if d.config.inet_addrs and conn.name in (d.name, d.remote_name):
                d.peer_connected(conn.name)

    def keeps_own_link(self, peer_name: str) -> bool:
        """Whether, of the two connections this instance and ``peer_name`` may open to
        each other, the tie rule keeps this instance's (:meth:`Destination.attach`): it
        dials the peer, offering the stream back, and its name sorts first. The peer
        then closes the connection it opened as soon as this one reaches it."""
        return peer_name > self.instance.name and any(
            d.config.inet_addrs and peer_name in (d.name, d.remote_name)
            for d in self.destinations
        )

    def back_destination(self, name: str, group: str) -> Destination | None:
        """The destination that may replicate back over a connection from instance
        ``name`` of ``group``: the one named after it, else a destination without
        ``InetAddr`` (it only ever replicates over the peer's connections) whose Group
        is ``group``."""
        for d in self.destinations:
            if d.name == name:
                return d
        for d in self.destinations:
            if not d.config.inet_addrs and d.config.group == group:
                return d
        return None

    def reset_upstreams(self, why: str) -> None:
        """Close every incoming replication connection (each upstream reconnects and
        resends from what this journal holds)."""
        for conn in list(self.upstreams.values()):
            log.warning(
                "closing replication from %s (%s): %s",
                conn.name,
                conn.peer,
                why,
                extra=events.extra(events.REPLICATION_DISCONNECTED),
            )
            conn.close()

    def upstream_disconnected(self, conn: UpstreamConnection) -> None:
        if self.upstreams.get(conn.name) is conn:
            del self.upstreams[conn.name]
        log.info(
            "replication from %s (%s) disconnected",
            conn.name,
            conn.peer,
            extra=events.extra(events.REPLICATION_DISCONNECTED),
        )

    def connected_peers(self) -> set[str]:
        """The instances replicating into this one now (their link is up): the ones
        known reachable through replication."""
        return set(self.upstreams)

    def statistics(self) -> dict[str, Any]:
        return {
            "destinations": [d.statistics().__dict__ for d in self.destinations],
            "upstreams": [u.statistics().__dict__ for u in self.upstreams.values()],
        }
