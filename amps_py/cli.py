"""The ``amps-py`` command. Thin: every subcommand calls a library API.

amps-py serve [CONFIG | --config FILE] run an instance (embedded default without one;
                                       --allow-empty-journal: see docs/GUARANTEES.md)
amps-py config check FILE              validate a config without starting
amps-py config show-default            print the embedded default config
amps-py config examples [NAME]         list the shipped example configs, or write one out
amps-py config fabric DIR_OR_FILES...  check a whole replication fabric's routing
amps-py txlog info|dump|verify PATH    inspect a journal directory
amps-py txlog compress|archive|remove PATH ID   maintain a stopped instance's journals
amps-py publish URI TOPIC [DATA]       publish and wait for the persisted ack
amps-py subscribe URI TOPIC            print messages as JSON lines
amps-py sow [URI] TOPIC                print a SOW topic's records, one per line
amps-py users add|remove|list FILE ...  maintain an amps-password-file password file
amps-py pipeline stats JOURNAL...      topic and publisher statistics (Spark)
amps-py pipeline export JOURNAL OUT    journal records to Parquet, incrementally

URIs are tcp://host:port/amps/json, or tcps://... for a TLS transport (--ca-file names
the CA to trust when the server's certificate is not signed by a system CA). publish
and subscribe also take a comma-separated list of equivalent URIs (failover across it)
and --store DIR (durable: publish resumes after a crash, subscribe --resume continues
where the last run stopped); both run on the HA client then (``cli_ha``). Client
credentials: --user NAME and the password in $AMPS_PY_PASSWORD, or
tcp://user:password@host:port/amps/json. Long work shows progress on stderr when it is
a terminal, and nothing extra when piped.

Each command group lives in its own module, registered on :func:`main` here:
``cli_config``, ``cli_txlog``, ``cli_users``, ``cli_names``, ``cli_admin``, ``cli_pipeline``
(``cli_client`` holds what publish, subscribe and sow need; ``cli_common`` what all
share).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import trio
import trio.lowlevel

from amps_py import __version__
from amps_py.cli_admin import admin
from amps_py.cli_common import Pacer, fail
from amps_py.cli_config import config
from amps_py.cli_names import names
from amps_py.cli_pipeline import pipeline
from amps_py.cli_txlog import txlog
from amps_py.cli_users import users
from amps_py.redact import redact_uris

if TYPE_CHECKING:
    from amps_py.cli_client import Credentials


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

    Example configs ship with amps-py: `amps-py config examples` lists them and
    `amps-py config examples NAME --to DIR` writes one out to serve.
    """
    config_path = _one_config(config_file, config_path)
    if config_path and (port is not None or admin_port is not None):
        flag = "--port" if port is not None else "--admin-port"
        fail(
            f"{flag} applies to the embedded default only; with {config_path}, set the "
            "port in its Transport's (or Admin's) InetAddr",
            2,
        )
    from amps_py.cli_config import missing_example_hint
    from amps_py.config import ConfigError, default_config, load_config
    from amps_py.logs import configure_logging
    from amps_py.server import serve_instance

    hint = missing_example_hint(config_path) if config_path else None
    if hint is not None:
        fail(hint, 2)
    try:
        if config_path:
            config = load_config(config_path)
        else:
            config = _with_ports(default_config(Path(data_dir)), port, admin_port)
    except ConfigError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot read config {config_path}: {exc.strerror or exc}", 2)
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
            async with trio.open_nursery() as inner:
                await inner.start(
                    partial(
                        serve_instance,
                        config,
                        ready_file=ready_file,
                        stats_file=stats_file,
                        allow_empty_journal=allow_empty_journal,
                    )
                )
                # what start-up built (a deep queue loaded from its checkpoint, the
                # config) lives as long as the instance: no collection rescans it
                gc.freeze()
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
        fail(message, 1)


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
        fail(
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
    "URI is tcp://HOST:PORT/amps/json, or tcps://... for a TLS transport; publish and "
    "subscribe also take a comma-separated list of equivalent URIs "
    "(tcp://h1:9107/amps/json,tcp://h2:9207/amps/json): they connect to the first that "
    "answers and fail over to the next when it is lost. Credentials: "
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
        fail(str(exc))


def _uri_list(uri: str, user: str | None, password_env: str) -> tuple[list[str], Credentials]:
    """The URIs of URI (a comma-separated list, or one) and the credentials, which
    every URI must agree on (the HA client logs on with the same ones everywhere)."""
    from amps_py.cli_ha import split_uris
    from amps_py.client import BadURI

    try:
        uris = split_uris(uri)
    except BadURI as exc:
        fail(str(exc))
    found = [_credentials(u, user, password_env) for u in uris]
    for u, other in zip(uris[1:], found[1:], strict=True):
        if (other.user, other.password) != (found[0].user, found[0].password):
            fail(
                f"{redact_uris(uris[0])} and {redact_uris(u)} log on with different "
                "credentials; the client logs on to every server of the list with the same "
                "ones: give the user with --user (the password in the environment variable) "
                "and none in the URIs"
            )
    return uris, found[0]


class _Failed(Exception):
    """A client command failed; the text is the whole line for the user."""


@contextlib.contextmanager
def _client_errors(
    credentials: Credentials, client_name: str, password_env: str, topic: str
) -> Iterator[None]:
    """Turn what a client command meets into one line and exit status 1."""
    from amps_py.cli_client import explain_refusal
    from amps_py.cli_ha import StoreMisuse
    from amps_py.client import AMPSError, BadURI, CommandError

    try:
        yield
    except CommandError as exc:
        fail(explain_refusal(exc, credentials, client_name, password_env, topic))
    except (_Failed, AMPSError, BadURI, OSError, TimeoutError, StoreMisuse) as exc:
        fail(str(exc))


async def _delimited(lines: Any, delimiter: bytes, file_: Any) -> Any:
    """``lines(file_)`` with ``delimiter`` written as SOH, the FIX field separator."""
    async for line, done in lines(file_):
        yield line.replace(delimiter, b"\x01"), done


async def _lines(file_: Any, check_json: bool = False) -> Any:
    """The non-blank lines of ``file_`` (binary) without their line ends, with the
    bytes read so far: ``(line, bytes_read)``. A regular file is read directly; a pipe
    or terminal in a worker thread, so waiting for input does not stall the client.

    With ``check_json``, a line that is not a JSON object raises :class:`_Failed`
    (saying which line, and how many were yielded before it) instead of being yielded.
    """
    regular = _file_size(file_) is not None
    read = 0
    number = yielded = 0
    pending = b""

    def checked(line: bytes) -> bytes:
        nonlocal yielded
        if check_json:
            _check_line(file_, number, line, yielded)
        yielded += 1
        return line

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
            number += 1
            line = line.rstrip(b"\r")
            if line.strip():
                yield checked(line), read - len(pending)
        await trio.lowlevel.checkpoint()
    if pending.strip():
        number += 1
        yield checked(pending.rstrip(b"\r")), read


def _check_line(file_: Any, number: int, line: bytes, sent: int) -> None:
    """Raise :class:`_Failed` when line ``number`` of ``file_`` is not a JSON object."""
    from amps_py.cli_client import json_problem, json_refusal

    problem = json_problem(line)
    if problem is not None:
        raise _Failed(json_refusal(problem, f"{_file_label(file_)} line {number}", sent))


def _file_label(file_: Any) -> str:
    name = str(getattr(file_, "name", "") or "-")
    return "standard input" if name in ("-", "<stdin>") else name


def _uri_message_type(uri: str) -> str:
    """The message type the (first) URI of ``uri`` names (``/amps/fix`` -> ``fix``);
    ``json`` for a URI that does not parse (connecting reports it)."""
    from amps_py.cli_ha import split_uris
    from amps_py.client import BadURI, parse_uri

    try:
        return str(parse_uri(split_uris(uri)[0]).message_type)
    except (BadURI, IndexError):
        return "json"


def _json_transport(uri: str) -> bool:
    """Whether the transport of ``uri`` (any of a list) carries json messages (its path
    /amps/json says so); False for a URI that does not parse (reported later)."""
    from amps_py.cli_ha import split_uris
    from amps_py.client import BadURI, parse_uri

    try:
        return any(parse_uri(u).message_type == "json" for u in split_uris(uri))
    except BadURI:
        return False


def _check_payloads(data: str | None, file_: Any) -> bool:
    """Refuse DATA, or a regular --file with a line, that is not a JSON object (exit
    status 1, nothing sent). Returns whether the lines must still be checked as they
    are read (a pipe, which cannot be read ahead)."""
    from amps_py.cli_client import json_problem, json_refusal

    if data is not None:
        problem = json_problem(data.encode())
        if problem is not None:
            fail(json_refusal(problem, "DATA"))
        return False
    if _file_size(file_) is None:
        return True
    start = file_.tell()
    for number, raw_line in enumerate(file_, start=1):
        line = raw_line.rstrip(b"\n").rstrip(b"\r")
        if line.strip():
            problem = json_problem(line)
            if problem is not None:
                fail(json_refusal(problem, f"{_file_label(file_)} line {number}"))
    file_.seek(start)
    return False


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
@click.option(
    "--name",
    default=None,
    help="Client name (identifies the publisher); required with --store.",
)
@click.option(
    "--store",
    "store",
    type=click.Path(file_okay=False),
    default=None,
    help="Durable publishing: keep each publish in DIR/publish until it is persisted, "
    "and resume --file after a crash (see above).",
    metavar="DIR",
)
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
    "--raw",
    is_flag=True,
    help="Send DATA or the lines as they are. Without it, on a json transport "
    "(/amps/json), a payload that is not a JSON object is refused: content filters "
    "would skip it.",
)
@click.option(
    "--admin-url",
    default=None,
    help="The instance's admin API (its Admin/InetAddr), asked which replication "
    "destinations it waits for when the persisted ack does not come (default: "
    "$AMPS_PY_ADMIN_URL, else port 8085 on the URI's host when that is this instance's); "
    "an https:// one is verified with --ca-file.",
)
@click.option(
    "--delimiter",
    default=None,
    metavar="CHAR",
    help="FIX and NVFIX: the character DATA and the lines use between fields (e.g. "
    "'|'); it is sent as the field separator, SOH (as AMPS's spark -delimiter).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="N",
    help="Publish the lines of --file at most N per second (e.g. to replay a capture at "
    "its pace); default: as fast as the server takes them.",
)
def publish(
    uri: str,
    topic: str,
    data: str | None,
    file_: Any,
    name: str | None,
    store: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    raw: bool,
    admin_url: str | None,
    delimiter: str | None,
    rate: float | None,
) -> None:
    """Publish DATA (or each line of --file) to TOPIC and wait until it is persisted.

    On a json transport (URI path /amps/json) each payload must be a JSON object:
    otherwise nothing is sent and a line says what is wrong (and which line of FILE);
    --raw sends it anyway. From a pipe (--file -) the lines are checked as they come:
    the ones before a bad line are published.

    On success prints `published N message(s) to TOPIC; persisted through seq S` on
    stderr, exit status 0 (`received through seq S (topic ... is not journaled ...)`
    when the instance does not journal TOPIC: nothing was stored). Otherwise one line
    says what failed, exit status 1; when the persisted ack does not come within
    --timeout, it names the sync replication destinations the instance waits for (from
    its admin API: --admin-url).

    URI may be a comma-separated list of equivalent URIs: the publisher fails over
    across it (and reconnects), republishing what was not yet acknowledged, in order,
    before anything new. Lines on stderr say when it lost a server and where it went.

    With --store DIR the publishes are kept in DIR/publish until the server has
    persisted them and are sent again after a reconnect, a failover or a restart of
    this command (--name is required: the server knows a publisher by its name; DIR
    stays tied to it). To resume --file F after a crash, rerun the same command (same
    F, DIR and --name). The rule: the N-th non-blank line of F is sequence number
    BASE+N, BASE being the store's last sequence number when the run of F started
    (kept in DIR/publish-file.json until every line is persisted); a rerun skips the
    lines the store already holds (the persisted ones are not sent again, the others
    are republished from the store, in order) and publishes the lines after them. Do
    not edit F in between (appending lines is fine). With --file - (standard input)
    nothing is skipped: a rerun publishes everything it reads.
    """
    import os

    from amps_py.cli_client import admin_url_for, explain_persisted_wait, fetch_instance, progress
    from amps_py.client import CommandError, open_client

    if data is None and file_ is None:
        if topic.lstrip().startswith(("{", "[", '"')):
            from amps_py.redact import redact_uris

            fail(
                f"{topic!r} looks like a message, not a topic: the topic is missing. "
                "Give both: amps-py publish URI TOPIC DATA, e.g. amps-py publish "
                f"{redact_uris(uri)} orders '{topic}'"
            )
        fail("give DATA or --file FILE")
    if store is not None and not name:
        fail(
            "--store needs --name NAME: the server knows a publisher's sequence numbers "
            "by its client name, so a rerun that resumes from the store must use the same "
            "one (e.g. --name orders-feed)"
        )
    check_lines = not raw and _json_transport(uri) and _check_payloads(data, file_)
    lines = partial(_lines, check_json=check_lines)
    if delimiter is not None:
        if len(delimiter) != 1 or delimiter == "\x01":
            fail(f"--delimiter takes one character other than SOH, e.g. '|'; got {delimiter!r}")
        if data is not None:
            data = data.replace(delimiter, "\x01")
        lines = partial(_delimited, lines, delimiter.encode())
    if store is not None or "," in uri:
        _publish_ha(
            uri,
            topic,
            data,
            file_,
            lines,
            name,
            store,
            timeout,
            ca_file,
            user,
            password_env,
            admin_url,
            rate,
        )
        return
    credentials = _credentials(uri, user, password_env)
    client_name = _client_name(name, "publish")

    async def run() -> tuple[int, int, bool]:
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
                    pacer = Pacer(rate)
                    async for line, done in lines(file_):
                        await pacer.wait()
                        last = await client.publish(topic, line)
                        n += 1
                        if n % 512 == 0:
                            show(done)
                    show()
                bar.update(what=f"waiting for the persisted ack of seq {last}")
                try:
                    await client.wait_persisted(last, timeout=timeout)
                except CommandError:
                    if n == 1:
                        raise  # the one message: its own failure says it all
                except TimeoutError as exc:
                    url, named = admin_url_for(uri, admin_url, os.environ)
                    document = await trio.to_thread.run_sync(
                        fetch_instance, url, credentials, ca_file
                    )
                    raise _Failed(
                        explain_persisted_wait(str(exc), url, document, client_name, named)
                    ) from None
            refused = refused_line(client.failed_publishes, first, last, n, topic)
            if refused is not None:
                raise _Failed(refused)
            return n, last, last > 0 and client.not_journaled_seq == last

    with _client_errors(credentials, client_name, password_env, topic):
        n, last, not_journaled = trio.run(run)
    click.echo(published_line(n, topic, last, not_journaled), err=True)


