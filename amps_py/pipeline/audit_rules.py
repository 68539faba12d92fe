"""The fabric audit's rules (pure: no Spark, no Arrow): what each message must reach,
and how what the journals hold is classified.

A *message* is a bookmark (``<publisher hash>|<seq>|``), the identity every instance
stores it under. Its *copies* are the journal records holding that bookmark, on every
audited instance. Its *reference copy* is the copy at its origin instance (the lowest
txid there), or, when the origin's journal does not hold it, the copy with the lowest
``(instance, txid)``; the message's origin, topic, message type, kind, origin txid
and payload are the reference copy's.

Where the message must go: :func:`fabric.simulate` with the message's origin, topic
and message type, run by the server's own routing code
(:meth:`amps_py.replication.routing.Route.accepts`). Where a link has a content filter
on the message's topic, the filter is evaluated on the message's payload
(:meth:`FilterPlan.verdict`); messages with the same origin, topic, type and filter
verdicts share one simulation (:class:`Expectation`), which gives every instance the
message must reach and the path that carries it there (its first arrival).

Classes, per message and audited instance (:func:`classify_message`):

- ``ok``: the instance must hold the message and holds exactly one copy;
- ``missing``: it must hold it and holds none (the finding names the path that should
  have carried it);
- ``duplicate``: it holds more than one copy (each copy's txid is named);
- ``phantom``: a record the fabric cannot have produced, one per record: a copy held
  where the routing never sends the message; a copy whose content (origin, origin
  txid, topic, message type, kind or payload) differs from the reference copy, i.e.
  not what the publisher sent under that bookmark; every copy of a message whose
  origin is not an instance of the configs, or whose origin does not journal its
  topic (no publisher's stream of the fabric holds it).

And per instance and publisher (:func:`reordered`): ``reordered`` counts, as
``tests/checker.py`` does, the fewest messages that would have to move for the
publisher's messages (first copies, in local txid order) to be in increasing seq
order: those outside one longest increasing run of seqs. A single message stored too
early or too late counts once. The servers store seqs a client sent out of order as
they come, so a publisher that sent out of order shows up at its origin too (the
finding says so); reordered messages also count in ``ok`` or ``duplicate``.

The audit can only see messages some audited journal holds: a message lost on every
audited instance (its origin included) leaves no trace to classify.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from amps_py.config import DestinationConfig, ReplicationTopic
from amps_py.replication.fabric import Arrival, Fabric, simulate
from amps_py.replication.routing import Route

__all__ = [
    "CLASSES",
    "PROBLEM_CLASSES",
    "Copy",
    "Counts",
    "Expectation",
    "ExpectedArrival",
    "FilterPlan",
    "Finding",
    "MessageOutcome",
    "PubRecord",
    "classify_message",
    "expectation_for",
    "longest_increasing",
    "out_of_order",
    "reference_copy",
    "reordered",
]

#: the columns of the per-instance table, in order
CLASSES: Final = ("held", "ok", "missing", "duplicate", "reordered", "phantom")
#: the classes that fail the audit (exit status 1)
PROBLEM_CLASSES: Final = ("missing", "duplicate", "reordered", "phantom")

#: an (origin, topic, message type, verdict) key of :class:`Expectation`
ExpectationKey = tuple[str, str, str, str]

# Names no instance can have: Route.accepts judges only the topic rule (4) with them.
_NO_ORIGIN: Final = "\x00audit-origin"
_NO_REMOTE: Final = "\x00audit-remote"


# ------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Finding:
    """One problem (see the module docstring for the classes).

    Attributes:
        kind: ``missing``, ``duplicate``, ``reordered`` or ``phantom``.
        instance: the instance whose journal has the problem.
        bookmark: the message (``<publisher hash>|<seq>|``).
        origin: the instance it was published to (the reference copy's).
        topic: its topic.
        message_type: its message type.
        expected_path: how the routing brings it to ``instance``
            (:meth:`fabric.Arrival.describe`), or ``None`` when it must not be there.
        expected_hops: the instances of that path, origin first (empty when none).
        txids: the txids of the records concerned on ``instance`` (none for missing).
        detail: what was seen, in words.
        ts_us: when, in microseconds since the epoch (UTC): the local timestamp of
            the record concerned on ``instance`` (the first one for a duplicate); for
            a missing message, the origin timestamp of its reference copy (when it
            was published); 0 when unknown.
    """

    kind: str
    instance: str
    bookmark: str
    origin: str
    topic: str
    message_type: str
    expected_path: str | None
    expected_hops: tuple[str, ...]
    txids: tuple[int, ...]
    detail: str
    ts_us: int = 0

    @property
    def publisher_hash(self) -> str:
        return self.bookmark.split("|", 1)[0]

    @property
    def seq(self) -> int:
        parts = self.bookmark.split("|")
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1

    def sort_key(self) -> tuple[int, str, str, int, str]:
        return (
            PROBLEM_CLASSES.index(self.kind) if self.kind in PROBLEM_CLASSES else 99,
            self.instance,
            self.publisher_hash,
            self.seq,
            self.detail,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "instance": self.instance,
            "bookmark": self.bookmark,
            "publisher_hash": self.publisher_hash,
            "seq": self.seq,
            "origin": self.origin,
            "topic": self.topic,
            "message_type": self.message_type,
            "expected_path": self.expected_path,
            "expected_hops": list(self.expected_hops),
            "txids": list(self.txids),
            "detail": self.detail,
            "ts_us": self.ts_us,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Finding:
        return cls(
            doc["kind"],
            doc["instance"],
            doc["bookmark"],
            doc["origin"],
            doc["topic"],
            doc["message_type"],
            doc["expected_path"],
            tuple(doc["expected_hops"]),
            tuple(doc["txids"]),
            doc["detail"],
            int(doc.get("ts_us", 0)),
        )

    def __str__(self) -> str:
        txids = f" txid {', '.join(map(str, self.txids))}" if self.txids else ""
        where = f"; expected path {self.expected_path}" if self.expected_path else ""
        return (
            f"{self.kind} on {self.instance}: {self.bookmark} ({self.topic}, from "
            f"{self.origin}){txids}: {self.detail}{where}"
        )


@dataclass
class Counts:
    """One instance's row: records held, and messages per class."""

    held: int = 0
    ok: int = 0
    missing: int = 0
    duplicate: int = 0
    reordered: int = 0
    phantom: int = 0

    @property
    def problems(self) -> int:
        return sum(getattr(self, name) for name in PROBLEM_CLASSES)

    def add(self, other: Counts) -> None:
        for name in CLASSES:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CLASSES}


