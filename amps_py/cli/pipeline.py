"""``amps-py pipeline ...``: analyse journals with Spark.

Thin: each subcommand parses its options and calls ``amps_py.pipeline``. pyspark and
pyarrow are imported inside the commands, so the rest of the command line starts fast
and works without the ``spark`` extra. Each job is also a script under
``tools/pipeline/`` for ``spark-submit``, built from the same click command.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import click

__all__ = ["pipeline"]


@click.group()
def pipeline() -> None:
    """Analyse journals with Spark: the amps_txlog data source, topic statistics.

    The jobs run on local Spark by default (local[*]: nothing to install beyond the
    spark extra, `pip install 'amps-py[spark]'` or in a source checkout `pip install -e
    '.[spark]'`, and Java 17 or newer); --master spark://HOST:PORT runs
    them on a Spark cluster, --conf KEY=VALUE (repeatable) sets any Spark setting.
    Journals are read read-only, also while their instance runs.

    \b
    In your own PySpark code:
        import amps_py.pipeline
        amps_py.pipeline.register(spark)
        spark.read.format("amps_txlog").load("/path/to/journal")
    """


class _Many(click.Option):
    """A repeatable option that also takes several values at once:
    ``--journals a b c`` is ``--journals a --journals b --journals c``."""

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            option = parser._long_opt.get(name) or parser._short_opt.get(name)
            if option is None:  # pragma: no cover - click changed its parser
                continue
            one = option.process

            def process(value: Any, state: Any, one: Any = one) -> None:
                one(value, state)
                while state.rargs and not str(state.rargs[0]).startswith("-"):
                    one(state.rargs.pop(0), state)

            option.process = process


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


def _inside(filename: object, directory: str) -> bool:
    """Whether ``filename`` (an OSError's) is in ``directory``."""
    if not isinstance(filename, str):
        return False
    return Path(filename).resolve().is_relative_to(Path(directory).resolve())


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)


def _require_extra(*modules: str) -> None:
    """Exit with one line (status 2) unless ``modules`` (of the spark extra) import."""
    import importlib

    from amps_py.pipeline import install_command

    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        java = "; the Spark jobs also need Java 17 or newer" if "pyspark" in modules else ""
        _fail(
            f"this command needs the spark extra, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: "
            f"{install_command()}{java}",
            2,
        )


#: the last line of a Python traceback Spark passes on, for our own errors
_OUR_ERROR = re.compile(
    r"^\s*(?:[\w.]+\.)?(JournalDamaged|JournalError|CorruptRecord|BadOption|StatsError): (.+)$",
    re.MULTILINE,
)


def _spark_failure(exc: BaseException) -> tuple[str, int]:
    """One line and an exit status for a failed Spark job: our error's own message
    when a worker raised it (3 for a damaged journal, 2 otherwise), else Spark's
    first line (1)."""
    from amps_py.pipeline.spark import error_text

    text = error_text(exc)
    found = _OUR_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return message.strip(), 3 if kind in ("JournalDamaged", "CorruptRecord") else 2
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"the Spark job failed: {first.strip()}", 1


def _session(app: str, master: str | None, conf: tuple[str, ...]) -> Any:
    pairs = _conf_pairs(conf)
    _require_extra("pyspark", "pyarrow")
    from amps_py.pipeline.spark import SparkUnavailable, quiet_task_failures, spark_session

    try:
        session = spark_session(app, master, pairs)
    except SparkUnavailable as exc:
        _fail(str(exc), 2)
    quiet_task_failures(session)  # a failed job is reported in one line
    return session


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

    Reads each JOURNAL directory (TransactionLog/JournalDirectory; a directory
    holding several, such as ./amps-data, reads every journal below it), or an
    export directory of `amps-py pipeline export` (its Parquet files), and prints, per
    instance, topic and publisher: messages, payload bytes, the mean and peak rate,
    the payload size distribution (p50/p90/p99/max), and per topic the rate in every
    --bucket (a table, or all of it with --json).

    A message is a journal record; the publisher is its client name; times are when
    the instance stored it. Exit status: 0 done, 2 a journal or option cannot be
    used, 3 a journal holds a damaged record (named), 1 Spark failed otherwise.
    """
    _require_extra("pyspark", "pyarrow")
    from amps_py.pipeline.stats import StatsError, StatsRequest

    try:
        request = StatsRequest(tuple(journals), bucket, tuple(topics), start, end).resolved()
    except StatsError as exc:
        _fail(str(exc), 2)
    spark = _session("amps-py-stats", master, conf)
    try:
        from amps_py.pipeline.stats import journal_stats, render_text

        report = journal_stats(spark, request)
    except StatsError as exc:
        _fail(str(exc), 2)
    except Exception as exc:  # Spark raises its own types, with our error inside
        message, code = _spark_failure(exc)
        _fail(message, code)
    finally:
        spark.stop()
    click.echo(json.dumps(report, indent=2) if as_json else render_text(report))


_Command = TypeVar("_Command", bound=Callable[..., None])


def _without_teardown(command: _Command) -> _Command:
    """Run ``command``, then exit with its status without the interpreter's teardown:
    when it tears down while one of pyarrow's pool threads is still alive, the process
    can abort (SIGABRT, "terminate called without an active exception"; seen in a test
    of ``export --verify`` on a loaded machine). Everything written is flushed first,
    and the command's work has committed (or failed) by then."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        else:
            code = 0
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    return cast(_Command, run)