#: refused messages a ``publish --file`` names one by one (the rest are counted)
REFUSALS_SHOWN = 5


def refused_line(
    failed: Mapping[int, Mapping[str, Any]], first: int, last: int, sent: int, topic: str
) -> str | None:
    """What ``publish`` says when the server refused some of the messages it sent
    (seqs ``first + 1`` to ``last``, the k-th message being seq ``first + k``), or None
    when it refused none. A refused message is not stored; the others are."""
    refused = sorted(seq for seq in failed if first < seq <= last)
    if not refused:
        return None
    shown = []
    for seq in refused[:REFUSALS_SHOWN]:
        ack = failed[seq]
        reason = str(ack.get("reason", "unknown"))
        detail = str(ack.get("detail", ""))
        why = f"{reason} ({detail})" if detail and detail != reason else reason
        shown.append(f"message {seq - first} (seq {seq}): {why}")
    more = len(refused) - len(shown)
    listed = "; ".join(shown) + (f"; and {more} more" if more else "")
    return (
        f"the server refused {len(refused)} of the {sent} message(s) published to {topic}: "
        f"{listed}. Those are not stored; every other one is persisted. "
        "Fix the refused messages and publish them again (message N is the N-th message "
        "sent by this run: the N-th non-blank line of the file)"
    )


