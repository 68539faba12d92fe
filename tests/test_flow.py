"""The client limits acting on connections (amps_py.server.flow), with stand-in
connections: who is closed, with what reason, what is counted and what the client is
told. No sockets, no event loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from amps_py import events, reasons
from amps_py.protocol import FrameDecoder, PartialFrame, messages
from amps_py.server.flow import (
    close_over_incomplete_limit,
    deadline_passed,
    disconnect_if_too_old,
    disconnect_slow_clients,
)
from amps_py.server.limits import ClientPools, Closing, InstanceLimits, ReadDeadline


def header_of(data: bytes) -> dict[str, Any]:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    (frame,) = decoder.frames()
    return frame.header


@dataclass(eq=False)
class StubDecoder:
    partial: PartialFrame | None = None

    def partial_frame(self) -> PartialFrame | None:
        return self.partial


@dataclass(eq=False)
class StubSession:
    """Keeps the pools' books the way a Session does: in its transport's pools."""

    limits: InstanceLimits
    conn_id: int
    client_name: str = ""
    peer: str = "127.0.0.1:4000"
    transport: str = "json-tcp"
    logon_timeout: float = 5.0
    frame_timeout: float = 2.0
    incomplete_held: int = 0
    out_bytes: int = 0
    queue_limit: int = 1 << 30
    disk_queue_limit: int = 1 << 30
    discarding: bool = False
    offline: bool = False
    spilled: int = 0
    #: go_offline fails (as a SpillError would make it)
    spill_fails: bool = False
    #: when its oldest unwritten message was queued (None: nothing waits)
    oldest_since: float | None = None
    #: bookmark replays running
    replaying: int = 0
    decoder: StubDecoder = field(default_factory=StubDecoder)
    sent: list[bytes] = field(default_factory=list)
    closed: str = ""
    dropped: str = ""
    slow: Closing | None = None
    #: where go_offline spilled
    spilled_to: Path | None = None

    @property
    def pools(self) -> ClientPools:
        return self.limits.pools_for(self.transport)

    def hold_partial(self, n: int) -> None:
        self.incomplete_held += n
        self.limits.incomplete.total += n
        self.decoder.partial = PartialFrame(n, n * 2, 0.0)

    def queue(self, n: int) -> None:
        self.out_bytes += n
        self.pools.memory.total += n

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self, reason: str) -> None:
        self.closed = self.closed or reason

    def drop_partial_frame(self, reason: str) -> None:
        self.limits.incomplete.total -= self.incomplete_held
        self.incomplete_held = 0
        self.dropped = reason

    def oldest_age(self, now: float) -> float:
        return 0.0 if self.oldest_since is None else now - self.oldest_since

    @property
    def memory_held(self) -> int:
        return self.out_bytes - self.spilled

    def spill(self, n: int) -> None:
        """Queue ``n`` bytes while offline."""
        self.out_bytes += n
        self.spilled += n
        self.pools.disk.total += n

    def go_offline(self, directory: Path) -> bool:
        if self.spill_fails:
            self.disconnect_slow(
                Closing(
                    reasons.SLOW_CLIENT, "spill failed", events.CLIENT_SLOW_DISCONNECTED, "", ()
                )
            )
            return False
        moved = self.out_bytes - self.spilled
        self.offline = True
        self.spilled_to = directory
        self.spilled += moved
        self.pools.memory.total -= moved
        self.pools.disk.total += moved
        return True

    def disconnect_slow(self, closing: Closing) -> None:
        if self.discarding:
            return
        self.discarding = True
        self.slow = closing
        self.pools.memory.total -= self.out_bytes - self.spilled
        self.pools.disk.total -= self.spilled


def sessions(limits: InstanceLimits, n: int) -> list[StubSession]:
    return [StubSession(limits, i, client_name=f"c{i}") for i in range(n)]


def test_unfinished_frames_over_the_limit_close_the_biggest_holders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = InstanceLimits(message_memory_limit=1 << 30, incomplete_limit=1000)
    small, big, middle = sessions(limits, 3)
    small.hold_partial(100)
    big.hold_partial(700)
    middle.hold_partial(400)  # 1200 held, 200 over
    with caplog.at_level(logging.WARNING, logger="amps_py.server.session"):
        close_over_incomplete_limit(limits, [small, big, middle])
    assert big.closed == big.dropped == reasons.INCOMPLETE_MESSAGE_MEMORY_LIMIT
    assert small.closed == middle.closed == ""  # the pool is back within its limit
    assert limits.incomplete.total == 500 and limits.incomplete_pool == 1
    (record,) = caplog.records
    assert record.getMessage().startswith("closing connection 1 (client 'c1', 127.0.0.1:4000)")
    assert "together hold 1200 bytes, over IncompleteMessageMemoryLimit of 1000" in (
        record.getMessage()
    )
    assert getattr(record, "code", None) == events.CLIENT_INCOMPLETE_MESSAGE_MEMORY


def test_a_client_past_its_own_capacity_goes_first_then_the_biggest() -> None:
    # MessageDiskLimit 0: no offlining, the biggest is disconnected
    limits = InstanceLimits(message_memory_limit=1000, incomplete_limit=1 << 30, disk_limit=0)
    mine, bigger, other = sessions(limits, 3)
    mine.queue_limit = 300
    mine.queue(400)
    bigger.queue(600)
    other.queue(200)  # 1200 queued: over the pool and mine over its capacity
    disconnect_slow_clients(mine, limits, [mine, bigger, other])
    assert mine.slow is not None and bigger.slow is None  # 800 left: within the pool
    assert "over its ClientMaxCapacity of 300 bytes" in mine.slow.detail
    assert (limits.slow_client_capacity, limits.slow_client_pool) == (1, 0)

    other.queue(300)  # 1100 queued by bigger (600) and other (500)
    disconnect_slow_clients(other, limits, [mine, bigger, other])
    assert bigger.slow is not None and other.slow is None
    assert bigger.slow.reason == reasons.SLOW_CLIENT
    assert "the most bytes waiting (600) and all clients together have 1100" in (bigger.slow.detail)
    assert (limits.slow_client_capacity, limits.slow_client_pool) == (1, 1)


def test_over_the_memory_limit_the_biggest_in_memory_is_offlined_not_disconnected(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=10_000, disk_path=tmp_path)
    small, big, middle = sessions(limits, 3)
    small.queue(200)
    big.queue(700)
    middle.queue(400)  # 1300 in memory, over 1000
    with caplog.at_level(logging.WARNING, logger="amps_py.server.session"):
        disconnect_slow_clients(small, limits, [small, big, middle])
    assert big.offline and not small.offline and not middle.offline
    assert big.slow is None and small.slow is None and middle.slow is None
    assert (limits.queued.total, limits.disk.total, limits.offlined) == (600, 700, 1)
    (record,) = caplog.records
    assert getattr(record, "code", None) == events.CLIENT_OFFLINE_START
    assert "offlined client 'c1'" in record.getMessage()
    message = record.getMessage()
    assert "the most bytes waiting in memory (700) and all clients together have 1300" in message
    assert f"spills to {tmp_path}" in record.getMessage()


def test_a_replay_holding_the_pool_does_not_offline_small_clients_one_by_one(
    tmp_path: Path,
) -> None:
    """A bookmark replay is exempt; with it holding most of the pool, offlining the
    clients that hold under 1 % of the limit (a publisher's acks) frees nothing: seen
    as 286 offlinings of a publisher and a caught-up subscriber in one test run."""
    limits = InstanceLimits(100_000, 1 << 30, disk_limit=1 << 30, disk_path=tmp_path)
    replayer, publisher, reader, big = sessions(limits, 4)
    replayer.replaying = 1
    replayer.queue(99_900)
    publisher.queue(93)
    reader.queue(38)
    disconnect_slow_clients(publisher, limits, [replayer, publisher, reader])
    assert not publisher.offline and not reader.offline and not replayer.offline
    assert limits.offlined == 0
    big.queue(5_000)  # one holding 5 % of the limit still goes
    disconnect_slow_clients(big, limits, [replayer, publisher, reader, big])
    assert big.offline and not publisher.offline and limits.offlined == 1


def test_a_lone_slow_client_at_100_percent_capacity_is_offlined_not_disconnected(
    tmp_path: Path,
) -> None:
    """ClientMaxCapacity 100% means no limit of its own (AMPS): a client holding all
    of MessageMemoryLimit is past its capacity and the pool at once, and is offlined,
    as the pool's biggest; past its share of MessageDiskLimit it is disconnected."""
    limits = InstanceLimits(1000, 1 << 30, disk_limit=5000, disk_path=tmp_path)
    (lone,) = sessions(limits, 1)
    lone.queue_limit, lone.disk_queue_limit = 1000, 5000  # 100% of each
    lone.queue(1200)
    disconnect_slow_clients(lone, limits, [lone])
    assert lone.offline and lone.slow is None and limits.offlined == 1
    assert limits.slow_client_capacity == 0
    lone.spill(4000)  # 5200 spilled: past its share of the disk limit
    disconnect_slow_clients(lone, limits, [lone])
    assert lone.slow is not None and "ClientMaxCapacity share of MessageDiskLimit" in (
        lone.slow.detail
    )


def test_an_offline_client_is_not_offlined_again_and_spill_failure_disconnects(
    tmp_path: Path,
) -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=10_000, disk_path=tmp_path)
    offline, failing, other = sessions(limits, 3)
    offline.queue(500)
    offline.go_offline(tmp_path)
    offline.queue(600)  # appended while offline... counted in memory by the stub
    failing.queue(700)
    failing.spill_fails = True
    other.queue(100)  # memory: 600 + 700 + 100
    disconnect_slow_clients(other, limits, [offline, failing, other])
    # the biggest online holder is tried; its spill failed, so it is disconnected
    assert failing.slow is not None and failing.slow.reason == reasons.SLOW_CLIENT
    assert offline.slow is None and other.slow is None and limits.offlined == 0


