"""The manifests of a Parquet export, and the file-system steps that keep them true:
atomic writes, flushed directories, one export per instance at a time, row checksums.

The cumulative manifest (``_manifests/<instance>/export.json``) is the export's commit
record: a file counts as exported once it is listed there, and ``last_txid`` is where
the next run starts. A commit's file is written under a hidden temporary name first,
listed here, and only then published (renamed to its listed name): so a reader of the
directory never sees a row the manifest does not list. Field by field:

==========================  ===============================================================
``format``                  ``amps-py-export-2``
``instance``                the instance whose records these are
``journal``                 the journal directory of the last run
``first_txid``              the first txid exported (0: none yet)
``last_txid``               every record of the journal through this txid is exported
``last_bookmark``           the bookmark at ``last_txid`` (a later run checks its journal
                            holds the same there, so another journal is not appended)
``rows``                    records exported, in all files
``rows_checksum``           the files' ``rows_sha256`` summed modulo 2**256 (64 hex digits)
``files``                   every file (one per commit): ``path`` (relative), ``date``,
                            ``rows``, ``topics`` (how many topics its rows are of),
                            ``first_txid``, ``last_txid``, ``bytes``, ``sha256`` (of
                            the bytes), ``rows_sha256``
``runs``                    every run: ``run`` (its manifest's name), ``started``,
                            ``finished`` (null: still running, or killed), ``journal``,
                            ``after_txid``, ``through_txid``, ``stop_txid`` (the journal's
                            newest txid when it started), ``rows``, ``files``,
                            ``seconds``, ``stopped`` (why it stopped early, or null)
``removed_before_export``   ``[first, last]`` txid ranges the journal had removed before
                            any run exported them
``updated``                 when it was written (UTC)
==========================  ===============================================================

A run's own manifest (``run-<UTC time>-<first>-<last>.json`` beside it) holds that
run's fields, its files and its own ``rows_checksum``.

``rows_sha256`` of a file: SHA-256 of its txid column as little-endian int64 values in
row order, followed by its bookmarks' UTF-8 bytes concatenated in row order (each
bookmark ends with ``|``, so the concatenation is unambiguous). Rows are in topic,
then txid order.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from .export_layout import (
    EXPORT_FORMAT,
    LOCK_FILE,
    OLD_EXPORT_FORMAT,
    OLD_LAYOUT_FIX,
    ZERO_CHECKSUM,
)

_I32 = struct.Struct("<i")


class ExportError(Exception):
    """The export cannot run or go on as asked; the message says what to do."""


class OldExportLayout(ExportError):
    """The export directory holds the previous layout (``amps-py-export-1``)."""


@dataclass(frozen=True)
class ExportedFile:
    """One Parquet file of an export, as its manifest lists it."""

    path: str  #: relative to the export directory, ``/``-separated
    date: str  #: ``YYYY-MM-DD``
    rows: int
    topics: int  #: how many topics its rows are of
    first_txid: int
    last_txid: int
    bytes: int
    sha256: str  #: of the file's bytes
    rows_sha256: str  #: of its txids and bookmarks (see the module docstring)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ExportedFile:
        return cls(**{name: doc[name] for name in cls.__dataclass_fields__})


@dataclass
class Manifest:
    """The cumulative manifest of one instance's export (see the module docstring)."""

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
    updated: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"format": EXPORT_FORMAT, **asdict(self)}

    def save(self, path: Path, unix_time: float) -> None:
        """Write it to ``path`` atomically (:func:`write_atomically`)."""
        self.updated = iso_time(unix_time)
        write_atomically(path, json.dumps(self.to_json(), indent=1).encode())

    @classmethod
    def load(cls, path: Path, instance: str) -> Manifest:
        """The manifest in ``path``, or an empty one when there is none yet.

        Raises:
            ExportError: the file is unreadable, or of another format or instance.
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
        if isinstance(doc, dict) and doc.get("format") == OLD_EXPORT_FORMAT:
            raise OldExportLayout(
                f"{path.parent.parent.parent} holds an export in the previous layout "
                f"({OLD_EXPORT_FORMAT}, topic=... directories); {OLD_LAYOUT_FIX}"
            )
        if (
            not isinstance(doc, dict)
            or doc.get("format") != EXPORT_FORMAT
            or doc.get("instance") != instance
        ):
            found = doc if not isinstance(doc, dict) else doc.get("format")
            raise ExportError(
                f"{path} is not an {EXPORT_FORMAT} manifest of instance {instance!r} "
                f"(found {found!r}); export into a new directory"
            )
        doc.pop("format")
        try:
            doc["files"] = [ExportedFile.from_json(f) for f in doc["files"]]
            return cls(**doc)
        except (KeyError, TypeError) as exc:
            raise ExportError(
                f"export manifest {path} lacks a field ({exc}); restore it, or export into "
                "a new directory"
            ) from None


def iso_time(unix_time: float) -> str:
    return datetime.fromtimestamp(unix_time, UTC).isoformat(timespec="milliseconds")


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` in ``path``: written to a hidden temporary file beside it, flushed to
    disk, renamed over ``path``, and the directory flushed; so ``path`` always holds a
    whole version, old or new."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    """Flush ``path``'s entries (names created, renamed or deleted in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def instance_lock(directory: Path, instance: str) -> Iterator[None]:
    """Hold ``directory/export.lock``: one export of ``instance`` into an export
    directory at a time (other instances' exports have their own).

    Raises:
        ExportError: another export of the instance holds it (its pid is named).
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
        os.close(fd)  # closing the file releases the lock


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