# ------------------------------------------------------------------------- expectations


@dataclass(frozen=True)
class ExpectedArrival:
    """How the routing brings a message to ``instance``: ``hops`` origin first, ending
    with ``instance``; ``describe`` in :meth:`fabric.Arrival.describe`'s words."""

    instance: str
    hops: tuple[str, ...]
    describe: str


@dataclass(frozen=True)
class Expectation:
    """Where the messages of one (origin, topic, message type, filter verdict) must
    go; ``reason`` (when set) says why none of them may exist at all."""

    arrivals: Mapping[str, ExpectedArrival] = field(default_factory=dict)
    reason: str | None = None


def _expected(arrival: Arrival) -> ExpectedArrival:
    return ExpectedArrival(arrival.instance, tuple(reversed(arrival.hops)), arrival.describe())


def expectation_for(
    fabric: Fabric, origin: str, topic: str, message_type: str, payload: bytes | None
) -> Expectation:
    """The expectation for messages published at ``origin`` on ``topic``: the
    fabric's own simulation, with content filters applied to ``payload`` (``None``:
    no link filters this topic, the payload does not matter)."""
    if origin not in fabric.instances:
        known = ", ".join(sorted(fabric.instances))
        return Expectation(
            reason=f"its origin {origin!r} is not an instance of the configs ({known})"
        )
    prop = simulate(fabric, origin, topic, message_type, payload=payload, failover=False)
    if not prop.journaled:
        return Expectation(
            reason=f"its origin {origin} does not journal topic {topic!r} ({message_type})"
        )
    return Expectation({a.instance: _expected(a) for a in prop.arrivals})


