#!/usr/bin/env python3
"""Resync without a cursor: a downstream that already holds its upstream's records.

Instance A's journal holds ``--records`` N records (256 B JSON payloads from four
publishers, written through txlog, not measured) and ``--new`` K more (default N/200);
instance B's journal holds copies of A's first N, as B would have stored them had it
received them (origin A, A's origin txids and bookmarks, path through A), but no
cursor for A: the cursor is lost (as for a new destination to an instance that got A's
records through another path, or a failover to the other member of a group). A starts
with an async Destination to B, then B starts. Measured from B's process start (and
from its ready file) until B's journal holds N + K records: the records A sent
(its destination's ``messages_out``; ``resent`` is what B already held), what the
exchange proved B holds (``resync_skipped``) and the bytes on the wire.

``--no-exchange`` marks B's journal as one written before holdings existed (meta
``holdings`` = ``off``): B's welcome then answers nothing, which is what an older
amps-py downstream does, and A resends its whole journal, the behaviour before the
exchange. ``--compare`` runs both, exchange first. Each case starts from a fresh copy
of B's journal. The padding of the payloads comes from ``--seed``.

``--write-cost`` measures instead what keeping holdings costs the journal's writer:
CPU seconds (``process_time``) per record to stage ``--records`` records in batches of
16 into a journal and commit LMDB every 1,024 records: with ``fsync`` durability
behind the commit log (as the server's event loop stages and its writer thread
commits; the fsync's own CPU time counts, and varies), then with ``page-cache``
durability (no commit log: each batch is its own LMDB transaction, the worst case for
holdings, updated once per transaction); into a journal that keeps holdings and into
one marked as from before them (which keeps none), alternately, ``--rounds`` rounds;
records published here, then received from another origin. The minimum of each, for
staging and for committing, is printed as ``[with holdings, without]``.

    python tools/bench/bench_cursorless_resync.py
    python tools/bench/bench_cursorless_resync.py --records 1000000 --compare
    python tools/bench/bench_cursorless_resync.py --write-cost --records 50000
"""

from __future__ import annotations

import argparse
import base64
import itertools
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replication import Node, destination_xml, poll
from common import emit, env_info

from txlog import Journal, Record, publisher_hash

BATCH = 20_000
PUBLISHERS = 4


def records(n: int, size: int, seed: int, *, replicas: bool) -> list[list[Record]]:
    """A's first ``n`` records in batches: as A journals them (its own), or as B
    stores them having received them from A (``replicas``)."""
    rng = random.Random(seed)
    pubs = [(publisher_hash(f"feed-{i}"), f"feed-{i}") for i in range(PUBLISHERS)]
    pads = [base64.b64encode(rng.randbytes(size))[: size - 30] for _ in pubs]
    batches: list[list[Record]] = []
    for start in range(0, n, BATCH):
        batch = []
        for k in range(start, min(n, start + BATCH)):
            ph, cname = pubs[k % PUBLISHERS]
            batch.append(
                Record(
                    topic="bench",
                    payload=b'{"id":%010d,"pad":"%s"}' % (k, pads[k % PUBLISHERS]),
                    pub_hash=ph,
                    seq=k // PUBLISHERS + 1,
                    client_name=cname,
                    origin="A",
                    # A's own records get origin txid = txid: 1, 2, ... on an empty journal
                    origin_txid=k + 1 if replicas else 0,
                    path=(("A", "ga"),) if replicas else (),
                )
            )
        batches.append(batch)
    return batches


def build(path: Path, name: str, batches: list[list[Record]]) -> float:
    t0 = time.perf_counter()
    with Journal(path, instance_name=name, durability="page-cache") as j:
        ts = time.time_ns() // 1000 - 10_000_000
        for batch in batches:
            j.append(batch, ts)
    return time.perf_counter() - t0


def forget_holdings(journal: Path) -> None:
    """Make B's journal look written by an amps-py without holdings (--no-exchange)."""
    env = lmdb.open(str(journal), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"holdings", b"off")
    env.close()


def run_case(a: argparse.Namespace, work: Path, pristine: Path, exchange: bool) -> dict[str, Any]:
    total = a.records + a.new
    A = Node(work, "A", "ga", "fsync")
    B = Node(work, "B", "gb", "fsync")
    shutil.rmtree(B.journal, ignore_errors=True)
    shutil.copytree(pristine, B.journal)
    if not exchange:
        forget_holdings(B.journal)
    A.destinations = [destination_xml("B", "gb", False, B.reserve_repl_port())]
    try:
        A.start()
        poll("A's statistics", A.stats, 10)
        t0 = time.perf_counter()
        B.spawn()
        t_ready: float | None = None
        deadline = t0 + a.timeout
        while True:
            now = time.perf_counter()
            if t_ready is None and B.ready_file.exists():
                t_ready = now
            if B.records() >= total:
                break
            if now > deadline:
                a.keep = True
                raise RuntimeError(
                    f"B holds {B.records()} of {total} after {a.timeout} s; A's destination: "
                    f"{A.destination('B')}; files in {work}"
                )
            B.check_alive()
            time.sleep(0.01)
        done = time.perf_counter()

        def sent_new() -> dict[str, Any] | None:
            d = A.destination("B")
            return d if d and d["messages_out"] >= a.new else None

        d = poll("A's destination statistics", sent_new, 10, 0.05)
        time.sleep(0.6)  # the statistics file is rewritten four times a second
        d = A.destination("B") or d
        assert t_ready is not None
        return {
            "bench": "cursorless_resync",
            "case": "exchange" if exchange else "no-exchange",
            "b_holds": a.records,
            "new": a.new,
            "records_sent": d["messages_out"],
            "resent": d["messages_out"] - a.new,
            "resent_pct": round(100 * (d["messages_out"] - a.new) / a.records, 3),
            "resync_skipped": d["resync_skipped"],
            "b_start_to_done_s": round(done - t0, 3),
            "b_ready_to_done_s": round(done - t_ready, 3),
            "bytes_out": d["bytes_out"],
        }
    finally:
        B.stop()
        A.stop()


