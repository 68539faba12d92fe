"""Journal maintenance: compress, archive and remove journal segments safely.

The operator (admin API, ``amps-py admin journal ...``) or an action
(``amps-action-do-compress-journal`` etc.) asks for a state change of a segment and
every older one, by id or by ``Age``:

- **compress** and **archive** happen at once: each segment's file is written (off the
  writer, reads only), then the writer records the new state; the records leave LMDB
  in small purge steps later. Both are allowed while a segment is still needed:
  replay and replication read the files.
- **remove** marks the request; segments are removed only while nothing still needs
  them, now or later: not the current segment, every replication destination has
  acknowledged all of their records (a disconnected destination keeps its last
  acknowledged position, saved in the journal, so it holds segments across restarts),
  and no bookmark replay is reading them. What cannot go yet stays marked (the mark is
  kept in the journal, across restarts) and goes as soon as the destinations catch up,
  like AMPS marking journal files for removal.

Queues will add their own "still needed" rule when they exist.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import lmdb
import trio

from amps_py import events, offload
from amps_py.errors import JournalMaintenanceError
from txlog import JournalError
from txlog.offline import segment_ids_text
from txlog.segments import Segment, wants_file

if TYPE_CHECKING:
    from .host import MaintenanceHost

log = logging.getLogger("amps_py.server.maintenance")

ACTIONS: Final = ("compress", "archive", "remove")
#: deletions per purge transaction: short enough that publishes barely wait for it
PURGE_STEP: Final = 2000
#: how often marked removals are retried and destination positions saved (seconds)
RECHECK_SECONDS: Final = 1.0
SAVE_POSITIONS_SECONDS: Final = 10.0
#: pause after a failed background step before trying again
RETRY_SECONDS: Final = 10.0


@dataclass
class MaintenanceResult:
    """What one request did.

    Attributes:
        action: compress, archive or remove.
        through: the newest segment id the request covers (0 when none qualified).
        done: segment ids whose state changed now.
        pending: for remove, segment ids marked but still needed (removed later).
        blockers: why the pending segments are still needed, in words.
    """

    action: str
    through: int
    done: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        past = {"compress": "compressed", "archive": "archived", "remove": "removed"}[self.action]
        if not self.through:
            return f"{self.action}: no sealed journal segment qualifies"
        text = f"{self.action} through journal {self.through}: " + (
            f"{past} {segment_ids_text(self.done)}" if self.done else f"nothing newly {past}"
        )
        if self.pending:
            text += f"; {segment_ids_text(self.pending)} marked, removed once no longer needed ("
            text += "; ".join(self.blockers) + ")"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "action": self.action,
            "through": self.through,
            "done": self.done,
            "pending": self.pending,
            "blockers": self.blockers,
            "summary": self.summary,
        }


class JournalMaintenance:
    """Runs an instance's journal maintenance; :meth:`run` is its background task."""

    def __init__(self, instance: MaintenanceHost) -> None:
        assert instance.journal is not None and instance.writer is not None
        self.instance = instance
        self.journal = instance.journal
        self.writer = instance.writer
        self._lock = trio.Lock()
        self._wake = trio.Event()
        #: remove requests not yet carried out (segment id; 0 = none); kept in the
        #: journal, so a restart keeps marked segments marked
        self.remove_through = self.journal.pending_removal()
        self._saved_positions = self.journal.destination_positions()
        self._last_save = 0.0
        self.counts = dict.fromkeys(ACTIONS, 0)
        #: background steps that failed (logged, retried)
        self.failures = 0

    # ------------------------------------------------------------ positions
    def destination_positions(self) -> dict[str, int]:
        """Per configured destination, the local txid it has acknowledged: the live
        value once it has connected since start, else the one saved in the journal
        (0, "needs everything", for a destination never seen)."""
        replication = self.instance.replication
        if replication is None:
            return {}
        positions: dict[str, int] = {}
        for dest in replication.destinations:
            name = dest.config.name
            if dest.resyncs:
                positions[name] = dest.acked_txid
            else:
                positions[name] = self._saved_positions.get(name, 0)
        return positions

    async def save_positions(self) -> dict[str, int]:
        positions = self.destination_positions()
        if positions != self._saved_positions:
            await self.writer.run_exclusive(
                lambda journal: journal.save_destination_positions(positions)
            )
            self._saved_positions = positions
        self._last_save = time.monotonic()
        return positions

    def removable_txid(self, positions: dict[str, int]) -> tuple[int, list[str]]:
        """The highest txid nothing needs any more, and what holds it there."""
        limit = self.instance.committed_txid
        reasons: list[tuple[int, str]] = []
        for name, acked in sorted(positions.items()):
            if acked < limit:
                reasons.append(
                    (acked, f"destination {name} has acknowledged through txid {acked} only")
                )
        for cursor in self.instance.active_replays.cursors():
            reasons.append((cursor, f"a bookmark replay is reading after txid {cursor}"))
        queues = self.instance.queues
        if queues is not None:
            # a queue sends what it holds from the journal: those records must stay
            for name, oldest in queues.oldest_txids().items():
                reasons.append(
                    (oldest - 1, f"queue {name} still holds a message from txid {oldest}")
                )
            # a start applies the records after a queue's checkpoint
            for name, covered in queues.checkpoint_txids().items():
                if covered < limit:
                    reasons.append(
                        (covered, f"the checkpoint of queue {name} covers txid {covered} only")
                    )
        for name, covered in self.instance.sow.checkpoint_txids().items():
            if covered < limit:
                reasons.append(
                    (covered, f"the SOW store of topic {name} covers txid {covered} only")
                )
        for txid, _ in reasons:
            limit = min(limit, txid)
        return limit, [why for txid, why in reasons if txid == limit]

    # ------------------------------------------------------------ requests
    def _target(self, through: int | None, older_than: float | None) -> int:
        """The newest segment id a request covers (0 when ``older_than`` finds none)."""
        segments = self.journal.segments()
        current = segments[-1].id if segments else 0
        if through is not None:
            known = {seg.id: seg for seg in segments}
            if through not in known:
                raise JournalMaintenanceError(
                    f"there is no journal {through}; `amps-py admin journals` lists them"
                )
            if through == current:
                raise JournalMaintenanceError(
                    f"journal {through} is the current one (new messages go there); only "
                    "sealed journals can be compressed, archived or removed"
                )
            return through
        if older_than is None:
            raise JournalMaintenanceError("give a journal id or an Age")
        cutoff_us = (time.time() - older_than) * 1e6
        sealed = [seg.id for seg in segments[:-1] if seg.last_ts < cutoff_us]
        return sealed[-1] if sealed else 0

    async def apply(
        self, action: str, *, through: int | None = None, older_than: float | None = None
    ) -> MaintenanceResult:
        """Compress, archive or remove journal ``through`` (or the newest sealed one
        older than ``older_than`` seconds) and every older one.

        Raises:
            JournalMaintenanceError: unknown action or journal, the current journal,
                no archive directory, or a damaged record in a segment to write.
        """
        if action not in ACTIONS:
            raise JournalMaintenanceError(
                f"unknown journal action {action!r}; use {', '.join(ACTIONS)}"
            )
        async with self._lock:
            target = self._target(through, older_than)
            result = MaintenanceResult(action, target)
            if not target:
                return result
            if action == "remove":
                if target > self.remove_through:
                    self.remove_through = target
                    await self.writer.run_exclusive(
                        lambda journal: journal.save_pending_removal(target)
                    )
                await self._remove_allowed(result)
            else:
                state = "compressed" if action == "compress" else "archived"
                for seg in self.journal.segments():
                    if seg.id > target:
                        break
                    if wants_file(seg, state):
                        await self._offload(seg, state)
                        result.done.append(seg.id)
            self.counts[action] += 1
        log.info(
            "journal maintenance: %s",
            result.summary,
            extra=events.extra(events.JOURNAL_MAINTENANCE),
        )
        self._wake.set()
        return result

    async def _offload(self, seg: Segment, state: str) -> None:
        path = await self._write_segment_file(seg, state)
        old = await self.writer.run_exclusive(
            lambda journal: journal.mark_offloaded(seg.id, state, path)
        )
        if old:
            # readers that still resolve the old file retry once and find the new one
            await offload.run_sync(lambda: Path(old).unlink(missing_ok=True))

    async def _write_segment_file(self, seg: Segment, state: str) -> Path:
        """The segment's file, written by ``python -m txlog.export`` in a process of
        its own: reading, CRC-checking and compressing a segment then runs on another
        core instead of taking the GIL from the event loop (publishes measured at a
        third of their rate while a thread did it)."""
        journal = self.journal
        if state == "archived" and journal.archive_directory is None:
            raise JournalMaintenanceError(
                f"journal {seg.id} cannot be archived: archiving needs an archive "
                "directory; set TransactionLog/JournalArchiveDirectory in the config"
            )
        command = [sys.executable, "-m", "txlog.export", str(journal.path), str(seg.id), state]
        if journal.archive_directory is not None:
            command.append(str(journal.archive_directory))
        done = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
            raise JournalMaintenanceError(f"journal {seg.id} cannot be {state}: {why}")
        return Path(done.stdout.decode().strip())

    async def _remove_allowed(self, result: MaintenanceResult | None = None) -> list[int]:
        """Remove the marked segments nothing needs any more; returns their ids."""
        positions = await self.save_positions()
        safe_txid, reasons = self.removable_txid(positions)
        segments = self.journal.segments()
        marked = [
            seg for seg in segments[:-1] if seg.id <= self.remove_through and seg.state != "removed"
        ]
        removable: list[Segment] = []
        for seg in marked:
            if seg.last_txid > safe_txid:
                break
            removable.append(seg)
        if removable:
            last_id = removable[-1].id
            await self.writer.run_exclusive(lambda journal: journal.mark_removed(last_id))
            log.info(
                "journal maintenance: removed %s",
                segment_ids_text([seg.id for seg in removable]),
                extra=events.extra(events.JOURNAL_MAINTENANCE),
            )
        pending = [seg.id for seg in marked[len(removable) :]]
        if not pending and self.remove_through:
            self.remove_through = 0
            await self.writer.run_exclusive(lambda journal: journal.save_pending_removal(0))
        if result is not None:
            result.done = [seg.id for seg in removable]
            result.pending = pending
            result.blockers = reasons if pending else []
        return [seg.id for seg in removable]

    def pending_removal(self) -> list[int]:
        return [
            seg.id
            for seg in self.journal.segments()[:-1]
            if seg.id <= self.remove_through and seg.state != "removed"
        ]

    # ------------------------------------------------------------ background
    async def run(self) -> None:
        """Finish purges, retry marked removals and save destination positions.

        A failing step (a file that cannot be deleted, a full disk) is logged and
        retried after :data:`RETRY_SECONDS`; it never stops the instance, whose
        journal stays consistent (each step is one transaction)."""
        while True:
            try:
                await self._step()
            except (OSError, JournalError, lmdb.Error) as exc:
                self.failures += 1
                log.error(
                    "journal maintenance failed, retrying in %g s: %s",
                    RETRY_SECONDS,
                    exc,
                    extra=events.extra(events.JOURNAL_MAINTENANCE_FAILED),
                )
                await trio.sleep(RETRY_SECONDS)

    async def _step(self) -> None:
        """One round of :meth:`run`: a purge step, or a removal retry, or a wait."""
        while True:
            if self.journal.purge_pending():
                await self.writer.run_staged(
                    lambda journal, on_staged: journal.purge_step(PURGE_STEP, on_staged)
                )
                await trio.lowlevel.checkpoint()
                continue
            if self.remove_through:
                async with self._lock:
                    await self._remove_allowed()
                if self.journal.purge_pending():
                    continue
            elif time.monotonic() - self._last_save >= SAVE_POSITIONS_SECONDS:
                await self.save_positions()
            self._wake = trio.Event()
            with trio.move_on_after(RECHECK_SECONDS):
                await self._wake.wait()