@dataclass
class FilterPlan:
    """The content filters of a fabric's links, as plain data that Spark ships to its
    executors (no addresses, no credentials), with the server's routing code rebuilt
    there from it.

    Attributes:
        links: link id (``<instance>:<destination name>``) to the destination's topic
            entries ``(name, message type, filter)``.
        relevant: (topic, message type) to the ids of the links whose decision on that
            topic depends on the payload (every matching entry has a filter), in order.
    """

    links: dict[str, tuple[tuple[str | None, str, str | None], ...]]
    relevant: dict[tuple[str, str], tuple[str, ...]]
    _routes: dict[str, Route] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_fabric(cls, fabric: Fabric, topics: Iterable[tuple[str, str]]) -> FilterPlan:
        """The plan for messages on ``topics`` ((topic, message type) pairs)."""
        links: dict[str, tuple[tuple[str | None, str, str | None], ...]] = {}
        relevant: dict[tuple[str, str], tuple[str, ...]] = {}
        for topic, message_type in sorted(set(topics)):
            ids: list[str] = []
            for name, own in fabric.links.items():
                for link in own:
                    if not link.filters(topic, message_type):
                        continue
                    link_id = f"{name}:{link.name}"
                    ids.append(link_id)
                    links[link_id] = tuple(
                        (t.name, t.message_type, t.filter) for t in link.destination.topics
                    )
            if ids:
                relevant[(topic, message_type)] = tuple(ids)
        return cls(links, relevant)

    def __getstate__(self) -> dict[str, Any]:
        # compiled filters do not pickle: executors rebuild the routes
        return {"links": self.links, "relevant": self.relevant}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.links = state["links"]
        self.relevant = state["relevant"]
        self._routes = {}

    def filtered(self, topic: str, message_type: str) -> bool:
        return (topic, message_type) in self.relevant

    def _route(self, link_id: str) -> Route:
        route = self._routes.get(link_id)
        if route is None:
            topics = tuple(
                ReplicationTopic(name, message_type, filt)
                for name, message_type, filt in self.links[link_id]
            )
            name = link_id.partition(":")[2]
            route = Route(DestinationConfig(name, None, "async", topics))
            self._routes[link_id] = route
        return route

    def verdict(self, topic: str, message_type: str, payload: bytes) -> str:
        """Which filtered links pass this message (``A:C=pass,B:C=drop``), judged by
        :meth:`Route.accepts` on ``payload``; ``""`` when no link filters the topic."""
        ids = self.relevant.get((topic, message_type), ())
        parts = []
        # judged on the topic rule alone, links with the same topic entries decide
        # alike: each set of entries is judged once (a hot-hot pair's two links to a
        # downstream usually share theirs)
        decided: dict[tuple[tuple[str | None, str, str | None], ...], bool] = {}
        for link_id in ids:
            entries = self.links[link_id]
            ok = decided.get(entries)
            if ok is None:
                ok = decided[entries] = self._route(link_id).accepts(
                    topic=topic,
                    message_type=message_type,
                    origin=_NO_ORIGIN,
                    path=(),
                    payload=payload,
                    remote_name=_NO_REMOTE,
                )
            parts.append(f"{link_id}={'pass' if ok else 'drop'}")
        return ",".join(parts)


# ------------------------------------------------------------------------- one message


@dataclass(frozen=True)
class Copy:
    """One journal record holding a message (the columns the audit compares)."""

    instance: str
    txid: int
    origin: str
    origin_txid: int
    topic: str
    message_type: str
    kind: str
    fingerprint: int  # a hash of the payload
    path: tuple[str, ...] = ()
    verdict: str = ""  # FilterPlan.verdict of its payload ("" when unfiltered)
    local_us: int = 0  # when this instance stored it (µs since the epoch, UTC)
    origin_us: int = 0  # when its origin stored it

    def content(self) -> tuple[str, int, str, str, str, int]:
        return (
            self.origin,
            self.origin_txid,
            self.topic,
            self.message_type,
            self.kind,
            self.fingerprint,
        )


_CONTENT_NAMES: Final = ("origin", "origin txid", "topic", "message type", "kind", "payload")


