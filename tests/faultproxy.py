"""A fault-injecting TCP proxy for tests: put it between two peers and break the network.

One :class:`FaultProxy` accepts connections on a listen address and forwards each one to
a fixed target, both directions. Faults can be switched at run time:

- :meth:`FaultProxy.cut` closes every current connection at once; new ones are accepted.
- :meth:`FaultProxy.blackhole` keeps connections open but silently drops every byte in
  both directions. Connections accepted meanwhile are held without reaching the target
  (like a partition: the SYN got through to the proxy, nothing gets further) and are
  connected to the target once the blackhole lifts.
- :meth:`FaultProxy.delay` adds latency to every chunk, keeping order (pipelined, like
  netem: a 200 ms delay does not turn into 200 ms per chunk of throughput).
- :meth:`FaultProxy.bandwidth` caps each direction of each connection.
- :meth:`FaultProxy.refuse` closes new connections as soon as they are accepted.
- :meth:`FaultProxy.random_drops` cuts connections at seeded random times: each
  connection lives for an exponentially distributed time, drawn in connection order from
  one ``random.Random(seed)``, so the same seed and the same connection order give the
  same plan (:meth:`FaultProxy.drop_plan`).
- :meth:`FaultProxy.heal` clears every fault.

:meth:`FaultProxy.statistics` counts connections accepted, refused and cut, and bytes
each way.

Use in-process (same trio run as the test)::

    async with open_fault_proxy("127.0.0.1", server_port, seed=7) as proxy:
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.listen_port)
        proxy.blackhole(True)

or as a program, driven from another process through the control port::

    python tests/faultproxy.py --listen 127.0.0.1:0 --target 127.0.0.1:9104 \\
        --control 127.0.0.1:0 [--seed 7] [--ready-file proxy.json]

When it is ready the program prints one JSON line (also written to ``--ready-file``)::

    {"listen": "127.0.0.1:40123", "control": "127.0.0.1:40124", "target": ..., "seed": 7,
     "pid": 4242}

Control protocol: one command per line on the control port, one JSON object per line
back (``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``). Commands::

    cut                      close every current connection (reply has "cut": N)
    blackhole on|off         drop every byte, keep connections open
    delay SECONDS            latency per chunk, each direction (0 = none)
    bandwidth BYTES|off      bytes per second per direction per connection
    refuse on|off            close new connections at once
    random_drops P [SEED]    seeded random cuts, P per connection per second
    random_drops off
    heal                     clear every fault
    stats                    counters and current faults

:class:`ProxyControl` is a small synchronous client for that port (pytest code that runs
proxies as subprocesses).

Resource handling: each forwarded connection owns its two sockets and closes both when
it ends (cut, drop, peer close or error). Cancelling :meth:`FaultProxy.serve` closes
everything. Error handling: a target that cannot be reached closes the accepted
connection and counts ``upstream_failures``; errors on one connection never reach the
others or the listener.

The fault methods are synchronous and must be called from the trio thread that runs the
proxy (or through the control port).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import trio

#: Bytes read from a socket at once. 64 KiB matches a typical socket buffer.
CHUNK_SIZE: Final = 64 * 1024
#: Chunks a direction may hold while they wait out the delay or the bandwidth cap. Bounded,
#: so a slow direction pushes back on the sender the way a full TCP window would.
PIPELINE_CHUNKS: Final = 256
#: With a bandwidth cap, a chunk is sent in slices worth this many seconds at the current
#: rate, so the cap holds over short windows and not just on average.
PACING_SLICE_SECONDS: Final = 0.02
#: The longest control line accepted; commands are a few words.
MAX_CONTROL_LINE: Final = 1024

_Item = tuple[float, bytes] | None  # (due time, data); None means end of stream


@dataclass(frozen=True)
class ProxyStatistics:
    """Counters and current faults of a :class:`FaultProxy`.

    Attributes:
        accepted: connections accepted on the listen port (refused ones included).
        refused: connections closed at once because ``refuse`` was on.
        active: connections open now.
        bytes_to_target: bytes forwarded from clients to the target.
        bytes_to_client: bytes forwarded from the target to clients.
        dropped_bytes: bytes read but thrown away (blackhole).
        in_flight: bytes read and queued, waiting out the delay or the bandwidth cap.
        cuts: connections closed by a fault (``cut`` or a random drop).
        random_cuts: the part of ``cuts`` due to random drops.
        upstream_failures: accepted connections whose target could not be reached.
        blackhole, delay, bandwidth, refusing, drop_rate: the faults in force.
    """

    accepted: int
    refused: int
    active: int
    bytes_to_target: int
    bytes_to_client: int
    dropped_bytes: int
    in_flight: int
    cuts: int
    random_cuts: int
    upstream_failures: int
    blackhole: bool
    delay: float
    bandwidth: float | None
    refusing: bool
    drop_rate: float


class _Connection:
    """One accepted connection: its cancel scope is what cut and random drops cancel."""

    __slots__ = ("ended_by", "id", "scope")

    def __init__(self, cid: int) -> None:
        self.id = cid
        self.scope = trio.CancelScope()
        #: why it ended early: "cut", "peer" (a socket error); None = not yet / deadline
        self.ended_by: str | None = None

    def end(self, reason: str) -> None:
        if self.ended_by is None:
            self.ended_by = reason
        self.scope.cancel()


def _check_rate(name: str, value: float, *, allow_zero: bool) -> float:
    value = float(value)
    if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"`{name}` must be a finite {bound} number, got {value!r}")
    return value


class FaultProxy:
    """A TCP proxy from ``listen_host:listen_port`` to ``target_host:target_port``.

    Args:
        listen_host: address to listen on.
        listen_port: port to listen on; 0 picks a free one (see ``listen_port`` once
            :meth:`serve` has started).
        target_host: where every accepted connection is forwarded.
        target_port: the target's port.
        seed: the default seed of :meth:`random_drops`.
    """

    def __init__(
        self,
        listen_host: str,
        listen_port: int,
        target_host: str,
        target_port: int,
        seed: int = 0,
    ) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target_host = target_host
        self.target_port = target_port
        self.seed = seed
        self._ids = itertools.count(1)
        self._conns: dict[int, _Connection] = {}
        self._changed = trio.Event()
        # faults
        self._blackhole = False
        self._delay = 0.0
        self._bandwidth: float | None = None
        self._refusing = False
        self._drop_rate = 0.0
        self._drop_rng: random.Random | None = None
        self._drop_plan: list[tuple[int, float]] = []
        # counters
        self._accepted = 0
        self._refused = 0
        self._bytes_to_target = 0
        self._bytes_to_client = 0
        self._dropped = 0
        self._in_flight = 0
        self._cuts = 0
        self._random_cuts = 0
        self._upstream_failures = 0

    # ------------------------------------------------------------------ faults
    def cut(self) -> int:
        """Close every current connection now; returns how many. New ones are accepted."""
        conns = list(self._conns.values())
        for conn in conns:
            conn.end("cut")
        return len(conns)

    def blackhole(self, on: bool = True) -> None:
        """Drop every byte both ways while ``on``; connections stay open."""
        self._blackhole = bool(on)
        self._notify()

    def delay(self, seconds: float) -> None:
        """Add ``seconds`` of latency to each chunk, each direction (0 removes it).

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        self._delay = _check_rate("seconds", seconds, allow_zero=True)
        self._notify()

    def bandwidth(self, bytes_per_second: float | None) -> None:
        """Cap each direction of each connection at ``bytes_per_second`` (None: no cap).

        Raises:
            ValueError: the rate is not a positive finite number.
        """
        self._bandwidth = (
            None
            if bytes_per_second is None
            else _check_rate("bytes_per_second", bytes_per_second, allow_zero=False)
        )
        self._notify()

    def refuse(self, on: bool = True) -> None:
        """While ``on``, close each new connection as soon as it is accepted."""
        self._refusing = bool(on)
        self._notify()

    def random_drops(self, probability_per_second: float, seed: int | None = None) -> None:
        """Cut connections at random, ``probability_per_second`` per connection.

        Each connection (those open now, by id, then each new one as it is accepted)
        gets a lifetime drawn from an exponential distribution with that rate, using
        one ``random.Random(seed)`` in that order. 0 turns random drops off.

        Args:
            probability_per_second: the cut rate of one connection (mean lifetime is
                its inverse).
            seed: defaults to the proxy's ``seed``.

        Raises:
            ValueError: the rate is negative or not finite.
        """
        rate = _check_rate("probability_per_second", probability_per_second, allow_zero=True)
        self._drop_rate = rate
        self._drop_plan = []
        if rate == 0:
            self._drop_rng = None
            for conn in self._conns.values():
                conn.scope.deadline = math.inf
        else:
            self._drop_rng = random.Random(self.seed if seed is None else seed)
            for cid in sorted(self._conns):
                self._plan_drop(self._conns[cid])
        self._notify()

    def heal(self) -> None:
        """Clear every fault (connections cut before stay closed)."""
        self._blackhole = False
        self._delay = 0.0
        self._bandwidth = None
        self._refusing = False
        self.random_drops(0)

    def drop_plan(self) -> tuple[tuple[int, float], ...]:
        """``(connection id, lifetime in seconds)`` for each random drop planned since
        :meth:`random_drops` was last called, in the order they were drawn."""
        return tuple(self._drop_plan)

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(
            accepted=self._accepted,
            refused=self._refused,
            active=len(self._conns),
            bytes_to_target=self._bytes_to_target,
            bytes_to_client=self._bytes_to_client,
            dropped_bytes=self._dropped,
            in_flight=self._in_flight,
            cuts=self._cuts,
            random_cuts=self._random_cuts,
            upstream_failures=self._upstream_failures,
            blackhole=self._blackhole,
            delay=self._delay,
            bandwidth=self._bandwidth,
            refusing=self._refusing,
            drop_rate=self._drop_rate,
        )

    # ------------------------------------------------------------------ control text
    def execute(self, line: str) -> dict[str, Any]:
        """Run one control-protocol command (see the module docstring); never raises."""
        words = line.split()
        if not words:
            return {"ok": False, "error": "empty command; try `stats` or `heal`"}
        name, args = words[0].lower(), words[1:]
        try:
            return self._execute(name, args)
        except ValueError as exc:
            return {"ok": False, "error": f"{line.strip()!r}: {exc}"}

    def _execute(self, name: str, args: list[str]) -> dict[str, Any]:
        def arity(low: int, high: int, usage: str) -> None:
            if not low <= len(args) <= high:
                raise ValueError(f"usage: {usage}")

        def on_off(usage: str) -> bool:
            arity(1, 1, usage)
            if args[0].lower() not in ("on", "off"):
                raise ValueError(f"usage: {usage}")
            return args[0].lower() == "on"

        def number(text: str) -> float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"{text!r} is not a number") from None

        if name == "cut":
            arity(0, 0, "cut")
            return {"ok": True, "cut": self.cut()}
        if name == "blackhole":
            self.blackhole(on_off("blackhole on|off"))
        elif name == "delay":
            arity(1, 1, "delay SECONDS")
            self.delay(number(args[0]))
        elif name == "bandwidth":
            arity(1, 1, "bandwidth BYTES_PER_SECOND|off")
            self.bandwidth(None if args[0].lower() == "off" else number(args[0]))
        elif name == "refuse":
            self.refuse(on_off("refuse on|off"))
        elif name == "random_drops":
            usage = "random_drops PROBABILITY_PER_SECOND [SEED] | random_drops off"
            arity(1, 2, usage)
            if args[0].lower() == "off":
                arity(1, 1, usage)
                self.random_drops(0)
            else:
                seed = None
                if len(args) == 2:
                    try:
                        seed = int(args[1])
                    except ValueError:
                        raise ValueError(f"seed {args[1]!r} is not an integer") from None
                self.random_drops(number(args[0]), seed)
        elif name == "heal":
            arity(0, 0, "heal")
            self.heal()
        elif name == "stats":
            arity(0, 0, "stats")
            return {"ok": True, **asdict(self.statistics())}
        else:
            raise ValueError(
                "unknown command; use one of cut, blackhole, delay, bandwidth, refuse, "
                "random_drops, heal, stats"
            )
        return {"ok": True}

    # ------------------------------------------------------------------ serving
    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and forward connections until cancelled.

        Reports the bound listen port through ``task_status.started`` (and sets
        ``listen_port``), so ``await nursery.start(proxy.serve)`` returns once the proxy
        accepts connections.
        """
        listeners = await trio.open_tcp_listeners(self.listen_port, host=self.listen_host)
        self.listen_port = int(listeners[0].socket.getsockname()[1])
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.listen_port)

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _plan_drop(self, conn: _Connection) -> None:
        assert self._drop_rng is not None
        lifetime = self._drop_rng.expovariate(self._drop_rate)
        self._drop_plan.append((conn.id, lifetime))
        conn.scope.deadline = trio.current_time() + lifetime

    async def _handle(self, client: trio.SocketStream) -> None:
        self._accepted += 1
        if self._refusing:
            self._refused += 1
            await trio.aclose_forcefully(client)
            return
        conn = _Connection(next(self._ids))
        self._conns[conn.id] = conn
        if self._drop_rng is not None:
            self._plan_drop(conn)
        upstream: trio.SocketStream | None = None
        try:
            with conn.scope:
                if self._blackhole and not await self._hold_while_blackholed(client):
                    return
                try:
                    upstream = await trio.open_tcp_stream(self.target_host, self.target_port)
                except OSError:
                    self._upstream_failures += 1
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._direction, conn, client, upstream, True)
                    nursery.start_soon(self._direction, conn, upstream, client, False)
        finally:
            del self._conns[conn.id]
            if conn.scope.cancelled_caught and conn.ended_by in (None, "cut"):
                # None: the scope's deadline fired, which only random drops set
                self._cuts += 1
                if conn.ended_by is None:
                    self._random_cuts += 1
            # close both without a checkpoint in between: when the whole proxy is being
            # cancelled, an await here would raise before the second socket is closed
            client.socket.close()
            if upstream is not None:
                upstream.socket.close()

    async def _hold_while_blackholed(self, client: trio.SocketStream) -> bool:
        """Discard what a new client sends until the blackhole lifts.

        Returns False when the client went away first.
        """
        gone = False

        async def discard(cancel: trio.CancelScope) -> None:
            nonlocal gone
            try:
                while data := await client.receive_some(CHUNK_SIZE):
                    self._dropped += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            gone = True
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(discard, nursery.cancel_scope)
            while self._blackhole:
                await self._changed.wait()
            nursery.cancel_scope.cancel()
        return not gone

    async def _direction(
        self,
        conn: _Connection,
        src: trio.SocketStream,
        dst: trio.SocketStream,
        to_target: bool,
    ) -> None:
        """Forward ``src`` to ``dst``: a reader stamps each chunk with its due time, a
        writer sends chunks in order once due, within the bandwidth cap."""
        send, receive = trio.open_memory_channel[_Item](PIPELINE_CHUNKS)
        queued = [0]  # bytes of this direction counted in self._in_flight
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, conn, src, send, queued)
                nursery.start_soon(self._writer, conn, dst, receive, to_target, queued)
        finally:
            self._in_flight -= queued[0]  # chunks still queued when the connection ended

    async def _reader(
        self,
        conn: _Connection,
        src: trio.SocketStream,
        out: trio.MemorySendChannel[_Item],
        queued: list[int],
    ) -> None:
        async with out:
            while True:
                try:
                    data = await src.receive_some(CHUNK_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    conn.end("peer")
                    return
                if not data:
                    await out.send(None)
                    return
                if self._blackhole:
                    self._dropped += len(data)
                    continue
                self._in_flight += len(data)
                queued[0] += len(data)
                await out.send((trio.current_time() + self._delay, data))

    async def _writer(
        self,
        conn: _Connection,
        dst: trio.SocketStream,
        items: trio.MemoryReceiveChannel[_Item],
        to_target: bool,
        queued: list[int],
    ) -> None:
        next_free = 0.0  # bandwidth pacing: when the next slice may start
        async with items:
            async for item in items:
                if item is None:
                    if not self._blackhole:
                        try:
                            await dst.send_eof()
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            conn.end("peer")
                    return
                due, data = item
                await trio.sleep_until(due)
                view = memoryview(data)
                while view:
                    if self._blackhole:  # switched on while the chunk was delayed
                        self._dropped += len(view)
                        self._in_flight -= len(view)
                        queued[0] -= len(view)
                        break
                    rate = self._bandwidth
                    if rate is None:
                        piece, view = view, view[len(view) :]
                    else:
                        size = max(1, int(rate * PACING_SLICE_SECONDS))
                        piece, view = view[:size], view[size:]
                        start = max(trio.current_time(), next_free)
                        await trio.sleep_until(start)
                        next_free = start + len(piece) / rate
                    self._in_flight -= len(piece)
                    queued[0] -= len(piece)
                    try:
                        await dst.send_all(piece)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        conn.end("peer")
                        return
                    if to_target:
                        self._bytes_to_target += len(piece)
                    else:
                        self._bytes_to_client += len(piece)


@dataclass(frozen=True)
class RunningProxy:
    """What :func:`serve_fault_proxy` reports once it is listening."""

    proxy: FaultProxy
    listen_port: int
    control_port: int | None


async def _serve_control(
    proxy: FaultProxy,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the line-based control protocol for ``proxy`` until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(MAX_CONTROL_LINE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                buffer += data
                while b"\n" in buffer:
                    line, _, buffer = buffer.partition(b"\n")
                    reply = proxy.execute(line.decode("utf-8", errors="replace"))
                    await stream.send_all(json.dumps(reply).encode() + b"\n")
                if len(buffer) > MAX_CONTROL_LINE:
                    error = {"ok": False, "error": f"line longer than {MAX_CONTROL_LINE} bytes"}
                    await stream.send_all(json.dumps(error).encode() + b"\n")
                    return

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = int(listeners[0].socket.getsockname()[1])
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound)


async def serve_fault_proxy(
    listen_host: str,
    listen_port: int,
    target_host: str,
    target_port: int,
    *,
    control_host: str | None = None,
    control_port: int | None = None,
    seed: int = 0,
    task_status: trio.TaskStatus[RunningProxy] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a :class:`FaultProxy` (and, with ``control_port``, its control port) until
    cancelled.

    Use ``running = await nursery.start(serve_fault_proxy, ...)``: it returns a
    :class:`RunningProxy` with the bound ports once both are accepting connections.
    Port 0 picks a free port.
    """
    proxy = FaultProxy(listen_host, listen_port, target_host, target_port, seed)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        bound_control: int | None = None
        if control_port is not None:
            bound_control = await nursery.start(
                partial(_serve_control, proxy, control_host or listen_host, control_port)
            )
        task_status.started(RunningProxy(proxy, proxy.listen_port, bound_control))


