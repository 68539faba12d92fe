"""The single journal writer: group commit, with the fsync off the event loop for
batches big enough to pay for the hand-off.

Publishes are queued with :meth:`JournalWriter.submit` (never blocks). The writer
task takes everything queued since its last batch and stages it in the journal
(:meth:`txlog.Journal.begin_stage`, in the trio thread: the duplicate checks, the
encoding and the commit log write; nothing goes to LMDB yet), makes it durable
(``Staging.sync``: one ``fdatasync`` of the commit log), then hands the stored
records to ``on_commit``. While a batch is being made durable, new publishes
accumulate, so batches grow with load: throughput comes from batching, not from
weaker durability.

A small batch (at most :data:`SYNC_INLINE_RECORDS` records) is synced in the trio
thread: a publisher waiting for each ack would otherwise pay two thread wake-ups
(about 100 µs on this machine, measured in docs/BENCHMARKS.md) around a 110 µs
fsync. A bigger batch is synced on the writer thread while the event loop reads the
next one.

LMDB takes the staged batches behind the commit log (:meth:`txlog.Journal.commit`,
on the writer thread): every :data:`COMMIT_INTERVAL` seconds while records are
staged, or after :data:`COMMIT_RECORDS` of them, and before any other journal write
(segment maintenance, which runs on the writer thread too). A batch of
``DIRECT_RECORDS`` records or ``DIRECT_BYTES`` skips the log: LMDB takes it, after
the staged batches, on the writer thread. While the writer thread puts records into
LMDB the event loop waits without the GIL (py-lmdb releases the GIL around every put,
and a busy event loop would make each put wait for a GIL switch); it runs on during
LMDB's fsync.
"""

from __future__ import annotations

import bisect
import errno
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import outcome
import trio

from amps_py import offload
from amps_py.statistics import BATCH_SIZE_BUCKETS, COMMIT_SECONDS_BUCKETS, WRITER_MAX_BATCH
from txlog import Journal, Record
from txlog.journal import DIRECT_BYTES, DIRECT_RECORDS, Staging

log = logging.getLogger("amps_py.server.writer")
_T = TypeVar("_T")

#: most records in one transaction; bounds commit latency under a flood
MAX_BATCH = WRITER_MAX_BATCH
#: longest time staged records wait for their LMDB commit (they are durable already;
#: reads serve them from memory meanwhile)
COMMIT_INTERVAL: Final = 0.1
#: staged records, or bytes, after which LMDB commits at once (measured on this
#: machine, docs/BENCHMARKS.md: with LMDB's puts done at commit time, while the event
#: loop waits, 1,000 records kept pipelined throughput and cut its p99 against 4,000)
COMMIT_RECORDS: Final = 1_000
COMMIT_BYTES: Final = 16 * 1024 * 1024
#: staged records this close to COMMIT_INTERVAL old are committed now (see _idle)
COMMIT_DUE_WITHIN: Final = 1e-6
#: batches of at most this many records are synced in the trio thread (see above)
SYNC_INLINE_RECORDS: Final = 16
#: an fsync in the trio thread slower than this (a stalling disk) sends every sync to
#: the writer thread for :data:`SLOW_SYNC_BACKOFF` seconds: the event loop (heartbeats,
#: the admin API, other clients) must not wait on a slow disk
SLOW_SYNC_SECONDS: Final = 0.02
SLOW_SYNC_BACKOFF: Final = 10.0
#: after a failed commit: first and longest wait before journal writes are tried again
RETRY_FIRST: Final = 0.5
RETRY_LONGEST: Final = 10.0
#: free bytes the journal's file system needs (beyond the failed batch) before writes
#: are tried again after a commit failed for lack of space
SPACE_MARGIN: Final = 4 * 1024 * 1024


def _stage_direct(
    journal: Journal,
    on_staged: Callable[[], None],
    batch: list[Record],
    now_us: int,
    cursors: dict[str, tuple[int, str]],
    values: list[bytes],
    rejected: dict[int, str],
) -> tuple[Staging, Exception | None]:
    """A writer-thread job: a big batch that LMDB takes itself, synced; the error of
    its sync (the caller abandons the staging) or None."""
    staging = journal.begin_stage(
        batch, now_us, cursors or None, values, rejected, direct=True, on_staged=on_staged
    )
    on_staged()
    try:
        staging.sync()
    except Exception as exc:
        return staging, exc
    return staging, None


