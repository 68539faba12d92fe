"""Export a journal to Parquet, incrementally (plain Python + pyarrow: no Spark, no
Java, so it runs on the server host beside a running instance).

The export directory's layout is in :mod:`.export_layout`; the manifests in
:mod:`.export_manifest`; reading an export back and checking it in
:mod:`.export_verify`. Each commit is one file holding the columns of
:data:`.schema.ARROW_SCHEMA` (one row per record, ordered by topic and txid, a row
group per topic), zstd-compressed, in the partition directory ``date=...`` (the UTC
date of ``local_ts``; no column of the files).

Contract:

- **Complete, no duplicates.** A run exports every record of the journal after the
  last txid the cumulative manifest says was exported, up to the journal's newest
  txid when the run started; each record is in exactly one file. Records the
  instance adds meanwhile are left for the next run.
- **Incremental.** The next run starts after the manifest's ``last_txid``. Several
  instances' journals can share one export directory: files and manifests are named
  by instance, and each instance has its own lock.
- **Crash-safe, and readers never run ahead of the manifest.** Records are
  committed in batches of consecutive txids on one UTC date: a batch's file is
  written under a hidden temporary name and flushed to disk; the cumulative manifest
  (written the same way) then lists it and moves ``last_txid`` past it; only then is
  the file published (renamed to the name listed). So a reader of the directory
  never sees a row the manifest does not list, and a run killed at any point leaves
  no partly written file a reader picks up. The next run first settles what a killed
  run left: it publishes a file the manifest lists (checked against its SHA-256) and
  deletes any other, whose records it then exports again.
- **Read-only on the journal**: safe while its instance runs.
- **Damage is never skipped.** A record that fails its CRC stops the run with
  :class:`ExportDamaged` naming its txid; everything before it is committed, so the
  manifest stands at the last good record.
- **Checkable.** The manifest lists every file with its row count and checksums
  (:mod:`.export_manifest`); :func:`.export_verify.verify_export` re-reads and checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txlog import CorruptRecord, Journal, UnreadableRecords

from .decode import stored_to_batch
from .export_layout import (
    CUMULATIVE_MANIFEST,
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_ROWS,
    EXPORT_FORMAT,
    MANIFEST_DIR,
    OLD_LAYOUT_FIX,
    OLD_TOPIC_PREFIX,
    ZERO_CHECKSUM,
    add_checksums,
    manifest_directory,
    part_path,
    run_manifest_name,
    temporary_name,
)
from .export_manifest import (
    ExportedFile,
    ExportError,
    Manifest,
    OldExportLayout,
    fsync_directory,
    instance_lock,
    iso_time,
    rows_sha256,
    write_atomically,
)
from .export_verify import exported_dataset, instance_files, subdirectories, verify_export
from .schema import ARROW_SCHEMA, RecordTooLarge

__all__ = [
    "ExportDamaged",
    "ExportError",
    "ExportResult",
    "ExportedFile",
    "OldExportLayout",
    "export_journal",
    "exported_dataset",
    "verify_export",
]

#: records read from the journal per read transaction
READ_CHUNK: Final = 8192
DAY_US: Final = 86_400_000_000
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
#: ``progress(done, total)``: records this run has read, and has to read
ProgressCallback = Callable[[int, int], None]
_PAYLOAD: Final = ARROW_SCHEMA.get_field_index("payload")
_TXID: Final = ARROW_SCHEMA.get_field_index("txid")
_BOOKMARK: Final = ARROW_SCHEMA.get_field_index("bookmark")
_LOCAL_TS: Final = ARROW_SCHEMA.get_field_index("local_ts")


class ExportDamaged(ExportError):
    """A damaged journal record stopped the export. Everything before it is exported
    and in the manifest (``exported_through``)."""

    def __init__(self, message: str, txid: int | None, exported_through: int) -> None:
        super().__init__(message)
        self.txid = txid
        self.exported_through = exported_through


@dataclass(frozen=True)
class ExportResult:
    """What one :func:`export_journal` run did."""

    instance: str
    journal: str
    out_dir: str
    #: the run exported the records after this txid ...
    after_txid: int
    #: ... through this one (``after_txid`` when there was nothing new)
    through_txid: int
    #: the journal's newest txid when the run started (where it stopped reading)
    stop_txid: int
    rows: int
    files: tuple[ExportedFile, ...]
    seconds: float
    #: this run's manifest (relative to the export directory); "" when nothing new
    run_manifest: str
    #: txids the journal had removed before any run exported them
    removed_before_export: tuple[int, int] | None = None
    #: files a killed run left behind, deleted before this run exported (relative)
    cleaned: tuple[str, ...] = ()
    #: files a killed run committed and had not published yet, published by this run
    published: tuple[str, ...] = ()

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


@dataclass(frozen=True)
class _Last:
    """The newest record read: where the manifest moves to once it is committed."""

    txid: int
    bookmark: str


class _Pending:
    """Records read and not yet committed: consecutive txids, all on one UTC date."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.day = 0  #: days since 1970-01-01 (UTC) of their local_ts
        self.rows = 0
        self.bytes = 0
        self.last: _Last | None = None

    def add(self, day: int, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (records in txid order, after those added before, all on
        ``day``)."""
        if not batch.num_rows:
            return
        self.batches.append(batch)
        self.day = day
        self.rows += batch.num_rows
        self.bytes += batch.column(_PAYLOAD).nbytes
        end = batch.num_rows - 1
        self.last = _Last(batch.column(_TXID)[end].as_py(), batch.column(_BOOKMARK)[end].as_py())

    def take(self) -> tuple[str, list[pa.RecordBatch], _Last | None]:
        """The pending records' date (``YYYY-MM-DD``), their batches and the last
        record; empties the buffer."""
        day = date.fromordinal(_EPOCH_ORDINAL + self.day).isoformat()
        batches, last = self.batches, self.last
        self.batches = []
        self.rows = self.bytes = 0
        self.last = None
        return day, batches, last


def _by_day(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``batch``'s rows in runs of consecutive rows on one UTC date (days since
    1970-01-01 of ``local_ts``), in the batch's order."""
    days = pc.cast(pc.cast(batch.column(_LOCAL_TS), pa.date32()), pa.int32())
    low, high = pc.min_max(days).values()
    if low == high:
        yield low.as_py(), batch
        return
    n = batch.num_rows
    change = pc.not_equal(days.slice(1), days.slice(0, n - 1))
    starts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    for start, end in itertools.pairwise(starts):
        yield days[start].as_py(), batch.slice(start, end - start)


@dataclass(frozen=True)
class _Encoded:
    """One commit's records as a Parquet file's bytes, and what the manifest says of
    them."""

    data: pa.Buffer
    rows: int
    topics: int
    first_txid: int
    rows_sha256: str


def _encode(batches: list[pa.RecordBatch]) -> _Encoded:
    """The records as one Parquet file (zstd), ordered by topic, then txid, a row group
    (or more) per topic. Rows are copied one topic at a time, so a commit needs little
    more memory than its records."""
    table = pa.Table.from_batches(batches, ARROW_SCHEMA)
    order = pc.sort_indices(
        table.select(["topic", "txid"]), [("topic", "ascending"), ("txid", "ascending")]
    )
    keys = table.select(["topic", "txid", "bookmark"]).take(order).combine_chunks()
    topics = keys.column("topic")
    n = keys.num_rows
    change = pc.not_equal(topics.slice(1), topics.slice(0, n - 1))
    starts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, ARROW_SCHEMA, compression="zstd") as writer:
        for start, end in itertools.pairwise(starts):
            writer.write_table(table.take(order.slice(start, end - start)))
    return _Encoded(
        data=sink.getvalue(),
        rows=n,
        topics=len(starts) - 1,
        first_txid=pc.min(keys.column("txid")).as_py(),
        rows_sha256=rows_sha256(keys),
    )


