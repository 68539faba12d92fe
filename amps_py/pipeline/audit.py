"""The fabric audit on Spark: do the journals hold what the fabric's configs promise?

``amps-py pipeline audit --config DIR_OR_FILES... --journals DIR...`` (and
``tools/pipeline/audit.py`` under ``spark-submit``) call :func:`prepare_audit` (no
Spark yet: bad configs or journals fail at once), :func:`run_audit` and
:func:`write_report`.

How it runs (the rules are :mod:`amps_py.pipeline.audit_rules`):

1. The configs are loaded on the driver (:func:`amps_py.replication.fabric.load_fabric`); each
   journal is read into a DataFrame with :func:`load_journal`, one per instance, once:
   the columns the audit needs are cached, spilling to disk when they do not fit in
   memory.
2. One aggregation gives the records per instance, the distinct (origin, topic,
   message type) and the time span of the replicated records. For the topics a link
   filters by content, the executors evaluate the filters on every such record's
   payload with the server's :meth:`Route.accepts` (routes rebuilt there from a
   :class:`~amps_py.pipeline.audit_rules.FilterPlan`, plain data: no addresses, no
   credentials leave the driver), giving each record a verdict.
3. On the driver, one simulation per distinct (origin, topic, message type, verdict)
   (:func:`amps_py.replication.fabric.simulate`, with a payload of that verdict when it matters)
   says which instances must hold such a message and by which path; the table is
   broadcast.
4. Records are grouped by bookmark (a message's copies: a few rows) and classified on
   the executors. Publisher order is checked with window functions in txid order
   over slices of each (instance, publisher), which Spark sorts and spills (no task
   sorts a whole publisher): only the records of the blocks out of order reach
   Python, a block at a time (see :func:`_order`). Counts and findings come back
   in one job: the counts exact, the findings at most ``keep_findings`` per (class,
   instance, sending instance), the first by publisher and seq (the report says how
   many it left out). Replication lag per link and time bucket is aggregated by
   Spark SQL (exact percentiles), in one job. Every finding carries the time of the
   record concerned (``ts_us``); the client names of the publishers the findings
   name reach the driver as one row per publisher, for the report's runs
   (:func:`amps_py.pipeline.audit_report.group_runs`).

Nothing the driver collects grows with the number of records or of problems (bar the
lag's time buckets, about 60 per link), and Spark holds in memory no more than one
message's copies, one out-of-order block (a message stored far from its place makes
one block of everything in between), and for the exact lag percentiles one count per
distinct lag value (µs) of a link: the audit runs with Spark's default memory at
sizes where those stay small, and on a cluster its shuffles spread over the
executors (one shuffle partition per million records, at least one per core).

Everything the report holds is deterministic for given journals and configs (sorted,
exact), so local mode and a cluster give the same report (its ``run`` part aside).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

from amps_py.config import ConfigError
from amps_py.pipeline.audit_report import (
    AuditReport,
    FindingsLeftOut,
    JournalInfo,
    LagBucket,
    LinkLag,
    render_html,
)
from amps_py.pipeline.audit_rules import (
    PROBLEM_CLASSES,
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
    out_of_order,
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

#: lag bucket widths the automatic choice picks from (microseconds)
_BUCKET_SECONDS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)
_BUCKETS_US: Final = tuple(
    [int(s * 1_000_000) for s in _BUCKET_SECONDS]
    + [int(m * 60_000_000) for m in (0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 360, 720, 1440)]
)
#: about this many buckets per plot when the width is chosen automatically
_TARGET_BUCKETS: Final = 60
#: findings the report lists per kind, instance and sender (the counts count all)
KEEP_FINDINGS: Final = 1000
#: about this many records per shuffle partition (see ``_size_shuffles``)
_SHUFFLE_ROWS: Final = 1_000_000
#: the order check's window functions run over slices of this many txids of one
#: publisher on one instance (see ``_order``), so no task sorts a whole publisher
ORDER_BUCKET_TXIDS: Final = 1 << 16


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
    spark: SparkSession,
    inputs: AuditInputs,
    *,
    bucket_s: float | None = None,
    keep_findings: int = KEEP_FINDINGS,
) -> AuditReport:
    """Audit ``inputs`` (:func:`prepare_audit`) on ``spark``.

    Args:
        spark: the session to run on.
        inputs: the fabric and the journals.
        bucket_s: the width of the lag buckets in seconds; ``None``: about 60 buckets
            over the time the replicated records arrived in, rounded to a round width.
        keep_findings: how many findings the report lists per kind, instance and
            sender (the first by publisher and seq); the counts count every one, and
            the report says how many it left out.

    Raises:
        AuditError: ``bucket_s`` or ``keep_findings`` is not positive, or a journal
            cannot be read (a damaged record names its txid).
    """
    if bucket_s is not None and bucket_s <= 0:
        raise AuditError(f"--bucket must be positive, not {bucket_s}")
    if keep_findings < 1:
        raise AuditError(f"--keep-findings must be at least 1, not {keep_findings}")
    frames = [load_source(spark, s) for s in inputs.sources]
    rows = reduce(lambda a, b: a.unionByName(b), frames)
    return _audit(
        spark, inputs.fabric, inputs.sources, rows, inputs.configs, bucket_s, keep_findings
    )


def _audit(
    spark: SparkSession,
    fabric: Fabric,
    sources: Sequence[JournalSource],
    rows: DataFrame,
    configs: tuple[str, ...],
    bucket_s: float | None,
    keep: int,
) -> AuditReport:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    audited = tuple(s.instance for s in sources)
    # the columns the jobs need (the payload for the filters' verdicts, its hash for
    # the rest), read from the journals once: cached, spilled to disk (compressed,
    # by column) when it does not fit in memory
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
    cached = [base]
    partitions_before = spark.conf.get("spark.sql.shuffle.partitions") or "200"
    try:
        summary = _summary(base)
        records = sum(n for n, _, _ in summary.held.values())
        _size_shuffles(spark, records, partitions_before)
        plan = FilterPlan.from_fabric(fabric, [(t, m) for _, t, m in summary.combos])
        verdicts, samples = _filter_verdicts(spark, base, plan)
        expectations: dict[ExpectationKey, Expectation] = {}
        for origin, topic, message_type in summary.combos:
            if not plan.filtered(topic, message_type):
                expectations[(origin, topic, message_type, "")] = expectation_for(
                    fabric, origin, topic, message_type, None
                )
        for key, payload in samples.items():
            origin, topic, message_type, _ = key
            expectations[key] = expectation_for(fabric, origin, topic, message_type, payload)
        expect = spark.sparkContext.broadcast(expectations)
        slim = base.drop("payload")
        if verdicts is None:
            frame = slim.withColumn("verdict", F.lit(""))
        else:
            cached.append(verdicts)
            frame = (
                slim.join(
                    verdicts.select("origin", "topic", "message_type", "fp", "verdict"),
                    ["origin", "topic", "message_type", "fp"],
                    "left",
                )
                .fillna({"verdict": ""})
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
            cached.append(frame)
        classified, counted, classify_frame = _classify(
            spark, frame, expectations, expect, audited, keep
        )
        cached.append(classify_frame)
        ordered, order_frames = _order(frame, expect, keep)
        cached.extend(order_frames)
        outcome = _collect_outcomes(spark, classified.union(ordered), counted, keep)
        counts = outcome.counts
        for instance in audited:
            c = counts.setdefault(instance, Counts())
            c.held = summary.held.get(instance, (0, 0, 0))[0]
        for (kind, instance, _), found in outcome.found.items():
            if kind == "reordered":
                counts.setdefault(instance, Counts()).reordered += found
        bucket_us, links = _lag(frame, fabric, bucket_s, summary.span)
        publishers = _publishers(frame, {f.publisher_hash for f in outcome.findings})
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions_before)
        for df in cached:
            df.unpersist()
    journals = tuple(
        JournalInfo(
            s.instance,
            str(s.path),
            summary.held.get(s.instance, (0, 0, 0))[0],
            summary.held.get(s.instance, (0, 0, 0))[1],
            summary.held.get(s.instance, (0, 0, 0))[2],
        )
        for s in sources
    )
    return AuditReport(
        instances=tuple(fabric.instances),
        journals=journals,
        messages=outcome.messages,
        counts={name: counts[name] for name in audited},
        findings=outcome.findings,
        links=links,
        bucket_us=bucket_us,
        configs=configs,
        publishers=publishers,
        run={
            "generated_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "spark_master": spark.sparkContext.master,
            "spark_version": spark.version,
        },
        left_out=outcome.left_out,
    )


@dataclass(frozen=True)
class _Summary:
    """What the first pass over the records finds: per instance (records, first
    txid, last txid), the distinct (origin, topic, message type), and the span of
    local times of the replicated records (``None`` when there are none)."""

    held: dict[str, tuple[int, int, int]]
    combos: list[tuple[str, str, str]]
    span: tuple[int, int] | None


def _summary(base: DataFrame) -> _Summary:
    """One aggregation (one Spark job, a few rows to the driver) for the counts per
    instance, the (origin, topic, message type) combinations and the lag's span."""
    from pyspark.sql import functions as F

    hop_us = F.when(F.size("path") > 0, F.col("local_us"))
    rows = (
        base.groupBy("instance", "origin", "topic", "message_type")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("txid").alias("first"),
            F.max("txid").alias("last"),
            F.min(hop_us).alias("lo"),
            F.max(hop_us).alias("hi"),
        )
        .collect()
    )
    held: dict[str, tuple[int, int, int]] = {}
    for r in rows:
        n, first, last = held.get(r["instance"], (0, r["first"], r["last"]))
        held[r["instance"]] = (n + r["n"], min(first, r["first"]), max(last, r["last"]))
    combos = sorted({(r["origin"], r["topic"], r["message_type"]) for r in rows})
    los = [r["lo"] for r in rows if r["lo"] is not None]
    his = [r["hi"] for r in rows if r["hi"] is not None]
    span = (int(min(los)), int(max(his))) if los else None
    return _Summary(held, combos, span)