def describe_commit_failure(exc: BaseException, path: str, needed: int) -> tuple[str, bool]:
    """What an operator should read about a failed commit, and whether it was for
    lack of space on the journal's file system. LMDB reports a full disk as
    ``Input/output error`` from ``mdb_txn_commit``, so the free space decides."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        free = -1
    no_space = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (
        0 <= free < needed + SPACE_MARGIN
    )
    if no_space:
        return (
            f"no space left on device: the file system of {path} has {free} bytes free "
            f"and this commit needed about {needed}; free space there (or move the "
            "JournalDirectory to a larger disk); journal writes resume by themselves "
            "once there is room"
        ), True
    return (
        f"the journal commit failed ({exc}); check the disk holding {path} and the "
        "system log; journal writes are retried with back-off"
    ), False


class RecentRecords:
    """The newest committed records and their stored values, by txid: a bounded
    in-memory tail of the journal.

    Replication destinations that keep up read fresh records here instead of reading
    them back from LMDB (no CRC check, no decoding: these are the objects and bytes
    just committed); a destination further behind than the tail reads the journal.
    Bounded by ``max_records`` and ``max_bytes`` (the memory it holds: each record's
    stored value plus its payload, which the record object keeps too), trimmed from
    the oldest end; it may hold up to 1.5 times either bound between trims. An
    instance with no replication destination keeps no tail (``max_records`` 0): no
    one would read it.
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
        if not records or self.max_records <= 0:
            return
        if not self._records or records[0].txid != self._first + len(self._records):
            self._records, self._values, self._bytes = [], [], 0
            self._first = records[0].txid
        self._records.extend(records)
        self._values.extend(values)
        self._bytes += sum(map(len, values)) + sum(len(r.payload) for r in records)
        # trim in large steps (amortised): down to the limits once 1.5x over them
        n = len(self._records)
        if n > self.max_records * 3 // 2 or self._bytes > self.max_bytes * 3 // 2:
            drop = max(n - self.max_records, 0)
            dropped = sum(map(len, self._values[:drop]))
            dropped += sum(len(r.payload) for r in self._records[:drop])
            while self._bytes - dropped > self.max_bytes and drop < n - 1:
                dropped += len(self._values[drop]) + len(self._records[drop].payload)
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


class WriterThread:
    """The thread that runs the journal's blocking work off the event loop, in the
    order submitted: the ``fdatasync`` of big batches, and segment maintenance."""

    def __init__(self, name: str = "amps-py journal writer") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Callable[[object], None]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def submit(
        self, work: Callable[[], _T], deliver: Callable[[outcome.Outcome[_T]], None]
    ) -> None:
        """Run ``work`` on the thread after what was submitted before; ``deliver`` gets
        its outcome on the thread (started by the first job)."""
        if not self._started:
            self._started = True
            self._thread.start()
        self._jobs.put((work, deliver))  # type: ignore[arg-type]

    def stop(self) -> None:
        """End the thread once what was submitted ran."""
        if self._started:
            self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            work, deliver = job
            deliver(outcome.capture(work))


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
    #: commits that failed (nothing of their batch stored)
    failed_commits: int = 0
    #: records refused alone (a field the journal cannot store)
    rejected_records: int = 0
    #: why journal writes are refused now ("" while they are accepted)
    failure: str = ""
    #: LMDB commits behind the commit log (each batch is durable in the log first)
    lmdb_commits: int = 0
    #: records durable in the commit log that LMDB has not committed yet
    staged: int = 0
    #: fsyncs in the event loop's thread slower than SLOW_SYNC_SECONDS (each sent the
    #: syncs to the writer thread for SLOW_SYNC_BACKOFF seconds)
    slow_syncs: int = 0


