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
==============  ==========================  =====================================

Records are grouped into numbered segments (AMPS's journal files, see
:mod:`txlog.segments`); sealed segments can be compressed or archived into segment
files, which every read below still serves, or removed.

Contract:

- Exactly one writer calls :meth:`Journal.append` at a time (the server runs it on one
  worker thread); each call is one LMDB transaction and, in ``fsync`` durability, one
  fsync. Readers may run concurrently from any thread; every read opens and closes
  its own short transaction, so no transaction ever spans an ``await``.
- A record whose bookmark ``(pub_hash, seq)`` is already stored (or at or below what
  removal deleted of that publisher) is a duplicate: it is not stored and
  :meth:`append` returns ``0`` for it. A seq below the publisher's highest that is not
  stored is stored (exact dedup; the high-water mark only makes higher seqs cheap).
- Opening costs the same whatever the journal size: no scan happens at start.
- Segment maintenance (:mod:`txlog.maintenance`, reached through
  :meth:`Journal.mark_offloaded`, :meth:`Journal.mark_removed`,
  :meth:`Journal.purge_step`, :meth:`Journal.save_destination_positions`) is writing:
  only the single writer's thread calls it, between appends.
- Every read checks the record CRC; a damaged record raises :class:`CorruptRecord`.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import lmdb

from . import preflight
from .errors import JournalDamaged as JournalDamaged  # re-exported
from .errors import JournalError as JournalError  # re-exported
from .maintenance import PROGRESS_EVERY, SegmentMaintenance, unpack_u64
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
from .segments import (
    Segment,
    SegmentFile,
    SegmentFileError,
    bytes_through,
    grown_table,
    removed_through,
)

_T = TypeVar("_T")
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
JOURNAL_FORMAT: Final = "amps-py-journal-1"
DURABILITY_MODES: Final = ("fsync", "page-cache")
#: one ``times`` index entry per this many microseconds of publishing
TIME_INDEX_STEP_US: Final = 10_000
DEFAULT_MAP_SIZE: Final = 64 * 1024**3
#: AMPS's default JournalSize
DEFAULT_SEGMENT_SIZE: Final = 1024**3
_U64_MAX: Final = (1 << 64) - 1


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


@dataclass(frozen=True)
class JournalStatistics:
    path: str
    instance_name: str
    durability: str
    compression: str
    first_txid: int
    last_txid: int
    records: int
    publishers: int
    file_bytes: int
    commits: int
    appended: int
    duplicates: int
    segments: int = 0


@dataclass(frozen=True)
class VerifyProblem:
    txid: int | None
    problem: str


WRITER_LOCK_FILE: Final = "amps-py.lock"


