"""The staged tail of a journal: records durable in the commit log that LMDB has not
committed yet, as every read of the journal must see them.

The writer adds a batch once its commit log frame is synced, and replaces the whole tail
with an empty one after each LMDB commit (a reader keeps the object it took, which is
never changed again). The writer also looks up what is staged here: whether a bookmark
is stored, and a publisher's highest seq. Readers take
:attr:`txlog.state.JournalState.pending` *before* they open their LMDB read transaction:
whatever the tail they took lacks, because an LMDB commit came between, their
transaction sees. Values are appended before the index entries that point at them, so an
entry a reader finds always has its value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from .record import CorruptRecord

if TYPE_CHECKING:
    from .record import Record

_T = TypeVar("_T")


class PendingTail:
    """Staged records from ``first_txid`` on, and their index entries."""

    __slots__ = ("cursors", "first_txid", "marks", "origins", "pub_high", "values")

    def __init__(self, first_txid: int) -> None:
        self.first_txid = first_txid
        #: stored values of txids first_txid, first_txid + 1, ...
        self.values: list[bytes] = []
        #: bookmark key (pub_hash, seq) -> txid
        self.marks: dict[bytes, int] = {}
        #: publisher -> highest seq staged
        self.pub_high: dict[int, int] = {}
        #: origin instance -> highest origin txid staged
        self.origins: dict[str, int] = {}
        #: upstream -> (upstream txid, bookmark), the newest staged
        self.cursors: dict[str, tuple[int, str]] = {}

    def add(
        self,
        first_txid: int,
        values: Sequence[bytes],
        marks: Mapping[bytes, int],
        pub_updates: Mapping[int, Record],
        origin_updates: Mapping[str, int],
        cursors: Mapping[str, tuple[int, str]] | None,
    ) -> None:
        """A batch whose commit log frame is synced (the writer only)."""
        if values and first_txid != self.first_txid + len(self.values):
            raise AssertionError(
                f"staged batch at txid {first_txid} does not follow the staged tail "
                f"({self.first_txid}+{len(self.values)})"
            )
        self.values.extend(values)
        self.marks.update(marks)
        for ph, rec in pub_updates.items():
            self.pub_high[ph] = rec.seq
        for origin, otx in origin_updates.items():
            if otx > self.origins.get(origin, 0):
                self.origins[origin] = otx
        if cursors:
            self.cursors.update(cursors)

    def scan(
        self,
        after_txid: int,
        count: int,
        limit: int,
        stop: int,
        convert: Callable[[bytes, int], _T],
        out: list[_T],
    ) -> CorruptRecord | None:
        """Append ``convert(value, txid)`` to ``out`` for the staged txids after
        ``after_txid`` among the first ``count`` (the reader's snapshot), up to
        ``stop`` and until ``out`` holds ``limit``; a damaged value ends it."""
        first = self.first_txid
        for index in range(max(after_txid + 1 - first, 0), count):
            txid = first + index
            if txid > stop or len(out) >= limit:
                break
            try:
                out.append(convert(self.values[index], txid))
            except CorruptRecord as exc:
                return exc
        return None