@asynccontextmanager
async def open_fault_proxy(
    target_host: str,
    target_port: int,
    *,
    listen_host: str = "127.0.0.1",
    listen_port: int = 0,
    seed: int = 0,
) -> AsyncIterator[FaultProxy]:
    """A :class:`FaultProxy` serving for the duration of the block (``listen_port`` set)."""
    proxy = FaultProxy(listen_host, listen_port, target_host, target_port, seed)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- sync client


class ProxyCommandError(Exception):
    """The proxy rejected a control command; the message says why and how to fix it."""


class ProxyControl:
    """Drive a proxy's control port from synchronous code (one connection per command).

    Raises:
        ProxyCommandError: the proxy rejected a command.
        OSError: the control port cannot be reached (the message names it).
    """

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout

    def command(self, line: str) -> dict[str, Any]:
        """Send one raw command line and return the decoded reply."""
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
                sock.sendall(line.strip().encode() + b"\n")
                reply = b""
                while not reply.endswith(b"\n"):
                    data = sock.recv(65536)
                    if not data:
                        break
                    reply += data
        except OSError as exc:
            raise OSError(
                f"fault proxy control port {self.host}:{self.port} did not answer "
                f"{line.strip()!r}: {exc}"
            ) from exc
        if not reply:
            raise OSError(f"fault proxy control port {self.host}:{self.port} closed silently")
        answer: dict[str, Any] = json.loads(reply)
        if not answer.get("ok"):
            raise ProxyCommandError(str(answer.get("error", answer)))
        return answer

    def cut(self) -> int:
        return int(self.command("cut")["cut"])

    def blackhole(self, on: bool = True) -> None:
        self.command(f"blackhole {'on' if on else 'off'}")

    def delay(self, seconds: float) -> None:
        self.command(f"delay {seconds!r}")

    def bandwidth(self, bytes_per_second: float | None) -> None:
        self.command(f"bandwidth {'off' if bytes_per_second is None else repr(bytes_per_second)}")

    def refuse(self, on: bool = True) -> None:
        self.command(f"refuse {'on' if on else 'off'}")

    def random_drops(self, probability_per_second: float, seed: int | None = None) -> None:
        if probability_per_second == 0:
            self.command("random_drops off")
        else:
            suffix = "" if seed is None else f" {int(seed)}"
            self.command(f"random_drops {probability_per_second!r}{suffix}")

    def heal(self) -> None:
        self.command("heal")

    def stats(self) -> dict[str, Any]:
        answer = self.command("stats")
        answer.pop("ok", None)
        return answer


