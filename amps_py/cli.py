"""The ``amps-py`` command. Thin: every subcommand calls a library API.

amps-py serve [CONFIG | --config FILE] run an instance (embedded default without one;
                                       --allow-empty-journal: see docs/GUARANTEES.md)
amps-py config check FILE              validate a config without starting
amps-py config show-default            print the embedded default config
amps-py config fabric DIR_OR_FILES...  check a whole replication fabric's routing
amps-py txlog info|dump|verify PATH    inspect a journal directory
amps-py txlog compress|archive|remove PATH ID   maintain a stopped instance's journals
amps-py publish URI TOPIC [DATA]       publish and wait for the persisted ack
amps-py subscribe URI TOPIC            print messages as JSON lines
amps-py users add|remove|list FILE ...  maintain an amps-password-file password file
amps-py pipeline stats JOURNAL...      topic and publisher statistics (Spark)
amps-py pipeline export JOURNAL OUT    journal records to Parquet, incrementally

URIs are tcp://host:port/amps/json, or tcps://... for a TLS transport (--ca-file names
the CA to trust when the server's certificate is not signed by a system CA). Client
credentials: --user NAME and the password in $AMPS_PY_PASSWORD, or
tcp://user:password@host:port/amps/json. Long work shows progress on stderr when it is
a terminal, and nothing extra when piped.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import orjson
import trio
import trio.lowlevel

from amps_py import __version__
from amps_py.cli_pipeline import pipeline

if TYPE_CHECKING:
    from amps_py.cli_client import Credentials


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(__version__, prog_name="amps-py")
def main() -> None:
    """amps-py: an AMPS-like message server with a durable journal and replication."""


# ---------------------------------------------------------------------------- serve
def tune_garbage_collector() -> None:
    """Collect the young generation every 50,000 allocations instead of 700.

    The server allocates a few objects per message and keeps tens of thousands alive
    (the commit tail, records awaiting acks), none in reference cycles of note; with
    the default threshold the cyclic collector ran every few hundred messages and took
    a measurable share of a replication stream's CPU. Memory is still reclaimed by
    reference counting as before; only cycle detection runs less often.
    """
    gc.freeze()  # what was imported and configured so far is never collected
    gc.set_threshold(50_000, 20, 100)


@main.command()
@click.argument("config_file", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="AMPS-style XML config (the same as giving CONFIG); without either the "
    "embedded default runs.",
)
@click.option(
    "--data-dir",
    default="amps-data",
    show_default=True,
    help="Journal directory of the embedded default (ignored with a config).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Embedded default only: the client port instead of 9007 (0: any free port; "
    "--ready-file tells which).",
)
@click.option(
    "--admin-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Embedded default only: the admin API port instead of 8085 (0: any free port).",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {name, pid, transports: {name: port}} as JSON here once listening "
    "(the admin API's port under the name admin).",
)
@click.option(
    "--stats-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Rewrite the instance's statistics (JSON) here four times a second.",
)
@click.option(
    "--allow-empty-journal",
    is_flag=True,
    help="Start with an empty journal even where a journal existed (its data.mdb is "
    "empty or missing): every message it held is absent from this instance. Without "
    "it such a start is refused.",
)
def serve(
    config_file: str | None,
    config_path: str | None,
    data_dir: str,
    port: int | None,
    admin_port: int | None,
    ready_file: str | None,
    stats_file: str | None,
    allow_empty_journal: bool,
) -> None:
    """Run an instance until SIGTERM or Ctrl-C: `amps-py serve config.xml` (as
    `ampServer config.xml`), or `amps-py serve --config config.xml`.

    With no config: the embedded default (`amps-py config show-default` prints it), a
    standalone instance journaling every topic under ./amps-data, clients on
    127.0.0.1:9007 (tcp://127.0.0.1:9007/amps/json), the admin API on 127.0.0.1:8085.
    """
    config_path = _one_config(config_file, config_path)
    if config_path and (port is not None or admin_port is not None):
        flag = "--port" if port is not None else "--admin-port"
        _fail(
            f"{flag} applies to the embedded default only; with {config_path}, set the "
            "port in its Transport's (or Admin's) InetAddr",
            2,
        )
    from amps_py.config import ConfigError, default_config, load_config
    from amps_py.logs import configure_logging
    from amps_py.server import serve_instance

    try:
        if config_path:
            config = load_config(config_path)
        else:
            config = _with_ports(default_config(Path(data_dir)), port, admin_port)
    except ConfigError as exc:
        _fail(str(exc), 2)
    except OSError as exc:
        _fail(f"cannot read config {config_path}: {exc.strerror or exc}", 2)
    configure_logging(config.logging, config.name)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                await nursery.start(serve_instance_task, nursery)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    async def serve_instance_task(
        nursery: trio.Nursery, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        try:
            await serve_instance(
                config,
                ready_file=ready_file,
                stats_file=stats_file,
                allow_empty_journal=allow_empty_journal,
            )
        except BaseException:
            nursery.cancel_scope.cancel()
            raise

    tune_garbage_collector()
    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        message = _startup_failure(exc)
        if message is None:
            raise
        _fail(message, 1)


def _startup_failure(exc: BaseException) -> str | None:
    """The line to print for an instance that could not start: the refusal's own text
    (a listener that cannot bind, a journal directory that cannot be written, a
    journal refused at open), or for another OS error its text and file. None: not a
    start failure (a bug), let it propagate."""
    from amps_py.server.startup import ConfigurationError
    from txlog import JournalError

    first = exc
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if isinstance(first, ConfigurationError | JournalError):
        return f"cannot start: {first}"
    if isinstance(first, OSError):
        where = f" ({first.filename})" if first.filename else ""
        return f"cannot start: {first.strerror or first}{where}"
    return None


def _one_config(positional: str | None, option: str | None) -> str | None:
    """The config file given as CONFIG or --config (both only when they agree)."""
    if positional and option and Path(positional).resolve() != Path(option).resolve():
        _fail(
            f"two configs given: {positional} and --config {option}; give one "
            f"(amps-py serve {option})",
            2,
        )
    return positional or option


def _with_ports(config: Any, port: int | None, admin_port: int | None) -> Any:
    """The embedded default ``config`` with its client (and admin) port replaced."""
    import dataclasses

    if port is not None:
        config = dataclasses.replace(
            config, transports=tuple(dataclasses.replace(t, port=port) for t in config.transports)
        )
    if admin_port is not None and config.admin is not None:
        config = dataclasses.replace(config, admin=(config.admin[0], admin_port))
    return config


# ---------------------------------------------------------------------------- config
@main.group()
def config() -> None:
    """Check configuration files."""


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Validate FILE against the schema and the semantic rules, without starting.

    Settings that work but leave the instance open (a replication transport without
    authentication reachable beyond this machine) are printed as warnings on stderr;
    they do not change the exit status.
    """
    from amps_py.config import ConfigError, load_config, security_warnings

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        _fail(str(exc), 2)
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}", 2)
    for warning in security_warnings(cfg):
        click.echo(f"{path}: warning: {warning}", err=True)
    transports = ", ".join(f"{t.name}={t.host}:{t.port}" for t in cfg.transports)
    journal = cfg.transaction_log.journal_directory if cfg.transaction_log else "none"
    admin = f"{cfg.admin[0]}:{cfg.admin[1]}" if cfg.admin else "none"
    click.echo(
        f"{path}: OK — instance {cfg.name} (group {cfg.group}); "
        f"transports {transports}; journal {journal}; admin {admin}"
    )


