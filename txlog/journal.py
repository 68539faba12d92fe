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
The journal's parts, each handed what it works on (no part imports this module):
opening and its checks in :mod:`txlog.opening`, the LMDB environment and its
sub-databases in :mod:`txlog.environment`, the shared in-memory state in
:mod:`txlog.state`, writing (:meth:`Journal.stage`, :meth:`Journal.commit`) in
:mod:`txlog.writing`, recovery from the commit log at open in :mod:`txlog.recovery`,
the reads and index lookups in :mod:`txlog.reading`, statistics and verify in
:mod:`txlog.inspection`, segment maintenance in :mod:`txlog.maintenance`, the commit
log in :mod:`txlog.commitlog` and the staged tail in :mod:`txlog.pending`. The
:class:`Journal` here opens and closes them, and is the API the rest of amps-py uses.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import lmdb

from . import preflight
from .commitlog import CommitLog, log_files
from .environment import JournalEnv
from .errors import JournalDamaged as JournalDamaged  # re-exported
from .errors import JournalError as JournalError  # re-exported
from .holdings import Holdings
from .inspection import JournalStatistics as JournalStatistics  # re-exported
from .inspection import VerifyProblem as VerifyProblem  # re-exported
from .inspection import journal_statistics, verify_journal
from .maintenance import SegmentMaintenance
from .opening import JOURNAL_FORMAT as JOURNAL_FORMAT  # re-exported
from .opening import LMDB_DAMAGE_ERRORS as LMDB_DAMAGE_ERRORS  # re-exported
from .opening import WRITER_LOCK_FILE as WRITER_LOCK_FILE  # re-exported
from .opening import (
    check_before_open,
    no_space,
    record_damaged,
    take_writer_lock,
    writer_lock_held,
)
from .opening import lmdb_damage as lmdb_damage  # re-exported
from .opening import lmdb_error as lmdb_error  # re-exported
from .pending import PendingTail
from .reading import EarliestAbove as EarliestAbove  # re-exported
from .reading import RecordReader
from .record import (
    CorruptRecord,
    DeliveryView,
    Record,
    RecordCodec,
    RouteView,
    StoredRecords,
)
from .recovery import read_live_log, recover_commit_log
from .segments import Segment, bytes_through, removed_through
from .state import JournalState
from .writing import DIRECT_BYTES as DIRECT_BYTES  # re-exported
from .writing import DIRECT_RECORDS as DIRECT_RECORDS  # re-exported
from .writing import TIME_INDEX_STEP_US as TIME_INDEX_STEP_US  # re-exported
from .writing import JournalWriter
from .writing import Staging as Staging  # re-exported