class JournalWriter:
    """Owns all writes to ``journal``.

    Args:
        journal: the instance's journal (the writer is its only writer).
        on_commit: called in the trio thread, after each commit, with the records
            that were stored (duplicates removed), in txid order, and the records
            published here that the journal found already stored (their bookmark
            is held by an earlier record: a copy received by replication).
        keep_recent: keep :attr:`recent`, the tail of new commits replication
            destinations read; False for an instance without destinations.

    Error handling:

    - A record the journal cannot store (a field longer than its stored length, an
      unencodable value) is rejected alone: ``on_rejected`` gets it with the reason,
      the rest of its batch commits.
    - A failed commit (disk full, I/O error, a full MapSize) stored nothing of the
      batch. Every record queued or in that batch is handed to ``on_failed`` with the
      reason, markers and riders are dropped (their positions are not durable), and
      the writer is *failed*: :attr:`failure` says why, :meth:`submit` must not be
      called (the instance refuses journaled publishes) and :meth:`submit_replicated`
      drops records without acknowledging them. The writer retries with back-off
      (after a lack of space, only once the file system has room again), then calls
      ``on_recovered`` and commits as before. The instance stays up throughout.
    """

    def __init__(
        self,
        journal: Journal,
        on_commit: Callable[[list[Record], list[Record]], None],
        *,
        on_rejected: Callable[[list[tuple[Record, str]]], None] | None = None,
        on_failed: Callable[[list[Record], str], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        keep_recent: bool = True,
    ) -> None:
        self.journal = journal
        self._on_commit = on_commit
        self._on_rejected = on_rejected
        self._on_failed = on_failed
        self._on_recovered = on_recovered
        #: why journal writes are refused now ("" while the writer is healthy)
        self.failure = ""
        self._failed_commits = 0
        self._rejected_records = 0
        self._no_space = False
        self._needed = 0
        self._queue: list[Record] = []
        self._batch: list[Record] = []  # the batch being committed
        self._submitted = 0  # records ever queued; markers refer to positions in it
        self._taken = 0  # records ever taken into a batch
        self._done = 0  # records whose commit finished
        self._markers: list[_Marker] = []
        self._riders: list[Callable[[], None]] = []
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self._thread = WriterThread()
        #: perf_counter time before which no sync runs in the trio thread
        self._inline_after = 0.0
        self._lmdb_commits = 0
        self._slow_syncs = 0
        self.committed_txid = journal.last_txid
        #: the newest committed records, for replication (see :class:`RecentRecords`)
        self.recent = RecentRecords() if keep_recent else RecentRecords(0, 0)
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
        commit that stores both. While the writer is failed, they are dropped and
        ``on_durable`` never runs (the upstream resends after it reconnects)."""
        if self.failure:
            return
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
        """Run ``job(journal)`` on the writer thread between batches, once LMDB has
        committed what is staged: journal writes other than appends (segment
        maintenance) go through here, so the journal keeps exactly one writer at a
        time. The trio thread runs on meanwhile."""

        def exclusive(journal: Journal, on_staged: Callable[[], None]) -> _T:
            on_staged()
            return job(journal)

        return await self._exclusive(exclusive)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def failed_commits(self) -> int:
        """How many commits failed so far (a connection that saw this change lost
        what it had queued)."""
        return self._failed_commits

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
        """Commit queued records forever (until cancelled); on the way out, commit
        what is staged and end the writer thread."""
        try:
            await self._run()
        finally:
            try:
                self.journal.commit()
            except Exception as exc:  # the commit log still holds every staged record
                log.error("the journal's last LMDB commit failed: %s", exc)
            self._thread.stop()

    async def _run(self) -> None:
        while True:
            if self.failure:
                await self._recover()
            if not self._queue and not self._markers:
                self._wake = trio.Event()
                await self._idle()
                continue
            batch = self._batch = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            self._taken += len(batch)
            markers: list[_Marker] = []
            while self._markers and self._markers[0].position <= self._taken:
                markers.append(self._markers.pop(0))
            cursors = {m.upstream: m.cursor for m in markers}
            now_us = time.time_ns() // 1000
            values: list[bytes] = []
            rejected: dict[int, str] = {}
            try:
                txids = await self._append(batch, now_us, cursors, values, rejected)
            except Exception as exc:  # nothing of the batch was stored
                self._batch = []
                self._commit_failed(batch, exc)
                continue
            self._batch = []
            stored = [rec for rec, txid in zip(batch, txids, strict=True) if txid > 0]
            dropped: list[Record] = []
            if len(stored) != len(batch):
                dropped = [
                    rec for rec, txid in zip(batch, txids, strict=True) if not txid and not rec.path
                ]
                if rejected:
                    self._rejected_records += len(rejected)
                    if self._on_rejected is not None:
                        self._on_rejected([(batch[i], why) for i, why in rejected.items()])
            self.recent.add(stored, values)
            self._commits += 1
            self._records += len(stored)
            self._duplicates += len(batch) - len(stored) - len(rejected)
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
            journal = self.journal
            if (
                journal.staged_records >= COMMIT_RECORDS
                or journal.staged_bytes >= COMMIT_BYTES
                or (journal.has_staged and journal.staged_seconds >= COMMIT_INTERVAL)
            ):
                await self._commit()
            if self._queue or self._markers:
                # Let the tasks this commit woke (replication sends, acks) run before
                # the next batch's puts block this thread. Trio may run one scheduling
                # batch in either order, so two checkpoints guarantee they get their
                # turn. (With nothing queued, waiting for the next batch does it.)
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()

    async def _idle(self) -> None:
        """Wait for the next record; meanwhile commit LMDB once records have been
        staged :data:`COMMIT_INTERVAL` (under load the loop commits between batches)."""
        journal = self.journal
        while journal.has_staged and not self.failure:
            left = COMMIT_INTERVAL - journal.staged_seconds
            # not "> 0": a wake-up at the deadline can compute a remainder of 1e-16,
            # which a clock that moves only when the loop waits (the simulator's)
            # never reaches, and this loop would spin
            if left > COMMIT_DUE_WITHIN:
                with trio.move_on_after(left):
                    await self._wake.wait()
                if self._wake.is_set():
                    return
            else:
                await self._commit()
        if not self.failure:
            await self._wake.wait()

    async def _commit(self) -> None:
        """Give LMDB the staged records (on the writer thread). A failure leaves them
        durable in the commit log and in memory; journal writes are refused until the
        writer recovers."""
        try:
            await self._commit_on_thread()
        except Exception as exc:
            self._commit_failed([], exc)
            return
        self._lmdb_commits += 1

    async def _commit_on_thread(self) -> None:
        """Commit what is staged to LMDB on the writer thread; the event loop waits
        (without the GIL) during the puts and runs on during the fsync."""

        def commit(journal: Journal, on_staged: Callable[[], None]) -> None:
            journal.commit(on_staged)

        async with self._limiter:
            await self._run_blocking(commit)

    def _commit_failed(self, batch: list[Record], exc: Exception) -> None:
        """A commit stored nothing: fail the batch and everything queued behind it,
        forget the replication positions that rode on them, and refuse writes until
        :meth:`_recover` lets them through again."""
        failed = batch + self._queue
        self._queue = []
        self._markers.clear()
        self._riders.clear()
        self._taken = self._done = self._submitted
        self._failed_commits += 1
        # the failed batch, and the staged records LMDB must still take
        needed = sum(len(rec.payload) + 256 for rec in batch) + self.journal.staged_bytes
        reason, self._no_space = describe_commit_failure(exc, str(self.journal.path), needed)
        self._needed = needed
        self.failure = reason
        if self._on_failed is not None:
            self._on_failed(failed, reason)
        else:
            raise exc

    async def _recover(self) -> None:
        """Wait with back-off until journal writes may be tried again (after a lack of
        space: until the file system has room for the failed batch and the staged
        records), then commit what is staged to LMDB first: new writes are accepted
        only once LMDB took the records already acknowledged (a new commit log file
        must not take the room they need)."""
        delay = RETRY_FIRST
        path = str(self.journal.path)
        while True:
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_LONGEST)
            if self._no_space:
                try:
                    free = shutil.disk_usage(path).free
                except OSError:
                    continue
                if free < self._needed + SPACE_MARGIN:
                    continue
            try:
                await self._commit_on_thread()
            except Exception as exc:  # still failing: keep refusing, say why now
                needed = self.journal.staged_bytes
                self.failure, self._no_space = describe_commit_failure(exc, path, needed)
                self._needed = needed
                continue
            break
        self.failure = ""
        if self._on_recovered is not None:
            self._on_recovered()

    async def _append(
        self,
        batch: list[Record],
        now_us: int,
        cursors: dict[str, tuple[int, str]],
        values: list[bytes],
        rejected: dict[int, str],
    ) -> list[int]:
        """Stage ``batch`` in the journal and make it durable: a small batch's fsync
        in this thread, a bigger one's on the writer thread while the event loop runs
        on, and a big one (which LMDB takes itself) wholly on the writer thread (see
        the module docstring)."""
        journal = self.journal
        try:  # (no checkpoint when free: it is, but during segment maintenance)
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            await self._limiter.acquire()
        try:
            t0 = time.perf_counter()
            if journal.has_commit_log and (
                len(batch) >= DIRECT_RECORDS
                or sum(len(rec.payload) for rec in batch) >= DIRECT_BYTES
            ):
                (staging, error), t1 = await self._run_blocking(
                    lambda journal, on_staged: _stage_direct(
                        journal, on_staged, batch, now_us, cursors, values, rejected
                    )
                )
            else:
                staging = journal.begin_stage(
                    batch, now_us, cursors or None, values, rejected, direct=False
                )
                t1 = time.perf_counter()
                error = None
                try:
                    if staging.direct:
                        staging.sync()  # (no commit log here: nothing to sync)
                    elif len(batch) <= SYNC_INLINE_RECORDS and t1 >= self._inline_after:
                        staging.sync()
                        self._check_sync_time(time.perf_counter() - t1)
                    else:
                        await self._on_thread(staging.sync)
                except Exception as exc:
                    error = exc
            if error is not None:
                journal.abandon_stage(staging)
                raise error
            txids = journal.finish_stage(staging)
        finally:
            self._limiter.release()
        t2 = time.perf_counter()
        self._commit_seconds += t2 - t0
        self._sync_seconds += t2 - t1
        self._latency_counts[bisect.bisect_left(COMMIT_SECONDS_BUCKETS, t2 - t0)] += 1
        self._batch_counts[bisect.bisect_left(BATCH_SIZE_BUCKETS, len(batch))] += 1
        return txids

    def _check_sync_time(self, seconds: float) -> None:
        """After a sync in the trio thread: if the disk was slow, sync on the writer
        thread for a while (and say so). Not under offload.inline() (the simulator):
        there is no thread, and a real duration must not steer a repeatable run."""
        if seconds < SLOW_SYNC_SECONDS or offload.is_inline():
            return
        self._inline_after = time.perf_counter() + SLOW_SYNC_BACKOFF
        self._slow_syncs += 1
        log.warning(
            "the journal's disk took %.0f ms for one fsync of the commit log; for the "
            "next %.0f s every sync runs on the writer thread so the event loop stays "
            "responsive. If this repeats, check the disk holding %s (iostat, the system "
            "log)",
            seconds * 1000,
            SLOW_SYNC_BACKOFF,
            self.journal.path,
        )

    async def run_staged(self, job: Callable[[Journal, Callable[[], None]], _T]) -> _T:
        """Run ``job(journal, on_staged)`` on the writer thread between batches, once
        LMDB has committed what is staged: the trio thread waits (GIL free) while the
        job stages its LMDB writes, and runs on during its commit. ``job`` must call
        ``on_staged()`` just before it commits. For bulk journal writes other than
        appends (purging segments)."""
        return await self._exclusive(job)

    async def _exclusive(self, job: Callable[[Journal, Callable[[], None]], _T]) -> _T:
        """:meth:`_run_blocking` under the writer's limiter (between batches), once
        LMDB has committed what is staged (the event loop waits meanwhile: other
        journal writes must come after the staged batches)."""

        def after_commit(journal: Journal, on_staged: Callable[[], None]) -> _T:
            journal.commit()
            return job(journal, on_staged)

        async with self._limiter:
            result, _ = await self._run_blocking(after_commit)
        return result

    async def _run_blocking(
        self, job: Callable[[Journal, Callable[[], None]], _T]
    ) -> tuple[_T, float]:
        """Run ``job`` on the writer thread; block this thread until the job calls
        ``on_staged`` (or ends), then await its end. Returns the job's result and the
        ``perf_counter`` time it was staged at.

        py-lmdb releases the GIL around every put. If the event loop kept running
        Python code meanwhile, every put would wait for a GIL hand-over (measured: 267k
        records/s alone, 3.5k/s beside a busy thread). So the trio thread waits,
        without holding the GIL, until the puts are staged, and runs on only while
        the commit's fsync (which needs no GIL) is in progress.
        """
        journal = self.journal
        staged = threading.Lock()  # held until the job has staged (a Lock is cheap)
        staged.acquire()
        released = False
        staged_at = 0.0

        def on_staged() -> None:  # writer thread only
            nonlocal released
            if not released:
                released = True
                staged.release()

        def work() -> _T:
            try:
                return job(journal, on_staged)
            finally:
                on_staged()

        def wait_staged() -> None:
            nonlocal staged_at
            staged.acquire()  # short: one batch of puts; the GIL is free meanwhile
            staged_at = time.perf_counter()

        result = await self._on_thread(work, wait_staged)
        return result, staged_at

    async def _on_thread(
        self, work: Callable[[], _T], after_submit: Callable[[], None] | None = None
    ) -> _T:
        """Run ``work`` on the writer thread and wait for its outcome (shielded: the
        journal must not be touched while it runs); ``after_submit`` runs in this
        thread once ``work`` is submitted."""
        if offload.is_inline():  # the simulator: no thread, the same order
            ran = outcome.capture(work)
            if after_submit is not None:
                after_submit()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return ran.unwrap()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        result: list[outcome.Outcome[_T]] = []

        def deliver(out: outcome.Outcome[_T]) -> None:
            result.append(out)
            token.run_sync_soon(done.set)

        self._thread.submit(work, deliver)
        if after_submit is not None:
            after_submit()
        with trio.CancelScope(shield=True):
            await done.wait()
        return result[0].unwrap()

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
            failed_commits=self._failed_commits,
            rejected_records=self._rejected_records,
            failure=self.failure,
            lmdb_commits=self._lmdb_commits,
            staged=self.journal.staged_records,
            slow_syncs=self._slow_syncs,
        )