def published_line(n: int, topic: str, last: int, not_journaled: bool) -> str:
    """What ``publish`` prints on success: persisted through the last seq, or (the
    instance said so in its persisted ack) received but not stored."""
    if not_journaled:
        return (
            f"published {n} message(s) to {topic}; received through seq {last} (topic "
            f"{topic!r} is not journaled on this instance: not stored, not replayable)"
        )
    return f"published {n} message(s) to {topic}; persisted through seq {last}"


def _publish_ha(
    uri: str,
    topic: str,
    data: str | None,
    file_: Any,
    lines: Any,
    name: str | None,
    store: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    admin_url: str | None,
    rate: float | None,
) -> None:
    """``publish`` with a URI list or --store: on the HA client (``cli_ha.publish``)."""
    import os

    from amps_py import cli_ha
    from amps_py.cli_client import admin_url_for, explain_persisted_wait, fetch_instance

    uris, credentials = _uri_list(uri, user, password_env)
    client_name = _client_name(name, "publish")
    fields: dict[str, Any] = {"ca_file": ca_file, **credentials.logon_fields()}

    async def explain_timeout(message: str, current: str) -> None:
        url, named = admin_url_for(current, admin_url, os.environ)
        document = await trio.to_thread.run_sync(fetch_instance, url, credentials, ca_file)
        raise _Failed(explain_persisted_wait(message, url, document, client_name, named))

    async def run() -> cli_ha.Published:
        return await cli_ha.publish(
            uris,
            topic,
            data,
            file_,
            lines,
            name=client_name,
            store_dir=Path(store) if store is not None else None,
            timeout=timeout,
            logon_fields=fields,
            explain_timeout=explain_timeout,
            rate=rate,
        )

    with _client_errors(credentials, client_name, password_env, topic):
        done = trio.run(run)
    refused = refused_line(done.refused, done.first, done.last, done.sent, topic)
    if refused is not None:
        fail(refused)
    click.echo(published_line(done.sent, topic, done.last, done.not_journaled), err=True)


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
@click.option(
    "--ack/--no-ack",
    default=False,
    show_default=True,
    help="On a queue: acknowledge each message once it is printed (it leaves the queue). "
    "Without it, messages are only printed: the queue delivers them again once their "
    "lease expires or this command exits.",
)
@click.option(
    "--ack-batch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ack: acknowledgements sent together in one command (a partial batch "
    "goes after 1 s, and at exit).",
)
@click.option(
    "--max-backlog",
    type=click.IntRange(min=1),
    default=None,
    help="On a queue: messages leased to this subscriber at a time, unacknowledged "
    "(the server's default is 1; the queue's MaxPerSubscriptionBacklog caps it).",
)
@click.option("--name", default=None, help="Client name.")
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Durable subscribing: keep in DIR/bookmarks which messages were printed, so "
    "that --resume continues after them (needs --resume or --bookmark).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="With --store: continue where the last run stopped (the first time: from the "
    "start of the journal, EPOCH).",
)
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
    ack: bool,
    ack_batch: int,
    max_backlog: int | None,
    name: str | None,
    store: str | None,
    resume: bool,
    ca_file: str | None,
    user: str | None,
    password_env: str,
) -> None:
    """Print messages on TOPIC as one JSON object per line: {topic, bookmark, data}.

    Stops after --count messages, after --timeout seconds without a message, or at
    Ctrl-C. Exit status 0, or 1 with a line on stderr when the subscription was refused
    or ended (connection lost), or when --timeout came before --count messages. When
    stderr is a terminal, a progress line (messages, rate) goes there every few
    seconds on long runs. A message's bookmark is printed when it has one (replayed
    messages, or with --options bookmark).

    On a queue (TOPIC is a queue's name), --ack acknowledges each message after it is
    printed (written and flushed), so it leaves the queue; at exit every acknowledgement
    is sent and confirmed by the server, and a line on stderr says how many. A message
    printed but not acknowledged (no --ack, or Ctrl-C before its acknowledgement was
    sent) is delivered again later.

    URI may be a comma-separated list of equivalent URIs: the subscriber fails over
    across it (and reconnects) and subscribes again; a bookmark subscription then
    resumes after the last message printed, and a message that may have been printed
    before carries "possible_duplicate": true. --store DIR keeps that position in
    DIR/bookmarks across runs, one per TOPIC and --filter: `--store DIR --resume`
    continues where the last run with DIR stopped (the first time from EPOCH);
    `--store DIR --bookmark B` starts a new position at B (refused when DIR holds one:
    resume it, or use another DIR). A message counts as done once its line is printed
    and flushed. With a URI list or --store, the replay-complete line is not printed.
    On a queue with a URI list, --ack goes on after a failover: what was printed and
    not acknowledged when a server was lost is delivered again (not with --store).
    """
    if resume and store is None:
        fail(
            "--resume continues from the position kept in a store directory: add --store "
            "DIR (the same DIR every run)"
        )
    if resume and bookmark is not None:
        fail(
            "give --resume (continue where the last run stopped) or --bookmark (start "
            "there), not both"
        )
    if store is not None or "," in uri:
        for flag, given in (("--ack", ack), ("--max-backlog", max_backlog is not None)):
            if given and store is not None:
                fail(
                    f"{flag} is for queues, and --store keeps the position of a bookmark "
                    "subscription; drop --store (a URI list alone fails over across it)"
                )
        _subscribe_ha(
            uri,
            topic,
            filter_,
            bookmark,
            resume,
            options,
            count,
            timeout,
            raw,
            name,
            store,
            ca_file,
            user,
            password_env,
            ack=ack,
            ack_batch=ack_batch,
            max_backlog=max_backlog,
        )
        return
    from amps_py.cli_client import stderr_is_terminal
    from amps_py.cli_ha import message_line
    from amps_py.client import AMPSError, open_client, parse_uri
    from amps_py.trio_util import unwrapping_groups

    out = sys.stdout
    rate_lines = stderr_is_terminal()
    credentials = _credentials(uri, user, password_env)
    client_name = _client_name(name, "subscribe")

    async def run() -> None:
        n = 0
        started = last_report = time.monotonic()
        announced = bookmark is None
        acked = 0
        async with (
            open_client(
                uri,
                client_name,
                ca_file=ca_file,
                ack_batch_size=ack_batch,
                **credentials.logon_fields(),
            ) as client,
            client.subscribe(
                topic,
                filter=filter_,
                bookmark=bookmark,
                options=options,
                max_backlog=max_backlog,
            ) as sub,
            unwrapping_groups(),
            trio.open_nursery() as nursery,
        ):
            if ack and sub.max_backlog is None:
                raise _Failed(
                    f"--ack acknowledges queue messages, and {topic!r} is not a queue on "
                    "this instance (its subscribe ack reported no max_backlog); drop --ack, "
                    "or give the queue's name"
                )

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
                out.write(message_line(msg, raw, parse_uri(uri).message_type))
                if ack:
                    out.flush()  # printed before it leaves the queue
                    await msg.ack()
                    acked += 1
                announce_replay_end()
                now = time.monotonic()
                if rate_lines and now - last_report >= 5:
                    out.flush()
                    click.echo(f"[{n} messages, {n / (now - started):,.0f} msg/s]", err=True)
                    last_report = now
            out.flush()
            if ack:
                await client.flush_acks()
                click.echo(f"amps-py: acknowledged {acked} message(s) on {topic}", err=True)
            nursery.cancel_scope.cancel()

    with (
        _client_errors(credentials, client_name, password_env, topic),
        contextlib.suppress(KeyboardInterrupt),
    ):
        trio.run(run)