@config.command("show-default")
def config_show_default() -> None:
    """Print the embedded default config (what `amps-py serve` runs without --config)."""
    from amps_py.config import default_config_xml

    click.echo(default_config_xml())


@config.command("fabric")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="NAME[:TYPE]",
    help="Simulate this topic (message type json unless given) instead of a sample of "
    "each replicated topic pattern; repeatable.",
)
def config_fabric(paths: tuple[str, ...], topics: tuple[str, ...]) -> None:
    """Load the configs of a whole fabric (files, or directories of *.xml) and print,
    for each instance and replicated topic, where a message published there goes and
    by which path, then the problems found.

    Exit status: 0 no problems, 1 warnings, 2 errors or a config that does not load.
    """
    from amps_py.config import ConfigError
    from amps_py.replication.fabric import load_fabric

    try:
        fabric = load_fabric(paths)
    except ConfigError as exc:
        _fail(str(exc), 2)
    cases = []
    for spec in topics:
        name, _, message_type = spec.partition(":")
        cases.append((name, message_type or "json"))
    click.echo(fabric.report(cases), nl=False)
    findings = fabric.findings(fabric.cases_for(cases))
    if any(f.level == "error" for f in findings):
        sys.exit(2)
    if findings:
        sys.exit(1)


# ---------------------------------------------------------------------------- txlog
@main.group()
def txlog() -> None:
    """Inspect a journal directory (safe on a running instance's journal).

    Every error is one line on stderr naming the file and what to do. Exit status: 0
    sound, 2 the journal cannot be opened or used as asked, 3 the journal is damaged
    (a damaged record, a truncated or damaged data.mdb, a damaged LMDB page).
    """


