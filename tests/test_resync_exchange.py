"""Resync without a cursor, without a network: what a journal keeps of each origin
(:mod:`txlog.holdings`) and the comparison of two journals' holdings
(:mod:`amps_py.replication.exchange`), driven the way the handshake drives them, on
real journals.

The rule under test is soundness: every record the upstream holds that the downstream
lacks is sent (after the plan's start, and not skipped). Then economy: a downstream
that holds the upstream's records is sent none of them again. The real instances are
in ``test_cursorless_resync.py``.
"""

from __future__ import annotations

import random
import shutil
import struct
from collections.abc import Iterable
from pathlib import Path

import lmdb
import orjson
import pytest

from amps_py.replication import hello
from amps_py.replication.exchange import (
    MAX_BUCKETS,
    ResyncPlan,
    cut_points,
    floors,
    hello_holdings,
    plan,
    report,
    scans,
)
from amps_py.replication.resync_reading import scanned
from txlog import Journal, Record
from txlog.holdings import BUCKET_BITS, Fingerprint, Holdings, batch_holdings

SEED = 2811
_KEY = struct.Struct(">QQ")


def rec(origin: str, origin_txid: int, pub: int, seq: int, topic: str = "orders") -> Record:
    """A record first journaled by ``origin`` (its own when ``origin_txid`` is 0)."""
    return Record(
        topic=topic,
        payload=b'{"x":1}',
        pub_hash=1000 + pub,
        seq=seq,
        client_name=f"pub-{pub}",
        origin=origin,
        origin_txid=origin_txid,
        path=((origin, origin),) if origin_txid else (),
    )


def journal(path: Path, name: str) -> Journal:
    return Journal(path / name, instance_name=name, durability="page-cache", commit_log=False)


def store(j: Journal, records: Iterable[Record], batch: int = 97) -> None:
    records = list(records)
    for i in range(0, len(records), batch):
        j.append(records[i : i + batch], 1)


def copies(records: Iterable[Record]) -> list[Record]:
    """What a peer stores of records it received: same origin, origin txid, bookmark."""
    return [rec(r.origin, r.origin_txid, r.pub_hash - 1000, r.seq, r.topic) for r in records]


def from_scratch(j: Journal) -> dict[str, tuple[int, int, Fingerprint, dict[int, Fingerprint]]]:
    """Per origin (first txid, high, total, per bucket) computed from every record."""
    found: dict[str, list[Record]] = {}
    for r in j.iter_records():
        found.setdefault(r.origin, []).append(r)
    out = {}
    for origin, recs in found.items():
        buckets: dict[int, list[bytes]] = {}
        for r in recs:
            buckets.setdefault(r.origin_txid >> BUCKET_BITS, []).append(
                _KEY.pack(r.pub_hash, r.seq)
            )
        out[origin] = (
            min(r.txid for r in recs),
            max(r.origin_txid for r in recs),
            Fingerprint.of(_KEY.pack(r.pub_hash, r.seq) for r in recs),
            {index: Fingerprint.of(keys) for index, keys in buckets.items()},
        )
    return out


def kept(j: Journal) -> dict[str, tuple[int, int, Fingerprint, dict[int, Fingerprint]]]:
    """The same, as the journal's holdings index has it."""
    held = j.holdings(buckets=1 << 30)
    assert held is not None
    assert held.through == j.last_txid
    return {
        origin: (
            h.first_txid,
            h.high,
            h.total,
            {b.index: b.fingerprint for b in h.top},
        )
        for origin, h in held.origins.items()
    }