def reference_copy(copies: Sequence[Copy]) -> Copy:
    """The copy at the message's origin (lowest txid), else the lowest
    ``(instance, txid)`` (see the module docstring)."""

    def rank(c: Copy) -> tuple[bool, str, int]:
        return (c.instance != c.origin, c.instance, c.txid)

    return min(copies, key=rank)


@dataclass(frozen=True)
class MessageOutcome:
    """The classes of one message per audited instance, and its findings."""

    statuses: tuple[tuple[str, str], ...]  # (instance, class); phantom once per record
    findings: tuple[Finding, ...]


def classify_message(
    bookmark: str,
    copies: Sequence[Copy],
    expectations: Mapping[ExpectationKey, Expectation],
    audited: Collection[str],
) -> MessageOutcome:
    """Classify one message on every audited instance.

    Args:
        bookmark: the message.
        copies: every record holding it, on the audited instances (at least one);
            the reference copy's verdict picks the expectation.
        expectations: the expectation of every (origin, topic, message type, verdict).
        audited: the instances whose journals were read.

    Raises:
        KeyError: no expectation for the reference copy's key (a bug of the caller).
    """
    ref = reference_copy(copies)
    key = (ref.origin, ref.topic, ref.message_type, ref.verdict)
    expectation = expectations[key]
    statuses: list[tuple[str, str]] = []
    findings: list[Finding] = []

    def finding(
        kind: str,
        instance: str,
        txids: Iterable[int],
        detail: str,
        arrival: ExpectedArrival | None,
        ts_us: int,
    ) -> Finding:
        return Finding(
            kind,
            instance,
            bookmark,
            ref.origin,
            ref.topic,
            ref.message_type,
            arrival.describe if arrival else None,
            arrival.hops if arrival else (),
            tuple(txids),
            detail,
            ts_us,
        )

    by_instance: dict[str, list[Copy]] = {}
    for c in sorted(copies, key=lambda c: (c.instance, c.txid)):
        by_instance.setdefault(c.instance, []).append(c)
    reference = ref.content()
    for instance in sorted(set(audited) | set(by_instance)):
        here = by_instance.get(instance, [])
        arrival = expectation.arrivals.get(instance)
        good: list[Copy] = []
        for c in here:
            if c.content() == reference:
                good.append(c)
                continue
            differs = [
                f"{name} {mine!r} (the reference copy on {ref.instance} has {theirs!r})"
                for name, mine, theirs in zip(_CONTENT_NAMES, c.content(), reference, strict=True)
                if mine != theirs and name != "payload"
            ]
            if c.fingerprint != ref.fingerprint:
                differs.append(f"payload differs from the reference copy on {ref.instance}")
            statuses.append((instance, "phantom"))
            findings.append(
                finding(
                    "phantom",
                    instance,
                    (c.txid,),
                    "not the message published under this bookmark: " + "; ".join(differs),
                    arrival,
                    c.local_us,
                )
            )
        if expectation.reason is not None:
            for c in good:
                statuses.append((instance, "phantom"))
                findings.append(
                    finding("phantom", instance, (c.txid,), expectation.reason, None, c.local_us)
                )
            continue
        if arrival is None:
            must = ", ".join(sorted(expectation.arrivals)) or "nowhere"
            for c in good:
                statuses.append((instance, "phantom"))
                hops = " <- ".join(reversed((*c.path, instance))) if c.path else instance
                findings.append(
                    finding(
                        "phantom",
                        instance,
                        (c.txid,),
                        f"held here (stored via {hops}) but the routing sends it to {must} only",
                        None,
                        c.local_us,
                    )
                )
            continue
        if instance not in audited:
            continue
        if not good:
            statuses.append((instance, "missing"))
            findings.append(
                finding("missing", instance, (), "not in the journal", arrival, ref.origin_us)
            )
        elif len(good) == 1:
            statuses.append((instance, "ok"))
        else:
            statuses.append((instance, "duplicate"))
            txids = [c.txid for c in good]
            findings.append(
                finding(
                    "duplicate",
                    instance,
                    txids,
                    f"stored {len(good)} times",
                    arrival,
                    good[0].local_us,
                )
            )
    return MessageOutcome(tuple(statuses), tuple(findings))