@contextlib.contextmanager
def _journal_tool(path: str) -> Iterator[None]:
    """Turn every error a txlog tool meets into one line and a non-zero exit (3 when
    the journal is damaged, else 2): LMDB's own errors included, never a traceback."""
    import lmdb

    from txlog import CorruptRecord, JournalDamaged, JournalError
    from txlog.journal import lmdb_error
    from txlog.segments import SegmentFileError

    try:
        yield
    except lmdb.Error as exc:
        error = lmdb_error(Path(path), exc)
        _fail(str(error), 3 if isinstance(error, JournalDamaged) else 2)
    except JournalDamaged as exc:
        _fail(str(exc), 3)
    except JournalError as exc:
        _fail(str(exc), 2)
    except (CorruptRecord, SegmentFileError) as exc:
        _fail(str(exc), 3)
    except OSError as exc:
        _fail(f"journal {path}: {exc.strerror or exc} ({exc.filename or path})", 2)


@txlog.command("info")
@click.argument("path", type=click.Path(file_okay=False))
def txlog_info(path: str) -> None:
    """Print the journal's summary as JSON.

    Counts are of what the journal holds now, in LMDB and in compressed or archived
    segment files, removed journals excluded: records, first_txid and last_txid,
    publishers (with records held; publishers_known also counts those whose records
    were all removed, whose last seq logon acks still report), segments. A figure that
    is an estimate is named in "about" with the reason (e.g. while a removal is still
    being purged); "about" is empty when every figure is exact.
    """
    from txlog import Journal

    with _journal_tool(path), Journal(path, readonly=True) as journal:
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
            "segment_table": [seg.__dict__ for seg in held],
            "pending_removal_through": journal.pending_removal(),
        }
    click.echo(json.dumps(info, indent=2))


@txlog.command("dump")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--from-txid", type=int, default=0, help="Start after this txid.")
@click.option("--limit", type=int, default=0, help="Stop after this many records (0 = all).")
def txlog_dump(path: str, from_txid: int, limit: int) -> None:
    """Print records as JSON lines; a damaged record stops the dump with an error."""
    from txlog import Journal

    count = 0
    with _journal_tool(path), Journal(path, readonly=True) as journal, _reader_may_leave():
        if journal.damage is not None:
            raise journal.damage  # LMDB would abort on the damaged page
        for rec in journal.iter_records(from_txid):
            sys.stdout.write(orjson.dumps(rec.to_json()).decode() + "\n")
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
    from amps_py.cli_client import progress
    from txlog import Journal
    from txlog.offline import maintain_offline

    with _journal_tool(path), Journal(path, archive_directory=archive_dir) as journal:
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
    from amps_py.cli_client import progress
    from txlog import Journal

    with _journal_tool(path), Journal(path, readonly=True) as journal:
        stats = journal.statistics()
        with progress(f"verifying {path}", stats.records) as bar:
            problems = journal.verify(lambda done: bar.update(completed=done))
    if problems:
        for p in problems:
            click.echo(f"CORRUPT txid {p.txid}: {p.problem}")
        from txlog.preflight import repair_advice

        _fail(f"{len(problems)} damaged record(s) in {path}; Fix: {repair_advice(Path(path))}", 3)
    click.echo(f"{path}: OK — {stats.records} records, txids {stats.first_txid}..{stats.last_txid}")


# ---------------------------------------------------------------------------- client
def _client_name(name: str | None, role: str) -> str:
    import os
    import socket

    return name or f"amps-py-{role}-{socket.gethostname()}-{os.getpid()}"


