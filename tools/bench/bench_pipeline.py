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

``--audit SIZE...`` measures the fabric audit instead (``amps-py pipeline audit``'s
``run_audit``) on generated journals of a three-instance fabric of about SIZE records
in all (``synthetic_journal.build_audit_fabric``: a sync pair A, B and a downstream C
behind a content filter, with one reordered and one missing message planted every
``--fault-every`` messages). Each size runs in a fresh process with Spark's default
memory (nothing raised; Spark's event log kept in the fabric's directory), timing
the session start and the audit apart; it prints
rows/s (records / audit seconds) per size, checks the report's problem counts
against the planted faults, and the ratio of the sizes' rows/s. ``--cache-dir``
keeps the generated journals for the next run (building 20M records takes minutes):

    python tools/bench/bench_pipeline.py --audit 2M 20M --cache-dir /var/tmp/amps-audit-bench
    python tools/bench/bench_pipeline.py --audit 2M 20M --with-100m --cache-dir ...
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import subprocess
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


# ------------------------------------------------------------------------- the audit


def parse_size(text: str) -> int:
    """``2M``, ``20m``, ``500k`` or a plain number of records."""
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        return int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2M, 20000000)") from None


def audit_fabric(records: int, fault_every: int, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The fabric of about ``records`` records under ``cache``, built unless a finished
    one (its manifest written last) is there."""
    from synthetic_journal import FABRIC_FORMAT, build_audit_fabric

    root = cache / f"audit-fabric-{records}-f{fault_every}-v{FABRIC_FORMAT}"
    manifest = root / "manifest.json"
    if manifest.exists():
        built = json.loads(manifest.read_text())
        built["reused"] = True
        return root, built
    print(f"building a fabric of {records:,} records in {root} ...", file=sys.stderr, flush=True)
    built = build_audit_fabric(root, records, fault_every=fault_every, progress=True)
    manifest.write_text(json.dumps(built))
    built["reused"] = False
    return root, built


def audit_child(root: Path, master: str | None) -> dict[str, Any]:
    """One audit of the fabric in ``root`` in this (fresh) process: session start,
    :func:`run_audit` and the report, timed apart; Spark's settings as
    ``amps-py pipeline audit`` has them (no memory raised)."""
    from amps_py.pipeline.audit import prepare_audit, run_audit, write_report
    from amps_py.pipeline.spark import spark_session

    t0 = time.perf_counter()
    inputs = prepare_audit([root / "configs"], [root / "journals"])
    # Spark's event log (stages, tasks, their memory and spills) beside the journals,
    # to see afterwards where a run spent its time or ran out of memory
    events = root / "eventlog"
    events.mkdir(exist_ok=True)
    spark = spark_session(
        "amps-py-bench-audit",
        master,
        [("spark.eventLog.enabled", "true"), ("spark.eventLog.dir", events.as_uri())],
    )
    started = time.perf_counter()
    try:
        report = run_audit(spark, inputs)
        audited = time.perf_counter()
        write_report(report, root / "report")
        jobs = spark_jobs(spark)
        memory = spark.sparkContext.getConf().get("spark.driver.memory", "default (1g)")
        partitions = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
    return {
        "records": sum(j.records for j in report.journals),
        "session_start_s": round(started - t0, 1),
        "audit_s": round(audited - started, 1),
        "spark_jobs": len(jobs),
        "job_s_by_call": job_seconds_by_call(jobs),
        "driver_memory": memory,
        "cores": partitions,
        "problems": report.problem_counts(),
        "messages": report.messages,
    }


def spark_jobs(spark: Any) -> list[tuple[str, float]]:
    """Every job the session ran: (its call site, seconds from submission to end)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    out = []
    it = jobs.iterator()
    while it.hasNext():
        job = it.next()
        if job.submissionTime().isDefined() and job.completionTime().isDefined():
            took = job.completionTime().get().getTime() - job.submissionTime().get().getTime()
            out.append((str(job.name()).rsplit("/", 1)[-1], took / 1000))
    return out


def job_seconds_by_call(jobs: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds of the jobs per call site (Spark's own stages run as jobs named after
    a Java frame; jobs overlap, so the sum can exceed the wall time)."""
    total: dict[str, float] = {}
    for call, seconds in jobs:
        total[call] = round(total.get(call, 0.0) + seconds, 1)
    return dict(sorted(total.items(), key=lambda item: -item[1]))


def audit_bench(args: argparse.Namespace) -> dict[str, Any]:
    sizes = list(args.audit) + ([100_000_000] if args.with_100m else [])
    temporary = args.cache_dir is None
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="amps-bench-audit-"))
    cache.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    try:
        for records in sizes:
            root, built = audit_fabric(records, args.fault_every, cache)
            command = [sys.executable, __file__, "--audit-child", str(root)]
            if args.master:
                command += ["--master", args.master]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                from amps_py.cli.pipeline import audit_failure

                raise SystemExit(
                    f"the audit of {records:,} records failed (exit {done.returncode}): "
                    f"{audit_failure(RuntimeError(done.stderr))}; Spark's event log is in "
                    f"{root / 'eventlog'}\n" + done.stderr[-3000:]
                )
            run = json.loads(done.stdout.strip().splitlines()[-1])
            expected = {"missing": built["expected"]["missing"], "duplicate": 0}
            expected.update(reordered=built["expected"]["reordered"], phantom=0)
            run.update(
                size=records,
                fabric=str(root),
                build_s=built["build_s"],
                reused=built["reused"],
                expected=expected,
                report_as_expected=run["problems"] == expected,
                rows_per_s=round(run["records"] / run["audit_s"]),
                rows_per_s_with_start=round(
                    run["records"] / (run["audit_s"] + run["session_start_s"])
                ),
            )
            print(
                f"audit of {run['records']:,} records ({run['messages']:,} messages): "
                f"{run['audit_s']} s, {run['rows_per_s']:,} rows/s "
                f"(session start {run['session_start_s']} s; {run['spark_jobs']} Spark jobs; "
                f"driver memory {run['driver_memory']}; problems {run['problems']}, "
                f"{'as planted' if run['report_as_expected'] else 'NOT as planted'}; "
                f"journals {'reused' if built['reused'] else 'built in ' + str(built['build_s'])}"
                f"{'' if built['reused'] else ' s'})",
                file=sys.stderr,
                flush=True,
            )
            results.append(run)
    finally:
        if temporary:
            shutil.rmtree(cache, ignore_errors=True)
    rates = [r["rows_per_s"] for r in results]
    out: dict[str, Any] = {"runs": results}
    if len(rates) > 1:
        out["rows_per_s_max_over_min"] = round(max(rates) / min(rates), 2)
        print(
            f"rows/s, fastest size over slowest: {out['rows_per_s_max_over_min']} "
            "(goal: at most 1.5)",
            file=sys.stderr,
        )
    return out


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
    ap.add_argument(
        "--audit",
        nargs="+",
        type=parse_size,
        metavar="SIZE",
        help="measure the fabric audit on generated journals of SIZE records (e.g. 2M 20M)",
    )
    ap.add_argument("--with-100m", action="store_true", help="--audit also 100M records")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep the audit's generated journals here and reuse them (default: a "
        "temporary directory, removed)",
    )
    ap.add_argument(
        "--fault-every",
        type=int,
        default=100_000,
        help="plant a reordered and a missing message every this many messages",
    )
    ap.add_argument("--audit-child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.audit_child:
        emit(audit_child(args.audit_child, args.master), None)
        return
    if args.audit or args.with_100m:
        if not args.audit:
            args.audit = []
        emit({"bench": "pipeline-audit", **env_info(), **audit_bench(args)}, args.json)
        return

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
