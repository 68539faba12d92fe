"""The simulator's network (amps_py/sim/network.py): what a trio stream over it does
under each fault, on a virtual clock, and that a seed fixes the whole run."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from amps_py.sim.determinism import seeded_scheduling
from amps_py.sim.network import SimNetwork, SimStream
from amps_py.sim.trace import Trace

SEED = 29


def network(**kwargs: object) -> SimNetwork:
    return SimNetwork(random.Random(SEED), Trace(), **kwargs)  # type: ignore[arg-type]


async def echo(stream: SimStream) -> None:
    """Send back what arrives, until EOF or a reset (which ends only this handler, as a
    real server's connection handler would)."""
    try:
        while data := await stream.receive_some():
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def read_exactly(stream: SimStream, size: int) -> bytes:
    got = b""
    while len(got) < size:
        chunk = await stream.receive_some()
        assert chunk, f"EOF after {len(got)} of {size} bytes"
        got += chunk
    return got


async def test_bytes_cross_after_the_latency_in_order(autojump_clock: trio.MockClock) -> None:
    net = network(latency=(0.01, 0.01))
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", echo)
        stream = await net.connect("a", "b:1")
        assert stream.socket.getpeername() == ("b", 1)
        sent_at = trio.current_time()
        await stream.send_all(b"hello ")
        await stream.send_all(b"world")
        assert await read_exactly(stream, 11) == b"hello world"
        assert trio.current_time() - sent_at == pytest.approx(0.02)  # there and back
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_full_pipe_blocks_the_sender_until_the_reader_reads(
    autojump_clock: trio.MockClock,
) -> None:
    net = network(pipe_bytes=100)
    received = trio.Event()
    accepted: list[SimStream] = []

    async def hold(stream: SimStream) -> None:
        accepted.append(stream)
        await received.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", hold)
        stream = await net.connect("a", "b:1")
        with trio.move_on_after(5) as blocked:
            await stream.send_all(b"x" * 250)
        assert blocked.cancelled_caught, "250 bytes went into a 100-byte pipe nobody read"
        got = await read_exactly(accepted[0], 100)
        assert got == b"x" * 100  # what fitted before the sender blocked
        nursery.cancel_scope.cancel()


async def test_a_reset_fails_both_ends(autojump_clock: trio.MockClock) -> None:
    net = network()
    ends: list[SimStream] = []

    async def keep(stream: SimStream) -> None:
        ends.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", keep)
        client = await net.connect("a", "b:1")
        await trio.testing.wait_all_tasks_blocked()
        assert net.reset("a", "b") == 1
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await ends[0].send_all(b"late")
        nursery.cancel_scope.cancel()


async def test_a_partition_holds_bytes_back_until_it_heals(
    autojump_clock: trio.MockClock,
) -> None:
    net = network(connect_timeout=3.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", echo)
        stream = await net.connect("a", "b:1")
        net.partition({"a"}, {"b", "c"})
        await stream.send_all(b"ping")
        with trio.move_on_after(30) as waited:
            await stream.receive_some()
        assert waited.cancelled_caught, "bytes crossed a partition"
        started = trio.current_time()
        with pytest.raises(OSError, match="timed out"):
            await net.connect("a", "b:1")
        assert trio.current_time() - started >= 3.0
        net.heal()
        assert await read_exactly(stream, 4) == b"ping"  # the connection survived
        nursery.cancel_scope.cancel()


async def test_a_crash_resets_connections_and_refuses_new_ones(
    autojump_clock: trio.MockClock,
) -> None:
    net = network()
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", echo)
        stream = await net.connect("a", "b:1")
        net.crash("b")
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some()
        with pytest.raises(OSError, match="refused"):
            await net.connect("a", "b:1")
        nursery.cancel_scope.cancel()


async def test_a_vanished_host_leaves_the_peer_half_open(autojump_clock: trio.MockClock) -> None:
    net = network(pipe_bytes=64)
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", echo)
        stream = await net.connect("a", "b:1")
        net.vanish("b")
        await stream.send_all(b"y" * 64)  # into the void, until the pipe is full
        with trio.move_on_after(60) as waited:
            await stream.receive_some()
        assert waited.cancelled_caught, "a vanished host answered"
        with trio.move_on_after(60) as full:
            await stream.send_all(b"z")
        assert full.cancelled_caught, "a half-open connection took bytes past its buffer"
        nursery.cancel_scope.cancel()


async def test_a_slow_reader_reads_at_its_rate(autojump_clock: trio.MockClock) -> None:
    net = network(latency=(0.0, 0.0))
    done: list[float] = []

    async def drain(stream: SimStream) -> None:
        got = 0
        while got < 10_000:
            got += len(await stream.receive_some(1000))
        done.append(trio.current_time())

    net.slow_reader("b", 1000.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve, "b:1", drain)
        stream = await net.connect("a", "b:1")
        started = trio.current_time()
        await stream.send_all(b"s" * 10_000)
        await stream.send_eof()
        while not done:
            await trio.sleep(1)
        assert done[0] - started == pytest.approx(10.0)  # 10 kB at 1 kB/s
        nursery.cancel_scope.cancel()


def _chatter(seed: int) -> str:
    """Five clients talking to two echo servers at once, a reset and a partition in
    the middle; the trace's digest."""

    async def main() -> str:
        net = SimNetwork(random.Random(seed), Trace())

        async def client(number: int) -> None:
            try:
                stream = await net.connect(f"c{number}", f"s{number % 2}:1")
                for i in range(20):
                    await stream.send_all(b"m" * (number * 10 + i + 1))
                    await stream.receive_some()
            except (OSError, trio.BrokenResourceError):
                pass

        async with trio.open_nursery() as nursery:
            await nursery.start(net.serve, "s0:1", echo)
            await nursery.start(net.serve, "s1:1", echo)
            async with trio.open_nursery() as clients:
                clients.cancel_scope.deadline = trio.current_time() + 600  # never hang
                for number in range(5):
                    clients.start_soon(client, number)
                await trio.sleep(0.005)
                net.reset("c1", "s1")
                net.partition({"c0", "s0"}, {"c2", "c3", "c4", "s1"})
                await trio.sleep(0.01)
                net.heal()
            nursery.cancel_scope.cancel()
        return net.trace.digest()

    with seeded_scheduling(seed):
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_same_seed_gives_the_same_trace() -> None:
    print(f"seeds {SEED}, {SEED + 1}")
    first = _chatter(SEED)
    assert _chatter(SEED) == first
    assert _chatter(SEED + 1) != first  # the seed matters: latencies and interleaving


async def test_amps_py_net_opens_on_the_network_a_task_tree_runs_on(
    autojump_clock: trio.MockClock,
) -> None:
    """What the server and the client call (amps_py.net) reaches the simulated network
    inside ``using``, and trio's listeners API serves its listeners."""
    from amps_py import net as amps_net

    sim = network()
    async with trio.open_nursery() as nursery:
        with amps_net.using(sim.node("b")):
            listeners = await amps_net.open_tcp_listeners(0)
            host, port = listeners[0].socket.getsockname()[:2]
            assert host == "b"
            nursery.start_soon(trio.serve_listeners, echo, listeners)
        with amps_net.using(sim.node("a")):
            stream = await amps_net.open_tcp_stream(host, port)
        assert stream.socket.getsockname()[0] == "a"
        await stream.send_all(b"through amps_py.net")
        assert await read_exactly(stream, 19) == b"through amps_py.net"  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()
