"""Export a journal to Parquet, incrementally (plain Python + pyarrow: no Spark, no
Java, so it runs on the server host beside a running instance).

The layout of the export directory and how topic names are encoded in it is in
:mod:`.export_layout`. Files hold the columns of :data:`.schema.ARROW_SCHEMA` (one row
per record, in txid order), zstd-compressed; ``topic`` and ``date`` are also the
partition directories.

Contract:

- **Complete, no duplicates.** A run exports every record of the journal after the
  last txid the cumulative manifest says was exported, up to the journal's newest
  txid when the run started; each record is in exactly one file. Records a later
  commit of the instance adds are left for the next run.
- **Incremental.** The next run starts after the manifest's ``last_txid``. Several
  instances' journals can share one export directory: files and manifests are named
  by instance, and each instance has its own lock.
- **Crash-safe.** Records are committed in batches: each batch's files are written
  under hidden temporary names, flushed to disk and renamed, then the cumulative
  manifest (written the same way) moves ``last_txid`` forward. A run killed at any
  point leaves no partly written file a reader picks up; the next run first deletes
  what the killed run wrote after the manifest's ``last_txid`` and exports it again.
- **Read-only on the journal.** The journal is opened read-only: safe while its
  instance runs.
- **Damage is never skipped.** A record that fails its CRC stops the run with
  :class:`ExportDamaged` naming its txid; everything before it is committed, so the
  manifest stands at the last good record.
- **Checkable.** The manifest lists every file with its row count, the SHA-256 of its
  bytes and of its rows (``rows_sha256``: SHA-256 of the txid column as little-endian
  int64 values in row order, then the bookmarks' UTF-8 bytes concatenated in row
  order); ``rows_checksum`` is those row checksums summed modulo 2**256.
  :func:`verify_export` re-reads everything and checks it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txlog import CorruptRecord, Journal, Record

from .export_layout import (
    CUMULATIVE_MANIFEST,
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_ROWS,
    EXPORT_FORMAT,
    LOCK_FILE,
    MANIFEST_DIR,
    ZERO_CHECKSUM,
    TopicTooLong,
    add_checksums,
    date_directory,
    decode_name,
    manifest_directory,
    parse_part_name,
    part_name,
    run_manifest_name,
    temporary_name,
    topic_directory,
)
from .schema import ARROW_SCHEMA, records_to_batch

if TYPE_CHECKING:
    import pyarrow.dataset as ds

#: records read from the journal per read transaction
READ_CHUNK = 8192
_I32 = struct.Struct("<i")
#: ``progress(done, total)``: records exported so far in this run, and in all
ProgressCallback = Callable[[int, int], None]


class ExportError(Exception):
    """The export cannot run or go on as asked; the message says what to do."""


class ExportDamaged(ExportError):
    """A damaged journal record stopped the export. Everything before it is exported
    and in the manifest (``exported_through``)."""

    def __init__(self, message: str, txid: int | None, exported_through: int) -> None:
        super().__init__(message)
        self.txid = txid
        self.exported_through = exported_through


@dataclass(frozen=True)
class ExportedFile:
    """One Parquet file of an export, as its manifest lists it."""

    path: str  #: relative to the export directory, ``/``-separated
    topic: str
    date: str  #: ``YYYY-MM-DD``
    rows: int
    first_txid: int
    last_txid: int
    bytes: int
    sha256: str  #: of the file's bytes
    rows_sha256: str  #: of its txids and bookmarks (see the module docstring)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ExportedFile:
        return cls(**{name: doc[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ExportResult:
    """What one :func:`export_journal` run did."""

    instance: str
    journal: str
    out_dir: str
    #: the run exported the records after this txid ...
    after_txid: int
    #: ... through this one (== ``after_txid`` when there was nothing new)
    through_txid: int
    #: the journal's newest txid when the run started (where it stopped reading)
    stop_txid: int
    rows: int
    files: tuple[ExportedFile, ...]
    seconds: float
    #: this run's manifest (relative to the export directory); "" when nothing new
    run_manifest: str
    #: txids that were removed from the journal before any run exported them
    removed_before_export: tuple[int, int] | None = None
    #: files an interrupted run left behind, deleted before this run exported
    cleaned: tuple[str, ...] = ()

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for a terminal or a log."""
        if not self.rows:
            return (
                f"nothing new to export for instance {self.instance} (exported through "
                f"txid {self.through_txid})"
            )
        return (
            f"exported {self.rows:,} records of instance {self.instance} (txids "
            f"{self.after_txid + 1}..{self.through_txid}) into {self.out_dir}: "
            f"{len(self.files)} file(s), {self.seconds:.1f} s, "
            f"{self.rows_per_second:,.0f} records/s"
        )


