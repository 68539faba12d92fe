#!/usr/bin/env python3
"""Parquet export throughput (``amps-py pipeline export``) against a plain reader.

1. Fills a journal with ``--messages`` records (256 B JSON payloads, 4 publishers,
   ``--topics`` topics, over about a day of local timestamps) through the txlog
   library (the fill is not what is measured), or uses ``--journal`` as it is.
2. Plain reader: ``Journal.read`` in chunks of 8192 over every record (decoded
   ``Record`` objects; what any single-process Python reader pays).
3. Reader + Arrow: the same, each chunk turned into an Arrow batch
   (``amps_py.pipeline.schema.records_to_batch``).
4. Export: ``export_journal`` into an empty directory (Arrow, rows ordered by topic
   with a row group per topic, one zstd Parquet file per commit under ``date=...``,
   checksums, fsync, manifests, publication by rename), then an incremental run with
   nothing new.

Prints one JSON line per figure (records/s, seconds; the export's files and bytes).

    python tools/bench/bench_export.py --messages 1000000
    python tools/bench/bench_export.py --journal PATH   # an existing journal
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info

from amps_py.pipeline.export import READ_CHUNK, export_journal
from amps_py.pipeline.schema import records_to_batch
from txlog import Journal, Record, publisher_hash

DAY_US = 86_400_000_000


def fill(journal_dir: Path, n: int, size: int, topics: int) -> float:
    t0 = time.perf_counter()
    pubs = [(publisher_hash(f"filler-{i}"), f"filler-{i}") for i in range(4)]
    body = b'{"id":%010d,"pad":"' + b"x" * (size - 30) + b'"}'
    step = DAY_US // max(n, 1)
    start_ts = time.time_ns() // 1000 - DAY_US
    with Journal(journal_dir, instance_name="bench", durability="page-cache") as j:
        seq = 0
        batch = 20_000
        while seq < n:
            recs = []
            for k in range(seq, min(n, seq + batch)):
                ph, cname = pubs[k % 4]
                recs.append(
                    Record(
                        topic=f"orders.{k % topics}",
                        payload=body % k,
                        pub_hash=ph,
                        seq=k // 4 + 1,
                        client_name=cname,
                    )
                )
            j.append(recs, start_ts + seq * step)
            seq += len(recs)
    return time.perf_counter() - t0


def plain_read(journal_dir: Path, to_arrow: bool) -> tuple[int, float]:
    t0 = time.perf_counter()
    count = 0
    with Journal(journal_dir, readonly=True) as j:
        after = 0
        while True:
            recs = j.read(after, READ_CHUNK)
            if not recs:
                break
            if to_arrow:
                records_to_batch("bench", recs)
            count += len(recs)
            after = recs[-1].txid
    return count, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--journal", type=Path, default=None, help="use this journal as it is")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        journal = args.journal
        if journal is None:
            journal = work / "journal"
            seconds = fill(journal, args.messages, args.size, args.topics)
            emit({"bench": "export", "step": "fill", "records": args.messages,
                  "seconds": round(seconds, 2), **env_info()}, args.out)  # fmt: skip
        for name, arrow in (("plain reader", False), ("reader + arrow", True)):
            count, seconds = plain_read(journal, arrow)
            emit({"bench": "export", "step": name, "records": count,
                  "seconds": round(seconds, 2),
                  "records_per_s": round(count / seconds)}, args.out)  # fmt: skip
        out = work / "export"
        result = export_journal(journal, out)
        size = sum(f.bytes for f in result.files)
        emit({"bench": "export", "step": "export", "records": result.rows,
              "seconds": round(result.seconds, 2),
              "records_per_s": round(result.rows_per_second), "files": len(result.files),
              "parquet_bytes": size}, args.out)  # fmt: skip
        again = export_journal(journal, out)
        emit({"bench": "export", "step": "export, nothing new", "records": again.rows,
              "seconds": round(again.seconds, 3)}, args.out)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