def _size_shuffles(spark: SparkSession, records: int, configured: str | None) -> None:
    """Shuffle partitions for ``records``: about :data:`_SHUFFLE_ROWS` rows each, at
    least one per core, never fewer than ``configured`` (``--conf
    spark.sql.shuffle.partitions`` can raise it). Few partitions keep a small audit's
    tasks few; many keep a big audit's sorts and aggregations small enough to spill
    in pieces and spread over a cluster's executors."""
    cores = spark.sparkContext.defaultParallelism
    wanted = max(cores, -(-records // _SHUFFLE_ROWS))
    try:
        floor = int(configured) if configured else 0
    except ValueError:
        floor = 0
    if records < _SHUFFLE_ROWS:
        floor = 0  # a small audit: one partition per core beats the default's many
    spark.conf.set("spark.sql.shuffle.partitions", str(max(wanted, floor)))


def _filter_verdicts(
    spark: SparkSession, rows: DataFrame, plan: FilterPlan
) -> tuple[DataFrame | None, dict[ExpectationKey, bytes]]:
    """The filter verdicts of the records on content-filtered topics (a DataFrame of
    origin, topic, message_type, fp, verdict: one row per distinct payload, by its
    hash ``fp``, of each origin, topic and type; a verdict depends on nothing else),
    and every (origin, topic, type, verdict) one sample payload (the smallest, so
    the choice is deterministic).

    ``rows``: the cached records, payloads included. Each payload is judged once,
    not once per copy (a message's copies on every instance share it), on the
    executors; the verdicts are cached without the payloads (the caller unpersists
    them): each task passes on a payload only where it is the smallest so far of its
    key, and one aggregation picks the smallest."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if not plan.relevant:
        return None, {}
    topics = sorted({t for t, _ in plan.relevant})
    wanted = reduce(
        lambda a, b: a | b,
        [
            (F.col("topic") == topic) & (F.col("message_type") == message_type)
            for topic, message_type in sorted(plan.relevant)
        ],
    )
    distinct = ["origin", "topic", "message_type", "fp"]
    filtered = (
        rows.where(F.col("topic").isin(topics) & wanted)
        .select(*distinct, "payload")
        .dropDuplicates(distinct)
    )
    shipped = spark.sparkContext.broadcast(plan)

    def judge(rows: Iterable[Any]) -> Iterator[tuple[str, str, str, int, str, Any]]:
        filters = shipped.value
        smallest: dict[tuple[str, str, str, str], bytes] = {}
        for r in rows:
            payload = bytes(r["payload"])
            verdict = filters.verdict(r["topic"], r["message_type"], payload)
            key = (r["origin"], r["topic"], r["message_type"], verdict)
            least = smallest.get(key)
            sample = None
            if least is None or payload < least:
                smallest[key] = sample = payload
            yield (*key[:3], r["fp"], verdict, sample)

    judged = spark.createDataFrame(
        filtered.rdd.mapPartitions(judge),
        "origin STRING, topic STRING, message_type STRING, fp BIGINT, verdict STRING, "
        "sample BINARY",
        verifySchema=False,
    ).persist(StorageLevel.MEMORY_AND_DISK)
    samples = {
        (r["origin"], r["topic"], r["message_type"], r["verdict"]): bytes(r["sample"])
        for r in judged.where(F.col("sample").isNotNull())
        .groupBy("origin", "topic", "message_type", "verdict")
        .agg(F.min("sample").alias("sample"))
        .collect()
    }
    return judged, samples


#: the rows the classification and the order check hand to the driver: findings
#: (``tag`` "finding": ``doc`` is the finding's JSON, the other columns its group and
#: sort key) and per task the counts (``tag`` "counts", "messages", "found")
_OUT_DDL: Final = (
    "tag STRING, kind STRING, instance STRING, via STRING, pub STRING, seq BIGINT, "
    "detail STRING, txid BIGINT, doc STRING"
)
_OUT_COLUMNS: Final = tuple(
    (name, ddl) for name, ddl in (column.split() for column in _OUT_DDL.split(", "))
)


def _finding_row(f: Finding) -> tuple[str, str, str, str, str, int, str, int, str]:
    via = f.expected_hops[-2] if len(f.expected_hops) >= 2 else ""
    return (
        "finding",
        f.kind,
        f.instance,
        via,
        f.publisher_hash,
        f.seq,
        f.detail,
        f.txids[0] if f.txids else -1,
        json.dumps(f.as_dict()),
    )


class _FirstFindings:
    """One task's findings: the first ``keep`` rows (:func:`_finding_row`) per (kind,
    instance, via) in the order :func:`_collect_outcomes` ranks them (publisher, seq,
    detail, txid), and how many there were in all. The first ``keep`` of all tasks
    are among the tasks' own first ``keep``, so a task sends no more than that
    however many problems it finds (an outage of a million messages is one count
    and ``keep`` rows), and at most ``2 * keep`` rows per group are held here."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._rows: dict[tuple[str, str, str], list[tuple[Any, ...]]] = {}
        self._found: Counter[tuple[str, str, str]] = Counter()

    def add(self, row: tuple[Any, ...]) -> None:
        group = (row[1], row[2], row[3])
        self._found[group] += 1
        rows = self._rows.setdefault(group, [])
        rows.append(row)
        if len(rows) >= 2 * self._keep:
            rows.sort(key=_rank)
            del rows[self._keep :]

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """The rows kept, then one ``found`` row per group with its count."""
        for rows in self._rows.values():
            rows.sort(key=_rank)
            yield from rows[: self._keep]
        yield from _found_rows(self._found)


def _rank(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A finding row's place in :func:`_collect_outcomes`'s window: publisher, seq,
    detail, txid (strings compare as Spark compares them: by code point)."""
    return (row[4], row[5], row[6], row[7])


def _found_rows(
    found: Mapping[tuple[str, str, str], int],
) -> Iterator[tuple[str, str, str, str, str, int, str, int, str]]:
    for (kind, instance, via), n in found.items():
        yield ("found", kind, instance, via, "", 0, "", 0, json.dumps(n))


def _classify(
    spark: SparkSession,
    frame: DataFrame,
    expectations: Mapping[ExpectationKey, Expectation],
    expect: Any,
    audited: tuple[str, ...],
    keep: int,
) -> tuple[Any, DataFrame, DataFrame]:
    """Classify every message (its copies grouped by bookmark: a few rows each):
    an RDD of :data:`_OUT_DDL` rows from Python, a DataFrame of such rows from Spark
    SQL, and the frame they share (cached; the caller unpersists it).

    A message whose copies all hold the same content, one on each audited instance
    its expectation names and none elsewhere, is ``ok`` on each of them and has no
    finding: Spark SQL recognises it (a broadcast table of the expected instances per
    expectation) and counts it there, per instance, never handing it to Python (at
    scale nearly every message: moving rows into Python workers is what costs most).
    Every other message goes to :func:`classify_message` with its copies."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    content = F.xxhash64("origin", "origin_txid", "topic", "message_type", "kind", "fp")
    grouped = frame.groupBy("bookmark").agg(
        F.count(F.lit(1)).alias("n"),
        F.array_sort(F.collect_set("instance")).alias("held_on"),
        F.min(content).alias("content_lo"),
        F.max(content).alias("content_hi"),
        F.first("origin").alias("origin"),
        F.first("topic").alias("topic"),
        F.first("message_type").alias("message_type"),
        F.first("verdict").alias("verdict"),
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
        ).alias("copies"),
    )
    wanted = [
        (*key, sorted(i for i in e.arrivals if i in audited))
        for key, e in sorted(expectations.items())
        if e.reason is None
    ]
    expected = spark.createDataFrame(
        wanted,
        "origin STRING, topic STRING, message_type STRING, verdict STRING, expected ARRAY<STRING>",
    )
    plain = (
        (F.col("content_lo") == F.col("content_hi"))
        & (F.col("n") == F.size("held_on"))
        & F.col("expected").isNotNull()
        & (F.col("held_on") == F.col("expected"))
    )
    marked = (
        grouped.join(F.broadcast(expected), ["origin", "topic", "message_type", "verdict"], "left")
        .select(
            "bookmark",
            "held_on",
            plain.alias("plain"),
            F.when(plain, F.lit(None)).otherwise(F.col("copies")).alias("copies"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    plain_rows = marked.where(F.col("plain"))
    oks = (
        plain_rows.select(F.explode("held_on").alias("instance"))
        .groupBy("instance")
        .agg(F.count(F.lit(1)).alias("ok"))
        .select(_out_row("counts", instance=F.col("instance"), doc=F.to_json(F.struct("ok"))))
    )
    messages = plain_rows.agg(F.count(F.lit(1)).alias("n")).select(
        _out_row("messages", doc=F.col("n").cast("string"))
    )

    def classify(groups: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        expectations = expect.value
        statuses: list[tuple[str, str]] = []
        kept = _FirstFindings(keep)
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
            if len(statuses) > 100_000:
                yield from _counts_rows(statuses)
                statuses = []
            for f in outcome.findings:
                kept.add(_finding_row(f))
        yield from _counts_rows(statuses)
        yield from kept.rows()
        yield ("messages", "", "", "", "", 0, "", 0, json.dumps(messages))

    classified = marked.where(~F.col("plain")).rdd.mapPartitions(classify)
    return classified, oks.unionByName(messages), marked


def _out_row(tag: str, **columns: Any) -> list[Any]:
    """The columns of an :data:`_OUT_DDL` row tagged ``tag`` made in Spark SQL:
    ``columns`` (Spark columns) where given, empty strings and zeros elsewhere."""
    from pyspark.sql import functions as F

    empty = {"kind": "", "instance": "", "via": "", "pub": "", "seq": 0, "detail": "", "txid": 0}
    out = [F.lit(tag).alias("tag")]
    for name, ddl in _OUT_COLUMNS[1:]:
        value = columns[name] if name in columns else F.lit(empty.get(name, ""))
        out.append(value.cast(ddl).alias(name))
    return out


def _counts_rows(
    statuses: Iterable[tuple[str, str]],
) -> Iterator[tuple[str, str, str, str, str, int, str, int, str]]:
    for instance, counts in count_statuses(statuses).items():
        yield ("counts", "", instance, "", "", 0, "", 0, json.dumps(counts.as_dict()))


def _order(
    frame: DataFrame, expect: Any, keep: int, bucket_txids: int = ORDER_BUCKET_TXIDS
) -> tuple[Any, list[DataFrame]]:
    """The reordered findings, an RDD of :data:`_OUT_DDL` rows, and the frames it
    caches (the caller unpersists them once the RDD has been computed).

    Per (instance, publisher), the first copy of each message, in txid order, is cut
    into blocks (:func:`~amps_py.pipeline.audit_rules.out_of_order`): a block ends
    where every seq so far is below every seq after. Window functions find the cuts
    (the largest seq before a record against the smallest from it on) over *slices*
    of ``bucket_txids`` txids of one publisher, never over a whole publisher: a
    publisher's records spread over every shuffle partition, so no task sorts more
    than its share however many records one publisher has. What a slice needs from
    the others (the largest seq before it, the smallest after it, the seqs just
    outside it, the block it starts in) comes from one small row per slice, joined
    back. The records of a block of one (a publisher in order: all of them) leave
    there, and only the others reach Python, a block at a time."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    publisher = ("instance", "publisher_hash")
    piece = (*publisher, "slice")
    firsts = (
        frame.groupBy("instance", "publisher_hash", "bookmark")
        .agg(
            F.min(
                F.struct("txid", "seq", "origin", "topic", "message_type", "verdict", "local_us")
            ).alias("r")
        )
        .select("instance", "publisher_hash", "bookmark", "r.*")
        .withColumn("slice", F.floor(F.col("txid") / F.lit(bucket_txids)).cast("long"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # one row per slice: what its records need from the slices before and after it
    slices = Window.partitionBy(*publisher).orderBy("slice")
    slices_down = Window.partitionBy(*publisher).orderBy(F.col("slice").desc())
    around = (
        firsts.groupBy(*piece)
        .agg(
            F.min("seq").alias("lo"),
            F.max("seq").alias("hi"),
            F.min_by("seq", "txid").alias("first_seq"),
            F.max_by("seq", "txid").alias("last_seq"),
        )
        .select(
            *piece,
            F.max("hi").over(slices.rowsBetween(Window.unboundedPreceding, -1)).alias("max_before"),
            F.min("lo")
            .over(slices_down.rowsBetween(Window.unboundedPreceding, -1))
            .alias("min_after"),
            F.lag("last_seq").over(slices).alias("seq_before"),
            F.lead("first_seq").over(slices).alias("seq_after"),
        )
    )
    up = Window.partitionBy(*piece).orderBy("txid")
    down = Window.partitionBy(*piece).orderBy(F.col("txid").desc())
    prev_max = F.greatest(
        F.max("seq").over(up.rowsBetween(Window.unboundedPreceding, -1)), F.col("max_before")
    )
    rest_min = F.least(
        F.min("seq").over(down.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
        F.col("min_after"),
    )
    marked = (
        firsts.join(around, list(piece))
        .withColumn("prev_max", prev_max)
        .withColumn("rest_min", rest_min)
        .withColumn("before", F.coalesce(F.lag("seq").over(up), F.col("seq_before")))
        .withColumn("after", F.coalesce(F.lead("seq").over(up), F.col("seq_after")))
        .withColumn("cut", F.col("prev_max").isNull() | (F.col("prev_max") < F.col("rest_min")))
        .drop("max_before", "min_after", "seq_before", "seq_after", "prev_max", "rest_min")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # a block is named by the txid of the cut that starts it, which may lie in an
    # earlier slice; a record ends a block of one when the next record (perhaps the
    # next slice's first) is a cut too
    cut_txid = F.when(F.col("cut"), F.col("txid"))
    edges = (
        marked.groupBy(*piece)
        .agg(F.max(cut_txid).alias("last_cut"), F.min_by("cut", "txid").alias("first_cut"))
        .select(
            *piece,
            F.max("last_cut")
            .over(slices.rowsBetween(Window.unboundedPreceding, -1))
            .alias("cut_before"),
            F.lead("first_cut").over(slices).alias("cut_after"),
        )
    )
    blocks = (
        marked.join(edges, list(piece))
        .withColumn(
            "block",
            F.coalesce(
                F.max(cut_txid).over(up.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
                F.col("cut_before"),
            ),
        )
        .withColumn("cut_next", F.coalesce(F.lead("cut").over(up), F.col("cut_after"), F.lit(True)))
        .where(~(F.col("cut") & F.col("cut_next")))
        .groupBy("instance", "publisher_hash", "block")
        .agg(
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
                    "before",
                    "after",
                )
            ).alias("records")
        )
    )

    def check(groups: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        expectations = expect.value
        kept = _FirstFindings(keep)
        for g in groups:
            rows = sorted(g["records"], key=lambda r: r["txid"])
            run = [
                PubRecord(
                    r["txid"],
                    r["seq"],
                    r["bookmark"],
                    r["origin"],
                    r["topic"],
                    r["message_type"],
                    r["verdict"],
                    r["local_us"],
                )
                for r in rows
            ]
            for f in out_of_order(
                g["instance"], run, expectations, rows[0]["before"], rows[-1]["after"]
            ):
                kept.add(_finding_row(f))
        yield from kept.rows()

    return blocks.rdd.mapPartitions(check), [firsts, marked]


@dataclass(frozen=True)
class _Outcomes:
    counts: dict[str, Counts]
    findings: list[Finding]
    messages: int
    found: dict[tuple[str, str, str], int]  # (kind, instance, via): findings in all
    left_out: tuple[FindingsLeftOut, ...]


def _collect_outcomes(
    spark: SparkSession, from_python: Any, from_sql: DataFrame, keep: int
) -> _Outcomes:
    """One Spark job: the counts, and of the findings the first ``keep`` per (kind,
    instance, via) by publisher and seq (a window over them, which sorts and spills:
    the driver gets a bounded number however many problems there are). The rows
    (:data:`_OUT_DDL`) come from Python workers (an RDD) and from Spark SQL."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    out = spark.createDataFrame(from_python, _OUT_DDL, verifySchema=False).unionByName(from_sql)
    first = Window.partitionBy("tag", "kind", "instance", "via").orderBy(
        "pub", "seq", "detail", "txid"
    )
    rows = (
        out.withColumn("rank", F.row_number().over(first))
        .where((F.col("tag") != "finding") | (F.col("rank") <= keep))
        .select("tag", "kind", "instance", "via", "doc")
        .collect()
    )
    counts: dict[str, Counts] = {}
    findings: list[Finding] = []
    found: dict[tuple[str, str, str], int] = {}
    messages = 0
    for r in rows:
        value = json.loads(r["doc"])
        if r["tag"] == "finding":
            findings.append(Finding.from_dict(value))
        elif r["tag"] == "counts":
            counts.setdefault(r["instance"], Counts()).add(Counts(**value))
        elif r["tag"] == "found":
            group = (r["kind"], r["instance"], r["via"])
            found[group] = found.get(group, 0) + int(value)
        else:
            messages += int(value)
    findings.sort(key=lambda f: (*f.sort_key(), f.txids))
    left_out = tuple(
        FindingsLeftOut(kind, instance, via, n, keep)
        for (kind, instance, via), n in sorted(
            found.items(),
            key=lambda item: (
                PROBLEM_CLASSES.index(item[0][0]) if item[0][0] in PROBLEM_CLASSES else 99,
                item[0][1],
                item[0][2],
            ),
        )
        if n > keep
    )
    return _Outcomes(counts, findings, messages, found, left_out)


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


def _lag(
    frame: DataFrame, fabric: Fabric, bucket_s: float | None, span: tuple[int, int] | None
) -> tuple[int, list[LinkLag]]:
    """Lag per link (sender = the last hop of the path, receiver = the instance) and
    per time bucket of arrival, with exact percentiles; one Spark job (grouping
    sets: per link and bucket, and per link). ``span``: the first and last local
    time of the replicated records (``None``: there are none)."""
    from pyspark.sql import functions as F

    if span is None:
        return choose_bucket(0, bucket_s), []
    bucket_us = choose_bucket(span[1] - span[0], bucket_s)
    hops = frame.where(F.size("path") > 0).select(
        F.element_at("path", -1).alias("sender"),
        F.col("instance").alias("receiver"),
        (F.col("local_us") - F.col("origin_us")).alias("lag_us"),
        (F.floor(F.col("local_us") / bucket_us) * bucket_us).alias("bucket"),
    )
    link = (F.col("sender"), F.col("receiver"))
    rows = (
        hops.groupingSets([[*link, F.col("bucket")], [*link]], *link, F.col("bucket"))
        .agg(
            F.grouping_id().alias("level"),
            F.count(F.lit(1)).alias("n"),
            F.expr("percentile(lag_us, array(0.5, 0.99))").alias("p"),
            F.max("lag_us").alias("max"),
        )
        .collect()
    )
    overall = [r for r in rows if r["level"] != 0]
    per_link: dict[tuple[str, str], list[LagBucket]] = {}
    for r in rows:
        if r["level"] != 0:
            continue
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
