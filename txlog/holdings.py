"""What a journal holds of each origin instance, in a form two journals can compare
without reading a record: the fingerprints behind a replication resync without a
cursor (``amps_py.replication.exchange``). Pure: no LMDB here (the journal stores
what this module computes, in its ``holdings`` database).

Every stored record counts under its origin instance (the instance that journaled it
first) and the *bucket* of its origin txid (``origin_txid >> BUCKET_BITS``; a record
first journaled here has origin txid = its txid). Per (origin, bucket) the journal
keeps the lowest local txid holding such a record and a :class:`Fingerprint` of their
bookmarks; per origin, the lowest local txid of any of its records, the highest origin
txid and the fingerprint of all of them.

Contract:

- A fingerprint covers the records ever stored: removing journals subtracts nothing,
  so a journal that removed old records still matches one that kept them (a record
  removed here is a duplicate if it arrives again: the publisher's removal floor).
- A :class:`Fingerprint` is the count of the bookmarks, and the sums modulo 2**64 of
  their CRC-32 (of the 16-byte bookmark key: publisher hash and seq, big-endian) and of
  its square. Equal fingerprints of two sets of bookmarks mean equal sets unless the
  sums coincide: never when the sets differ by one or two bookmarks each way whose
  CRC-32s differ (two seqs of one publisher less than 2**32 apart never share one),
  otherwise by a coincidence of two 64-bit sums. The bookmark is what the journal's
  duplicate detection compares, so "holds the same bookmarks" is "would store none of
  them again".
- The sums are over bookmarks, not positions: an origin whose journal was started
  again (its txids reused by other records) does not match what a peer kept of its
  previous journal.
- Buckets and origins are few (one entry per 1,024 origin txids per origin): reading
  them costs what the live state costs, never a scan of records.
"""

from __future__ import annotations

import hashlib
import operator
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

#: a bucket holds the records of one origin whose origin txids share all bits above these
BUCKET_BITS: Final = 10
_MASK: Final = (1 << 64) - 1
_U64 = struct.Struct(">Q")
_BUCKET_VALUE = struct.Struct(">QQQQ")  # first txid, count, sum, sum of squares
_ORIGIN_VALUE = struct.Struct(">QQQQQ")  # first txid, high, count, sum, sum of squares
#: separates the origin name from the bucket in a key (names hold no control character)
_SEP: Final = b"\x00"
#: :attr:`OriginHoldings.floor` when no bucket was read
NOTHING_READ: Final = 1 << 64
_bookmark_of = operator.itemgetter(0)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """How many bookmarks, and the sums (mod 2**64) of their CRC-32 and its square."""

    count: int = 0
    total: int = 0
    squares: int = 0

    @classmethod
    def of(cls, bookmark_keys: Iterable[bytes]) -> Fingerprint:
        """The fingerprint of these bookmark keys (16 bytes each: publisher hash, seq)."""
        crcs = list(map(zlib.crc32, bookmark_keys))
        return cls._of_crcs(crcs)

    @classmethod
    def _of_crcs(cls, crcs: Sequence[int]) -> Fingerprint:
        return cls(len(crcs), sum(crcs) & _MASK, sum(map(operator.mul, crcs, crcs)) & _MASK)

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(
            self.count + other.count,
            (self.total + other.total) & _MASK,
            (self.squares + other.squares) & _MASK,
        )

    def __sub__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(
            self.count - other.count,
            (self.total - other.total) & _MASK,
            (self.squares - other.squares) & _MASK,
        )

    def digest(self) -> int:
        """One 64-bit number for the three (BLAKE2b of them): what a peer is sent. Two
        different fingerprints give the same digest by a 1 in 2**64 coincidence."""
        raw = struct.pack(">qQQ", self.count, self.total, self.squares)
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest())


@dataclass(frozen=True, slots=True)
class Bucket:
    """The records of one origin whose origin txids share a bucket."""

    index: int
    #: the lowest local txid holding one of them
    first_txid: int
    fingerprint: Fingerprint