# ---------------------------------------------------------------------- program


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:0")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Fault-injecting TCP proxy (see the module docstring for the control protocol)."
    )
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT (0 = free)")
    parser.add_argument("--target", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--control", type=_address, help="HOST:PORT of the control port")
    parser.add_argument("--seed", type=int, default=0, help="default random-drop seed")
    parser.add_argument("--ready-file", type=Path, help="also write the ready line here")
    args = parser.parse_args(argv)

    async def run() -> None:
        (lhost, lport), (thost, tport) = args.listen, args.target
        chost, cport = args.control if args.control else (None, None)
        async with trio.open_nursery() as nursery:
            running: RunningProxy = await nursery.start(
                partial(
                    serve_fault_proxy,
                    lhost,
                    lport,
                    thost,
                    tport,
                    control_host=chost,
                    control_port=cport,
                    seed=args.seed,
                )
            )
            ready = {
                "listen": f"{lhost}:{running.listen_port}",
                "control": None if chost is None else f"{chost}:{running.control_port}",
                "target": f"{thost}:{tport}",
                "seed": args.seed,
                "pid": os.getpid(),
            }
            line = json.dumps(ready)
            if args.ready_file is not None:
                partial_file = args.ready_file.with_name(args.ready_file.name + ".tmp")
                partial_file.write_text(line + "\n")
                partial_file.replace(args.ready_file)  # appear whole, never half-written
            print(line, flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