def exchange(up: Journal, down: Journal, buckets: int = MAX_BUCKETS) -> ResyncPlan:
    """The handshake's exchange between journals ``up`` and ``down``, the hello and
    welcome through their codec (JSON and back), the plan as the upstream makes it
    (``buckets``: how many each side reads at most where no floor is set)."""
    up_name, down_name = up.instance_name, down.instance_name
    mine = up.holdings()
    assert mine is not None
    body = hello.hello_body(
        name=up_name,
        group=up_name,
        destination=down_name,
        sync="async",
        compression="none",
        topics=[],
        holdings=hello_holdings(mine),
    )
    asked = hello.parse_hello(orjson.loads(orjson.dumps(body))).holdings
    assert asked is not None
    theirs = down.holdings(list(asked), buckets)
    assert theirs is not None
    welcome_body = hello.welcome_body(
        name=down_name, group=down_name, cursor=(0, ""), holdings=report(asked, theirs)
    )
    welcome = hello.parse_welcome(orjson.loads(orjson.dumps(welcome_body)))
    assert welcome.holdings is not None
    compared = up.holdings(list(welcome.holdings), buckets, floors(welcome.holdings))
    every = up.holdings()
    assert compared is not None and every is not None
    both = Holdings(compared.through, {**every.origins, **compared.origins})
    partial = scanned(up, scans(welcome.holdings, both), both.through)
    return plan(welcome.holdings, both, down_name, partial)


def sent(up: Journal, down: Journal, found: ResyncPlan) -> tuple[list[Record], list[Record]]:
    """(records the upstream sends, records the downstream lacks): the sent ones are
    those after the plan's start that it does not skip; the downstream may lack only
    records it is sent (records it first journaled itself are never sent to it)."""
    held = {(r.pub_hash, r.seq) for r in down.iter_records()}
    out = [
        r
        for r in up.iter_records(found.after)
        if r.origin != down.instance_name and not found.holds(r.txid, r.origin, r.origin_txid)
    ]
    lacking = [
        r
        for r in up.iter_records()
        if (r.pub_hash, r.seq) not in held and r.origin != down.instance_name
    ]
    return out, lacking


def assert_sound(up: Journal, down: Journal, found: ResyncPlan) -> list[Record]:
    out, lacking = sent(up, down, found)
    sent_marks = {(r.pub_hash, r.seq) for r in out}
    missed = [r for r in lacking if (r.pub_hash, r.seq) not in sent_marks]
    assert not missed, f"the downstream lacks {len(missed)} records it is not sent: {missed[:5]}"
    return out


# ------------------------------------------------------------------ what a journal keeps


def test_fingerprints_add_and_subtract_and_digest_what_they_count() -> None:
    keys = [_KEY.pack(7, s) for s in range(1, 100)]
    whole = Fingerprint.of(keys)
    assert Fingerprint.of(keys[:40]) + Fingerprint.of(keys[40:]) == whole
    assert whole - Fingerprint.of(keys[40:]) == Fingerprint.of(keys[:40])
    assert whole.digest() == Fingerprint.of(reversed(keys)).digest()
    # one record swapped for another, two swapped for two: different
    assert Fingerprint.of([*keys[:-1], _KEY.pack(7, 500)]).digest() != whole.digest()
    assert Fingerprint.of([_KEY.pack(7, s) for s in (4, 7)]) != Fingerprint.of(
        [_KEY.pack(7, s) for s in (5, 6)]
    )


def test_a_batch_counts_its_own_records_in_runs_and_the_others_one_by_one() -> None:
    marks = [(_KEY.pack(1, s), b"") for s in range(1, 3001)]
    others = [(i, "X", 50_000 + i) for i in range(1000, 1010)] + [(2999, "", 12)]
    batch = batch_holdings(1000, marks, others, "A")
    own = [m for i, (m, _) in enumerate(marks) if i not in {o[0] for o in others}]
    total = Fingerprint()
    for (origin, _), (_, count, s1, s2) in batch.buckets.items():
        if origin == "A":
            total = total + Fingerprint(count, s1 & ((1 << 64) - 1), s2 & ((1 << 64) - 1))
    assert total == Fingerprint.of(own)
    # own records are bucketed by their txid: 1000..3998 span buckets 0 to 3
    assert sorted(i for o, i in batch.buckets if o == "A") == [0, 1, 2, 3]
    assert batch.origins["X"][:3] == [2000, 51_009, 10]
    assert batch.origins[""][:3] == [3999, 12, 1]


def test_parts_of_a_transaction_merge_into_what_the_whole_holds() -> None:
    marks = [(_KEY.pack(1, s), b"") for s in range(1, 2001)]
    others = [(i, "X", 3 * i) for i in range(500, 1500)]
    whole = batch_holdings(100, marks, others, "A")
    parts = batch_holdings(100, marks[:900], others[:400], "A")
    parts.merge(
        batch_holdings(1000, marks[900:], [(i - 900, o, t) for i, o, t in others[400:]], "A")
    )
    assert parts == whole


