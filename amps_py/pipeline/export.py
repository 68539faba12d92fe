"""Export a journal to Parquet, incrementally (plain Python + pyarrow: no Spark, no
Java, so it runs on the server host beside a running instance).

The export directory's layout and how topic names are encoded in it are in
:mod:`.export_layout`; the manifests in :mod:`.export_manifest`; reading an export
back and checking it in :mod:`.export_verify`. Files hold the columns of
:data:`.schema.ARROW_SCHEMA` (one row per record, in txid order), zstd-compressed;
``topic`` and ``date`` (the UTC date of ``local_ts``) are the partition directories.

Contract:

- **Complete, no duplicates.** A run exports every record of the journal after the
  last txid the cumulative manifest says was exported, up to the journal's newest
  txid when the run started; each record is in exactly one file. Records the
  instance adds meanwhile are left for the next run.
- **Incremental.** The next run starts after the manifest's ``last_txid``. Several
  instances' journals can share one export directory: files and manifests are named
  by instance, and each instance has its own lock.
- **Crash-safe.** Records are committed in batches: each batch's files are written
  under hidden temporary names, flushed to disk and renamed; then the cumulative
  manifest (written the same way) moves ``last_txid`` past them. A run killed at any
  point leaves no partly written file that a reader picks up; the next run first
  deletes what a killed run wrote after the manifest's ``last_txid``, then exports
  those records again.
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
    ZERO_CHECKSUM,
    TopicTooLong,
    add_checksums,
    date_directory,
    decode_name,
    manifest_directory,
    part_name,
    run_manifest_name,
    temporary_name,
    topic_directory,
)
from .export_manifest import (
    ExportedFile,
    ExportError,
    Manifest,
    fsync_directory,
    instance_lock,
    iso_time,
    rows_sha256,
    write_atomically,
)
from .export_verify import exported_dataset, instance_files, verify_export
from .schema import ARROW_SCHEMA, RecordTooLarge

__all__ = [
    "ExportDamaged",
    "ExportError",
    "ExportResult",
    "ExportedFile",
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
#: a partition: (topic, days since 1970-01-01 of local_ts, UTC)
_Key = tuple[str, int]
_PAYLOAD: Final = ARROW_SCHEMA.get_field_index("payload")
_TOPIC: Final = ARROW_SCHEMA.get_field_index("topic")
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
    """Records read and not yet committed, as Arrow batches grouped by partition."""

    def __init__(self) -> None:
        self.batches: dict[_Key, list[pa.RecordBatch]] = {}
        self.rows = 0
        self.bytes = 0
        self.last: _Last | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (records in txid order, after those added before), split by
        partition where it spans several."""
        if not batch.num_rows:
            return
        for key, rows in _split(batch):
            self.batches.setdefault(key, []).append(rows)
        self.rows += batch.num_rows
        self.bytes += batch.column(_PAYLOAD).nbytes
        end = batch.num_rows - 1
        self.last = _Last(batch.column(_TXID)[end].as_py(), batch.column(_BOOKMARK)[end].as_py())

    def take(self) -> tuple[list[tuple[str, str, pa.Table]], _Last | None]:
        """The pending records as one table per partition, ``(topic, 'YYYY-MM-DD',
        rows)`` in topic and date order, and the last record; empties the buffer."""
        parts = [
            (topic, date.fromordinal(_EPOCH_ORDINAL + day).isoformat(),
             pa.Table.from_batches(batches, ARROW_SCHEMA))
            for (topic, day), batches in sorted(self.batches.items())
        ]  # fmt: skip
        last = self.last
        self.batches = {}
        self.rows = self.bytes = 0
        self.last = None
        return parts, last