@dataclass(frozen=True, slots=True)
class OriginHoldings:
    """What a journal holds of one origin, as of one moment (see :class:`Holdings`).

    ``top`` lists its highest buckets, highest first, as many as the reader asked for;
    every bucket numbered ``floor`` or above is in it (``floor`` 0: all of them;
    :data:`NOTHING_READ`: none was read).
    """

    origin: str
    #: the lowest local txid holding a record of this origin
    first_txid: int
    #: the highest origin txid held
    high: int
    total: Fingerprint
    top: tuple[Bucket, ...] = ()
    floor: int = 1 << 64

    def reaches(self, index: int) -> bool:
        """Whether every bucket at or above ``index`` is in :attr:`top`."""
        return index >= self.floor

    def prefix(self, cut: int) -> Fingerprint | None:
        """The fingerprint of the records whose origin txid is below
        ``cut << BUCKET_BITS``; None when :attr:`top` does not reach down to ``cut``."""
        if cut <= 0:
            return Fingerprint()
        if not self.reaches(cut):
            return None
        above = Fingerprint()
        for bucket in self.top:
            if bucket.index < cut:
                break
            above = above + bucket.fingerprint
        return self.total - above

    def bucket(self, index: int) -> Bucket | None:
        """Bucket ``index`` if it is in :attr:`top`: None means no record of this
        origin there only when :meth:`reaches` ``index``."""
        for bucket in self.top:
            if bucket.index == index:
                return bucket
            if bucket.index < index:
                break
        return None

    def first_txid_from(self, cut: int) -> int | None:
        """The lowest local txid holding a record whose origin txid is at or above
        ``cut << BUCKET_BITS``: None when there is none (or :attr:`top` does not reach
        ``cut``: then :attr:`first_txid`, the safe answer)."""
        if cut <= 0 or not self.reaches(cut):
            return self.first_txid
        firsts = [b.first_txid for b in self.top if b.index >= cut]
        return min(firsts) if firsts else None


@dataclass(frozen=True, slots=True)
class Holdings:
    """A journal's holdings as of local txid :attr:`through` (every record up to it
    counts, none after it), read in one transaction."""

    through: int
    origins: Mapping[str, OriginHoldings] = field(default_factory=dict)


# ------------------------------------------------------------------ a stored batch
@dataclass(slots=True)
class BatchHoldings:
    """What one stored batch adds: per (origin, bucket) ``[first txid, count, sum,
    squares]`` and per origin ``[first txid, high, count, sum, squares]`` (the journal
    merges them into its stored ones; the sums are not reduced modulo 2**64 yet)."""

    buckets: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    origins: dict[str, list[int]] = field(default_factory=dict)

    def add_run(
        self, origin: str, index: int, first_txid: int, high: int, crcs: Sequence[int]
    ) -> None:
        """Records of ``origin`` in bucket ``index``, the first at local txid
        ``first_txid``, the highest origin txid among them ``high``; ``crcs``: the
        CRC-32 of their bookmark keys."""
        if not crcs:
            return
        key = (origin, index)
        count, total, squares = len(crcs), sum(crcs), sum(map(operator.mul, crcs, crcs))
        acc = self.buckets.get(key)
        if acc is None:
            self.buckets[key] = [first_txid, count, total, squares]
        else:
            acc[1] += count
            acc[2] += total
            acc[3] += squares
        known = self.origins.get(origin)
        if known is None:
            self.origins[origin] = [first_txid, high, count, total, squares]
        else:
            if high > known[1]:
                known[1] = high
            known[2] += count
            known[3] += total
            known[4] += squares

    def merge(self, other: BatchHoldings) -> None:
        """Add what ``other`` (a later part of the same transaction) holds."""
        for key, (first_txid, count, total, squares) in other.buckets.items():
            acc = self.buckets.get(key)
            if acc is None:
                self.buckets[key] = [first_txid, count, total, squares]
            else:
                acc[0] = min(acc[0], first_txid)
                acc[1] += count
                acc[2] += total
                acc[3] += squares
        for origin, (first_txid, high, count, total, squares) in other.origins.items():
            known = self.origins.get(origin)
            if known is None:
                self.origins[origin] = [first_txid, high, count, total, squares]
            else:
                known[0], known[1] = min(known[0], first_txid), max(known[1], high)
                known[2] += count
                known[3] += total
                known[4] += squares

    def add_own_run(self, origin: str, first_txid: int, crcs: Sequence[int]) -> None:
        """Records of ``origin`` at the consecutive local txids from ``first_txid``,
        whose origin txid is their txid (first journaled here)."""
        txid, end = first_txid, first_txid + len(crcs)
        while txid < end:
            index = txid >> BUCKET_BITS
            stop = min(end, (index + 1) << BUCKET_BITS)
            part = crcs[txid - first_txid : stop - first_txid]
            self.add_run(origin, index, txid, stop - 1, part)
            txid = stop


