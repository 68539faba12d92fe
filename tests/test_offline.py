"""Slow-client offlining, in process: a subscriber that stops reading while a publisher
publishes a fixed amount past a small MessageMemoryLimit.

What a user relies on: the slow subscriber is offlined, not dropped (its backlog goes
to a spill file under MessageDiskPath, and the admin statistics say so); the
instance's memory for waiting messages stays under MessageMemoryLimit plus a bounded
overhead; the other subscriber keeps receiving everything; when the slow one reads
again it gets every message, in order, and comes back online by itself (its spill file
gone). With a small MessageDiskLimit it is disconnected as a slow client instead, and
its spill file is removed.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from harness import wait_until
from inprocess import InProcessInstance, serve_instance

from amps_py.admin.console import clients_table
from amps_py.admin.http import client_entry, client_sessions
from amps_py.admin.metrics import InstanceCollector
from amps_py.client import open_client
from amps_py.protocol import Frame, FrameDecoder, encode_frame
from amps_py.server.flow import SEND_CHUNK

MiB = 1024 * 1024
#: an Action for each of offline-start and offline-stop (their runs are counted)
OFFLINE_ACTIONS = (
    "<Actions>"
    + "".join(
        f"<Action><On><Module>amps-action-on-offline-{edge}</Module></On>"
        "<Do><Module>amps-action-do-nothing</Module></Do></Action>"
        for edge in ("start", "stop")
    )
    + "</Actions>"
)
SIZE = 4096
#: what the waiting-message memory may exceed MessageMemoryLimit by: the slow client's
#: batch being written when it stopped reading (at most SEND_CHUNK) plus a round of
#: messages and acks queued before the limit is acted on
OVERHEAD = SEND_CHUNK + 512 * 1024


class RawSubscriber:
    """A subscriber on a raw socket with a small receive buffer, so that when it stops
    reading the server's backlog for it builds up at once."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        self.eof = False

    @classmethod
    async def connect(
        cls, port: int, name: str, topic: str, bookmark: str | None = None
    ) -> RawSubscriber:
        """Log on as ``name`` and subscribe to ``topic`` (from ``bookmark`` if given)."""
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        await sock.connect(("127.0.0.1", port))
        sub = cls(trio.SocketStream(sock))
        await sub.command({"c": "logon", "client_name": name, "cid": "l"})
        subscribe = {"c": "subscribe", "t": topic, "sub_id": "s1", "cid": "s"}
        if bookmark is not None:
            subscribe["bm"] = bookmark
        await sub.command(subscribe)
        return sub

    async def command(self, header: dict[str, Any]) -> None:
        """Send ``header`` and wait for its successful processed ack; the frames read
        meanwhile are dropped, except the messages."""
        header["a"] = "processed"
        await self.stream.send_all(encode_frame(header))
        with trio.fail_after(60):
            while not (acks := [f for f in self.frames if f.header.get("cid") == header["cid"]]):
                await self.read_some()
        assert acks[0].header.get("status") == "success", acks[0].header
        self.frames = [f for f in self.frames if f.command == "publish"]

    async def read_some(self) -> None:
        data = await self.stream.receive_some(256 * 1024)
        if not data:
            self.eof = True
            return
        self.decoder.receive_data(data)
        self.frames.extend(self.decoder.frames())

    @property
    def messages(self) -> list[int]:
        """The indexes of the messages received, in order of arrival."""
        return [int(f.payload[:8]) for f in self.frames if f.command == "publish"]

    async def read_until(self, count: int, timeout: float) -> None:
        with trio.fail_after(timeout):
            while len(self.messages) < count and not self.eof:
                await self.read_some()

    async def read_forever(self) -> None:
        while not self.eof:
            await self.read_some()


def payload(i: int) -> bytes:
    return f"{i:08d}".encode() + b"x" * (SIZE - 8)


def metrics_of(served: InProcessInstance) -> dict[tuple[str, str], float]:
    """The /metrics samples: (name, client label or "") -> value."""
    return {
        (sample.name, sample.labels.get("client", "")): sample.value
        for family in InstanceCollector(served.instance).collect()
        for sample in family.samples
    }


