"""DurableWindow: which records are durable by the persisted-ack rule, and the
watermark, without trio or a server.

A record is durable once committed and acknowledged by every sync destination it is
routed to; durable stays durable. The examples pin single rules; the seeded random
walk compares the incremental window with that definition computed from scratch after
every step (commits with duplicates, acks forward and back, downgrades, upgrades,
routing that changes when a destination learns its peer's name, a content filter).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from amps_py.server.durable_window import DurableWindow, Release
from txlog import Record


def rec(txid: int, ph: int, seq: int, topic: str = "t", origin: str = "") -> Record:
    return Record(topic=topic, payload=b"{}", pub_hash=ph, seq=seq, txid=txid, origin=origin)


@dataclass(eq=False)
class Holder:
    """A sync destination: routes the records ``routes`` accepts under its current
    ``routing_key``; counts the records it was asked to route."""

    name: str
    routes: Callable[[Record, object], bool]
    acked_txid: int = 0
    routing_key: object = ""
    asked: int = 0

    def routed(self, records: Sequence[Record]) -> list[int]:
        self.asked += len(records)
        return [i for i, r in enumerate(records) if self.routes(r, self.routing_key)]


def topic_is(*topics: str) -> Callable[[Record, object], bool]:
    return lambda r, _key: r.topic in topics


def txids(release: Release) -> list[int]:
    return [r.txid for r in release.records]


# ---------------------------------------------------------------------- single rules


def test_without_sync_destinations_a_commit_is_durable_at_once() -> None:
    window = DurableWindow()
    release = window.committed([rec(1, 7, 1), rec(2, 7, 2), rec(3, 8, 1)], [], 3, ())
    assert release.settled == {7: [1, 2], 8: [1]}
    assert txids(release) == [1, 2, 3]
    assert (window.durable_txid, window.waiting) == (3, False)


def test_a_sync_destination_holds_only_the_records_routed_to_it() -> None:
    b = Holder("B", topic_is("rep"))
    window = DurableWindow()
    release = window.committed(
        [rec(1, 7, 1, "rep"), rec(2, 8, 1, "local"), rec(3, 7, 2, "local")], [], 3, [b]
    )
    # the local records are durable (their publishers get acks), the rep one waits
    assert release.settled == {8: [1], 7: [2]}
    # ... and the watermark stays before it: fully_durable subscribers see journal order
    assert (window.durable_txid, txids(release), window.held_by("B")) == (0, [], 1)
    assert window.is_durable(2) and window.is_durable(3) and not window.is_durable(1)
    b.acked_txid = 3
    release = window.advance([b])
    assert release.settled == {7: [1]}
    assert txids(release) == [1, 2, 3] and window.durable_txid == 3
    assert not window.waiting and window.held_by("B") == 0


def test_nothing_routed_keeps_the_window_empty() -> None:
    b = Holder("B", topic_is("rep"))
    window = DurableWindow()
    for txid in range(1, 50):
        release = window.committed([rec(txid, 7, txid, "local")], [], txid, [b])
        assert release.settled == {7: [txid]} and txids(release) == [txid]
    assert not window.waiting and window.durable_txid == 49


def test_a_record_waits_for_every_sync_destination_it_is_routed_to() -> None:
    b, c = Holder("B", topic_is("rep", "both")), Holder("C", topic_is("both"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "both"), rec(2, 7, 2, "rep")], [], 2, [b, c])
    b.acked_txid = 2
    assert window.advance([b, c]).settled == {7: [2]}  # 1 still waits for C
    c.acked_txid = 2
    release = window.advance([b, c])
    assert release.settled == {7: [1]} and txids(release) == [1, 2]


def test_a_downgrade_releases_what_only_it_held() -> None:
    b = Holder("B", topic_is("rep"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "rep")], [], 1, [b])
    release = window.committed([rec(2, 7, 2, "rep")], [], 2, [])  # B downgraded
    assert release.settled == {7: [2, 1]} or release.settled == {7: [1, 2]}
    assert window.durable_txid == 2 and window.held_by("B") == 0


def test_an_upgrade_holds_what_is_not_durable_yet_but_never_what_is() -> None:
    b, c = Holder("B", topic_is("rep")), Holder("C", topic_is("rep", "local"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "rep"), rec(2, 8, 1, "local")], [], 2, [b])
    assert window.is_durable(2)
    c.acked_txid = 0  # C becomes sync again (an upgrade), behind
    window.advance([b, c])
    assert window.held_by("C") == 1, "only record 1 (not durable yet) waits for C"
    b.acked_txid = 2
    assert window.advance([b, c]).settled == {}
    c.acked_txid = 2
    assert window.advance([b, c]).settled == {7: [1]}


def test_learning_the_peers_name_reroutes_what_is_held() -> None:
    # loop prevention: records that came from the peer's instance are not sent back
    def routes(r: Record, key: object) -> bool:
        return r.origin != key

    b = Holder("B", routes)
    window = DurableWindow()
    window.committed([rec(1, 7, 1, origin="B"), rec(2, 7, 2, origin="A")], [], 2, [b])
    assert window.held_by("B") == 2  # unknown peer: nothing excluded
    b.routing_key = "B"  # connected: the peer is instance B
    release = window.advance([b])
    assert release.settled == {7: [1]} and window.held_by("B") == 1


def test_acked_moving_back_holds_again_what_is_not_durable() -> None:
    b, c = Holder("B", topic_is("rep")), Holder("C", topic_is("rep"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "rep"), rec(2, 7, 2, "rep")], [], 2, [b, c])
    b.acked_txid = 2
    window.advance([b, c])
    b.acked_txid = 0  # B resynced from a peer that lost what it had acknowledged
    window.advance([b, c])
    c.acked_txid = 2
    assert window.advance([b, c]).settled == {}, "B acknowledged them before losing them"
    b.acked_txid = 2
    assert window.advance([b, c]).settled == {7: [1, 2]}


def test_a_publish_found_already_stored_settles_once_the_copy_is_durable() -> None:
    b = Holder("B", topic_is("rep"))
    window = DurableWindow()
    window.committed([rec(1, 7, 5, "rep"), rec(2, 8, 1, "local")], [], 2, [b])
    release = window.committed([], [(7, 5, 1), (8, 1, 2)], 2, [b])
    assert release.settled == {8: [1]}, "the copy of 8/1 is durable: settled at once"
    b.acked_txid = 2
    assert window.advance([b]).settled == {7: [5, 5]}


def test_a_publish_whose_copy_is_not_found_waits_for_the_watermark() -> None:
    b = Holder("B", topic_is("rep"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "rep")], [], 1, [b])
    assert window.committed([], [(9, 3, None)], 1, [b]).settled == {}
    b.acked_txid = 1
    assert window.advance([b]).settled == {7: [1], 9: [3]}


# ---------------------------------------------------------------------- random walk


@dataclass
class Model:
    """The rule from scratch: every committed record, which are durable (sticky)."""

    records: list[Record] = field(default_factory=list)
    durable: set[int] = field(default_factory=set)
    #: duplicates: (publisher, seq, copy txid or None, commit bound)
    dups: list[tuple[int, int, int | None, int]] = field(default_factory=list)
    dups_settled: set[tuple[int, int]] = field(default_factory=set)
    watermark: int = 0

    def step(self, holders: Sequence[Holder]) -> tuple[dict[tuple[int, int], int], list[int]]:
        """Apply the rule; the (publisher, seq) newly settled (with counts) and the
        txids the watermark passed."""
        settled: dict[tuple[int, int], int] = {}
        for r in self.records:
            if r.txid in self.durable:
                continue
            if all(
                h.acked_txid >= r.txid or not h.routes(r, h.routing_key) for h in holders
            ):
                self.durable.add(r.txid)
                settled[(r.pub_hash, r.seq)] = settled.get((r.pub_hash, r.seq), 0) + 1
        passed = []
        for r in self.records:
            if r.txid <= self.watermark:
                continue
            if r.txid not in self.durable:
                break
            passed.append(r.txid)
            self.watermark = r.txid
        committed = self.records[-1].txid if self.records else 0
        everything = self.watermark == committed
        for pub_hash, seq, copy, bound in self.dups:
            if (pub_hash, seq) in self.dups_settled:
                continue
            ok = copy in self.durable if copy is not None else everything or bound <= self.watermark
            if ok:
                self.dups_settled.add((pub_hash, seq))
                settled[(pub_hash, seq)] = settled.get((pub_hash, seq), 0) + 1
        return settled, passed


def flat(release: Release) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for pub_hash, seqs in release.settled.items():
        for seq in seqs:
            out[(pub_hash, seq)] = out.get((pub_hash, seq), 0) + 1
    return out


def routes_rep(r: Record, _key: object) -> bool:
    return r.topic in ("rep", "both")


def routes_both(r: Record, _key: object) -> bool:
    return r.topic == "both"


def routes_filtered(r: Record, _key: object) -> bool:
    return r.topic in ("rep", "both") and r.payload == b'{"x":1}'  # a content filter


def routes_not_back(r: Record, key: object) -> bool:
    return r.origin != key  # every topic, but never back to the instance it came from


@pytest.mark.parametrize("seed", range(12))
def test_random_walk_matches_the_rule_computed_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    print(f"seed {seed}")
    holders = [
        Holder("A", routes_rep),
        Holder("B", routes_both),
        Holder("C", routes_filtered),
        Holder("D", routes_not_back),
    ]
    sync = {h.name: rng.random() < 0.7 for h in holders}
    window, model = DurableWindow(), Model()
    txid = 0
    dup_seq = 0

    def current() -> list[Holder]:
        return [h for h in holders if sync[h.name]]

    for step in range(400):
        roll = rng.random()
        active = current()
        if roll < 0.45:  # a commit
            batch = []
            for _ in range(rng.randint(0, 6)):
                txid += 1
                r = rec(
                    txid,
                    rng.randint(1, 3),
                    txid,
                    rng.choice(("rep", "local", "both")),
                    origin=rng.choice(("", "Dpeer", "other")),
                )
                r.payload = rng.choice((b'{"x":1}', b'{"x":2}'))
                batch.append(r)
            model.records.extend(batch)
            dropped: list[tuple[int, int, int | None]] = []
            if model.records and rng.random() < 0.3:
                dup_seq += 1
                copy = rng.choice(model.records).txid if rng.random() < 0.8 else None
                dropped.append((99, dup_seq, copy))
                model.dups.append((99, dup_seq, copy, txid))
            release = window.committed(batch, dropped, txid, active)
        else:
            h = rng.choice(holders)
            if roll < 0.8:  # it acknowledges more (never beyond what is committed)
                h.acked_txid = rng.randint(h.acked_txid, txid)
            elif roll < 0.85:  # a resync from a peer that lost some
                h.acked_txid = rng.randint(0, h.acked_txid)
            elif roll < 0.9:  # learns its peer's name, or another one answers
                h.routing_key = rng.choice(("", "Dpeer", "other"))
            else:  # downgrade / upgrade
                sync[h.name] = not sync[h.name]
            active = current()
            if not window.waiting and rng.random() < 0.7:
                continue  # as the server: nothing waits, nothing to advance
            release = window.advance(active)
        want_settled, want_passed = model.step(active)
        where = f"seed {seed} step {step}"
        assert flat(release) == want_settled, where
        assert txids(release) == want_passed, where
        assert window.durable_txid == model.watermark, where
        for r in model.records[-30:]:
            assert window.is_durable(r.txid) == (r.txid in model.durable), (where, r.txid)
        for h in active:
            waiting = sum(
                1
                for r in model.records
                if r.txid not in model.durable
                and r.txid > h.acked_txid
                and h.routes(r, h.routing_key)
            )
            assert window.held_by(h.name) == waiting, (where, h.name)


def test_cost_follows_what_waits_not_what_was_committed() -> None:
    """A sync destination down for long while most traffic is not routed to it: each
    record is routed once at its commit, and acks pop only what was held; nothing is
    scanned again per commit or per ack."""
    b = Holder("B", topic_is("rep"))
    other = Holder("C", topic_is("rep", "local"))
    window = DurableWindow()
    window.committed([rec(1, 7, 1, "rep")], [], 1, [b, other])  # held by B from now on
    n = 20_000
    for txid in range(2, n + 2):
        window.committed([rec(txid, 8, txid, "local")], [], txid, [b, other])
        other.acked_txid = txid  # C acknowledges each commit at once
        window.advance([b, other])
    assert (b.asked, other.asked) == (n + 1, n + 1), "each record routed once per destination"
    assert window.held_by("B") == 1 and window.held_by("C") == 0
    b.acked_txid = n + 1
    release = window.advance([b, other])
    assert release.settled == {7: [1]} and len(release.records) == n + 1