@pipeline.command("export")
@click.argument("journal", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--instance",
    default=None,
    help="The name files and manifest are kept under (default: the journal's instance); "
    "only when JOURNAL is one journal.",
)
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Records per commit (default 250,000); each commit is one file (a commit also "
    "ends where the records' UTC date changes).",
)
@click.option(
    "--batch-bytes",
    type=click.IntRange(min=1),
    default=None,
    help="Payload bytes per commit (default 32 MiB; whichever limit comes first). "
    "The export needs about 7 times this in memory.",
)
@click.option(
    "--shorten-long-topics",
    is_flag=True,
    hidden=True,
    help="No longer needed (topics are not directory names any more); accepted, and ignored.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Then re-read every file of the instance and check it against the manifest.",
)
@_without_teardown
def pipeline_export(
    journal: str,
    out: str,
    instance: str | None,
    batch_rows: int | None,
    batch_bytes: int | None,
    shorten_long_topics: bool,
    verify: bool,
) -> None:
    """Export JOURNAL's records to Parquet files in OUT, partitioned by date
    (OUT/date=YYYY-MM-DD/part-INSTANCE-FIRST-LAST.parquet, zstd, every column in
    the files; rows ordered by topic, a row group per topic), with a manifest per run
    and a cumulative one in OUT/_manifests/INSTANCE/.

    JOURNAL is an instance's journal directory (TransactionLog/JournalDirectory), or
    a directory holding several (such as ./amps-data holding amps-a/ and amps-b/):
    each is exported into OUT in turn, under its own instance's name.

    Incremental: a run exports only the records after those OUT holds, up to the
    journal's newest record when it started. Safe while the instance runs (the
    journal is only read) and if killed: readers of OUT never see a record the
    manifest does not list, and the next run finishes the job. A damaged record
    stops the export of its journal with exit status 3, everything before it
    exported.

    Prints one line per journal when done; a progress bar on stderr when it is a
    terminal.
    """
    from amps_py.cli.txlog import journal_tool

    _require_extra("pyarrow")
    from amps_py.pipeline.sources import journal_directories

    journals = journal_directories(journal) if Path(journal).is_dir() else []
    if not journals:
        if Path(journal).is_dir():
            _fail(
                f"{journal} holds no journal (no data.mdb in it or below it); give an "
                "instance's TransactionLog/JournalDirectory, or a directory holding them",
                2,
            )
        journals = [Path(journal)]  # the journal library names what is wrong
    if len(journals) > 1:
        if instance is not None:
            _fail(
                f"--instance names one journal's export, and {journal} holds "
                f"{len(journals)} journals ({', '.join(str(j) for j in journals)}); "
                "export them one at a time to rename one",
                2,
            )
        with journal_tool(journal):
            _refuse_shared_instances(journals)
    worst = 0
    for path in journals:
        code = _export_one(str(path), out, instance, batch_rows, batch_bytes, verify)
        worst = max(worst, code)
    if worst:
        sys.exit(worst)