log = logging.getLogger("txlog.journal")
DURABILITY_MODES: Final = ("fsync", "page-cache")
DEFAULT_MAP_SIZE: Final = 64 * 1024**3
#: AMPS's default JournalSize
DEFAULT_SEGMENT_SIZE: Final = 1024**3


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
        self._use_log = commit_log and durability == "fsync" and not readonly
        #: the shared in-memory state (filled in as the journal opens)
        self._state = JournalState(0)
        #: the writing side (made once the sub-databases are open)
        self._writer: JournalWriter | None = None
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
            self._recover_for_reading(instance_name)
        self._lock_fd = -1
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = take_writer_lock(self.path)
            if traces:
                self.started_empty_over = tuple(traces)
                self.set_aside_to = tuple(
                    preflight.set_aside(self.path, self.archive_directory, traces, time.time())
                )
        self._env = self._open_lmdb(readonly)
        try:
            self._open_parts(instance_name, readonly, compression)
            if not readonly:
                recover_commit_log(self._environment, self._state, self.writer, self.map_size)
                self._check_newest_record()
                if self._use_log:
                    self.writer.log = CommitLog(self.path)
            self._state.pending = PendingTail(self._state.last_txid + 1)
            if readonly:
                read_live_log(self._environment, self._state)
        except CorruptRecord as exc:
            self.close()
            raise record_damaged(self.path, exc, self._state.last_txid) from exc
        except lmdb.Error as exc:
            self.close()
            raise lmdb_error(self.path, exc, readonly) from exc
        except BaseException:
            self.close()  # a journal of another instance or format: let go of it
            raise

    def _recover_for_reading(self, instance_name: str | None) -> None:
        """A read-only open of a journal whose writer ended without closing: give LMDB
        what only the commit log holds (a writer's open and close), or say why not."""
        try:
            Journal(
                self.path,
                instance_name=instance_name,
                durability=self.durability,
                compression=self.compression,
                map_size=self.map_size,
                segment_size=self.segment_size,
                archive_directory=self.archive_directory,
            ).close()
        except JournalError as exc:
            log.warning(
                "journal %s: the records its commit log holds past LMDB could not be "
                "written to LMDB (%s); reading what LMDB holds",
                self.path,
                exc,
            )

    def _open_lmdb(self, readonly: bool) -> lmdb.Environment:
        """LMDB's environment of the journal directory (the writer lock, if any, is
        released when it cannot open).

        Raises:
            JournalNoSpace: no room for LMDB's lock file.
            JournalError: LMDB cannot open the directory.
        """
        try:
            preflight.check_lock_file_room(self.path)
        except OSError as exc:  # LMDB would die with SIGBUS creating its lock file
            self._release_lock()
            raise no_space(self.path, exc, preflight.free_bytes(self.path)) from exc
        try:
            return lmdb.open(
                str(self.path),
                map_size=self.map_size,
                max_dbs=16,
                subdir=True,
                readonly=readonly,
                sync=self.durability == "fsync",
                # behind the commit log a lost meta page only loses what the log holds
                metasync=self.durability == "fsync" and not self._use_log,
                lock=True,
                readahead=False,
                max_readers=256,
            )
        except lmdb.Error as exc:
            self._release_lock()
            raise lmdb_error(self.path, exc) from exc

    def _check_newest_record(self) -> None:
        """A writer continues from its newest record: it must read.

        Raises:
            CorruptRecord: the newest record is damaged.
        """
        if self._state.last_txid:
            self.get(self._state.last_txid)

    def _open_parts(self, instance_name: str | None, readonly: bool, compression: str) -> None:
        """The sub-databases, the format and owner checks, the in-memory state, and the
        journal's parts (reader, writer, segment maintenance) that share them."""
        environment = self._environment = JournalEnv(
            self._env,
            self.path,
            instance_name=instance_name,
            readonly=readonly,
            durability=self.durability,
            compression=compression,
            segment_size=self.segment_size,
            archive_directory=self.archive_directory,
        )
        self.instance_name = environment.instance_name
        state = self._state
        state.last_txid = self._newest_key(environment.records, readonly)
        last_time_entry = self._newest_key(environment.times, readonly)
        reader = self._reader = RecordReader(environment, state)
        state.segments = environment.load_segments(
            state.last_txid, readonly, reader.first_lmdb_record, reader.record
        )
        # every record may have left LMDB (offloaded or removed): the table knows the last
        state.last_txid = max(
            state.last_txid, max((s.last_txid for s in state.segments), default=0)
        )
        state.removed_through = removed_through(state.segments)
        self._writer = JournalWriter(environment, state, self.map_size, last_time_entry)
        self._maintenance = SegmentMaintenance(environment, state, self._reader, self.commit)
        state.holdings_valid = environment.check_holdings(state.last_txid, readonly)

    @property
    def writer(self) -> JournalWriter:
        """The writing side (the methods of the writing section delegate to it)."""
        assert self._writer is not None, "the journal did not open"
        return self._writer

    @property
    def environment(self) -> JournalEnv:
        """The LMDB environment, its sub-databases and the journal's settings."""
        return self._environment

    @property
    def codec(self) -> RecordCodec:
        """The codec that encodes and decodes this journal's records."""
        return self._environment.codec

    @property
    def commit_log(self) -> CommitLog | None:
        """The commit log batches are made durable in (None: none, see
        :attr:`has_commit_log`); its files and its ``file_size``, for tests and tools."""
        return self.writer.log

    # the names the tests have always reached in by (see the public ones above)
    @property
    def _log(self) -> CommitLog | None:
        return self.writer.log

    @property
    def _codec(self) -> RecordCodec:
        return self._environment.codec

    @property
    def _pub_cache(self) -> dict[int, int]:
        return self.writer.pub_cache

    @property
    def _segments_db(self) -> lmdb._Database | None:
        return self._environment.segments_db

    def _forget_file(self, path: str) -> None:
        self.forget_segment_file(path)

    @property
    def holdings_valid(self) -> bool:
        """Whether :meth:`holdings` can answer (see
        :meth:`txlog.environment.JournalEnv.check_holdings`)."""
        return self._state.holdings_valid

    def _newest_key(self, db: lmdb._Database, readonly: bool) -> int:
        """See :meth:`txlog.environment.JournalEnv.newest_key`; the damage a read-only
        open survives there is kept in :attr:`damage`."""
        key, damage = self._environment.newest_key(db, readonly)
        if damage is not None:
            self.damage = damage
        return key

    def first_lmdb_record(self) -> Record | None:
        """See :meth:`RecordReader.first_lmdb_record`."""
        return self._reader.first_lmdb_record()

    def close(self) -> None:
        """Commit what is staged, sync LMDB and delete the commit log (LMDB then holds
        all it held), and close. Called from another thread than the one that staged,
        or when LMDB fails, the commit log stays: the next open writes its records to
        LMDB again."""
        writer = self._writer
        clean = True
        if writer is None:
            pass  # the open failed before anything could be staged
        elif writer.writing:
            clean = False  # a write is in progress on another thread: leave the log
        elif writer.has_staged:
            try:
                self.commit()
            except JournalError as exc:
                clean = False
                log.error("%s; the next open recovers them from the commit log", exc)
        if writer is not None and writer.log is not None:
            if clean:
                try:
                    self._env.sync(True)
                except lmdb.Error:
                    clean = False
            writer.log.close(remove=clean)
            writer.log = None
        self._env.close()
        self._release_lock()

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
        return self._state.last_txid

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
        return self.writer.begin_stage(
            records, now_us, cursors, encoded, rejected, direct, on_staged
        )

    def finish_stage(self, staging: Staging) -> list[int]:
        """See :meth:`JournalWriter.finish_stage`."""
        return self.writer.finish_stage(staging)

    def abandon_stage(self, staging: Staging) -> None:
        """See :meth:`JournalWriter.abandon_stage`."""
        self.writer.abandon_stage(staging)

    @property
    def staged_records(self) -> int:
        """See :attr:`JournalWriter.staged_records`."""
        return self.writer.staged_records

    @property
    def has_commit_log(self) -> bool:
        """See :attr:`JournalWriter.has_commit_log`."""
        return self.writer.has_commit_log

    @property
    def has_staged(self) -> bool:
        """See :attr:`JournalWriter.has_staged`."""
        return self.writer.has_staged

    @property
    def staged_bytes(self) -> int:
        """See :attr:`JournalWriter.staged_bytes`."""
        return self.writer.staged_bytes

    @property
    def staged_seconds(self) -> float:
        """See :attr:`JournalWriter.staged_seconds`."""
        return self.writer.staged_seconds

    def commit(self, on_staged: Callable[[], None] | None = None) -> None:
        """See :meth:`JournalWriter.commit`."""
        self.writer.commit(on_staged)

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
        """See :meth:`txlog.environment.JournalEnv.segment_path`."""
        return self._environment.segment_path(seg)

    def forget_segment_file(self, path: str) -> None:
        """See :meth:`RecordReader.forget_file`."""
        self._reader.forget_file(path)

    def read(self, after_txid: int, limit: int, max_txid: int | None = None) -> list[Record]:
        """Return up to ``limit`` records with txid > ``after_txid`` (and <= ``max_txid``).

        Raises:
            CorruptRecord: a record in the range failed its CRC, or
                (:class:`UnreadableRecords`) LMDB reports a damaged page where the read
                went; the message names the txid or the unreadable range.
        """
        return self._reader.read(after_txid, limit, max_txid)

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
        return self._reader.read_stored(after_txid, limit, max_txid)

    def read_route_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[RouteView], CorruptRecord | None]:
        """Routing views (with the stored bytes) for replication; same damage rule as
        :meth:`read_views`."""
        return self._reader.scan(after_txid, limit, max_txid, self._environment.codec.route_view)

    def route_payload(self, view: RouteView) -> bytes:
        return self._environment.codec.route_payload(view)

    def read_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[DeliveryView], CorruptRecord | None]:
        """Delivery views of up to ``limit`` records after ``after_txid`` (<= ``max_txid``).

        Replay's read: cheaper than :meth:`read`, CRC still checked. A damaged record
        (or a damaged LMDB page: :class:`UnreadableRecords`) ends the batch: the sound
        views before it are returned with the error, so nothing before the damage is
        withheld and nothing damaged is served.
        """
        return self._reader.scan(after_txid, limit, max_txid, self._environment.codec.view)

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
        return self._reader.record(txid)

    def first_txid(self) -> int:
        """The oldest txid still held (in LMDB or a segment file); 0 when none is."""
        return self._reader.first_txid()

    def lookup_bookmark(self, pub_hash: int, seq: int) -> int | None:
        """See :meth:`RecordReader.lookup_bookmark`."""
        return self._reader.lookup_bookmark(pub_hash, seq)

    def earliest_above(self, pub_hash: int, seq: int, through_txid: int) -> EarliestAbove:
        """A search for the earliest record held of ``pub_hash`` with a seq above
        ``seq`` (txid at most ``through_txid``); run it with :meth:`EarliestAbove.step`.
        See :class:`txlog.reading.EarliestAbove` for its cost and contract."""
        return EarliestAbove(self._environment, self._state, pub_hash, seq, through_txid)

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
        return any(seg.state == "removed" and not seg.cleaned for seg in self._state.segments)

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
        return journal_statistics(self._environment, self._state, self._reader)

    def verify(self, progress: Callable[[int], None] | None = None) -> list[VerifyProblem]:
        """See :func:`txlog.inspection.verify_journal` (never raises for damage)."""
        return verify_journal(self._environment, self._state, progress)

    # ------------------------------------------------------------------ segments
    def bytes_through(self, txid: int) -> int:
        """Stored bytes of every record up to ``txid``, from the segment table: exact
        at segment boundaries, within a segment estimated from its mean record size.
        Differences give the bytes between two txids (replication lag in bytes)."""
        return bytes_through(self._state.segments, txid)

    @property
    def removed_through(self) -> int:
        """The newest txid of a removed segment (0 when none was removed): reads start
        after it."""
        return self._state.removed_through

    def segments(self) -> list[Segment]:
        """The segment table, oldest first (removed segments included)."""
        return list(self._state.segments)

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
