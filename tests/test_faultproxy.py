"""The fault-injecting proxy (tests/faultproxy.py) against a trio echo server on port 0.

Negative checks ("nothing arrives") wait a bounded time, SILENCE seconds; positive checks
poll with a deadline and say what is still wrong.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from faultproxy import (
    FaultProxy,
    ProxyCommandError,
    ProxyControl,
    open_fault_proxy,
)
from harness import REPO, wait_until

#: How long a "nothing arrives" assertion waits.
SILENCE = 0.3
#: Deadline for things that should happen promptly.
PROMPT = 5.0


class EchoServer:
    """Echoes every byte; keeps the server side of each connection for pushing."""

    def __init__(self) -> None:
        self.port = 0
        self.accepted = 0
        self.streams: list[trio.SocketStream] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        self.streams.append(stream)
        try:
            async with stream:
                while data := await stream.receive_some(65536):
                    await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@pytest.fixture
async def echo(nursery: trio.Nursery) -> EchoServer:
    server = EchoServer()
    listeners = await nursery.start(trio.serve_tcp, server.handle, 0)
    server.port = listeners[0].socket.getsockname()[1]
    return server


@pytest.fixture
async def proxy(echo: EchoServer) -> AsyncIterator[FaultProxy]:
    async with open_fault_proxy("127.0.0.1", echo.port, seed=1) as p:
        yield p


_opened: list[trio.SocketStream] = []


@pytest.fixture(autouse=True)
async def close_test_streams() -> AsyncIterator[None]:
    """Close every stream a test opened with :func:`connect`."""
    yield
    while _opened:
        await trio.aclose_forcefully(_opened.pop())


async def connect(proxy: FaultProxy | int) -> trio.SocketStream:
    port = proxy if isinstance(proxy, int) else proxy.listen_port
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    _opened.append(stream)
    return stream


async def receive_exactly(stream: trio.SocketStream, n: int, timeout: float = PROMPT) -> bytes:
    data = b""
    with trio.move_on_after(timeout):
        while len(data) < n:
            chunk = await stream.receive_some(n - len(data))
            if not chunk:
                break
            data += chunk
    assert len(data) == n, f"got {len(data)} of {n} bytes within {timeout} s: {data[:40]!r}"
    return data


async def roundtrip(stream: trio.SocketStream, payload: bytes) -> None:
    await stream.send_all(payload)
    assert await receive_exactly(stream, len(payload)) == payload


async def assert_silent(stream: trio.SocketStream, what: str) -> None:
    """Nothing arrives for SILENCE seconds, and the connection is not closed either."""
    with trio.move_on_after(SILENCE):
        data = await stream.receive_some(65536)
        if data:
            pytest.fail(f"{what}: {data[:40]!r} arrived")
        pytest.fail(f"{what}: the connection was closed")


async def assert_closed(stream: trio.SocketStream, what: str) -> None:
    with trio.move_on_after(PROMPT):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return
    pytest.fail(f"{what}: still open after {PROMPT} s")


async def test_forwards_both_ways_on_several_connections(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    rng = random.Random(3)
    payloads = [rng.randbytes(n) for n in (1, 4096, 300_000)]
    streams = [await connect(proxy) for _ in payloads]
    async with trio.open_nursery() as nursery:
        for stream, payload in zip(streams, payloads, strict=True):
            nursery.start_soon(roundtrip, stream, payload)
    total = sum(map(len, payloads))

    def counted() -> str | None:
        s = proxy.statistics()
        if (s.accepted, s.active, s.bytes_to_target, s.bytes_to_client) != (3, 3, total, total):
            return f"statistics {s}, want 3 accepted/active and {total} bytes each way"
        return None

    await wait_until(counted, PROMPT)
    assert echo.accepted == 3


async def test_cut_closes_current_connections_and_keeps_accepting(proxy: FaultProxy) -> None:
    a, b = await connect(proxy), await connect(proxy)
    await roundtrip(a, b"a")
    await roundtrip(b, b"b")
    assert proxy.cut() == 2
    await assert_closed(a, "connection a after cut")
    await assert_closed(b, "connection b after cut")
    c = await connect(proxy)
    await roundtrip(c, b"after the cut")
    stats = proxy.statistics()
    assert (stats.cuts, stats.random_cuts, stats.active) == (2, 0, 1)


async def test_blackhole_drops_bytes_both_ways_until_heal(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    a = await connect(proxy)
    await roundtrip(a, b"before")
    proxy.blackhole(True)
    await a.send_all(b"to the void")
    await assert_silent(a, "client->target while blackholed")
    await echo.streams[0].send_all(b"pushed by the target")
    await assert_silent(a, "target->client while blackholed")

    # a connection made during the blackhole is accepted but does not reach the target
    b = await connect(proxy)
    await b.send_all(b"early")
    await assert_silent(b, "new connection while blackholed")
    assert echo.accepted == 1, "the blackholed connection reached the target"
    stats = proxy.statistics()
    assert stats.active == 2, f"blackholed connections must stay open: {stats}"
    assert stats.dropped_bytes >= len(b"to the void" + b"pushed by the target" + b"early")

    proxy.heal()
    await roundtrip(a, b"after heal")
    await roundtrip(b, b"b after heal")
    assert echo.accepted == 2


async def test_delay_adds_latency_keeps_order_and_pipelines(proxy: FaultProxy) -> None:
    stream = await connect(proxy)
    proxy.delay(0.15)
    messages = [b"<%03d>" % i for i in range(50)]
    start = trio.current_time()
    for message in messages:
        await stream.send_all(message)
        await trio.sleep(0.002)  # spread the messages over several chunks
    first = await receive_exactly(stream, 5)
    first_at = trio.current_time() - start
    rest = await receive_exactly(stream, 5 * 49)
    elapsed = trio.current_time() - start
    assert first + rest == b"".join(messages)
    assert first_at >= 0.28, f"round trip through 2 x 0.15 s took only {first_at:.3f} s"
    # not pipelined, 50 chunks would take 50 x 0.3 s: half that leaves room for a slow machine
    assert elapsed < 7.5, f"chunks are not pipelined: 50 messages took {elapsed:.2f} s"

    # a chunk sent with a long delay is not overtaken by one sent after the delay dropped
    proxy.delay(0.4)
    await stream.send_all(b"slow")

    def slow_is_queued() -> str | None:
        queued = proxy.statistics().in_flight
        return None if queued == 4 else f"{queued} bytes in flight, want 4 (b'slow')"

    await wait_until(slow_is_queued, PROMPT)
    proxy.delay(0)
    await stream.send_all(b"fast")
    assert await receive_exactly(stream, 8) == b"slowfast"


async def test_bandwidth_limit_is_roughly_honoured(proxy: FaultProxy) -> None:
    stream = await connect(proxy)
    payload = random.Random(4).randbytes(25_000)
    proxy.bandwidth(50_000)
    start = trio.current_time()
    await roundtrip(stream, payload)
    limited = trio.current_time() - start
    # 25 kB at 50 kB/s is 0.5 s each way (the two directions overlap)
    assert 0.35 <= limited <= 5.0, f"25 kB at 50 kB/s took {limited:.3f} s"

    proxy.bandwidth(None)
    start = trio.current_time()
    await roundtrip(stream, payload)
    unlimited = trio.current_time() - start
    assert unlimited < limited, f"no cap: {unlimited:.3f} s, capped: {limited:.3f} s"


async def test_refuse_closes_new_connections_only(proxy: FaultProxy, echo: EchoServer) -> None:
    a = await connect(proxy)
    await roundtrip(a, b"a")
    proxy.refuse(True)
    b = await connect(proxy)
    await assert_closed(b, "new connection while refusing")
    await roundtrip(a, b"still here")
    proxy.refuse(False)
    c = await connect(proxy)
    await roundtrip(c, b"accepted again")
    stats = proxy.statistics()
    assert (stats.accepted, stats.refused, stats.cuts) == (3, 1, 0)
    assert echo.accepted == 2


async def run_random_drops(port: int, seed: int) -> tuple[tuple[tuple[int, float], ...], int]:
    """Open 4 connections one after another under random drops; each must be cut close to
    its planned lifetime. Returns the drop plan and the random cut count."""
    async with open_fault_proxy("127.0.0.1", port, seed=seed) as proxy:
        proxy.random_drops(8.0)  # mean lifetime 1/8 s
        for _ in range(4):
            stream = await connect(proxy)
            opened = trio.current_time()
            await assert_closed(stream, "connection under random drops")
            lived = trio.current_time() - opened
            planned = proxy.drop_plan()[-1][1]
            assert planned - 0.02 <= lived <= planned + 1.0, (
                f"seed {seed}: connection lived {lived:.3f} s, planned {planned:.3f} s"
            )

        def all_cut() -> str | None:
            s = proxy.statistics()
            return None if s.random_cuts == 4 else f"random cuts {s.random_cuts}, want 4"

        await wait_until(all_cut, PROMPT)
        return proxy.drop_plan(), proxy.statistics().random_cuts


async def test_random_drops_are_reproducible_with_the_same_seed(echo: EchoServer) -> None:
    seed = 20240601
    print(f"seed {seed}")
    plan, cuts = await run_random_drops(echo.port, seed)
    again, cuts_again = await run_random_drops(echo.port, seed)
    assert plan == again
    assert cuts == cuts_again == 4
    assert [cid for cid, _ in plan] == [1, 2, 3, 4]
    other, _ = await run_random_drops(echo.port, seed + 1)
    assert [t for _, t in other] != [t for _, t in plan]


async def test_random_drops_off_and_heal_cancel_planned_cuts(proxy: FaultProxy) -> None:
    stream = await connect(proxy)
    proxy.random_drops(1000.0, seed=9)  # would cut within milliseconds
    proxy.heal()
    await roundtrip(stream, b"survived")
    await assert_silent(stream, "connection after heal")
    assert proxy.statistics().cuts == 0


async def test_fault_arguments_are_checked() -> None:
    proxy = FaultProxy("127.0.0.1", 0, "127.0.0.1", 1)
    with pytest.raises(ValueError, match="`seconds` must be"):
        proxy.delay(-1)
    with pytest.raises(ValueError, match="`bytes_per_second` must be"):
        proxy.bandwidth(0)
    with pytest.raises(ValueError, match="`probability_per_second` must be"):
        proxy.random_drops(float("nan"))
    assert proxy.execute("bandwidth fast") == {
        "ok": False,
        "error": "'bandwidth fast': 'fast' is not a number",
    }
    assert "usage: blackhole on|off" in proxy.execute("blackhole maybe")["error"]
    assert "unknown command" in proxy.execute("partition")["error"]


async def test_control_port_of_a_subprocess_proxy(echo: EchoServer, tmp_path: Path) -> None:
    ready = tmp_path / "proxy.json"
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            str(REPO / "tests" / "faultproxy.py"),
            "--listen",
            "127.0.0.1:0",
            "--target",
            f"127.0.0.1:{echo.port}",
            "--control",
            "127.0.0.1:0",
            "--seed",
            "5",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:

        def started() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"the proxy exited with {proc.returncode}")
            return None if ready.exists() else "the proxy has not written its ready file"

        await wait_until(started, 60)
        info = json.loads(ready.read_text())
        assert info["seed"] == 5
        listen_port = int(info["listen"].rpartition(":")[2])
        chost, _, cport = info["control"].rpartition(":")
        control = ProxyControl(chost, int(cport))

        async def call(method: str, *args: object) -> object:
            return await trio.to_thread.run_sync(lambda: getattr(control, method)(*args))

        stream = await connect(listen_port)
        await roundtrip(stream, b"through the subprocess")
        await call("blackhole", True)
        await stream.send_all(b"dropped")
        await assert_silent(stream, "blackholed by control command")
        await call("heal")
        await roundtrip(stream, b"healed")
        await call("delay", 0.1)
        await call("bandwidth", 1_000_000)
        await call("random_drops", 0.001, 3)
        stats = await call("stats")
        assert isinstance(stats, dict)
        assert stats["delay"] == 0.1 and stats["bandwidth"] == 1_000_000
        assert stats["drop_rate"] == 0.001
        await call("heal")
        assert await call("cut") == 1
        await assert_closed(stream, "cut by control command")
        await call("refuse", True)
        refused = await connect(listen_port)
        await assert_closed(refused, "refused by control command")
        with pytest.raises(ProxyCommandError, match="usage: delay SECONDS"):
            await call("command", "delay")
        stats = await call("stats")
        assert isinstance(stats, dict)
        assert (stats["accepted"], stats["refused"], stats["cuts"]) == (2, 1, 1)
        assert stats["bytes_to_target"] == len(b"through the subprocesshealed")
    finally:
        proc.terminate()
        with trio.fail_after(60):
            await proc.wait()
