"""The single journal writer: group commit on one worker thread.

Publishes are queued with :meth:`JournalWriter.submit` (never blocks). The writer
task takes everything queued since its last commit, appends it to the journal in
one LMDB transaction (one fsync) on a worker thread, then hands the committed
records to ``on_commit`` back in the trio thread. While a commit runs, new publishes
accumulate, so batches grow with load: throughput comes from batching, not from
weaker durability.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import outcome
import trio

from txlog import Journal, Record

log = logging.getLogger("amps_py.server.writer")
_T = TypeVar("_T")

#: most records in one transaction; bounds commit latency under a flood
MAX_BATCH = 8192
#: upper bounds (seconds) of the commit-latency histogram; the last bucket is +Inf
COMMIT_SECONDS_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: upper bounds (records) of the batch-size histogram; the last bucket is +Inf
BATCH_SIZE_BUCKETS: Final = (1, 10, 100, 1000, 4096, MAX_BATCH)


class RecentRecords:
    """The newest committed records and their stored values, by txid: a bounded
    in-memory tail of the journal.

    Replication destinations that keep up read fresh records here instead of reading
    them back from LMDB (no CRC check, no decoding: these are the objects and bytes
    just committed); a destination further behind than the tail reads the journal.
    Bounded by ``max_records`` and ``max_bytes`` (of stored values), trimmed from the
    oldest end.
    """

    def __init__(self, max_records: int = 32_768, max_bytes: int = 64 * 1024**2) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: list[Record] = []
        self._values: list[bytes] = []
        self._first = 0  # txid of _records[0]
        self._bytes = 0

    def add(self, records: list[Record], values: list[bytes]) -> None:
        """Append a commit's stored records (consecutive txids) and their values."""
        if not records:
            return
        if not self._records or records[0].txid != self._first + len(self._records):
            self._records, self._values, self._bytes = [], [], 0
            self._first = records[0].txid
        self._records.extend(records)
        self._values.extend(values)
        self._bytes += sum(map(len, values))
        # trim in large steps (amortised): down to the limits once 1.5x over them
        n = len(self._records)
        if n > self.max_records * 3 // 2 or self._bytes > self.max_bytes * 3 // 2:
            drop = max(n - self.max_records, 0)
            dropped = sum(map(len, self._values[:drop]))
            while self._bytes - dropped > self.max_bytes and drop < n - 1:
                dropped += len(self._values[drop])
                drop += 1
            del self._records[:drop]
            del self._values[:drop]
            self._bytes -= dropped
            self._first += drop

    def bytes_after(self, txid: int) -> int | None:
        """Stored bytes of the records after ``txid`` in the tail; ``None`` when the
        tail does not hold ``txid + 1`` (and does not end at ``txid``)."""
        start = txid + 1 - self._first
        if start < 0 or start > len(self._records):
            return None
        return sum(map(len, self._values[start:]))

    def after(self, txid: int, limit: int, upto: int) -> tuple[list[Record], list[bytes]] | None:
        """Up to ``limit`` records with txids after ``txid`` and at most ``upto``, with
        their values; ``None`` when the tail does not hold ``txid + 1``."""
        start = txid + 1 - self._first
        if start < 0 or start >= len(self._records):
            return None
        end = min(start + limit, upto + 1 - self._first)
        return self._records[start:end], self._values[start:end]


@dataclass(frozen=True)
class _Marker:
    position: int  # the marker is committed with the batch holding record #position
    upstream: str
    cursor: tuple[int, str]
    on_durable: Callable[[], None]


@dataclass(frozen=True)
class WriterStatistics:
    commits: int
    records: int
    duplicates: int
    queued: int
    last_batch: int
    max_batch: int
    committed_txid: int
    #: total seconds spent in commits (staging the puts, then the fsync)
    commit_seconds: float
    #: of which waiting for the commit's fsync (after the puts were staged)
    sync_seconds: float
    #: commits per latency bucket (COMMIT_SECONDS_BUCKETS, then +Inf); not cumulative
    commit_seconds_histogram: tuple[int, ...] = ()
    #: commits per batch-size bucket (BATCH_SIZE_BUCKETS, then +Inf); not cumulative
    batch_size_histogram: tuple[int, ...] = ()


