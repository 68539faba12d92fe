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
"""

from __future__ import annotations

import math
import struct
from typing import Final, Literal

import trio

from amps_py.protocol import ProtocolError
from amps_py.protocol.codec import split_header

Role = Literal["up", "down", "both"]

_LEN = struct.Struct(">I")
#: the header of every replication frame fits in this many bytes
_HEADER_PEEK: Final = 4096
_TO_DOWN: Final = frozenset({"repl_hello", "repl_data"})
_TO_UP: Final = frozenset({"repl_welcome", "repl_ack"})


def receiving_role(header_and_more: bytes) -> Role:
    """Which role of the receiving end a frame (its body, or the first bytes of it) is
    for. A frame this cannot read goes to ``down``: on the accepting side that is the
    role whose link reports garbage as "not a replication peer"."""
    try:
        header, _ = split_header(header_and_more)
    except ProtocolError:
        return "down"
    command = header.get("command", header.get("c"))
    if command in _TO_DOWN:
        return "down"
    if command in _TO_UP:
        return "up"
    sender = header.get("r")
    if sender == "u":
        return "down"
    if sender == "d":
        return "up"
    return "both"


class RoleStream(trio.abc.Stream):
    """One role's view of a :class:`SharedConnection`: receives the frames for this
    role, sends through the shared socket (one sender at a time)."""

    def __init__(self, shared: SharedConnection, role: Literal["up", "down"]) -> None:
        self._shared = shared
        self.role = role
        self._send, self._receive = trio.open_memory_channel[bytes](math.inf)
        self.started = trio.Event()  # the first frame for this role arrived
        self.closed = False

    def _deliver(self, frame: bytes) -> None:
        if not self.closed:
            self._send.send_nowait(frame)
            self.started.set()

    def _end(self) -> None:
        self._send.close()
        self.started.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise trio.ClosedResourceError(f"the {self.role} role of this connection is closed")
        await self._shared.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._shared.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next frame(s) for this role; ``b""`` once the connection has ended."""
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return b""

    async def aclose(self) -> None:
        """End this role; the other role (and the socket) carry on."""
        self.closed = True
        self._receive.close()
        await trio.lowlevel.checkpoint()


class SharedConnection:
    """Demultiplexes one replication connection into an ``up`` and a ``down`` role.

    Run :meth:`run` in a task for as long as the connection is wanted; when it ends
    (the peer closed, or the task is cancelled) both roles see the end of their stream.
    """

    def __init__(self, stream: trio.abc.Stream, peer: str) -> None:
        self.stream = stream
        self.peer = peer
        self.up = RoleStream(self, "up")
        self.down = RoleStream(self, "down")
        self._send_lock = trio.Lock()
        self.ended = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def run(self) -> None:
        """Read the socket and hand each complete frame to its role, until the peer
        closes or the task is cancelled."""
        buf = bytearray()
        try:
            while True:
                data = await self.stream.receive_some(256 * 1024)
                if not data:
                    return
                buf += data
                pos = 0
                end = len(buf)
                while end - pos >= 4:
                    (size,) = _LEN.unpack_from(buf, pos)
                    if end - pos - 4 < size:
                        break
                    frame = bytes(buf[pos : pos + 4 + size])
                    role = receiving_role(frame[4 : 4 + min(size, _HEADER_PEEK)])
                    if role != "down":
                        self.up._deliver(frame)
                    if role != "up":
                        self.down._deliver(frame)
                    pos += 4 + size
                if pos:
                    del buf[:pos]
                if end - pos >= 4 and _LEN.unpack_from(buf, 0)[0] > 1 << 30:
                    # a length no replication peer sends: let the down role see the
                    # garbage and refuse it
                    self.down._deliver(bytes(buf))
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.up._end()
            self.down._end()
            self.ended.set()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.aclose()
