"""The journal's exceptions (shared by :mod:`txlog.journal`, :mod:`txlog.opening` and
:mod:`txlog.maintenance`; :mod:`txlog` re-exports them)."""

from __future__ import annotations

from pathlib import Path


class JournalError(Exception):
    """The journal cannot be opened or used as asked; the message says how to fix it."""


class JournalDamaged(JournalError):
    """The journal's files are damaged (truncated, empty where a journal was, a damaged
    page or newest record); the message names the file and what to do. The open that
    raised it changed nothing in ``data.mdb`` or the segment files.

    ``found``, when given, is the message's account of the damage alone (without the
    fix), for a tool whose own fix differs (``verify`` does not advise running itself).
    """

    def __init__(self, message: str, found: str = "") -> None:
        super().__init__(message)
        self.found = found


class JournalNoSpace(JournalError):
    """A write the journal needs failed because its file system is full (or so nearly
    full that an I/O error from LMDB can only mean that). The write that failed changed
    nothing the journal holds: LMDB's transaction was not committed, and what LMDB
    lacks is still in the commit log files.

    Attributes:
        directory: the journal directory.
        free: bytes free on its file system when the failure was seen (-1: unknown).
        cause: which write failed and the error's own words (``writing .../data.mdb
            failed: mdb_txn_commit: Input/output error``).
    """

    def __init__(self, message: str, directory: Path, free: int, cause: str) -> None:
        super().__init__(message)
        self.directory = directory
        self.free = free
        self.cause = cause