class JournalWriter:
    """Owns all writes to ``journal``.

    Args:
        journal: the instance's journal (the writer is its only writer).
        on_commit: called in the trio thread, after each commit, with the records
            that were stored (duplicates removed), in txid order, and the records
            published here that the journal found already stored (their bookmark
            is held by an earlier record: a copy received by replication).

    Error handling: if a commit fails (disk full, I/O error) nothing of that batch was
    stored; the error propagates out of :meth:`run`, which stops the instance: an
    instance that cannot persist must not keep acknowledging.
    """

    def __init__(
        self, journal: Journal, on_commit: Callable[[list[Record], list[Record]], None]
    ) -> None:
        self.journal = journal
        self._on_commit = on_commit
        self._queue: list[Record] = []
        self._batch: list[Record] = []  # the batch being committed
        self._submitted = 0  # records ever queued; markers refer to positions in it
        self._taken = 0  # records ever taken into a batch
        self._done = 0  # records whose commit finished
        self._markers: list[_Marker] = []
        self._riders: list[Callable[[], None]] = []
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self.committed_txid = journal.last_txid
        #: the newest committed records, for replication (see :class:`RecentRecords`)
        self.recent = RecentRecords()
        self._commits = 0
        self._records = 0
        self._duplicates = 0
        self._last_batch = 0
        self._max_batch = 0
        self._commit_seconds = 0.0
        self._sync_seconds = 0.0
        self._latency_counts = [0] * (len(COMMIT_SECONDS_BUCKETS) + 1)
        self._batch_counts = [0] * (len(BATCH_SIZE_BUCKETS) + 1)

    def submit(self, record: Record) -> None:
        """Queue one record for the next commit."""
        self._queue.append(record)
        self._submitted += 1
        self._wake.set()

    def submit_replicated(
        self,
        records: list[Record],
        upstream: str,
        cursor: tuple[int, str],
        on_durable: Callable[[], None],
    ) -> None:
        """Queue records received from ``upstream`` with the stream position they
        bring this journal to; ``on_durable`` runs (in the trio thread) after the
        commit that stores both."""
        if not records:
            # A position-only frame: no commit of its own (it would cost two fsyncs).
            if self._submitted <= self._done:
                on_durable()  # everything before it is already durable
                return
            if self._submitted <= self._taken:
                self._riders.append(on_durable)  # durable with the commit in progress
                return
        self._queue.extend(records)
        self._submitted += len(records)
        self._markers.append(_Marker(self._submitted, upstream, cursor, on_durable))
        self._wake.set()

    async def run_exclusive(self, job: Callable[[Journal], _T]) -> _T:
        """Run ``job(journal)`` on a worker thread between commits: journal writes
        other than appends (segment maintenance) go through here, so the journal
        keeps exactly one writer at a time."""
        async with self._limiter:
            return await trio.to_thread.run_sync(job, self.journal)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def queued_high(self, pub_hash: int) -> int:
        """The highest seq of ``pub_hash`` among the records queued or being committed
        (0 if none). A scan of the queue: for a logon, not for every publish."""
        high = 0
        for batch in (self._batch, self._queue):
            for rec in batch:
                if rec.pub_hash == pub_hash and rec.seq > high:
                    high = rec.seq
        return high

    async def run(self) -> None:
        """Commit queued records forever (until cancelled)."""
        while True:
            if not self._queue and not self._markers:
                self._wake = trio.Event()
                await self._wake.wait()
            batch = self._batch = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            self._taken += len(batch)
            markers: list[_Marker] = []
            while self._markers and self._markers[0].position <= self._taken:
                markers.append(self._markers.pop(0))
            cursors = {m.upstream: m.cursor for m in markers}
            now_us = time.time_ns() // 1000
            values: list[bytes] = []
            txids = await self._append(batch, now_us, cursors, values)
            self._batch = []
            stored = [rec for rec, txid in zip(batch, txids, strict=True) if txid]
            dropped: list[Record] = []
            if len(stored) != len(batch):
                dropped = [
                    rec
                    for rec, txid in zip(batch, txids, strict=True)
                    if not txid and not rec.path
                ]
            self.recent.add(stored, values)
            self._commits += 1
            self._records += len(stored)
            self._duplicates += len(batch) - len(stored)
            self._last_batch = len(batch)
            self._max_batch = max(self._max_batch, len(batch))
            if stored:
                self.committed_txid = stored[-1].txid
            self._done = self._taken
            self._on_commit(stored, dropped)
            for marker in markers:
                marker.on_durable()
            riders, self._riders = self._riders, []
            for rider in riders:
                rider()
            # Let the tasks this commit woke (replication sends, acks) run before the
            # next batch's puts block this thread. Trio may run one scheduling batch in
            # either order, so two checkpoints guarantee they get their turn.
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()

    async def _append(
        self,
        batch: list[Record],
        now_us: int,
        cursors: dict[str, tuple[int, str]],
        values: list[bytes],
    ) -> list[int]:
        """Run ``journal.append`` on a worker thread; block this thread during the puts
        (see :meth:`_staged`)."""
        t0 = time.perf_counter()
        txids, t1 = await self._staged(
            lambda journal, on_staged: journal.append(
                batch, now_us, on_staged, cursors or None, values
            )
        )
        t2 = time.perf_counter()
        self._commit_seconds += t2 - t0
        self._sync_seconds += t2 - t1
        self._latency_counts[bisect.bisect_left(COMMIT_SECONDS_BUCKETS, t2 - t0)] += 1
        self._batch_counts[bisect.bisect_left(BATCH_SIZE_BUCKETS, len(batch))] += 1
        return txids

    async def run_staged(self, job: Callable[[Journal, Callable[[], None]], _T]) -> _T:
        """Run ``job(journal, on_staged)`` between commits like an append: the trio
        thread waits (GIL free) while the job stages its LMDB writes, and runs on
        during its commit. ``job`` must call ``on_staged()`` just before it commits.
        For bulk journal writes other than appends (purging segments)."""
        result, _ = await self._staged(job)
        return result

    async def _staged(self, job: Callable[[Journal, Callable[[], None]], _T]) -> tuple[_T, float]:
        """Run ``job`` on a worker thread under the writer's limiter; block this thread
        until the job calls ``on_staged`` (or ends), then await its end. Returns the
        job's result and the ``perf_counter`` time at which it was staged.

        py-lmdb releases the GIL around every put. If the event loop kept running
        Python code meanwhile, every put would wait for a GIL hand-over (measured: 267k
        records/s alone, 3.5k/s beside a busy thread). So the trio thread waits,
        without holding the GIL, until the puts are staged, and runs on only while
        the commit's fsync (which needs no GIL) is in progress.
        """
        journal = self.journal
        token = trio.lowlevel.current_trio_token()
        staged = threading.Event()
        done = trio.Event()
        result: list[outcome.Outcome[_T]] = []

        def work() -> _T:
            return job(journal, staged.set)

        def deliver(out: outcome.Outcome[_T]) -> None:
            result.append(out)
            staged.set()
            token.run_sync_soon(done.set)

        async with self._limiter:
            trio.lowlevel.start_thread_soon(work, deliver)
            staged.wait()  # short: one batch of puts; the GIL is free meanwhile
            staged_at = time.perf_counter()
            await done.wait()
        return result[0].unwrap(), staged_at

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            commits=self._commits,
            records=self._records,
            duplicates=self._duplicates,
            queued=len(self._queue),
            last_batch=self._last_batch,
            max_batch=self._max_batch,
            committed_txid=self.committed_txid,
            commit_seconds=round(self._commit_seconds, 6),
            sync_seconds=round(self._sync_seconds, 6),
            commit_seconds_histogram=tuple(self._latency_counts),
            batch_size_histogram=tuple(self._batch_counts),
        )