# ---------------------------------------------------------------------- manifest
@dataclass
class Manifest:
    """The cumulative manifest of one instance's export (``export.json``)."""

    instance: str
    journal: str = ""
    first_txid: int = 0
    last_txid: int = 0
    last_bookmark: str = ""
    rows: int = 0
    rows_checksum: str = ZERO_CHECKSUM
    files: list[ExportedFile] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    removed_before_export: list[list[int]] = field(default_factory=list)
    shortened_topics: dict[str, str] = field(default_factory=dict)
    updated: str = ""

    def to_json(self) -> dict[str, Any]:
        doc = {"format": EXPORT_FORMAT, **asdict(self)}
        return doc

    @classmethod
    def load(cls, path: Path, instance: str) -> Manifest:
        """The manifest in ``path``, or an empty one when there is none yet.

        Raises:
            ExportError: the file is unreadable or of another format or instance.
        """
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(instance)
        except (OSError, ValueError) as exc:
            raise ExportError(
                f"export manifest {path} cannot be read ({exc}); restore it, or export "
                "into a new directory"
            ) from None
        if doc.get("format") != EXPORT_FORMAT or doc.get("instance") != instance:
            raise ExportError(
                f"{path} is not an {EXPORT_FORMAT} manifest of instance {instance!r} "
                f"(format {doc.get('format')!r}, instance {doc.get('instance')!r}); export "
                "into a new directory"
            )
        doc.pop("format")
        doc["files"] = [ExportedFile.from_json(f) for f in doc["files"]]
        return cls(**doc)


