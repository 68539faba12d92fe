"""Resync without a cursor: the upstream sends only what the downstream lacks. Pure:
no trio, no journal (the callers read :class:`txlog.holdings.Holdings` and records,
and pass them in).

A downstream that holds no cursor for an upstream (a new destination to an instance
that already has the records through other paths, a failover to another member of a
group, a lost cursor) used to be sent the upstream's whole journal, every record then
dropped as a duplicate. Instead the two compare what they hold, per origin instance,
in the handshake:

1. the upstream's hello names, per origin it holds, the highest origin txid
   (:func:`hello_holdings`: a map bounded by the number of origins);
2. the downstream's welcome answers, per origin it also holds (:func:`report`), the
   digest of the fingerprint (:mod:`txlog.holdings`: its bookmarks, counted and summed)
   of all its records of that origin, when its highest origin txid is not above the
   upstream's (the usual case: a downstream is behind); and a few bucket *cuts* ``c``
   at and below ``K = min(both highs) >> BUCKET_BITS`` (``K``, ``K-1``, ``K-2``,
   ``K-4``, ...), each with the digest of its records of that origin whose origin txid
   is below ``c << BUCKET_BITS``;
3. the upstream (:func:`plan`) compares them with its own records of the same origin
   up to the same point: the highest that matches proves that the downstream holds
   exactly the bookmarks the upstream holds there, which is what duplicate detection
   compares, so none of them needs sending. The resync starts at the lowest local
   txid holding a record not proven held (for an origin the downstream did not report:
   its first record), and while sending skips the records proven held
   (:meth:`ResyncPlan.holds`). Checking the first answer needs the upstream's records
   of one bucket of that origin one by one (:func:`scans`: from the bucket's first
   local txid, at most :data:`MAX_SCAN` records back; the rest of the range is the
   resync itself); the cuts need none.

What is never skipped: a record of an origin whose fingerprints differ at every point
compared (the downstream missed some of its records, or holds others: a gap, a
filtered path, an origin whose journal was started again), anything above the point
that matched, and anything journaled here after the upstream read its holdings. A
mismatch costs records sent again (dropped as duplicates, as before), never a record
lost. Routing still decides what is sent of what is not proven held; records the
upstream never routes to the downstream are not looked at, but they are part of the
comparison (an origin the downstream holds only part of, behind a filter, is not
proven).

Costs follow the live state: each side reads a summary per origin, and buckets (an
index entry per 1,024 origin txids) of the origins compared: the downstream at most
:data:`MAX_BUCKETS` per origin, the upstream those above the points reported
(:func:`floors`: one entry per 1,024 origin txids it sends anyway); and the upstream
reads at most one bucket's spread of records per origin (:data:`MAX_SCAN`); never the
journal from its start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from txlog.holdings import BUCKET_BITS, Fingerprint, Holdings

from .hello import MAX_NAME_LENGTH, HeldOrigin

__all__ = [
    "MAX_BUCKETS",
    "MAX_CUTS",
    "MAX_ORIGINS",
    "MAX_SCAN",
    "ResyncPlan",
    "Scan",
    "comparable",
    "cut_points",
    "floors",
    "hello_holdings",
    "partial_fingerprints",
    "plan",
    "report",
    "scans",
]

#: origins named in a hello at most (those holding the most records); an origin left
#: out is not compared: its records are sent. Keeps a hello and its welcome well within
#: the 64 KiB handshake frame (a welcome: about 60 bytes per origin and 30 per cut).
MAX_ORIGINS: Final = 48
#: cuts reported per origin at most: K, K-1, K-2, K-4, ... K-4096
MAX_CUTS: Final = 14
#: buckets of an origin read at most (4M origin txids: a gap older than that makes the
#: whole origin unproven)
MAX_BUCKETS: Final = 4096
#: records the upstream reads at most to check an exact report (from the first local
#: txid of the bucket it ends in to the newest); beyond, only the cuts are compared.
#: About a second of reading: the plan is made before the stream starts, and the
#: downstream closes a link silent for five heartbeat intervals
MAX_SCAN: Final = 200_000


def cut_points(top: int, limit: int = MAX_CUTS) -> list[int]:
    """The cuts at and below bucket ``top``, highest first: ``top``, ``top - 1``,
    ``top - 2``, ``top - 4``, ... while above 0, at most ``limit``. Dense near the top
    (a downstream usually lacks only the newest records), sparse below (a gap far back
    still leaves everything below the next cut down proven)."""
    cuts: list[int] = []
    step = 0
    while len(cuts) < limit:
        cut = top - step
        if cut <= 0:
            break
        cuts.append(cut)
        step = 1 if step == 0 else step * 2
    return cuts


def comparable(origin: str) -> bool:
    """Whether ``origin`` may be named in a hello or welcome: what a peer accepts of an
    instance name there (at most 64 printable characters). Records of another origin
    (written by a tool, say) are never compared: they are sent."""
    return len(origin) <= MAX_NAME_LENGTH and origin.isprintable()


def hello_holdings(mine: Holdings) -> dict[str, int]:
    """What an upstream's hello says it holds: per origin, the highest origin txid (the
    :data:`MAX_ORIGINS` origins holding the most records)."""
    held = sorted(
        (o for o in mine.origins.values() if comparable(o.origin)),
        key=lambda o: o.total.count,
        reverse=True,
    )
    return {o.origin: o.high for o in held[:MAX_ORIGINS]}


def report(asked: Mapping[str, int], mine: Holdings) -> dict[str, HeldOrigin]:
    """What a downstream's welcome answers to the ``asked`` map of a hello (origin ->
    the upstream's highest origin txid), from ``mine`` (read with :data:`MAX_BUCKETS`
    buckets per origin): for each origin both hold, the digest of everything held of
    it when that ends at or below the upstream's high, and the cuts at and below the
    lower of the two highs that the buckets read reach. An origin held nothing of is
    left out (the upstream then sends all of it)."""
    out: dict[str, HeldOrigin] = {}
    for origin, their_high in list(asked.items())[:MAX_ORIGINS]:
        held = mine.origins.get(origin)
        if held is None or not comparable(origin):
            continue
        cuts: list[tuple[int, int]] = []
        for cut in cut_points(min(their_high, held.high) >> BUCKET_BITS):
            fingerprint = held.prefix(cut)
            if fingerprint is None:
                break  # the buckets read do not reach this far down
            cuts.append((cut, fingerprint.digest()))
        if held.high <= their_high:
            out[origin] = HeldOrigin(held.high, held.total.digest(), tuple(cuts))
        elif cuts:
            out[origin] = HeldOrigin(None, 0, tuple(cuts))
    return out


def floors(reported: Mapping[str, HeldOrigin]) -> dict[str, int]:
    """Per origin reported, the lowest bucket the upstream must read its buckets down
    to (from its newest) to check every point reported: as many entries as there are
    buckets above the downstream's report, one per 1,024 origin txids it must send
    anyway (a downstream far behind is still compared, at that cost)."""
    out = {}
    for origin, held in reported.items():
        points = [cut for cut, _ in held.cuts]
        if held.upto is not None:
            points.append(held.upto >> BUCKET_BITS)
        if points:
            out[origin] = min(points)
    return out


@dataclass(frozen=True)
class Scan:
    """Records of ``origin`` the upstream fingerprints one by one to check a
    downstream's report of everything up to origin txid ``upto``: those of the bucket
    ``upto`` falls in, up to ``upto``; they are all at local txids after ``after``."""

    origin: str
    upto: int
    after: int


def scans(reported: Mapping[str, HeldOrigin], mine: Holdings) -> list[Scan]:
    """The record scans :func:`plan` needs (their fingerprints go to it as
    ``partial``): one per origin reported with an ``upto`` whose bucket holds records
    here, unless that bucket starts more than :data:`MAX_SCAN` records back."""
    out = []
    for origin, held in reported.items():
        holding = mine.origins.get(origin)
        if held.upto is None or holding is None:
            continue
        index = held.upto >> BUCKET_BITS
        if not holding.reaches(index):
            continue  # not comparable anyway
        bucket = holding.bucket(index)
        if bucket is not None and mine.through - bucket.first_txid < MAX_SCAN:
            out.append(Scan(origin, held.upto, bucket.first_txid - 1))
    return out


def partial_fingerprints(
    wanted: Iterable[Scan], records: Iterable[tuple[str, int, bytes]]
) -> dict[str, Fingerprint]:
    """The fingerprints of the ``wanted`` scans, from ``records`` (origin, origin txid,
    bookmark key) read from the lowest ``after`` of them on."""
    ranges = {s.origin: ((s.upto >> BUCKET_BITS) << BUCKET_BITS, s.upto, s.after) for s in wanted}
    keys: dict[str, list[bytes]] = {origin: [] for origin in ranges}
    for origin, origin_txid, bookmark_key in records:
        found = ranges.get(origin)
        if found is not None and found[0] <= origin_txid <= found[1]:
            keys[origin].append(bookmark_key)
    return {origin: Fingerprint.of(found) for origin, found in keys.items()}


@dataclass(frozen=True)
class ResyncPlan:
    """Where a resync without a cursor starts and what it need not send.

    ``after``: the stream resumes after this local txid. ``through``: the local txid
    the upstream's holdings were read at; records after it are always sent.
    ``proven``: per origin, the origin txid below which the downstream holds every
    record this journal held at ``through``. ``held``: how many records those are.
    """

    after: int
    through: int
    proven: Mapping[str, int] = field(default_factory=dict)
    held: int = 0

    def holds(self, txid: int, origin: str, origin_txid: int) -> bool:
        """Whether the downstream is proven to hold the record at local ``txid`` (so it
        is not sent)."""
        return txid <= self.through and origin_txid < self.proven.get(origin, 0)


def plan(
    reported: Mapping[str, HeldOrigin],
    mine: Holdings,
    remote_name: str,
    partial: Mapping[str, Fingerprint] | None = None,
) -> ResyncPlan:
    """The resync of a downstream (instance ``remote_name``) that reported
    ``reported`` in its welcome, from this journal's holdings ``mine`` (with the
    buckets of each origin reported read down to its :func:`floors`) and the
    fingerprints of the
    :func:`scans` it asked for (``partial``; a scan not done only leaves its report
    unchecked).

    Per origin, the highest point the downstream reported whose digest equals this
    journal's up to it bounds what is proven held; an origin not reported, or matching
    nowhere, is proven nothing. Records first journaled by the downstream itself are
    never sent to it and do not move the start."""
    partial = partial or {}
    after = mine.through
    proven: dict[str, int] = {}
    held = 0
    for origin, holding in mine.origins.items():
        if origin == remote_name:
            continue
        bound, count = 0, 0
        report_ = reported.get(origin)
        if report_ is not None and report_.upto is not None:
            index = report_.upto >> BUCKET_BITS
            below = holding.prefix(index)
            part = partial.get(origin) if holding.bucket(index) is not None else Fingerprint()
            if holding.reaches(index) and below is not None and part is not None:
                upto = below + part
                if upto.digest() == report_.digest:
                    bound, count = report_.upto + 1, upto.count
        if report_ is not None and not bound:
            for cut, digest in sorted(report_.cuts, reverse=True):
                fingerprint = holding.prefix(cut)
                if fingerprint is not None and fingerprint.digest() == digest:
                    bound, count = cut << BUCKET_BITS, fingerprint.count
                    break
        if bound:
            proven[origin] = bound
            held += count
        # (everything held of it proven: nothing of it to send)
        first = None if bound > holding.high else holding.first_txid_from(bound >> BUCKET_BITS)
        if first is not None:
            after = min(after, first - 1)
    return ResyncPlan(max(after, 0), mine.through, proven, held)
