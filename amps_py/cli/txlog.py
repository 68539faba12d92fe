"""``amps-py txlog ...``: inspect a journal directory, and maintain a stopped
instance's journals. Thin: each subcommand opens a :class:`txlog.Journal` and calls it;
:func:`journal_tool` turns every error into one line and the exit status the group's
help promises (the pipeline's journal commands use it too)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click
import orjson

from amps_py.cli.common import fail

__all__ = ["journal_tool", "txlog"]


@click.group()
def txlog() -> None:
    """Inspect a journal directory (safe on a running instance's journal).

    Every error is one line on stderr naming the file and what to do. Exit status: 0
    sound, 2 the journal cannot be opened or used as asked, 3 the journal is damaged
    (a damaged record, a truncated or damaged data.mdb, a damaged LMDB page).
    """


@contextlib.contextmanager
def journal_tool(path: str, verifying: bool = False, readonly: bool = True) -> Iterator[None]:
    """Turn every error a txlog tool meets into one line and a non-zero exit (3 when
    the journal is damaged, else 2): LMDB's own errors included, never a traceback.
    ``verifying``: the tool is ``verify``, so the fix for damage is the repair itself
    (the usual one starts with running ``verify``). ``readonly``: the tool only reads
    the journal."""
    import lmdb

    from txlog import CorruptRecord, JournalDamaged, JournalError
    from txlog.journal import lmdb_error
    from txlog.preflight import repair_advice
    from txlog.segments import SegmentFileError

    def damaged(found: str, otherwise: str) -> NoReturn:
        if verifying and found:
            fail(f"{found}. Fix: {repair_advice(Path(path))}", 3)
        fail(otherwise, 3)

    try:
        yield
    except lmdb.Error as exc:
        error = lmdb_error(Path(path), exc, readonly)
        if isinstance(error, JournalDamaged):
            damaged(error.found, str(error))
        fail(str(error), 2)
    except JournalDamaged as exc:
        damaged(exc.found, str(exc))
    except JournalError as exc:
        fail(str(exc), 2)
    except CorruptRecord as exc:
        damaged(f"journal {path}: {exc.found}", f"journal {path}: {exc}")
    except SegmentFileError as exc:
        fail(str(exc), 3)
    except OSError as exc:
        fail(f"journal {path}: {exc.strerror or exc} ({exc.filename or path})", 2)


@txlog.command("info")
@click.argument("path", type=click.Path(file_okay=False))
def txlog_info(path: str) -> None:
    """Print the journal's summary as JSON.

    Counts are of what the journal holds now, in LMDB and in compressed or archived
    segment files, removed journals excluded: records, first_txid and last_txid,
    publishers (with records held; publishers_known also counts those whose records
    were all removed, whose last seq logon acks still report), segments. A figure that
    is an estimate is named in "about" with the reason (e.g. while a removal is still
    being purged); "about" is empty when every figure is exact. "holdings_kept" says
    whether the journal keeps what it holds per origin (false for one written before
    amps-py kept it: its resyncs without a cursor send everything).
    """
    from txlog import Journal

    with journal_tool(path), Journal(path, readonly=True) as journal:
        if journal.damage is not None:
            raise journal.damage
        stats = journal.statistics()
        held = [seg for seg in journal.segments() if seg.state != "removed"]
        about: dict[str, str] = {}
        if journal.removal_pending():
            about["publishers"] = (
                "about: a removal is still being purged, so publishers whose records "
                "were all removed may still count"
            )
        segment_file_bytes = 0
        for seg in held:
            if seg.file:
                with contextlib.suppress(OSError):
                    segment_file_bytes += journal.segment_path(seg).stat().st_size
        info = {
            "path": stats.path,
            "instance_name": stats.instance_name,
            "records": stats.records,
            "first_txid": stats.first_txid,
            "last_txid": stats.last_txid,
            "publishers": journal.held_publishers(),
            "publishers_known": journal.known_publishers(),
            "segments": len(held),
            "file_bytes": stats.file_bytes,
            "segment_file_bytes": segment_file_bytes,
            "about": about,
            "origins": journal.origin_high_water(),
            # whether it keeps what it holds per origin (the resync exchange): false for
            # a journal written before holdings, which resyncs without a cursor in full
            "holdings_kept": journal.holdings_valid,
            "segment_table": [seg.__dict__ for seg in held],
            "pending_removal_through": journal.pending_removal(),
        }
    click.echo(json.dumps(info, indent=2))


@txlog.command("dump")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--from-txid", type=int, default=0, help="Start after this txid.")
@click.option("--limit", type=int, default=0, help="Stop after this many records (0 = all).")
def txlog_dump(path: str, from_txid: int, limit: int) -> None:
    """Print records as JSON lines; a damaged record stops the dump with an error.
    Records of a message type other than json and binary (fix, nvfix, xml, bson,
    msgpack) also carry ``decoded``: their fields as JSON (null when the payload is
    not a well-formed message of its type)."""
    from amps_py.message_types import default_types
    from txlog import Journal

    types = default_types()
    count = 0
    with journal_tool(path), Journal(path, readonly=True) as journal, _reader_may_leave():
        if journal.damage is not None:
            raise journal.damage  # LMDB would abort on the damaged page
        for rec in journal.iter_records(from_txid):
            line = rec.to_json()
            reader = types.get(rec.message_type)
            if reader is not None and rec.message_type not in ("json", "binary"):
                line["decoded"] = reader.to_jsonable(rec.payload)
            sys.stdout.write(orjson.dumps(line).decode() + "\n")
            count += 1
            if limit and count >= limit:
                break
        sys.stdout.flush()


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """End quietly when whoever reads stdout stops reading (``| head``)."""
    try:
        yield
    except BrokenPipeError:
        import os

        # stdout is gone: point it at /dev/null so the interpreter's final flush
        # does not complain again, and exit as `head` expects of a writer
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def _maintain_offline(path: str, action: str, journal_id: int, archive_dir: str | None) -> None:
    from amps_py.cli.progress import progress
    from txlog import Journal
    from txlog.offline import maintain_offline

    with (
        journal_tool(path, readonly=False),
        Journal(path, archive_directory=archive_dir) as journal,
    ):
        steps = {
            "compress": "compressing",
            "archive": "archiving",
            "remove": "removing",
            "purge": "purging LMDB",
        }
        with progress(f"{steps[action]} through journal {journal_id}", None) as bar:

            def report(step: str, done: int, total: int) -> None:
                bar.update(completed=done, total=total, what=f"{steps[step]} (records)")

            summary = maintain_offline(journal, action, journal_id, report)
        click.echo(f"{action} through journal {journal_id}: {summary}")


@txlog.command("compress")
@click.argument("path", type=click.Path(file_okay=False, exists=True))
@click.argument("journal_id", metavar="ID", type=int)
def txlog_compress(path: str, journal_id: int) -> None:
    """Compress journal ID and every older one of a stopped instance's journal (a
    running instance: `amps-py admin journal compress ID`)."""
    _maintain_offline(path, "compress", journal_id, None)


@txlog.command("archive")
@click.argument("path", type=click.Path(file_okay=False, exists=True))
@click.argument("journal_id", metavar="ID", type=int)
@click.option(
    "--archive-dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Where the segment files go (the instance's JournalArchiveDirectory).",
)
def txlog_archive(path: str, journal_id: int, archive_dir: str) -> None:
    """Archive journal ID and every older one of a stopped instance's journal."""
    _maintain_offline(path, "archive", journal_id, archive_dir)


