"""A simulated network for whole fabrics in one trio run (docs/SIMULATION.md).

Nodes are host names; a listener is ``host:port``. A connection is two pipes, one per
direction, each with the link's latency (drawn per connection from the network's
seeded RNG) and a bounded number of bytes in flight, as a socket's buffers bound
them: a sender blocks while its pipe is full, so a slow reader pushes back on its
writer as over TCP.

Faults, each of which a real network produces:

* :meth:`SimNetwork.reset` (``cut``): every connection between two hosts is reset;
  both ends fail at once (``trio.BrokenResourceError``), as after an RST.
* :meth:`SimNetwork.partition` / :meth:`SimNetwork.heal`: the hosts of different
  groups cannot reach each other. Bytes in flight between them stop (TCP keeps
  retransmitting: the connection stays open, nothing arrives) and arrive after the
  heal; a connect across the partition fails after ``connect_timeout``.
* :meth:`SimNetwork.crash`: a host's process dies (kill -9): its listeners go, its
  connections are reset on the peer's side.
* :meth:`SimNetwork.vanish`: a host's machine is gone without a word (power loss, a
  cable pulled): its listeners go and its connections become half-open, so a peer's
  bytes go nowhere and nothing ever arrives; only the peer's own timeouts notice.
* :meth:`SimNetwork.slow_reader`: a host reads at most so many bytes a second.

Everything runs on trio's clock (a ``MockClock`` in the simulator) and draws from
one ``random.Random``: the same seed and the same calls give the same timings.
"""

from __future__ import annotations

import errno
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import trio

from amps_py.sim.trace import Trace

__all__ = ["SimListener", "SimNetwork", "SimNode", "SimStream"]

#: bytes one direction of a connection holds in flight before the sender blocks
DEFAULT_PIPE_BYTES: Final = 256 * 1024
#: one-way latency range, seconds, drawn per connection
DEFAULT_LATENCY: Final = (0.0002, 0.002)
#: how long a connect across a partition takes to fail (a SYN that is never answered)
DEFAULT_CONNECT_TIMEOUT: Final = 3.0

Handler = Callable[["SimStream"], Awaitable[object]]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a simulated address is host:port, e.g. a:9007; got {text!r}")
    return host, int(port)


@dataclass(eq=False)
class _Pipe:
    """One direction of a connection."""

    latency: float
    capacity: int
    chunks: deque[tuple[float, bytes]] = field(default_factory=deque)
    in_flight: int = 0
    eof: bool = False  # the sender sent its FIN; delivered after the bytes before it
    broken: bool = False  # reset: both ends fail
    stalled: bool = False  # partitioned or half-open: nothing is delivered
    lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def wake(self) -> None:
        self.lot.unpark_all()


class _FakeSocket:
    """What code asks of a ``trio.SocketStream``'s ``socket``: its two addresses
    (options set on it do nothing)."""

    def __init__(self, local: tuple[str, int], remote: tuple[str, int]) -> None:
        self._local = local
        self._remote = remote

    def getsockname(self) -> tuple[str, int]:
        return self._local

    def getpeername(self) -> tuple[str, int]:
        return self._remote

    def setsockopt(self, *args: object) -> None:
        return None


