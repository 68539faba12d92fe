"""``amps-py admin ...``: inspect and steer a running instance through its HTTP admin
interface. Thin: each subcommand asks the admin API (``amps_py.admin.console``) and
prints its answer as a table, or as JSON with ``--json``. Administrator actions are sent
as POST with the ``X-AMPS-Admin: 1`` header the server requires; an ``https://`` URL is
verified (``--ca-file``)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from amps_py.cli.common import fail

__all__ = ["admin"]


@click.group()
@click.option(
    "--url",
    default=None,
    help="the instance's admin interface, http://HOST:PORT or https://HOST:PORT when "
    "Admin has a Certificate (default: http://127.0.0.1:8085, the embedded default's "
    "Admin/InetAddr; or $AMPS_PY_ADMIN_URL)",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="For an https:// --url: PEM file of the CA that issued the admin interface's "
    "certificate (the certificate itself if self-signed; or $AMPS_PY_ADMIN_CA_FILE); "
    "default: the system's CAs. A certificate that does not verify is refused.",
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
    ctx: click.Context,
    url: str | None,
    ca_file: str | None,
    user: str | None,
    password_env: str,
    as_json: bool,
) -> None:
    """Inspect and steer a running instance through its HTTP admin interface.

    Tables fit the terminal (80 columns when piped; COLUMNS=N sets another width):
    the key columns are always shown whole, the others as room allows.
    """
    import os

    from amps_py.admin.console import DEFAULT_URL

    ctx.obj = {
        "url": url or os.environ.get("AMPS_PY_ADMIN_URL") or DEFAULT_URL,
        "ca_file": ca_file or os.environ.get("AMPS_PY_ADMIN_CA_FILE") or None,
        "user": user,
        "password": os.environ.get(password_env, ""),
        "json": as_json,
    }


def _admin_fetch(ctx: click.Context, path: str, method: str = "GET") -> Any:
    from amps_py.admin.console import AdminError, fetch

    o = ctx.obj
    try:
        return fetch(
            o["url"],
            path,
            method=method,
            user=o["user"],
            password=o["password"],
            ca_file=o["ca_file"],
        )
    except AdminError as exc:
        fail(str(exc), exc.exit_code)


def _json_after_subcommand(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``amps-py admin status --json`` means ``amps-py admin --json status``."""
    if value:
        ctx.ensure_object(dict)["json"] = True


def _setting_after_subcommand(key: str) -> Any:
    """The callback of an option given after the subcommand (``admin status --url U``):
    it sets what the group's option of the same name sets."""

    def store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None:
            ctx.ensure_object(dict)[key] = value

    return store


def _accept_json_after_subcommands(group: click.Group) -> None:
    """Give every subcommand of ``group`` the group's ``--json``, ``--url``,
    ``--ca-file`` and ``--user`` (``admin status --url U`` as ``admin --url U status``;
    given in both places, the one after the subcommand wins)."""
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
        for flag, key, metavar in (
            ("--url", "url", "URL"),
            ("--ca-file", "ca_file", "FILE"),
            ("--user", "user", "NAME"),
        ):
            command.params.append(
                click.Option(
                    [flag],
                    default=None,
                    metavar=metavar,
                    expose_value=False,
                    callback=_setting_after_subcommand(key),
                    help=f"same as `admin {flag} {metavar} ...` (see `amps-py admin --help`)",
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


@admin.command("queues")
@click.pass_context
def admin_queues(ctx: click.Context) -> None:
    """The queues: depth, leased, owned here, backlog, deliveries, acks, expiries,
    seconds behind (how long the oldest message has waited), ownership transfers
    (with --json: /amps/instance/queues, every figure by queue name)."""
    from amps_py.admin.console import queues_table

    _admin_table(ctx, "/amps/instance/queues.json", queues_table)


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
            fail(f"parameter {item!r} is not NAME=VALUE; write e.g. who=operators", 2)
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


@admin.command("queue")
@click.argument("name")
@click.argument(
    "action", type=click.Choice(["enable-proxied-transfer", "disable-proxied-transfer"])
)
@click.pass_context
def admin_queue(ctx: click.Context, name: str, action: str) -> None:
    """Enable or disable proxied transfer on queue NAME: while enabled, this instance
    takes over the messages of an owner it cannot reach through replication (a message
    that owner delivered before it went may be delivered again)."""
    from urllib.parse import quote

    path = f"/amps/administrator/queues/{quote(name, safe='')}/{action.replace('-', '_')}"
    _admin_action(ctx, path, "queue")


@admin.command("clients")
@click.pass_context
def admin_clients(ctx: click.Context) -> None:
    """The connected clients (user, address, subscriptions, messages, queued output,
    offline and spilled bytes), then the last disconnects and why (with --json:
    /amps/instance/clients; the disconnects are /amps/instance/disconnects)."""
    from amps_py.admin.console import print_clients

    clients = _admin_fetch(ctx, "/amps/instance/clients.json")
    if ctx.obj["json"]:
        _admin_print(ctx, clients, print_clients)
        return
    recent = _admin_fetch(ctx, "/amps/instance/disconnects.json").get("recent", [])
    _admin_print(ctx, clients, lambda console, doc: print_clients(console, doc, recent))


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
                        o["url"],
                        "/amps/instance.json",
                        user=o["user"],
                        password=o["password"],
                        ca_file=o["ca_file"],
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
            ca_file=o["ca_file"],
        )
        if failure is not None:
            raise failure
    except AdminError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        pass


_accept_json_after_subcommands(admin)