def test_over_the_disk_limit_the_biggest_offline_client_is_disconnected() -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=1000)
    a, b, online = sessions(limits, 3)
    a.offline = b.offline = True
    a.spill(300)
    b.spill(800)  # 1100 on disk, over 1000
    online.queue(900)  # within the memory limit: stays
    disconnect_slow_clients(a, limits, [a, b, online])
    assert b.slow is not None and a.slow is None and online.slow is None
    assert b.slow.reason == reasons.SLOW_CLIENT
    assert "over MessageDiskLimit of 1000 bytes" in b.slow.detail
    assert (limits.disk.total, limits.slow_client_disk) == (300, 1)


def test_an_offline_client_past_its_share_of_the_disk_limit_is_disconnected() -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=1 << 20)
    (session,) = sessions(limits, 1)
    session.offline = True
    session.disk_queue_limit = 500
    session.queue_limit = 100  # the memory share does not apply while offline
    session.spill(400)
    disconnect_slow_clients(session, limits, [session])
    assert session.slow is None
    session.spill(200)
    disconnect_slow_clients(session, limits, [session])
    assert session.slow is not None and session.slow.reason == reasons.SLOW_CLIENT
    assert "offline with 600 bytes spilled" in session.slow.detail
    assert "ClientMaxCapacity share of MessageDiskLimit (500 bytes)" in session.slow.detail
    assert limits.slow_client_capacity == 1


