"""One TCP connection carrying replication both ways (back replication).

When two instances replicate to each other, the instance that opened the connection
sends its stream on it (its *upstream role*) and may receive the other instance's
stream on the same connection (its *downstream role*); the other end mirrors that.
:class:`SharedConnection` splits the frames arriving on the socket between the two
roles and gives each role a :class:`RoleStream` that looks like a plain stream, so the
link drivers run unchanged over it.

Which role a frame is for follows from its command (sans-IO, :func:`receiving_role`):
``repl_hello`` and ``repl_data`` are sent by an upstream, so they go to this end's
downstream role; ``repl_welcome`` and ``repl_ack`` go to the upstream role;
``repl_hb`` and ``repl_refuse`` name the sender's role in their ``r`` field.

Lifetime: the connection lives as long as the stream of the instance that opened it;
the stream sent back over it is a passenger that ends with it.

Frames are limited to :data:`~.link.MAX_HANDSHAKE_FRAME` bytes until one of the links
on the connection has completed its handshake (:meth:`RoleStream.handshake_done`: a
hello accepted, or a welcome received), then to :data:`~.link.MAX_REPLICATION_FRAME`.
Until then the socket is read :data:`~.prehello.HANDSHAKE_READ` bytes at a time, and a
connection the peer opened counts what it buffers against the instance's
:class:`~.prehello.PreHelloMemory` (which may close it, or another, when all such
connections together hold too much); its buffer is freed when it closes.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import trio

from amps_py import reasons
from amps_py.protocol import Frame, FrameDecoder, FrameTooLarge, ProtocolError

from .link import (
    MAX_HANDSHAKE_FRAME,
    MAX_REPLICATION_FRAME,
    LinkError,
    frame_too_large,
    not_a_peer,
)
from .prehello import HANDSHAKE_READ, PreHelloMemory

#: bytes read from the socket at a time once the handshake is done
_READ: Final = 256 * 1024

Role = Literal["up", "down", "both"]

_TO_DOWN: Final = frozenset({"repl_hello", "repl_data"})
_TO_UP: Final = frozenset({"repl_welcome", "repl_ack"})


def receiving_role(frame: Frame) -> Role:
    """Which role of the receiving end ``frame`` is for (see the module doc)."""
    command = frame.command
    if command in _TO_DOWN:
        return "down"
    if command in _TO_UP:
        return "up"
    sender = frame.header.get("r")
    if sender == "u":
        return "down"
    if sender == "d":
        return "up"
    return "both"


class RoleStream:
    """One role's view of a :class:`SharedConnection`: receives the frames for this
    role, sends through the shared socket (one sender at a time)."""

    def __init__(self, shared: SharedConnection, role: Literal["up", "down"]) -> None:
        self._shared = shared
        self.role = role
        self._send, self._receive = trio.open_memory_channel[list[Frame] | LinkError](math.inf)
        self.started = trio.Event()  # the first frame for this role arrived
        self.closed = False
        #: bytes of the frames delivered to this role
        self.bytes_in = 0

    @property
    def peer(self) -> str:
        return self._shared.peer

    def _deliver(self, item: list[Frame] | LinkError, size: int = 0) -> None:
        if not self.closed:
            self.bytes_in += size
            self._send.send_nowait(item)
            self.started.set()

    def _end(self) -> None:
        self._send.close()
        self.started.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise trio.ClosedResourceError(f"the {self.role} role of this connection is closed")
        await self._shared.send_all(data)

    def handshake_done(self) -> None:
        """This role's link completed its handshake with a peer that passed every
        check: the connection now accepts frames up to the replication limit."""
        self._shared.handshake_done()

    async def receive_frames(self) -> list[Frame]:
        """The next frames for this role; ``[]`` once the connection has ended.

        Raises:
            LinkError: the peer sent bytes that are not replication frames.
        """
        try:
            item = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return []
        if isinstance(item, LinkError):
            raise item
        return item

    async def aclose(self) -> None:
        """End this role; the other role (and the socket) carry on."""
        self.closed = True
        self._receive.close()
        await trio.lowlevel.checkpoint()


class SharedConnection:
    """Demultiplexes one replication connection into an ``up`` and a ``down`` role.

    Run :meth:`run` in a task for as long as the connection is wanted; when it ends
    (the peer closed, or the task is cancelled) both roles see the end of their stream.

    Args:
        stream: the connection.
        peer: ``host:port`` of the other end, for messages.
        prehello: for a connection the peer opened: the instance's account of bytes
            buffered before the handshake (see the module doc); None for one this
            instance opened.
    """

    def __init__(
        self, stream: trio.abc.Stream, peer: str, prehello: PreHelloMemory | None = None
    ) -> None:
        self.stream = stream
        self.peer = peer
        self.up = RoleStream(self, "up")
        self.down = RoleStream(self, "down")
        self._send_lock = trio.Lock()
        self.ended = trio.Event()
        self._decoder = FrameDecoder(MAX_HANDSHAKE_FRAME)
        self._prehello = prehello
        self._scope = trio.CancelScope()

    @property
    def handshaking(self) -> bool:
        """Whether no link on this connection has completed its handshake yet."""
        return self._decoder.max_frame_size < MAX_REPLICATION_FRAME

    def handshake_done(self) -> None:
        """Accept frames up to :data:`~.link.MAX_REPLICATION_FRAME` from now on."""
        self._decoder.max_frame_size = MAX_REPLICATION_FRAME
        if self._prehello is not None:
            self._prehello.release(self, ended=False)

    def _over_memory(self, held: int) -> None:
        """Close this connection: before its handshake it held ``held`` bytes, the most,
        while such connections together held more than the instance allows."""
        prehello = self._prehello
        assert prehello is not None
        self._decoder.discard(reasons.HANDSHAKE_MEMORY_LIMIT)
        error = LinkError(
            reasons.HANDSHAKE_MEMORY_LIMIT,
            f"this connection buffered {held} bytes without completing the replication "
            "handshake, the most of all connections doing so, which together held more "
            f"than the {prehello.limit} bytes allowed before the handshake; a peer sends "
            "its small hello at once: is something other than an amps-py instance "
            "connecting to the replication port?",
        )
        self.down._deliver(error)
        self.up._deliver(error)
        self._scope.cancel()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def run(self) -> None:
        """Read the socket and hand the frames to their roles, until the peer closes,
        sends something that is not a replication frame, or the task is cancelled."""
        decoder = self._decoder
        prehello = self._prehello
        try:
            with self._scope:
                await self._read(decoder, prehello)
        finally:
            decoder.discard("the connection closed")  # free its buffer now
            if prehello is not None:
                prehello.release(self, ended=self.handshaking)
            self.up._end()
            self.down._end()
            self.ended.set()

    async def _read(self, decoder: FrameDecoder, prehello: PreHelloMemory | None) -> None:
        try:
            while True:
                handshaking = self.handshaking
                data = await self.stream.receive_some(HANDSHAKE_READ if handshaking else _READ)
                if not data:
                    return
                decoder.receive_data(data)
                up: list[Frame] = []
                down: list[Frame] = []
                for frame in decoder.frames():
                    role = receiving_role(frame)
                    if role != "down":
                        up.append(frame)
                    if role != "up":
                        down.append(frame)
                if up:
                    self.up._deliver(up, len(data) if not down else 0)
                if down:
                    self.down._deliver(down, len(data))
                if prehello is not None and handshaking and self.handshaking:
                    for victim, held in prehello.hold(self, decoder.buffered):
                        assert isinstance(victim, SharedConnection)
                        victim._over_memory(held)
        except ProtocolError as exc:
            if isinstance(exc, FrameTooLarge):
                handshaking = decoder.max_frame_size < MAX_REPLICATION_FRAME
                error = frame_too_large(exc, handshaking=handshaking)
            else:
                error = not_a_peer(exc)
            self.down._deliver(error)
            self.up._deliver(error)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
