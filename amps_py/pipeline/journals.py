"""Which journals a path names: the path itself when it is a journal directory (it
holds ``data.mdb``), else every journal directory below it, as the walkthroughs lay
them out (``./amps-data/amps-a``, ``./amps-data/amps-b``).

A journal directory also keeps stores of its own inside it, each an LMDB environment
with its own ``data.mdb`` (SOW stores under ``sow/``, queue checkpoints under
``queues/``, the client-name owners): those are not journals and are never returned.
"""

from __future__ import annotations

import os
from pathlib import Path

from txlog import JournalError


def journal_directories(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` when it is a journal directory, else the journal directories below it
    (sorted), outermost first: a directory inside a journal directory is one of its
    stores, not another journal.

    Raises:
        JournalError: ``path`` does not exist, or neither it nor anything below it
            holds a journal (the message says what to pass).
    """
    base = Path(path)
    if (base / "data.mdb").is_file():
        return [base]
    if not base.is_dir():
        raise JournalError(
            f"{base}: no such directory; pass an instance's TransactionLog/JournalDirectory "
            "or a directory holding them"
        )
    journals: list[Path] = []
    for directory in sorted(d.parent for d in base.rglob("data.mdb")):
        if not any(directory.is_relative_to(j) for j in journals):
            journals.append(directory)
    if not journals:
        raise JournalError(
            f"{base} holds no journal (no data.mdb in it or below it); pass an instance's "
            "TransactionLog/JournalDirectory or a directory holding them"
        )
    return journals