def render(table: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def session_of(served: InProcessInstance, name: str) -> Any:
    (session,) = [s for s in served.instance.sessions if s.client_name == name]
    return session


@asynccontextmanager
async def offline_setup(
    tmp_path: Path, disk_limit: str
) -> AsyncIterator[tuple[InProcessInstance, Path, RawSubscriber, RawSubscriber]]:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    extra = (
        "<MessageMemoryLimit>4MB</MessageMemoryLimit><ClientMaxCapacity>1GB</ClientMaxCapacity>"
        f"<MessageDiskLimit>{disk_limit}</MessageDiskLimit>"
        f"<MessageDiskPath>{spill_dir}</MessageDiskPath>{OFFLINE_ACTIONS}"
    )
    async with serve_instance(tmp_path, "off", extra=extra) as served:
        slow = await RawSubscriber.connect(served.port, "sleepy", "feed")
        fast = await RawSubscriber.connect(served.port, "steady", "feed")
        try:
            yield served, spill_dir, slow, fast
        finally:
            await trio.aclose_forcefully(slow.stream)
            await trio.aclose_forcefully(fast.stream)


async def publish(served: InProcessInstance, count: int) -> int:
    """Publish ``count`` messages in persisted-ack rounds of 64; returns the largest
    waiting-message memory seen after a round."""
    limits = served.instance.limits
    worst = 0
    async with open_client(served.uri, "pub") as pub:
        for start in range(0, count, 64):
            seq = 0
            for i in range(start, min(count, start + 64)):
                seq = await pub.publish("feed", payload(i))
            await pub.wait_persisted(seq, timeout=20)
            worst = max(worst, limits.queued.total)
    return max(worst, limits.queued.peak)


async def test_a_slow_subscriber_is_offlined_drains_in_order_and_comes_back_online(
    tmp_path: Path,
) -> None:
    count = 6000  # ~24 MiB, six times MessageMemoryLimit
    async with offline_setup(tmp_path, "1GB") as (served, spill_dir, slow, fast):
        limits = served.instance.limits
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fast.read_forever)
            worst = await publish(served, count)
            session = session_of(served, "sleepy")
            print(
                f"published {count} x {SIZE} B; waiting-message memory peaked at "
                f"{worst / MiB:.2f} MiB (limit 4 MiB, overhead allowed {OVERHEAD / MiB:.2f} MiB); "
                f"slow client: {session.spilled / MiB:.2f} MiB spilled, "
                f"{session.out_bytes / MiB:.2f} MiB waiting in all"
            )
            assert session.offline and limits.offline_clients == 1 and limits.offlined == 1
            assert worst <= 4 * MiB + OVERHEAD
            assert list(spill_dir.glob("amps-py-spill-*.spill"))
            offline = served.statistics()["limits"]["offline"]
            assert offline["clients"] == 1 and offline["spilled_bytes"] > 8 * MiB
            assert "70-0005" in served.log_text() and "'sleepy'" in served.log_text()
            actions = served.instance.actions
            assert actions is not None
            await wait_until(
                lambda: None if actions.stats[0].runs == 1 else "on-offline-start did not run",
                timeout=60,
            )
            assert actions.stats[1].runs == 0
            # the admin API and the metrics show it
            clients = {k: client_entry(s) for k, s in client_sessions(served.instance).items()}
            assert clients["sleepy"]["offline"] is True
            assert clients["sleepy"]["spill_bytes"] == session.spilled > 8 * MiB
            assert clients["steady"]["offline"] is False and clients["steady"]["spill_bytes"] == 0
            assert "offline" in render(clients_table(clients, 200))
            metrics = metrics_of(served)
            assert metrics[("amps_offline_clients", "")] == 1
            assert metrics[("amps_clients_spilled_bytes", "")] == limits.disk.total > 8 * MiB
            assert metrics[("amps_client_spill_bytes", "sleepy")] == session.spilled

            # the other subscriber was not held back
            await wait_until(
                lambda: None if len(fast.messages) == count else f"{len(fast.messages)}",
                timeout=60,
            )
            assert fast.messages == list(range(count))
            assert session_of(served, "steady").offline is False

            # the slow one reads again: everything, in order, then online by itself
            await slow.read_until(count, timeout=60)
            assert slow.messages == list(range(count))
            await wait_until(
                lambda: None if limits.offline_clients == 0 else "still offline", timeout=60
            )
            assert not session.offline and session.spilled == 0
            assert list(spill_dir.iterdir()) == []
            assert limits.disk.total == 0
            assert "70-0006" in served.log_text()
            await wait_until(
                lambda: None if actions.stats[1].runs == 1 else "on-offline-stop did not run",
                timeout=60,
            )
            assert client_entry(session)["offline"] is False
            assert metrics_of(served)[("amps_offline_clients", "")] == 0
            nursery.cancel_scope.cancel()


