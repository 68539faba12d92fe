"""``amps-py subscribe``: print a topic's messages as JSON lines; on one server with
the plain client (a replay-complete line after a bookmark replay, ``--ack`` on a
queue), or with a URI list or ``--store`` on the HA client
(:mod:`amps_py.cli.ha_subscribe`)."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click
import trio

from amps_py.cli.common import fail
from amps_py.cli.connect import (
    URI_HELP,
    CommandFailed,
    ca_file_option,
    client_errors,
    client_name_for,
    credentials_for,
    password_env_option,
    uri_list,
    user_option,
)
from amps_py.cli.printing import RateLine, message_line

if TYPE_CHECKING:
    from amps_py.cli.client import Credentials


@click.command(epilog=URI_HELP)
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
@ca_file_option
@user_option
@password_env_option
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
    _refuse_flag_mix(uri, bookmark, resume, store, ack, max_backlog)
    if store is not None or "," in uri:
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
    credentials = credentials_for(uri, user, password_env)
    client_name = client_name_for(name, "subscribe")
    request = _Request(topic, filter_, bookmark, options, count, timeout, raw, ack, max_backlog)

    async def run() -> None:
        await _print_from_one_server(uri, client_name, request, ca_file, ack_batch, credentials)

    with (
        client_errors(credentials, client_name, password_env, topic),
        contextlib.suppress(KeyboardInterrupt),
    ):
        trio.run(run)


def _refuse_flag_mix(
    uri: str,
    bookmark: str | None,
    resume: bool,
    store: str | None,
    ack: bool,
    max_backlog: int | None,
) -> None:
    """Exit with status 1 (and what to give instead) for flags that do not go
    together."""
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


@dataclass(frozen=True)
class _Request:
    """What a one-server ``subscribe`` subscribes to and how long it prints."""

    topic: str
    filter_: str | None
    bookmark: str | None
    options: str | None
    count: int
    timeout: float
    raw: bool
    ack: bool
    max_backlog: int | None


async def _print_from_one_server(
    uri: str,
    client_name: str,
    request: _Request,
    ca_file: str | None,
    ack_batch: int,
    credentials: Credentials,
) -> None:
    """Subscribe on the instance at ``uri`` (the plain client) and print what comes
    until ``request`` says to stop; a queue's acknowledgements are confirmed before it
    returns."""
    from amps_py.cli.progress import stderr_is_terminal
    from amps_py.client import open_client, parse_uri
    from amps_py.trio_util import unwrapping_groups

    out = sys.stdout
    rate = RateLine(out, stderr_is_terminal())
    async with (
        open_client(
            uri,
            client_name,
            ca_file=ca_file,
            ack_batch_size=ack_batch,
            **credentials.logon_fields(),
        ) as client,
        client.subscribe(
            request.topic,
            filter=request.filter_,
            bookmark=request.bookmark,
            options=request.options,
            max_backlog=request.max_backlog,
        ) as sub,
        unwrapping_groups(),
        trio.open_nursery() as nursery,
    ):
        if request.ack and sub.max_backlog is None:
            raise CommandFailed(
                f"--ack acknowledges queue messages, and {request.topic!r} is not a queue on "
                "this instance (its subscribe ack reported no max_backlog); drop --ack, "
                "or give the queue's name"
            )
        printer = _Printer(out, client, sub, request, parse_uri(uri).message_type, rate)
        if not printer.announced:
            nursery.start_soon(printer.announce_when_complete)
        await printer.print_all()
        nursery.cancel_scope.cancel()


class _Printer:
    """The one-server subscribe loop: prints each message, acknowledges it on a queue
    (``--ack``), says once when a bookmark replay is complete, and stops as the
    request says (``--count``, ``--timeout``, the subscription's end)."""

    def __init__(
        self,
        out: TextIO,
        client: Any,
        sub: Any,
        request: _Request,
        message_type: str,
        rate: RateLine,
    ) -> None:
        self.out = out
        self.client = client
        self.sub = sub
        self.request = request
        self.message_type = message_type
        self.rate = rate
        self.printed = 0
        self.acked = 0
        self.announced = request.bookmark is None

    def announce_replay_end(self) -> None:
        """Say on stderr (once) that the replay is complete, when every replayed
        message is printed."""
        sub = self.sub
        if self.announced or sub.replayed is None or self.printed < sub.replayed:
            return
        self.announced = True
        self.out.flush()
        after = "" if (self.request.bookmark or "")[:1] in "[(" else "; live messages follow"
        click.echo(
            f"amps-py: replay complete ({sub.replayed} message(s) replayed){after}",
            err=True,
        )

    async def announce_when_complete(self) -> None:
        await self.sub.completed.wait()
        self.announce_replay_end()

    async def print_all(self) -> None:
        """Print until the request says stop; then confirm the acknowledgements."""
        count = self.request.count
        while not count or self.printed < count:
            msg = await self._next_message()
            if msg is None:
                break
            self.printed += 1
            self.out.write(message_line(msg, self.request.raw, self.message_type))
            if self.request.ack:
                self.out.flush()  # printed before it leaves the queue
                await msg.ack()
                self.acked += 1
            self.announce_replay_end()
            self.rate.tick(self.printed)
        self.out.flush()
        if self.request.ack:
            await self.client.flush_acks()
            click.echo(
                f"amps-py: acknowledged {self.acked} message(s) on {self.request.topic}",
                err=True,
            )

    async def _next_message(self) -> Any | None:
        """The next message; None: stop (--timeout passed without --count, or the
        subscription ended as asked). Raises when it ended otherwise."""
        from amps_py.client import AMPSError

        sub, n, count, timeout = self.sub, self.printed, self.request.count, self.request.timeout
        try:
            return await sub.get(timeout) if timeout else await sub.__anext__()
        except TimeoutError:
            self.out.flush()
            if count:
                raise CommandFailed(
                    f"only {n} of {count} message(s) arrived: none came for {timeout:g} s"
                ) from None
            click.echo(
                f"amps-py: no message for {timeout:g} s; stopping after {n} message(s)",
                err=True,
            )
            return None
        except StopAsyncIteration:
            self.out.flush()
            if sub.failure:
                raise AMPSError(f"subscription ended: {sub.failure.get('reason')}") from None
            if self.client.closed is not None:
                raise AMPSError(
                    f"subscription ended after {n} message(s): {self.client.closed}"
                ) from None
            return None


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
    (:func:`amps_py.cli.ha_subscribe.subscribe`)."""
    from amps_py.cli import ha_subscribe

    uris, credentials = uri_list(uri, user, password_env)
    client_name = client_name_for(name, "subscribe")

    async def run() -> int:
        return await ha_subscribe.subscribe(
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
        client_errors(credentials, client_name, password_env, topic),
        contextlib.suppress(KeyboardInterrupt),
    ):
        trio.run(run)