def write_cost(
    work: Path, n: int, durability: str, *, holdings: bool, received: bool
) -> tuple[float, float]:
    """CPU µs per record to stage ``n`` records 16 at a time, and to commit LMDB every
    1,024 (with ``fsync``: behind the commit log; ``page-cache``: nothing to commit)."""
    path = work / f"cost-{holdings}-{received}"
    shutil.rmtree(path, ignore_errors=True)
    Journal(path, instance_name="A").close()
    if not holdings:
        forget_holdings(path)
    ph = publisher_hash("feed")
    cpu = committing = 0.0
    with Journal(path, instance_name="A", durability=durability) as j:
        assert j.holdings_valid == holdings
        for start in range(0, n, 16):
            batch = [
                Record(
                    topic="bench",
                    payload=b'{"id":%d,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' % k,
                    pub_hash=ph,
                    seq=k + 1,
                    client_name="feed",
                    origin="X" if received else "A",
                    origin_txid=k + 1 if received else 0,
                    path=(("X", "gx"),) if received else (),
                )
                for k in range(start, min(n, start + 16))
            ]
            t0 = time.process_time()
            j.stage(batch, 1)
            t1 = time.process_time()
            if (start // 16) % 64 == 63:
                j.commit()
            cpu += t1 - t0
            committing += time.process_time() - t1
    shutil.rmtree(path, ignore_errors=True)
    return cpu / n * 1e6, committing / n * 1e6


def bench_write_cost(a: argparse.Namespace, work: Path) -> None:
    for durability, received in itertools.product(("fsync", "page-cache"), (False, True)):
        stage = {True: float("inf"), False: float("inf")}
        commit = dict(stage)
        for _ in range(a.rounds):
            for holdings in (True, False):
                cost = write_cost(work, a.records, durability, holdings=holdings, received=received)
                stage[holdings] = min(stage[holdings], cost[0])
                commit[holdings] = min(commit[holdings], cost[1])
        result = {
            "bench": "holdings_write_cost",
            "records": a.records,
            "durability": durability,
            "received": received,
            "stage_cpu_us_per_record": [round(stage[True], 2), round(stage[False], 2)],
            "commit_cpu_us_per_record": [round(commit[True], 2), round(commit[False], 2)],
            "difference_us": round(stage[True] + commit[True] - stage[False] - commit[False], 2),
        }
        emit(result, a.out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=100_000, help="records B already holds")
    ap.add_argument("--new", type=int, default=None, help="records only A holds (N/200)")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--seed", type=int, default=28)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-exchange", action="store_true", help="the resync before it")
    mode.add_argument("--compare", action="store_true", help="with and without the exchange")
    mode.add_argument(
        "--write-cost", action="store_true", help="what keeping holdings costs the writer"
    )
    ap.add_argument("--rounds", type=int, default=3, help="--write-cost: rounds (min taken)")
    ap.add_argument("--timeout", type=float, default=900, help="give up after (s)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    if a.new is None:
        a.new = max(1, a.records // 200)
    print("#", env_info(), flush=True)
    print("# command:", " ".join(["python", *sys.argv]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="amps-bench-cursorless-"))
    if a.write_cost:
        try:
            bench_write_cost(a, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        own = records(a.records + a.new, a.size, a.seed, replicas=False)
        fill_a = build(work / "A-journal", "A", own)
        copies = records(a.records, a.size, a.seed, replicas=True)
        fill_b = build(work / "B-pristine", "B", copies)
        mb = (work / "A-journal" / "data.mdb").stat().st_size / 1e6
        print(
            f"# built A ({a.records + a.new:,} records, {mb:.0f} MB) in {fill_a:.1f} s and "
            f"B ({a.records:,}, no cursor for A) in {fill_b:.1f} s",
            flush=True,
        )
        cases = [True, False] if a.compare else [not a.no_exchange]
        results = [run_case(a, work, work / "B-pristine", exchange) for exchange in cases]
        print(
            f"\n{'case':<12} {'B holds':>10} {'new':>7} {'sent':>10} {'resent':>16} "
            f"{'proven held':>12} {'B start->done s':>16} {'ready->done s':>14} {'wire MB':>8}"
        )
        for r in results:
            resent = f"{r['resent']:,} ({r['resent_pct']:g} %)"
            print(
                f"{r['case']:<12} {r['b_holds']:>10,} {r['new']:>7,} {r['records_sent']:>10,} "
                f"{resent:>16} {r['resync_skipped']:>12,} {r['b_start_to_done_s']:>16.2f} "
                f"{r['b_ready_to_done_s']:>14.2f} {r['bytes_out'] / 1e6:>8.1f}"
            )
        print()
        for r in results:
            emit(r, a.out)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"# files kept in {work}")


if __name__ == "__main__":
    main()
