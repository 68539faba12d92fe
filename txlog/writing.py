"""Writing a journal: staging batches durably, and committing them to LMDB.

The single writer of an open journal (:class:`JournalWriter`, owned by
:class:`txlog.journal.Journal`, whose ``stage``/``commit`` methods delegate here) and
what one batch is on its way (:class:`Staging`). The contract (exactly one writer, one
write at a time, each LMDB write transaction on one thread; exact dedup; the commit log
as the durability point in ``fsync`` durability) is :mod:`txlog.journal`'s.

The writer works on what the journal hands it: the LMDB environment
(:class:`txlog.environment.JournalEnv`) and the shared in-memory state
(:class:`txlog.state.JournalState`), which it alone changes besides segment
maintenance; its own state (the commit log, the staged batches, the publishers'
cached high-water marks) is here.
"""

from __future__ import annotations

import contextlib
import operator
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import lmdb

from .commitlog import CommitLog, encode_batch
from .environment import JournalEnv
from .errors import JournalError
from .holdings import (
    BatchHoldings,
    batch_holdings,
    bucket_key,
    merged_bucket,
    merged_origin,
    origin_key,
)
from .pending import PendingTail
from .record import Record, ReplicaRecord
from .segments import Segment, grown_table
from .state import JournalState

_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
#: one ``times`` index entry per this many microseconds of publishing
TIME_INDEX_STEP_US: Final = 10_000
#: a batch this big (records, or stored bytes) skips the commit log: LMDB commits it and
#: syncs (two fsyncs, but no second copy of every byte), as without a commit log
DIRECT_RECORDS: Final = 1_000
DIRECT_BYTES: Final = 256 * 1024


def _unstorable(exc: Exception) -> str:
    """Why a record cannot be stored, in words (the codec's struct errors name no
    field)."""
    if isinstance(exc, struct.error):
        return (
            "a field is longer than the journal stores (topic, client name, correlation "
            "id, SOW key, message type, origin and path: at most 65,535 UTF-8 bytes each) "
            f"or a number is out of range ({exc})"
        )
    return f"a field cannot be encoded ({exc})"


class BatchPuts:
    """What LMDB is given for one stored batch (see :meth:`JournalWriter.put`)."""

    __slots__ = (
        "bookmarks",
        "cursors",
        "origins",
        "others",
        "publishers",
        "records",
        "segments",
        "time_entry",
    )

    def __init__(
        self,
        records: list[tuple[bytes, bytes]],
        bookmarks: list[tuple[bytes, bytes]],
        cursors: Mapping[str, tuple[int, str]] | None,
    ) -> None:
        self.records = records
        self.bookmarks = bookmarks
        self.cursors = cursors
        self.publishers: list[tuple[bytes, bytes]] = []
        self.origins: list[tuple[bytes, int]] = []
        self.time_entry: tuple[bytes, bytes] | None = None
        self.segments: list[tuple[bytes, bytes]] = []
        #: (index in the batch, origin, origin txid) of each record that is not this
        #: instance's own with origin txid = txid (see txlog.holdings.batch_holdings)
        self.others: list[tuple[int, str, int]] = []


class Staging:
    """A batch :meth:`JournalWriter.begin_stage` wrote, not durable until :meth:`sync`."""

    __slots__ = (
        "_writer",
        "direct",
        "encoded",
        "first",
        "frame",
        "last",
        "lmdb_sync",
        "log_fd",
        "marks",
        "now_us",
        "origin_updates",
        "pub_updates",
        "puts",
        "records",
        "segments",
        "stored",
        "txids",
        "values",
    )

    def __init__(
        self,
        writer: JournalWriter,
        txids: list[int],
        records: Sequence[Record],
        now_us: int,
        encoded: list[bytes] | None,
        puts: BatchPuts,
    ) -> None:
        self._writer = writer
        #: what LMDB is given for the batch (its cursors too)
        self.puts = puts
        self.txids = txids
        self.records = records
        self.now_us = now_us
        self.encoded = encoded
        #: the commit log file its frame went to (-1: no frame)
        self.log_fd = -1
        #: LMDB took the batch itself (a big batch, or no commit log): its sync is
        #: LMDB's, not a log frame's
        self.direct = False
        #: ``sync()`` syncs LMDB (a big batch beside a commit log)
        self.lmdb_sync = False
        self.frame = b""
        self.first = 0
        self.last = 0
        self.values: list[bytes] = []
        self.marks: dict[bytes, int] = {}
        self.pub_updates: dict[int, Record] = {}
        self.origin_updates: dict[str, int] = {}
        self.segments: list[Segment] = []
        self.stored = 0

    def sync(self) -> None:
        """Make the batch durable: ``fdatasync`` its commit log frame, or LMDB for a
        batch LMDB committed. Blocks without the GIL; any thread may run it."""
        writer = self._writer
        if self.log_fd >= 0:
            assert writer.log is not None
            writer.log.flush(self.log_fd)
        elif self.lmdb_sync:
            writer.sync_lmdb()


