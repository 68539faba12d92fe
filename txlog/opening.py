"""Opening a journal: the writer lock, the checks before and right after LMDB opens
``data.mdb``, and LMDB's errors in words.

:class:`txlog.journal.Journal` opens in this order, and every step here refuses with a
:class:`JournalDamaged` or :class:`JournalError` that names the file, the problem and the
fix, before anything in ``data.mdb`` or the segment files changes:

1. :func:`check_before_open`: ``data.mdb`` against its own LMDB meta pages
   (:mod:`txlog.preflight`), and the signs of a former journal where the file is empty
   or missing;
2. a writer takes the lock (:func:`take_writer_lock`): one writer process per journal;
3. :func:`check_format_and_owner`: the journal's format and owning instance;
4. a writer reads its newest record (:func:`record_damaged` words its damage).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Final

import lmdb

from . import preflight
from .errors import JournalDamaged, JournalError, JournalNoSpace
from .preflight import free_bytes
from .record import CorruptRecord

JOURNAL_FORMAT: Final = "amps-py-journal-1"
WRITER_LOCK_FILE: Final = "amps-py.lock"

#: LMDB errors that mean the file's pages are not what LMDB wrote
LMDB_DAMAGE_ERRORS: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
)
#: LMDB errors a read of sound pages never raises: the pages it went through are damaged
#: (a damaged node can also claim an impossible key or value size)
LMDB_READ_DAMAGE_ERRORS: Final = (*LMDB_DAMAGE_ERRORS, lmdb.BadValsizeError)


def take_writer_lock(path: Path) -> int:
    """Hold an exclusive lock on ``path/amps-py.lock`` for as long as the journal is
    open for writing: one writer process per journal (a second instance, or an offline
    tool while the instance runs, is refused). Returns the lock file's descriptor;
    closing it releases the lock.

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


