"""Benchmark of the SOW store alone (no server): apply, full scan, filtered select.

Run with ``python tools/bench/bench_sow_store.py [--records N] [--size B] [--batch B]``.
A program, not a test: it prints one JSON line per phase (``--out`` appends them to a
file too) and exits 0.

Phases:

* ``apply``: N records of B-byte JSON payloads, generated keys, in ``apply`` calls of
  ``--batch`` upserts each (one LMDB write transaction per call, as the server applies
  a commit batch); ``records_per_s`` counts the time in ``apply`` only, and
  ``with_generation_records_per_s`` includes making the payloads and keys;
* ``scan``: every entry through ``entries()`` (one read snapshot, decoded entries);
* ``select``: a filter matching 1 in 10 records (``matches_json`` on each payload);
* ``select_top``: the same filter with ``OrderBy /price DESC`` and ``top_n=100``;
* ``snapshot_open``: taking a snapshot while the store holds N records;
* ``reopen``: closing and reopening the store (count, bytes, applied_txid are read
  from one meta record, not by a scan).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info

from amps_py.filters import compile_filter
from amps_py.sow import SowEntry, SowKeyer, SowStore, parse_orderby, select


def payload_of(i: int, size: int) -> bytes:
    base = {"id": i, "sym": f"S{i % 500}", "price": (i * 7919) % 10007 / 10, "bucket": i % 10}
    raw = orjson.dumps({**base, "pad": ""})
    pad = max(0, size - len(raw))
    return orjson.dumps({**base, "pad": "x" * pad})


def rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256, help="payload bytes per record")
    ap.add_argument("--batch", type=int, default=4096, help="upserts per apply()")
    ap.add_argument("--dir", type=Path, default=None, help="store directory (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="bench-sow-"))
    directory = base / "sow-bench"
    keyer = SowKeyer("bench", ["/id"])
    common = {"records": a.records, "size": a.size}

    store = SowStore(directory, "bench", transient=True)
    start = time.perf_counter()
    in_store = 0.0
    txid = 0
    for first in range(0, a.records, a.batch):
        batch = []
        for i in range(first, min(first + a.batch, a.records)):
            txid += 1
            payload = payload_of(i, a.size)
            key = keyer.key_of({"id": i})
            batch.append(SowEntry(key, txid, f"bm{txid}", "", txid, payload))
        before = time.perf_counter()
        store.apply(batch, [], txid)
        in_store += time.perf_counter() - before
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "apply",
            **common,
            "batch": a.batch,
            "records_per_s": round(a.records / in_store),
            "mb_per_s": round(store.bytes / in_store / 1e6, 1),
            "apply_s": round(in_store, 2),
            "with_generation_records_per_s": round(a.records / elapsed),
            "store_count": store.count,
            "payload_mb": round(store.bytes / 1e6, 1),
            "file_mb": round(store.file_bytes / 1e6, 1),
            "rss_mb": rss_mb(),
        },
        a.out,
    )

    start = time.perf_counter()
    scanned = sum(1 for _ in store.entries())
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "scan",
            **common,
            "records_per_s": round(scanned / elapsed),
            "elapsed": round(elapsed, 2),
        },
        a.out,
    )

    f = compile_filter("/bucket = 3")
    start = time.perf_counter()
    with store.snapshot() as snap:
        found = select(snap, lambda e: f.matches_json(e.payload))
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "select",
            **common,
            "filter": "/bucket = 3",
            "matched": len(found),
            "records_per_s": round(a.records / elapsed),
            "elapsed": round(elapsed, 2),
        },
        a.out,
    )

    order = parse_orderby("/price DESC")
    start = time.perf_counter()
    with store.snapshot() as snap:
        top = select(snap, lambda e: f.matches_json(e.payload), order, top_n=100)
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "select_top",
            **common,
            "filter": "/bucket = 3",
            "orderby": "/price DESC",
            "top_n": 100,
            "returned": len(top),
            "records_per_s": round(a.records / elapsed),
            "elapsed": round(elapsed, 2),
        },
        a.out,
    )

    rounds = 1000
    start = time.perf_counter()
    for _ in range(rounds):
        with store.snapshot():
            pass
    elapsed = time.perf_counter() - start
    emit({"phase": "snapshot_open", **common, "us": round(elapsed / rounds * 1e6, 1)}, a.out)

    store.close()
    start = time.perf_counter()
    store = SowStore(directory, "bench", transient=False)
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "reopen",
            **common,
            "ms": round(elapsed * 1e3, 2),
            "count_ok": store.count == a.records,
            "rss_mb": rss_mb(),
        },
        a.out,
    )
    store.close()
    if not a.dir:
        for name in os.listdir(directory):
            os.unlink(directory / name)
        os.rmdir(directory)
        os.rmdir(base)


if __name__ == "__main__":
    main()