class SimStream(trio.abc.HalfCloseableStream):
    """One end of a simulated connection: a ``trio`` stream, with a ``socket``
    attribute answering ``getpeername``/``getsockname`` like a ``SocketStream``'s."""

    def __init__(
        self,
        network: SimNetwork,
        connection: _Connection,
        host: str,
        outgoing: _Pipe,
        incoming: _Pipe,
        socket: _FakeSocket,
    ) -> None:
        self._network = network
        self._connection = connection
        self.host = host
        self._out = outgoing
        self._in = incoming
        self.socket = socket
        self._closed = False
        self._sending = False
        self._receiving = False

    # -- sending -------------------------------------------------------------------
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            view = memoryview(bytes(data))
            while view:
                self._check_sendable()
                room = self._out.capacity - self._out.in_flight
                if room <= 0:
                    await self._out.lot.park()
                    continue
                chunk, view = view[:room], view[room:]
                self._put(bytes(chunk))
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    def _check_sendable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed")
        if self._out.broken:
            raise trio.BrokenResourceError("connection reset by peer")
        if self._out.eof:
            raise trio.ClosedResourceError("send_eof was called on this stream")

    def _put(self, chunk: bytes) -> None:
        now = trio.current_time()
        last = self._out.chunks[-1][0] if self._out.chunks else now
        self._out.chunks.append((max(now + self._out.latency, last), chunk))
        self._out.in_flight += len(chunk)
        self._network.trace.record(now, self.host, "send", f"{self._connection.name} {len(chunk)}")
        self._out.wake()

    async def wait_send_all_might_not_block(self) -> None:
        while not self._out.broken and self._out.in_flight >= self._out.capacity:
            await self._out.lot.park()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed")
        if not self._out.eof:
            self._out.eof = True
            self._out.wake()

    # -- receiving -----------------------------------------------------------------
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            return await self._receive(max_bytes or 65536)
        finally:
            self._receiving = False

    async def _receive(self, max_bytes: int) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        pipe = self._in
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this stream was closed")
            if pipe.broken:
                raise trio.BrokenResourceError("connection reset by peer")
            due = pipe.chunks[0][0] if pipe.chunks and not pipe.stalled else None
            now = trio.current_time()
            if due is not None and due <= now:
                data = self._take(max_bytes)
                rate = self._network.read_rate(self.host)
                if rate:
                    await trio.sleep(len(data) / rate)
                else:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            if due is None and pipe.eof and not pipe.chunks:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return b""
            with trio.move_on_at(due if due is not None else float("inf")):
                await pipe.lot.park()

    def _take(self, max_bytes: int) -> bytes:
        pipe = self._in
        now = trio.current_time()
        parts: list[bytes] = []
        size = 0
        while pipe.chunks and pipe.chunks[0][0] <= now and size < max_bytes:
            due, chunk = pipe.chunks.popleft()
            if size + len(chunk) > max_bytes:
                keep = max_bytes - size
                pipe.chunks.appendleft((due, chunk[keep:]))
                chunk = chunk[:keep]
            parts.append(chunk)
            size += len(chunk)
        pipe.in_flight -= size
        pipe.wake()  # room for the sender
        self._network.trace.record(now, self.host, "recv", f"{self._connection.name} {size}")
        return b"".join(parts)

    # -- closing -------------------------------------------------------------------
    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._out.eof = True
            self._out.wake()
            self._in.wake()
            self._connection.closed_by(self)
        await trio.lowlevel.checkpoint()


@dataclass(eq=False)
class _Connection:
    name: str
    client_host: str
    server_host: str
    forward: _Pipe  # client -> server
    backward: _Pipe  # server -> client
    ends: list[SimStream] = field(default_factory=list)
    closed: set[int] = field(default_factory=set)
    half_open: bool = False  # one host vanished: nothing will ever arrive

    @property
    def pipes(self) -> tuple[_Pipe, _Pipe]:
        return self.forward, self.backward

    def hosts(self) -> frozenset[str]:
        return frozenset((self.client_host, self.server_host))

    def closed_by(self, end: SimStream) -> None:
        self.closed.add(id(end))

    def finished(self) -> bool:
        return len(self.closed) == 2 or any(pipe.broken for pipe in self.pipes)


class SimListener(trio.abc.Listener[SimStream]):
    """A listening port of the simulated network (what ``trio.open_tcp_listeners``
    gives, with a ``socket`` answering ``getsockname``): ``accept`` returns the next
    connection made to it. Closed by ``aclose``, or by a crash of its host."""

    def __init__(self, network: SimNetwork, host: str, port: int, backlog: int) -> None:
        self._network = network
        self.address = (host, port)
        self.socket = _FakeSocket(self.address, ("", 0))
        self._send, self._receive = trio.open_memory_channel[SimStream](backlog)

    def offer(self, stream: SimStream) -> bool:
        """Queue a new connection for ``accept``; False when the backlog is full or the
        listener closed (the connect is refused)."""
        try:
            self._send.send_nowait(stream)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def accept(self) -> SimStream:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise trio.ClosedResourceError("the listener was closed (its host crashed)") from None

    def shut(self) -> None:
        """Stop taking connections (the host crashed): a pending ``accept`` fails."""
        self._send.close()

    async def aclose(self) -> None:
        self.shut()
        self._network.forget_listener(self)
        await self._receive.aclose()