def test_the_index_matches_a_count_from_scratch_whatever_the_order(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    j = journal(tmp_path, "A")
    records: list[Record] = []
    seqs = [0] * 5
    for _ in range(6000):
        pub = rng.randrange(5)
        seqs[pub] += 1
        kind = rng.random()
        if kind < 0.5:
            records.append(rec("A", 0, pub, seqs[pub]))  # published here
        else:  # replicated in, from two origins, partly out of order
            origin = "X" if kind < 0.8 else "Y"
            records.append(rec(origin, rng.randint(1, 9000), pub, seqs[pub]))
    store(j, records, batch=rng.randint(50, 400))
    assert j.holdings_valid
    assert kept(j) == from_scratch(j)
    j.close()
    with journal(tmp_path, "A") as again:
        assert again.holdings_valid and kept(again) == from_scratch(again)


def test_the_index_follows_records_written_back_from_the_commit_log(tmp_path: Path) -> None:
    """A journal that stopped with batches only in its commit log (a crash) writes them
    into LMDB when it opens, holdings included."""
    path = tmp_path / "live"
    j = Journal(path, instance_name="A")
    j.stage([rec("A", 0, 1, s) for s in range(1, 1500)], 1)
    j.commit()
    j.stage([rec("A", 0, 1, s) for s in range(1500, 1600)], 2)
    j.stage(copies([rec("X", 70 + i, 2, i + 1) for i in range(30)]), 3)
    image = tmp_path / "image"
    image.mkdir()
    for part in path.iterdir():
        if part.is_file() and part.name != "lock.mdb":
            shutil.copy(part, image / part.name)
    j.close()  # commits the two staged batches in one transaction
    with Journal(path, instance_name="A") as stopped:
        assert kept(stopped) == from_scratch(stopped)
    with Journal(image, instance_name="A") as crashed:
        assert crashed.last_txid == 1629
        assert crashed.holdings_valid and kept(crashed) == from_scratch(crashed)


def forget_holdings(path: Path) -> None:
    """Make a journal look written by an amps-py that kept no holdings."""
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.delete(b"holdings_through")
    env.close()


def test_a_journal_from_before_holdings_never_reports_them(tmp_path: Path) -> None:
    with journal(tmp_path, "A") as j:
        store(j, [rec("A", 0, 1, s) for s in range(1, 50)])
    forget_holdings(tmp_path / "A")
    with journal(tmp_path, "A") as j:
        assert not j.holdings_valid and j.holdings() is None
        store(j, [rec("A", 0, 1, s) for s in range(50, 60)])
    # marked once: records written since do not make it whole again
    with journal(tmp_path, "A") as j:
        assert not j.holdings_valid and j.holdings() is None
    with journal(tmp_path, "new") as fresh:
        assert fresh.holdings_valid and fresh.holdings() == Holdings(0, {})


# ------------------------------------------------------------------ the comparison


def test_origins_a_peer_would_refuse_to_read_are_never_named(tmp_path: Path) -> None:
    """A record whose origin is no instance name (written by a tool) is not compared,
    so it never makes a hello or a welcome malformed: it is sent."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    odd = "x" * 70
    store(up, [rec("A", 0, 1, s) for s in range(1, 11)] + [rec(odd, 5, 2, 1)])
    store(down, copies(up.iter_records()))
    found = exchange(up, down)
    assert found.proven == {"A": 11}
    assert [r.origin for r in assert_sound(up, down, found)] == [odd]


def test_cut_points_are_dense_at_the_top_and_sparse_below() -> None:
    assert cut_points(100) == [100, 99, 98, 96, 92, 84, 68, 36]
    assert cut_points(3) == [3, 2, 1]
    assert cut_points(0) == []
    assert len(cut_points(10**9)) == 14


def test_a_downstream_holding_everything_is_sent_nothing_again(tmp_path: Path) -> None:
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, p, s) for s in range(1, 2500) for p in (1, 2)])
    store(down, copies(up.iter_records()))
    found = exchange(up, down)
    assert found.proven == {"A": up.last_txid + 1}
    assert found.after == up.last_txid and found.held == up.last_txid
    assert assert_sound(up, down, found) == []


def test_a_downstream_behind_is_sent_exactly_its_missing_tail(tmp_path: Path) -> None:
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(1, 5001)])
    store(down, copies(up.read(0, 4321)))
    found = exchange(up, down)
    out = assert_sound(up, down, found)
    assert [r.txid for r in out] == list(range(4322, 5001))
    # from the first record of the bucket the downstream's high is in
    assert found.after == ((4321 >> BUCKET_BITS) << BUCKET_BITS) - 1


def test_a_downstream_far_behind_is_compared_where_it_stands(tmp_path: Path) -> None:
    """The upstream reads its buckets down to the downstream's report, however far
    below its newest (here 20 buckets behind, with at most 4 read elsewhere: the
    downstream's own reads stay bounded, the upstream's follow what it sends)."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(1, 25_001)], batch=1000)
    store(down, copies(up.read(0, 3000)))
    found = exchange(up, down, buckets=4)
    assert found.proven == {"A": 3001}
    assert len(assert_sound(up, down, found)) == 22_000


def test_a_few_records_of_an_origin_are_compared_exactly_too(tmp_path: Path) -> None:
    """Fewer records than a bucket: the downstream's exact report is checked against
    the upstream's records of that bucket, read one by one."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(1, 101)])
    store(down, copies(up.read(0, 60)))
    found = exchange(up, down)
    assert [r.seq for r in assert_sound(up, down, found)] == list(range(61, 101))


def test_a_gap_in_the_middle_is_sent_and_what_is_below_it_is_not(tmp_path: Path) -> None:
    """The downstream holds the origin up to its high but missed a range in the middle
    (a filtered path, a partial topology): the exact report does not match; the cuts
    below the gap do, so the gap and everything above the matching cut are sent."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(1, 20_001)])
    gap = range(15_000, 15_100)
    store(down, copies(r for r in up.iter_records() if r.txid not in gap))
    found = exchange(up, down)
    out = assert_sound(up, down, found)
    assert {r.txid for r in out} >= set(gap)
    assert found.proven["A"] <= 15_000
    assert len(out) < 20_000 - 10_000, "the cuts below the gap left everything unproven"


def test_a_downstream_ahead_on_an_origin_is_proven_at_a_cut(tmp_path: Path) -> None:
    """It holds more of X than the upstream does (X reached it by a faster path): no
    exact report, but the cuts below the upstream's high prove most of it."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    xs = [rec("X", 10 + i, 3, i + 1) for i in range(8000)]
    store(up, copies(xs[:6000]))
    store(down, copies(xs))
    found = exchange(up, down)
    out = assert_sound(up, down, found)
    assert found.proven["X"] == (5999 + 10) >> BUCKET_BITS << BUCKET_BITS
    assert len(out) < 1 << BUCKET_BITS


def test_records_the_downstream_holds_and_the_upstream_does_not_prove_nothing(
    tmp_path: Path,
) -> None:
    """A filtered replica of X on each side, filtered differently: the same count of
    X records, not the same records. Nothing is proven; everything of X is sent."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    xs = [rec("X", i + 1, 3, i + 1, f"t{i % 2}") for i in range(3000)]
    store(up, copies(x for x in xs if x.topic == "t0"))
    store(down, copies(x for x in xs if x.topic == "t1"))
    found = exchange(up, down)
    assert found.proven == {} and found.after == 0
    assert len(assert_sound(up, down, found)) == 1500


def test_an_origin_whose_journal_was_started_again_proves_nothing(tmp_path: Path) -> None:
    """Origin A lost its journal and started again: its new records reuse the origin
    txids its old ones had, under other bookmarks. The downstream holds the old ones."""
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(2001, 3001)])  # seqs go on; txids restart
    store(down, [rec("A", i, 1, i) for i in range(1, 1001)])
    found = exchange(up, down)
    assert found.proven == {}
    assert len(assert_sound(up, down, found)) == 1000


