"""Topic statistics of journals: per instance, topic and publisher, how many messages
and payload bytes, at what rates over time, and how large the payloads are.

:func:`journal_stats` runs the Spark job (the ``amps_txlog`` data source, one read of
each journal, cached for the three aggregations; an export directory of ``amps-py
pipeline export`` is read from its Parquet files instead) and returns a plain JSON-ready report
(:func:`build_report`, pure); :func:`render_text` prints it for a terminal.

Definitions: a message is one journal record (publishes, delta publishes and SOW
deletes alike); the publisher is its client name; bytes are payload bytes
(decompressed); times are local timestamps (when that instance stored it), UTC; a
bucket is ``[start, start + bucket_seconds)`` with starts on multiples of the bucket
width since the epoch. Percentiles are exact, interpolated linearly between the two
nearest sizes (Spark's ``percentile``). A journal of several instances counts a
replicated message once per instance that holds it: rows are per instance.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .sources import is_export, read_export

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: the percentiles of payload size reported
PERCENTILES: Final = (0.5, 0.9, 0.99)
DEFAULT_BUCKET_SECONDS: Final = 60
#: buckets per topic the text rendering shows (the latest; JSON has them all)
SHOWN_BUCKETS: Final = 30


class StatsError(ValueError):
    """The statistics cannot be computed as asked; the message says why and the fix."""


@dataclass(frozen=True)
class StatsRequest:
    """What to count: journals (directories), the bucket width, and optional bounds
    pushed down to the reads (topics, local time ``[start, end)`` as ISO 8601)."""

    journals: tuple[str, ...]
    bucket_seconds: int = DEFAULT_BUCKET_SECONDS
    topics: tuple[str, ...] = ()
    start_time: str | None = None
    end_time: str | None = None

    def __post_init__(self) -> None:
        if not self.journals:
            raise StatsError("give at least one journal directory")
        if self.bucket_seconds < 1:
            raise StatsError(f"the bucket must be at least 1 second, not {self.bucket_seconds}")

    def resolved(self) -> StatsRequest:
        """This request with every path checked and made absolute (a cluster's
        executors do not share the driver's working directory), before Spark starts.

        Raises:
            StatsError: a path is neither an export directory nor a journal directory
                or a directory holding journals (the message names it and the fix).
        """
        from txlog import JournalError

        from .sources import require_journals

        absolute: list[str] = []
        for path in self.journals:
            if not is_export(path):
                try:
                    require_journals(path)
                except JournalError as exc:
                    raise StatsError(str(exc)) from None
            absolute.append(str(Path(path).resolve()))
        return replace(self, journals=tuple(absolute))


def journal_stats(spark: SparkSession, request: StatsRequest) -> dict[str, Any]:
    """The statistics report of ``request`` (see :func:`build_report`).

    Raises:
        StatsError: bad options of the data source (the message names them).
    """
    from pyspark.sql import functions as F

    frames = [_read(spark, path, request) for path in request.journals]
    df = frames[0]
    for frame in frames[1:]:
        df = df.unionByName(frame)
    bucket_us = request.bucket_seconds * 1_000_000
    df = df.select(
        "instance",
        "topic",
        F.col("client_name").alias("publisher"),
        F.unix_micros("local_ts").alias("ts"),
        F.length("payload").alias("size"),
    ).withColumn("bucket", F.floor(F.col("ts") / bucket_us) * bucket_us)
    df = df.persist()
    try:
        per_publisher = _summary(df, ["instance", "topic", "publisher"])
        per_topic = _summary(df, ["instance", "topic"])
        buckets = (
            df.groupBy("instance", "topic", "publisher", "bucket")
            .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
            .collect()
        )
    finally:
        df.unpersist()
    return build_report(
        request,
        [row.asDict() for row in per_publisher],
        [row.asDict() for row in per_topic],
        [row.asDict() for row in buckets],
    )


def _read(spark: SparkSession, path: str, request: StatsRequest) -> DataFrame:
    if is_export(path):
        return _read_export(spark, path, request)
    reader = spark.read.format("amps_txlog")
    if request.topics:
        reader = reader.option("topics", ",".join(request.topics))
    if request.start_time:
        reader = reader.option("start_time", request.start_time)
    if request.end_time:
        reader = reader.option("end_time", request.end_time)
    return reader.load(path)


def _summary(df: DataFrame, keys: list[str]) -> list[Any]:
    from pyspark.sql import functions as F

    wanted = ", ".join(str(p) for p in PERCENTILES)
    return (
        df.groupBy(*keys)
        .agg(
            F.count("*").alias("messages"),
            F.sum("size").alias("bytes"),
            F.min("ts").alias("first_us"),
            F.max("ts").alias("last_us"),
            F.min("size").alias("size_min"),
            F.max("size").alias("size_max"),
            F.avg("size").alias("size_mean"),
            F.expr(f"percentile(size, array({wanted}))").alias("size_percentiles"),
        )
        .collect()
    )


def build_report(
    request: StatsRequest,
    per_publisher: Iterable[Mapping[str, Any]],
    per_topic: Iterable[Mapping[str, Any]],
    buckets: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """The report from the aggregated rows (pure).

    Shape::

        {"journals": [...], "bucket_seconds": 60, "messages": N, "bytes": B,
         "first": ISO|None, "last": ISO|None,
         "topics": [{"instance", "topic", "messages", "bytes", "first", "last",
                     "rate_per_s", "peak_rate_per_s", "publishers": n,
                     "size": {"min", "mean", "p50", "p90", "p99", "max"},
                     "buckets": [{"start", "messages", "bytes"}]}],
         "publishers": [the same per (instance, topic, publisher), "publisher" added]}

    ``rate_per_s`` is messages per second over the buckets from the first message's
    to the last one's (both included); ``peak_rate_per_s`` is the busiest bucket's.
    Lists are sorted by instance, topic (and publisher); buckets by start.
    """
    width = request.bucket_seconds
    bucket_us = width * 1_000_000
    series: dict[tuple[str, ...], dict[int, list[int]]] = defaultdict(dict)
    for row in buckets:
        key = (row["instance"], row["topic"], row["publisher"])
        for k in (key, key[:2]):
            slot = series[k].setdefault(int(row["bucket"]), [0, 0])
            slot[0] += int(row["messages"])
            slot[1] += int(row["bytes"] or 0)

    def entry(row: Mapping[str, Any], key: tuple[str, ...]) -> dict[str, Any]:
        timeline = sorted(series.get(key, {}).items())
        covered_us = (
            row["last_us"] // bucket_us * bucket_us - row["first_us"] // bucket_us * bucket_us
        )
        covered_s = covered_us / 1e6 + width
        peak = max((slot[0] for _, slot in timeline), default=0)
        head = {"instance": row["instance"], "topic": row["topic"]}
        if len(key) == 3:
            head["publisher"] = key[2]
        return {
            **head,
            "messages": int(row["messages"]),
            "bytes": int(row["bytes"] or 0),
            "first": iso(row["first_us"]),
            "last": iso(row["last_us"]),
            "rate_per_s": round(row["messages"] / covered_s, 3),
            "peak_rate_per_s": round(peak / width, 3),
            "size": size_summary(row),
            "buckets": [
                {"start": iso(start), "messages": slot[0], "bytes": slot[1]}
                for start, slot in timeline
            ],
        }

    publishers = sorted(
        (entry(row, (row["instance"], row["topic"], row["publisher"])) for row in per_publisher),
        key=lambda e: (e["instance"], e["topic"], e["publisher"]),
    )
    counted: dict[tuple[str, str], int] = defaultdict(int)
    for p in publishers:
        counted[(p["instance"], p["topic"])] += 1
    topics = []
    for row in per_topic:
        pair = (row["instance"], row["topic"])
        topics.append({**entry(row, pair), "publishers": counted[pair]})
    topics.sort(key=lambda e: (e["instance"], e["topic"]))
    firsts = [t["first"] for t in topics]
    lasts = [t["last"] for t in topics]
    return {
        "journals": list(request.journals),
        "bucket_seconds": width,
        "messages": sum(t["messages"] for t in topics),
        "bytes": sum(t["bytes"] for t in topics),
        "first": min(firsts) if firsts else None,
        "last": max(lasts) if lasts else None,
        "topics": topics,
        "publishers": publishers,
    }


def size_summary(row: Mapping[str, Any]) -> dict[str, float | int]:
    """min, mean, percentiles and max of one aggregated row's payload sizes."""
    values = list(row["size_percentiles"] or [])
    out: dict[str, float | int] = {"min": int(row["size_min"]), "mean": round(row["size_mean"], 3)}
    for p, value in zip(PERCENTILES, values, strict=True):
        out[f"p{round(p * 100)}"] = round(float(value), 3)
    out["max"] = int(row["size_max"])
    return out


def iso(us: int) -> str:
    """µs since the epoch as ISO 8601 UTC with a ``Z`` (µs kept when not zero)."""
    moment = datetime.fromtimestamp(us // 1_000_000, UTC).replace(microsecond=us % 1_000_000)
    text = moment.isoformat(timespec="microseconds" if us % 1_000_000 else "seconds")
    return text.replace("+00:00", "Z")


# ------------------------------------------------------------------ text rendering
def render_text(report: Mapping[str, Any], shown_buckets: int = SHOWN_BUCKETS) -> str:
    """The report as tables for a terminal: one row per topic and publisher (with a
    total row per topic), then per topic its rate in each bucket (the latest
    ``shown_buckets``)."""
    lines = [
        f"{report['messages']:,} messages, {_bytes(report['bytes'])} of payload in "
        f"{len({t['instance'] for t in report['topics']})} instance(s)"
        + (f", {report['first']} to {report['last']}" if report["first"] else ""),
        "",
    ]
    header = [
        "instance",
        "topic",
        "publisher",
        "messages",
        "bytes",
        "msg/s",
        "peak msg/s",
        "size p50",
        "p90",
        "p99",
        "max",
    ]
    rows: list[list[str]] = []
    by_topic: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for p in report["publishers"]:
        by_topic[(p["instance"], p["topic"])].append(p)
    for t in report["topics"]:
        for p in by_topic[(t["instance"], t["topic"])]:
            rows.append(_summary_cells(p, p["publisher"]))
        rows.append(_summary_cells(t, f"(all {t['publishers']})"))
    lines += _table(header, rows, right_from=3)
    width = report["bucket_seconds"]
    for t in report["topics"]:
        buckets = t["buckets"]
        lines += ["", f"{t['topic']} on {t['instance']}: messages per {width} s bucket"]
        if len(buckets) > shown_buckets:
            lines.append(f"(the latest {shown_buckets} of {len(buckets)}; --json has them all)")
        cells = [
            [
                b["start"],
                f"{b['messages']:,}",
                _rate(b["messages"] / width),
                _bytes(b["bytes"] / width) + "/s",
            ]
            for b in buckets[-shown_buckets:]
        ]
        lines += _table(["bucket start", "messages", "msg/s", "bytes/s"], cells, right_from=1)
    return "\n".join(lines)


def _summary_cells(e: Mapping[str, Any], who: str) -> list[str]:
    size = e["size"]
    return [
        e["instance"],
        e["topic"],
        who,
        f"{e['messages']:,}",
        _bytes(e["bytes"]),
        _rate(e["rate_per_s"]),
        _rate(e["peak_rate_per_s"]),
        _num(size["p50"]),
        _num(size["p90"]),
        _num(size["p99"]),
        _num(size["max"]),
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i >= right_from else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _bytes(n: float) -> str:
    if n < 1000:
        return f"{n:,.0f} B" if n >= 10 or float(n).is_integer() else f"{n:.1f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:,.1f} {unit}"


def _rate(per_s: float) -> str:
    """A rate with the digits that matter: 12,345 / 12.3 / 0.0333."""
    if per_s >= 100:
        return f"{per_s:,.0f}"
    if per_s >= 1:
        return f"{per_s:.1f}"
    return f"{per_s:.3g}"


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _read_export(spark: SparkSession, path: str, request: StatsRequest) -> DataFrame:
    """An export directory's records with the request's bounds (topic prunes the
    directories read)."""
    from pyspark.sql import functions as F

    try:
        df = read_export(spark, path)
    except ValueError as exc:  # the previous layout
        raise StatsError(str(exc)) from None
    if request.topics:
        df = df.where(F.col("topic").isin(list(request.topics)))
    if request.start_time:
        df = df.where(F.col("local_ts") >= F.to_timestamp(F.lit(request.start_time)))
    if request.end_time:
        df = df.where(F.col("local_ts") < F.to_timestamp(F.lit(request.end_time)))
    return df
