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
do). This module reads what the journal hands it, its LMDB environment
(:class:`txlog.environment.JournalEnv`) and its shared in-memory state and segment table
(:class:`txlog.state.JournalState`); it never writes.

Damaged LMDB pages: every read finds each record by a search (``set_range`` of the next
txid), never by LMDB's step to the next page: a step onto a damaged page can fail an
LMDB assertion, which aborts the process, while a search reports ``MDB_CORRUPTED``
(LMDB searches the cursor's current page first, so a search costs little more than a
step). Whatever LMDB reports of damage while reading becomes
:class:`~txlog.record.UnreadableRecords`, a :class:`~txlog.record.CorruptRecord` naming
the txid range that does not read (found by probing where reading resumes): the records
before it are returned, like those before a record that fails its CRC, and no raw
``lmdb`` error leaves a read.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final, TypeVar

import lmdb

from .holdings import (
    NOTHING_READ,
    Bucket,
    Holdings,
    OriginHoldings,
    decode_bucket,
    decode_origin,
    next_origin_key,
    origin_key,
    split_key,
)
from .opening import LMDB_READ_DAMAGE_ERRORS
from .record import (
    CorruptRecord,
    Record,
    StoredRecords,
    UnreadableRecords,
    check_stored_records,
)
from .segments import Segment, SegmentFile, SegmentFileError

if TYPE_CHECKING:
    from .environment import JournalEnv
    from .state import JournalState

_T = TypeVar("_T")
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")
_U64_MAX: Final = (1 << 64) - 1


def _stored_pair(value: bytes, txid: int) -> tuple[int, bytes]:
    return txid, value