class _Run:
    """One export run: reads the journal after the manifest's last txid while a writer
    thread commits the previous batch (Parquet encoding, compression and file writes
    let go of the GIL), and keeps the manifest in step."""

    def __init__(
        self,
        journal: Journal,
        out: Path,
        instance: str,
        manifest: Manifest,
        *,
        batch_rows: int,
        batch_bytes: int,
        progress: ProgressCallback | None,
    ) -> None:
        self.journal = journal
        self.out = out
        self.instance = instance
        self.manifest_dir = out / manifest_directory(instance)
        self.manifest = manifest
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.progress = progress
        self.started_unix = time.time()
        self.started = time.monotonic()
        self.after_txid = manifest.last_txid
        self.stop_txid = journal.last_txid
        self.pending = _Pending()
        self.read_rows = 0
        self.files: list[ExportedFile] = []
        self.rows = 0
        self.rows_checksum = ZERO_CHECKSUM
        self.removed_before_export: tuple[int, int] | None = None
        self.stopped = ""
        self.run_entry: dict[str, Any] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="export-writer")
        self._writing: Future[None] | None = None

    # -- reading
    def export(self) -> None:
        """Read and commit every record after :attr:`after_txid` up to
        :attr:`stop_txid`; on return everything is committed.

        Raises:
            ExportDamaged: a damaged record (what came before it is committed).
        """
        try:
            self._export()
        finally:
            self._writer.shutdown(wait=True)  # a commit under way ends before we leave

    def _export(self) -> None:
        self._check_same_journal()
        after = self.after_txid
        first = self.journal.first_txid()
        if first > after + 1 and after > 0:
            self.removed_before_export = (after + 1, first - 1)
            self.manifest.removed_before_export.append([after + 1, first - 1])
        total = max(0, self.stop_txid - max(after, first - 1))
        self._report(total)
        while after < self.stop_txid:
            try:
                want = min(READ_CHUNK, self.batch_rows - self.pending.rows)
                batch = self._read(after, want)
            except CorruptRecord as exc:
                self._stop_at_damage(after, exc)
            if not batch.num_rows:
                break
            self._add(batch)
            self.read_rows += batch.num_rows
            after = batch.column(_TXID)[batch.num_rows - 1].as_py()
            if self.pending.rows >= self.batch_rows or self.pending.bytes >= self.batch_bytes:
                self._commit_pending()
            self._report(total)
        self._commit_pending()
        self._wait_for_writer()

    def _add(self, batch: pa.RecordBatch) -> None:
        """Add ``batch`` to the pending records, committing those pending first where
        the date changes (a commit's records are all on one date)."""
        for day, rows in _by_day(batch):
            if self.pending.rows and self.pending.day != day:
                self._commit_pending()
            self.pending.add(day, rows)

    def _read(self, after: int, limit: int) -> pa.RecordBatch:
        """Up to ``limit`` records after txid ``after`` (and up to :attr:`stop_txid`)
        as one Arrow batch.

        Raises:
            CorruptRecord: a record among them is damaged.
        """
        stored = self.journal.read_stored(after, limit, self.stop_txid)
        try:
            return stored_to_batch(self.instance, stored)
        except RecordTooLarge as exc:
            raise ExportError(
                f"journal {self.journal.path}: {exc}, so the export stops before it "
                f"(exported through txid {self.manifest.last_txid}); the publisher sent a "
                "seq above what Parquet's and Spark's signed long holds"
            ) from None

    def _report(self, total: int) -> None:
        if self.progress is not None:
            self.progress(self.read_rows, total)

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
            rec = None  # damaged after it was exported: not this run's records
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
            self._add(self._read(after, txid - after - 1))
        self._commit_pending()
        self._wait_for_writer()
        through = self.manifest.last_txid
        if isinstance(exc, UnreadableRecords):  # a damaged LMDB page: a range
            where, verb = exc.what, "are"
            self.stopped = f"unreadable records, {exc.what}: {exc}"
        else:
            where = f"record txid {txid}"
            if txid is None:
                where = f"the record after txid {through}"
            verb = "is"
            self.stopped = f"damaged record at txid {txid}: {exc}"
        self.finish()
        raise ExportDamaged(
            f"journal {self.journal.path}: {where} {verb} damaged ({exc}); the export of "
            f"instance {self.instance!r} stopped there and holds every record through "
            f"txid {through}. Fix: `amps-py txlog verify {self.journal.path}` lists the "
            "damage; restore the journal (or copy it from a replica) and export again",
            txid,
            through,
        ) from exc

    # -- writing (on the writer thread, one commit at a time, in order)
    def _commit_pending(self) -> None:
        day, batches, last = self.pending.take()
        if last is None:
            return
        self._wait_for_writer()
        self._writing = self._writer.submit(self._commit, day, batches, last)

    def _wait_for_writer(self) -> None:
        """Wait for the commit under way; its error is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _commit(self, day: str, batches: list[pa.RecordBatch], last: _Last) -> None:
        """Write the records as one file under a hidden name, list it in the manifest
        (moving ``last_txid`` past ``last``), then publish it under its listed name.
        A failure before the manifest lists it deletes the file; one after leaves it
        for the next run to publish."""
        encoded = _encode(batches)
        first = encoded.first_txid
        relative = part_path(self.instance, day, first, last.txid)
        final = self.out / relative
        tmp = final.with_name(temporary_name(final.name))
        directory = final.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            fsync_directory(self.out)
        try:
            data = encoded.data
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_directory(directory)
            written = ExportedFile(
                path=relative,
                date=day,
                rows=encoded.rows,
                topics=encoded.topics,
                first_txid=first,
                last_txid=last.txid,
                bytes=data.size,
                sha256=hashlib.sha256(data).hexdigest(),
                rows_sha256=encoded.rows_sha256,
            )
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        m = self.manifest
        m.files.append(written)
        m.first_txid = m.first_txid or first
        m.last_txid = last.txid
        m.last_bookmark = last.bookmark
        m.journal = str(self.journal.path.resolve())
        m.rows += written.rows
        m.rows_checksum = add_checksums(m.rows_checksum, written.rows_sha256)
        # a failure while the manifest is saved leaves the file where it is: whether
        # the manifest lists it or not, the next run settles it (publishes or deletes)
        self._save_manifest(finished=False)
        # listed: from here on the file is committed, whatever happens next
        self.files.append(written)
        self.rows += written.rows
        self.rows_checksum = add_checksums(self.rows_checksum, written.rows_sha256)
        os.replace(tmp, final)
        fsync_directory(directory)

    def _save_manifest(self, *, finished: bool) -> None:
        entry = self.run_entry
        if not entry:
            self.manifest.runs.append(entry)
        entry.update(
            started=iso_time(self.started_unix),
            finished=iso_time(time.time()) if finished else None,
            journal=str(self.journal.path.resolve()),
            after_txid=self.after_txid,
            through_txid=self.manifest.last_txid,
            stop_txid=self.stop_txid,
            rows=self.rows,
            files=len(self.files),
            seconds=round(time.monotonic() - self.started, 3),
            stopped=self.stopped or None,
        )
        self.manifest.save(self.manifest_dir / CUMULATIVE_MANIFEST, time.time())

    def finish(self) -> str:
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
            "started": iso_time(self.started_unix),
            "finished": iso_time(time.time()),
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
        write_atomically(self.manifest_dir / name, json.dumps(doc, indent=1).encode())
        self._save_manifest(finished=True)
        return f"{MANIFEST_DIR}/{self.manifest_dir.name}/{name}"


def _settle_interrupted(
    out: Path, instance: str, manifest: Manifest
) -> tuple[list[str], list[str]]:
    """Settle what a killed run of ``instance`` left: publish a file the manifest lists
    that was not published yet (its bytes checked against the manifest), delete any
    other unpublished file, and any published one the manifest does not list past its
    ``last_txid``. Returns the paths (relative to ``out``) published, and deleted."""
    listed = {f.path: f for f in manifest.files}
    published: list[str] = []
    deleted: list[str] = []
    touched: set[Path] = set()
    for path, part in list(instance_files(out, instance)):
        at = out / path
        if part.temporary:
            final = (path.parent / at.name[1 : -len(".tmp")]).as_posix()
            entry = listed.get(final)
            if entry is not None and not (out / final).exists() and _holds(at, entry):
                os.replace(at, out / final)
                published.append(final)
            else:
                at.unlink()
                deleted.append(path.as_posix())
            touched.add(at.parent)
        elif part.first_txid > manifest.last_txid and path.as_posix() not in listed:
            at.unlink()
            deleted.append(path.as_posix())
            touched.add(at.parent)
    for directory in sorted(touched):
        fsync_directory(directory)
    return published, deleted


def _holds(path: Path, entry: ExportedFile) -> bool:
    """Whether ``path`` holds the bytes the manifest lists for ``entry``."""
    if path.stat().st_size != entry.bytes:
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256


def refuse_old_layout(out: Path) -> None:
    """Raise :class:`OldExportLayout` when ``out`` holds an export in the previous
    layout (its ``topic=...`` directories); writing the new one beside it would leave
    a directory no reader reads whole."""
    old = subdirectories(out, OLD_TOPIC_PREFIX)
    if old:
        raise OldExportLayout(
            f"{out} holds an export in the previous layout ({len(old)} topic=... "
            f"directories, e.g. {sorted(old)[0].name}); {OLD_LAYOUT_FIX}"
        )


def export_journal(
    journal_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    instance: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    progress: ProgressCallback | None = None,
) -> ExportResult:
    """Export the records of the journal in ``journal_path`` that ``out_dir`` does not
    hold yet to Parquet files in ``out_dir`` (what is promised: the module docstring).

    Args:
        journal_path: the instance's ``TransactionLog/JournalDirectory``; opened
            read-only (the instance may be running).
        out_dir: the export directory (created if missing); may hold other
            instances' exports.
        instance: the name files and manifests are kept under; default: the name
            the journal records.
        batch_rows: records per commit; each commit writes one file (a commit also
            ends where the records' UTC date changes), so larger batches mean fewer,
            larger files.
        batch_bytes: payload bytes per commit (whichever limit comes first).
        progress: called with (records read, records to read) as the run goes.

    Raises:
        ExportDamaged: a damaged record stopped the run (what came before it is
            exported and in the manifest).
        ExportError: the export cannot run (another export of the instance is
            running, the directory holds another journal's export, or an export in
            the previous layout (:class:`OldExportLayout`), a damaged manifest).
        txlog.JournalError: the journal cannot be opened.
        OSError: the export directory cannot be written (e.g. its disk is full);
            what was committed stays, the next run goes on from there.
    """
    if batch_rows < 1 or batch_bytes < 1:
        raise ExportError("batch_rows and batch_bytes must be at least 1")
    out = Path(out_dir)
    refuse_old_layout(out)
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
        with instance_lock(manifest_dir, name):
            manifest = Manifest.load(manifest_dir / CUMULATIVE_MANIFEST, name)
            published, cleaned = _settle_interrupted(out, name, manifest)
            run = _Run(
                journal,
                out,
                name,
                manifest,
                batch_rows=batch_rows,
                batch_bytes=batch_bytes,
                progress=progress,
            )
            run.export()
            run_manifest = run.finish()
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
                published=tuple(published),
            )