class _Batch:
    """What :meth:`JournalWriter.begin_stage` has taken of its records so far (and the
    LMDB transaction its lookups use, which a failure must abort)."""

    __slots__ = (
        "bm_items",
        "marks",
        "origin_updates",
        "others",
        "pending",
        "pub_updates",
        "rec_items",
        "txid",
        "txids",
        "txn",
    )

    def __init__(self, last_txid: int, pending: PendingTail) -> None:
        self.txids: list[int] = []
        #: the txid of the last record taken
        self.txid = last_txid
        self.rec_items: list[tuple[bytes, bytes]] = []
        self.bm_items: list[tuple[bytes, bytes]] = []
        #: publisher -> its highest-seq record here
        self.pub_updates: dict[int, Record] = {}
        self.origin_updates: dict[str, int] = {}
        self.others: list[tuple[int, str, int]] = []
        #: bookmarks stored by this batch; built only when an out-of-order copy shows up
        self.marks: set[bytes] | None = None
        self.pending = pending
        self.txn: lmdb.Transaction | None = None


class JournalWriter:
    """The writing side of one open journal (created by the journal).

    Args:
        env: the journal's LMDB environment.
        state: the journal's shared in-memory state (the writer changes it).
        map_size: the LMDB map size (named when the journal is full).
        last_time_entry: the newest ``times`` index key (µs; 0 when none).
    """

    def __init__(
        self, env: JournalEnv, state: JournalState, map_size: int, last_time_entry: int
    ) -> None:
        self._env = env
        self._state = state
        self._map_size = map_size
        #: the commit log (``fsync`` durability with a commit log, once open), else None
        self.log: CommitLog | None = None
        #: the write transaction of a commit or direct batch in progress
        self._txn: lmdb.Transaction | None = None
        #: what LMDB is to be given for each staged batch (durable in the commit log,
        #: not yet in LMDB), oldest first
        self._staged: list[BatchPuts] = []
        self._lmdb_commits = 0
        self._staged_bytes = 0
        self._staged_since = 0.0
        #: the newest ``times`` index entry's time (µs)
        self.last_time_entry = last_time_entry
        #: publisher -> highest seq stored, as far as looked up (cleared on a failure)
        self.pub_cache: dict[int, int] = {}
        #: the batches with records put in the write transaction being built, whose
        #: holdings go in with one update before it commits (see put_holdings)
        self.holding_puts: list[BatchPuts] = []

    @property
    def writing(self) -> bool:
        """Whether a write transaction (a commit, a direct batch) is in progress."""
        return self._txn is not None

    def sync_lmdb(self) -> None:
        """``fdatasync`` LMDB (a batch LMDB committed itself)."""
        self._env.env.sync(True)

    def _last_seq(self, txn: lmdb.Transaction, pub_hash: int) -> int:
        seq = self.pub_cache.get(pub_hash)
        if seq is None:
            raw = txn.get(_U64.pack(pub_hash), db=self._env.publishers)
            seq = _U64.unpack_from(raw)[0] if raw else 0
            self.pub_cache[pub_hash] = seq
        return seq

    def begin_stage(
        self,
        records: Sequence[Record],
        now_us: int,
        cursors: Mapping[str, tuple[int, str]] | None = None,
        encoded: list[bytes] | None = None,
        rejected: dict[int, str] | None = None,
        direct: bool | None = None,
        on_staged: Callable[[], None] | None = None,
    ) -> Staging:
        """The first step of a stage: see :meth:`txlog.journal.Journal.begin_stage`,
        whose contract this is (the single writer only)."""
        batch = _Batch(self._state.last_txid, self._state.pending)
        if self.log is None:
            direct = True
        try:
            # A batch for the commit log writes nothing to LMDB here (it is applied with
            # the next commit): lookups read LMDB's committed state, and the staged tail
            # for what is not committed yet. A direct batch's write transaction holds
            # the staged batches first.
            if direct:
                batch.txn = self._write_txn()
            self._take(batch, records, now_us, rejected)
            rec_items = batch.rec_items
            values = list(map(_second, rec_items))
            first = batch.txid - len(rec_items) + 1
            if direct is None:
                direct = len(rec_items) >= DIRECT_RECORDS or sum(map(len, values)) >= DIRECT_BYTES
                if direct:
                    # decided only now: the lookups ran in a read transaction, which saw
                    # what a write transaction holding the staged batches would
                    if batch.txn is not None:
                        batch.txn.abort()
                    batch.txn = None
                    batch.txn = self._write_txn()
            puts, segments = self._batch_puts(batch, cursors, first, now_us, values)
            staging = Staging(self, batch.txids, records, now_us, encoded, puts)
            if direct:
                self._commit_direct(staging, batch, on_staged)
            else:
                self._write_frame(staging, batch, first, values)
        except lmdb.MapFullError:
            self._abandon_staged(batch.txn)
            raise JournalError(
                f"the journal is full: it reached its MapSize of {self._map_size} bytes "
                "(nothing of this batch was stored); raise TransactionLog/MapSize and "
                "restart, and remove old journals (amps-action-do-remove-journal) so "
                "their space is reused"
            ) from None
        except BaseException:
            # nothing of this batch was stored: the cached high-water marks may be ahead
            self._abandon_staged(batch.txn)
            raise
        staging.first = first
        staging.last = batch.txid
        staging.values = values
        staging.pub_updates = batch.pub_updates
        staging.origin_updates = batch.origin_updates
        staging.segments = segments
        staging.stored = len(rec_items)
        return staging

    def _take(
        self,
        batch: _Batch,
        records: Sequence[Record],
        now_us: int,
        rejected: dict[int, str] | None,
    ) -> None:
        """Take ``records`` into ``batch``: each gets its txid (0: a duplicate, -1:
        cannot be stored, see :meth:`begin_stage`), is stamped and encoded."""
        txids = batch.txids
        encode = self._env.codec.encode
        pack_key = _U64.pack
        pack_mark = _U64x2.pack
        txid = batch.txid
        rec_items = batch.rec_items
        bm_items = batch.bm_items
        pub_updates = batch.pub_updates
        origin_updates = batch.origin_updates
        others = batch.others
        own_name = self._env.instance_name
        cache = self.pub_cache
        cached_seq = cache.get
        for index, rec in enumerate(records):
            ph = rec.pub_hash
            seq = rec.seq
            last = cached_seq(ph)
            if last is None:
                last = self._high_water(batch, ph)
            try:
                bm_key = pack_mark(ph, seq)
            except struct.error:
                txids.append(self._reject(rejected, index, f"seq {seq} is out of range"))
                continue
            fresh = seq > last
            if not fresh and self._stored_already(batch, ph, seq, bm_key):
                txids.append(0)
                continue
            txid += 1
            key = pack_key(txid)
            own_origin = False
            try:
                if type(rec) is ReplicaRecord:
                    value = rec.restamp(txid, now_us)
                else:
                    rec.txid = txid
                    rec.local_ts = now_us
                    if not rec.origin_ts:
                        rec.origin_ts = now_us
                    if rec.origin_txid == 0:
                        rec.origin_txid = txid
                        own_origin = True
                    value = encode(rec)
            except (struct.error, ValueError) as exc:
                txid -= 1
                if own_origin:
                    rec.origin_txid = 0
                rec.txid = 0
                txids.append(self._reject(rejected, index, _unstorable(exc)))
                continue
            if fresh:
                cache[ph] = seq
                pub_updates[ph] = rec
            if batch.marks is not None:
                batch.marks.add(bm_key)
            bm_items.append((bm_key, key))
            txids.append(txid)
            rec_items.append((key, value))
            origin = rec.origin
            if own_origin:
                if origin != own_name:
                    others.append((len(rec_items) - 1, origin, txid))
                continue
            others.append((len(rec_items) - 1, origin, rec.origin_txid))
            if not origin:
                continue
            if rec.origin_txid > origin_updates.get(origin, 0):
                origin_updates[origin] = rec.origin_txid
        batch.txid = txid

    def _high_water(self, batch: _Batch, ph: int) -> int:
        """Publisher ``ph``'s highest seq stored or staged (its cache was empty)."""
        if batch.txn is None:
            batch.txn = self._env.env.begin()
        last = self._last_seq(batch.txn, ph)
        staged_high = batch.pending.pub_high.get(ph, 0)
        if staged_high > last:
            last = self.pub_cache[ph] = staged_high
        return last

    def _stored_already(self, batch: _Batch, ph: int, seq: int, bm_key: bytes) -> bool:
        """Whether the record ``(ph, seq)`` at or below the publisher's high-water mark
        is a duplicate: exact lookup (replicated copies arrive over several paths in any
        order, and a client may reorder its publishes after a failover); one at or
        below what removal deleted of this publisher is a late copy of a removed
        record, not new."""
        txn = batch.txn
        if txn is None:
            txn = batch.txn = self._env.env.begin()
        if seq <= self._state.floor(txn, self._env.floors_db, ph):
            return True
        if batch.marks is None:
            batch.marks = {mark for mark, _ in batch.bm_items}
        return (
            bm_key in batch.marks
            or bm_key in batch.pending.marks
            or txn.get(bm_key, db=self._env.bookmarks) is not None
        )

    def _batch_puts(
        self,
        batch: _Batch,
        cursors: Mapping[str, tuple[int, str]] | None,
        first: int,
        now_us: int,
        values: list[bytes],
    ) -> tuple[BatchPuts, list[Segment]]:
        """What LMDB is given for ``batch``, and the segment table once it is stored."""
        rec_items = batch.rec_items
        segments = self._state.segments
        puts = BatchPuts(rec_items, batch.bm_items, cursors)
        puts.others = batch.others
        if rec_items:
            puts.publishers = [
                (_U64.pack(ph), _U64.pack(high.seq) + high.client_name.encode())
                for ph, high in batch.pub_updates.items()
            ]
            puts.origins = [(o.encode(), otx) for o, otx in batch.origin_updates.items()]
            if now_us - self.last_time_entry >= TIME_INDEX_STEP_US:
                puts.time_entry = (_U64.pack(now_us), rec_items[0][0])
            segments, touched = grown_table(
                self._state.segments, self._env.segment_size, first, now_us, list(map(len, values))
            )
            if self._env.segments_db is not None:
                puts.segments = [(_U64.pack(seg.id), seg.encode()) for seg in touched]
        return puts, segments

    def _commit_direct(
        self, staging: Staging, batch: _Batch, on_staged: Callable[[], None] | None
    ) -> None:
        """A big batch (or no commit log): LMDB itself is the durability point."""
        txn = batch.txn
        assert txn is not None
        self.put(txn, staging.puts)
        self.put_holdings(txn)
        if on_staged is not None:
            on_staged()
        self._txn = None
        txn.commit()
        staging.direct = True
        staging.lmdb_sync = self.log is not None

    def _write_frame(
        self, staging: Staging, batch: _Batch, first: int, values: list[bytes]
    ) -> None:
        """A batch for the commit log: its frame is written (not synced)."""
        if batch.txn is not None:
            batch.txn.abort()
            batch.txn = None
        cursors = staging.puts.cursors
        if batch.rec_items or cursors:
            staging.frame = encode_batch(first, staging.now_us, values, cursors)
            staging.marks = dict(
                zip(map(_first, batch.bm_items), range(first, batch.txid + 1), strict=True)
            )
            assert self.log is not None
            staging.log_fd = self.log.write(staging.frame)

    def put(self, txn: lmdb.Transaction, puts: BatchPuts) -> None:
        """Write one batch's records and index entries into ``txn``."""
        if puts.records:
            txn.cursor(db=self._env.records).putmulti(puts.records, append=True)
            txn.cursor(db=self._env.bookmarks).putmulti(puts.bookmarks)
            for key, value in puts.publishers:
                txn.put(key, value, db=self._env.publishers)
            for key_o, otx in puts.origins:
                raw = txn.get(key_o, db=self._env.origins)
                if raw is None or _U64.unpack(raw)[0] < otx:
                    txn.put(key_o, _U64.pack(otx), db=self._env.origins)
            if puts.time_entry is not None:  # (an earlier entry for that time stays)
                txn.put(*puts.time_entry, db=self._env.times, overwrite=False)
            for key, value in puts.segments:
                txn.put(key, value, db=self._env.segments_db)
            if self._state.holdings_valid:
                self.holding_puts.append(puts)  # see put_holdings
        if puts.cursors:
            for name, (up_txid, up_bm) in puts.cursors.items():
                txn.put(name.encode(), _U64.pack(up_txid) + up_bm.encode(), db=self._env.upstreams)

    def put_holdings(self, txn: lmdb.Transaction) -> None:
        """Add what the batches put in ``txn`` hold to the ``holdings`` database and
        move ``holdings_through`` to their last txid: once per transaction (a commit
        takes every staged batch), a few entries (one per origin and bucket touched)."""
        batches, self.holding_puts = self.holding_puts, []
        if not batches:
            return
        db = self._env.holdings_db
        own = self._env.instance_name
        first = _U64.unpack(batches[0].records[0][0])[0]
        if len(batches) == 1:  # a direct batch (page-cache durability, a big one)
            batch = batch_holdings(first, batches[0].bookmarks, batches[0].others, own)
        else:  # the staged batches of a commit: they follow on from each other
            batch = BatchHoldings()
            marks: list[tuple[bytes, bytes]] = []
            others: list[tuple[int, str, int]] = []
            for puts in batches:
                start = _U64.unpack(puts.records[0][0])[0]
                if start != first + len(marks):  # never expected; counted apart if so
                    batch.merge(batch_holdings(first, marks, others, own))
                    first, marks, others = start, [], []
                if puts.others:
                    base = len(marks)
                    others.extend((base + i, origin, otx) for i, origin, otx in puts.others)
                marks.extend(puts.bookmarks)
            batch.merge(batch_holdings(first, marks, others, own))
        for (origin, index), add in batch.buckets.items():
            key = bucket_key(origin, index)
            txn.put(key, merged_bucket(txn.get(key, db=db), add), db=db)
        for origin, add in batch.origins.items():
            key = origin_key(origin)
            txn.put(key, merged_origin(txn.get(key, db=db), add), db=db)
        txn.put(b"holdings_through", batches[-1].records[-1][0], db=self._env.meta)

    def finish_stage(self, staging: Staging) -> list[int]:
        """The last step of :meth:`txlog.journal.Journal.stage`, once ``staging.sync()``
        returned: the records are the journal's (reads find them); returns their txids."""
        if staging.frame:
            assert self.log is not None
            self.log.written(staging.frame, staging.last)
            self._staged_bytes += len(staging.frame)
            if not self._staged:
                self._staged_since = time.monotonic()
            self._staged.append(staging.puts)
        if staging.stored:
            self._advance(staging)
        if staging.lmdb_sync:
            self._lmdb_commits += 1
            self._after_lmdb_commit(staging.last)
        if staging.frame:
            self._state.pending.add(
                staging.first,
                staging.values,
                staging.marks,
                staging.pub_updates,
                staging.origin_updates,
                staging.puts.cursors,
            )
        self._state.duplicates += len(staging.records) - staging.stored
        return staging.txids

    def _advance(self, staging: Staging) -> None:
        """The in-memory state follows a stored batch (its txids, segments, time index)."""
        self._state.segments = staging.segments
        if staging.encoded is not None:
            staging.encoded.extend(staging.values)
        if staging.now_us - self.last_time_entry >= TIME_INDEX_STEP_US:
            self.last_time_entry = staging.now_us
        self._state.last_txid = staging.last
        self._state.commits += 1
        self._state.appended += staging.stored

    def abandon_stage(self, staging: Staging) -> None:
        """``staging.sync()`` failed: nothing of the batch is acknowledged. Its commit
        log frame is not counted (the next write overwrites it); a big batch LMDB had
        already committed stays in LMDB (its txids are used, so the next batch goes on
        after them), but was never made durable nor acknowledged."""
        if staging.direct:
            if staging.stored:
                self._advance(staging)
            self._after_lmdb_commit(staging.last, synced=False)
            self.pub_cache.clear()
            return
        self._abandon_staged(None)

    # ------------------------------------------------------ LMDB behind the commit log
    def _write_txn(self) -> lmdb.Transaction:
        """A new write transaction (on the calling thread, which must also end it)
        holding every staged batch: whatever LMDB commits next goes on after them."""
        txn = self._env.env.begin(write=True)
        self.holding_puts = []
        try:
            for puts in self._staged:
                self.put(txn, puts)
        except BaseException:
            txn.abort()
            raise
        self._txn = txn
        return txn

    @property
    def staged_records(self) -> int:
        """Records stored durably (in the commit log) that LMDB has not committed yet."""
        return self._state.last_txid - self._state.pending.first_txid + 1 if self._staged else 0

    @property
    def has_commit_log(self) -> bool:
        """Whether batches are made durable in the commit log (``fsync`` durability)."""
        return self.log is not None

    @property
    def has_staged(self) -> bool:
        """Whether anything (records, or only upstream cursors) waits for LMDB's commit."""
        return bool(self._staged)

    @property
    def staged_bytes(self) -> int:
        """Stored bytes of the staged records (see :attr:`staged_records`)."""
        return self._staged_bytes if self._staged else 0

    @property
    def staged_seconds(self) -> float:
        """How long the oldest staged batch has waited for LMDB (0 when none does)."""
        return time.monotonic() - self._staged_since if self._staged else 0.0

    def commit(self, on_staged: Callable[[], None] | None = None) -> None:
        """Commit the staged batches to LMDB: one write transaction takes them all
        (``on_staged`` is called once its puts are done), with one ``fdatasync`` of
        ``data.mdb``; its meta page follows with the next commit or sync. When the
        commit log has moved on to a new file, LMDB is synced and the log files it now
        holds durably are deleted. A no-op without staged batches.

        Runs on any one thread, but not beside another write of this journal. Raises
        :class:`JournalError` when LMDB fails (a full disk, an I/O error): the staged
        records stay durable in the commit log and in memory (every read still serves
        them) and the next commit or direct batch writes them to LMDB again.
        """
        if not self._staged:
            return
        txn: lmdb.Transaction | None = None
        through = self._state.last_txid
        try:
            txn = self._write_txn()
            self.put_holdings(txn)
            if on_staged is not None:
                on_staged()
            self._txn = None
            txn.commit()
        except lmdb.Error as exc:
            self._txn = None
            if txn is not None:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            self.pub_cache.clear()
            if isinstance(exc, lmdb.MapFullError):
                raise JournalError(
                    f"the journal is full: it reached its MapSize of {self._map_size} "
                    "bytes; what was acknowledged is safe in the commit log and goes into "
                    "LMDB once there is room: raise TransactionLog/MapSize and restart, "
                    "and remove old journals (amps-action-do-remove-journal) so their "
                    "space is reused"
                ) from None
            raise JournalError(
                f"journal {self._env.path}: LMDB could not commit ({exc}); the records are "
                "safe in the commit log and are written again with the next commit. "
                f"Check the disk holding {self._env.path}"
            ) from exc
        self._lmdb_commits += 1
        if self.log is not None:
            if self.log.files > 1:
                self._env.env.sync(True)
                self._after_lmdb_commit(through, synced=True)
            else:
                self._after_lmdb_commit(through, synced=False)

    def _after_lmdb_commit(self, through: int, synced: bool = True) -> None:
        """LMDB committed everything staged through txid ``through``: reads find it
        there now; when LMDB was also synced, the log files it covers go."""
        self._staged = []
        self._staged_bytes = 0
        self._state.pending = PendingTail(through + 1)
        if synced and self.log is not None:
            self.log.release_through(through)

    def _abandon_staged(self, txn: lmdb.Transaction | None) -> None:
        """A stage failed: nothing of it was stored. Its transaction (if any) is
        aborted; the staged batches before it stay staged (the next write transaction
        takes them again); the cached high-water marks may be ahead: forget them."""
        self.pub_cache.clear()
        self._txn = None
        if txn is not None:
            with contextlib.suppress(lmdb.Error):
                txn.abort()

    @staticmethod
    def _reject(rejected: dict[int, str] | None, index: int, why: str) -> int:
        if rejected is not None:
            rejected[index] = why
        return -1