_ca_file_option = click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="For tcps:// URIs: PEM file of the CA that issued the server's certificate "
    "(the certificate itself if self-signed); default: the system's CAs.",
)
_URI_HELP = (
    "URI is tcp://HOST:PORT/amps/json, or tcps://... for a TLS transport. Credentials: "
    "--user NAME with the password in the environment variable AMPS_PY_PASSWORD "
    "(--password-env names another), or the AMPS form "
    "tcp://USER:PASSWORD@HOST:PORT/amps/json (a password in a URI shows in shell "
    "history and process lists: prefer the variable)."
)
_user_option = click.option(
    "--user",
    default=None,
    help="Log on as this user (or give it in the URI: tcp://USER@HOST:PORT/amps/json).",
)
_password_env_option = click.option(
    "--password-env",
    default="AMPS_PY_PASSWORD",
    show_default=True,
    metavar="VAR",
    help="Environment variable holding the logon password (there is no password flag: "
    "it would stay in shell history).",
)


def _credentials(uri: str, user: str | None, password_env: str) -> Credentials:
    import os

    from amps_py.cli_client import CredentialsError, resolve_credentials
    from amps_py.client import BadURI

    try:
        return resolve_credentials(uri, user, password_env, os.environ)
    except (BadURI, CredentialsError) as exc:
        _fail(str(exc))


class _Failed(Exception):
    """A client command failed; the text is the whole line for the user."""


@contextlib.contextmanager
def _client_errors(
    credentials: Credentials, client_name: str, password_env: str, topic: str
) -> Iterator[None]:
    """Turn what a client command meets into one line and exit status 1."""
    from amps_py.cli_client import explain_refusal
    from amps_py.client import AMPSError, BadURI, CommandError

    try:
        yield
    except CommandError as exc:
        _fail(explain_refusal(exc, credentials, client_name, password_env, topic))
    except (_Failed, AMPSError, BadURI, OSError, TimeoutError) as exc:
        _fail(str(exc))


async def _lines(file_: Any) -> Any:
    """The non-blank lines of ``file_`` (binary) without their line ends, with the
    bytes read so far: ``(line, bytes_read)``. A regular file is read directly; a pipe
    or terminal in a worker thread, so waiting for input does not stall the client."""
    regular = _file_size(file_) is not None
    read = 0
    pending = b""
    while True:
        if regular:
            chunk = file_.read(1 << 16)
        else:
            chunk = await trio.to_thread.run_sync(
                getattr(file_, "read1", file_.read), 1 << 16, abandon_on_cancel=True
            )
        if not chunk:
            break
        read += len(chunk)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            line = line.rstrip(b"\r")
            if line.strip():
                yield line, read - len(pending)
        await trio.lowlevel.checkpoint()
    if pending.strip():
        yield pending.rstrip(b"\r"), read


