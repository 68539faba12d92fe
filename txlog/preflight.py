"""Checks on a journal directory before LMDB opens it.

LMDB maps ``data.mdb`` into memory and believes its own meta pages. A file shorter
than they say (cut by a failed copy or restore, a full disk, a truncation) makes the
first touch of a missing page kill the process with SIGBUS, with no message; an
empty ``data.mdb`` is silently initialised as a new, empty database. So before
:class:`txlog.Journal` hands a directory to LMDB it reads LMDB's two meta pages itself
(two reads of 152 bytes) and checks the file against them, and it looks for the signs
that a journal existed before it lets an empty or missing ``data.mdb`` start empty.

LMDB's on-disk layout read here (LMDB 0.9, data format version 1, a 64-bit build;
integers in the machine's byte order, as LMDB writes them):

- pages 0 and 1 are the meta pages; page 1 starts at the page size given in page 0;
- a page starts with a 16-byte header: page number (u64), pad (u16), flags (u16,
  ``0x08`` = meta page), then u32;
- the meta follows the header: magic ``0xBEEFC0DE`` (u32), data version (u32), fixed
  map address (u64), map size (u64), two database records of 48 bytes (the first one's
  leading u32, ``md_pad``, is the page size), the last used page number (u64) and the
  transaction id that wrote this meta (u64);
- LMDB uses the meta with the higher transaction id (page 0 on a tie); it needs the
  file to hold every page up to that meta's last used page.

Everything here only reads; nothing in the journal directory is changed, except by
:func:`set_aside` (which an operator asks for with ``--allow-empty-journal``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from .commitlog import LOG_FILE

#: page header: page number, pad, flags, lower/upper (or overflow page count)
_PAGE_HEADER: Final = struct.Struct("=QHHI")
#: meta: magic, version, address, map size, 2 x (pad, flags, depth, branch pages,
#: leaf pages, overflow pages, entries, root), last used page, txnid
_META: Final = struct.Struct("=IIQQ" + "IHHQQQQQ" * 2 + "QQ")
#: bytes of a meta page that this module reads
META_BYTES: Final = _PAGE_HEADER.size + _META.size
P_META: Final = 0x08
LMDB_MAGIC: Final = 0xBEEFC0DE
LMDB_DATA_VERSION: Final = 1
#: page sizes LMDB can have written (a power of two in this range)
MIN_PAGE_SIZE: Final = 256
MAX_PAGE_SIZE: Final = 65536
DATA_FILE: Final = "data.mdb"
#: files a journal directory gets on its first open (LMDB's lock file, the writer lock)
LOCK_FILES: Final = ("lock.mdb", "amps-py.lock")
#: LMDB's lock file
LMDB_LOCK_FILE: Final = "lock.mdb"
#: free bytes LMDB needs to create its lock file (about 16 KiB for 256 readers, 32 KiB
#: for 512; with room to spare): LMDB sizes the file with ftruncate and maps it, so on
#: a full file system its first write to the map kills the process with SIGBUS
LOCK_FILE_ROOM: Final = 1024 * 1024
#: a segment file (:func:`txlog.segments.segment_file_name`), or its temporary name
SEGMENT_FILE: Final = re.compile(r"^(?P<instance>.+)\.\d{10}\.journal(\.zst)?(\.tmp)?$")


class DataFileDamage(Exception):
    """``data.mdb`` is not what LMDB's meta pages say it is; the text says how."""


@dataclass(frozen=True)
class MetaPage:
    """What one of LMDB's meta pages says about the data file."""

    page_no: int
    page_size: int
    map_size: int
    last_page: int
    txnid: int

    @property
    def needed_bytes(self) -> int:
        """The size the file must at least have: every page up to the last used one."""
        return (self.last_page + 1) * self.page_size


def free_bytes(path: Path) -> int:
    """Bytes free for this user on the file system of ``path`` (of its nearest
    existing parent when it does not exist yet); -1 when that cannot be read."""
    for part in (path, *path.parents):
        try:
            return shutil.disk_usage(part).free
        except FileNotFoundError:
            continue
        except OSError:
            return -1
    return -1


def check_lock_file_room(directory: Path) -> None:
    """Before LMDB opens the environment in ``directory``: when it has to create its
    lock file (``lock.mdb`` is missing), the file system must have room for it.

    Raises:
        OSError: ENOSPC, naming the lock file, when fewer than :data:`LOCK_FILE_ROOM`
            bytes are free (LMDB would die with SIGBUS writing the file's map).
    """
    lock = directory / LMDB_LOCK_FILE
    if lock.exists():
        return
    free = free_bytes(directory)
    if 0 <= free < LOCK_FILE_ROOM:
        raise OSError(
            errno.ENOSPC,
            "No space left on device: LMDB must create its lock file there",
            str(lock),
        )


