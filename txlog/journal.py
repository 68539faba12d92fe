"""The LMDB journal (transaction log) of one instance.

One LMDB environment holds these sub-databases:

==============  ==========================  =====================================
name            key                         value
==============  ==========================  =====================================
``records``     txid (u64 BE)               record (:mod:`txlog.record`)
``bookmarks``   pub_hash u64 + seq u64      txid (u64 BE)  — exact dedup, resume
``publishers``  pub_hash u64                last seq u64 + client name (logon ack)
``origins``     origin instance name        highest origin txid stored (resync)
``times``       local ts µs (u64 BE)        first txid at or after it (sparse)
``upstreams``   upstream instance name      upstream txid u64 + its bookmark (resync)
``meta``        text key                    text value (format, instance name)
``segments``    segment id (u64 BE)         :class:`txlog.segments.Segment` row
``destinations`` destination name           txid u64 it has acknowledged (removal)
``floors``      pub_hash u64                highest seq of its records removed
``holdings``    origin, or origin + bucket  what is held of each origin (resync
                                            without a cursor, :mod:`txlog.holdings`)
==============  ==========================  =====================================

Records are grouped into numbered segments (AMPS's journal files, see
:mod:`txlog.segments`); sealed segments can be compressed or archived into segment
files, which every read below still serves, or removed.

Contract:

- Exactly one writer writes, one write at a time (each LMDB write transaction begins
  and ends within one call, on the calling thread: LMDB ties it to that thread). In
  ``fsync`` durability :meth:`Journal.stage` makes a batch durable with one fsync of
  the commit log (:mod:`txlog.commitlog`) and writes nothing to LMDB: it checks for
  duplicates against LMDB's committed records and the staged ones.
  :meth:`Journal.commit` gives LMDB every staged batch in one transaction (the server
  does it every 100 ms); :meth:`Journal.append` is both. :meth:`Journal.begin_stage`,
  ``Staging.sync`` and :meth:`Journal.finish_stage` are the three steps of a stage, so
  that the sync may run on another thread. A big batch, ``page-cache`` durability or
  ``commit_log=False`` commit LMDB in the stage itself, after the staged batches.
- Readers may run concurrently from any thread; every read opens and closes its own
  short transaction, so no transaction ever spans an ``await``, and serves the staged
  records LMDB has not committed yet from memory (:mod:`txlog.pending`), so a record
  is readable as soon as :meth:`Journal.stage` returns. A read-only open beside a
  running writer serves what its commit log holds past LMDB; opening a journal whose
  writer ended without closing it first writes what the commit log holds past LMDB
  into LMDB.
- A record whose bookmark ``(pub_hash, seq)`` is already stored (or at or below what
  removal deleted of that publisher) is a duplicate: it is not stored and
  :meth:`append` returns ``0`` for it. A seq below the publisher's highest that is not
  stored is stored (exact dedup; the high-water mark only makes higher seqs cheap).
- Opening costs the same whatever the journal size: no scan happens at start.
- Every LMDB transaction that stores records also adds them to the ``holdings`` index
  (:mod:`txlog.holdings`: per origin and bucket of origin txids, a fingerprint of the
  bookmarks held) and records the txid it covers; a journal that was written without
  keeping it (before it existed, or by an older amps-py since) is marked and never
  keeps or reports it again (:attr:`Journal.holdings_valid`).
- Segment maintenance (:mod:`txlog.maintenance`, reached through
  :meth:`Journal.mark_offloaded`, :meth:`Journal.mark_removed`,
  :meth:`Journal.purge_step`, :meth:`Journal.save_destination_positions`) is writing:
  only the single writer calls it, between batches, once :meth:`Journal.commit` gave
  LMDB what is staged.
- Every read checks the record CRC; a damaged record raises :class:`CorruptRecord`.
  A damaged LMDB page met by a read raises (or returns, for the reads that return
  their damage) :class:`UnreadableRecords`, a :class:`CorruptRecord` naming the txid
  range that does not read (or the index); no raw ``lmdb`` error leaves a read, and
  no read steps from page to page (a step onto a damaged page can abort the process:
  see :mod:`txlog.reading`).

The journal's parts: opening and its checks in :mod:`txlog.opening`, the reads and
index lookups in :mod:`txlog.reading`, statistics and verify in
:mod:`txlog.inspection`, segment maintenance in :mod:`txlog.maintenance`, the commit
log in :mod:`txlog.commitlog` and the staged tail in :mod:`txlog.pending`. Writing
(:meth:`Journal.stage`, :meth:`Journal.commit`) and recovery are here.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import lmdb

from . import preflight
from .commitlog import CommitLog, LoggedBatch, encode_batch, log_files, read_log, remove_log
from .errors import JournalDamaged as JournalDamaged  # re-exported
from .errors import JournalError as JournalError  # re-exported
from .holdings import (
    BatchHoldings,
    Holdings,
    batch_holdings,
    bucket_key,
    merged_bucket,
    merged_origin,
    origin_key,
)
from .inspection import JournalStatistics as JournalStatistics  # re-exported
from .inspection import VerifyProblem as VerifyProblem  # re-exported
from .inspection import journal_statistics, verify_journal
from .maintenance import SegmentMaintenance, unpack_u64
from .opening import JOURNAL_FORMAT as JOURNAL_FORMAT  # re-exported
from .opening import LMDB_DAMAGE_ERRORS as LMDB_DAMAGE_ERRORS  # re-exported
from .opening import WRITER_LOCK_FILE as WRITER_LOCK_FILE  # re-exported
from .opening import (
    check_before_open,
    check_format_and_owner,
    no_space,
    record_damaged,
    take_writer_lock,
    writer_lock_held,
)
from .opening import lmdb_damage as lmdb_damage  # re-exported
from .opening import lmdb_error as lmdb_error  # re-exported
from .pending import PendingTail as _PendingTail
from .reading import EarliestAbove as EarliestAbove  # re-exported
from .reading import RecordReader
from .record import (
    CorruptRecord,
    DeliveryView,
    Record,
    RecordCodec,
    ReplicaRecord,
    RouteView,
    StoredRecords,
    check_stored_records,
)
from .segments import Segment, bytes_through, grown_table, removed_through

log = logging.getLogger("txlog.journal")
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
DURABILITY_MODES: Final = ("fsync", "page-cache")
#: one ``times`` index entry per this many microseconds of publishing
TIME_INDEX_STEP_US: Final = 10_000
DEFAULT_MAP_SIZE: Final = 64 * 1024**3
#: a batch this big (records, or stored bytes) skips the commit log: LMDB commits it and
#: syncs (two fsyncs, but no second copy of every byte), as without a commit log
DIRECT_RECORDS: Final = 1_000
DIRECT_BYTES: Final = 256 * 1024
#: AMPS's default JournalSize
DEFAULT_SEGMENT_SIZE: Final = 1024**3


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


def _stored_pair(value: bytes, txid: int) -> tuple[int, bytes]:
    return txid, value


class _Puts:
    """What LMDB is given for one stored batch (see :meth:`Journal._put`)."""

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
    """A batch :meth:`Journal.begin_stage` wrote, not durable until :meth:`sync`."""

    __slots__ = (
        "_journal",
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
        journal: Journal,
        txids: list[int],
        records: Sequence[Record],
        now_us: int,
        encoded: list[bytes] | None,
        puts: _Puts,
    ) -> None:
        self._journal = journal
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
        journal = self._journal
        if self.log_fd >= 0:
            assert journal._log is not None
            journal._log.flush(self.log_fd)
        elif self.lmdb_sync:
            journal._env.sync(True)


class Journal:
    """An instance's transaction log in ``path`` (a directory, created if missing).

    Args:
        path: the journal directory (``TransactionLog/JournalDirectory``).
        instance_name: the owning instance; a journal written by another instance
            name is refused so two configs never share one directory by mistake.
            ``None`` accepts any (tools that only read).
        durability: ``fsync`` (default: every commit is on disk before it returns) or
            ``page-cache`` (commits reach the OS page cache only: survives a process
            crash, not a power loss).
        compression: ``none`` or ``zstd`` for new records' payloads.
        readonly: open for reading only (``amps-py txlog`` tools on a live journal).
        segment_size: bytes of records after which the current segment is sealed
            (AMPS ``JournalSize``).
        archive_directory: where archived segment files go
            (``TransactionLog/JournalArchiveDirectory``); archiving needs it.
        allow_empty: start an empty journal even where one existed before (lock
            files or segment files, but an empty or missing ``data.mdb``); without
            it such a directory is refused. Segment files found are moved into a
            ``discarded-<time>`` directory beside them (:attr:`set_aside_to`), so the
            new journal never overwrites them.
        commit_log: in ``fsync`` durability, make batches durable in the commit log
            (:mod:`txlog.commitlog`: one fsync per batch) and commit LMDB behind it;
            ``False`` commits LMDB with its two fsyncs per batch instead.

    Opening checks the files before LMDB sees them (:mod:`txlog.preflight`): a
    ``data.mdb`` shorter than its LMDB meta pages say, or with invalid meta pages, is
    refused (LMDB would crash the process with SIGBUS). A writer also reads its newest
    record, which it continues from. Every refusal raises :class:`JournalDamaged` (or
    :class:`JournalError`) with the file, the problem and the fix, and happens before
    anything in ``data.mdb`` or the segment files changes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        instance_name: str | None = None,
        durability: str = "fsync",
        compression: str = "none",
        map_size: int = DEFAULT_MAP_SIZE,
        readonly: bool = False,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        archive_directory: str | os.PathLike[str] | None = None,
        allow_empty: bool = False,
        commit_log: bool = True,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise JournalError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        if compression not in ("none", "zstd"):
            raise JournalError(f"unknown compression {compression!r}; use none or zstd")
        self.path = Path(path)
        self.segment_size = segment_size
        self.archive_directory = Path(archive_directory) if archive_directory else None
        self.durability = durability
        self.map_size = map_size
        self.compression = compression
        self._log: CommitLog | None = None
        self._use_log = commit_log and durability == "fsync" and not readonly
        #: the write transaction of a commit or direct batch in progress
        self._txn: lmdb.Transaction | None = None
        #: what LMDB is to be given for each staged batch (durable in the commit log,
        #: not yet in LMDB), oldest first
        self._staged: list[_Puts] = []
        self._pending = _PendingTail(1)
        self._lmdb_commits = 0
        self._staged_bytes = 0
        self._staged_since = 0.0
        #: with ``allow_empty``: what showed that a journal existed where an empty one
        #: was started (empty when none did), and where its segment files went
        self.started_empty_over: tuple[str, ...] = ()
        self.set_aside_to: tuple[Path, ...] = ()
        #: a read-only open that met a damaged LMDB page where it reads the newest
        #: record: what is wrong (``verify`` lists it; reading through it may abort)
        self.damage: JournalDamaged | None = None
        traces = check_before_open(
            self.path, self.archive_directory, instance_name, readonly, allow_empty
        )
        if readonly and log_files(self.path) and not writer_lock_held(self.path):
            # a writer ended without closing: give LMDB what only the commit log holds
            try:
                Journal(
                    self.path,
                    instance_name=instance_name,
                    durability=durability,
                    compression=compression,
                    map_size=map_size,
                    segment_size=segment_size,
                    archive_directory=archive_directory,
                ).close()
            except JournalError as exc:
                log.warning(
                    "journal %s: the records its commit log holds past LMDB could not be "
                    "written to LMDB (%s); reading what LMDB holds",
                    self.path,
                    exc,
                )
        self._lock_fd = -1
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = take_writer_lock(self.path)
            if traces:
                self.started_empty_over = tuple(traces)
                self.set_aside_to = tuple(
                    preflight.set_aside(self.path, self.archive_directory, traces, time.time())
                )
        try:
            preflight.check_lock_file_room(self.path)
        except OSError as exc:  # LMDB would die with SIGBUS creating its lock file
            self._release_lock()
            raise no_space(self.path, exc, preflight.free_bytes(self.path)) from exc
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=16,
                subdir=True,
                readonly=readonly,
                sync=durability == "fsync",
                # behind the commit log a lost meta page only loses what the log holds
                metasync=durability == "fsync" and not self._use_log,
                lock=True,
                readahead=False,
                max_readers=256,
            )
        except lmdb.Error as exc:
            self._release_lock()
            raise lmdb_error(self.path, exc) from exc
        try:
            self._open_databases(instance_name, readonly, compression)
            if not readonly:
                self._recover_commit_log()
                self._check_newest_record()
                if self._use_log:
                    self._log = CommitLog(self.path)
            self._pending = _PendingTail(self._last_txid + 1)
            if readonly:
                self._read_live_log()
        except CorruptRecord as exc:
            self.close()
            raise record_damaged(self.path, exc, self._last_txid) from exc
        except lmdb.Error as exc:
            self.close()
            raise lmdb_error(self.path, exc, readonly) from exc
        except BaseException:
            self.close()  # a journal of another instance or format: let go of it
            raise

    def _check_newest_record(self) -> None:
        """A writer continues from its newest record: it must read.

        Raises:
            CorruptRecord: the newest record is damaged.
        """
        if self._last_txid:
            self.get(self._last_txid)

    def _open_databases(self, instance_name: str | None, readonly: bool, compression: str) -> None:
        """The sub-databases, the format and owner checks, and the in-memory state."""
        create = not readonly
        self._records = self._env.open_db(b"records", create=create)
        self._bookmarks = self._env.open_db(b"bookmarks", create=create)
        self._publishers = self._env.open_db(b"publishers", create=create)
        self._origins = self._env.open_db(b"origins", create=create)
        self._times = self._env.open_db(b"times", create=create)
        self._meta = self._env.open_db(b"meta", create=create)
        self._upstreams = self._env.open_db(b"upstreams", create=create)
        self._segments_db = self._open_optional_db(b"segments", create)
        self._destinations_db = self._open_optional_db(b"destinations", create)
        self._floors_db = self._open_optional_db(b"floors", create)
        self._holdings_db = self._open_optional_db(b"holdings", create)
        self._codec = RecordCodec(compress=compression == "zstd")
        self.instance_name = check_format_and_owner(
            self._env, self._meta, self.path, instance_name, readonly
        )
        self._last_txid = self._newest_key(self._records, readonly)
        self._last_time_entry = self._newest_key(self._times, readonly)
        self._pub_cache: dict[int, int] = {}
        self._floor_cache: dict[int, int] = {}
        self._commits = 0
        self._appended = 0
        self._duplicates = 0
        self._reader = RecordReader(self)
        #: the segment table, oldest first; replaced (never changed in place) on change
        self._segments: list[Segment] = []
        self._removed_through = 0
        self._segments = self._load_segments(readonly)
        # every record may have left LMDB (offloaded or removed): the table knows the last
        self._last_txid = max(
            self._last_txid, max((s.last_txid for s in self._segments), default=0)
        )
        self._removed_through = removed_through(self._segments)
        self._maintenance = SegmentMaintenance(self)
        self._holdings_valid = self._check_holdings(readonly)
        #: the batches with records put in the write transaction being built, whose
        #: holdings go in with one update before it commits (see _put_holdings)
        self._holding_puts: list[_Puts] = []

    def _check_holdings(self, readonly: bool) -> bool:
        """Whether the ``holdings`` database accounts for every record (see
        :mod:`txlog.holdings`): it does when every write since the journal was created
        kept it, which the ``holdings_through`` meta entry shows (the newest txid it
        covers). A journal written before holdings existed, or written since by an
        amps-py that did not keep them, never has them again (marked ``off``): a
        resync without a cursor then sends everything, as before."""
        if self._holdings_db is None:
            return False
        with self._env.begin(db=self._meta) as txn:
            state = txn.get(b"holdings")
            raw = txn.get(b"holdings_through")
        if state == b"off":
            return False
        through = _U64.unpack(raw)[0] if raw is not None and len(raw) == 8 else None
        valid = through == self._last_txid if through is not None else self._last_txid == 0
        through_now = _U64.pack(self._last_txid)
        # write only what changes: an open that changes nothing leaves the files as
        # they were (a start refused over a damaged record must not touch the journal)
        if not readonly and (raw != through_now if valid else state != b"off"):
            with self._env.begin(write=True, db=self._meta) as txn:
                if valid:
                    txn.put(b"holdings_through", through_now)
                else:
                    txn.put(b"holdings", b"off")
        return valid

    @property
    def holdings_valid(self) -> bool:
        """Whether :meth:`holdings` can answer (see :meth:`_check_holdings`)."""
        return self._holdings_valid

    def _newest_key(self, db: lmdb._Database, readonly: bool) -> int:
        """The highest (u64) key of ``db``, 0 when empty. A read-only open (the tools)
        survives a damaged LMDB page here, so ``verify`` can still list the damage: the
        segment table, written with every commit, then gives the newest txid.

        Raises:
            lmdb.Error: LMDB cannot read the newest page (a writer's open).
        """
        try:
            with self._env.begin(db=db) as txn:
                cur = txn.cursor()
                return int(_U64.unpack(cur.key())[0]) if cur.last() else 0
        except LMDB_DAMAGE_ERRORS as exc:
            if not readonly:
                raise
            self.damage = lmdb_damage(self.path, exc)
            return 0

    def _open_optional_db(self, name: bytes, create: bool) -> lmdb._Database | None:
        """A sub-database newer versions added; ``None`` when a read-only open finds an
        older journal without it."""
        try:
            return self._env.open_db(name, create=create)
        except lmdb.NotFoundError:
            return None

    def _load_segments(self, readonly: bool) -> list[Segment]:
        segments: list[Segment] = []
        if self._segments_db is not None:
            with self._env.begin(db=self._segments_db) as txn:
                for key, value in txn.cursor():
                    segments.append(Segment.decode(_U64.unpack(key)[0], value))
        if segments or self._last_txid == 0:
            return segments
        # a journal from before segments: everything so far is segment 1
        first = self.first_lmdb_record()
        last = self.get(self._last_txid)
        with self._env.begin() as txn:
            stat = txn.stat(self._records)
        pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
        seg = Segment(
            1,
            first.txid if first else 1,
            self._last_txid,
            first.local_ts if first else 0,
            last.local_ts if last else 0,
            pages * stat["psize"],
            stat["entries"],
        )
        if not readonly and self._segments_db is not None:
            with self._env.begin(write=True, db=self._segments_db) as txn:
                txn.put(_U64.pack(seg.id), seg.encode())
        return [seg]

    def first_lmdb_record(self) -> Record | None:
        """See :meth:`RecordReader.first_lmdb_record`."""
        return self._reader.first_lmdb_record()

    def close(self) -> None:
        """Commit what is staged, sync LMDB and delete the commit log (LMDB then holds
        all it held), and close. Called from another thread than the one that staged,
        or when LMDB fails, the commit log stays: the next open writes its records to
        LMDB again."""
        clean = True
        if self._txn is not None:
            clean = False  # a write is in progress on another thread: leave the log
        elif self._staged:
            try:
                self.commit()
            except JournalError as exc:
                clean = False
                log.error("%s; the next open recovers them from the commit log", exc)
        if self._log is not None:
            if clean:
                try:
                    self._env.sync(True)
                except lmdb.Error:
                    clean = False
            self._log.close(remove=clean)
            self._log = None
        self._env.close()
        self._release_lock()

    def _read_live_log(self) -> None:
        """A read-only open beside a running writer: what the commit log holds past
        LMDB (durable and acknowledged, not yet committed to LMDB) becomes this
        journal's staged tail, so a reader sees every acknowledged record at once.
        Records the writer commits to LMDB later are read from there."""
        expected = self._last_txid + 1
        tail = _PendingTail(expected)
        decode = self._codec.decode
        try:
            batches = read_log(self.path, live=True)
        except (OSError, JournalError) as exc:
            log.warning("journal %s: its commit log cannot be read (%s)", self.path, exc)
            return
        for batch in batches:
            if batch.last_txid < expected:
                continue
            if batch.first_txid != expected:
                break  # not contiguous with LMDB as read here: LMDB holds what follows
            try:
                records = [decode(v, batch.first_txid + i) for i, v in enumerate(batch.values)]
            except CorruptRecord:
                break  # served from LMDB once committed (where every read checks it)
            marks = {_U64x2.pack(rec.pub_hash, rec.seq): rec.txid for rec in records}
            tail.add(batch.first_txid, batch.values, marks, {}, {}, batch.cursors)
            expected = batch.last_txid + 1
        if tail.values:
            self._pending = tail
            self._last_txid = expected - 1

    def _recover_commit_log(self) -> None:
        """Write what the commit log holds past LMDB's newest record into LMDB (after a
        crash or a power loss), make LMDB durable, and delete the log.

        Raises:
            JournalDamaged: the log does not continue LMDB's records (a gap), or is
                damaged beyond a cut last frame.
        """
        if not log_files(self.path):
            return
        try:
            batches = read_log(self.path)
        except OSError as exc:
            raise JournalError(
                f"journal {self.path}: its commit log cannot be read ({exc}); it may hold "
                "acknowledged records that LMDB lacks, so the journal is not opened. Fix: "
                f"make the commit-*.log files in {self.path} readable by this user"
            ) from exc
        todo = [batch for batch in batches if batch.last_txid > self._last_txid]
        expected = self._last_txid + 1
        for batch in todo:  # what LMDB lacks must follow on from it, batch after batch
            if batch.first_txid > expected:
                raise JournalDamaged(
                    f"journal {self.path}: its commit log goes on at txid "
                    f"{batch.first_txid} where txid {expected} is due (LMDB ends at txid "
                    f"{self._last_txid}): the records between are missing (was data.mdb "
                    f"restored from an older backup?). Fix: restore the whole directory "
                    f"{self.path} from one backup, or move its commit-*.log files away to "
                    "start from what data.mdb holds"
                )
            expected = batch.last_txid + 1
        if todo:
            count = 0
            txn = self._env.begin(write=True)
            self._holding_puts = []
            try:
                for batch in todo:
                    skip = self._last_txid - batch.first_txid + 1
                    if skip > 0:  # partly in LMDB already
                        batch = LoggedBatch(
                            batch.first_txid + skip, batch.now_us, batch.values[skip:], {}
                        )
                    self._apply_logged(txn, batch)
                    count += len(batch.values)
                self._put_holdings(txn)
                txn.commit()
            except lmdb.MapFullError:
                txn.abort()
                raise JournalError(
                    f"journal {self.path}: its commit log holds records LMDB does not, and "
                    f"they do not fit in the MapSize of {self.map_size} bytes: raise "
                    "TransactionLog/MapSize and restart (nothing was lost or changed)"
                ) from None
            except BaseException:
                txn.abort()
                raise
            log.warning(
                "journal %s: %d records the commit log held past LMDB's newest were "
                "written to LMDB (the previous run ended without closing the journal); "
                "now through txid %d",
                self.path,
                count,
                self._last_txid,
            )
        self._env.sync(True)
        remove_log(self.path)

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the file releases the flock
            self._lock_fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    @property
    def last_txid(self) -> int:
        """The txid of the newest committed record (0 for an empty journal)."""
        return self._last_txid

    def _last_seq(self, txn: lmdb.Transaction, pub_hash: int) -> int:
        seq = self._pub_cache.get(pub_hash)
        if seq is None:
            raw = txn.get(_U64.pack(pub_hash), db=self._publishers)
            seq = _U64.unpack_from(raw)[0] if raw else 0
            self._pub_cache[pub_hash] = seq
        return seq

    def append(
        self, records: Sequence[Record], now_us: int, rejected: dict[int, str] | None = None
    ) -> list[int]:
        """Store ``records`` and commit them to LMDB (see :meth:`stage`, then
        :meth:`commit`); return their txids. For tools and tests; the server stages
        and commits on its own schedule.

        Must only be called by the single writer.
        """
        txids = self.stage(records, now_us, rejected=rejected)
        self.commit()
        return txids

    def stage(
        self,
        records: Sequence[Record],
        now_us: int,
        cursors: Mapping[str, tuple[int, str]] | None = None,
        encoded: list[bytes] | None = None,
        rejected: dict[int, str] | None = None,
    ) -> list[int]:
        """Store ``records`` durably and return their txids: :meth:`begin_stage`, then
        :meth:`Staging.sync`, then :meth:`finish_stage` (:meth:`abandon_stage` when
        the sync fails), all on the calling thread.

        Raises:
            JournalError: nothing of this call was stored (a full MapSize, a failed
                write or sync); what earlier calls stored stays stored.
        """
        staging = self.begin_stage(records, now_us, cursors, encoded, rejected)
        try:
            staging.sync()
        except BaseException:
            self.abandon_stage(staging)
            raise
        return self.finish_stage(staging)

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
        """Write ``records``, not yet durably: the first of the three steps of
        :meth:`stage`. The returned :class:`Staging`'s ``sync()`` makes them durable
        (it needs no GIL: another thread may run it while this one goes on, but no
        other journal write may start before :meth:`finish_stage` or
        :meth:`abandon_stage`); :meth:`finish_stage` then makes them the journal's
        and returns their txids.

        In ``fsync`` durability with the commit log (the default), the records go into
        the commit log only, whose ``fdatasync`` is the sync: one fsync per batch.
        LMDB takes them with the next :meth:`commit`; until then every read of this
        journal serves the staged records from memory. Without the commit log
        (``page-cache`` durability, or ``commit_log=False``), and for a big batch
        (:data:`DIRECT_RECORDS`, :data:`DIRECT_BYTES`), LMDB commits here (the staged
        batches first, in the same transaction) and the sync is LMDB's.

        Each record gets the next txid and ``local_ts = now_us``; a record with no
        ``origin_txid`` becomes its own origin (``origin_txid = txid``).

        Duplicates get txid ``0`` and are not stored: a record whose bookmark is
        already stored, or at or below the publisher's removal floor. Exact matching,
        because replicated copies arrive over several paths in any order and a client
        may reorder its publishes: a later-arriving lower seq is not a duplicate. Seqs
        above the publisher's high-water mark need no lookup.

        ``cursors`` maps upstream instance names to ``(upstream txid, bookmark of that
        upstream record)``: how far this journal holds each upstream's replication
        stream. They are stored with the records, so a journal restored from a backup
        carries the cursors that match its contents.

        ``encoded``, when given, receives the stored value of every stored record, in
        txid order (once they are durable only): replication sends fresh records from
        memory instead of reading them back.

        A record that cannot be stored (a string longer than its stored length of
        65,535 UTF-8 bytes, a seq outside 0..2**64-1, ...) gets txid ``-1`` and is left
        out; the others are stored. ``rejected``, when given, receives its index in
        ``records`` and the reason. One bad record never fails a batch.

        ``direct`` decides whether LMDB takes the batch itself (``True``) or the commit
        log does (``False``); ``None``: by its size. Without a commit log LMDB always
        does. ``on_staged`` is called once the puts are done, before LMDB commits a
        direct batch (the server's event loop waits, without the GIL, while another
        thread runs the puts: py-lmdb releases the GIL around each put, so a busy
        second thread would make every put wait for a GIL switch).

        Raises:
            JournalError: nothing of this call was stored (a full MapSize, a failed
                write); what earlier calls stored stays stored.

        Must only be called by the single writer, never while another of its writes
        (a :meth:`commit`, a direct batch) runs on another thread.
        """
        txids: list[int] = []
        encode = self._codec.encode
        pack_key = _U64.pack
        pack_mark = _U64x2.pack
        txid = self._last_txid
        rec_items: list[tuple[bytes, bytes]] = []
        bm_items: list[tuple[bytes, bytes]] = []
        pub_updates: dict[int, Record] = {}  # publisher -> its highest-seq record here
        origin_updates: dict[str, int] = {}
        cache = self._pub_cache
        cached_seq = cache.get
        own_name = self.instance_name
        others: list[tuple[int, str, int]] = []
        # bookmarks stored by this batch; built only when an out-of-order copy shows up
        marks: set[bytes] | None = None
        segments = self._segments
        pending = self._pending
        if self._log is None:
            direct = True
        txn: lmdb.Transaction | None = None
        try:
            # A batch for the commit log writes nothing to LMDB here (it is applied with
            # the next commit): lookups read LMDB's committed state, and the staged tail
            # for what is not committed yet. A direct batch's write transaction holds
            # the staged batches first.
            if direct:
                txn = self._write_txn()
            bookmarks = self._bookmarks
            staged_marks_all = pending.marks
            for index, rec in enumerate(records):
                ph = rec.pub_hash
                seq = rec.seq
                last = cached_seq(ph)
                if last is None:
                    if txn is None:
                        txn = self._env.begin()
                    last = self._last_seq(txn, ph)
                    staged_high = pending.pub_high.get(ph, 0)
                    if staged_high > last:
                        last = cache[ph] = staged_high
                try:
                    bm_key = pack_mark(ph, seq)
                except struct.error:
                    txids.append(self._reject(rejected, index, f"seq {seq} is out of range"))
                    continue
                fresh = seq > last
                if not fresh:
                    # at or below the high-water mark: exact lookup (replicated
                    # copies arrive over several paths in any order, and a client
                    # may reorder its publishes after a failover); one at or below
                    # what removal deleted of this publisher is a late copy of a
                    # removed record, not new
                    if txn is None:
                        txn = self._env.begin()
                    if seq <= self._floor(txn, ph):
                        txids.append(0)
                        continue
                    if marks is None:
                        marks = {mark for mark, _ in bm_items}
                    if (
                        bm_key in marks
                        or bm_key in staged_marks_all
                        or txn.get(bm_key, db=bookmarks) is not None
                    ):
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
                if marks is not None:
                    marks.add(bm_key)
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
            values = list(map(_second, rec_items))
            first = txid - len(rec_items) + 1
            if direct is None:
                direct = len(rec_items) >= DIRECT_RECORDS or sum(map(len, values)) >= DIRECT_BYTES
                if direct:
                    # decided only now: the lookups ran in a read transaction, which saw
                    # what a write transaction holding the staged batches would
                    if txn is not None:
                        txn.abort()
                    txn = None
                    txn = self._write_txn()
            puts = _Puts(rec_items, bm_items, cursors)
            puts.others = others
            if rec_items:
                puts.publishers = [
                    (_U64.pack(ph), _U64.pack(high.seq) + high.client_name.encode())
                    for ph, high in pub_updates.items()
                ]
                puts.origins = [(o.encode(), otx) for o, otx in origin_updates.items()]
                if now_us - self._last_time_entry >= TIME_INDEX_STEP_US:
                    puts.time_entry = (_U64.pack(now_us), rec_items[0][0])
                segments, touched = grown_table(
                    self._segments, self.segment_size, first, now_us, list(map(len, values))
                )
                if self._segments_db is not None:
                    puts.segments = [(_U64.pack(seg.id), seg.encode()) for seg in touched]
            staging = Staging(self, txids, records, now_us, encoded, puts)
            if direct:
                # a big batch (or no commit log): LMDB itself is the durability point
                assert txn is not None
                self._put(txn, puts)
                self._put_holdings(txn)
                if on_staged is not None:
                    on_staged()
                self._txn = None
                txn.commit()
                staging.direct = True
                staging.lmdb_sync = self._log is not None
            else:
                if txn is not None:
                    txn.abort()
                    txn = None
                if rec_items or cursors:
                    staging.frame = encode_batch(first, now_us, values, cursors)
                    staging.marks = dict(
                        zip(map(_first, bm_items), range(first, txid + 1), strict=True)
                    )
                    assert self._log is not None
                    staging.log_fd = self._log.write(staging.frame)
        except lmdb.MapFullError:
            self._abandon_staged(txn)
            raise JournalError(
                f"the journal is full: it reached its MapSize of {self.map_size} bytes "
                "(nothing of this batch was stored); raise TransactionLog/MapSize and "
                "restart, and remove old journals (amps-action-do-remove-journal) so "
                "their space is reused"
            ) from None
        except BaseException:
            # nothing of this batch was stored: the cached high-water marks may be ahead
            self._abandon_staged(txn)
            raise
        staging.first = first
        staging.last = txid
        staging.values = values
        staging.pub_updates = pub_updates
        staging.origin_updates = origin_updates
        staging.segments = segments
        staging.stored = len(rec_items)
        return staging

    def _put(self, txn: lmdb.Transaction, puts: _Puts) -> None:
        """Write one batch's records and index entries into ``txn``."""
        if puts.records:
            txn.cursor(db=self._records).putmulti(puts.records, append=True)
            txn.cursor(db=self._bookmarks).putmulti(puts.bookmarks)
            for key, value in puts.publishers:
                txn.put(key, value, db=self._publishers)
            for key_o, otx in puts.origins:
                raw = txn.get(key_o, db=self._origins)
                if raw is None or _U64.unpack(raw)[0] < otx:
                    txn.put(key_o, _U64.pack(otx), db=self._origins)
            if puts.time_entry is not None:  # (an earlier entry for that time stays)
                txn.put(*puts.time_entry, db=self._times, overwrite=False)
            for key, value in puts.segments:
                txn.put(key, value, db=self._segments_db)
            if self._holdings_valid:
                self._holding_puts.append(puts)  # see _put_holdings
        if puts.cursors:
            for name, (up_txid, up_bm) in puts.cursors.items():
                txn.put(name.encode(), _U64.pack(up_txid) + up_bm.encode(), db=self._upstreams)

    def _put_holdings(self, txn: lmdb.Transaction) -> None:
        """Add what the batches put in ``txn`` hold to the ``holdings`` database and
        move ``holdings_through`` to their last txid: once per transaction (a commit
        takes every staged batch), a few entries (one per origin and bucket touched)."""
        batches, self._holding_puts = self._holding_puts, []
        if not batches:
            return
        db = self._holdings_db
        own = self.instance_name
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
        txn.put(b"holdings_through", batches[-1].records[-1][0], db=self._meta)

    def finish_stage(self, staging: Staging) -> list[int]:
        """The last step of :meth:`stage`, once ``staging.sync()`` returned: the
        records are the journal's (reads find them); returns their txids."""
        if staging.frame:
            assert self._log is not None
            self._log.written(staging.frame, staging.last)
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
            self._pending.add(
                staging.first,
                staging.values,
                staging.marks,
                staging.pub_updates,
                staging.origin_updates,
                staging.puts.cursors,
            )
        self._duplicates += len(staging.records) - staging.stored
        return staging.txids

    def _advance(self, staging: Staging) -> None:
        """The in-memory state follows a stored batch (its txids, segments, time index)."""
        self._segments = staging.segments
        if staging.encoded is not None:
            staging.encoded.extend(staging.values)
        if staging.now_us - self._last_time_entry >= TIME_INDEX_STEP_US:
            self._last_time_entry = staging.now_us
        self._last_txid = staging.last
        self._commits += 1
        self._appended += staging.stored

    def abandon_stage(self, staging: Staging) -> None:
        """``staging.sync()`` failed: nothing of the batch is acknowledged. Its commit
        log frame is not counted (the next write overwrites it); a big batch LMDB had
        already committed stays in LMDB (its txids are used, so the next batch goes on
        after them), but was never made durable nor acknowledged."""
        if staging.direct:
            if staging.stored:
                self._advance(staging)
            self._after_lmdb_commit(staging.last, synced=False)
            self._pub_cache.clear()
            return
        self._abandon_staged(None)

    # ------------------------------------------------------ LMDB behind the commit log
    def _write_txn(self) -> lmdb.Transaction:
        """A new write transaction (on the calling thread, which must also end it)
        holding every staged batch: whatever LMDB commits next goes on after them."""
        txn = self._env.begin(write=True)
        self._holding_puts = []
        try:
            for puts in self._staged:
                self._put(txn, puts)
        except BaseException:
            txn.abort()
            raise
        self._txn = txn
        return txn

    @property
    def staged_records(self) -> int:
        """Records stored durably (in the commit log) that LMDB has not committed yet."""
        return self._last_txid - self._pending.first_txid + 1 if self._staged else 0

    @property
    def has_commit_log(self) -> bool:
        """Whether batches are made durable in the commit log (``fsync`` durability)."""
        return self._log is not None

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
        through = self._last_txid
        try:
            txn = self._write_txn()
            self._put_holdings(txn)
            if on_staged is not None:
                on_staged()
            self._txn = None
            txn.commit()
        except lmdb.Error as exc:
            self._txn = None
            if txn is not None:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            self._pub_cache.clear()
            if isinstance(exc, lmdb.MapFullError):
                raise JournalError(
                    f"the journal is full: it reached its MapSize of {self.map_size} "
                    "bytes; what was acknowledged is safe in the commit log and goes into "
                    "LMDB once there is room: raise TransactionLog/MapSize and restart, "
                    "and remove old journals (amps-action-do-remove-journal) so their "
                    "space is reused"
                ) from None
            raise JournalError(
                f"journal {self.path}: LMDB could not commit ({exc}); the records are "
                "safe in the commit log and are written again with the next commit. "
                f"Check the disk holding {self.path}"
            ) from exc
        self._lmdb_commits += 1
        if self._log is not None:
            if self._log.files > 1:
                self._env.sync(True)
                self._after_lmdb_commit(through, synced=True)
            else:
                self._after_lmdb_commit(through, synced=False)

    def _after_lmdb_commit(self, through: int, synced: bool = True) -> None:
        """LMDB committed everything staged through txid ``through``: reads find it
        there now; when LMDB was also synced, the log files it covers go."""
        self._staged = []
        self._staged_bytes = 0
        self._pending = _PendingTail(through + 1)
        if synced and self._log is not None:
            self._log.release_through(through)

    def _abandon_staged(self, txn: lmdb.Transaction | None) -> None:
        """A stage failed: nothing of it was stored. Its transaction (if any) is
        aborted; the staged batches before it stay staged (the next write transaction
        takes them again); the cached high-water marks may be ahead: forget them."""
        self._pub_cache.clear()
        self._txn = None
        if txn is not None:
            with contextlib.suppress(lmdb.Error):
                txn.abort()

    def _apply_logged(self, txn: lmdb.Transaction, batch: LoggedBatch) -> None:
        """Write a batch the commit log holds into ``txn`` when the journal opens:
        its records and every index entry :meth:`begin_stage` makes for them (see
        :meth:`_put`); the in-memory state (segment table, newest txid) follows."""
        decode = self._codec.decode
        highs: dict[int, tuple[int, str]] = {}
        changed: set[int] = set()
        origins: dict[str, int] = {}
        rec_items: list[tuple[bytes, bytes]] = []
        bm_items: list[tuple[bytes, bytes]] = []
        others: list[tuple[int, str, int]] = []
        for offset, value in enumerate(batch.values):
            txid = batch.first_txid + offset
            rec = decode(value, txid)
            if rec.origin != self.instance_name or rec.origin_txid != txid:
                others.append((offset, rec.origin, rec.origin_txid))
            key = _U64.pack(txid)
            rec_items.append((key, value))
            bm_items.append((_U64x2.pack(rec.pub_hash, rec.seq), key))
            high = highs.get(rec.pub_hash)
            if high is None:
                raw = txn.get(_U64.pack(rec.pub_hash), db=self._publishers)
                high = (_U64.unpack_from(raw)[0] if raw else 0, "")
            if rec.seq > high[0]:
                high = (rec.seq, rec.client_name)
                changed.add(rec.pub_hash)
            highs[rec.pub_hash] = high
            if rec.origin and rec.origin != self.instance_name:
                origins[rec.origin] = max(origins.get(rec.origin, 0), rec.origin_txid)
        puts = _Puts(rec_items, bm_items, batch.cursors)
        puts.others = others
        if rec_items:
            puts.publishers = [
                (_U64.pack(ph), _U64.pack(highs[ph][0]) + highs[ph][1].encode()) for ph in changed
            ]
            puts.origins = [(origin.encode(), otx) for origin, otx in origins.items()]
            if batch.now_us - self._last_time_entry >= TIME_INDEX_STEP_US:
                puts.time_entry = (_U64.pack(batch.now_us), rec_items[0][0])
                self._last_time_entry = batch.now_us
            segments, touched = grown_table(
                self._segments,
                self.segment_size,
                batch.first_txid,
                batch.now_us,
                list(map(len, batch.values)),
            )
            if self._segments_db is not None:
                puts.segments = [(_U64.pack(seg.id), seg.encode()) for seg in touched]
            self._segments = segments
            self._last_txid = batch.last_txid
        self._put(txn, puts)

    @staticmethod
    def _reject(rejected: dict[int, str] | None, index: int, why: str) -> int:
        if rejected is not None:
            rejected[index] = why
        return -1

    def upstream_cursor(self, upstream: str) -> tuple[int, str]:
        """See :meth:`RecordReader.upstream_cursor`."""
        return self._reader.upstream_cursor(upstream)

    # ------------------------------------------------------------------ reading
    @property
    def reader(self) -> RecordReader:
        """The reads across LMDB and segment files, and the index lookups (the
        methods below use or delegate to it)."""
        return self._reader

    def segment_path(self, seg: Segment) -> Path:
        """Where ``seg``'s file is: files in the journal directory are recorded by name
        (the directory can be moved or restored elsewhere), others (archived) by
        absolute path."""
        path = Path(seg.file)
        return path if path.is_absolute() else self.path / path

    def _forget_file(self, path: str) -> None:
        self._reader.forget_file(path)

    def read(self, after_txid: int, limit: int, max_txid: int | None = None) -> list[Record]:
        """Return up to ``limit`` records with txid > ``after_txid`` (and <= ``max_txid``).

        Raises:
            CorruptRecord: a record in the range failed its CRC, or
                (:class:`UnreadableRecords`) LMDB reports a damaged page where the read
                went; the message names the txid or the unreadable range.
        """
        out, damage = self._reader.scan(after_txid, limit, max_txid, self._codec.decode)
        if damage is not None:
            raise damage
        return out

    def read_stored(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> StoredRecords:
        """Up to ``limit`` records after ``after_txid`` (<= ``max_txid``) as stored,
        after the checks every read makes (see :class:`txlog.record.StoredRecords`).

        For readers that decode many records at once in their own way (the Spark
        pipeline builds Arrow columns from them); everyone else wants :meth:`read`.

        Raises:
            CorruptRecord: a record in the range failed its checks (its txid named).
        """
        pairs, damage = self._reader.scan(after_txid, limit, max_txid, _stored_pair)
        stored = check_stored_records(pairs)
        if damage is not None:
            raise damage
        return stored

    def read_route_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[RouteView], CorruptRecord | None]:
        """Routing views (with the stored bytes) for replication; same damage rule as
        :meth:`read_views`."""
        return self._reader.scan(after_txid, limit, max_txid, self._codec.route_view)

    def route_payload(self, view: RouteView) -> bytes:
        return self._codec.route_payload(view)

    def read_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[DeliveryView], CorruptRecord | None]:
        """Delivery views of up to ``limit`` records after ``after_txid`` (<= ``max_txid``).

        Replay's read: cheaper than :meth:`read`, CRC still checked. A damaged record
        (or a damaged LMDB page: :class:`UnreadableRecords`) ends the batch: the sound
        views before it are returned with the error, so nothing before the damage is
        withheld and nothing damaged is served.
        """
        return self._reader.scan(after_txid, limit, max_txid, self._codec.view)

    def iter_records(self, after_txid: int = 0, chunk: int = 4096) -> Iterator[Record]:
        """Every record after ``after_txid`` in txid order, read in short transactions."""
        while True:
            try:
                batch = self.read(after_txid, chunk)
            except CorruptRecord as exc:
                # hand out the sound records before the damaged one, then report it
                if exc.txid is not None and exc.txid > after_txid + 1:
                    yield from self.read(after_txid, exc.txid - after_txid - 1)
                raise
            if not batch:
                return
            yield from batch
            after_txid = batch[-1].txid

    def get(self, txid: int) -> Record | None:
        """The record ``txid`` (from LMDB or its segment file), or None if not held.

        Raises:
            CorruptRecord: the record failed its CRC, or (:class:`UnreadableRecords`)
                LMDB reports a damaged page on the way to it.
        """
        if txid <= self._removed_through:
            return None
        value = self._reader.get(txid)
        if value is not None:
            return self._codec.decode(value, txid)
        found, damage = self._reader.scan(txid - 1, 1, txid, self._codec.decode)
        if damage is not None:
            raise damage
        return found[0] if found else None

    def first_txid(self) -> int:
        """The oldest txid still held (in LMDB or a segment file); 0 when none is."""
        found, _ = self._reader.scan(0, 1, None, lambda _value, txid: txid)
        return found[0] if found else 0

    def lookup_bookmark(self, pub_hash: int, seq: int) -> int | None:
        """See :meth:`RecordReader.lookup_bookmark`."""
        return self._reader.lookup_bookmark(pub_hash, seq)

    def earliest_above(self, pub_hash: int, seq: int, through_txid: int) -> EarliestAbove:
        """A search for the earliest record held of ``pub_hash`` with a seq above
        ``seq`` (txid at most ``through_txid``); run it with :meth:`EarliestAbove.step`.
        See :class:`txlog.reading.EarliestAbove` for its cost and contract."""
        return EarliestAbove(self, pub_hash, seq, through_txid)

    def publisher_last_seq(self, pub_hash: int) -> int:
        """See :meth:`RecordReader.publisher_last_seq`."""
        return self._reader.publisher_last_seq(pub_hash)

    def publisher_floor(self, pub_hash: int) -> int:
        """See :meth:`RecordReader.publisher_floor`."""
        return self._reader.publisher_floor(pub_hash)

    def held_publishers(self) -> int:
        """See :meth:`RecordReader.held_publishers`."""
        return self._reader.held_publishers()

    def known_publishers(self) -> int:
        """See :meth:`RecordReader.known_publishers`."""
        return self._reader.known_publishers()

    def removal_pending(self) -> bool:
        """Whether a removed segment's records or index entries are still being
        deleted (:meth:`purge_step`)."""
        return any(seg.state == "removed" and not seg.cleaned for seg in self._segments)

    def origin_high_water(self) -> dict[str, int]:
        """See :meth:`RecordReader.origin_high_water`."""
        return self._reader.origin_high_water()

    def holdings(
        self,
        origins: Iterable[str] | None = None,
        buckets: int = 0,
        down_to: Mapping[str, int] | None = None,
    ) -> Holdings | None:
        """See :meth:`RecordReader.holdings`."""
        return self._reader.holdings(origins, buckets, down_to)

    def txid_before_time(self, ts_us: int) -> int:
        """See :meth:`RecordReader.txid_before_time`."""
        return self._reader.txid_before_time(ts_us)

    # ------------------------------------------------------------------ tools
    def statistics(self) -> JournalStatistics:
        """See :func:`txlog.inspection.journal_statistics`."""
        return journal_statistics(self)

    def verify(self, progress: Callable[[int], None] | None = None) -> list[VerifyProblem]:
        """See :func:`txlog.inspection.verify_journal` (never raises for damage)."""
        return verify_journal(self, progress)

    # ------------------------------------------------------------------ segments
    def bytes_through(self, txid: int) -> int:
        """Stored bytes of every record up to ``txid``, from the segment table: exact
        at segment boundaries, within a segment estimated from its mean record size.
        Differences give the bytes between two txids (replication lag in bytes)."""
        return bytes_through(self._segments, txid)

    @property
    def removed_through(self) -> int:
        """The newest txid of a removed segment (0 when none was removed): reads start
        after it."""
        return self._removed_through

    def segments(self) -> list[Segment]:
        """The segment table, oldest first (removed segments included)."""
        return list(self._segments)

    def _replace_segments(self, changed: Mapping[int, Segment]) -> None:
        """Swap in changed rows of the segment table (for :mod:`txlog.maintenance`)."""
        self._segments = [changed.get(seg.id, seg) for seg in self._segments]
        self._removed_through = removed_through(self._segments)

    # ------------------------------------------ segment maintenance (txlog.maintenance)
    @property
    def maintenance(self) -> SegmentMaintenance:
        """Segment files, state changes and the purge (the methods below delegate)."""
        return self._maintenance

    def pending_removal(self) -> int:
        """See :meth:`SegmentMaintenance.pending_removal`."""
        return self._maintenance.pending_removal()

    def save_pending_removal(self, through_id: int) -> None:
        """See :meth:`SegmentMaintenance.save_pending_removal` (writer only)."""
        self._maintenance.save_pending_removal(through_id)

    def destination_positions(self) -> dict[str, int]:
        """See :meth:`SegmentMaintenance.destination_positions`."""
        return self._maintenance.destination_positions()

    def save_destination_positions(self, positions: Mapping[str, int]) -> None:
        """See :meth:`SegmentMaintenance.save_destination_positions` (writer only)."""
        self._maintenance.save_destination_positions(positions)

    def write_segment_file(
        self, seg: Segment, state: str, progress: Callable[[int], None] | None = None
    ) -> Path:
        """See :meth:`SegmentMaintenance.write_segment_file` (any thread)."""
        return self._maintenance.write_segment_file(seg, state, progress)

    def mark_offloaded(self, seg_id: int, state: str, file: Path) -> str:
        """See :meth:`SegmentMaintenance.mark_offloaded` (writer only)."""
        return self._maintenance.mark_offloaded(seg_id, state, file)

    def mark_removed(self, through_id: int) -> list[Segment]:
        """See :meth:`SegmentMaintenance.mark_removed` (writer only)."""
        return self._maintenance.mark_removed(through_id)

    def purge_pending(self) -> bool:
        """See :meth:`SegmentMaintenance.purge_pending`."""
        return self._maintenance.purge_pending()

    def purge_step(
        self, max_records: int = 10_000, on_staged: Callable[[], None] | None = None
    ) -> bool:
        """See :meth:`SegmentMaintenance.purge_step` (writer only)."""
        return self._maintenance.purge_step(max_records, on_staged)

    def _floor(self, txn: lmdb.Transaction, pub_hash: int) -> int:
        floor = self._floor_cache.get(pub_hash)
        if floor is None:
            raw = txn.get(_U64.pack(pub_hash), db=self._floors_db) if self._floors_db else None
            floor = self._floor_cache[pub_hash] = unpack_u64(bytes(raw)) if raw else 0
        return floor