def _take_writer_lock(path: Path) -> int:
    """Hold an exclusive lock on ``path/amps-py.lock`` for as long as the journal is
    open for writing: one writer process per journal (a second instance, or an offline
    tool while the instance runs, is refused). Returns the lock file's descriptor.

    Raises:
        JournalError: another process holds the lock (its pid is named).
    """
    fd = os.open(path / WRITER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise JournalError(
            f"journal {path} is already open for writing (by process {holder}); give "
            "each instance its own JournalDirectory, and maintain a running instance's "
            "journals through its admin API (amps-py admin journal ...)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


#: LMDB errors that mean the file's pages are not what LMDB wrote
LMDB_DAMAGE_ERRORS: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
)


def lmdb_error(path: Path, exc: lmdb.Error) -> JournalError:
    """``exc`` from LMDB on the journal in ``path``, as a :class:`JournalError` (a
    :class:`JournalDamaged` when the file is damaged) whose text names the file and
    what to do, in one line."""
    if isinstance(exc, LMDB_DAMAGE_ERRORS):
        return lmdb_damage(path, exc)
    return JournalError(f"journal {path}: LMDB failed on {path / preflight.DATA_FILE}: {exc}")


def lmdb_damage(path: Path, exc: lmdb.Error) -> JournalDamaged:
    """LMDB's report of a damaged page in the journal in ``path``, with the fix."""
    return JournalDamaged(
        f"journal {path}: LMDB cannot read {path / preflight.DATA_FILE} ({exc}): the file "
        f"is damaged. Fix: amps-py txlog verify {path} lists the damage; "
        f"{preflight.repair_advice(path)}"
    )


def _next_key(key: bytes) -> bytes:
    """The lowest key above ``key``: the next txid for a txid key."""
    if len(key) == 8 and key != b"\xff" * 8:
        return _U64.pack(_U64.unpack(key)[0] + 1)
    return key + b"\x00"


def _stored_pair(value: bytes, txid: int) -> tuple[int, bytes]:
    return txid, value


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
        #: with ``allow_empty``: what showed that a journal existed where an empty one
        #: was started (empty when none did), and where its segment files went
        self.started_empty_over: tuple[str, ...] = ()
        self.set_aside_to: tuple[Path, ...] = ()
        #: a read-only open that met a damaged LMDB page where it reads the newest
        #: record: what is wrong (``verify`` lists it; reading through it may abort)
        self.damage: JournalDamaged | None = None
        traces = self._preflight(instance_name, readonly, allow_empty)
        self._lock_fd = -1
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _take_writer_lock(self.path)
            if traces:
                self.started_empty_over = tuple(traces)
                self.set_aside_to = tuple(
                    preflight.set_aside(self.path, self.archive_directory, traces, time.time())
                )
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=16,
                subdir=True,
                readonly=readonly,
                sync=durability == "fsync",
                metasync=durability == "fsync",
                lock=True,
                readahead=False,
                max_readers=256,
            )
        except lmdb.Error as exc:
            self._release_lock()
            raise self._lmdb_failure(exc) from exc
        try:
            self._open_databases(instance_name, readonly, compression)
            if not readonly:
                self._check_newest_record()
        except CorruptRecord as exc:
            self.close()
            raise self._record_damaged(exc) from exc
        except lmdb.Error as exc:
            self.close()
            raise self._lmdb_failure(exc) from exc
        except BaseException:
            self.close()  # a journal of another instance or format: let go of it
            raise

    def _preflight(self, instance_name: str | None, readonly: bool, allow_empty: bool) -> list[str]:
        """Check ``data.mdb`` before LMDB opens it (see :mod:`txlog.preflight`).

        Returns the signs of a former journal when ``allow_empty`` lets an empty one
        start over them (else nothing).

        Raises:
            JournalDamaged: the file is damaged, or empty/missing where a journal was.
            JournalError: no journal to read (read-only), or the file is unreadable.
        """
        data = self.path / preflight.DATA_FILE
        try:
            size: int | None = data.stat().st_size
        except FileNotFoundError:
            size = None
        if readonly and size is None:
            raise JournalError(
                f"{self.path} holds no journal (no data.mdb); pass the instance's "
                "TransactionLog/JournalDirectory"
            )
        if not readonly and not size:
            traces = preflight.find_traces(self.path, self.archive_directory, instance_name)
            if traces and not allow_empty:
                state = "missing" if size is None else "empty (0 bytes)"
                raise JournalDamaged(
                    f"journal {self.path} held a journal ({preflight.describe_traces(traces)}) "
                    f"but its data.mdb is {state}: starting would begin an empty journal "
                    "and lose every message it held; nothing was changed. Fix: restore "
                    f"{self.path} from a backup, or to start empty on purpose (replication "
                    "peers then resync what they replicate to this instance) start with "
                    "amps-py serve --allow-empty-journal"
                )
            return traces
        try:
            preflight.check_data_file(data)
        except preflight.DataFileDamage as exc:
            raise JournalDamaged(
                f"journal {self.path} is damaged: {exc}; nothing was opened or changed. "
                f"Fix: {preflight.repair_advice(self.path)}"
            ) from None
        except OSError as exc:
            raise JournalError(f"cannot read {data}: {exc.strerror or exc}") from exc
        return []

    def _check_newest_record(self) -> None:
        """A writer continues from its newest record: it must read.

        Raises:
            CorruptRecord: the newest record is damaged.
        """
        if self._last_txid:
            self.get(self._last_txid)

    def _record_damaged(self, exc: CorruptRecord) -> JournalDamaged:
        txid = exc.txid if exc.txid is not None else self._last_txid
        which = "the newest record" if txid == self._last_txid else "the record"
        return JournalDamaged(
            f"journal {self.path}: {which}, txid {txid}, is damaged ({exc.problem}); the "
            "journal cannot be continued from it and nothing was changed. Fix: "
            f"amps-py txlog verify {self.path} lists every damaged record; "
            f"{preflight.repair_advice(self.path)}"
        )

    def _lmdb_failure(self, exc: lmdb.Error) -> JournalError:
        """An LMDB error while opening, as one line naming the file and the fix."""
        return lmdb_error(self.path, exc)

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
        self._codec = RecordCodec(compress=compression == "zstd")
        self._check_meta(instance_name, readonly)
        self._last_txid = self._newest_key(self._records, readonly)
        self._last_time_entry = self._newest_key(self._times, readonly)
        self._pub_cache: dict[int, int] = {}
        self._floor_cache: dict[int, int] = {}
        self._commits = 0
        self._appended = 0
        self._duplicates = 0
        self._files: dict[str, SegmentFile] = {}
        self._files_lock = threading.Lock()
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
        with self._env.begin(db=self._records) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            return self._codec.decode(cur.value(), _U64.unpack(cur.key())[0])

    # ------------------------------------------------------------------ setup
    def _check_meta(self, instance_name: str | None, readonly: bool) -> None:
        with self._env.begin(db=self._meta, write=not readonly) as txn:
            fmt = txn.get(b"format")
            owner = txn.get(b"instance")
            if fmt is None and not readonly:
                txn.put(b"format", JOURNAL_FORMAT.encode())
                if instance_name:
                    txn.put(b"instance", instance_name.encode())
                    owner = instance_name.encode()
            elif fmt is not None and fmt.decode() != JOURNAL_FORMAT:
                raise JournalError(
                    f"{self.path} holds journal format {fmt.decode()!r}, this amps-py "
                    f"reads {JOURNAL_FORMAT!r}; use the matching amps-py version"
                )
        self.instance_name = owner.decode() if owner else (instance_name or "")
        if instance_name and owner and owner.decode() != instance_name:
            raise JournalError(
                f"journal {self.path} belongs to instance {owner.decode()!r}, not "
                f"{instance_name!r}; give each instance its own JournalDirectory"
            )

    def close(self) -> None:
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
        return self._last_txid

    def _last_seq(self, txn: lmdb.Transaction, pub_hash: int) -> int:
        seq = self._pub_cache.get(pub_hash)
        if seq is None:
            raw = txn.get(_U64.pack(pub_hash), db=self._publishers)
            seq = _U64.unpack_from(raw)[0] if raw else 0
            self._pub_cache[pub_hash] = seq
        return seq

    def append(
        self,
        records: Sequence[Record],
        now_us: int,
        on_staged: Callable[[], None] | None = None,
        cursors: Mapping[str, tuple[int, str]] | None = None,
        encoded: list[bytes] | None = None,
        rejected: dict[int, str] | None = None,
    ) -> list[int]:
        """Store ``records`` in one transaction (one fsync) and return their txids.

        Each record gets the next txid and ``local_ts = now_us``; a record with no
        ``origin_txid`` becomes its own origin (``origin_txid = txid``).

        Duplicates get txid ``0`` and are not stored: a record whose bookmark is
        already stored, or at or below the publisher's removal floor. Exact matching,
        because replicated copies arrive over several paths in any order and a client
        may reorder its publishes: a later-arriving lower seq is not a duplicate. Seqs
        above the publisher's high-water mark need no lookup.

        ``cursors`` maps upstream instance names to ``(upstream txid, bookmark of that
        upstream record)``: how far this journal holds each upstream's replication
        stream. They are written in the same transaction as the records, so a journal
        restored from a backup carries the cursors that match its contents.

        ``encoded``, when given, receives the stored value of every stored record, in
        txid order (after a successful commit only): replication sends fresh records
        from memory instead of reading them back.

        A record that cannot be stored (a string longer than its stored length of
        65,535 UTF-8 bytes, a seq outside 0..2**64-1, ...) gets txid ``-1`` and is left
        out; the others commit. ``rejected``, when given, receives its index in
        ``records`` and the reason. One bad record never fails a batch.

        ``on_staged`` is called once every put is done, just before the commit (the
        fsync). The server uses it to keep its event loop off the GIL while the puts
        run (py-lmdb releases the GIL around every put, so a busy second thread would
        make each put wait for a GIL switch) and to run the fsync in parallel.

        Must only be called by the single writer.
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
        # bookmarks stored by this batch; built only when an out-of-order copy shows up
        marks: set[bytes] | None = None
        try:
            with self._env.begin(write=True) as txn:
                bookmarks = self._bookmarks
                for index, rec in enumerate(records):
                    ph = rec.pub_hash
                    seq = rec.seq
                    last = cached_seq(ph)
                    if last is None:
                        last = self._last_seq(txn, ph)
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
                        if seq <= self._floor(txn, ph):
                            txids.append(0)
                            continue
                        if marks is None:
                            marks = {mark for mark, _ in bm_items}
                        if bm_key in marks or txn.get(bm_key, db=bookmarks) is not None:
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
                    if own_origin or not origin:
                        continue
                    if rec.origin_txid > origin_updates.get(origin, 0):
                        origin_updates[origin] = rec.origin_txid
                if rec_items:
                    txn.cursor(db=self._records).putmulti(rec_items, append=True)
                    txn.cursor(db=bookmarks).putmulti(bm_items)
                    for ph, high in pub_updates.items():
                        value = _U64.pack(high.seq) + high.client_name.encode()
                        txn.put(_U64.pack(ph), value, db=self._publishers)
                    for origin, otx in origin_updates.items():
                        key_o = origin.encode()
                        raw = txn.get(key_o, db=self._origins)
                        if raw is None or _U64.unpack(raw)[0] < otx:
                            txn.put(key_o, _U64.pack(otx), db=self._origins)
                    if now_us - self._last_time_entry >= TIME_INDEX_STEP_US:
                        txn.put(_U64.pack(now_us), rec_items[0][0], db=self._times)
                    segments, touched = grown_table(
                        self._segments,
                        self.segment_size,
                        txid - len(rec_items) + 1,
                        now_us,
                        [len(value) for _, value in rec_items],
                    )
                    if self._segments_db is not None:
                        for seg in touched:
                            txn.put(_U64.pack(seg.id), seg.encode(), db=self._segments_db)
                if cursors:
                    for name, (up_txid, up_bm) in cursors.items():
                        value = _U64.pack(up_txid) + up_bm.encode()
                        txn.put(name.encode(), value, db=self._upstreams)
                if on_staged is not None:
                    on_staged()
        except lmdb.MapFullError:
            self._pub_cache.clear()
            raise JournalError(
                f"the journal is full: it reached its MapSize of {self.map_size} bytes "
                "(nothing of this batch was stored); raise TransactionLog/MapSize and "
                "restart, and remove old journals (amps-action-do-remove-journal) so "
                "their space is reused"
            ) from None
        except BaseException:
            # nothing of this batch was stored: the cached high-water marks may be ahead
            self._pub_cache.clear()
            raise
        if rec_items:
            self._segments = segments
            if encoded is not None:
                encoded.extend(value for _, value in rec_items)
            if now_us - self._last_time_entry >= TIME_INDEX_STEP_US:
                self._last_time_entry = now_us
            self._last_txid = txid
            self._commits += 1
            self._appended += len(rec_items)
        self._duplicates += len(records) - len(rec_items)
        return txids

    @staticmethod
    def _reject(rejected: dict[int, str] | None, index: int, why: str) -> int:
        if rejected is not None:
            rejected[index] = why
        return -1

    def upstream_cursor(self, upstream: str) -> tuple[int, str]:
        """``(upstream txid, bookmark)`` of the replication stream from ``upstream``
        held here, or ``(0, "")`` when nothing was ever received from it."""
        with self._env.begin(db=self._upstreams) as txn:
            raw = txn.get(upstream.encode())
        if raw is None:
            return 0, ""
        return _U64.unpack_from(raw)[0], raw[8:].decode()

    # ------------------------------------------------------------------ reading
    def _scan(
        self,
        after_txid: int,
        limit: int,
        max_txid: int | None,
        convert: Callable[[bytes, int], _T],
    ) -> tuple[list[_T], CorruptRecord | None]:
        """``convert(value, txid)`` for up to ``limit`` records after ``after_txid``
        (and <= ``max_txid``), in one short read transaction. A damaged record ends the
        scan: the results before it are returned with the error.

        Records of compressed or archived segments are read from their segment files;
        removed segments are skipped. A segment file that went away meanwhile (archived
        elsewhere, or removed) is looked up again once in a fresh transaction.
        """
        try:
            return self._scan_once(after_txid, limit, max_txid, convert)
        except SegmentFileError:
            try:
                return self._scan_once(after_txid, limit, max_txid, convert)
            except SegmentFileError as exc:
                return [], CorruptRecord(None, str(exc))

    def _scan_once(
        self,
        after_txid: int,
        limit: int,
        max_txid: int | None,
        convert: Callable[[bytes, int], _T],
    ) -> tuple[list[_T], CorruptRecord | None]:
        out: list[_T] = []
        unpack = _U64.unpack
        stop = max_txid if max_txid is not None else _U64_MAX
        after_txid = max(after_txid, self._removed_through)
        with self._env.begin(buffers=False) as txn:
            cur = txn.cursor(db=self._records)
            while len(out) < limit and after_txid < stop:
                found = cur.set_range(_U64.pack(after_txid + 1))
                next_txid = unpack(cur.key())[0] if found else None
                if next_txid != after_txid + 1:
                    # not in LMDB: in a segment file, or removed
                    seg = self._offloaded_segment_after(txn, after_txid, next_txid)
                    if seg is not None:
                        pairs = self._segment_file(seg).after(
                            after_txid, min(seg.last_txid, stop), limit - len(out)
                        )
                        for txid, value in pairs:
                            try:
                                out.append(convert(value, txid))
                            except CorruptRecord as exc:
                                return out, exc
                        after_txid = pairs[-1][0] if pairs else seg.last_txid
                        continue
                    if not found:
                        break
                for key, value in cur:
                    txid = unpack(key)[0]
                    if txid > stop:
                        break
                    try:
                        out.append(convert(value, txid))
                    except CorruptRecord as exc:
                        return out, exc
                    if len(out) >= limit:
                        break
                break
        return out, None

    def _offloaded_segment_after(
        self, txn: lmdb.Transaction, after_txid: int, next_lmdb_txid: int | None
    ) -> Segment | None:
        """The compressed or archived segment (as ``txn`` sees the table) that holds
        the first record after ``after_txid``, if that record is not in LMDB."""
        if self._segments_db is None:
            return None
        # segment boundaries never change: the in-memory table finds the segment that
        # holds after_txid + 1, and the transaction's own rows say its state from there
        known = self._segments
        i = bisect.bisect_right(known, after_txid + 1, key=lambda s: s.first_txid) - 1
        start = known[i].id if i >= 0 else 1
        cursor = txn.cursor(db=self._segments_db)
        if not cursor.set_range(_U64.pack(start)):
            return None
        for key, value in cursor:
            seg = Segment.decode(_U64.unpack(key)[0], bytes(value))
            if seg.last_txid <= after_txid or seg.state == "removed":
                continue
            if next_lmdb_txid is not None and seg.first_txid >= next_lmdb_txid:
                return None
            if seg.offloaded:
                return seg
            if seg.state == "live":
                return None
        return None

    def segment_path(self, seg: Segment) -> Path:
        """Where ``seg``'s file is: files in the journal directory are recorded by name
        (the directory can be moved or restored elsewhere), others (archived) by
        absolute path."""
        path = Path(seg.file)
        return path if path.is_absolute() else self.path / path

    def _segment_file(self, seg: Segment) -> SegmentFile:
        path = self.segment_path(seg)
        key = str(path)
        with self._files_lock:
            handle = self._files.get(key)
            if handle is None:
                handle = self._files[key] = SegmentFile(path)
            return handle

    def _forget_file(self, path: str) -> None:
        with self._files_lock:
            self._files.pop(path, None)

    def read(self, after_txid: int, limit: int, max_txid: int | None = None) -> list[Record]:
        """Return up to ``limit`` records with txid > ``after_txid`` (and <= ``max_txid``).

        Raises:
            CorruptRecord: a record in the range failed its CRC.
        """
        out, damage = self._scan(after_txid, limit, max_txid, self._codec.decode)
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
        pairs, damage = self._scan(after_txid, limit, max_txid, _stored_pair)
        stored = check_stored_records(pairs)
        if damage is not None:
            raise damage
        return stored

    def read_route_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[RouteView], CorruptRecord | None]:
        """Routing views (with the stored bytes) for replication; same damage rule as
        :meth:`read_views`."""
        return self._scan(after_txid, limit, max_txid, self._codec.route_view)

    def route_payload(self, view: RouteView) -> bytes:
        return self._codec.route_payload(view)

    def read_views(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> tuple[list[DeliveryView], CorruptRecord | None]:
        """Delivery views of up to ``limit`` records after ``after_txid`` (<= ``max_txid``).

        Replay's read: cheaper than :meth:`read`, CRC still checked. A damaged record
        ends the batch: the sound views before it are returned with the error, so
        nothing before the damage is withheld and nothing damaged is served.
        """
        return self._scan(after_txid, limit, max_txid, self._codec.view)

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
            CorruptRecord: the record failed its CRC.
        """
        if txid <= self._removed_through:
            return None
        with self._env.begin(db=self._records) as txn:
            value = txn.get(_U64.pack(txid))
        if value is not None:
            return self._codec.decode(value, txid)
        found, damage = self._scan(txid - 1, 1, txid, self._codec.decode)
        if damage is not None:
            raise damage
        return found[0] if found else None

    def first_txid(self) -> int:
        """The oldest txid still held (in LMDB or a segment file); 0 when none is."""
        found, _ = self._scan(0, 1, None, lambda _value, txid: txid)
        return found[0] if found else 0

    def lookup_bookmark(self, pub_hash: int, seq: int) -> int | None:
        """The local txid of the message with this bookmark, or None."""
        with self._env.begin(db=self._bookmarks) as txn:
            raw = txn.get(_U64x2.pack(pub_hash, seq))
        return None if raw is None else _U64.unpack(raw)[0]

    def publisher_last_seq(self, pub_hash: int) -> int:
        """The highest seq journaled for this publisher (0 if none)."""
        with self._env.begin(db=self._publishers) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        return _U64.unpack_from(raw)[0] if raw else 0

    def held_publishers(self) -> int:
        """How many publishers have records in the journal, from the bookmark index
        (one index search per publisher). Bookmarks of removed records leave the index
        as their removal is purged: until :meth:`removal_pending` is false, publishers
        whose every record was removed may still count."""
        count = 0
        with self._env.begin(db=self._bookmarks) as txn:
            cur = txn.cursor()
            found = cur.first()
            while found:
                count += 1
                pub_hash = _U64.unpack_from(cur.key())[0]
                if pub_hash == _U64_MAX:
                    break
                found = cur.set_range(_U64.pack(pub_hash + 1))
        return count

    def known_publishers(self) -> int:
        """How many publishers the journal holds a last seq for (the logon ack's
        source), including those whose records were all removed."""
        with self._env.begin() as txn:
            return int(txn.stat(self._publishers)["entries"])

    def removal_pending(self) -> bool:
        """Whether a removed segment's records or index entries are still being
        deleted (:meth:`purge_step`)."""
        return any(seg.state == "removed" and not seg.cleaned for seg in self._segments)

    def origin_high_water(self) -> dict[str, int]:
        """Per origin instance, the highest origin txid stored here (resync)."""
        with self._env.begin(db=self._origins) as txn:
            return {k.decode(): _U64.unpack(v)[0] for k, v in txn.cursor()}

    def txid_before_time(self, ts_us: int) -> int:
        """The last txid whose local timestamp is certainly before ``ts_us``.

        Uses the sparse time index, then walks forward through records: replay from
        the returned txid (exclusive) starts with the first message at or after
        ``ts_us``.
        """
        with self._env.begin(db=self._times) as txn:
            cur = txn.cursor()
            start = 0
            if cur.set_range(_U64.pack(ts_us + 1)):
                if cur.prev():
                    start = _U64.unpack(cur.value())[0] - 1
            elif cur.last():
                start = _U64.unpack(cur.value())[0] - 1
        after = max(start, 0)
        while True:
            batch = self.read(after, 1024)
            if not batch:
                return after
            for rec in batch:
                if rec.local_ts >= ts_us:
                    return rec.txid - 1
            after = batch[-1].txid

    # ------------------------------------------------------------------ tools
    def statistics(self) -> JournalStatistics:
        with self._env.begin() as txn:
            n_pubs = txn.stat(self._publishers)["entries"]
        segments = [seg for seg in self._segments if seg.state != "removed"]
        data = self.path / "data.mdb"
        return JournalStatistics(
            path=str(self.path),
            instance_name=self.instance_name,
            durability=self.durability,
            compression=self.compression,
            first_txid=self.first_txid(),
            last_txid=self._last_txid,
            records=sum(seg.records for seg in segments),
            publishers=n_pubs,
            file_bytes=data.stat().st_size if data.exists() else 0,
            commits=self._commits,
            appended=self._appended,
            duplicates=self._duplicates,
            segments=len(segments),
        )

    def verify(self, progress: Callable[[int], None] | None = None) -> list[VerifyProblem]:
        """Check every record's CRC and decoding, and that txids strictly increase.

        Returns the problems found (empty when the journal is sound); never raises
        for damaged records. ``progress``, when given, is called with the number of
        records checked so far, every few thousand records and once at the end.
        """
        problems: list[VerifyProblem] = []
        decode = self._codec.decode
        checked = 0

        def count() -> None:
            nonlocal checked
            checked += 1
            if progress is not None and checked % PROGRESS_EVERY == 0:
                progress(checked)

        for seg in self._segments:
            if not seg.offloaded:
                continue
            try:
                pairs = iter(SegmentFile(self.segment_path(seg)))
                for file_txid, file_value in pairs:
                    if not seg.first_txid <= file_txid <= seg.last_txid:
                        problems.append(
                            VerifyProblem(
                                file_txid,
                                f"outside segment {seg.id} in its file {self.segment_path(seg)}",
                            )
                        )
                        continue
                    count()
                    try:
                        decode(file_value, file_txid)
                    except CorruptRecord as exc:
                        problems.append(VerifyProblem(file_txid, exc.problem))
            except SegmentFileError as exc:
                problems.append(VerifyProblem(None, str(exc)))
        prev = 0
        for item in self._walk_records():
            if isinstance(item, VerifyProblem):
                problems.append(item)
                continue
            key, value = item
            txid = _U64.unpack(key)[0] if len(key) == 8 else None
            if txid is None:
                problems.append(VerifyProblem(None, f"bad record key {key.hex()}"))
                continue
            if txid <= prev:
                problems.append(VerifyProblem(txid, f"txid not after previous {prev}"))
            prev = txid
            if txid <= self._removed_through:
                continue  # left over from a removal still in progress
            count()
            try:
                decode(value, txid)
            except CorruptRecord as exc:
                problems.append(VerifyProblem(txid, exc.problem))
        if progress is not None:
            progress(checked)
        return problems

    def _walk_records(self) -> Iterator[tuple[bytes, bytes] | VerifyProblem]:
        """Every (key, value) of the LMDB records database in key order; a damaged
        LMDB page is reported as a :class:`VerifyProblem` naming the txids it hides,
        and the walk goes on after it.

        Each record is found by a search (``set_range`` of the next txid), not by
        LMDB's step to the next page: that step asserts, killing the process, when the
        next page is damaged, while a search reports ``MDB_CORRUPTED``. LMDB looks in
        the cursor's current page first, so a search costs little more than a step.
        """
        after: bytes | None = None
        while True:
            with self._env.begin(db=self._records, buffers=False) as txn:
                cur = txn.cursor()
                try:
                    found = cur.first() if after is None else cur.set_range(_next_key(after))
                    while found:
                        after = cur.key()
                        yield after, cur.value()
                        found = cur.set_range(_next_key(after))
                    return
                except LMDB_DAMAGE_ERRORS as exc:
                    damage = exc
            if after is not None and len(after) != 8:
                yield VerifyProblem(None, f"LMDB cannot read past key {after.hex()} ({damage})")
                return
            first = _U64.unpack(after)[0] + 1 if after is not None else 1
            resume = self._readable_from(first)
            hidden = f"txids {first} to {resume - 1}" if resume else f"txids from {first}"
            yield VerifyProblem(
                first, f"{hidden} unreadable: LMDB reports a damaged page ({damage})"
            )
            if resume is None:
                return
            after = _U64.pack(resume - 1)

    def _readable_from(self, damaged: int) -> int | None:
        """The lowest txid above ``damaged`` from which LMDB reads again (records from
        there on are on sound pages), or None when nothing after it reads. Each probe
        runs in its own read transaction (an LMDB error spoils the one it happens in)."""

        def reads(txid: int) -> bool:
            with self._env.begin(db=self._records) as txn:
                try:
                    txn.cursor().set_range(_U64.pack(txid))
                except LMDB_DAMAGE_ERRORS:
                    return False
                return True

        lo, hi = damaged, max(self._last_txid, damaged) + 1  # lo does not read
        if not reads(hi):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if reads(mid):
                hi = mid
            else:
                lo = mid
        return hi

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

    def publisher_floor(self, pub_hash: int) -> int:
        """The highest seq of this publisher among removed records (0 if none): a
        bookmark at or below it is older than what the journal keeps."""
        if self._floors_db is None:
            return 0
        with self._env.begin(db=self._floors_db) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        return unpack_u64(bytes(raw)) if raw else 0