@txlog.command("remove")
@click.argument("path", type=click.Path(file_okay=False, exists=True))
@click.argument("journal_id", metavar="ID", type=int)
def txlog_remove(path: str, journal_id: int) -> None:
    """Remove journal ID and every older one of a stopped instance's journal, except
    what a replication destination has not acknowledged (as last saved)."""
    _maintain_offline(path, "remove", journal_id, None)


@txlog.command("verify")
@click.argument("path", type=click.Path(file_okay=False))
def txlog_verify(path: str) -> None:
    """Check data.mdb against LMDB's meta pages, every LMDB page on the way to a
    record, and every record's CRC; exit 3 and list the damage if any."""
    from amps_py.cli.progress import progress
    from txlog import Journal

    with journal_tool(path, verifying=True), Journal(path, readonly=True) as journal:
        stats = journal.statistics()
        with progress(f"verifying {path}", stats.records) as bar:
            problems = journal.verify(lambda done: bar.update(completed=done))
    if problems:
        for p in problems:
            click.echo(f"CORRUPT txid {p.txid}: {p.problem}")
        from txlog.preflight import repair_advice

        fail(f"{len(problems)} damaged record(s) in {path}; Fix: {repair_advice(Path(path))}", 3)
    click.echo(f"{path}: OK — {stats.records} records, txids {stats.first_txid}..{stats.last_txid}")