def test_a_client_whose_oldest_message_is_past_the_age_limit_is_disconnected() -> None:
    limits = InstanceLimits(1 << 30, 1 << 30, age_limit=30.0)
    (session,) = sessions(limits, 1)
    assert not disconnect_if_too_old(session, limits, now=100.0)  # nothing waits
    session.oldest_since = 75.0
    assert not disconnect_if_too_old(session, limits, now=105.0)  # exactly 30 s: allowed
    assert disconnect_if_too_old(session, limits, now=105.5)
    assert session.slow is not None and session.slow.reason == reasons.SLOW_CLIENT
    assert "oldest message has waited 30.5 s" in session.slow.detail
    assert "over ClientMessageAgeLimit of 30 s" in session.slow.detail
    assert limits.slow_client_age == 1
    assert not disconnect_if_too_old(session, limits, now=200.0)  # already going
    # no limit configured: never
    no_limit = InstanceLimits(1 << 30, 1 << 30)
    (other,) = sessions(no_limit, 1)
    other.oldest_since = 0.0
    assert not disconnect_if_too_old(other, no_limit, now=1e9)


def test_the_default_message_disk_limit_is_1_gib_or_the_memory_limit() -> None:
    assert InstanceLimits(1000, 1).disk.limit == 1024**3
    assert InstanceLimits(4 * 1024**3, 1).disk.limit == 4 * 1024**3
    assert InstanceLimits(1000, 1, disk_limit=0).offlining is False
    assert InstanceLimits(1000, 1, disk_limit=5).disk.limit == 5


def test_a_missed_logon_deadline_is_counted_and_told() -> None:
    limits = InstanceLimits(1 << 30, 1 << 30)
    (session,) = sessions(limits, 1)
    reason = deadline_passed(session, ReadDeadline(5.0, "logon"), limits)
    assert reason == reasons.LOGON_TIMEOUT
    assert (limits.logon_timeouts, limits.incomplete_timeouts) == (1, 0)
    (ack,) = session.sent
    header = header_of(ack)
    assert (header["a"], header["status"], header["reason"]) == (
        "processed",
        "failure",
        reasons.LOGON_TIMEOUT,
    )
    assert ack == messages.ack("processed", "failure", reason=reason, detail=header["detail"])


def test_a_missed_frame_deadline_is_counted_with_the_frame_it_waited_for() -> None:
    limits = InstanceLimits(1 << 30, 1 << 30)
    (session,) = sessions(limits, 1)
    session.hold_partial(30)
    assert deadline_passed(session, ReadDeadline(5.0, "frame"), limits) == (
        reasons.INCOMPLETE_MESSAGE_TIMEOUT
    )
    assert limits.incomplete_timeouts == 1
    assert "(30 of 60 bytes)" in header_of(session.sent[0])["detail"]


def test_a_real_decoder_reports_what_the_deadline_names() -> None:
    """The Session hands flow its FrameDecoder: the stand-in's contract holds for it."""
    decoder = FrameDecoder()
    decoder.receive_data(b"\x00\x00\x00\x10abc", now=1.0)
    assert list(decoder.frames()) == []
    assert decoder.partial_frame() == PartialFrame(7, 20, 1.0)