def _file_size(file_: Any) -> int | None:
    """The size of ``file_`` when it is a regular file (None: a pipe, a terminal)."""
    import os
    import stat

    try:
        info = os.fstat(file_.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@main.command(epilog=_URI_HELP)
@click.argument("uri")
@click.argument("topic")
@click.argument("data", required=False)
@click.option(
    "--file",
    "file_",
    type=click.File("rb"),
    help="Publish each non-blank line of FILE ('-' = stdin); on a terminal a progress "
    "bar shows how far it got.",
)
@click.option("--name", default=None, help="Client name (identifies the publisher).")
@click.option(
    "--timeout",
    type=float,
    default=30,
    show_default=True,
    help="Seconds allowed to connect and log on, and for the persisted ack once "
    "everything is sent.",
)
@_ca_file_option
@_user_option
@_password_env_option
@click.option(
    "--admin-url",
    default=None,
    help="The instance's admin API, asked which replication destinations it waits for "
    "when the persisted ack does not come (default: $AMPS_PY_ADMIN_URL, else port 8085 "
    "on the URI's host).",
)
def publish(
    uri: str,
    topic: str,
    data: str | None,
    file_: Any,
    name: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    admin_url: str | None,
) -> None:
    """Publish DATA (or each line of --file) to TOPIC and wait until it is persisted.

    On success prints `published N message(s) to TOPIC; persisted through seq S` on
    stderr, exit status 0. Otherwise one line says what failed, exit status 1; when the
    persisted ack does not come within --timeout, it names the sync replication
    destinations the instance waits for (from its admin API).
    """
    import os

    from amps_py.cli_client import admin_url_for, explain_persisted_wait, fetch_instance, progress
    from amps_py.client import open_client

    if data is None and file_ is None:
        _fail("give DATA or --file FILE")
    credentials = _credentials(uri, user, password_env)
    client_name = _client_name(name, "publish")

    async def run() -> tuple[int, int]:
        async with open_client(
            uri, client_name, timeout=timeout, ca_file=ca_file, **credentials.logon_fields()
        ) as client:
            first = client.seq
            n = last = 0
            size = _file_size(file_) if file_ is not None else None
            with progress(f"publishing to {topic}", size, "bytes") as bar:

                def show(done: int | None = None) -> None:
                    persisted = max(client.persisted_seq - first, 0)
                    bar.update(completed=done, detail=f"{n} sent, {persisted} persisted")

                if data is not None:
                    last = await client.publish(topic, data.encode())
                    n = 1
                else:
                    async for line, done in _lines(file_):
                        last = await client.publish(topic, line)
                        n += 1
                        if n % 512 == 0:
                            show(done)
                    show()
                bar.update(what=f"waiting for the persisted ack of seq {last}")
                try:
                    await client.wait_persisted(last, timeout=timeout)
                except TimeoutError as exc:
                    url = admin_url_for(uri, admin_url, os.environ)
                    document = await trio.to_thread.run_sync(fetch_instance, url, credentials)
                    raise _Failed(
                        explain_persisted_wait(str(exc), url, document, client_name)
                    ) from None
            return n, last

    with _client_errors(credentials, client_name, password_env, topic):
        n, last = trio.run(run)
    click.echo(f"published {n} message(s) to {topic}; persisted through seq {last}", err=True)


@main.command(epilog=_URI_HELP)
@click.argument("uri")
@click.argument("topic")
@click.option("--filter", "filter_", default=None, help='Content filter, e.g. "/qty > 10".')
@click.option(
    "--bookmark",
    default=None,
    help="Replay from a bookmark: 0 (EPOCH), 0|1| (NOW), <hash>|<seq>|, "
    "YYYYMMDDTHHMMSS, or a range. A line on stderr says when the replay is complete "
    "and live messages start.",
)
@click.option("--options", default=None, help="Subscription options, e.g. timestamp,bookmark.")
@click.option("--count", type=int, default=0, help="Exit after this many messages.")
@click.option(
    "--timeout",
    type=float,
    default=0,
    help="Exit after this many seconds without a message (0 = never): exit status 0, "
    "or 1 with --count when fewer messages came.",
)
@click.option("--raw", is_flag=True, help="Print payloads only, not the JSON envelope.")
@click.option("--name", default=None, help="Client name.")
@_ca_file_option
@_user_option
@_password_env_option
def subscribe(
    uri: str,
    topic: str,
    filter_: str | None,
    bookmark: str | None,
    options: str | None,
    count: int,
    timeout: float,
    raw: bool,
    name: str | None,
    ca_file: str | None,
    user: str | None,
    password_env: str,
) -> None:
    """Print messages on TOPIC as one JSON object per line: {topic, bookmark, data}.

    Stops after --count messages, after --timeout seconds without a message, or at
    Ctrl-C. Exit status 0, or 1 with a line on stderr when the subscription was refused
    or ended (connection lost), or when --timeout came before --count messages. A
    progress line (messages, rate) goes to stderr every few seconds on long runs.
    """
    from amps_py.client import AMPSError, open_client
    from amps_py.trio_util import unwrapping_groups

    out = sys.stdout
    credentials = _credentials(uri, user, password_env)
    client_name = _client_name(name, "subscribe")

    async def run() -> None:
        n = 0
        started = last_report = time.monotonic()
        announced = bookmark is None
        async with (
            open_client(uri, client_name, ca_file=ca_file, **credentials.logon_fields()) as client,
            client.subscribe(topic, filter=filter_, bookmark=bookmark, options=options) as sub,
            unwrapping_groups(),
            trio.open_nursery() as nursery,
        ):

            def announce_replay_end() -> None:
                nonlocal announced
                if announced or sub.replayed is None or n < sub.replayed:
                    return
                announced = True
                out.flush()
                after = "" if (bookmark or "")[:1] in "[(" else "; live messages follow"
                click.echo(
                    f"amps-py: replay complete ({sub.replayed} message(s) replayed){after}",
                    err=True,
                )

            async def on_completed() -> None:
                await sub.completed.wait()
                announce_replay_end()

            if not announced:
                nursery.start_soon(on_completed)
            while not count or n < count:
                try:
                    msg = await sub.get(timeout) if timeout else await sub.__anext__()
                except TimeoutError:
                    out.flush()
                    if count:
                        raise _Failed(
                            f"only {n} of {count} message(s) arrived: none came for {timeout:g} s"
                        ) from None
                    click.echo(
                        f"amps-py: no message for {timeout:g} s; stopping after {n} message(s)",
                        err=True,
                    )
                    break
                except StopAsyncIteration:
                    out.flush()
                    if sub.failure:
                        raise AMPSError(
                            f"subscription ended: {sub.failure.get('reason')}"
                        ) from None
                    if client.closed is not None:
                        raise AMPSError(
                            f"subscription ended after {n} message(s): {client.closed}"
                        ) from None
                    break
                n += 1
                if raw:
                    out.write(msg.data.decode(errors="replace") + "\n")
                else:
                    try:
                        data: Any = orjson.loads(msg.data)
                    except orjson.JSONDecodeError:
                        data = msg.data.decode(errors="replace")
                    env = {"topic": msg.topic, "bookmark": msg.bookmark, "data": data}
                    out.write(orjson.dumps(env).decode() + "\n")
                announce_replay_end()
                now = time.monotonic()
                if now - last_report >= 5:
                    out.flush()
                    click.echo(f"[{n} messages, {n / (now - started):,.0f} msg/s]", err=True)
                    last_report = now
            out.flush()
            nursery.cancel_scope.cancel()

    with (
        _client_errors(credentials, client_name, password_env, topic),
        contextlib.suppress(KeyboardInterrupt),
    ):
        trio.run(run)


# ---------------------------------------------------------------------------- users
@main.group()
def users() -> None:
    """Maintain an amps-password-file password file (scrypt hashes, one user a line)."""


def _load_passwords(path: str, *, create: bool) -> Any:
    from amps_py.auth import AuthFileError, PasswordFile

    if create and not Path(path).exists():
        return PasswordFile(path)
    try:
        return PasswordFile.load(path)
    except AuthFileError as exc:
        _fail(str(exc), 2)


@users.command("add")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("user")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of stdin instead of prompting.",
)
def users_add(path: str, user: str, password_stdin: bool) -> None:
    """Add USER to FILE (created if missing), or set a new password for USER."""
    passwords = _load_passwords(path, create=True)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            f"Password for {user}", hide_input=True, confirmation_prompt=True, err=True
        )
    if not password:
        _fail("the password is empty; give a non-empty password", 2)
    try:
        updated = passwords.with_user(user, password)
    except ValueError as exc:
        _fail(str(exc), 2)
    updated.save()
    verb = "updated" if user in passwords.entries else "added"
    click.echo(f"{path}: user {user} {verb}")


