"""Connection caps per transport (``MaxConnections``) and the replication port's limits
before the hello: a frame over 64 KiB is refused, all strangers together buffer at most
4 MiB, and what they held is released when they close.

Real server processes and sockets; the rules themselves are also tested pure.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ServerProcess, wait_until, write_config
from test_replication_trust import peer

from amps_py.config import ConfigError, TransportConfig, parse_config
from amps_py.protocol import FrameDecoder, encode_frame
from amps_py.replication.prehello import PreHelloMemory
from amps_py.server.connection_cap import ConnectionCap

SEED = 25_0728


def replication_transport(extra: str = "") -> str:
    return (
        "<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        f"<InetAddr>127.0.0.1:0</InetAddr>{extra}</Transport>"
    )


def start(tmp_path: Path, *, client_extra: str = "", repl_extra: str = "") -> ServerProcess:
    config = write_config(
        tmp_path,
        "A",
        0,
        transport_extra=client_extra,
        extra_transport=replication_transport(repl_extra),
    )
    return ServerProcess(config, tmp_path, 0, "A").start()


def limits(server: ServerProcess) -> dict[str, Any]:
    return dict(server.statistics()["limits"])


def rss_anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


async def closed_by_server(stream: trio.SocketStream, timeout: float = 10) -> bool:
    """Whether the server closes ``stream`` (EOF or reset) within ``timeout``."""
    with trio.move_on_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return True
    return False


async def logon(stream: trio.SocketStream, name: str) -> dict[str, Any]:
    """Log on over ``stream``; the ack's header."""
    await stream.send_all(
        encode_frame({"c": "logon", "a": "processed", "cid": "1", "client_name": name})
    )
    decoder = FrameDecoder()
    with trio.fail_after(60):
        while True:
            for frame in decoder.frames():
                return dict(frame.header)
            data = await stream.receive_some(65536)
            assert data, "the server closed the connection instead of answering the logon"
            decoder.receive_data(data)


# ------------------------------------------------------------------- MaxConnections


async def test_max_connections_refuses_one_more_and_admits_again_after_a_close(
    tmp_path: Path,
) -> None:
    server = start(tmp_path, client_extra="<MaxConnections>3</MaxConnections>")
    opened: list[trio.SocketStream] = []
    try:
        for i in range(3):
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            opened.append(stream)
            assert (await logon(stream, f"c{i}"))["status"] == "success"
        # the 4th to 9th: accepted and closed at once, one log line for all of them
        for _ in range(6):
            extra = await trio.open_tcp_stream("127.0.0.1", server.port)
            try:
                assert await closed_by_server(extra), "the server kept a 4th connection open"
            finally:
                await trio.aclose_forcefully(extra)

        def refused_counted() -> str | None:
            cap = limits(server)["connections"]["json-tcp"]
            return None if cap["refused"] == 6 else f"connections of json-tcp: {cap}"

        await wait_until(refused_counted, 60)
        cap = limits(server)["connections"]["json-tcp"]
        assert cap == {"open": 3, "limit": 3, "peak": 3, "refused": 6}, cap
        lines = [ln for ln in server.log_file.read_text().splitlines() if "02-0030" in ln]
        assert len(lines) == 1, lines  # rate-limited: one line per 10 s
        assert "transport json-tcp closed a connection from 127.0.0.1:" in lines[0], lines[0]
        assert "3 connections are open, its MaxConnections of 3" in lines[0], lines[0]
        assert "Fix: raise <MaxConnections> of Transport json-tcp" in lines[0], lines[0]
        # one closes: a new one is admitted and served
        await opened.pop().aclose()

        def released() -> str | None:
            cap = limits(server)["connections"]["json-tcp"]
            return None if cap["open"] == 2 else f"connections of json-tcp: {cap}"

        await wait_until(released, 60)
        again = await trio.open_tcp_stream("127.0.0.1", server.port)
        opened.append(again)
        assert (await logon(again, "again"))["status"] == "success"
        assert limits(server)["connections"]["json-tcp"]["refused"] == 6
    finally:
        for stream in opened:
            await trio.aclose_forcefully(stream)
        assert server.stop() == 0, server.tail()