def batch_holdings(
    first_txid: int,
    bookmark_keys: Sequence[tuple[bytes, bytes]],
    others: Sequence[tuple[int, str, int]],
    own_name: str,
) -> BatchHoldings:
    """The holdings of a stored batch.

    Args:
        first_txid: the local txid of the first record.
        bookmark_keys: per record in txid order, ``(bookmark key, ...)`` (the journal's
            bookmark index entries).
        others: ``(index in the batch, origin, origin txid)``, ascending, of every
            record that is not ``own_name``'s with origin txid = its txid; every other
            record is.
        own_name: this journal's instance name.
    """
    crcs = list(map(zlib.crc32, map(_bookmark_of, bookmark_keys)))
    out = BatchHoldings()
    at = 0  # the next index not accounted for
    # a run of others in one (origin, bucket): its origin, bucket, first txid, high
    run_origin, run_bucket, run_first, run_high = "", -1, 0, 0
    run: list[int] = []
    for index, origin, otx in others:
        bucket = otx >> BUCKET_BITS
        if index > at or bucket != run_bucket or origin != run_origin:
            out.add_run(run_origin, run_bucket, run_first, run_high, run)
            if index > at:
                out.add_own_run(own_name, first_txid + at, crcs[at:index])
            run_origin, run_bucket, run_first, run_high = origin, bucket, first_txid + index, otx
            run = []
        elif otx > run_high:
            run_high = otx
        run.append(crcs[index])
        at = index + 1
    out.add_run(run_origin, run_bucket, run_first, run_high, run)
    if at < len(crcs):
        out.add_own_run(own_name, first_txid + at, crcs[at:])
    return out


# ------------------------------------------------------------------ stored form
def bucket_key(origin: str, index: int) -> bytes:
    """The ``holdings`` key of one bucket (it sorts after its origin's key)."""
    return origin.encode() + _SEP + _U64.pack(index)


def origin_key(origin: str) -> bytes:
    """The ``holdings`` key of one origin's summary."""
    return origin.encode() + _SEP


def next_origin_key(origin: str) -> bytes:
    """The lowest key after every key of ``origin``."""
    return origin.encode() + b"\x01"


def split_key(key: bytes | memoryview) -> tuple[str, int | None]:
    """(origin, bucket index), or (origin, None) for an origin's summary.

    Raises:
        ValueError: not a ``holdings`` key (a damaged page).
    """
    name, sep, rest = bytes(key).partition(_SEP)
    if not sep or len(rest) not in (0, 8):
        raise ValueError(f"not a holdings key: {bytes(key)!r}")
    return name.decode(), (_U64.unpack(rest)[0] if rest else None)


def decode_bucket(index: int, value: bytes) -> Bucket:
    first, count, total, squares = _BUCKET_VALUE.unpack(value)
    return Bucket(index, first, Fingerprint(count, total, squares))


def merged_bucket(stored: bytes | memoryview | None, add: Sequence[int]) -> bytes:
    """The stored value of a bucket after adding ``[first txid, count, sum, squares]``."""
    if stored is None:
        first, count, total, squares = add
    else:
        first, count, total, squares = _BUCKET_VALUE.unpack(stored)
        first = min(first, add[0])
        count, total, squares = count + add[1], total + add[2], squares + add[3]
    return _BUCKET_VALUE.pack(first, count, total & _MASK, squares & _MASK)


def decode_origin(origin: str, value: bytes) -> OriginHoldings:
    first, high, count, total, squares = _ORIGIN_VALUE.unpack(value)
    return OriginHoldings(origin, first, high, Fingerprint(count, total, squares))


def merged_origin(stored: bytes | memoryview | None, add: Sequence[int]) -> bytes:
    """The stored summary of an origin after adding a batch's ``[first txid, high,
    count, sum, squares]``."""
    if stored is None:
        first, high, count, total, squares = add
    else:
        first, high, count, total, squares = _ORIGIN_VALUE.unpack(stored)
        first, high = min(first, add[0]), max(high, add[1])
        count, total, squares = count + add[2], total + add[3], squares + add[4]
    return _ORIGIN_VALUE.pack(first, high, count, total & _MASK, squares & _MASK)


def sorted_buckets(buckets: Iterable[Bucket]) -> tuple[Bucket, ...]:
    """Highest first (as :attr:`OriginHoldings.top` holds them)."""
    return tuple(sorted(buckets, key=operator.attrgetter("index"), reverse=True))


__all__ = [
    "BUCKET_BITS",
    "NOTHING_READ",
    "BatchHoldings",
    "Bucket",
    "Fingerprint",
    "Holdings",
    "OriginHoldings",
    "batch_holdings",
    "bucket_key",
    "decode_bucket",
    "decode_origin",
    "merged_bucket",
    "merged_origin",
    "next_origin_key",
    "origin_key",
    "sorted_buckets",
    "split_key",
]