@users.command("remove")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("user")
def users_remove(path: str, user: str) -> None:
    """Remove USER from FILE."""
    passwords = _load_passwords(path, create=False)
    if user not in passwords.entries:
        _fail(f"{path}: no user {user!r}; `amps-py users list {path}` shows the users", 1)
    passwords.without_user(user).save()
    click.echo(f"{path}: user {user} removed")


@users.command("list")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
def users_list(path: str) -> None:
    """Print the user names in FILE, one a line (never the hashes)."""
    for user in _load_passwords(path, create=False).users():
        click.echo(user)


# ---------------------------------------------------------------------------- admin
@main.group()
@click.option(
    "--url",
    default=None,
    help="the instance's admin interface (default: http://127.0.0.1:8085, the embedded "
    "default's Admin/InetAddr; or $AMPS_PY_ADMIN_URL)",
)
@click.option("--user", default=None, help="HTTP Basic user, when the instance authenticates")
@click.option(
    "--password-env",
    default="AMPS_PY_ADMIN_PASSWORD",
    show_default=True,
    help="environment variable holding the password (never pass it on the command line)",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="print the JSON the server returned (also accepted after the subcommand)",
)
@click.pass_context
def admin(
    ctx: click.Context, url: str | None, user: str | None, password_env: str, as_json: bool
) -> None:
    """Inspect and steer a running instance through its HTTP admin interface.

    Tables fit the terminal (80 columns when piped; COLUMNS=N sets another width):
    the key columns are always shown whole, the others as room allows.
    """
    import os

    from amps_py.admin.console import DEFAULT_URL

    ctx.obj = {
        "url": url or os.environ.get("AMPS_PY_ADMIN_URL") or DEFAULT_URL,
        "user": user,
        "password": os.environ.get(password_env, ""),
        "json": as_json,
    }


