"""``amps-py pipeline ...``: analyse journals (Parquet export; the Spark jobs).

Thin: each subcommand parses its options and calls ``amps_py.pipeline``. pyarrow and
pyspark are imported inside the commands, so the rest of the CLI starts fast and
works without the ``spark`` extra.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click


def _inside(filename: object, directory: str) -> bool:
    """Whether ``filename`` (an OSError's) is in ``directory``."""
    if not isinstance(filename, str):
        return False
    return Path(filename).resolve().is_relative_to(Path(directory).resolve())


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)


@click.group()
def pipeline() -> None:
    """Analyse journals: export them to Parquet (no Java needed), run Spark jobs."""


@pipeline.command("export")
@click.argument("journal", type=click.Path(file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--instance",
    default=None,
    help="The name files and manifest are kept under (default: the journal's instance).",
)
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Records per commit (default 250,000); each commit writes one file per topic "
    "and date in it.",
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
    help="Put a topic too long for a directory name under a shortened name (the "
    "manifest maps it back) instead of stopping.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Then re-read every file of the instance and check it against the manifest.",
)
def pipeline_export(
    journal: str,
    out: str,
    instance: str | None,
    batch_rows: int | None,
    batch_bytes: int | None,
    shorten_long_topics: bool,
    verify: bool,
) -> None:
    """Export JOURNAL's records to Parquet files in OUT, partitioned by topic and date
    (OUT/topic=T/date=YYYY-MM-DD/part-INSTANCE-FIRST-LAST.parquet, zstd), with a
    manifest per run and a cumulative one in OUT/_manifests/INSTANCE/.

    Incremental: a run exports only the records after those OUT holds, up to the
    journal's newest record when it started. Safe while the instance runs (the
    journal is only read) and if killed (the next run finishes the job). Several
    instances can share OUT. A damaged record stops the export with exit status 3,
    everything before it exported.

    Prints one line when done; a progress bar on stderr when it is a terminal.
    """
    from amps_py.cli import _journal_tool
    from amps_py.cli_client import progress

    try:
        from amps_py.pipeline.export import (
            ExportDamaged,
            ExportError,
            export_journal,
            verify_export,
        )
        from amps_py.pipeline.export_layout import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_ROWS
    except ImportError as exc:
        _fail(f"the export needs pyarrow ({exc}): pip install -e '.[spark]'", 2)

    try:
        with _journal_tool(journal), progress(f"exporting {journal}", None) as bar:
            try:
                result = export_journal(
                    journal,
                    out,
                    instance=instance,
                    batch_rows=batch_rows or DEFAULT_BATCH_ROWS,
                    batch_bytes=batch_bytes or DEFAULT_BATCH_BYTES,
                    shorten_long_topics=shorten_long_topics,
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
    if result.removed_before_export:
        first, last = result.removed_before_export
        click.echo(
            f"amps-py: warning: txids {first}..{last} were removed from the journal before "
            "any export held them (journal housekeeping ran first): they are not in OUT",
            err=True,
        )
    if result.cleaned:
        click.echo(
            f"amps-py: deleted {len(result.cleaned)} file(s) an interrupted export left "
            "(their records were exported again)",
            err=True,
        )
    click.echo(result.summary())
    if verify:
        problems = verify_export(out, result.instance)
        for problem in problems:
            click.echo(f"PROBLEM {problem}")
        if problems:
            _fail(f"{len(problems)} problem(s) in the export of {result.instance} in {out}", 3)
        click.echo(f"verified: {out} holds instance {result.instance}'s export whole")