# ------------------------------------------------------------------------- publisher order


@dataclass(frozen=True)
class PubRecord:
    """One record of a publisher on one instance, for the order check."""

    txid: int
    seq: int
    bookmark: str
    origin: str
    topic: str
    message_type: str
    verdict: str = ""
    ts_us: int = 0  # when the instance stored it (local time, µs)


def longest_increasing(values: Sequence[int]) -> set[int]:
    """Indices of one longest strictly increasing subsequence of ``values``
    (patience sorting, O(n log n)). Among equally long runs it keeps, at every length,
    the one ending in the smallest value seen first, so the result is deterministic."""
    tails: list[int] = []  # tails[k]: the smallest last value of a run of length k + 1
    tail_index: list[int] = []  # where that value is
    back = [-1] * len(values)
    for i, value in enumerate(values):
        k = bisect.bisect_left(tails, value)
        if k == len(tails):
            tails.append(value)
            tail_index.append(i)
        else:
            tails[k] = value
            tail_index[k] = i
        back[i] = tail_index[k - 1] if k else -1
    keep: set[int] = set()
    i = tail_index[-1] if tail_index else -1
    while i >= 0:
        keep.add(i)
        i = back[i]
    return keep


def reordered(
    instance: str,
    records: Sequence[PubRecord],
    expectations: Mapping[ExpectationKey, Expectation],
) -> list[Finding]:
    """The reordered findings of one publisher on ``instance``.

    Args:
        instance: the instance.
        records: the publisher's records there (any order; sorted by txid here, and
            only the first copy of each bookmark counts).
        expectations: as for :func:`classify_message` (names the expected path).
    """
    firsts: list[PubRecord] = []
    seen: set[str] = set()
    for r in sorted(records, key=lambda r: r.txid):
        if r.bookmark not in seen:
            seen.add(r.bookmark)
            firsts.append(r)
    return out_of_order(instance, firsts, expectations)


def out_of_order(
    instance: str,
    run: Sequence[PubRecord],
    expectations: Mapping[ExpectationKey, Expectation],
    before: int | None = None,
    after: int | None = None,
) -> list[Finding]:
    """The reordered findings among ``run``: first copies of one publisher's messages
    on ``instance``, consecutive in txid order and sorted by txid; ``before`` and
    ``after`` are the seqs of the first copies just outside it (``None``: none).

    :func:`reordered` calls it with every first copy. The audit on Spark calls it
    once per *block*: a run of first copies such that every seq before it is below
    every seq in it, and every seq after it above. Patience sorting never lets a
    block's seqs displace an earlier block's, so the longest increasing run of the
    whole sequence (:func:`longest_increasing`, with its tie rule) is the
    concatenation of the blocks' own: checking block by block gives exactly the
    findings of checking the whole sequence at once.
    """
    seqs = [r.seq for r in run]
    keep = longest_increasing(seqs)
    out: list[Finding] = []
    for i, r in enumerate(run):
        if i in keep:
            continue
        prev = seqs[i - 1] if i else before
        following = seqs[i + 1] if i + 1 < len(seqs) else after
        expectation = expectations.get((r.origin, r.topic, r.message_type, r.verdict))
        arrival = expectation.arrivals.get(instance) if expectation else None
        where = "published here" if r.origin == instance else f"published at {r.origin}"
        detail = (
            f"seq {r.seq} is out of the publisher's seq order: stored between seq "
            f"{prev} and seq {following} ({where})"
        )
        out.append(
            Finding(
                "reordered",
                instance,
                r.bookmark,
                r.origin,
                r.topic,
                r.message_type,
                arrival.describe if arrival else None,
                arrival.hops if arrival else (),
                (r.txid,),
                detail,
                ts_us=r.ts_us,
            )
        )
    return out


def count_statuses(outcomes: Iterable[tuple[str, str]]) -> dict[str, Counts]:
    """Per instance, the counts of (instance, class) pairs."""
    tally = Counter(outcomes)
    out: dict[str, Counts] = {}
    for (instance, kind), n in tally.items():
        counts = out.setdefault(instance, Counts())
        setattr(counts, kind, getattr(counts, kind) + n)
    return out
