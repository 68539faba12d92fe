"""Reading a journal: records wherever they are kept, and the indexes.

A record is in LMDB until its segment is compressed or archived (then in the segment
file) or removed (then gone). :meth:`RecordReader.scan` serves a txid range from both
places in one short read transaction; the :class:`~txlog.journal.Journal` read methods
(``read``, ``read_views``, ``read_route_views``, ``read_stored``, ``get``, ...) are built
on it. The index lookups (bookmarks, publishers and their removal floors, origins,
upstream cursors, the time index) are here too; the journal's methods of the same names
delegate to them.

Every read opens and closes its own transaction, from any thread, and checks the CRC
of each record it converts (the ``convert`` functions of :class:`txlog.record.RecordCodec`
do). This module reads the journal's LMDB environment and in-memory segment table; it
never writes.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

import lmdb

from .record import CorruptRecord, Record
from .segments import Segment, SegmentFile, SegmentFileError

if TYPE_CHECKING:
    from .journal import Journal

_T = TypeVar("_T")
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
_U64_MAX: Final = (1 << 64) - 1


class RecordReader:
    """The reads of one open journal (created by the journal); it also keeps the open
    segment files, shared by every reader thread."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._files: dict[str, SegmentFile] = {}
        self._files_lock = threading.Lock()

    # ------------------------------------------------------------------ records
    def scan(
        self,
        after_txid: int,
        limit: int,
        max_txid: int | None,
        convert: Callable[[bytes, int], _T],
    ) -> tuple[list[_T], CorruptRecord | None]:
        """``convert(value, txid)`` for up to ``limit`` records after ``after_txid``
        (and <= ``max_txid``), in one short read transaction. A damaged record ends the
        scan: the results before it are returned with the error.

        Records of compressed or archived segments are read from their segment files;
        removed segments are skipped. A segment file that went away meanwhile (archived
        elsewhere, or removed) is looked up again once in a fresh transaction.
        """
        try:
            return self._scan_once(after_txid, limit, max_txid, convert)
        except SegmentFileError:
            try:
                return self._scan_once(after_txid, limit, max_txid, convert)
            except SegmentFileError as exc:
                return [], CorruptRecord(None, str(exc))

    def _scan_once(
        self,
        after_txid: int,
        limit: int,
        max_txid: int | None,
        convert: Callable[[bytes, int], _T],
    ) -> tuple[list[_T], CorruptRecord | None]:
        j = self._journal
        out: list[_T] = []
        unpack = _U64.unpack
        stop = max_txid if max_txid is not None else _U64_MAX
        after_txid = max(after_txid, j._removed_through)
        pending = j._pending  # before the transaction: see txlog.pending
        staged = len(pending.values)
        seen = after_txid  # the newest txid read so far (or skipped as removed)
        with j._env.begin(buffers=False) as txn:
            cur = txn.cursor(db=j._records)
            while len(out) < limit and seen < stop:
                found = cur.set_range(_U64.pack(seen + 1))
                next_txid = unpack(cur.key())[0] if found else None
                if next_txid != seen + 1:
                    # not in LMDB: in a segment file, or removed
                    seg = self._offloaded_segment_after(txn, seen, next_txid)
                    if seg is not None:
                        pairs = self.segment_file(seg).after(
                            seen, min(seg.last_txid, stop), limit - len(out)
                        )
                        for txid, value in pairs:
                            try:
                                out.append(convert(value, txid))
                            except CorruptRecord as exc:
                                return out, exc
                        seen = pairs[-1][0] if pairs else seg.last_txid
                        continue
                    if not found:
                        break
                for key, value in cur:
                    txid = unpack(key)[0]
                    if txid > stop:
                        break
                    try:
                        out.append(convert(value, txid))
                    except CorruptRecord as exc:
                        return out, exc
                    seen = txid
                    if len(out) >= limit:
                        break
                break
        if staged and len(out) < limit and seen < stop:
            damage = pending.scan(seen, staged, limit, stop, convert, out)
            if damage is not None:
                return out, damage
        return out, None

    def _offloaded_segment_after(
        self, txn: lmdb.Transaction, after_txid: int, next_lmdb_txid: int | None
    ) -> Segment | None:
        """The compressed or archived segment (as ``txn`` sees the table) that holds
        the first record after ``after_txid``, if that record is not in LMDB."""
        j = self._journal
        if j._segments_db is None:
            return None
        # segment boundaries never change: the in-memory table finds the segment that
        # holds after_txid + 1, and the transaction's own rows say its state from there
        known = j._segments
        i = bisect.bisect_right(known, after_txid + 1, key=lambda s: s.first_txid) - 1
        start = known[i].id if i >= 0 else 1
        cursor = txn.cursor(db=j._segments_db)
        if not cursor.set_range(_U64.pack(start)):
            return None
        for key, value in cursor:
            seg = Segment.decode(_U64.unpack(key)[0], bytes(value))
            if seg.last_txid <= after_txid or seg.state == "removed":
                continue
            if next_lmdb_txid is not None and seg.first_txid >= next_lmdb_txid:
                return None
            if seg.offloaded:
                return seg
            if seg.state == "live":
                return None
        return None

    def segment_file(self, seg: Segment) -> SegmentFile:
        """The open reader of ``seg``'s file (opened on first use, then shared)."""
        path = self._journal.segment_path(seg)
        key = str(path)
        with self._files_lock:
            handle = self._files.get(key)
            if handle is None:
                handle = self._files[key] = SegmentFile(path)
            return handle

    def forget_file(self, path: str) -> None:
        """Drop the reader of the segment file at ``path`` (moved or deleted): the next
        read opens it afresh."""
        with self._files_lock:
            self._files.pop(path, None)

    def first_lmdb_record(self) -> Record | None:
        """The oldest record still in LMDB (not in a segment file), or None."""
        j = self._journal
        with j._env.begin(db=j._records) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            return j._codec.decode(cur.value(), _U64.unpack(cur.key())[0])

    # ------------------------------------------------------------------ indexes
    def lookup_bookmark(self, pub_hash: int, seq: int) -> int | None:
        """The local txid of the message with this bookmark, or None."""
        j = self._journal
        pending = j._pending  # before the transaction: see txlog.pending
        key = _U64x2.pack(pub_hash, seq)
        with j._env.begin(db=j._bookmarks) as txn:
            raw = txn.get(key)
        if raw is None:
            return pending.marks.get(key)
        return int(_U64.unpack(raw)[0])

    def publisher_last_seq(self, pub_hash: int) -> int:
        """The highest seq journaled for this publisher (0 if none)."""
        j = self._journal
        pending = j._pending  # before the transaction: see txlog.pending
        with j._env.begin(db=j._publishers) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        stored = int(_U64.unpack_from(raw)[0]) if raw else 0
        return max(stored, pending.pub_high.get(pub_hash, 0))

    def publisher_floor(self, pub_hash: int) -> int:
        """The highest seq of this publisher among removed records (0 if none): a
        bookmark at or below it is older than what the journal keeps."""
        j = self._journal
        if j._floors_db is None:
            return 0
        with j._env.begin(db=j._floors_db) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        return int(_U64.unpack_from(bytes(raw))[0]) if raw else 0

    def held_publishers(self) -> int:
        """How many publishers have records in the journal, from the bookmark index
        (one index search per publisher). Bookmarks of removed records leave the index
        as their removal is purged: until :meth:`Journal.removal_pending` is false,
        publishers whose every record was removed may still count."""
        j = self._journal
        count = 0
        with j._env.begin(db=j._bookmarks) as txn:
            cur = txn.cursor()
            found = cur.first()
            while found:
                count += 1
                pub_hash = _U64.unpack_from(cur.key())[0]
                if pub_hash == _U64_MAX:
                    break
                found = cur.set_range(_U64.pack(pub_hash + 1))
        return count

    def known_publishers(self) -> int:
        """How many publishers the journal holds a last seq for (the logon ack's
        source), including those whose records were all removed."""
        j = self._journal
        with j._env.begin() as txn:
            return int(txn.stat(j._publishers)["entries"])

    def origin_high_water(self) -> dict[str, int]:
        """Per origin instance, the highest origin txid stored here (resync)."""
        j = self._journal
        pending = j._pending  # before the transaction: see txlog.pending
        with j._env.begin(db=j._origins) as txn:
            found = {k.decode(): int(_U64.unpack(v)[0]) for k, v in txn.cursor()}
        for origin, otx in list(pending.origins.items()):
            if otx > found.get(origin, 0):
                found[origin] = otx
        return found

    def upstream_cursor(self, upstream: str) -> tuple[int, str]:
        """``(upstream txid, bookmark)`` of the replication stream from ``upstream``
        held here, or ``(0, "")`` when nothing was ever received from it."""
        j = self._journal
        pending = j._pending  # before the transaction: see txlog.pending
        with j._env.begin(db=j._upstreams) as txn:
            raw = txn.get(upstream.encode())
        staged = pending.cursors.get(upstream)
        if staged is not None:
            return staged
        if raw is None:
            return 0, ""
        return _U64.unpack_from(raw)[0], raw[8:].decode()

    def txid_before_time(self, ts_us: int) -> int:
        """The last txid whose local timestamp is certainly before ``ts_us``.

        Uses the sparse time index, then walks forward through records: replay from
        the returned txid (exclusive) starts with the first message at or after
        ``ts_us``.
        """
        j = self._journal
        with j._env.begin(db=j._times) as txn:
            cur = txn.cursor()
            start = 0
            if cur.set_range(_U64.pack(ts_us + 1)):
                if cur.prev():
                    start = _U64.unpack(cur.value())[0] - 1
            elif cur.last():
                start = _U64.unpack(cur.value())[0] - 1
        after = max(start, 0)
        while True:
            batch = j.read(after, 1024)
            if not batch:
                return after
            for rec in batch:
                if rec.local_ts >= ts_us:
                    return rec.txid - 1
            after = batch[-1].txid
