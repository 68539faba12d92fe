"""The writer's in-memory tail of committed records (what replication sends from)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio

from amps_py.server.writer import SLOW_SYNC_SECONDS, JournalWriter, RecentRecords
from txlog import Journal, Record
from txlog.journal import DIRECT_RECORDS


def committed(first: int, n: int, size: int = 10) -> tuple[list[Record], list[bytes]]:
    records = []
    for txid in range(first, first + n):
        rec = Record(topic="t", payload=b"x", pub_hash=1, seq=txid)
        rec.txid = txid
        records.append(rec)
    return records, [bytes(size)] * n


def test_after_returns_consecutive_records_up_to_the_limits() -> None:
    tail = RecentRecords(max_records=100)
    assert tail.after(0, 10, 5) is None  # empty: read the journal
    tail.add(*committed(1, 5))
    tail.add(*committed(6, 5))
    got = tail.after(2, 4, 10)
    assert got is not None
    assert [r.txid for r in got[0]] == [3, 4, 5, 6] and len(got[1]) == 4
    got = tail.after(7, 100, 9)  # never beyond what the caller knows is committed
    assert got is not None and [r.txid for r in got[0]] == [8, 9]
    assert tail.after(10, 10, 10) is None  # nothing newer held


def test_trimmed_records_are_read_from_the_journal_instead() -> None:
    tail = RecentRecords(max_records=10, max_bytes=1_000_000)
    for first in range(1, 100, 5):
        tail.add(*committed(first, 5))
    assert tail.after(0, 10, 100) is None
    got = tail.after(99, 10, 100)
    assert got is not None and [r.txid for r in got[0]] == [100]
    oldest = min(t for t in range(101) if tail.after(t, 1, 100) is not None)
    assert 100 - oldest <= 15  # bounded: at most 1.5 x max_records kept


def test_bytes_bound_the_tail_too() -> None:
    tail = RecentRecords(max_records=1000, max_bytes=1000)
    for first in range(1, 200, 10):
        tail.add(*committed(first, 10, size=100))
    oldest = min(t for t in range(201) if tail.after(t, 1, 200) is not None)
    assert (200 - oldest) * 100 <= 1500


def test_a_gap_in_txids_resets_the_tail() -> None:
    tail = RecentRecords()
    tail.add(*committed(1, 5))
    tail.add(*committed(20, 5))  # the journal was written by someone else in between
    assert tail.after(3, 10, 24) is None
    got = tail.after(19, 10, 24)
    assert got is not None and [r.txid for r in got[0]] == [20, 21, 22, 23, 24]


def test_bytes_after_is_exact_inside_the_tail_and_unknown_before_it() -> None:
    tail = RecentRecords(max_records=100)
    tail.add(*committed(11, 5, size=10))
    tail.add(*committed(16, 5, size=30))
    assert tail.bytes_after(10) == 5 * 10 + 5 * 30  # everything held
    assert tail.bytes_after(13) == 2 * 10 + 5 * 30
    assert tail.bytes_after(20) == 0  # caught up
    assert tail.bytes_after(9) is None  # txid 10 is not held: ask the journal


def test_the_bytes_bound_counts_the_payloads_the_records_hold_too() -> None:
    """A record object keeps its payload besides its stored value: both are memory
    the tail holds, so both count against ``max_bytes``."""
    tail = RecentRecords(max_records=1000, max_bytes=10_000)
    for first in range(1, 200, 10):
        records, values = committed(first, 10, size=100)
        for rec in records:
            rec.payload = bytes(100)
        tail.add(records, values)
    oldest = min(t for t in range(201) if tail.after(t, 1, 200) is not None)
    assert (200 - oldest) * (100 + 100) <= 15_000


def test_a_tail_of_no_records_keeps_nothing() -> None:
    """An instance without replication destinations keeps no tail (nobody reads it):
    memory does not grow with what is published."""
    tail = RecentRecords(0, 0)
    for first in range(1, 100, 5):
        tail.add(*committed(first, 5, size=4096))
    assert tail.after(0, 10, 100) is None and tail.after(99, 10, 100) is None
    assert tail.bytes_after(50) is None


async def test_a_slow_fsync_sends_syncs_off_the_event_loop_for_a_while(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A small batch is synced in the event loop's thread (cheaper than a thread hand-
    off), but a disk that stalls must not stall the event loop again and again: after
    one slow fsync, syncs run on the writer thread for a while, and a warning says so.
    The slow disk is simulated by delaying the commit log's fsync (fault injection)."""
    journal = Journal(tmp_path / "j", instance_name="a")
    assert journal._log is not None
    real_flush = journal._log.flush
    threads: list[str] = []

    def slow_first_flush(fd: int) -> None:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            time.sleep(SLOW_SYNC_SECONDS * 2)  # the stalling disk, not synchronisation
        real_flush(fd)

    journal._log.flush = slow_first_flush  # type: ignore[method-assign]
    stored: list[int] = []
    writer = JournalWriter(journal, lambda recs, dropped: stored.extend(r.seq for r in recs))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            for seq in (1, 2):
                writer.submit(Record(topic="t", payload=b"{}", pub_hash=1, seq=seq))
                with trio.fail_after(60):
                    while seq not in stored:
                        await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    finally:
        journal.close()
    assert threads == [threading.main_thread().name, "amps-py journal writer"]
    assert "for the next 10 s every sync runs on the writer thread" in caplog.text


async def test_a_big_batch_goes_into_lmdb_on_the_writer_thread_after_the_staged_ones(
    tmp_path: Path,
) -> None:
    """A batch of DIRECT_RECORDS or more skips the commit log: the writer thread puts
    it into LMDB, after the batches staged in the log before it, in one transaction.
    Every record is stored once, in order, and LMDB holds them all (no log left)."""
    journal = Journal(tmp_path / "j", instance_name="a")
    stored: list[int] = []
    writer = JournalWriter(journal, lambda recs, dropped: stored.extend(r.txid for r in recs))
    big = DIRECT_RECORDS + 200
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            writer.submit(Record(topic="t", payload=b"{}", pub_hash=1, seq=1))  # small
            with trio.fail_after(60):
                while not stored:
                    await trio.sleep(0.001)
            # (now in the commit log only; LMDB takes it after 100 ms idle, or with
            # the big batch, which comes at once)
            for seq in range(2, big + 2):  # queued at once: one batch
                writer.submit(Record(topic="t", payload=b"{}", pub_hash=1, seq=seq))
            with trio.fail_after(30):
                while len(stored) < big + 1:
                    await trio.sleep(0.001)
            assert not journal.has_staged  # LMDB took the staged batch with the big one
            nursery.cancel_scope.cancel()
        assert stored == list(range(1, big + 2))
        assert writer.statistics().max_batch == big
    finally:
        journal.close()
    reopened = Journal(tmp_path / "j", instance_name="a")
    try:
        assert [r.seq for r in reopened.read(0, big + 10)] == list(range(1, big + 2))
    finally:
        reopened.close()
