"""The in-memory state of an open journal that its parts share.

:class:`JournalState` is owned by :class:`txlog.journal.Journal` and handed to its
readers (:mod:`txlog.reading`, :mod:`txlog.inspection`), its segment maintenance
(:mod:`txlog.maintenance`) and its writer (:mod:`txlog.writing`). Contract:

- Only the journal's single writer changes it (the writer, recovery at open, segment
  maintenance); readers on any thread only read it.
- :attr:`JournalState.segments` and :attr:`JournalState.pending` are replaced, never
  changed in place once published, so a reader that took one keeps a consistent
  object (a reader takes ``pending`` *before* its LMDB read transaction: see
  :mod:`txlog.pending`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import lmdb

from .pending import PendingTail
from .segments import Segment, removed_through

_U64 = struct.Struct(">Q")


def unpack_u64(raw: bytes) -> int:
    """The big-endian u64 at the start of ``raw``."""
    return int(_U64.unpack_from(raw)[0])


class JournalState:
    """What an open journal knows in memory besides LMDB (see the module doc)."""

    __slots__ = (
        "appended",
        "commits",
        "duplicates",
        "floor_cache",
        "holdings_valid",
        "last_txid",
        "pending",
        "removed_through",
        "segments",
    )

    def __init__(self, last_txid: int) -> None:
        #: the txid of the newest record stored (0 for an empty journal)
        self.last_txid = last_txid
        #: the segment table, oldest first; replaced (never changed in place) on change
        self.segments: list[Segment] = []
        #: the newest txid of a removed segment (0: none): reads start after it
        self.removed_through = 0
        #: the staged records LMDB has not committed yet (see :mod:`txlog.pending`)
        self.pending = PendingTail(1)
        #: whether the ``holdings`` index accounts for every record
        self.holdings_valid = False
        #: publisher -> removal floor, as far as looked up (see :meth:`floor`)
        self.floor_cache: dict[int, int] = {}
        #: this process's stored batches, stored records and duplicates
        self.commits = 0
        self.appended = 0
        self.duplicates = 0

    def replace_segments(self, changed: Mapping[int, Segment]) -> None:
        """Swap in changed rows of the segment table (segment maintenance)."""
        self.segments = [changed.get(seg.id, seg) for seg in self.segments]
        self.removed_through = removed_through(self.segments)

    def floor(self, txn: lmdb.Transaction, floors_db: lmdb._Database | None, pub_hash: int) -> int:
        """The highest seq of ``pub_hash`` among removed records (0 if none), from the
        cache or ``floors_db`` as ``txn`` sees it (then cached)."""
        floor = self.floor_cache.get(pub_hash)
        if floor is None:
            raw = txn.get(_U64.pack(pub_hash), db=floors_db) if floors_db else None
            floor = self.floor_cache[pub_hash] = unpack_u64(bytes(raw)) if raw else 0
        return floor