def _refuse_shared_instances(journals: list[Path]) -> None:
    """Exit (status 2) when two of ``journals`` belong to one instance: their exports
    would go under one name."""
    from txlog import Journal

    owners: dict[str, Path] = {}
    for path in journals:
        with Journal(path, readonly=True) as j:
            name = j.instance_name or ""
        if not name:
            _fail(
                f"journal {path} records no instance name; export it alone with --instance NAME",
                2,
            )
        if name in owners:
            _fail(
                f"journals {owners[name]} and {path} both belong to instance {name!r}; "
                "export each alone, one of them under another --instance",
                2,
            )
        owners[name] = path


def _export_one(
    journal: str,
    out: str,
    instance: str | None,
    batch_rows: int | None,
    batch_bytes: int | None,
    verify: bool,
) -> int:
    """Export one journal into ``out`` (and verify it) as the export command says;
    problems are printed. Returns the exit status for it (0: done)."""
    from amps_py.cli.progress import progress
    from amps_py.cli.txlog import journal_tool
    from amps_py.pipeline.export import ExportDamaged, ExportError, export_journal, verify_export
    from amps_py.pipeline.export_layout import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS

    try:
        with journal_tool(journal), progress(f"exporting {journal}", None) as bar:
            try:
                result = export_journal(
                    journal,
                    out,
                    instance=instance,
                    batch_rows=batch_rows or DEFAULT_BATCH_ROWS,
                    batch_bytes=batch_bytes or DEFAULT_BATCH_BYTES,
                    progress=lambda done, total: bar.update(completed=done, total=total),
                )
            except OSError as exc:
                if not _inside(exc.filename, out):
                    raise  # the journal's: said as the txlog tools say it
                _fail(
                    f"cannot write the export into {out}: {exc.strerror or exc} ({exc.filename})", 2
                )
            except ExportDamaged as exc:
                _fail(str(exc), 3)
            except ExportError as exc:
                _fail(str(exc), 2)
    except SystemExit as exc:  # the line is printed
        return exc.code if isinstance(exc.code, int) else 1
    if result.removed_before_export:
        first, last = result.removed_before_export
        click.echo(
            f"amps-py: warning: txids {first}..{last} were removed from the journal before "
            "any export held them (journal housekeeping ran first): they are not in OUT",
            err=True,
        )
    if result.published:
        click.echo(
            f"amps-py: published {len(result.published)} file(s) an interrupted export "
            "had committed and not published yet",
            err=True,
        )
    if result.cleaned:
        click.echo(
            f"amps-py: deleted {len(result.cleaned)} file(s) an interrupted export left "
            "(their records were exported again)",
            err=True,
        )
    click.echo(result.summary())
    if not verify:
        return 0
    problems = verify_export(out, result.instance)
    for problem in problems:
        click.echo(f"PROBLEM {problem}")
    if problems:
        click.echo(
            f"amps-py: {len(problems)} problem(s) in the export of {result.instance} in {out}",
            err=True,
        )
        return 3
    click.echo(f"verified: {out} holds instance {result.instance}'s export whole")
    return 0


def _stop(spark: Any) -> None:
    """Stop ``spark``; a JVM that died (out of memory) cannot be stopped, and that
    must not hide why."""
    with contextlib.suppress(Exception):
        spark.stop()


#: what the JVM's death looks like from Python (py4j lost its connection)
_JVM_GONE = ("Answer from Java side is empty", "Error while receiving", "Connection refused")


def audit_failure(exc: BaseException) -> str:
    """The one line ``pipeline audit`` prints when its Spark job failed (exit status
    3): what failed, and what to do."""
    from amps_py.pipeline.spark import error_text

    text = error_text(exc)
    found = _OUR_ERROR.findall(text)
    if found:  # a damaged journal record, named by our reader with the fix
        return f"the audit could not complete: {found[-1][1].strip()}"
    more_memory = (
        "rerun with more memory (--conf spark.driver.memory=4g on local[*], "
        "--conf spark.executor.memory=4g on a cluster) or more executors"
    )
    if "OutOfMemoryError" in text:
        kind = next(
            (line.strip() for line in text.splitlines() if "OutOfMemoryError" in line),
            "java.lang.OutOfMemoryError",
        )
        oom = re.search(r"java\.lang\.OutOfMemoryError[^\n]*", kind)
        return (
            f"the audit could not complete: Spark ran out of memory "
            f"({oom.group(0) if oom else kind}); {more_memory}"
        )
    if "ExecutorLostFailure" in text or "lost executor" in text.lower():
        return (
            "the audit could not complete: a Spark executor was lost (its worker's log says "
            f"why; most often it ran out of memory); {more_memory}, then rerun"
        )
    if type(exc).__name__.startswith("Py4J") or any(m in text for m in _JVM_GONE):
        return (
            "the audit could not complete: the Spark driver's JVM stopped answering (most "
            f"often it ran out of memory and exited; Spark's log above says why); {more_memory}"
        )
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return (
        f"the audit could not complete: the Spark job failed: {first.strip()} (Spark's log "
        "above says more); fix that and rerun"
    )