def _subscribe_ha(
    uri: str,
    topic: str,
    filter_: str | None,
    bookmark: str | None,
    resume: bool,
    options: str | None,
    count: int,
    timeout: float,
    raw: bool,
    name: str | None,
    store: str | None,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    *,
    ack: bool = False,
    ack_batch: int = 1,
    max_backlog: int | None = None,
) -> None:
    """``subscribe`` with a URI list or --store: on the HA client
    (``cli_ha.subscribe``)."""
    from amps_py import cli_ha

    uris, credentials = _uri_list(uri, user, password_env)
    client_name = _client_name(name, "subscribe")

    async def run() -> int:
        return await cli_ha.subscribe(
            uris,
            topic,
            filter_=filter_,
            bookmark=bookmark,
            resume=resume,
            options=options,
            count=count,
            timeout=timeout,
            raw=raw,
            name=client_name,
            store_dir=Path(store) if store is not None else None,
            logon_fields={"ca_file": ca_file, **credentials.logon_fields()},
            ack=ack,
            ack_batch=ack_batch,
            max_backlog=max_backlog,
        )

    with (
        _client_errors(credentials, client_name, password_env, topic),
        contextlib.suppress(KeyboardInterrupt),
    ):
        trio.run(run)


@main.command(epilog=_URI_HELP)
@click.argument("first", metavar="[URI] TOPIC")
@click.argument("second", required=False, metavar=" ")
@click.option("--filter", "filter_", default=None, help='Content filter, e.g. "/qty > 10".')
@click.option("--top-n", type=click.IntRange(min=0), default=None, help="At most N records.")
@click.option(
    "--orderby", default=None, help='Sort order, e.g. "/qty DESC,/id" (unordered without it).'
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    default=10,
    show_default=True,
    help="Records per result frame from the server.",
)
@click.option(
    "--uri",
    default=None,
    help="The instance to ask (the same as giving URI); default: the embedded default's "
    "tcp://127.0.0.1:9007/amps/json.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print each record as {"key", "bookmark", "data"} instead of its payload.',
)
@click.option("--name", default=None, help="Client name.")
@click.option(
    "--timeout",
    type=float,
    default=60,
    show_default=True,
    help="Seconds allowed to connect, log on and receive the whole result.",
)
@_ca_file_option
@_user_option
@_password_env_option
def sow(
    first: str,
    second: str | None,
    filter_: str | None,
    top_n: int | None,
    orderby: str | None,
    batch_size: int,
    uri: str | None,
    as_json: bool,
    name: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
) -> None:
    """Print the records of the SOW topic TOPIC (State of the World), one per line:
    `amps-py sow tcp://HOST:PORT/amps/json TOPIC` (as publish and subscribe take the
    URI), or `amps-py sow TOPIC --uri URI`, or `amps-py sow TOPIC` for the embedded
    default's instance.

    Each line is a record's payload, or with --json a JSON object {key, bookmark,
    data}. A last line on stderr counts them. Exit status 0, or 1 with a line on
    stderr when the query was refused (e.g. `invalid topic`: TOPIC has no SOW) or
    failed.
    """
    from amps_py.cli_client import DEFAULT_URI, sow_record_line, sow_summary
    from amps_py.client import open_client

    topic = first if second is None else second
    if second is not None:
        if uri is not None and uri != first:
            fail(f"two URIs given: {first} and --uri {uri}; give one", 2)
        uri = first
    target = uri or DEFAULT_URI
    credentials = _credentials(target, user, password_env)
    client_name = _client_name(name, "sow")
    message_type = _uri_message_type(target)
    out = sys.stdout

    async def run() -> tuple[int, dict[str, int]]:
        async with open_client(
            target, client_name, timeout=timeout, ca_file=ca_file, **credentials.logon_fields()
        ) as client:
            records = await client.sow(
                topic,
                filter_,
                top_n=top_n,
                orderby=orderby,
                batch_size=batch_size,
                timeout=timeout,
            )
        for record in records:
            out.write(sow_record_line(record, as_json, message_type) + "\n")
        out.flush()
        return len(records), records.stats

    with _client_errors(credentials, client_name, password_env, topic):
        count, stats = trio.run(run)
    click.echo(sow_summary(topic, count, stats), err=True)


for group in (admin, config, names, pipeline, txlog, users):
    main.add_command(group)


if __name__ == "__main__":
    main()