def parse_meta(raw: bytes, page_no: int) -> MetaPage:
    """Decode meta page ``page_no`` (0 or 1) from its first :data:`META_BYTES` bytes.

    Raises:
        DataFileDamage: the bytes are cut short or are not an LMDB meta page this
            LMDB reads (flags, magic, data version, page size, last page).
    """
    where = f"meta page {page_no}"
    if len(raw) < META_BYTES:
        raise DataFileDamage(f"{where} is cut short ({len(raw)} of {META_BYTES} bytes)")
    _pgno, _pad, flags, _ = _PAGE_HEADER.unpack_from(raw)
    fields = _META.unpack_from(raw, _PAGE_HEADER.size)
    magic, version, _address, map_size, page_size = fields[:5]
    last_page, txnid = fields[-2:]
    if not flags & P_META:
        raise DataFileDamage(f"page {page_no} is not an LMDB meta page (flags 0x{flags:04x})")
    if magic != LMDB_MAGIC:
        raise DataFileDamage(
            f"{where} has magic 0x{magic:08x}, not LMDB's 0x{LMDB_MAGIC:08x}: not an LMDB "
            "file, or written on a machine of another byte order"
        )
    if version != LMDB_DATA_VERSION:
        raise DataFileDamage(
            f"{where} has LMDB data version {version}; this LMDB reads version {LMDB_DATA_VERSION}"
        )
    if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE or page_size & (page_size - 1):
        raise DataFileDamage(f"{where} gives an impossible page size {page_size}")
    if last_page < 1:
        raise DataFileDamage(f"{where} gives last used page {last_page}, below its own")
    return MetaPage(page_no, page_size, map_size, last_page, txnid)


def newest_meta(meta0: MetaPage, meta1: MetaPage) -> MetaPage:
    """The meta LMDB uses: the higher transaction id, page 0 on a tie."""
    return meta1 if meta1.txnid > meta0.txnid else meta0


def size_problem(meta: MetaPage, file_size: int) -> str | None:
    """Why a data file of ``file_size`` bytes cannot hold what ``meta`` says, or None."""
    if file_size >= meta.needed_bytes:
        return None
    return (
        f"data.mdb is {file_size} bytes but LMDB needs {meta.needed_bytes} (pages 0 to "
        f"{meta.last_page} of {meta.page_size} bytes, as meta page {meta.page_no} of "
        f"transaction {meta.txnid} says): the file was truncated or damaged"
    )


def check_data_file(path: str | os.PathLike[str]) -> MetaPage:
    """Read ``path`` (a ``data.mdb``)'s meta pages and check its size against them.

    Two reads of :data:`META_BYTES`; the size is taken after them, so a writer that
    grows the file meanwhile (it writes pages before the meta that counts them) never
    makes a sound file look short.

    Returns:
        The meta LMDB will use.

    Raises:
        DataFileDamage: the file is empty, its meta pages are unreadable or invalid, or
            it is shorter than they say.
        OSError: the file cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size == 0:
            raise DataFileDamage("data.mdb is empty (0 bytes)")
        try:
            meta0 = parse_meta(os.pread(fd, META_BYTES, 0), 0)
            meta1 = parse_meta(os.pread(fd, META_BYTES, meta0.page_size), 1)
        except DataFileDamage as exc:
            size = os.fstat(fd).st_size
            raise DataFileDamage(
                f"data.mdb ({size} bytes) has no valid LMDB meta pages ({exc}): the file "
                "was truncated or damaged"
            ) from None
        meta = newest_meta(meta0, meta1)
        problem = size_problem(meta, os.fstat(fd).st_size)
        if problem is not None:
            raise DataFileDamage(problem)
        return meta
    finally:
        os.close(fd)


def journal_traces(
    names: Iterable[str], archive_names: Iterable[str] = (), instance: str | None = None
) -> list[str]:
    """Of the file ``names`` in a journal directory (and ``archive_names`` in its
    archive directory), those that show a journal existed there: ``data.mdb`` itself,
    the lock files, and segment files (in the archive directory only those of
    ``instance``, when it is known). Sorted, archive files prefixed ``archive/``."""
    found = [
        name
        for name in names
        if name == DATA_FILE
        or name in LOCK_FILES
        or SEGMENT_FILE.match(name)
        or LOG_FILE.match(name)
    ]
    for name in archive_names:
        match = SEGMENT_FILE.match(name)
        if match and (not instance or match["instance"] == instance):
            found.append(f"archive/{name}")
    return sorted(found)


def describe_traces(traces: Iterable[str], limit: int = 4) -> str:
    """``traces`` for a one-line message: at most ``limit`` names, then a count."""
    names = list(traces)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def find_traces(directory: Path, archive_directory: Path | None, instance: str | None) -> list[str]:
    """:func:`journal_traces` of what is on disk (missing directories hold none)."""
    names = [p.name for p in directory.iterdir() if p.is_file()] if directory.is_dir() else []
    archived: list[str] = []
    if archive_directory is not None and archive_directory.is_dir():
        archived = [p.name for p in archive_directory.iterdir() if p.is_file()]
    return journal_traces(names, archived, instance)


def set_aside(
    directory: Path, archive_directory: Path | None, traces: Iterable[str], now: float
) -> list[Path]:
    """Move the segment and commit log files among ``traces`` into a ``discarded-<UTC time>``
    directory beside them, so a new journal started in their place never overwrites
    them (its segments get the same names). Returns the directories used."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("discarded-%Y%m%dT%H%M%SZ")
    used: list[Path] = []
    for trace in traces:
        base, name = directory, trace
        if trace.startswith("archive/") and archive_directory is not None:
            base, name = archive_directory, trace.removeprefix("archive/")
        if not SEGMENT_FILE.match(name) and not LOG_FILE.match(name):
            continue
        target = base / stamp
        target.mkdir(exist_ok=True)
        (base / name).rename(target / name)
        if target not in used:
            used.append(target)
    return used


def repair_advice(directory: Path) -> str:
    """What an operator can do about a damaged journal in ``directory`` (one line)."""
    return (
        f"restore {directory} from a backup, or move it aside (mv {directory} "
        f"{directory}.damaged) and start the instance with --allow-empty-journal: it "
        "starts with an empty journal and its replication peers resync what they "
        "replicate to it"
    )