def writer_lock_held(path: Path) -> bool:
    """Whether a process holds ``path``'s writer lock now (a running instance)."""
    try:
        fd = os.open(path / WRITER_LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the file releases a lock taken here
    return False


#: free bytes (beyond what the commit log holds for LMDB) below which a failed LMDB
#: write is taken for a full disk: LMDB reports space that ran out during write-back
#: as ``Input/output error``, so the free space decides (as for a running instance)
FULL_DISK_MARGIN: Final = 4 * 1024 * 1024


def is_full_disk(exc: BaseException, free: int, needed: int = 0) -> bool:
    """Whether ``exc``, from a write to a file system with ``free`` bytes free, means
    that file system is full: the error says so (ENOSPC, LMDB's ``DiskError``, "No
    space left on device"), or it is an I/O error while less than ``needed`` plus
    :data:`FULL_DISK_MARGIN` bytes are free. Pure, apart from reading ``exc``."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, lmdb.DiskError) or "No space left on device" in str(exc):
        return True
    io_error = (isinstance(exc, OSError) and exc.errno == errno.EIO) or (
        "Input/output error" in str(exc)
    )
    return io_error and 0 <= free < needed + FULL_DISK_MARGIN


def no_space(path: Path, exc: BaseException, free: int) -> JournalNoSpace:
    """The journal in ``path`` cannot be written because its file system is full: one
    line with the bytes free, that nothing stored was lost, and the fix."""
    if isinstance(exc, OSError) and exc.filename:
        where = Path(exc.filename)
    else:
        where = path / preflight.DATA_FILE if isinstance(exc, lmdb.Error) else path
    shown = f"{free} bytes free" if free >= 0 else "its free space could not be read"
    cause = f"writing {where} failed: {_words(exc)}"
    return JournalNoSpace(
        f"journal {path}: no space left on device: the file system of {path} has "
        f"{shown} ({cause}); nothing stored was lost or changed (what LMDB lacks stays "
        "in the commit-*.log files beside data.mdb). Fix: free space on the file "
        f"system of {path}, or move the whole directory (data.mdb with its commit-*.log "
        "files) to a larger disk, then open it again",
        path,
        free,
        cause,
    )


def _words(exc: BaseException) -> str:
    """An error's own text without the errno and file name an OSError adds."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def pending_log_bytes(path: Path) -> int:
    """Bytes of the commit log files in ``path``: about what opening it may have to
    write into LMDB (the files are preallocated, so this is an upper bound)."""
    total = 0
    for entry in path.glob("commit-*.log"):
        try:
            total += entry.stat().st_size
        except OSError:
            continue
    return total


def lmdb_error(path: Path, exc: lmdb.Error, readonly: bool = False) -> JournalError:
    """``exc`` from LMDB on the journal in ``path``, as a :class:`JournalError` whose
    text names the file and what to do, in one line: a :class:`JournalDamaged` when the
    file is damaged, a :class:`JournalNoSpace` when its file system is full.

    ``readonly``: ``exc`` came from a read-only use of the journal, where
    ``MDB_BAD_TXN`` too means a damaged page (a read that met one flags its transaction
    failed, some without an error of their own, e.g. on opening a cursor)."""
    if isinstance(exc, LMDB_DAMAGE_ERRORS) or (readonly and isinstance(exc, lmdb.BadTxnError)):
        return lmdb_damage(path, exc)
    free = free_bytes(path)
    if is_full_disk(exc, free, pending_log_bytes(path)):
        return no_space(path, exc, free)
    return JournalError(f"journal {path}: LMDB failed on {path / preflight.DATA_FILE}: {exc}")


def lmdb_damage(path: Path, exc: lmdb.Error) -> JournalDamaged:
    """LMDB's report of a damaged page in the journal in ``path``, with the fix."""
    found = (
        f"journal {path}: LMDB cannot read {path / preflight.DATA_FILE} ({exc}): the file "
        "is damaged"
    )
    return JournalDamaged(
        f"{found}. Fix: amps-py txlog verify {path} lists the damage; "
        f"{preflight.repair_advice(path)}",
        found,
    )


def check_before_open(
    path: Path,
    archive_directory: Path | None,
    instance_name: str | None,
    readonly: bool,
    allow_empty: bool,
) -> list[str]:
    """Check ``path/data.mdb`` before LMDB opens it (see :mod:`txlog.preflight`).

    Returns the signs of a former journal when ``allow_empty`` lets an empty one
    start over them (else nothing).

    Raises:
        JournalDamaged: the file is damaged, or empty/missing where a journal was.
        JournalError: no journal to read (read-only), or the file is unreadable.
    """
    data = path / preflight.DATA_FILE
    try:
        size: int | None = data.stat().st_size
    except FileNotFoundError:
        size = None
    if readonly and size is None:
        raise JournalError(
            f"{path} holds no journal (no data.mdb); pass the instance's "
            "TransactionLog/JournalDirectory"
        )
    if not readonly and not size:
        traces = preflight.find_traces(path, archive_directory, instance_name)
        if traces and not allow_empty:
            state = "missing" if size is None else "empty (0 bytes)"
            raise JournalDamaged(
                f"journal {path} held a journal ({preflight.describe_traces(traces)}) "
                f"but its data.mdb is {state}: starting would begin an empty journal "
                "and lose every message it held; nothing was changed. Fix: restore "
                f"{path} from a backup, or to start empty on purpose (replication "
                "peers then resync what they replicate to this instance) start with "
                "amps-py serve --allow-empty-journal"
            )
        return traces
    try:
        preflight.check_data_file(data)
    except preflight.DataFileDamage as exc:
        raise JournalDamaged(
            f"journal {path} is damaged: {exc}; nothing was opened or changed. "
            f"Fix: {preflight.repair_advice(path)}"
        ) from None
    except OSError as exc:
        raise JournalError(f"cannot read {data}: {exc.strerror or exc}") from exc
    return []


def check_format_and_owner(
    env: lmdb.Environment,
    meta: lmdb._Database,
    path: Path,
    instance_name: str | None,
    readonly: bool,
) -> str:
    """Check the journal's format and owner in its ``meta`` database (a writer stamps
    a new journal with both) and return the owning instance's name (``instance_name``,
    or ``""``, when the journal names none).

    Raises:
        JournalError: another format, or a journal of another instance.
    """
    with env.begin(db=meta, write=not readonly) as txn:
        fmt = txn.get(b"format")
        owner = txn.get(b"instance")
        if fmt is None and not readonly:
            txn.put(b"format", JOURNAL_FORMAT.encode())
            if instance_name:
                txn.put(b"instance", instance_name.encode())
                owner = instance_name.encode()
        elif fmt is not None and fmt.decode() != JOURNAL_FORMAT:
            raise JournalError(
                f"{path} holds journal format {fmt.decode()!r}, this amps-py "
                f"reads {JOURNAL_FORMAT!r}; use the matching amps-py version"
            )
    if instance_name and owner and owner.decode() != instance_name:
        raise JournalError(
            f"journal {path} belongs to instance {owner.decode()!r}, not "
            f"{instance_name!r}; give each instance its own JournalDirectory"
        )
    return owner.decode() if owner else (instance_name or "")


def record_damaged(path: Path, exc: CorruptRecord, last_txid: int) -> JournalDamaged:
    """A damaged record met while opening the journal in ``path`` (whose newest txid
    is ``last_txid``), with the fix."""
    txid = exc.txid if exc.txid is not None else last_txid
    which = "the newest record" if txid == last_txid else "the record"
    found = (
        f"journal {path}: {which}, txid {txid}, is damaged ({exc.problem}); the "
        "journal cannot be continued from it and nothing was changed"
    )
    return JournalDamaged(
        f"{found}. Fix: amps-py txlog verify {path} lists every damaged record; "
        f"{preflight.repair_advice(path)}",
        found,
    )