def _admin_fetch(ctx: click.Context, path: str, method: str = "GET") -> Any:
    from amps_py.admin.console import AdminError, fetch

    o = ctx.obj
    try:
        return fetch(o["url"], path, method=method, user=o["user"], password=o["password"])
    except AdminError as exc:
        _fail(str(exc), exc.exit_code)


def _json_after_subcommand(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``amps-py admin status --json`` means ``amps-py admin --json status``."""
    if value:
        ctx.ensure_object(dict)["json"] = True


def _accept_json_after_subcommands(group: click.Group) -> None:
    """Give every subcommand of ``group`` a ``--json`` flag that sets the group's."""
    for command in group.commands.values():
        command.params.append(
            click.Option(
                ["--json"],
                is_flag=True,
                expose_value=False,
                callback=_json_after_subcommand,
                help="print the JSON the server returned (same as `admin --json ...`)",
            )
        )


def _admin_print(ctx: click.Context, document: Any, show: Any) -> None:
    if ctx.obj["json"]:
        click.echo(json.dumps(document, indent=2))
        return
    from rich.console import Console

    show(Console(markup=False), document)  # server text is never markup


@admin.command("status")
@click.pass_context
def admin_status(ctx: click.Context) -> None:
    """One screen: instance, journal, transports, replication (with the destinations
    that are down: since when, failed attempts, last error)."""
    from amps_py.admin.console import print_status

    _admin_print(ctx, _admin_fetch(ctx, "/amps/instance.json"), print_status)


@admin.command("replication")
@click.pass_context
def admin_replication(ctx: click.Context) -> None:
    """The replication destinations as a table, those that are down, and the upstreams
    (with --json: /amps/instance/replication, destinations and upstreams by name)."""
    from amps_py.admin.console import replication_view

    _admin_table(ctx, "/amps/instance/replication.json", replication_view)


@admin.command("downgrade")
@click.argument("destination")
@click.pass_context
def admin_downgrade(ctx: click.Context, destination: str) -> None:
    """Make a sync destination async now: persisted acks stop waiting for it."""
    _replication_action(ctx, destination, "downgrade")


@admin.command("upgrade")
@click.argument("destination")
@click.pass_context
def admin_upgrade(ctx: click.Context, destination: str) -> None:
    """Make a downgraded destination sync again once it has caught up."""
    _replication_action(ctx, destination, "upgrade")


def _replication_action(ctx: click.Context, destination: str, action: str) -> None:
    _admin_action(ctx, f"/amps/administrator/replication/{destination}/{action}", "destination")


def _admin_table(ctx: click.Context, path: str, table: Any) -> None:
    """Fetch ``path`` and print ``table(document, width)`` for the console's width (or
    the JSON with --json)."""
    _admin_print(
        ctx,
        _admin_fetch(ctx, path),
        lambda console, doc: console.print(table(doc, console.width)),
    )


def _admin_action(ctx: click.Context, path: str, subject: str) -> None:
    """POST an administrator action and print ``<subject>: <result>``."""
    doc = _admin_fetch(ctx, path, "POST")
    _admin_print(ctx, doc, lambda console, d: console.print(f"{d[subject]}: {d['result']}"))


@admin.command("journals")
@click.pass_context
def admin_journals(ctx: click.Context) -> None:
    """The transaction log (txid range, size, durability, commit and fsync times) and
    its journal segments."""
    from amps_py.admin.console import journals_view

    _admin_table(ctx, "/amps/instance/transaction_log.json", journals_view)


@admin.command("journal")
@click.argument("action", type=click.Choice(["compress", "archive", "remove"]))
@click.argument("journal_id", metavar="ID", type=int)
@click.pass_context
def admin_journal(ctx: click.Context, action: str, journal_id: int) -> None:
    """Compress, archive or remove journal ID and every older one (`journals` lists
    them). Remove waits until no destination, replay or queue needs them."""
    doc = _admin_fetch(
        ctx, f"/amps/administrator/transaction_log/journals/{journal_id}/{action}", "POST"
    )
    _admin_print(ctx, doc, lambda console, d: console.print(d["summary"]))


@admin.command("actions")
@click.pass_context
def admin_actions(ctx: click.Context) -> None:
    """The custom actions an administrator can run (amps-action-on-admin)."""
    from amps_py.admin.console import actions_view

    _admin_print(
        ctx,
        _admin_fetch(ctx, "/amps/administrator/actions.json"),
        lambda console, doc: console.print(actions_view(doc)),
    )


@admin.command("action")
@click.argument("path")
@click.argument("parameters", nargs=-1, metavar="[NAME=VALUE]...")
@click.pass_context
def admin_action(ctx: click.Context, path: str, parameters: tuple[str, ...]) -> None:
    """Run the actions with amps-action-on-admin Path PATH; NAME=VALUE pairs become
    their variables ({{NAME}})."""
    from urllib.parse import quote, urlencode

    pairs = []
    for item in parameters:
        name, sep, value = item.partition("=")
        if not sep or not name:
            _fail(f"parameter {item!r} is not NAME=VALUE; write e.g. who=operators", 2)
        pairs.append((name, value))
    query = f"?{urlencode(pairs)}" if pairs else ""
    doc = _admin_fetch(
        ctx, f"/amps/administrator/actions/{quote(path.strip('/'))}.json{query}", "POST"
    )

    def show(console: Any, d: dict[str, Any]) -> None:
        for run in d["runs"]:
            console.print(f"{run['name']} (action {run['action']}): {run['outcome']}")

    _admin_print(ctx, doc, show)


@admin.command("transport")
@click.argument("action", type=click.Choice(["enable", "disable"]))
@click.argument("name")
@click.pass_context
def admin_transport(ctx: click.Context, action: str, name: str) -> None:
    """Disable a client transport (stop listening, disconnect its clients) or enable it."""
    _admin_action(ctx, f"/amps/administrator/transports/{name}/{action}", "transport")


@admin.command("clients")
@click.pass_context
def admin_clients(ctx: click.Context) -> None:
    """The connected clients: user, address, subscriptions, messages, queued output."""
    from amps_py.admin.console import print_clients

    _admin_print(ctx, _admin_fetch(ctx, "/amps/instance/clients.json"), print_clients)


@admin.command("disconnect")
@click.argument("client")
@click.pass_context
def admin_disconnect(ctx: click.Context, client: str) -> None:
    """Close CLIENT's connection (a name from `amps-py admin clients`, or connection-ID)."""
    from urllib.parse import quote

    _admin_action(ctx, f"/amps/administrator/clients/{quote(client, safe='')}/disconnect", "client")


@admin.command("watch")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="seconds between refreshes",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="stop after this many screens (default: until Ctrl-C)",
)
@click.pass_context
def admin_watch(ctx: click.Context, interval: float, count: int | None) -> None:
    """The status screen, refreshed every --interval seconds until Ctrl-C.

    With --json, one JSON document a line per refresh instead. A refresh that fails is
    shown and retried; with --count, a failed last refresh sets the exit status.
    """
    from amps_py.admin.console import AdminError, fetch, watch

    o = ctx.obj
    failure: AdminError | None = None
    try:
        if o["json"]:
            click.echo(json.dumps(_admin_fetch(ctx, "/amps/instance.json"), separators=(",", ":")))
            shown = 1
            while count is None or shown < count:
                time.sleep(interval)  # the refresh period the operator asked for
                shown += 1
                try:
                    document = fetch(
                        o["url"], "/amps/instance.json", user=o["user"], password=o["password"]
                    )
                except AdminError as exc:
                    failure = exc
                    if count is None or shown < count:
                        click.echo(f"amps-py: {exc} (retrying)", err=True)
                    continue
                failure = None
                click.echo(json.dumps(document, separators=(",", ":")))
            if failure is not None:
                raise failure
            return
        from rich.console import Console

        failure = watch(
            Console(markup=False),
            o["url"],
            interval=interval,
            count=count,
            user=o["user"],
            password=o["password"],
        )
        if failure is not None:
            raise failure
    except AdminError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        pass


_accept_json_after_subcommands(admin)

main.add_command(pipeline)


if __name__ == "__main__":
    main()