@pipeline.command("audit")
@click.option(
    "--config",
    "configs",
    cls=_Many,
    multiple=True,
    required=True,
    metavar="DIR_OR_FILE...",
    help="The fabric's configs: files, or directories of *.xml (one config per instance).",
)
@click.option(
    "--journals",
    cls=_Many,
    multiple=True,
    required=True,
    metavar="DIR...",
    help="Journal directories (TransactionLog/JournalDirectory), directories holding "
    "them, or export directories of `amps-py pipeline export`.",
)
@click.option(
    "--out",
    default="audit-report",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory for audit.json and audit.html.",
)
@click.option(
    "--bucket",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Width of the lag buckets (default: about 60 buckets over the journals' time).",
)
@click.option("--master", default=None, help="Spark master URL (default local[*]).")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting.")
@click.option(
    "--findings",
    default=20,
    show_default=True,
    help="Runs of findings to print (audit.json holds every finding kept: --keep-findings).",
)
@click.option(
    "--keep-findings",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    metavar="N",
    help="Findings the report lists per class, instance and sending instance (the first "
    "by publisher and seq); the counts count every one, and the report says how many "
    "it left out.",
)
def audit_command(
    configs: tuple[str, ...],
    journals: tuple[str, ...],
    out: str,
    bucket: float | None,
    master: str | None,
    conf: tuple[str, ...],
    findings: int,
    keep_findings: int,
) -> None:
    """Check the journals against what the fabric's configs promise.

    Works out, with the server's own routing, which instances each message must
    reach and by which path; reports every message missing somewhere, stored twice,
    out of its publisher's order, or held where it must not be (phantom), and the
    replication lag per link over time. Writes OUT/audit.json and OUT/audit.html
    (self-contained, plots included) and prints a summary.

    Spark sorts, aggregates and spills to disk rather than holding a publisher or a
    link in memory, so Spark's default memory does for any number of records.

    \b
    Exit status:
      0  no problems
      1  problems found (the report lists them)
      2  the audit could not run: a config, journal or option cannot be used
      3  the audit could not complete: the Spark job failed (a damaged journal
         record, Spark out of memory, a lost executor, ...); no report is written,
         and one line says what failed and what to do
    """
    pairs = _conf_pairs(conf)
    _require_extra("pyspark", "pyarrow")
    from amps_py.pipeline.audit import (
        AuditError,
        prepare_audit,
        run_audit,
        session_conf,
        write_report,
    )
    from amps_py.pipeline.audit_report import render_text
    from amps_py.pipeline.spark import SparkUnavailable, quiet_task_failures, spark_session

    if bucket is not None and bucket <= 0:
        raise click.BadParameter(f"must be positive, not {bucket}", param_hint="--bucket")
    try:
        inputs = prepare_audit(configs, journals)
    except AuditError as exc:
        click.echo(f"amps-py: {exc}", err=True)
        sys.exit(2)
    try:
        spark = spark_session("amps-py-audit", master, session_conf(master, pairs))
    except SparkUnavailable as exc:
        click.echo(f"amps-py: {exc}", err=True)
        sys.exit(2)
    quiet_task_failures(spark)  # a failed job is reported in one line
    try:
        report = run_audit(spark, inputs, bucket_s=bucket, keep_findings=keep_findings)
    except AuditError as exc:
        _stop(spark)
        _fail(str(exc), 2)
    except Exception as exc:  # a failed Spark job (a damaged journal names its txid)
        _stop(spark)
        _fail(audit_failure(exc), 3)
    _stop(spark)
    paths = write_report(report, out)
    click.echo(render_text(report, findings))
    click.echo(f"Report: {paths[0]}, {paths[1]}")
    sys.exit(report.exit_code)
