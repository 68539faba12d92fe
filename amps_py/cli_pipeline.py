"""``amps-py pipeline ...``: analyse journals with Spark.

Thin: each subcommand parses its options and calls ``amps_py.pipeline``. pyspark and
pyarrow are imported inside the commands, so the rest of the command line starts fast
and works without the ``spark`` extra. Each job is also a script under
``tools/pipeline/`` for ``spark-submit``, built from the same click command.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, NoReturn

import click

__all__ = ["pipeline"]


@click.group()
def pipeline() -> None:
    """Analyse journals with Spark: the amps_txlog data source, topic statistics.

    The jobs run on local Spark by default (local[*]: nothing to install beyond
    `pip install -e '.[spark]'` and Java 17 or newer); --master spark://HOST:PORT runs
    them on a Spark cluster, --conf KEY=VALUE (repeatable) sets any Spark setting.
    Journals are read read-only, also while their instance runs.

    \b
    In your own PySpark code:
        import amps_py.pipeline
        amps_py.pipeline.register(spark)
        spark.read.format("amps_txlog").load("/path/to/journal")
    """


def _conf_pairs(values: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = []
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{text!r} is not KEY=VALUE (e.g. --conf spark.executor.memory=2g)",
                param_hint="--conf",
            )
        pairs.append((key.strip(), value))
    return pairs


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)


#: the last line of a Python traceback Spark passes on, for our own errors
_OUR_ERROR = re.compile(
    r"^\s*(?:[\w.]+\.)?(JournalDamaged|JournalError|CorruptRecord|BadOption|StatsError): (.+)$",
    re.MULTILINE,
)


def _spark_failure(exc: BaseException) -> tuple[str, int]:
    """One line and an exit status for a failed Spark job: our error's own message
    when a worker raised it (3 for a damaged journal, 2 otherwise), else Spark's
    first line (1)."""
    text = str(exc)
    found = _OUR_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return message.strip(), 3 if kind in ("JournalDamaged", "CorruptRecord") else 2
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"the Spark job failed: {first.strip()}", 1


def _session(app: str, master: str | None, conf: tuple[str, ...]) -> Any:
    pairs = _conf_pairs(conf)
    try:
        from amps_py.pipeline.spark import SparkUnavailable, spark_session
    except ImportError as exc:
        _fail(
            f"the Spark pipeline needs the spark extra ({exc}): pip install -e '.[spark]' "
            "(and Java 17 or newer)",
            2,
        )
    try:
        return spark_session(app, master, pairs)
    except SparkUnavailable as exc:
        _fail(str(exc), 2)


_master_option = click.option(
    "--master", default=None, help="Spark master URL (default local[*], this machine)."
)
_conf_option = click.option(
    "--conf", "conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting (repeatable)."
)


# ------------------------------------------------------------------------------ stats
@pipeline.command("stats")
@click.argument("journals", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--bucket",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="Width of the rate buckets.",
)
@click.option("--topic", "topics", multiple=True, help="Only this topic (repeatable).")
@click.option("--start", default=None, help="From this local time (ISO 8601, UTC if no zone).")
@click.option("--end", default=None, help="Up to this local time (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_master_option
@_conf_option
def stats_command(
    journals: tuple[str, ...],
    bucket: int,
    topics: tuple[str, ...],
    start: str | None,
    end: str | None,
    as_json: bool,
    master: str | None,
    conf: tuple[str, ...],
) -> None:
    """Message counts, bytes, rates and payload sizes per topic and publisher.

    Reads each JOURNAL directory (TransactionLog/JournalDirectory) and prints, per
    instance, topic and publisher: messages, payload bytes, the mean and peak rate,
    the payload size distribution (p50/p90/p99/max), and per topic the rate in every
    --bucket (a table, or all of it with --json).

    A message is a journal record; the publisher is its client name; times are when
    the instance stored it. Exit status: 0 done, 2 a journal or option cannot be
    used, 3 a journal holds a damaged record (named), 1 Spark failed otherwise.
    """
    from amps_py.pipeline.stats import StatsError, StatsRequest

    try:
        request = StatsRequest(tuple(journals), bucket, tuple(topics), start, end)
    except StatsError as exc:
        _fail(str(exc), 2)
    spark = _session("amps-py-stats", master, conf)
    try:
        from amps_py.pipeline.stats import journal_stats, render_text

        report = journal_stats(spark, request)
    except Exception as exc:  # Spark raises its own types, with our error inside
        message, code = _spark_failure(exc)
        _fail(message, code)
    finally:
        spark.stop()
    click.echo(json.dumps(report, indent=2) if as_json else render_text(report))
