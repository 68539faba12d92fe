"""Slow-client management end to end, against a real ``amps-py serve`` process.

Four publishers publish at a fixed rate; two subscribers keep up; one more subscriber
stops reading. What a user relies on, measured here and printed:

* the slow subscriber costs the instance no more memory than MessageMemoryLimit plus a
  stated overhead (the server's anonymous resident memory, read from /proc);
* it is offlined (the admin API shows it, with its spill file's size), drains from
  disk in order when it reads again, and comes back online by itself;
* the others do not pay for it: the fast subscribers' p99 delivery latency and the
  publishers' acknowledged rate stay close to a run without it (asserted loosely: the
  machine is shared; the figures are printed);
* stalled again past its MessageDiskLimit, it is disconnected as a slow client (it
  reads the ``slow client`` failure ack, then EOF) and its spill file is removed;
* it reconnects with the bookmark of the last message it got and receives everything
  it missed, in order, from the journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import ServerProcess, start_instance, wait_until
from test_offline import RawSubscriber

from amps_py.client import Client, open_client

MiB = 1024 * 1024
PUBLISHERS = 4
#: messages per second per publisher (fixed rate: what a feed does, not a flood)
RATE = 250
#: bytes of padding per message (about 4 KiB messages: 4 MB/s in all)
PAD = 4000
#: MessageMemoryLimit and MessageDiskLimit of the instance
MEMORY_LIMIT = 8 * MiB
DISK_LIMIT = 20 * MiB
#: seconds of each measured phase
PHASE_SECS = 3.0
#: What the server's anonymous memory may grow by over the run without the slow client,
#: beyond MessageMemoryLimit: the slow client's spill buffers (a 256 KiB write batch, a
#: 1 MiB read-ahead, a 256 KiB batch being written), the messages in flight to the fast
#: subscribers and publishers in the same moment, and what CPython's allocator keeps of
#: freed objects in arenas it cannot give back.
OVERHEAD = 6 * MiB
TOPIC = "feed"
#: AMPS's NOW bookmark: live messages only
NOW = "0|1|"
ADMIN = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"


def anon_rss(pid: int) -> int:
    """The process's anonymous resident memory (its heap; not the journal's mapped
    file pages), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no RssAnon line")


def admin_json(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=10) as response:
        return json.loads(response.read())


def payload(publisher: int, index: int, phase: int) -> bytes:
    head = orjson.dumps({"p": publisher, "i": index, "ph": phase, "t": time.monotonic()})
    return head[:-1] + b',"x":"' + b"x" * PAD + b'"}'


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@dataclass
class FastSubscriber:
    """Reads every message at once; keeps (publisher, index) in order of arrival and
    the delivery latency of each, by phase."""

    client: Client
    #: (publisher, index, phase) of each message, in order of arrival
    received: list[tuple[int, int, int]] = field(default_factory=list)
    latency: dict[int, list[float]] = field(default_factory=dict)

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with self.client.subscribe(TOPIC) as sub:
            task_status.started()
            async for message in sub:
                now = time.monotonic()
                doc = orjson.loads(message.data)
                self.received.append((doc["p"], doc["i"], doc["ph"]))
                self.latency.setdefault(doc["ph"], []).append(now - doc["t"])


class StallingSubscriber(RawSubscriber):
    """A bookmark subscriber on a raw socket with a small receive buffer
    (:class:`test_offline.RawSubscriber`), so a backlog builds on the server as soon as
    it stops reading; its messages carry (publisher, index, phase)."""

    @classmethod
    async def join(cls, port: int, bookmark: str) -> StallingSubscriber:
        sub = await cls.connect(port, "laggard", TOPIC, bookmark)
        assert isinstance(sub, StallingSubscriber)
        return sub

    @property
    def received(self) -> list[tuple[int, int, int]]:
        """(publisher, index, phase) of each message received, in order."""
        out = []
        for frame in self.frames:
            if frame.command == "publish":
                doc = orjson.loads(frame.payload)
                out.append((doc["p"], doc["i"], doc["ph"]))
        return out

    async def read_until(self, count: int, timeout: float) -> None:
        with trio.fail_after(timeout):
            while len(self.received) < count and not self.eof:
                await self.read_some()

    async def read_to_eof(self, timeout: float) -> None:
        with trio.fail_after(timeout):
            while not self.eof:
                await self.read_some()


@dataclass
class PhaseResult:
    published: int
    acked_rate: float