class SimNetwork:
    """The simulated network: listeners, connections and the faults on them.

    ``rng`` draws each connection's latency; ``trace`` records what happened (sends,
    receives, connects, faults) on trio's clock."""

    def __init__(
        self,
        rng: random.Random,
        trace: Trace,
        *,
        latency: tuple[float, float] = DEFAULT_LATENCY,
        pipe_bytes: int = DEFAULT_PIPE_BYTES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self._rng = rng
        self.trace = trace
        self._latency = latency
        self._pipe_bytes = pipe_bytes
        self._connect_timeout = connect_timeout
        self._listeners: dict[tuple[str, int], SimListener] = {}
        self._next_listen_port: dict[str, int] = {}
        self._connections: list[_Connection] = []
        self._groups: list[frozenset[str]] = []
        self._read_rates: dict[str, float] = {}
        self._next_port: dict[str, int] = {}
        self._count = 0

    # -- listening and connecting --------------------------------------------------
    def listen(self, address: str, backlog: int = 128) -> SimListener:
        """A listener on ``address`` (``host:port``; port 0 picks a free one)."""
        host, port = _address(address)
        if port == 0:
            port = self._next_listen_port.get(host, 9000) + 1
            self._next_listen_port[host] = port
        if (host, port) in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{host}:{port} is in use in the simulated network")
        listener = SimListener(self, host, port, backlog)
        self._listeners[(host, port)] = listener
        self.trace.record(trio.current_time(), host, "listen", f"{host}:{port}")
        return listener

    def forget_listener(self, listener: SimListener) -> None:
        """Take ``listener`` off its port (it was closed)."""
        if self._listeners.get(listener.address) is listener:
            del self._listeners[listener.address]

    async def serve(
        self,
        address: str,
        handler: Handler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections on ``address`` until cancelled or the host crashes,
        running ``handler(stream)`` for each in a task of its own (the stream is
        closed when it returns)."""
        listener = self.listen(address)
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except trio.ClosedResourceError:
                    return
                nursery.start_soon(self._handle, handler, stream)

    async def _handle(self, handler: Handler, stream: SimStream) -> None:
        try:
            await handler(stream)
        finally:
            await stream.aclose()

    async def connect(self, source: str, address: str) -> SimStream:
        """Open a connection from host ``source`` to ``address``; ``OSError`` when
        nothing listens there (refused at once) or a partition is between (after the
        connect timeout)."""
        host, port = _address(address)
        latency = self._rng.uniform(*self._latency)
        await trio.sleep(latency)
        if not self._reachable(source, host):
            await trio.sleep(self._connect_timeout)
            self.trace.record(trio.current_time(), source, "connect-timeout", address)
            raise OSError(errno.ETIMEDOUT, f"connecting to {address}: timed out")
        listener = self._listeners.get((host, port))
        if listener is None:
            self.trace.record(trio.current_time(), source, "connect-refused", address)
            raise OSError(errno.ECONNREFUSED, f"connecting to {address}: connection refused")
        client_end, server_end = self._open(source, (host, port), latency)
        if not listener.offer(server_end):
            self._break(self._connections[-1])
            self.trace.record(trio.current_time(), source, "connect-refused", address)
            raise OSError(errno.ECONNREFUSED, f"connecting to {address}: backlog full")
        self.trace.record(trio.current_time(), source, "connect", self._connections[-1].name)
        return client_end

    def _open(
        self, source: str, target: tuple[str, int], latency: float
    ) -> tuple[SimStream, SimStream]:
        self._count += 1
        port = self._next_port.get(source, 40000) + 1
        self._next_port[source] = port
        local = (source, port)
        name = f"{source}:{port}->{target[0]}:{target[1]}"
        forward = _Pipe(latency, self._pipe_bytes)
        backward = _Pipe(latency, self._pipe_bytes)
        connection = _Connection(name, source, target[0], forward, backward)
        stall = not self._reachable(source, target[0])
        forward.stalled = backward.stalled = stall
        client = SimStream(self, connection, source, forward, backward, _FakeSocket(local, target))
        server = SimStream(
            self, connection, target[0], backward, forward, _FakeSocket(target, local)
        )
        connection.ends = [client, server]
        self._connections = [c for c in self._connections if not c.finished()]
        self._connections.append(connection)
        return client, server

    # -- faults --------------------------------------------------------------------
    def _reachable(self, a: str, b: str) -> bool:
        if a == b or not self._groups:
            return True
        return any(a in group and b in group for group in self._groups)

    def _between(self, hosts: Iterable[str]) -> list[_Connection]:
        wanted = set(hosts)
        return [c for c in self._connections if c.hosts() & wanted and not c.finished()]

    def reset(self, a: str, b: str) -> int:
        """Reset every connection between hosts ``a`` and ``b``; returns how many."""
        hit = [c for c in self._between([a]) if c.hosts() == frozenset((a, b))]
        for connection in hit:
            self._break(connection)
        self.trace.record(trio.current_time(), a, "reset", f"{b} {len(hit)}")
        return len(hit)

    def _break(self, connection: _Connection) -> None:
        for pipe in connection.pipes:
            pipe.broken = True
            pipe.wake()

    def partition(self, *groups: Iterable[str]) -> None:
        """Only hosts in one group reach each other until :meth:`heal` (a host in no
        group reaches nobody)."""
        self._groups = [frozenset(group) for group in groups]
        for connection in self._connections:
            stall = not self._reachable(connection.client_host, connection.server_host)
            for pipe in connection.pipes:
                pipe.stalled = stall or pipe.stalled
                pipe.wake()
        shown = " | ".join(",".join(sorted(group)) for group in self._groups)
        self.trace.record(trio.current_time(), "-", "partition", shown)

    def heal(self) -> None:
        """End the partition: bytes held back arrive, connects succeed again."""
        self._groups = []
        for connection in self._connections:
            if not connection.finished() and not connection.half_open:
                for pipe in connection.pipes:
                    pipe.stalled = False
                    pipe.wake()
        self.trace.record(trio.current_time(), "-", "heal", "")

    def crash(self, host: str) -> None:
        """``host``'s process died: its listeners close and its connections reset."""
        self._drop_listeners(host)
        for connection in self._between([host]):
            self._break(connection)
        self.trace.record(trio.current_time(), host, "crash", "")

    def vanish(self, host: str) -> None:
        """``host`` is gone without a word: its listeners close and its connections
        stay open on the peer's side with nothing ever arriving (half-open)."""
        self._drop_listeners(host)
        for connection in self._between([host]):
            connection.half_open = True
            for pipe in connection.pipes:
                pipe.stalled = True
                pipe.wake()
        self.trace.record(trio.current_time(), host, "vanish", "")

    def _drop_listeners(self, host: str) -> None:
        for key, listener in list(self._listeners.items()):
            if key[0] == host:
                del self._listeners[key]
                listener.shut()

    def node(self, host: str) -> SimNode:
        """``host``'s view of the network (see :class:`SimNode`)."""
        return SimNode(self, host)

    def slow_reader(self, host: str, bytes_per_second: float | None) -> None:
        """``host`` reads at most ``bytes_per_second`` (None: as fast as it can)."""
        if bytes_per_second:
            self._read_rates[host] = bytes_per_second
        else:
            self._read_rates.pop(host, None)
        self.trace.record(trio.current_time(), host, "slow-reader", str(bytes_per_second))

    def read_rate(self, host: str) -> float | None:
        return self._read_rates.get(host)


class SimNode:
    """One host's view of the network: what ``amps_py.net`` asks of a network
    (``open_tcp_stream``, ``open_tcp_listeners``), its connections made from
    ``host``."""

    def __init__(self, network: SimNetwork, host: str) -> None:
        self.network = network
        self.host = host

    async def open_tcp_stream(self, host: str, port: int) -> SimStream:
        return await self.network.connect(self.host, f"{host}:{port}")

    async def open_tcp_listeners(self, port: int, *, host: str | None = None) -> list[SimListener]:
        await trio.lowlevel.checkpoint()
        return [self.network.listen(f"{self.host}:{port}")]
