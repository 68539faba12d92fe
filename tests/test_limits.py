"""Limits on what one client (or many hostile ones) can hold, against a real server.

- A frame started must be finished within the transport's IncompleteMessageTimeout.
- A connection must log on within the transport's LogonTimeout.
- Partial frames of all connections together stay under IncompleteMessageMemoryLimit
  (checked on the server's RSS, not only its own accounting).
- A subscriber that stops reading is disconnected as a slow client past its
  ClientMaxCapacity, and sees EOF; the biggest of several slow subscribers goes when all
  together pass MessageMemoryLimit. Publishers keep getting persisted acks meanwhile.

Each instance runs as a real process; small limits keep the tests fast, and every wait
polls a condition with a deadline.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ServerProcess, start_instance, wait_until

from amps_py.client import open_client
from amps_py.protocol import Frame, FrameDecoder, encode_frame

MiB = 1024 * 1024


# ------------------------------------------------------------------------ raw clients


@dataclass
class RawClient:
    """A client on a bare socket, so a test can stop reading or send half a frame."""

    stream: trio.SocketStream
    decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(64 * MiB))
    frames: list[Frame] = field(default_factory=list)
    received: int = 0

    @property
    def address(self) -> str:
        host, port = self.stream.socket.getsockname()[:2]
        return f"{host}:{port}"

    async def command(self, header: dict[str, Any], timeout: float = 10) -> Frame:
        """Send a command with a cid and a processed ack; return that ack."""
        cid = header.setdefault("cid", f"c{len(self.frames)}-{time.monotonic_ns()}")
        header.setdefault("a", "processed")
        await self.stream.send_all(encode_frame(header))
        with trio.fail_after(timeout):
            while True:
                for frame in self.frames:
                    if frame.command == "ack" and frame.header.get("cid") == cid:
                        return frame
                if await self._read() == "eof":
                    raise AssertionError(f"server closed the connection before acking {header}")

    async def _read(self) -> str:
        data = await self.stream.receive_some(256 * 1024)
        if not data:
            return "eof"
        self.received += len(data)
        self.decoder.receive_data(data)
        self.frames.extend(self.decoder.frames())
        return "data"

    async def read_to_end(self, timeout: float) -> str:
        """Read until the server closes: ``"eof"`` (clean close) or ``"reset"``; fails
        when the connection is still open at the deadline."""
        with trio.move_on_after(timeout):
            try:
                while await self._read() != "eof":
                    pass
            except trio.BrokenResourceError:
                return "reset"
            return "eof"
        raise AssertionError(
            f"connection {self.address} still open {timeout} s later "
            f"({self.received} bytes, {len(self.frames)} frames read)"
        )

    def failure_reasons(self) -> list[str]:
        return [
            str(f.header.get("reason"))
            for f in self.frames
            if f.command == "ack" and f.header.get("status") == "failure"
        ]


#: every raw connection a test opened; closed after each test
_OPEN: list[RawClient] = []


@pytest.fixture(autouse=True)
async def _close_raw_clients() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await trio.aclose_forcefully(_OPEN.pop().stream)


async def raw_connect(port: int, *, rcvbuf: int | None = None) -> RawClient:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        # small receive buffer: the server's backlog shows up in its outbox sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    try:
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    client = RawClient(trio.SocketStream(sock))
    _OPEN.append(client)
    return client


async def raw_logon(port: int, name: str, *, rcvbuf: int | None = None) -> RawClient:
    client = await raw_connect(port, rcvbuf=rcvbuf)
    ack = await client.command({"c": "logon", "client_name": name})
    assert ack.header["status"] == "success", ack.header
    return client


def log_lines(server: ServerProcess, code: str) -> list[str]:
    if not server.log_file.exists():
        return []
    return [line for line in server.log_file.read_text().splitlines() if code in line]


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


# ------------------------------------------------------------------ partial frames


async def test_stalled_frame_is_closed_after_the_frame_deadline_while_others_publish(
    tmp_path: Path,
) -> None:
    server = start_instance(
        tmp_path,
        "frames",
        transport_extra="<IncompleteMessageTimeout>1s</IncompleteMessageTimeout>",
    )
    try:
        async with open_client(server.uri, "steady") as steady:
            before = await steady.publish_persisted("audit", b'{"n":0}', timeout=20)

            # half a publish frame, then silence
            staller = await raw_logon(server.port, "staller")
            frame = encode_frame({"c": "p", "t": "audit", "s": 1}, b"x" * 2000)
            await staller.stream.send_all(frame[: len(frame) // 2])
            stalled_at = trio.current_time()
            # a frame announced as 100,000 bytes, trickled: the connection is never idle,
            # but the frame is not finished in time either
            trickler = await raw_logon(server.port, "trickler")
            await trickler.stream.send_all(struct.pack(">I", 100_000) + b'{"c":"p"')
            trickled_at = trio.current_time()

            async def trickle() -> None:
                try:
                    while True:
                        await trickler.stream.send_all(b" ")
                        await trio.sleep(0.05)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            published = before

            async def publish_meanwhile() -> None:
                nonlocal published
                n = 0
                while True:
                    n += 1
                    published = await steady.publish_persisted("audit", b'{"n":%d}' % n, timeout=20)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle)
                nursery.start_soon(publish_meanwhile)
                end_staller = await staller.read_to_end(15)
                staller_open_for = trio.current_time() - stalled_at
                end_trickler = await trickler.read_to_end(15)
                trickler_open_for = trio.current_time() - trickled_at
                nursery.cancel_scope.cancel()
            # a library client that stalls mid-frame is told why its connection closed
            async with open_client(server.uri, "halfway") as halfway:
                await halfway.send_raw(frame[:100])
                with trio.fail_after(60):
                    while halfway.closed is None:
                        await trio.sleep(0.02)
                assert "incomplete message timeout" in str(halfway.closed), halfway.closed
            print(
                f"staller closed ({end_staller}) after {staller_open_for:.2f} s, trickler "
                f"({end_trickler}) after {trickler_open_for:.2f} s; steady published "
                f"{published - before} with persisted acks meanwhile"
            )
            assert published > before
            # closed by the deadline, not before it
            assert 0.9 <= staller_open_for < 10, staller_open_for
            assert 0.9 <= trickler_open_for < 10, trickler_open_for
            assert "incomplete message timeout" in staller.failure_reasons()
            # the steady publisher still works after both were closed
            after = await steady.publish_persisted("audit", b'{"n":"after"}', timeout=20)
            assert after > published >= before
        assert server.alive, server.tail()
        lines = log_lines(server, "07-0071")
        staller_line = next(line for line in lines if staller.address in line)
        half = len(frame) // 2
        assert f"sent {half} of {len(frame)} bytes" in staller_line, staller_line
        assert "IncompleteMessageTimeout of 1 s" in staller_line, staller_line
        trickler_line = next(line for line in lines if trickler.address in line)
        assert "of 100004 bytes" in trickler_line, trickler_line
    finally:
        server.stop()


async def test_connection_that_never_logs_on_is_closed_after_the_logon_deadline(
    tmp_path: Path,
) -> None:
    server = start_instance(tmp_path, "logon", transport_extra="<LogonTimeout>1s</LogonTimeout>")
    try:
        silent = [await raw_connect(server.port) for _ in range(50)]
        opened_at = trio.current_time()
        async with open_client(server.uri, "prompt") as prompt:
            ends = []
            for conn in silent:
                ends.append(await conn.read_to_end(15))
            open_for = trio.current_time() - opened_at
            print(f"50 silent connections closed ({set(ends)}) {open_for:.2f} s after opening")
            assert open_for >= 0.9, open_for
            for conn in silent:
                assert conn.failure_reasons() == ["logon timeout"], conn.frames
            # a client that logged on in time is not affected
            await prompt.publish_persisted("t", b'{"ok":1}', timeout=20)

        def all_logged() -> str | None:
            n = len(log_lines(server, "07-0070"))
            return None if n >= 50 else f"{n} of 50 logon timeouts logged"

        await wait_until(all_logged, 60)
        line = log_lines(server, "07-0070")[0]
        assert "no logon within LogonTimeout of 1 s" in line, line
        assert any(conn.address in line for conn in silent), line
        assert server.alive, server.tail()
    finally:
        server.stop()


async def test_partial_frames_of_many_connections_stay_within_the_budget(tmp_path: Path) -> None:
    budget = 32 * MiB
    frame_size = 8 * MiB
    attackers = 20
    held_each = frame_size - 512 * 1024
    server = start_instance(
        tmp_path,
        "budget",
        max_message_size="8MB",
        extra="<IncompleteMessageMemoryLimit>32MB</IncompleteMessageMemoryLimit>",
    )
    try:
        assert server.proc is not None
        pid = server.proc.pid
        async with open_client(server.uri, "normal") as normal:
            await normal.publish_persisted("t", b'{"warm":1}', timeout=20)
            start_rss = vm_rss(pid)
            peak_rss = start_rss
            closed = 0
            body = struct.pack(">I", frame_size) + b'{"c":"p","t":"t"}' + b"x" * held_each

            async def attack() -> None:
                nonlocal closed
                conn = await raw_connect(server.port)
                try:
                    for at in range(0, len(body), 256 * 1024):
                        await conn.stream.send_all(body[at : at + 256 * 1024])
                    # hold the partial frame until the server closes the connection
                    await conn.read_to_end(60)
                    closed += 1
                except trio.BrokenResourceError:
                    closed += 1  # closed by the server while sending
                finally:
                    await conn.stream.aclose()

            async def sample_rss() -> None:
                nonlocal peak_rss
                while True:
                    peak_rss = max(peak_rss, vm_rss(pid))
                    await trio.sleep(0.01)

            async with trio.open_nursery() as outer:
                outer.start_soon(sample_rss)
                with trio.move_on_after(90):
                    async with trio.open_nursery() as nursery:
                        for _ in range(attackers):
                            nursery.start_soon(attack)

                        def enough_closed() -> str | None:
                            stats = server.statistics()["limits"]["incomplete_messages"]
                            # every attacker still open holds a whole partial frame
                            if stats["closed_over_limit"] >= attackers - budget // held_each:
                                return None
                            return f"{stats} after {closed} attackers saw their close"

                        await wait_until(enough_closed, 60)
                        # the server keeps serving a normal client meanwhile
                        await normal.publish_persisted("t", b'{"during":1}', timeout=20)
                        async with normal.subscribe("t", bookmark="0") as sub:
                            assert (await sub.get(10)).json() == {"warm": 1}
                        peak_rss = max(peak_rss, vm_rss(pid))
                        nursery.cancel_scope.cancel()
                outer.cancel_scope.cancel()
        stats = server.statistics()["limits"]["incomplete_messages"]
        growth = peak_rss - start_rss
        print(
            f"RSS {start_rss / MiB:.0f} MiB -> peak {peak_rss / MiB:.0f} MiB "
            f"(+{growth / MiB:.0f} MiB, budget {budget / MiB:.0f} MiB); "
            f"{attackers} attackers x {held_each / MiB:.1f} MiB; pool {stats}"
        )
        assert stats["peak_bytes"] <= budget + 256 * 1024, stats
        # without the budget this is attackers x held_each = 150 MiB
        assert growth <= budget + 40 * MiB, f"RSS grew by {growth / MiB:.0f} MiB"
        line = log_lines(server, "07-0072")[0]
        assert "over IncompleteMessageMemoryLimit of 33554432 bytes" in line, line
        assert server.alive, server.tail()
    finally:
        server.stop()


# ------------------------------------------------------------------------ slow clients


async def publish_until(
    pub: Any, topics: list[tuple[str, bytes]], done: Callable[[int], bool], limit: int = 20_000
) -> int:
    """Publish to ``topics`` in turn, 32 messages per persisted-ack round, until
    ``done(published so far)``; returns how many were published. Every round must be
    acknowledged within 20 s."""
    n = 0
    while not done(n):
        assert n < limit, f"{n} messages published and still not done"
        seq = 0
        for _ in range(32):
            topic, payload = topics[n % len(topics)]
            seq = await pub.publish(topic, payload)
            n += 1
        await pub.wait_persisted(seq, timeout=20)
    return n


def queued_stats(server: ServerProcess, cause: str, count: int) -> str | None:
    """None once the server's statistics show ``count`` slow-client disconnects for
    ``cause`` and nothing queued for anyone (the disconnected client's bytes freed)."""
    stats = server.statistics()["limits"]["queued"]
    if stats["slow_client_disconnects"][cause] == count and stats["bytes"] < 64 * 1024:
        return None
    return f"queued statistics {stats}"


def slow_disconnects(server: ServerProcess) -> list[str]:
    return log_lines(server, "70-0004")


async def read_slow_client_end(conn: RawClient, line: str) -> None:
    """After its disconnect is logged (``line``), the slow client reads what is left
    and must see EOF. The server writes whole frames and then a ``slow client`` notice
    if the client reads within SLOW_CLIENT_FLUSH_TIMEOUT (5 s), so a reader that starts soon
    gets exactly that; one that starts later may see a cut frame instead."""
    logged = datetime.fromisoformat(line.split()[0])
    lag = (datetime.now(UTC) - logged).total_seconds()
    began = trio.current_time()
    end = await conn.read_to_end(10)
    took = trio.current_time() - began
    leftover = conn.decoder.buffered
    print(
        f"slow client started reading {lag:.2f} s after its disconnect was logged, read "
        f"{conn.received} bytes, {len(conn.frames)} frames, then {end} {took:.2f} s later; "
        f"{leftover} bytes of a cut frame"
    )
    assert end == "eof", f"expected a clean close, got {end}"
    if lag < 0.5:
        assert leftover == 0, f"the stream ended inside a frame ({leftover} bytes of it)"
        last = conn.frames[-1].header
        assert last.get("reason") == "slow client", last
        assert "resume by bookmark" in last.get("detail", ""), last
    else:
        print("reader started too late to be owed the notice; not checking it")


async def test_subscriber_that_stops_reading_is_disconnected_and_sees_eof(
    tmp_path: Path,
) -> None:
    server = start_instance(
        tmp_path,
        "slow",
        transport_extra="<ClientMaxCapacity>1MB</ClientMaxCapacity>",
        extra="<MessageMemoryLimit>64MB</MessageMemoryLimit>",
    )
    try:
        slow = await raw_logon(server.port, "sleepy", rcvbuf=16 * 1024)
        ack = await slow.command({"c": "subscribe", "t": "feed", "sub_id": "s1"})
        assert ack.header["status"] == "success", ack.header
        # it stops reading here
        async with open_client(server.uri, "pusher") as pub:
            payload = b'{"pad":"' + b"p" * 16_000 + b'"}'
            pushed = await publish_until(
                pub, [("feed", payload)], lambda _: bool(slow_disconnects(server))
            )
            (line,) = slow_disconnects(server)
            assert "'sleepy'" in line and "ClientMaxCapacity of 1048576 bytes" in line, line
            await read_slow_client_end(slow, line)
            # the publisher was acknowledged throughout, and still is
            extra = await publish_until(pub, [("feed", payload)], lambda n: n >= 64)
            print(f"published {pushed} x 16 KB until the disconnect, {extra} after")
        await wait_until(lambda: queued_stats(server, "client_max_capacity", 1), 60)
        assert server.alive, server.tail()
    except trio.TooSlowError:
        raise AssertionError(f"a persisted ack did not come in time\n{server.tail()}") from None
    finally:
        server.stop()


async def test_instance_limit_disconnects_the_biggest_of_two_slow_subscribers(
    tmp_path: Path,
) -> None:
    limit = 12 * MiB
    server = start_instance(
        tmp_path,
        "pool",
        extra="<MessageMemoryLimit>12MB</MessageMemoryLimit><ClientMaxCapacity>1GB</ClientMaxCapacity>"
        "<MessageDiskLimit>0</MessageDiskLimit>",
    )
    try:
        # "big" gets every message twice as often as "small"; neither reads
        big = await raw_logon(server.port, "big", rcvbuf=16 * 1024)
        small = await raw_logon(server.port, "small", rcvbuf=16 * 1024)
        for conn, topics in ((big, ("x", "y")), (small, ("x",))):
            for topic in topics:
                ack = await conn.command({"c": "subscribe", "t": topic, "sub_id": topic})
                assert ack.header["status"] == "success", ack.header
        async with open_client(server.uri, "pusher") as pub:
            payload = b'{"pad":"' + b"p" * 16_000 + b'"}'
            await publish_until(
                pub, [("x", payload), ("y", payload)], lambda _: bool(slow_disconnects(server))
            )
            (line,) = slow_disconnects(server)
            print(line)
            assert "'big'" in line and "over MessageMemoryLimit of 12582912 bytes" in line, line
            figures = re.search(r"most bytes waiting \((\d+)\).* have (\d+),", line)
            assert figures is not None, line
            held, total = int(figures[1]), int(figures[2])
            # the sum passed the limit, not the big one alone: the small one held the rest
            assert held <= limit < total, (held, total)
            await read_slow_client_end(big, line)
            # the small one stays: it reads its backlog, then answers a command
            ack = await small.command({"c": "flush"}, timeout=20)
            assert ack.header["status"] == "success", ack.header
            await pub.publish_persisted("x", b'{"after":1}', timeout=20)
        assert slow_disconnects(server) == [line]
        await wait_until(lambda: queued_stats(server, "message_memory_limit", 1), 60)
        assert server.alive, server.tail()
    finally:
        server.stop()