class RecordReader:
    """The reads of one open journal (created by the journal); it also keeps the open
    segment files, shared by every reader thread."""

    def __init__(self, env: JournalEnv, state: JournalState) -> None:
        self._env = env
        self._state = state
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
        j = self._env
        out: list[_T] = []
        unpack = _U64.unpack
        pack = _U64.pack
        stop = max_txid if max_txid is not None else _U64_MAX
        after_txid = max(after_txid, self._state.removed_through)
        pending = self._state.pending  # before the transaction: see txlog.pending
        staged = len(pending.values)
        seen = after_txid  # the newest txid read so far (or skipped as removed)
        damage: lmdb.Error | None = None
        with j.env.begin(buffers=False) as txn:
            cur = txn.cursor(db=j.records)
            get, set_range, key, value = cur.get, cur.set_range, cur.key, cur.value
            try:
                while len(out) < limit and seen < stop:
                    # searches for the next record, never a step (see the module doc)
                    stored = get(pack(seen + 1))
                    if stored is not None:
                        try:
                            out.append(convert(stored, seen + 1))
                        except CorruptRecord as exc:
                            return out, exc
                        seen += 1
                        continue
                    # not in LMDB: in a segment file, removed, or after a gap
                    if set_range(pack(seen + 1)):
                        raw = key()
                        if len(raw) != 8:
                            raise lmdb.CorruptedError(f"a record key of {len(raw)} bytes")
                        next_txid: int | None = unpack(raw)[0]
                    else:
                        next_txid = None
                    seg = self._offloaded_segment_after(txn, seen, next_txid)
                    if seg is not None:
                        pairs = self.segment_file(seg).after(
                            seen, min(seg.last_txid, stop), limit - len(out)
                        )
                        for txid, stored in pairs:
                            try:
                                out.append(convert(stored, txid))
                            except CorruptRecord as exc:
                                return out, exc
                        seen = pairs[-1][0] if pairs else seg.last_txid
                        continue
                    if next_txid is None or next_txid > stop:
                        break
                    if next_txid <= seen:  # a damaged page LMDB did not notice
                        raise lmdb.CorruptedError(
                            f"a search after txid {seen} found txid {next_txid}"
                        )
                    try:
                        out.append(convert(value(), next_txid))
                    except CorruptRecord as exc:
                        return out, exc
                    seen = next_txid
            except LMDB_READ_DAMAGE_ERRORS as exc:
                damage = exc
        if damage is not None:
            return out, self.unreadable(seen + 1, damage)
        if staged and len(out) < limit and seen < stop:
            found_damage = pending.scan(seen, staged, limit, stop, convert, out)
            if found_damage is not None:
                return out, found_damage
        return out, None

    def unreadable(self, first: int, exc: lmdb.Error) -> UnreadableRecords:
        """LMDB reported ``exc`` (damage) where a read looked for txid ``first``: the
        range that does not read, from ``first`` to just before where reading resumes
        (:func:`readable_from`)."""
        resume = readable_from(self._env, self._state, first)
        return UnreadableRecords(first, None if resume is None else resume - 1, str(exc))

    def _offloaded_segment_after(
        self, txn: lmdb.Transaction, after_txid: int, next_lmdb_txid: int | None
    ) -> Segment | None:
        """The compressed or archived segment (as ``txn`` sees the table) that holds
        the first record after ``after_txid``, if that record is not in LMDB."""
        j = self._env
        if j.segments_db is None:
            return None
        # segment boundaries never change: the in-memory table finds the segment that
        # holds after_txid + 1, and the transaction's own rows say its state from there
        known = self._state.segments
        i = bisect.bisect_right(known, after_txid + 1, key=lambda s: s.first_txid) - 1
        start = known[i].id if i >= 0 else 1
        cursor = txn.cursor(db=j.segments_db)
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
        path = self._env.segment_path(seg)
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
        j = self._env
        try:
            with j.env.begin(db=j.records) as txn:
                cur = txn.cursor()
                if not cur.first():
                    return None
                txid = _txid_of(cur.key())
                value = bytes(cur.value())
        except LMDB_READ_DAMAGE_ERRORS as exc:
            raise self.unreadable(self._state.removed_through + 1, exc) from None
        return j.codec.decode(value, txid)

    def get(self, txid: int) -> bytes | None:
        """The stored value of record ``txid`` if LMDB holds it (else None: in a segment
        file, removed, or not written).

        Raises:
            UnreadableRecords: LMDB reports a damaged page on the way to it.
        """
        j = self._env
        try:
            with j.env.begin(db=j.records, buffers=False) as txn:
                return txn.get(_U64.pack(txid))
        except LMDB_READ_DAMAGE_ERRORS as exc:
            raise self.unreadable(txid, exc) from None

    def read(self, after_txid: int, limit: int, max_txid: int | None = None) -> list[Record]:
        """See :meth:`txlog.journal.Journal.read`."""
        out, damage = self.scan(after_txid, limit, max_txid, self._env.codec.decode)
        if damage is not None:
            raise damage
        return out

    def read_stored(
        self, after_txid: int, limit: int, max_txid: int | None = None
    ) -> StoredRecords:
        """See :meth:`txlog.journal.Journal.read_stored`."""
        pairs, damage = self.scan(after_txid, limit, max_txid, _stored_pair)
        stored = check_stored_records(pairs)
        if damage is not None:
            raise damage
        return stored

    def record(self, txid: int) -> Record | None:
        """See :meth:`txlog.journal.Journal.get`."""
        if txid <= self._state.removed_through:
            return None
        codec = self._env.codec
        value = self.get(txid)
        if value is not None:
            return codec.decode(value, txid)
        found, damage = self.scan(txid - 1, 1, txid, codec.decode)
        if damage is not None:
            raise damage
        return found[0] if found else None

    def first_txid(self) -> int:
        """See :meth:`txlog.journal.Journal.first_txid`."""
        found, _ = self.scan(0, 1, None, lambda _value, txid: txid)
        return found[0] if found else 0

    # ------------------------------------------------------------------ indexes
    def lookup_bookmark(self, pub_hash: int, seq: int) -> int | None:
        """The local txid of the message with this bookmark, or None."""
        j = self._env
        pending = self._state.pending  # before the transaction: see txlog.pending
        key = _U64x2.pack(pub_hash, seq)
        with _Index("bookmarks"), j.env.begin(db=j.bookmarks) as txn:
            raw = txn.get(key)
        if raw is None:
            return pending.marks.get(key)
        return int(_U64.unpack(raw)[0])

    def publisher_last_seq(self, pub_hash: int) -> int:
        """The highest seq journaled for this publisher (0 if none)."""
        j = self._env
        pending = self._state.pending  # before the transaction: see txlog.pending
        with _Index("publishers"), j.env.begin(db=j.publishers) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        stored = int(_U64.unpack_from(raw)[0]) if raw else 0
        return max(stored, pending.pub_high.get(pub_hash, 0))

    def publisher_floor(self, pub_hash: int) -> int:
        """The highest seq of this publisher among removed records (0 if none): a
        bookmark at or below it is older than what the journal keeps."""
        j = self._env
        if j.floors_db is None:
            return 0
        with _Index("floors"), j.env.begin(db=j.floors_db) as txn:
            raw = txn.get(_U64.pack(pub_hash))
        return int(_U64.unpack_from(bytes(raw))[0]) if raw else 0

    def held_publishers(self) -> int:
        """How many publishers have records in the journal, from the bookmark index
        (one index search per publisher). Bookmarks of removed records leave the index
        as their removal is purged: until :meth:`Journal.removal_pending` is false,
        publishers whose every record was removed may still count."""
        j = self._env
        count = 0
        with _Index("bookmarks"), j.env.begin(db=j.bookmarks) as txn:
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
        j = self._env
        with _Index("publishers"), j.env.begin() as txn:
            return int(txn.stat(j.publishers)["entries"])

    def origin_high_water(self) -> dict[str, int]:
        """Per origin instance, the highest origin txid stored here (resync)."""
        j = self._env
        pending = self._state.pending  # before the transaction: see txlog.pending
        with _Index("origins"), j.env.begin(db=j.origins) as txn:
            found = {k.decode(): int(_U64.unpack(v)[0]) for k, v in txn.cursor()}
        for origin, otx in list(pending.origins.items()):
            if otx > found.get(origin, 0):
                found[origin] = otx
        return found

    def holdings(
        self,
        origins: Iterable[str] | None = None,
        buckets: int = 0,
        down_to: Mapping[str, int] | None = None,
    ) -> Holdings | None:
        """What the journal holds of each origin (see :mod:`txlog.holdings`), as of
        the newest txid LMDB has committed (staged records do not count yet), read in
        one transaction; ``None`` when the journal does not keep holdings
        (:attr:`Journal.holdings_valid`).

        Args:
            origins: the origins wanted (None: every origin held); one not held is
                left out.
            buckets: per origin, read up to this many of its highest buckets into
                :attr:`OriginHoldings.top` (0: none).
            down_to: per origin, read its buckets from the highest down to this bucket
                number instead, however many (what must be compared costs at most one
                entry per 1,024 origin txids above it).

        Raises:
            UnreadableRecords: LMDB reports a damaged page in the index.
        """
        j = self._env
        db = j.holdings_db
        if not self._state.holdings_valid or db is None:
            return None
        found: dict[str, OriginHoldings] = {}
        floors = down_to or {}
        try:
            with _Index("holdings"), j.env.begin(db=db) as txn:
                raw = txn.get(b"holdings_through", db=j.meta)
                through = int(_U64.unpack(raw)[0]) if raw is not None else 0
                cur = txn.cursor()
                names = list(origins) if origins is not None else None
                if names is None:  # every summary: one search per origin
                    names = []
                    found_key = cur.first()
                    while found_key:
                        origin, index = split_key(cur.key())
                        if index is None:
                            names.append(origin)
                        found_key = cur.set_range(next_origin_key(origin))
                for origin in names:
                    value = txn.get(origin_key(origin))
                    if value is None:
                        continue
                    held = decode_origin(origin, bytes(value))
                    floor = floors.get(origin)
                    if floor is not None:
                        held = self._top_buckets(cur, held, NOTHING_READ, floor)
                    elif buckets > 0:
                        held = self._top_buckets(cur, held, buckets, 0)
                    found[origin] = held
        except (ValueError, struct.error) as exc:  # a key or value of the wrong shape
            raise UnreadableRecords(None, None, str(exc), "holdings") from None
        return Holdings(through, found)

    @staticmethod
    def _top_buckets(
        cur: lmdb.Cursor, held: OriginHoldings, limit: int, floor: int
    ) -> OriginHoldings:
        """``held`` with its highest buckets, down to bucket ``floor`` or ``limit`` of
        them, whichever comes first (stepping back through a small index, as the origins
        index does)."""
        top: list[Bucket] = []
        origin = held.origin
        ok = cur.set_range(next_origin_key(origin))
        ok = cur.prev() if ok else cur.last()
        reached = 0  # every bucket at or above it is read
        while ok:
            name, index = split_key(cur.key())
            if name != origin or index is None:
                break
            if index < floor:
                reached = floor
                break
            if len(top) == limit:
                reached = top[-1].index if top else NOTHING_READ
                break
            top.append(decode_bucket(index, bytes(cur.value())))
            ok = cur.prev()
        return OriginHoldings(
            held.origin, held.first_txid, held.high, held.total, tuple(top), reached
        )

    def upstream_cursor(self, upstream: str) -> tuple[int, str]:
        """``(upstream txid, bookmark)`` of the replication stream from ``upstream``
        held here, or ``(0, "")`` when nothing was ever received from it."""
        j = self._env
        pending = self._state.pending  # before the transaction: see txlog.pending
        with _Index("upstreams"), j.env.begin(db=j.upstreams) as txn:
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
        j = self._env
        with _Index("times"), j.env.begin(db=j.times) as txn:
            cur = txn.cursor()
            start = 0
            if cur.set_range(_U64.pack(ts_us + 1)):
                if cur.prev():
                    start = _U64.unpack(cur.value())[0] - 1
            elif cur.last():
                start = _U64.unpack(cur.value())[0] - 1
        after = max(start, 0)
        while True:
            batch = self.read(after, 1024)
            if not batch:
                return after
            for rec in batch:
                if rec.local_ts >= ts_us:
                    return rec.txid - 1
            after = batch[-1].txid