async def test_the_replication_transport_is_capped_too(tmp_path: Path) -> None:
    server = start(tmp_path, repl_extra="<MaxConnections>2</MaxConnections>")
    port = server.ports["amps-replication"]
    held: list[trio.SocketStream] = []
    try:
        for _ in range(2):
            held.append(await trio.open_tcp_stream("127.0.0.1", port))

        def both_open() -> str | None:
            cap = limits(server)["connections"]["amps-replication"]
            return None if cap["open"] == 2 else f"connections: {cap}"

        await wait_until(both_open, 60)
        third = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            assert await closed_by_server(third)
        finally:
            await trio.aclose_forcefully(third)
        line = next(ln for ln in server.log_file.read_text().splitlines() if "02-0030" in ln)
        assert "transport amps-replication closed a connection" in line, line
        for stream in held:
            await stream.aclose()
        held.clear()

        def none_open() -> str | None:
            cap = limits(server)["connections"]["amps-replication"]
            return None if cap["open"] == 0 else f"connections: {cap}"

        await wait_until(none_open, 60)
        async with peer(port) as p:  # a real hello is welcomed again
            assert (await p.handshake())["name"] == "A"
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)
        assert server.stop() == 0, server.tail()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "MaxConnections 0 would refuse every connection"),
        ("lots", "'lots' is not a valid count for MaxConnections"),
    ],
)
def test_max_connections_must_be_a_count_of_at_least_1(value: str, problem: str) -> None:
    xml = (
        "<AMPSConfig><Name>A</Name><Transports><Transport><Name>t</Name><Type>tcp</Type>"
        f"<InetAddr>127.0.0.1:0</InetAddr><MaxConnections>{value}</MaxConnections>"
        "</Transport></Transports></AMPSConfig>"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(xml)
    assert problem in str(info.value), str(info.value)


def test_connection_limit_defaults() -> None:
    client = TransportConfig("c", "tcp", "127.0.0.1", 0, "amps", None)
    repl = TransportConfig("r", "amps-replication", "127.0.0.1", 0, "amps-replication", None)
    assert (client.connection_limit, repl.connection_limit) == (10_000, 100)
    assert TransportConfig("c", "tcp", "", 0, "amps", None, max_connections=7).connection_limit == 7


def test_connection_cap_reports_at_most_once_per_interval() -> None:
    cap = ConnectionCap(TransportConfig("c", "tcp", "", 0, "amps", None, max_connections=1))
    assert cap.admit() and not cap.admit()
    first = cap.report(100.0, "p:1")
    assert first is not None and "1 refused so far" in first
    assert not cap.admit() and cap.report(105.0, "p:2") is None
    assert not cap.admit()
    later = cap.report(110.0, "p:3")
    assert later is not None and "2 refused since the last report (3 in all" in later
    cap.release()
    assert cap.admit() and cap.statistics() == {"open": 1, "limit": 1, "peak": 1, "refused": 3}


# ----------------------------------------------------------- before the hello


async def test_a_frame_over_64_kib_before_the_hello_is_refused(tmp_path: Path) -> None:
    """100 KiB: within the old 256 KiB allowance, over the hello's 64 KiB."""
    server = start(tmp_path)
    try:
        async with peer(server.ports["amps-replication"]) as p:
            await p.stream.send_all(struct.pack(">I", 100 * 1024))
            answer = await p.refusal()
        assert answer["reason"] == "not a replication peer", answer
        assert (
            "a frame of 102400 bytes arrived before the replication handshake" in (answer["detail"])
        )
        assert "at most 65536 bytes" in answer["detail"], answer
        async with peer(server.ports["amps-replication"]) as p:
            assert (await p.handshake())["name"] == "A"
    finally:
        assert server.stop() == 0, server.tail()


async def test_300_half_sent_frames_before_the_hello_are_bounded_and_released(
    tmp_path: Path,
) -> None:
    """300 connections each send 60 KiB of a 63 KiB frame and wait: all of them
    together never hold more than the 4 MiB pool (the biggest go), a real peer is still
    welcomed meanwhile, and once they close nothing is held and memory was handed back."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    server = start(tmp_path, repl_extra="<MaxConnections>400</MaxConnections>")
    port = server.ports["amps-replication"]
    pid = json.loads(server.ready_file.read_text())["pid"]
    before = rss_anon_kib(pid)
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(300):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            streams.append(stream)
            body = bytes(rng.randrange(256) for _ in range(16)) * (60 * 1024 // 16)
            try:
                await stream.send_all(struct.pack(">I", 63 * 1024) + body)
            except trio.BrokenResourceError:
                pass  # already closed for the pool: the biggest go first

        def all_read() -> str | None:
            stats = limits(server)
            shake = stats["replication_handshakes"]
            gone = shake["closed_over_limit"]
            waiting = shake["connections"]
            if gone + waiting < 300 or shake["bytes"] < 3 * 1024 * 1024:
                return f"handshakes: {shake}"
            return None

        await wait_until(all_read, 30)
        shake = limits(server)["replication_handshakes"]
        held = rss_anon_kib(pid)
        print(f"while held: {shake}; RssAnon {before} -> {held} KiB")
        assert shake["limit_bytes"] == 4 * 1024 * 1024
        assert shake["bytes"] <= shake["limit_bytes"], shake
        assert shake["peak_bytes"] <= shake["limit_bytes"] + 64 * 1024, shake
        assert shake["closed_over_limit"] > 0, shake
        async with peer(port) as p:  # a real peer's small hello is still welcome
            assert (await p.handshake())["name"] == "A"
        for stream in streams:
            await trio.aclose_forcefully(stream)
        streams.clear()

        def released() -> str | None:
            stats = limits(server)
            shake = stats["replication_handshakes"]
            cap = stats["connections"]["amps-replication"]
            if (
                shake["connections"]
                or shake["bytes"]
                or cap["open"]
                or not shake["memory_returned"]
            ):
                return f"handshakes {shake}, connections {cap}"
            return None

        await wait_until(released, 30)
        after = limits(server)["replication_handshakes"]
        print(f"after close: {after}; RssAnon {rss_anon_kib(pid)} KiB")
        assert server.alive
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)
        assert server.stop() == 0, server.tail()


def test_prehello_memory_sheds_the_biggest_and_returns_memory_when_due() -> None:
    trims: list[int] = []
    pool = PreHelloMemory(limit=100, trim=lambda: trims.append(1))
    assert pool.hold("a", 60) == [] and pool.hold("b", 30) == []
    assert pool.hold("c", 50) == [("a", 60)]  # 140 > 100: the biggest goes
    assert (pool.total, pool.connections, pool.closed_over_limit) == (80, 2, 1)
    pool.hold("b", 0)  # its hello arrived whole
    pool.release("b", ended=False)
    pool.release("c", ended=True)
    assert pool.total == 0 and pool.connections == 0 and pool.ended == 1
    assert not pool.tick() and trims == []  # 110 bytes freed, one ended: not due
    for i in range(40):
        pool.hold(i, 60)
        pool.release(i, ended=True)
    assert not pool.tick()
    for i in range(60):
        pool.release(i, ended=True)  # 100 ended since: due
    assert pool.tick() and trims == [1]
    assert not pool.tick()  # nothing new since
    big = PreHelloMemory(limit=10 * 1024 * 1024, trim=lambda: trims.append(2))
    for i in range(20):
        big.hold(i, 60 * 1024)
        big.release(i, ended=False)  # handshakes completed: 1.2 MiB freed
    assert big.tick() and trims == [1, 2]
    assert big.statistics()["memory_returned"] == 1