def test_an_origin_the_downstream_never_saw_is_sent_from_its_first_record(
    tmp_path: Path,
) -> None:
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, [rec("A", 0, 1, s) for s in range(1, 3001)])
    store(up, copies(rec("Z", 5 + i, 9, i + 1) for i in range(500)))
    store(up, [rec("A", 0, 1, s) for s in range(3001, 4001)])
    store(down, copies(r for r in up.iter_records() if r.origin == "A"))
    found = exchange(up, down)
    out = assert_sound(up, down, found)
    assert {r.origin for r in out} == {"Z"} and len(out) == 500
    assert found.after == 3000


def test_the_downstreams_own_records_never_move_the_start(tmp_path: Path) -> None:
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(down, [rec("B", 0, 5, s) for s in range(1, 1001)])  # B's own
    store(up, copies(down.iter_records()))  # A holds B's records (never sent back)
    store(up, [rec("A", 0, 1, s) for s in range(1, 101)])
    store(down, copies(r for r in up.iter_records() if r.origin == "A"))
    found = exchange(up, down)
    assert found.after == up.last_txid


def test_records_journaled_after_the_holdings_were_read_are_sent(tmp_path: Path) -> None:
    found = ResyncPlan(after=10, through=100, proven={"A": 500})
    assert found.holds(100, "A", 499)
    assert not found.holds(101, "A", 10), "journaled after the plan: not proven"
    assert not found.holds(50, "A", 500) and not found.holds(50, "Z", 1)