def _split(batch: pa.RecordBatch) -> Iterator[tuple[_Key, pa.RecordBatch]]:
    """``batch``'s rows by partition, each part in the batch's order."""
    topics = batch.column(_TOPIC)
    days = pc.cast(pc.cast(batch.column(_LOCAL_TS), pa.date32()), pa.int32())
    low, high = pc.min_max(days).values()
    if low == high and pc.count_distinct(topics).as_py() == 1:
        yield (topics[0].as_py(), low.as_py()), batch
        return
    keys = pa.record_batch([topics, days], ["topic", "day"])
    order = pc.sort_indices(keys, [("topic", "ascending"), ("day", "ascending")])
    batch, keys = batch.take(order), keys.take(order)
    topics, days = keys.column(0), keys.column(1)
    n = batch.num_rows
    change = pc.or_(
        pc.not_equal(topics.slice(1), topics.slice(0, n - 1)),
        pc.not_equal(days.slice(1), days.slice(0, n - 1)),
    )
    starts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    for start, end in itertools.pairwise(starts):
        yield (topics[start].as_py(), days[start].as_py()), batch.slice(start, end - start)


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
        shorten_long_topics: bool,
        progress: ProgressCallback | None,
    ) -> None:
        self.journal = journal
        self.out = out
        self.instance = instance
        self.manifest_dir = out / manifest_directory(instance)
        self.manifest = manifest
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.shorten = shorten_long_topics
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
            self.pending.add(batch)
            self.read_rows += batch.num_rows
            after = batch.column(_TXID)[batch.num_rows - 1].as_py()
            if self.pending.rows >= self.batch_rows or self.pending.bytes >= self.batch_bytes:
                self._commit_pending()
            self._report(total)
        self._commit_pending()
        self._wait_for_writer()

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
            self.pending.add(self._read(after, txid - after - 1))
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
        parts, last = self.pending.take()
        if last is None:
            return
        self._wait_for_writer()
        self._writing = self._writer.submit(self._commit, parts, last)

    def _wait_for_writer(self) -> None:
        """Wait for the commit under way; its error is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _commit(self, parts: list[tuple[str, str, pa.Table]], last: _Last) -> None:
        """Write one file per partition, then move the manifest past ``last``. A
        failure on the way deletes the files this commit wrote (what a reader of the
        directory sees stays what the manifest lists)."""
        named = [(self._topic_directory(topic, table), day, table) for topic, day, table in parts]
        written: list[ExportedFile] = []
        try:
            for (topic_dir, day, table), (topic, _, _) in zip(named, parts, strict=True):
                written.append(self._write(topic_dir, topic, day, table))
            for directory in sorted({(self.out / f.path).parent for f in written}):
                fsync_directory(directory)
        except BaseException:
            for f in written:
                with contextlib.suppress(OSError):
                    (self.out / f.path).unlink()
            raise
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

    def _topic_directory(self, topic: str, table: pa.Table) -> str:
        """``topic=...`` for ``topic`` (noting a renamed one in the manifest).

        Raises:
            ExportError: the topic is too long for a directory name.
        """
        try:
            topic_dir = topic_directory(topic, shorten=self.shorten)
        except TopicTooLong as exc:
            raise ExportError(f"txid {table.column('txid')[0].as_py()}: {exc}") from None
        if "~" in topic_dir:  # a full name has its "~" encoded: this one is renamed
            self.manifest.renamed_topics[decode_name(topic_dir.partition("=")[2])] = topic
        return topic_dir

    def _write(self, topic_dir: str, topic: str, day: str, table: pa.Table) -> ExportedFile:
        txids = table.column("txid")
        first, last = txids[0].as_py(), txids[-1].as_py()
        relative = f"{topic_dir}/{date_directory(day)}"
        directory = self.out / relative
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            fsync_directory(directory.parent)
            fsync_directory(self.out)
        name = part_name(self.instance, first, last)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue()
        tmp = directory / temporary_name(name)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / name)
        return ExportedFile(
            path=f"{relative}/{name}",
            topic=topic,
            date=day,
            rows=table.num_rows,
            first_txid=first,
            last_txid=last,
            bytes=data.size,
            sha256=hashlib.sha256(data).hexdigest(),
            rows_sha256=rows_sha256(table),
        )

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


def _clean_interrupted(out: Path, instance: str, through: int) -> list[str]:
    """Delete what a killed run of ``instance`` left: unfinished files, and files of
    records after txid ``through`` (written, never committed to the manifest).
    Returns their paths relative to ``out``."""
    cleaned: list[Path] = []
    for path, part in list(instance_files(out, instance)):
        if part.temporary or part.first_txid > through:
            (out / path).unlink()
            cleaned.append(path)
    for directory in sorted({(out / path).parent for path in cleaned}):
        fsync_directory(directory)
    return [str(path) for path in cleaned]


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
    hold yet to Parquet files in ``out_dir`` (what is promised: the module docstring).

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
        progress: called with (records read, records to read) as the run goes.

    Raises:
        ExportDamaged: a damaged record stopped the run (what came before it is
            exported and in the manifest).
        ExportError: the export cannot run (another export of the instance is
            running, the directory holds another journal's export, a topic is too
            long for a directory name, a damaged manifest).
        txlog.JournalError: the journal cannot be opened.
        OSError: the export directory cannot be written (e.g. its disk is full);
            what was committed stays, the next run goes on from there.
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
        with instance_lock(manifest_dir, name):
            manifest = Manifest.load(manifest_dir / CUMULATIVE_MANIFEST, name)
            cleaned = _clean_interrupted(out, name, manifest.last_txid)
            run = _Run(
                journal,
                out,
                name,
                manifest,
                batch_rows=batch_rows,
                batch_bytes=batch_bytes,
                shorten_long_topics=shorten_long_topics,
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
            )