class Feed:
    """The four publishers: each publishes at RATE a second and waits for the
    persisted ack of its last message; indexes keep counting across phases."""

    def __init__(self, clients: list[Client]) -> None:
        self.clients = clients
        self.next_index = [0] * len(clients)

    async def phase(
        self, phase: int, secs: float | None, stop: trio.Event | None = None
    ) -> PhaseResult:
        """Publish for ``secs`` seconds (or until ``stop`` is set); returns how many
        were published and at what rate they were acknowledged as persisted."""
        published = [0] * len(self.clients)
        started = trio.current_time()

        async def one(p: int) -> None:
            client = self.clients[p]
            seq = 0
            k = 0
            while True:
                due = started + k / RATE
                if (secs is not None and k >= secs * RATE) or (stop is not None and stop.is_set()):
                    break
                await trio.sleep_until(due)  # the fixed publishing rate, not synchronisation
                seq = await client.publish(TOPIC, payload(p, self.next_index[p], phase))
                self.next_index[p] += 1
                k += 1
            published[p] = k
            if seq:
                await client.wait_persisted(seq, timeout=60)

        async with trio.open_nursery() as nursery:
            for p in range(len(self.clients)):
                nursery.start_soon(one, p)
        took = trio.current_time() - started
        return PhaseResult(sum(published), sum(published) / took)


