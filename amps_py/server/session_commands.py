"""The commands a connection answers about itself: ``heartbeat``, ``flush``,
``start_timer`` and ``stop_timer``.

The protocol state (:class:`~amps_py.protocol.server.connection.ServerConnection`)
decides the answers and the heartbeat timing; these handlers give it the clock and
send what it returns, and :func:`heartbeat_loop` beats in time (a task of the session:
it ends with the connection, or closes it, reason ``heartbeat``, when the client has
been silent too long). Each takes the narrow :class:`ConnectionCommandsSession`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from amps_py import events
from amps_py.protocol import Frame
from amps_py.protocol.server.commands import ack_types

if TYPE_CHECKING:
    from amps_py.protocol.server.connection import ServerConnection

__all__ = [
    "ConnectionCommandsSession",
    "heartbeat_loop",
    "on_flush",
    "on_heartbeat",
    "on_start_timer",
    "on_stop_timer",
]

#: the session's logger: these lines are a connection's, as before they moved here
log = logging.getLogger("amps_py.server.session")


class ConnectionCommandsSession(Protocol):
    """What these commands use of their session."""

    @property
    def conn(self) -> ServerConnection: ...
    @property
    def client_name(self) -> str: ...
    @property
    def awaiting_persisted(self) -> int:
        """How many of this publisher's seqs wait to be durable."""
        ...

    def send(self, data: bytes) -> None: ...

    def send_all(self, frames: list[bytes]) -> None: ...

    def close(self, reason: str) -> None: ...

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None: ...


def on_heartbeat(session: ConnectionCommandsSession, frame: Frame) -> None:
    """``heartbeat``: answer, and start beating at the first ``start`` (also when its
    ack types are unknown and it is refused)."""
    clock = session.conn.heartbeat
    beating = clock.interval > 0
    try:
        session.send_all(session.conn.start_heartbeat(frame.header, trio.current_time()))
    finally:
        if not beating and clock.interval > 0:
            session.start_soon(heartbeat_loop, session)


async def heartbeat_loop(session: ConnectionCommandsSession) -> None:
    """Send a beat whenever one is due; close the connection once the client has been
    silent past the grace (:class:`~amps_py.protocol.server.heartbeat.HeartbeatClock`)."""
    clock = session.conn.heartbeat
    while True:
        await trio.sleep_until(clock.due)
        tick = clock.tick(trio.current_time())
        session.send(tick.beat)
        if tick.silent is not None:
            log.warning(
                "client %r sent nothing for %.1f s (heartbeat %.1f s); disconnecting",
                session.client_name,
                tick.silent,
                tick.interval,
                extra=events.extra(events.CLIENT_HEARTBEAT_MISSED),
            )
            session.close("heartbeat")
            return


def on_start_timer(session: ConnectionCommandsSession, frame: Frame) -> None:
    """``start_timer`` (:meth:`ServerConnection.start_timer`)."""
    session.send_all(session.conn.start_timer(frame.header, time.monotonic()))


def on_stop_timer(session: ConnectionCommandsSession, frame: Frame) -> None:
    """``stop_timer`` (:meth:`ServerConnection.stop_timer`).

    Raises:
        CommandFailed: no ``start_timer`` came first on this connection.
    """
    session.send_all(session.conn.stop_timer(frame.header, time.monotonic()))


def on_flush(session: ConnectionCommandsSession, frame: Frame) -> None:
    """``flush``: answered at once, or (``persisted``) once nothing is in flight
    (:meth:`~amps_py.protocol.server.acks.PublishAcks.flush`)."""
    header = frame.header
    acks = ack_types(header) or frozenset({"processed"})
    session.send_all(session.conn.publish_acks.flush(header, acks, session.awaiting_persisted))
