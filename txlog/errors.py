"""The journal's exceptions (shared by every txlog module; :mod:`txlog` re-exports
them, and :mod:`txlog.record` re-exports the two record errors it has always named)."""

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


class CorruptRecord(Exception):
    """A stored record failed its CRC or could not be decoded.

    The record is never served as data; ``txid`` says which one (``None`` when the
    damage hides it), so ``amps-py txlog verify`` and the logs can name it.
    """

    def __init__(self, txid: int | None, problem: str) -> None:
        where = f"record txid {txid}" if txid is not None else "a record"
        #: the damage in words, without the fix
        self.found = f"{where} is corrupt: {problem}"
        super().__init__(
            f"{self.found}; restore the journal from a replica or backup "
            "(amps-py txlog verify lists every damaged record)"
        )
        self.txid = txid
        self.problem = problem

    @property
    def through(self) -> int | None:
        """The last txid the damage covers: ``txid`` for one damaged record (a range
        for :class:`UnreadableRecords`)."""
        return self.txid


class UnreadableRecords(CorruptRecord):
    """LMDB reports a damaged page where a journal read went (``lmdb.CorruptedError``,
    ``PageNotFoundError`` and the like), so records ``txid`` to :attr:`through` cannot
    be read at all; ``through`` is None when nothing after ``txid`` reads. Damage in one
    of the journal's indexes (bookmarks, publishers, times ...) has ``txid`` None and
    names the index.

    A :class:`CorruptRecord`, so every reader that stops cleanly at a damaged record
    stops as cleanly here: nothing of the unreadable range is ever served, the records
    before it are. The message names the range, LMDB's error and the fix, in one line.

    Args:
        txid: the first txid that does not read (None for an index).
        through: the last one (None: nothing after ``txid`` reads, or an index).
        lmdb_error: LMDB's words for the damage.
        index: ``records``, or the name of the damaged index.
    """

    def __init__(
        self, txid: int | None, through: int | None, lmdb_error: str, index: str = "records"
    ) -> None:
        problem = f"LMDB reports a damaged page ({lmdb_error})"
        if index != "records":
            what = f"the journal's {index} index"
        elif txid is None:
            what = "records"
        elif through is None:
            what = f"txids from {txid} on"
        elif through == txid:
            what = f"txid {txid}"
        else:
            what = f"txids {txid} to {through}"
        verb = " is" if index != "records" else ""
        # not CorruptRecord.__init__: its words are for one record that fails its checks
        self.found = f"{what}{verb} unreadable: {problem}"
        Exception.__init__(
            self,
            f"{self.found}; restore the journal from a replica or backup (amps-py txlog "
            "verify lists every damaged record and page)",
        )
        self.txid = txid
        self.problem = problem
        self.index = index
        self._through = through
        #: the unreadable range in words ("txids 10 to 12", "txids from 10 on", ...)
        self.what = what

    @property
    def through(self) -> int | None:
        """The last unreadable txid (None: everything after :attr:`txid`, or an index)."""
        return self._through