class MemoryWatch:
    """Samples the server's anonymous resident memory every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0

    def reset(self) -> None:
        self.peak = anon_rss(self.pid)

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, anon_rss(self.pid))
            await trio.sleep(0.02)  # the sampling interval


async def test_a_subscriber_that_stops_reading_is_offlined_then_disconnected_and_resumes(
    tmp_path: Path,
) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    extra = (
        f"<MessageMemoryLimit>{MEMORY_LIMIT // MiB}MB</MessageMemoryLimit>"
        f"<MessageDiskLimit>{DISK_LIMIT // MiB}MB</MessageDiskLimit>"
        f"<MessageDiskPath>{spill_dir}</MessageDiskPath>"
        "<ClientMaxCapacity>100%</ClientMaxCapacity>" + ADMIN
    )
    server = start_instance(tmp_path, "slow", extra=extra)
    try:
        await run_scenario(server, spill_dir)
    finally:
        server.stop()


async def run_scenario(server: ServerProcess, spill_dir: Path) -> None:
    assert server.proc is not None
    admin = f"http://127.0.0.1:{server.ports['admin']}"
    memory = MemoryWatch(server.proc.pid)
    clients: list[Client] = []
    async with trio.open_nursery() as nursery:
        for p in range(PUBLISHERS):
            clients.append(await nursery.start(_client_task, server.uri, f"pub-{p}"))
        fast = [
            FastSubscriber(await nursery.start(_client_task, server.uri, f"fast-{n}"))
            for n in range(2)
        ]
        for sub in fast:
            await nursery.start(sub.run)
        feed = Feed(clients)
        nursery.start_soon(memory.run)

        # 1. the run without the slow client (after a second of warm-up)
        await feed.phase(0, 1.0)
        memory.reset()
        base = await feed.phase(1, PHASE_SECS)
        base_peak = memory.peak
        base_p99 = max(percentile(s.latency[1], 0.99) for s in fast)

        # 2. the same run while one subscriber has stopped reading
        slow = await StallingSubscriber.join(server.port, NOW)
        memory.reset()
        with_slow = await feed.phase(2, PHASE_SECS)
        slow_peak = memory.peak
        slow_p99 = max(percentile(s.latency[2], 0.99) for s in fast)
        clients_now = admin_json(admin, "/amps/instance/clients.json")
        laggard = clients_now["laggard"]
        stalled_bytes = with_slow.published * (PAD + 60)
        print(
            f"run without the slow client: {base.acked_rate:,.0f} msg/s acked, fast p99 "
            f"{base_p99 * 1e3:.1f} ms, server heap peak {base_peak / MiB:.1f} MiB\n"
            f"run with it: {with_slow.acked_rate:,.0f} msg/s acked "
            f"({with_slow.acked_rate / base.acked_rate:.2f} of it), fast p99 "
            f"{slow_p99 * 1e3:.1f} ms ({slow_p99 / base_p99:.2f}x), server heap peak "
            f"{slow_peak / MiB:.1f} MiB (+{(slow_peak - base_peak) / MiB:.1f} MiB; limit "
            f"{MEMORY_LIMIT / MiB:.0f} MiB + stated overhead {OVERHEAD / MiB:.0f} MiB) while "
            f"about {stalled_bytes / MiB:.1f} MiB waited for the slow client\n"
            f"admin shows it: offline={laggard['offline']} spill_bytes={laggard['spill_bytes']:,} "
            f"queued_bytes={laggard['queued_bytes']:,}"
        )
        assert laggard["offline"] is True and laggard["spill_bytes"] > MEMORY_LIMIT // 2, laggard
        assert list(os.scandir(spill_dir)), "no spill file under MessageDiskPath"
        assert slow_peak - base_peak <= MEMORY_LIMIT + OVERHEAD
        # loosely: the figures to meet are 2x and 0.7 (printed above)
        assert slow_p99 <= max(4 * base_p99, base_p99 + 0.05)
        assert with_slow.acked_rate >= 0.5 * base.acked_rate

        # 3. it reads again: everything since it subscribed, in order, then online
        # (it subscribed before phase 2 began: it is owed every message from there)
        await fast_caught_up(feed, fast[0])
        expected = [m for m in fast[0].received if m[2] >= 2]
        await slow.read_until(len(expected), timeout=60)
        assert slow.received == expected
        await wait_until(lambda: _offline_state(admin, want=False), timeout=60)
        assert list(os.scandir(spill_dir)) == []

        # 4. it stalls again until it passes MessageDiskLimit: disconnected
        stop = trio.Event()
        disconnected = {}

        async def watch_disconnect() -> None:
            def check() -> str | None:
                limits = admin_json(admin, "/amps/instance/limits.json")
                counts = limits["queued"]["slow_client_disconnects"]
                if sum(counts.values()) == 0:
                    return f"not disconnected yet: {limits['offline']}"
                disconnected.update(counts)
                return None

            await wait_until(check, timeout=60, interval=0.02)
            stop.set()

        async with trio.open_nursery() as watchers:
            watchers.start_soon(watch_disconnect)
            await feed.phase(3, None, stop)
        await slow.read_to_eof(timeout=20)
        last = slow.frames[-1].header
        print(f"slow client disconnected ({disconnected}); its last frame: {last}")
        assert last.get("reason") == "slow client", last
        assert list(os.scandir(spill_dir)) == []
        # the admin API, the metrics and `amps-py admin clients` say who went and why
        ended = admin_json(admin, "/amps/instance/disconnects.json")
        gone = next(d for d in ended["recent"] if d["client_name"] == "laggard")
        assert gone["reason"] == "slow client" and "ClientMaxCapacity" in gone["detail"], gone
        assert ended["counts"]["slow client"] == 1, ended["counts"]
        metrics = await trio.to_thread.run_sync(_get_text, admin + "/metrics")
        assert 'amps_client_disconnects_total{instance="slow",reason="slow client"} 1.0' in (
            metrics
        )
        shown = await trio.to_thread.run_sync(_admin_cli, admin, "clients")
        assert "recent disconnects" in shown and "laggard" in shown, shown
        assert "slow client" in shown, shown
        got_before = slow.received
        assert got_before[: len(expected)] == expected
        last_bookmark = next(
            f.header["bm"] for f in reversed(slow.frames) if f.command == "publish"
        )
        await trio.aclose_forcefully(slow.stream)

        # 5. it resumes from its last bookmark: what it missed, in order
        await feed.phase(4, 0.5)
        await fast_caught_up(feed, fast[0])
        full = [m for m in fast[0].received if m[2] >= 2]
        assert got_before == full[: len(got_before)]
        missed = full[len(got_before) :]
        resumed = await StallingSubscriber.join(server.port, last_bookmark)
        await resumed.read_until(len(missed), timeout=60)
        print(
            f"slow client got {len(got_before)} messages before it was disconnected, and "
            f"the {len(missed)} it missed after resuming from {last_bookmark}"
        )
        assert resumed.received == missed
        await trio.aclose_forcefully(resumed.stream)
        nursery.cancel_scope.cancel()


async def fast_caught_up(feed: Feed, sub: FastSubscriber) -> None:
    """Wait until ``sub`` has every message published so far."""

    def check() -> str | None:
        published = sum(feed.next_index)
        if len(sub.received) == published:
            return None
        return f"a fast subscriber has {len(sub.received)} of {published} messages"

    await wait_until(check, timeout=30)


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _admin_cli(url: str, *args: str) -> str:
    """``amps-py admin --url URL ARGS`` as a user runs it, on a wide terminal."""
    done = subprocess.run(
        [sys.executable, "-m", "amps_py", "admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _offline_state(admin: str, *, want: bool) -> str | None:
    clients = admin_json(admin, "/amps/instance/clients.json")
    entry = clients.get("laggard")
    if entry is None:
        return "the slow client is not listed"
    if entry["offline"] is not want:
        return f"offline is {entry['offline']}, spill_bytes {entry['spill_bytes']}"
    return None


async def _client_task(uri: str, name: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with open_client(uri, name) as client:
        task_status.started(client)
        await trio.sleep_forever()