def _now_iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds")


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` in ``path``: written to a hidden temporary file, flushed to disk, renamed
    over ``path``, and the directory flushed, so ``path`` is always whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _instance_lock(directory: Path, instance: str) -> Iterator[None]:
    """Hold the lock that makes one export of ``instance`` into the directory run at
    a time.

    Raises:
        ExportError: another export of the instance holds it.
    """
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ExportError(
                f"another export of instance {instance!r} into {directory.parent.parent} "
                f"is running (process {holder}); wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- checksums
def rows_sha256(table: pa.Table) -> str:
    """SHA-256 of ``table``'s txids (little-endian int64, in row order) followed by its
    bookmarks' UTF-8 bytes concatenated in row order."""
    digest = hashlib.sha256()
    for chunk in table.column("txid").chunks:
        data = chunk.buffers()[1]
        digest.update(memoryview(data)[chunk.offset * 8 : (chunk.offset + len(chunk)) * 8])
    for chunk in table.column("bookmark").chunks:
        if not len(chunk):
            continue
        _, offsets, data = chunk.buffers()
        start = _I32.unpack_from(offsets, chunk.offset * 4)[0]
        end = _I32.unpack_from(offsets, (chunk.offset + len(chunk)) * 4)[0]
        digest.update(memoryview(data)[start:end])
    return digest.hexdigest()


# ---------------------------------------------------------------------- the run
class _Run:
    """One export run: reads the journal after the manifest's last txid, commits
    batches of files, and keeps the manifest in step."""

    def __init__(
        self,
        journal: Journal,
        out: Path,
        instance: str,
        manifest_dir: Path,
        manifest: Manifest,
        *,
        batch_rows: int,
        batch_bytes: int,
        shorten_long_topics: bool,
        progress: ProgressCallback | None,
    ) -> None:
        self.journal = journal
        self.out = out
        self.instance = instance
        self.manifest_dir = manifest_dir
        self.manifest = manifest
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.shorten = shorten_long_topics
        self.progress = progress
        self.started_unix = time.time()
        self.started = time.monotonic()
        self.after_txid = manifest.last_txid
        self.stop_txid = journal.last_txid
        self.files: list[ExportedFile] = []
        self.rows = 0
        self.rows_checksum = ZERO_CHECKSUM
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.pending_last: Record | None = None
        self.removed_before_export: tuple[int, int] | None = None
        self.stopped = ""
        self.run_entry: dict[str, Any] = {}

    # -- reading
    def export(self) -> None:
        """Read and commit every record after :attr:`after_txid` up to
        :attr:`stop_txid`.

        Raises:
            ExportDamaged: a damaged record (what came before it is committed).
        """
        self._check_same_journal()
        after = self.after_txid
        first = self.journal.first_txid()
        if first > after + 1 and self.after_txid > 0:
            self.removed_before_export = (after + 1, first - 1)
            self.manifest.removed_before_export.append([after + 1, first - 1])
        total = max(0, self.stop_txid - max(after, first - 1))
        self._report(total)
        while after < self.stop_txid:
            try:
                records = self.journal.read(after, READ_CHUNK, self.stop_txid)
            except CorruptRecord as exc:
                self._stop_at_damage(after, exc)
            if not records:
                break
            self._add(records)
            after = records[-1].txid
            if self.pending_rows >= self.batch_rows or self.pending_bytes >= self.batch_bytes:
                self._commit()
            self._report(total)
        self._commit()
        self._report(total)

    def _report(self, total: int) -> None:
        if self.progress is not None:
            self.progress(self.rows + self.pending_rows, total)

    def _check_same_journal(self) -> None:
        m = self.manifest
        if not m.last_txid:
            return
        if self.stop_txid < m.last_txid:
            raise ExportError(
                f"{self.out} holds instance {self.instance!r}'s records through txid "
                f"{m.last_txid}, but journal {self.journal.path} ends at txid "
                f"{self.stop_txid}: it is another (or a restored) journal of that name; "
                "export it into a new directory"
            )
        try:
            rec = self.journal.get(m.last_txid)
        except CorruptRecord:
            rec = None  # its damage is not this run's business: it was exported
        if rec is not None and m.last_bookmark and rec.bookmark != m.last_bookmark:
            raise ExportError(
                f"{self.out} holds txid {m.last_txid} of instance {self.instance!r} as "
                f"bookmark {m.last_bookmark}, but journal {self.journal.path} holds "
                f"{rec.bookmark} there: it is another journal of that name; export it into "
                "a new directory"
            )

    def _stop_at_damage(self, after: int, exc: CorruptRecord) -> NoReturn:
        txid = exc.txid
        if txid is not None and txid > after + 1:
            self._add(self.journal.read(after, txid - after - 1, self.stop_txid))
        self._commit()
        through = self.manifest.last_txid
        where = f"record txid {txid}" if txid is not None else f"the record after txid {through}"
        self.stopped = f"damaged record: {exc}"
        self._finish()
        raise ExportDamaged(
            f"journal {self.journal.path}: {where} is damaged ({exc}); the export of "
            f"instance {self.instance!r} stopped there and holds every record through "
            f"txid {through}. Fix: amps-py txlog verify {self.journal.path} lists the "
            "damage; restore the journal (or its instance's replica) and export again",
            txid,
            through,
        ) from exc

    def _add(self, records: list[Record]) -> None:
        if not records:
            return
        batch = records_to_batch(self.instance, records)
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.column(ARROW_SCHEMA.get_field_index("payload")).nbytes
        self.pending_last = records[-1]

    # -- writing
    def _commit(self) -> None:
        """Write the pending records' files and move the manifest past them."""
        if not self.pending:
            return
        table = pa.Table.from_batches(self.pending, ARROW_SCHEMA)
        last = self.pending_last
        assert last is not None
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0
        written = [self._write(part, topic, day) for part, topic, day in _partitions(table)]
        dirs = {self.out / Path(f.path).parent for f in written}
        for d in sorted(dirs):
            _fsync_directory(d)
        m = self.manifest
        m.files.extend(written)
        m.first_txid = m.first_txid or min(f.first_txid for f in written)
        m.last_txid = last.txid
        m.last_bookmark = last.bookmark
        m.journal = str(self.journal.path.resolve())
        self.files.extend(written)
        for f in written:
            m.rows += f.rows
            self.rows += f.rows
            m.rows_checksum = add_checksums(m.rows_checksum, f.rows_sha256)
            self.rows_checksum = add_checksums(self.rows_checksum, f.rows_sha256)
        self._save_manifest(finished=False)

    def _write(self, part: pa.Table, topic: str, day: str) -> ExportedFile:
        try:
            topic_dir = topic_directory(topic, shorten=self.shorten)
        except TopicTooLong as exc:
            txid = part.column("txid")[0].as_py()
            raise ExportError(f"txid {txid}: {exc}") from None
        if "~" in topic_dir:  # a full name has its "~" encoded: this one is shortened
            self.manifest.shortened_topics[decode_name(topic_dir[6:])] = topic
        directory = self.out / topic_dir / date_directory(day)
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if created:
            _fsync_directory(directory.parent)
            _fsync_directory(self.out)
        txids = part.column("txid")
        first, last = txids[0].as_py(), txids[-1].as_py()
        name = part_name(self.instance, first, last)
        sink = pa.BufferOutputStream()
        pq.write_table(part, sink, compression="zstd")
        data = sink.getvalue()
        tmp = directory / temporary_name(name)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / name)
        return ExportedFile(
            path=f"{topic_dir}/{date_directory(day)}/{name}",
            topic=topic,
            date=day,
            rows=part.num_rows,
            first_txid=first,
            last_txid=last,
            bytes=data.size,
            sha256=hashlib.sha256(data).hexdigest(),
            rows_sha256=rows_sha256(part),
        )

    def _save_manifest(self, *, finished: bool) -> None:
        now = time.time()
        entry = self.run_entry
        if not entry:
            self.manifest.runs.append(entry)
        entry.update(
            started=_now_iso(self.started_unix),
            finished=_now_iso(now) if finished else None,
            journal=str(self.journal.path.resolve()),
            after_txid=self.after_txid,
            through_txid=self.manifest.last_txid,
            stop_txid=self.stop_txid,
            rows=self.rows,
            files=len(self.files),
            seconds=round(time.monotonic() - self.started, 3),
            stopped=self.stopped or None,
        )
        self.manifest.updated = _now_iso(now)
        _write_atomically(
            self.manifest_dir / CUMULATIVE_MANIFEST,
            json.dumps(self.manifest.to_json(), indent=1).encode(),
        )

    def _finish(self) -> str:
        """Write this run's manifest, then the cumulative one (marking the run
        finished). Returns the run manifest's path relative to the export directory,
        or "" when the run exported nothing (and wrote nothing)."""
        if not self.rows and not self.stopped:
            return ""
        name = run_manifest_name(self.started_unix, self.after_txid + 1, self.manifest.last_txid)
        self.run_entry["run"] = name
        doc = {
            "format": EXPORT_FORMAT,
            "instance": self.instance,
            "journal": str(self.journal.path.resolve()),
            "started": _now_iso(self.started_unix),
            "finished": _now_iso(time.time()),
            "seconds": round(time.monotonic() - self.started, 3),
            "after_txid": self.after_txid,
            "through_txid": self.manifest.last_txid,
            "stop_txid": self.stop_txid,
            "rows": self.rows,
            "rows_checksum": self.rows_checksum,
            "files": [asdict(f) for f in self.files],
            "removed_before_export": self.removed_before_export,
            "stopped": self.stopped or None,
        }
        _write_atomically(self.manifest_dir / name, json.dumps(doc, indent=1).encode())
        self._save_manifest(finished=True)
        return f"{MANIFEST_DIR}/{self.manifest_dir.name}/{name}"


def _partitions(table: pa.Table) -> Iterator[tuple[pa.Table, str, str]]:
    """``table``'s rows grouped by (topic, UTC date of local_ts), each group in its
    original (txid) order: ``(rows, topic, 'YYYY-MM-DD')``."""
    days = pc.cast(table.column("local_ts"), pa.date32())
    keys = pa.table({"topic": table.column("topic"), "day": days})
    order = pc.sort_indices(keys, [("topic", "ascending"), ("day", "ascending")])
    table = table.take(order)
    keys = keys.take(order)
    topics, days = keys.column("topic"), keys.column("day")
    n = table.num_rows
    change = pc.or_(
        pc.not_equal(topics.slice(1), topics.slice(0, n - 1)),
        pc.not_equal(days.slice(1), days.slice(0, n - 1)),
    )
    starts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    for start, end in itertools.pairwise(starts):
        yield (
            table.slice(start, end - start),
            topics[start].as_py(),
            days[start].as_py().isoformat(),
        )


def _clean_interrupted(out: Path, instance: str, through: int) -> list[str]:
    """Delete what an interrupted run of ``instance`` left: temporary files, and files
    after txid ``through`` (written, but never committed to the manifest). Returns
    their paths relative to ``out``."""
    cleaned: list[str] = []
    for topic_dir in _subdirectories(out, "topic="):
        for day_dir in _subdirectories(topic_dir, "date="):
            before = len(cleaned)
            for entry in os.scandir(day_dir):
                part = parse_part_name(entry.name)
                if part is None or part.instance != instance:
                    continue
                if part.temporary or part.first_txid > through:
                    os.unlink(entry.path)
                    cleaned.append(str(Path(entry.path).relative_to(out)))
            if len(cleaned) > before:
                _fsync_directory(day_dir)
    return cleaned


def _subdirectories(path: Path, prefix: str) -> list[Path]:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.name.startswith(prefix) and e.is_dir()]


def export_journal(
    journal_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    instance: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    shorten_long_topics: bool = False,
    progress: ProgressCallback | None = None,
) -> ExportResult:
    """Export the records of the journal in ``journal_path`` that ``out_dir`` does not
    hold yet to Parquet files in ``out_dir`` (see the module docstring for what is
    promised).

    Args:
        journal_path: the instance's ``TransactionLog/JournalDirectory``; opened
            read-only (the instance may be running).
        out_dir: the export directory (created if missing); may hold other
            instances' exports.
        instance: the name files and manifests are kept under; default: the name
            the journal records.
        batch_rows: records per commit; each commit writes one file per topic and
            date among its records, so larger batches mean fewer, larger files.
        batch_bytes: payload bytes per commit (whichever limit comes first).
        shorten_long_topics: export a topic too long for a directory name under a
            shortened one (:mod:`.export_layout`) instead of stopping.
        progress: called with (records done, records to do) as the run goes.

    Raises:
        ExportDamaged: a damaged record stopped the run (what came before it is
            exported and in the manifest).
        ExportError: the export cannot run (another export of the instance is
            running, the directory holds another journal's export, a topic is too
            long for a directory name, a damaged manifest).
        txlog.JournalError: the journal cannot be opened.
    """
    if batch_rows < 1 or batch_bytes < 1:
        raise ExportError("batch_rows and batch_bytes must be at least 1")
    out = Path(out_dir)
    with Journal(journal_path, readonly=True) as journal:
        if journal.damage is not None:
            raise journal.damage
        name = instance or journal.instance_name
        if not name:
            raise ExportError(
                f"journal {journal_path} records no instance name; name it with --instance "
                "NAME (the name its files and manifest are kept under)"
            )
        manifest_dir = out / manifest_directory(name)
        manifest_dir.mkdir(parents=True, exist_ok=True)
        with _instance_lock(manifest_dir, name):
            manifest = Manifest.load(manifest_dir / CUMULATIVE_MANIFEST, name)
            cleaned = _clean_interrupted(out, name, manifest.last_txid)
            run = _Run(
                journal,
                out,
                name,
                manifest_dir,
                manifest,
                batch_rows=batch_rows,
                batch_bytes=batch_bytes,
                shorten_long_topics=shorten_long_topics,
                progress=progress,
            )
            run.export()
            run_manifest = run._finish()
            return ExportResult(
                instance=name,
                journal=str(journal.path),
                out_dir=str(out),
                after_txid=run.after_txid,
                through_txid=manifest.last_txid,
                stop_txid=run.stop_txid,
                rows=run.rows,
                files=tuple(run.files),
                seconds=time.monotonic() - run.started,
                run_manifest=run_manifest,
                removed_before_export=run.removed_before_export,
                cleaned=tuple(cleaned),
            )


# ---------------------------------------------------------------------- reading back
def exported_dataset(out_dir: str | os.PathLike[str]) -> ds.Dataset:
    """Every exported file in ``out_dir`` as one pyarrow dataset: the schema's columns,
    ``topic`` decoded from its directory (the same as the column) and ``date`` as a
    date. Manifests and unfinished files are not part of it."""
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(
        pa.schema([("topic", pa.string()), ("date", pa.date32())]), flavor="hive"
    )
    return ds.dataset(out_dir, format="parquet", partitioning=partitioning)


def verify_export(out_dir: str | os.PathLike[str], instance: str | None = None) -> list[str]:
    """Re-read the export of ``instance`` (default: every instance) in ``out_dir`` and
    check it against its manifest. Returns the problems found, each naming the file
    and what is wrong; empty when the export is whole.

    Checks: every file listed is there with its size and SHA-256; its rows, txid range
    and row checksum match; its rows are of that instance, topic and date; no txid is
    in two files; the row checksums add up to the manifest's; and no data file of the
    instance is missing from the manifest (a reader would count its rows twice).
    """
    out = Path(out_dir)
    base = out / MANIFEST_DIR
    if instance is not None:
        names = [manifest_directory(instance).split("/", 1)[1]]
    else:
        names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    if not names:
        return [f"{out} holds no export manifest (in {MANIFEST_DIR}/)"]
    problems: list[str] = []
    for encoded in names:
        problems += _verify_instance(out, decode_name(encoded))
    return problems


def _verify_instance(out: Path, instance: str) -> list[str]:
    path = out / manifest_directory(instance) / CUMULATIVE_MANIFEST
    if not path.exists():
        return [f"{path}: no manifest of instance {instance!r}"]
    try:
        manifest = Manifest.load(path, instance)
    except ExportError as exc:
        return [str(exc)]
    problems: list[str] = []
    seen: set[int] = set()
    rows = 0
    checksum = ZERO_CHECKSUM
    for f in manifest.files:
        problems += _verify_file(out, instance, f, seen)
        rows += f.rows
        checksum = add_checksums(checksum, f.rows_sha256)
    if rows != manifest.rows:
        problems.append(f"{path}: files hold {rows} rows, the manifest says {manifest.rows}")
    if checksum != manifest.rows_checksum:
        problems.append(f"{path}: the files' row checksums do not add up to rows_checksum")
    listed = {f.path for f in manifest.files}
    for stray in _instance_files(out, instance):
        if stray not in listed:
            problems.append(
                f"{stray}: a file of instance {instance!r} that the manifest does not list "
                "(left by an interrupted export, or copied in); the next export of the "
                "instance deletes one it left, else remove it: readers count its rows too"
            )
    return problems


def _verify_file(out: Path, instance: str, f: ExportedFile, seen: set[int]) -> list[str]:
    file = out / f.path
    try:
        data = file.read_bytes()
    except OSError as exc:
        return [f"{f.path}: cannot be read ({exc.strerror or exc})"]
    if len(data) != f.bytes or hashlib.sha256(data).hexdigest() != f.sha256:
        return [f"{f.path}: its bytes are not what was written (size or SHA-256 differs)"]
    table = pq.read_table(pa.BufferReader(data))
    problems: list[str] = []
    txids = table.column("txid").to_pylist()
    if len(txids) != f.rows or rows_sha256(table) != f.rows_sha256:
        problems.append(f"{f.path}: its rows are not those the manifest lists")
    if txids and (txids[0] != f.first_txid or txids[-1] != f.last_txid):
        problems.append(f"{f.path}: its txids are not {f.first_txid}..{f.last_txid}")
    if any(b <= a for a, b in itertools.pairwise(txids)):
        problems.append(f"{f.path}: its txids are not in increasing order")
    twice = seen.intersection(txids)
    if twice:
        problems.append(f"{f.path}: txid(s) {sorted(twice)[:5]} are also in another file")
    seen.update(txids)
    for column, expected in (("instance", instance), ("topic", f.topic)):
        if set(table.column(column).to_pylist()) - {expected}:
            problems.append(f"{f.path}: a row's {column} is not {expected!r}")
    days = pc.cast(table.column("local_ts"), pa.date32()).to_pylist()
    if {d.isoformat() for d in days} - {f.date}:
        problems.append(f"{f.path}: a row's local_ts is not on {f.date}")
    return problems


def _instance_files(out: Path, instance: str) -> Iterator[str]:
    """The data files (not temporary ones) of ``instance`` in ``out``."""
    for topic_dir in _subdirectories(out, "topic="):
        for day_dir in _subdirectories(topic_dir, "date="):
            for entry in os.scandir(day_dir):
                part = parse_part_name(entry.name)
                if part is not None and part.instance == instance and not part.temporary:
                    yield str(Path(entry.path).relative_to(out))
