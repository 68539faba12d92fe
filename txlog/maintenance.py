"""Segment maintenance of a journal: segment files, state changes and the purge.

The writing side of the segment table (:mod:`txlog.segments`):

- :meth:`SegmentMaintenance.write_segment_file` writes the file a sealed segment needs
  to be compressed or archived (any thread; it only reads the journal);
- :meth:`~SegmentMaintenance.mark_offloaded` and :meth:`~SegmentMaintenance.mark_removed`
  record a state change of segments in the table;
- :meth:`~SegmentMaintenance.purge_step` then finishes its LMDB side in small
  transactions: the records leave LMDB, and for a removed segment its bookmark and
  time index entries and its file are deleted and its publishers' removal floors rise;
- the saved remove request and replication destination positions, which decide what
  may be removed, survive restarts in the journal.

Everything but :meth:`~SegmentMaintenance.write_segment_file` and the reads writes:
only the journal's single writer calls it, between appends. Callers use the
:class:`~txlog.journal.Journal` methods of the same names, which delegate here. This
module works on what the journal hands it: its LMDB environment
(:class:`txlog.environment.JournalEnv`), its shared in-memory state and segment table
(:class:`txlog.state.JournalState`), its reader and its commit; besides the writer
(:mod:`txlog.writing`), only the readers (:mod:`txlog.reading`,
:mod:`txlog.inspection`) touch them, and they never write.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

import lmdb

from .errors import JournalError
from .record import check_stored
from .segments import (
    Segment,
    SegmentFile,
    SegmentFileError,
    copy_segment_file,
    segment_file_name,
    write_segment_file,
)
from .state import unpack_u64 as unpack_u64  # re-exported

if TYPE_CHECKING:
    from .environment import JournalEnv
    from .reading import RecordReader
    from .state import JournalState

_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
_BOOKMARK_AT: Final = 16  # offset of (pub_hash, seq) in a stored record value
#: records between two calls of a tool's progress callback (verify, segment files)
PROGRESS_EVERY: Final = 4096


def reporting(
    values: Iterator[tuple[int, bytes]], progress: Callable[[int], None]
) -> Iterator[tuple[int, bytes]]:
    """``values`` as they are, calling ``progress`` with how many passed, every
    :data:`PROGRESS_EVERY` and at the end."""
    done = 0
    for item in values:
        yield item
        done += 1
        if done % PROGRESS_EVERY == 0:
            progress(done)
    progress(done)


class SegmentMaintenance:
    """The segment maintenance of one open journal (created by the journal)."""

    def __init__(
        self,
        env: JournalEnv,
        state: JournalState,
        reader: RecordReader,
        commit: Callable[[], None],
    ) -> None:
        self._env = env
        self._state = state
        self._reader = reader
        #: the journal's commit: LMDB takes what is staged before maintenance writes
        self._commit = commit
        #: removed segment id -> newest txid of its file whose bookmark entry is deleted
        self._purge_progress: dict[int, int] = {}

    # ------------------------------------------------------------ saved decisions
    def pending_removal(self) -> int:
        """The newest segment id a remove request still waits to remove (0: none)."""
        j = self._env
        with j.env.begin(db=j.meta) as txn:
            raw = txn.get(b"remove_through")
        return int(raw.decode()) if raw else 0

    def save_pending_removal(self, through_id: int) -> None:
        """Remember (writer only) that segments up to ``through_id`` are marked for
        removal, so a restart keeps the request; 0 clears it."""
        j = self._env
        self._commit()  # no staged transaction may be open beside this one
        with j.env.begin(write=True, db=j.meta) as txn:
            if through_id:
                txn.put(b"remove_through", str(through_id).encode())
            else:
                txn.delete(b"remove_through")

    def destination_positions(self) -> dict[str, int]:
        """Per replication destination, the txid it had acknowledged when last saved."""
        j = self._env
        if j.destinations_db is None:
            return {}
        with j.env.begin(db=j.destinations_db) as txn:
            return {k.decode(): _U64.unpack(v)[0] for k, v in txn.cursor()}

    def save_destination_positions(self, positions: Mapping[str, int]) -> None:
        """Replace the saved destination positions (writer only).

        Raises:
            JournalError: the journal was opened read-only.
        """
        j = self._env
        if j.destinations_db is None:
            raise JournalError("this journal was opened read-only")
        self._commit()  # no staged transaction may be open beside this one
        with j.env.begin(write=True, db=j.destinations_db) as txn:
            txn.drop(j.destinations_db, delete=False)
            for name, txid in positions.items():
                txn.put(name.encode(), _U64.pack(txid))

    # ------------------------------------------------------------ segment files
    def _segment_values(self, seg: Segment) -> Iterator[tuple[int, bytes]]:
        """``(txid, stored value)`` of every record of ``seg``, CRC-checked.

        Raises:
            CorruptRecord: a record of the segment is damaged.
        """

        def checked(value: bytes, txid: int) -> tuple[int, bytes]:
            check_stored(value, txid)
            return txid, value

        after = seg.first_txid - 1
        while after < seg.last_txid:
            batch, damage = self._reader.scan(after, 4096, seg.last_txid, checked)
            yield from batch
            if damage is not None:
                raise damage
            if not batch:
                return
            after = batch[-1][0]

    def write_segment_file(
        self, seg: Segment, state: str, progress: Callable[[int], None] | None = None
    ) -> Path:
        """Write (or copy) the segment file ``seg`` needs to enter ``state``
        (``compressed``: zstd file in the journal directory; ``archived``: file in the
        archive directory, compressed if the segment was). Any thread; reads only.
        ``progress``, when given, is called with the number of the segment's records
        written so far, every few thousand records.

        Raises:
            JournalError: archiving without an archive directory.
            CorruptRecord: a record of the segment is damaged (nothing is written).
        """
        j = self._env
        if state == "compressed":
            directory, compressed = j.path, True
        elif state == "archived":
            if j.archive_directory is None:
                raise JournalError(
                    "archiving journals needs an archive directory; set "
                    "TransactionLog/JournalArchiveDirectory in the config"
                )
            directory, compressed = j.archive_directory, seg.state == "compressed"
        else:
            raise JournalError(f"segments have no file in state {state!r}")
        target = directory / segment_file_name(j.instance_name, seg.id, compressed)
        if seg.offloaded and seg.file:
            source = j.segment_path(seg)
            if source.resolve() != target.resolve():
                copy_segment_file(source, target)
        else:
            values = self._segment_values(seg)
            if progress is not None:
                values = reporting(values, progress)
            written, _ = write_segment_file(target, values, compressed=compressed)
            if written != seg.records:
                target.unlink(missing_ok=True)
                raise JournalError(
                    f"journal segment {seg.id} should hold {seg.records} records but "
                    f"{written} were read for its file; nothing was written: check the "
                    "journal with `amps-py txlog verify`"
                )
        return target

    def _stored_name(self, file: Path) -> str:
        """How a segment file is recorded in the table (see
        :meth:`txlog.journal.Journal.segment_path`)."""
        resolved = file.resolve()
        if resolved.parent == self._env.path.resolve():
            return resolved.name
        return str(resolved)

    # ------------------------------------------------------------ state changes
    def _put_segment(self, txn: lmdb.Transaction, seg: Segment) -> None:
        txn.put(_U64.pack(seg.id), seg.encode(), db=self._env.segments_db)

    def _segment(self, seg_id: int) -> Segment:
        for seg in self._state.segments:
            if seg.id == seg_id:
                return seg
        raise JournalError(f"there is no journal segment {seg_id}")

    def mark_offloaded(self, seg_id: int, state: str, file: Path) -> str:
        """Record that segment ``seg_id`` is now ``state`` (compressed or archived) with
        its records in ``file`` (written by :meth:`write_segment_file`). Writer only.

        Returns the path of the segment's previous file when it is no longer used ("" if
        none): delete it once no reader can still have it open (readers retry on a
        missing file). The segment's records leave LMDB in later :meth:`purge_step`
        calls.
        """
        j = self._env
        seg = self._segment(seg_id)
        if seg.state not in ("live", "compressed", "archived"):
            raise JournalError(f"journal segment {seg_id} is {seg.state}")
        stored = self._stored_name(file)
        updated = replace(
            seg, state=state, cleaned=seg.cleaned and seg.state != "live", file=stored
        )
        self._commit()  # no staged transaction may be open beside this one
        with j.env.begin(write=True) as txn:
            self._put_segment(txn, updated)
        self._state.replace_segments({seg_id: updated})
        if not seg.file or seg.file == stored:
            return ""
        old = str(j.segment_path(seg))
        self._reader.forget_file(old)
        return old

    def mark_removed(self, through_id: int) -> list[Segment]:
        """Remove segment ``through_id`` and every older one (writer only): from now
        on no read returns their records; :meth:`purge_step` deletes them. Returns the
        segments newly removed."""
        j = self._env
        table = self._state.segments
        newly = [seg for seg in table if seg.id <= through_id and seg.state != "removed"]
        if not newly:
            return []
        if any(seg.id == table[-1].id for seg in newly):
            raise JournalError("the current journal segment cannot be removed")
        changed = {seg.id: replace(seg, state="removed", cleaned=False) for seg in newly}
        self._commit()  # no staged transaction may be open beside this one
        with j.env.begin(write=True) as txn:
            for seg in changed.values():
                self._put_segment(txn, seg)
        self._state.replace_segments(changed)
        return list(changed.values())

    # ------------------------------------------------------------ purge
    def purge_pending(self) -> bool:
        """Whether some segment still has LMDB records, index entries or a file to
        delete after a state change (see :meth:`purge_step`)."""
        return any(not seg.cleaned for seg in self._state.segments)

    def purge_step(
        self, max_records: int = 10_000, on_staged: Callable[[], None] | None = None
    ) -> bool:
        """Do up to ``max_records`` deletions of the oldest unfinished state change, in
        one transaction (writer only); returns whether work remains.

        Compressed or archived segment: its records leave LMDB (they are in the file).
        Removed segment: its records, their bookmark index entries, its time index
        entries and its file are deleted. ``on_staged`` is called just before the
        commit, as in :meth:`txlog.journal.Journal.append`.
        """
        j = self._env
        seg = next((s for s in self._state.segments if not s.cleaned), None)
        if seg is None:
            return False
        lo, hi = _U64.pack(seg.first_txid), seg.last_txid
        unpack = _U64.unpack
        removing = seg.state == "removed"
        done = False
        file_to_delete = ""
        floors: dict[int, int] = {}
        raised: dict[int, int] = {}
        self._commit()  # no staged transaction may be open beside this one
        with j.env.begin(write=True) as txn:
            cur = txn.cursor(db=j.records)
            deleted = 0
            if cur.set_range(lo):
                while deleted < max_records:
                    key = cur.key()
                    if not key:  # deleted the last record: the cursor is past the end
                        break
                    txid = unpack(key)[0]
                    if txid > hi:
                        break
                    if removing:
                        self._delete_bookmark(txn, cur.value(), txid, floors)
                    deleted += 1
                    if not cur.delete():
                        break
            if deleted < max_records and removing and seg.file:
                # bookmarks of records that live only in the file
                after = self._purge_progress.get(seg.id, seg.first_txid - 1)
                try:
                    pairs = SegmentFile(j.segment_path(seg)).after(
                        after, seg.last_txid, max_records - deleted
                    )
                except SegmentFileError:
                    pairs = []  # already gone: its index entries cannot be found either
                for txid, value in pairs:
                    self._delete_bookmark(txn, value, txid, floors)
                self._purge_progress[seg.id] = pairs[-1][0] if pairs else seg.last_txid
                deleted += len(pairs)
            if deleted < max_records:
                if removing:
                    times = txn.cursor(db=j.times)
                    while times.first() and unpack(times.value())[0] <= seg.last_txid:
                        times.delete()
                    file_to_delete = str(j.segment_path(seg)) if seg.file else ""
                done = True
                finished = replace(seg, cleaned=True, file="" if removing else seg.file)
                self._put_segment(txn, finished)
            if floors:
                raised = self._raise_floors(txn, floors)
            if on_staged is not None:
                on_staged()
        self._state.floor_cache.update(raised)
        if done:
            self._state.replace_segments({seg.id: finished})
            self._purge_progress.pop(seg.id, None)
            if file_to_delete:
                self._reader.forget_file(file_to_delete)
                Path(file_to_delete).unlink(missing_ok=True)
        return self.purge_pending()

    def _delete_bookmark(
        self, txn: lmdb.Transaction, value: bytes, txid: int, floors: dict[int, int]
    ) -> None:
        """Delete a removed record's bookmark entry and raise its publisher's floor
        in ``floors`` (written at the end of the purge step)."""
        if len(value) < _BOOKMARK_AT + 16:
            return
        key = bytes(memoryview(value)[_BOOKMARK_AT : _BOOKMARK_AT + 16])
        pub_hash, seq = _U64x2.unpack(key)
        if seq > floors.get(pub_hash, 0):
            floors[pub_hash] = seq
        bookmarks = self._env.bookmarks
        stored = txn.get(key, db=bookmarks)
        if stored is not None and unpack_u64(bytes(stored)) == txid:
            txn.delete(key, db=bookmarks)

    def _raise_floors(self, txn: lmdb.Transaction, floors: dict[int, int]) -> dict[int, int]:
        """Store the floors of ``floors`` that are higher than the stored ones; returns
        those (for the journal's cache, once committed)."""
        j = self._env
        floor = self._state.floor
        raised = {ph: seq for ph, seq in floors.items() if seq > floor(txn, j.floors_db, ph)}
        for pub_hash, seq in raised.items():
            txn.put(_U64.pack(pub_hash), _U64.pack(seq), db=j.floors_db)
        return raised