async def test_past_the_disk_limit_the_offline_subscriber_is_disconnected_and_its_file_removed(
    tmp_path: Path,
) -> None:
    count = 4000  # ~16 MiB: past MessageMemoryLimit, then past MessageDiskLimit
    async with offline_setup(tmp_path, "6MB") as (served, spill_dir, slow, fast):
        limits = served.instance.limits
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fast.read_forever)
            slow_done = trio.Event()

            async def read_once_disconnected() -> None:
                # it reads again at once, so it is owed the whole notice (not a cut frame)
                await wait_until(
                    lambda: None if limits.slow_client_disk == 1 else "not disconnected yet",
                    timeout=30,
                    interval=0.005,
                )
                with trio.fail_after(60):
                    await slow.read_forever()  # the server closes it: EOF after the notice
                slow_done.set()

            nursery.start_soon(read_once_disconnected)
            await publish(served, count)
            with trio.fail_after(60):
                await slow_done.wait()
            assert limits.offlined == 1 and limits.offline_clients == 0
            assert list(spill_dir.iterdir()) == []
            assert limits.disk.total == 0
            lines = [line for line in served.log_text().splitlines() if "70-0004" in line]
            assert len(lines) == 1 and "'sleepy'" in lines[0], lines
            assert "over MessageDiskLimit of 6291456 bytes" in lines[0], lines[0]
            received = slow.messages
            assert received == list(range(len(received)))  # a prefix, in order
            last = slow.frames[-1].header
            print(f"slow client got {len(received)} messages, then {last}")
            assert last.get("reason") == "slow client", last
            # the other subscriber is unaffected
            await wait_until(
                lambda: None if len(fast.messages) == count else f"{len(fast.messages)}",
                timeout=60,
            )
            assert fast.messages == list(range(count))
            nursery.cancel_scope.cancel()


async def test_a_subscriber_whose_oldest_message_waits_past_the_age_limit_is_disconnected(
    tmp_path: Path,
) -> None:
    """ClientMessageAgeLimit: a subscriber that stops reading is disconnected once a
    message has waited longer than the limit for it; one that reads (even after being
    idle longer than the limit) is not."""
    extra = "<ClientMessageAgeLimit>1s</ClientMessageAgeLimit>"
    async with serve_instance(tmp_path, "aged", extra=extra) as served:
        limits = served.instance.limits
        slow = await RawSubscriber.connect(served.port, "sleepy", "feed")
        fast = await RawSubscriber.connect(served.port, "steady", "feed")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fast.read_forever)
                # idle for longer than the limit, then one message: nobody is too old
                await trio.sleep(1.5)  # the idle time the limit must not count
                await publish(served, 1)
                await wait_until(lambda: None if fast.messages == [0] else "not yet", timeout=60)
                assert limits.slow_client_age == 0
                started = trio.current_time()
                # enough to fill the slow subscriber's socket buffers: a backlog waits
                await publish(served, 1000)
                await wait_until(
                    lambda: None if limits.slow_client_age == 1 else "not disconnected yet",
                    timeout=60,
                    interval=0.01,
                )
                took = trio.current_time() - started
                print(f"slow subscriber disconnected {took:.2f} s after the backlog began")
                assert took >= 1.0
                with trio.fail_after(60):
                    await slow.read_forever()  # EOF: the server closed it
                assert slow.frames[-1].header.get("reason") == "slow client"
                lines = [ln for ln in served.log_text().splitlines() if "70-0004" in ln]
                assert len(lines) == 1 and "'sleepy'" in lines[0], lines
                assert "over ClientMessageAgeLimit of 1 s" in lines[0], lines[0]
                await wait_until(
                    lambda: None if len(fast.messages) == 1001 else f"{len(fast.messages)}",
                    timeout=60,
                )
                assert fast.messages == list(range(1)) + list(range(1000))
                assert session_of(served, "steady").discarding is False
                nursery.cancel_scope.cancel()
        finally:
            await trio.aclose_forcefully(slow.stream)
            await trio.aclose_forcefully(fast.stream)