class EarliestAbove:
    """A search of the bookmark index for the earliest record (lowest txid) the
    journal holds of publisher ``pub_hash`` with a seq above ``seq``, in bounded steps.

    Why a search: a publisher's records need not arrive in seq order (a failover
    publisher sends new seqs, then resends its older tail; replication interleaves
    them), so the record with the smallest seq above ``seq`` may have a later txid
    than one with a larger seq. The index is ordered by (publisher, seq), not txid:
    the answer is the minimum txid over every entry of the publisher above ``seq``.

    Contract:

    - Each :meth:`step` reads at most ``max_entries`` index entries (one search each,
      never a step to the next page: see the module doc) in one short read
      transaction, so a caller on an event loop can interleave other work.
    - Cost: the publisher's index entries above ``seq`` (one search each) plus one
      search per :meth:`step` that finds the end, and once, at the end, the journal's
      staged tail (what LMDB has not committed yet, a bounded amount); never the
      entries at or below ``seq`` nor those of other publishers, so it does not grow
      with the journal's length. :attr:`entries_read` counts the index entries.
    - Only records at or below ``through_txid`` and not removed count: the caller
      delivers every later record anyway (it replays or fans out everything after
      ``through_txid``). Every record at or below ``through_txid`` is in LMDB or in
      the staged tail taken when the search began (taken first: see
      :mod:`txlog.pending`), so none is missed whatever commits happen between steps.
    - :attr:`earliest` is the lowest such txid found so far (None: none yet); once
      :attr:`done`, the lowest there is.

    Raises (from :meth:`step`):
        UnreadableRecords: LMDB reports a damaged page of the bookmark index.
    """

    __slots__ = (
        "_after",
        "_env",
        "_pending",
        "_state",
        "done",
        "earliest",
        "entries_read",
        "pub_hash",
        "seq",
        "through_txid",
    )

    def __init__(
        self, env: JournalEnv, state: JournalState, pub_hash: int, seq: int, through_txid: int
    ) -> None:
        self._env = env
        self._state = state
        self._pending = state.pending  # before any transaction: see txlog.pending
        self.pub_hash = pub_hash
        self.seq = seq
        self.through_txid = through_txid
        self.earliest: int | None = None
        self.entries_read = 0
        self.done = seq >= _U64_MAX
        self._after = seq  # the highest seq examined so far

    def _found(self, txid: int) -> None:
        held = self._state.removed_through < txid <= self.through_txid
        if held and (self.earliest is None or txid < self.earliest):
            self.earliest = txid

    def step(self, max_entries: int) -> bool:
        """Read up to ``max_entries`` more index entries (at least one); True once
        the search is over (then :attr:`earliest` is final)."""
        if self.done:
            return True
        j = self._env
        pack, unpack = _U64x2.pack, _U64x2.unpack
        ph = self.pub_hash
        after = self._after
        read = 0
        ended = False
        with _Index("bookmarks"), j.env.begin(db=j.bookmarks) as txn:
            cur = txn.cursor()
            set_range, key, value = cur.set_range, cur.key, cur.value
            while read < max(max_entries, 1):
                # a search for the next entry of this publisher, never a step
                if after >= _U64_MAX or not set_range(pack(ph, after + 1)):
                    ended = True
                    break
                raw = key()
                if len(raw) != 16:
                    raise lmdb.CorruptedError(f"a bookmark key of {len(raw)} bytes")
                found_ph, found_seq = unpack(raw)
                if found_ph != ph:
                    ended = True
                    break
                if found_seq <= after:  # a damaged page LMDB did not notice
                    raise lmdb.CorruptedError(
                        f"a search after seq {after} of publisher {ph} found seq {found_seq}"
                    )
                read += 1
                after = found_seq
                self._found(int(_U64.unpack(value())[0]))
        self._after = after
        self.entries_read += read
        if ended:
            self._staged()
            self.done = True
        return self.done

    def _staged(self) -> None:
        """The staged tail taken when the search began: entries LMDB lacked then."""
        unpack = _U64x2.unpack
        for key, txid in list(self._pending.marks.items()):
            found_ph, found_seq = unpack(key)
            if found_ph == self.pub_hash and found_seq > self.seq:
                self._found(txid)

    def __repr__(self) -> str:
        return (
            f"EarliestAbove(publisher {self.pub_hash} above seq {self.seq}: "
            f"earliest {self.earliest}, {self.entries_read} entries, done={self.done})"
        )