#: what a random downstream holds of one origin
MODES = ("everything", "prefix", "gap", "nothing", "noise", "extra")


@pytest.mark.parametrize("case", range(12))
def test_random_fabrics_never_skip_a_record_the_downstream_lacks(tmp_path: Path, case: int) -> None:
    """Seeded random histories: three origins (the upstream's own and two it received,
    in part out of order and with losses); per origin the downstream holds everything,
    a prefix (in origin txid order), a prefix with a gap, nothing, a random part, or a
    prefix plus records the upstream never had. Whatever it holds, every record it
    lacks is sent; of an origin it holds everything or a prefix of, nothing it holds."""
    rng = random.Random(SEED * 100 + case)
    universe: dict[str, list[Record]] = {}
    for origin, pub in (("A", 1), ("X", 2), ("Y", 3)):
        n = rng.randint(300, 5000)
        universe[origin] = [
            rec(origin, 0 if origin == "A" else i + 1, pub, i + 1) for i in range(n)
        ]
    up, down = journal(tmp_path, "A"), journal(tmp_path, "B")
    store(up, universe["A"])  # A's own: origin txid = txid
    foreign = [r for o in ("X", "Y") for r in universe[o] if rng.random() >= 0.01]
    if rng.random() < 0.5:  # received over several paths: partly out of order
        for _ in range(len(foreign) // 20):
            i, j = rng.randrange(len(foreign)), rng.randrange(len(foreign))
            foreign[i], foreign[j] = foreign[j], foreign[i]
    store(up, copies(foreign))
    modes = {origin: rng.choice(MODES) for origin in universe}
    held: list[Record] = []
    for origin, mode in modes.items():
        mine = sorted(
            (r for r in up.iter_records() if r.origin == origin), key=lambda r: r.origin_txid
        )
        upto = rng.randint(0, len(mine))
        if mode == "everything":
            held += mine
        elif mode == "prefix":
            held += mine[:upto]
        elif mode == "gap":
            lo = rng.randint(0, upto)
            held += mine[:lo] + mine[min(upto, lo + rng.randint(1, 300)) : upto]
        elif mode == "noise":
            held += [r for r in mine if rng.random() < 0.9]
        elif mode == "extra":
            others = {(r.pub_hash, r.seq) for r in mine}
            held += mine[:upto] + [r for r in universe[origin] if (r.pub_hash, r.seq) not in others]
    rng.shuffle(held)
    store(down, copies(held))
    found = exchange(up, down)
    out = assert_sound(up, down, found)
    holding = {(r.pub_hash, r.seq) for r in down.iter_records()}
    for origin, mode in modes.items():
        wasted = [r for r in out if r.origin == origin and (r.pub_hash, r.seq) in holding]
        if mode in ("everything", "prefix"):
            assert not wasted, f"{origin} ({mode}): {len(wasted)} records it holds sent again"
