"""Journal maintenance on a stopped instance's journal (``amps-py txlog compress|
archive|remove``): the same state changes as the running server's, done in-process.

The journal is opened for writing, which takes its writer lock: a running instance
holds that lock, so these refuse to touch its journal (use ``amps-py admin journal``).
Removal keeps what the replication destinations have not acknowledged, as far as the
journal knows: the positions the instance last saved.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .errors import JournalError
from .journal import Journal
from .segments import wants_file

#: ``progress(what, done, total)``: ``done`` of ``total`` records of the step ``what``
Progress = Callable[[str, int, int], None]


def maintain_offline(
    journal: Journal, action: str, through: int, progress: Progress | None = None
) -> str:
    """Compress, archive or remove journal segment ``through`` and every older one;
    purge what that frees from LMDB; return what happened, in words.

    ``progress``, when given, is called as the work goes: with ``("compress" or
    "archive", records written, records to write)``, then ``("purge", records
    deleted from LMDB, records to delete)``.

    Raises:
        JournalError: unknown action or segment, the current segment, or archiving
            without an archive directory.
    """
    segments = journal.segments()
    if action not in ("compress", "archive", "remove"):
        raise JournalError(f"unknown journal action {action!r}; use compress, archive or remove")
    if through not in {seg.id for seg in segments}:
        raise JournalError(f"there is no journal {through}; `amps-py txlog info` lists them")
    if through == segments[-1].id:
        raise JournalError(
            f"journal {through} is the current one; only sealed journals can be "
            f"{action}{'d' if action.endswith('e') else 'ed'}"
        )
    if action == "remove":
        summary = _remove(journal, through)
    else:
        state = "compressed" if action == "compress" else "archived"
        todo = [s for s in segments if s.id <= through and wants_file(s, state)]
        total = sum(s.records for s in todo)
        done: list[int] = []
        written = 0
        for seg in todo:

            def report(n: int, before: int = written) -> None:
                if progress is not None:
                    progress(action, before + n, total)

            file = journal.write_segment_file(seg, state, report if progress else None)
            old = journal.mark_offloaded(seg.id, state, file)
            if old:
                Path(old).unlink(missing_ok=True)
            done.append(seg.id)
            written += seg.records
            report(0, written)
        summary = f"{state} {segment_ids_text(done)}" if done else f"nothing newly {state}"
    _purge(journal, progress)
    return summary


def _purge(journal: Journal, progress: Progress | None) -> None:
    """Finish every pending state change's LMDB side (see ``Journal.purge_step``)."""
    step = 50_000
    total = sum(seg.records for seg in journal.segments() if not seg.cleaned)
    deleted = 0
    while journal.purge_step(step):
        deleted = min(deleted + step, total)
        if progress is not None:
            progress("purge", deleted, total)
    if progress is not None:
        progress("purge", total, total)


def _remove(journal: Journal, through: int) -> str:
    positions = journal.destination_positions()
    safe = min(positions.values(), default=journal.last_txid)
    marked = [s for s in journal.segments()[:-1] if s.id <= through and s.state != "removed"]
    removable = []
    for seg in marked:
        if seg.last_txid > safe:
            break
        removable.append(seg.id)
    if removable:
        journal.mark_removed(removable[-1])
    summary = f"removed {segment_ids_text(removable)}" if removable else "nothing removed"
    kept = [s.id for s in marked if s.id not in removable]
    if kept:
        holders = [
            f"{name} (through txid {txid})" for name, txid in positions.items() if txid == safe
        ]
        summary += (
            f"; kept {segment_ids_text(kept)}: destination {', '.join(holders)} has not "
            "acknowledged them (start the instance so it can catch the destination up)"
        )
    return summary


def segment_ids_text(ids: list[int]) -> str:
    """``journal 3`` or ``journals 1, 2``."""
    return ("journals " if len(ids) > 1 else "journal ") + ", ".join(map(str, ids))
