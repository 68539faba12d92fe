"""The fabric audit on Spark: do the journals hold what the fabric's configs promise?

``amps-py pipeline audit --config DIR_OR_FILES... --journals DIR...`` (and
``tools/pipeline/audit.py`` under ``spark-submit``) call :func:`prepare_audit` (no
Spark yet: bad configs or journals fail at once), :func:`run_audit` and
:func:`write_report`.

How it runs (the rules are :mod:`amps_py.pipeline.audit_rules`):

1. The configs are loaded on the driver (:func:`amps_py.replication.fabric.load_fabric`); each
   journal is read into a DataFrame with :func:`load_journal`, one per instance.
2. The distinct (origin, topic, message type) of the records are collected. For the
   topics a link filters by content, the executors evaluate the filters on every
   record's payload with the server's :meth:`Route.accepts` (routes rebuilt there
   from a :class:`~amps_py.pipeline.audit_rules.FilterPlan`, plain data: no addresses,
   no credentials leave the driver), giving each record a verdict.
3. On the driver, one simulation per distinct (origin, topic, message type, verdict)
   (:func:`amps_py.replication.fabric.simulate`, with a payload of that verdict when it matters)
   says which instances must hold such a message and by which path; the table is
   broadcast.
4. Records are grouped by bookmark and classified on the executors; records are
   grouped by (instance, publisher) and checked for order; replication lag per link
   and time bucket is aggregated by Spark SQL (exact percentiles). Every finding
   carries the time of the record concerned (``ts_us``); the client names of the
   publishers the findings name reach the driver as one row per publisher, for the
   report's runs (:func:`amps_py.pipeline.audit_report.group_runs`).

Everything the report holds is deterministic for given journals and configs (sorted,
exact), so local mode and a cluster give the same report (its ``run`` part aside).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

from amps_py.config import ConfigError
from amps_py.pipeline.audit_report import (
    AuditReport,
    JournalInfo,
    LagBucket,
    LinkLag,
    render_html,
)
from amps_py.pipeline.audit_rules import (
    Copy,
    Counts,
    Expectation,
    ExpectationKey,
    FilterPlan,
    Finding,
    PubRecord,
    classify_message,
    count_statuses,
    expectation_for,
    reordered,
)
from amps_py.pipeline.sources import (
    export_instances,
    is_export,
    journal_directories,
    old_export_layout,
    read_export,
)
from amps_py.replication.fabric import Fabric, load_fabric

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "AuditError",
    "AuditInputs",
    "JournalSource",
    "find_journals",
    "load_journal",
    "prepare_audit",
    "run_audit",
    "session_conf",
    "write_report",
]

#: rows per Arrow batch when the adapter reads a journal
#: lag bucket widths the automatic choice picks from (microseconds)
_BUCKET_SECONDS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
_BUCKETS_US: Final = tuple(
    [int(s * 1_000_000) for s in _BUCKET_SECONDS]
    + [int(m * 60_000_000) for m in (0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 360, 720, 1440)]
)
#: about this many buckets per plot when the width is chosen automatically
_TARGET_BUCKETS: Final = 60


class AuditError(Exception):
    """The audit cannot run as asked (configs, journals); the message says how to fix
    it."""


# ------------------------------------------------------------------------- journals


@dataclass(frozen=True)
class JournalSource:
    """One instance's records: its journal directory, or an export directory holding
    its Parquet files (``exported``)."""

    path: Path
    instance: str
    exported: bool = False


def find_journals(paths: Iterable[str | os.PathLike[str]]) -> list[JournalSource]:
    """The journals in ``paths``: each is a journal directory (it holds ``data.mdb``),
    an export directory of ``amps-py pipeline export`` (every instance it holds), or
    a directory searched for journal directories below it. The instance is the one the
    journal records as its owner (else the directory's name).

    Raises:
        AuditError: a path does not exist or holds no journal, a journal cannot be
            opened, or two journals belong to the same instance.
    """
    from txlog import Journal, JournalError

    found: list[Path] = []
    exported: list[JournalSource] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            raise AuditError(
                f"--journals {path}: no such directory; give each instance's "
                "TransactionLog/JournalDirectory, or a directory holding them"
            )
        if is_export(path):
            old = old_export_layout(path)
            if old is not None:
                raise AuditError(f"--journals {path}: {old}")
            instances = export_instances(path)
            if not instances:
                raise AuditError(
                    f"--journals {path}: an export directory without a finished export "
                    "(no manifest); run amps-py pipeline export into it first"
                )
            exported.extend(JournalSource(path.resolve(), i, exported=True) for i in instances)
            continue
        below = journal_directories(path)
        if not below:
            raise AuditError(
                f"--journals {path}: holds no journal (no data.mdb in it or below it); "
                "give each instance's TransactionLog/JournalDirectory"
            )
        found.extend(below)
    sources: list[JournalSource] = []
    owners: dict[str, Path] = {}
    for source in exported:
        if source.instance in owners:
            raise AuditError(
                f"two exports hold instance {source.instance!r} ({owners[source.instance]} "
                f"and {source.path}); give one source per instance"
            )
        owners[source.instance] = source.path
        sources.append(source)
    for path in dict.fromkeys(p.resolve() for p in found):
        try:
            with Journal(path, readonly=True) as journal:
                instance = journal.instance_name or path.name
        except JournalError as exc:
            raise AuditError(f"--journals {path}: {exc}") from None
        if instance in owners:
            raise AuditError(
                f"journals {owners[instance]} and {path} both belong to instance "
                f"{instance!r}; give one journal per instance"
            )
        owners[instance] = path
        sources.append(JournalSource(path, instance))
    return sources


def load_source(spark: SparkSession, source: JournalSource) -> DataFrame:
    """``source``'s records: its export's Parquet files, or its journal."""
    if source.exported:
        return read_export(spark, source.path, source.instance)
    return load_journal(spark, source.path)


def load_journal(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """One instance's journal as a DataFrame of :data:`schema.ARROW_SCHEMA` rows, read
    by the ``amps_txlog`` data source (in parallel, by txid ranges, on the executors).

    A damaged record fails the Spark job when it runs, naming the txid; callers turn
    that into an :class:`AuditError` (see :func:`run_audit`).
    """
    return spark.read.format("amps_txlog").load(str(path))


# ------------------------------------------------------------------------- session


def session_conf(master: str | None, conf: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The Spark settings the audit adds to ``conf``: a driver talking to a master on
    this machine binds to 127.0.0.1 (``conf`` wins)."""
    given = dict(conf)
    out: list[tuple[str, str]] = []
    host = urlparse(master).hostname if master and "://" in master else None
    if host in ("127.0.0.1", "localhost", "::1"):
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            if key not in given:
                out.append((key, "127.0.0.1"))
    out.extend(given.items())
    return out


# ------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class AuditInputs:
    """What an audit reads: the fabric, its journals and the config paths given."""

    fabric: Fabric
    sources: tuple[JournalSource, ...]
    configs: tuple[str, ...]


def prepare_audit(
    configs: Sequence[str | os.PathLike[str]], journals: Sequence[str | os.PathLike[str]]
) -> AuditInputs:
    """Load the fabric of ``configs`` (files, or directories of ``*.xml``) and find
    the journals in ``journals`` (journal directories, or directories holding them),
    before any Spark work.

    Raises:
        AuditError: the configs do not load, a journal cannot be opened, or a journal
            belongs to an instance the configs do not name.
    """
    try:
        fabric = load_fabric([Path(c) for c in configs])
    except ConfigError as exc:
        raise AuditError(f"the fabric's configs do not load:\n{exc}") from None
    sources = find_journals(journals)
    strangers = [s for s in sources if s.instance not in fabric.instances]
    if strangers:
        names = ", ".join(f"{s.instance} ({s.path})" for s in strangers)
        raise AuditError(
            f"journals of instances the configs do not name: {names}; the configs name "
            f"{', '.join(fabric.instances)}. Give every instance's config with --config, "
            "or leave those journals out"
        )
    return AuditInputs(fabric, tuple(sources), tuple(str(c) for c in configs))


def run_audit(
    spark: SparkSession, inputs: AuditInputs, *, bucket_s: float | None = None
) -> AuditReport:
    """Audit ``inputs`` (:func:`prepare_audit`) on ``spark``.

    Args:
        spark: the session to run on.
        inputs: the fabric and the journals.
        bucket_s: the width of the lag buckets in seconds; ``None``: about 60 buckets
            over the time the replicated records arrived in, rounded to a round width.

    Raises:
        AuditError: ``bucket_s`` is not positive, or a journal cannot be read (a
            damaged record names its txid).
    """
    if bucket_s is not None and bucket_s <= 0:
        raise AuditError(f"--bucket must be positive, not {bucket_s}")
    frames = [load_source(spark, s) for s in inputs.sources]
    rows = reduce(lambda a, b: a.unionByName(b), frames)
    return _audit(spark, inputs.fabric, inputs.sources, rows, inputs.configs, bucket_s)


def _audit(
    spark: SparkSession,
    fabric: Fabric,
    sources: Sequence[JournalSource],
    rows: DataFrame,
    configs: tuple[str, ...],
    bucket_s: float | None,
) -> AuditReport:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    audited = tuple(s.instance for s in sources)
    base = rows.select(
        "instance",
        "txid",
        "bookmark",
        "publisher_hash",
        "seq",
        "origin",
        "origin_txid",
        "topic",
        "message_type",
        "kind",
        F.xxhash64("payload").alias("fp"),
        "path",
        F.unix_micros("origin_ts").alias("origin_us"),
        F.unix_micros("local_ts").alias("local_us"),
        "payload",
        "client_name",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        journal_rows = (
            base.groupBy("instance")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.min("txid").alias("first"),
                F.max("txid").alias("last"),
            )
            .collect()
        )
        held = {r["instance"]: (r["n"], r["first"], r["last"]) for r in journal_rows}
        combos = sorted(
            (r["origin"], r["topic"], r["message_type"])
            for r in base.select("origin", "topic", "message_type").distinct().collect()
        )
        plan = FilterPlan.from_fabric(fabric, [(t, m) for _, t, m in combos])
        verdicts, samples = _filter_verdicts(spark, base, plan)
        expectations: dict[ExpectationKey, Expectation] = {}
        for origin, topic, message_type in combos:
            if not plan.filtered(topic, message_type):
                expectations[(origin, topic, message_type, "")] = expectation_for(
                    fabric, origin, topic, message_type, None
                )
        for key, payload in samples.items():
            origin, topic, message_type, _ = key
            expectations[key] = expectation_for(fabric, origin, topic, message_type, payload)
        expect = spark.sparkContext.broadcast(expectations)
        with_verdict = (
            base.join(verdicts, ["instance", "txid"], "left").fillna({"verdict": ""})
            if verdicts is not None
            else base.withColumn("verdict", F.lit(""))
        ).drop("payload")
        counts, findings, messages = _classify(with_verdict, expect, audited)
        findings.extend(_order(with_verdict, expect))
        for instance in audited:
            c = counts.setdefault(instance, Counts())
            c.held = held.get(instance, (0, 0, 0))[0]
        for f in findings:
            if f.kind == "reordered":
                counts[f.instance].reordered += 1
        findings.sort(key=Finding.sort_key)
        publishers = _publishers(base, {f.publisher_hash for f in findings})
        bucket_us, links = _lag(base, fabric, bucket_s)
    finally:
        base.unpersist()
    journals = tuple(
        JournalInfo(
            s.instance,
            str(s.path),
            held.get(s.instance, (0, 0, 0))[0],
            held.get(s.instance, (0, 0, 0))[1],
            held.get(s.instance, (0, 0, 0))[2],
        )
        for s in sources
    )
    return AuditReport(
        instances=tuple(fabric.instances),
        journals=journals,
        messages=messages,
        counts={name: counts[name] for name in audited},
        findings=findings,
        links=links,
        bucket_us=bucket_us,
        configs=configs,
        publishers=publishers,
        run={
            "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "spark_master": spark.sparkContext.master,
            "spark_version": spark.version,
        },
    )


def _filter_verdicts(
    spark: SparkSession, base: DataFrame, plan: FilterPlan
) -> tuple[DataFrame | None, dict[ExpectationKey, bytes]]:
    """Each record on a content-filtered topic gets its filter verdict (a DataFrame
    of instance, txid, verdict), and every (origin, topic, type, verdict) one sample
    payload (the smallest, so the choice is deterministic)."""
    from pyspark.sql import functions as F

    if not plan.relevant:
        return None, {}
    pairs = spark.createDataFrame(
        sorted(plan.relevant), "topic STRING, message_type STRING"
    ).distinct()
    filtered = base.join(F.broadcast(pairs), ["topic", "message_type"]).select(
        "instance", "txid", "origin", "topic", "message_type", "payload"
    )
    shipped = spark.sparkContext.broadcast(plan)

    def judge(rows: Iterable[Any]) -> Iterator[tuple[str, int, str, str, str, str, bytes]]:
        filters = shipped.value
        for r in rows:
            payload = bytes(r["payload"])
            verdict = filters.verdict(r["topic"], r["message_type"], payload)
            yield (
                r["instance"],
                r["txid"],
                r["origin"],
                r["topic"],
                r["message_type"],
                verdict,
                payload,
            )

    judged = filtered.rdd.mapPartitions(judge).cache()
    samples = dict(
        judged.map(lambda j: ((j[2], j[3], j[4], j[5]), j[6]))
        .reduceByKey(lambda a, b: min(a, b))
        .collect()
    )
    verdicts = spark.createDataFrame(
        judged.map(lambda j: (j[0], j[1], j[5])), "instance STRING, txid BIGINT, verdict STRING"
    )
    return verdicts, samples


def _classify(
    frame: DataFrame, expect: Any, audited: tuple[str, ...]
) -> tuple[dict[str, Counts], list[Finding], int]:
    """Classify every message (grouped by bookmark) on the executors; returns the
    counts per instance, the findings and the number of messages."""
    from pyspark.sql import functions as F

    grouped = frame.groupBy("bookmark").agg(
        F.collect_list(
            F.struct(
                "instance",
                "txid",
                "origin",
                "origin_txid",
                "topic",
                "message_type",
                "kind",
                "fp",
                "path",
                "verdict",
                "local_us",
                "origin_us",
            )
        ).alias("copies")
    )

    def classify(groups: Iterable[Any]) -> Iterator[tuple[str, Any]]:
        expectations = expect.value
        statuses: list[tuple[str, str]] = []
        messages = 0
        for g in groups:
            messages += 1
            copies = [
                Copy(
                    c["instance"],
                    c["txid"],
                    c["origin"],
                    c["origin_txid"],
                    c["topic"],
                    c["message_type"],
                    c["kind"],
                    c["fp"],
                    tuple(c["path"]),
                    c["verdict"],
                    local_us=c["local_us"] or 0,
                    origin_us=c["origin_us"] or 0,
                )
                for c in g["copies"]
            ]
            outcome = classify_message(g["bookmark"], copies, expectations, audited)
            statuses.extend(outcome.statuses)
            for f in outcome.findings:
                yield ("finding", f.as_dict())
        for instance, counts in count_statuses(statuses).items():
            yield ("counts", (instance, counts.as_dict()))
        yield ("messages", messages)

    counts: dict[str, Counts] = {}
    findings: list[Finding] = []
    messages = 0
    for kind, value in grouped.rdd.mapPartitions(classify).collect():
        if kind == "finding":
            findings.append(Finding.from_dict(value))
        elif kind == "counts":
            instance, values = value
            counts.setdefault(instance, Counts()).add(Counts(**values))
        else:
            messages += value
    return counts, findings, messages


def _order(frame: DataFrame, expect: Any) -> list[Finding]:
    """The reordered findings, per (instance, publisher) on the executors."""
    from pyspark.sql import functions as F

    grouped = frame.groupBy("instance", "publisher_hash").agg(
        F.collect_list(
            F.struct(
                "txid",
                "seq",
                "bookmark",
                "origin",
                "topic",
                "message_type",
                "verdict",
                "local_us",
            )
        ).alias("records")
    )

    def check(groups: Iterable[Any]) -> Iterator[dict[str, Any]]:
        expectations = expect.value
        for g in groups:
            records = [
                PubRecord(
                    r["txid"],
                    r["seq"],
                    r["bookmark"],
                    r["origin"],
                    r["topic"],
                    r["message_type"],
                    r["verdict"],
                    r["local_us"] or 0,
                )
                for r in g["records"]
            ]
            for f in reordered(g["instance"], records, expectations):
                yield f.as_dict()

    return [Finding.from_dict(d) for d in grouped.rdd.mapPartitions(check).collect()]


#: at most this many publisher hashes are named in one filter (more: all are read)
_NAMED_AT_ONCE: Final = 1000


def _publishers(base: DataFrame, hashes: set[str]) -> dict[str, str]:
    """The client name of each publisher hash in ``hashes`` (the publishers the
    findings name), as its records hold it; names joined by `` / `` in the unlikely
    case a hash's records hold several. One row per distinct publisher reaches the
    driver."""
    from pyspark.sql import functions as F

    if not hashes:
        return {}
    frame = base.select("publisher_hash", "client_name")
    if len(hashes) <= _NAMED_AT_ONCE:
        frame = frame.where(F.col("publisher_hash").isin(sorted(hashes)))
    rows = (
        frame.groupBy("publisher_hash")
        .agg(F.array_sort(F.collect_set("client_name")).alias("names"))
        .collect()
    )
    out = {}
    for r in rows:
        if r["publisher_hash"] in hashes:
            names = [n for n in r["names"] if n]
            out[r["publisher_hash"]] = " / ".join(names)
    return dict(sorted(out.items()))


def _link_label(fabric: Fabric, sender: str, receiver: str) -> str:
    for link in fabric.links.get(sender, ()):
        if receiver in link.targets:
            return f"Destination {link.name}, {link.destination.sync_type}"
    return "no Destination in the configs"


def choose_bucket(span_us: int, bucket_s: float | None) -> int:
    """The lag bucket width in microseconds: ``bucket_s`` when given, else the
    smallest round width that cuts ``span_us`` into at most about 60 buckets."""
    if bucket_s is not None:
        return max(1, round(bucket_s * 1_000_000))
    for width in _BUCKETS_US:
        if span_us / width <= _TARGET_BUCKETS:
            return width
    return _BUCKETS_US[-1]


def _lag(base: DataFrame, fabric: Fabric, bucket_s: float | None) -> tuple[int, list[LinkLag]]:
    """Lag per link (sender = the last hop of the path, receiver = the instance) and
    per time bucket of arrival, with exact percentiles."""
    from pyspark.sql import functions as F

    hops = base.where(F.size("path") > 0).select(
        F.element_at("path", -1).alias("sender"),
        F.col("instance").alias("receiver"),
        (F.col("local_us") - F.col("origin_us")).alias("lag_us"),
        F.col("local_us").alias("t_us"),
    )
    span = hops.agg(F.min("t_us").alias("lo"), F.max("t_us").alias("hi")).first()
    if span is None or span["lo"] is None:
        return choose_bucket(0, bucket_s), []
    bucket_us = choose_bucket(int(span["hi"]) - int(span["lo"]), bucket_s)

    def stats(frame: DataFrame, *keys: Any) -> list[Any]:
        return (
            frame.groupBy(*keys)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.expr("percentile(lag_us, array(0.5, 0.99))").alias("p"),
                F.max("lag_us").alias("max"),
            )
            .collect()
        )

    overall = stats(hops, "sender", "receiver")
    bucketed = stats(
        hops.withColumn("bucket", F.floor(F.col("t_us") / bucket_us) * bucket_us),
        "sender",
        "receiver",
        "bucket",
    )
    per_link: dict[tuple[str, str], list[LagBucket]] = {}
    for r in bucketed:
        per_link.setdefault((r["sender"], r["receiver"]), []).append(
            LagBucket(
                int(r["bucket"]),
                int(r["n"]),
                _ms(r["p"][0]),
                _ms(r["p"][1]),
                _ms(r["max"]),
            )
        )
    links = [
        LinkLag(
            r["sender"],
            r["receiver"],
            _link_label(fabric, r["sender"], r["receiver"]),
            int(r["n"]),
            _ms(r["p"][0]),
            _ms(r["p"][1]),
            _ms(r["max"]),
            tuple(sorted(per_link.get((r["sender"], r["receiver"]), []), key=lambda b: b.start_us)),
        )
        for r in overall
    ]
    links.sort(key=lambda link: (link.sender, link.receiver))
    return bucket_us, links


def _ms(us: float) -> float:
    return round(float(us) / 1000.0, 3)


# ------------------------------------------------------------------------- output


def write_report(report: AuditReport, out: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``audit.html`` into ``out`` (created if missing);
    returns their paths."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / "audit.json"
    html_path = folder / "audit.html"
    json_path.write_text(report.to_json(), encoding="utf-8")
    html_path.write_text(render_html(report), encoding="utf-8")
    return json_path, html_path
