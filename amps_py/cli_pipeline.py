"""``amps-py pipeline ...``: the Spark jobs over journals.

Each subcommand imports pyspark (and pyarrow) only when it runs, so the rest of the
command line starts fast and works without the ``spark`` extra. Every job runs on
local Spark by default (``local[*]``) and takes ``--master`` and ``--conf KEY=VALUE``.
"""

from __future__ import annotations

import sys
from typing import Any

import click

__all__ = ["pipeline"]


@click.group()
def pipeline() -> None:
    """Analyse journals with Spark (needs the spark extra and Java)."""


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
        if not sep or not key:
            raise click.BadParameter(
                f"{text!r} is not KEY=VALUE (e.g. --conf spark.executor.memory=2g)",
                param_hint="--conf",
            )
        pairs.append((key.strip(), value))
    return pairs


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
    help="Journal directories (TransactionLog/JournalDirectory), or directories holding them.",
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
@click.option("--findings", default=20, show_default=True, help="Findings to print.")
def audit_command(
    configs: tuple[str, ...],
    journals: tuple[str, ...],
    out: str,
    bucket: float | None,
    master: str | None,
    conf: tuple[str, ...],
    findings: int,
) -> None:
    """Check the journals against what the fabric's configs promise.

    Works out, with the server's own routing, which instances each message must
    reach and by which path; reports every message missing somewhere, stored twice,
    out of its publisher's order, or held where it must not be (phantom), and the
    replication lag per link over time. Writes OUT/audit.json and OUT/audit.html
    (self-contained, plots included) and prints a summary. Exit status: 0 no
    problems, 1 problems found, 2 the audit could not run.
    """
    pairs = _conf_pairs(conf)
    try:
        from amps_py.pipeline.audit import (
            AuditError,
            prepare_audit,
            run_audit,
            session_conf,
            write_report,
        )
        from amps_py.pipeline.audit_report import render_text
        from amps_py.pipeline.spark import SparkUnavailable, spark_session
    except ImportError as exc:
        click.echo(
            f"amps-py: the Spark pipeline needs the spark extra ({exc}): "
            "pip install -e '.[spark]' (and Java 17 or newer)",
            err=True,
        )
        sys.exit(2)
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
    try:
        report = run_audit(spark, inputs, bucket_s=bucket)
    except AuditError as exc:
        click.echo(f"amps-py: {exc}", err=True)
        sys.exit(2)
    finally:
        spark.stop()
    paths = write_report(report, out)
    click.echo(render_text(report, findings))
    click.echo(f"Report: {paths[0]}, {paths[1]}")
    sys.exit(report.exit_code)
