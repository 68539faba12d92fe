#!/usr/bin/env python3
"""Reading a journal for analysis: the ``amps_txlog`` Spark data source against plain
single-process Python readers of the same LMDB journal (and Parquet export, when
``amps_py.pipeline.export`` is installed).

1. Fills a journal with ``--records`` records (256 B JSON, 4 publishers, 3 topics)
   through the txlog library in large batches (the fill is not measured), or reuses
   ``--journal``.
2. Single process, no Spark:
   - ``read``: ``Journal.read`` alone (a Record per record);
   - ``read+records_to_batch``: the same plus ``schema.records_to_batch`` (Arrow);
   - ``read_stored+stored_to_batch``: what each data source partition does
     (``readplan.read_range``: checked stored values, columns built at once).
3. Spark (``--master``, default ``local[*]``): the session start, then per run
   ``spark.read.format("amps_txlog").load(journal)`` written to Spark's ``noop``
   sink (every row and column produced, nothing stored) and a group-by
   (topic, client_name) count.
4. Export (``amps_py.pipeline.export``), when that module can be imported: rows/s of
   a full export into a fresh directory.

Every figure is rows per second of the median run; ``--json FILE`` appends the result.

    python tools/bench/bench_pipeline.py --records 1000000
    python tools/bench/bench_pipeline.py --records 1000000 --skip-spark
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info

from amps_py.pipeline.readplan import ReadPlan, read_range
from amps_py.pipeline.schema import records_to_batch
from txlog import Journal, Record, publisher_hash

TOPICS = ("orders", "trades", "quotes")


def fill(journal_dir: Path, n: int, size: int) -> float:
    t0 = time.perf_counter()
    pubs = [(publisher_hash(f"filler-{i}"), f"filler-{i}") for i in range(4)]
    body = b'{"id":%010d,"pad":"' + b"x" * (size - 30) + b'"}'
    with Journal(journal_dir, instance_name="bench", durability="page-cache") as j:
        done = 0
        ts = time.time_ns() // 1000 - n
        while done < n:
            recs = []
            for k in range(done, min(n, done + 20_000)):
                ph, name = pubs[k % 4]
                recs.append(
                    Record(
                        topic=TOPICS[k % 3],
                        payload=body % k,
                        pub_hash=ph,
                        seq=k // 4 + 1,
                        client_name=name,
                    )
                )
            j.append(recs, ts + done)
            done += len(recs)
    return time.perf_counter() - t0


def timed(runs: int, work: Callable[[], int]) -> dict[str, Any]:
    """Median rows/s of ``runs`` calls of ``work`` (which returns the rows it made)."""
    rates, rows = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        rows = work()
        rates.append(rows / (time.perf_counter() - t0))
    return {"rows": rows, "rows_per_s": round(statistics.median(rates)), "runs": runs}


def python_readers(journal: Path, runs: int) -> dict[str, Any]:
    def read_only() -> int:
        n = after = 0
        with Journal(journal, readonly=True) as j:
            while batch := j.read(after, 8192):
                n += len(batch)
                after = batch[-1].txid
        return n

    def read_and_convert() -> int:
        n = after = 0
        with Journal(journal, readonly=True) as j:
            while batch := j.read(after, 8192):
                n += records_to_batch("bench", batch).num_rows
                after = batch[-1].txid
        return n

    def data_source_path() -> int:
        with Journal(journal, readonly=True) as j:
            last = j.last_txid
        return sum(b.num_rows for b in read_range(ReadPlan(path=str(journal)), 0, last))

    return {
        "read": timed(runs, read_only),
        "read+records_to_batch": timed(runs, read_and_convert),
        "read_stored+stored_to_batch": timed(runs, data_source_path),
    }


def spark_reader(journal: Path, runs: int, master: str | None) -> dict[str, Any]:
    from amps_py.pipeline.spark import spark_session

    t0 = time.perf_counter()
    spark = spark_session("amps-py-bench", master)
    start_s = time.perf_counter() - t0
    parallelism = spark.sparkContext.defaultParallelism
    try:
        df = spark.read.format("amps_txlog").load(str(journal))
        n = df.count()  # warms the Python workers; also the row count

        def full_scan() -> int:
            df.write.format("noop").mode("overwrite").save()
            return n

        def group_by() -> int:
            df.groupBy("topic", "client_name").count().collect()
            return n

        partitions = df.rdd.getNumPartitions()
        return {
            "session_start_s": round(start_s, 1),
            "master": spark.sparkContext.master,
            "parallelism": parallelism,
            "partitions": partitions,
            "full_scan_noop": timed(runs, full_scan),
            "group_by_topic_client": timed(runs, group_by),
        }
    finally:
        spark.stop()


def exporter(journal: Path, runs: int, workdir: Path) -> dict[str, Any] | str:
    """Rows/s of ``amps_py.pipeline.export`` when it exists (else why not measured).

    Calls its ``export_journal(journal, out)`` (the function behind
    ``amps-py pipeline export JOURNAL OUT``) into a fresh directory each run; the
    result's ``rows`` is the row count."""
    try:
        module = importlib.import_module("amps_py.pipeline.export")
    except ImportError as exc:
        return f"not measured: amps_py.pipeline.export cannot be imported ({exc})"
    run = getattr(module, "export_journal", None)
    if run is None:
        return "not measured: amps_py.pipeline.export has no export_journal(journal, out)"

    def once() -> int:
        out = workdir / "export"
        shutil.rmtree(out, ignore_errors=True)
        return int(run(journal, out).rows)

    return timed(runs, once)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--journal", type=Path, help="read this journal instead of filling one")
    ap.add_argument("--master", default=None, help="Spark master (default local[*])")
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the filled journal")
    ap.add_argument("--json", type=Path, default=None, help="append the result here")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="amps-bench-pipeline-"))
    journal = args.journal or workdir / "journal"
    result: dict[str, Any] = {"bench": "pipeline", **env_info()}
    try:
        if args.journal is None:
            result["fill_s"] = round(fill(journal, args.records, args.size), 1)
        with Journal(journal, readonly=True) as j:
            result["records"] = j.last_txid
        result["python"] = python_readers(journal, args.runs)
        result["export"] = exporter(journal, args.runs, workdir)
        if not args.skip_spark:
            result["spark"] = spark_reader(journal, args.runs, args.master)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"journal kept in {journal}", file=sys.stderr)
    emit(result, args.json)


if __name__ == "__main__":
    main()