class _Index:
    """``with _Index(name):`` around a read of the journal's ``name`` index: LMDB's
    report of a damaged page there leaves as :class:`UnreadableRecords` naming the
    index (a class, not a generator: index lookups are on the publish path)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if exc is not None and isinstance(exc, LMDB_READ_DAMAGE_ERRORS):
            raise UnreadableRecords(None, None, str(exc), self._name) from None


def _txid_of(key: bytes) -> int:
    """The txid a records key holds.

    Raises:
        lmdb.CorruptedError: the key is not 8 bytes (a damaged page).
    """
    if len(key) != 8:
        raise lmdb.CorruptedError(f"a record key of {len(key)} bytes")
    return int(_U64.unpack(key)[0])


def readable_from(env: JournalEnv, state: JournalState, damaged: int) -> int | None:
    """The lowest txid above ``damaged`` (which a search did not reach) from which LMDB
    reads again: records from there on are on sound pages. None when nothing after it
    reads. A binary search of probes, each in its own read transaction (an LMDB error
    spoils the one it happens in)."""

    def reads(txid: int) -> bool:
        try:
            with env.env.begin(db=env.records) as txn:
                txn.cursor().set_range(_U64.pack(txid))
        except LMDB_READ_DAMAGE_ERRORS:
            return False
        return True

    lo, hi = damaged, max(state.last_txid, damaged) + 1  # lo does not read
    if not reads(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reads(mid):
            hi = mid
        else:
            lo = mid
    return hi
