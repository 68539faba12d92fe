"""``amps-py publish``: DATA or the lines of a file to a topic, waiting until the
instance has persisted them; on one server with the plain client, or with a URI list or
``--store`` on the HA client (:mod:`amps_py.cli.ha_publish`). On success one line on
stderr says how far it is persisted (:func:`published_line`); messages the server
refused are named (:func:`refused_line`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import trio

from amps_py.cli.common import Pacer, fail
from amps_py.cli.connect import (
    URI_HELP,
    CommandFailed,
    ca_file_option,
    client_errors,
    client_name_for,
    credentials_for,
    json_transport,
    password_env_option,
    uri_list,
    user_option,
)
from amps_py.cli.payloads import check_payloads, delimited, file_lines, file_size

if TYPE_CHECKING:
    from amps_py.cli.ha_publish import Published


@click.command(epilog=URI_HELP)
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
@ca_file_option
@user_option
@password_env_option
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
    _refuse_incomplete(uri, topic, data, file_, store, name)
    data, lines = _payload_source(uri, data, file_, raw, delimiter)
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
    _publish_one_server(
        uri, topic, data, file_, lines, name, timeout, ca_file, user, password_env, admin_url, rate
    )


def _refuse_incomplete(
    uri: str, topic: str, data: str | None, file_: Any, store: str | None, name: str | None
) -> None:
    """Exit with status 1 (and what to give) when there is nothing to publish, or
    --store comes without --name."""
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


def _payload_source(
    uri: str, data: str | None, file_: Any, raw: bool, delimiter: str | None
) -> tuple[str | None, Any]:
    """DATA as it is sent, and the reader of the file's lines (``lines(file_)``): both
    checked to be JSON objects on a json transport unless ``raw`` (DATA and a regular
    file before anything is sent; exit status 1 for a bad one), with ``delimiter``
    written as SOH."""
    check_lines = not raw and json_transport(uri) and check_payloads(data, file_)
    lines: Any = partial(file_lines, check_json=check_lines)
    if delimiter is not None:
        if len(delimiter) != 1 or delimiter == "\x01":
            fail(f"--delimiter takes one character other than SOH, e.g. '|'; got {delimiter!r}")
        if data is not None:
            data = data.replace(delimiter, "\x01")
        lines = partial(delimited, lines, delimiter.encode())
    return data, lines


def _publish_one_server(
    uri: str,
    topic: str,
    data: str | None,
    file_: Any,
    lines: Any,
    name: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    admin_url: str | None,
    rate: float | None,
) -> None:
    """``publish`` to the one instance at ``uri``, on the plain client."""
    from amps_py.cli.progress import progress
    from amps_py.client import CommandError, open_client

    credentials = credentials_for(uri, user, password_env)
    client_name = client_name_for(name, "publish")

    async def run() -> tuple[int, int, bool]:
        async with open_client(
            uri, client_name, timeout=timeout, ca_file=ca_file, **credentials.logon_fields()
        ) as client:
            first = client.seq
            n = last = 0
            size = file_size(file_) if file_ is not None else None
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
                    await _explain_persisted_wait(
                        str(exc), uri, admin_url, credentials, ca_file, client_name
                    )
            refused = refused_line(client.failed_publishes, first, last, n, topic)
            if refused is not None:
                raise CommandFailed(refused)
            return n, last, last > 0 and client.not_journaled_seq == last

    with client_errors(credentials, client_name, password_env, topic):
        n, last, not_journaled = trio.run(run)
    click.echo(published_line(n, topic, last, not_journaled), err=True)


async def _explain_persisted_wait(
    message: str,
    uri: str,
    admin_url: str | None,
    credentials: Any,
    ca_file: str | None,
    client_name: str,
) -> None:
    """Raise the user's error for a persisted ack that did not come (``message``): the
    instance at ``uri`` is asked, through its admin API, which sync destinations it
    waits for (both publish paths)."""
    from amps_py.cli.client import admin_url_for, explain_persisted_wait, fetch_instance

    url, named = admin_url_for(uri, admin_url, os.environ)
    document = await trio.to_thread.run_sync(fetch_instance, url, credentials, ca_file)
    explained = explain_persisted_wait(message, url, document, client_name, named)
    raise CommandFailed(explained) from None


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
    """``publish`` with a URI list or --store: on the HA client
    (:func:`amps_py.cli.ha_publish.publish`)."""
    from amps_py.cli import ha_publish

    uris, credentials = uri_list(uri, user, password_env)
    client_name = client_name_for(name, "publish")
    fields: dict[str, Any] = {"ca_file": ca_file, **credentials.logon_fields()}

    async def explain_timeout(message: str, current: str) -> None:
        await _explain_persisted_wait(
            message, current, admin_url, credentials, ca_file, client_name
        )

    async def run() -> Published:
        return await ha_publish.publish(
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

    with client_errors(credentials, client_name, password_env, topic):
        done = trio.run(run)
    refused = refused_line(done.refused, done.first, done.last, done.sent, topic)
    if refused is not None:
        fail(refused)
    click.echo(published_line(done.sent, topic, done.last, done.not_journaled), err=True)
