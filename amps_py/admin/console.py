"""``amps-py admin``: a console client of the HTTP admin API.

Every command reads or posts one admin path and prints a readable screen (rich), or the
raw JSON with ``--json``. A connection or HTTP error prints one line saying what failed
and how to fix it, and exits with status 2 (connection) or 1 (refused by the server).
``watch`` redraws the status screen in place (:func:`watch`).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from amps_py.config import DEFAULT_ADMIN_ADDRESS

DEFAULT_URL = f"http://{DEFAULT_ADMIN_ADDRESS[0]}:{DEFAULT_ADMIN_ADDRESS[1]}"


class AdminError(Exception):
    """One line for the operator; ``exit_code`` 2 = not reachable, 1 = refused."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


#: seconds to wait for an answer: reads are quick; administrator actions (POST) may
#: take as long as their work (compressing a 1 GB journal, an action's Do modules)
READ_TIMEOUT: Final = 10.0
ACTION_TIMEOUT: Final = 900.0


def fetch(
    url: str, path: str, *, method: str = "GET", user: str | None = None, password: str = ""
) -> Any:
    """The JSON document at ``url + path``."""
    timeout = ACTION_TIMEOUT if method == "POST" else READ_TIMEOUT
    request = urllib.request.Request(url.rstrip("/") + path, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except (ValueError, AttributeError):
            detail = ""
        message = f"{url}{path}: HTTP {exc.code}: {detail or exc.reason}"
        if exc.code == 401:
            message += f"; {_credentials_hint(user, password)}"
        raise AdminError(message, 1) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminError(
            f"cannot reach the admin interface at {url} ({reason}); is the instance running "
            "with an Admin/InetAddr? pass --url http://HOST:PORT",
            2,
        ) from None


def _credentials_hint(user: str | None, password: str) -> str:
    """How to pass admin credentials, after an HTTP 401 (``amps-py admin`` flags)."""
    how = (
        "pass a user with the admin right: amps-py admin --user NAME ..., with the "
        "password in the environment variable AMPS_PY_ADMIN_PASSWORD (--password-env "
        "names another)"
    )
    if user is None:
        return f"the admin API needs credentials (no user was given): {how}"
    sent = "with a password" if password else "with no password"
    return f"user {user!r} {sent} was refused: check the user and password, and {how}"


def _bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def destinations_table(instance: dict[str, Any]) -> Table:
    table = Table(title="replication destinations", expand=False, title_justify="left")
    back_note = False
    for column in (
        "destination",
        "mode",
        "connected",
        "address",
        "sent txid",
        "acked txid",
        "behind (s)",
        "lag (msgs)",
        "downgrades",
    ):
        table.add_column(column, no_wrap=True)
    committed = int(instance.get("transaction_log", {}).get("last_txid", 0))
    for name, d in sorted(instance.get("replication", {}).get("destinations", {}).items()):
        lag = max(committed - int(d["acked_txid"]), 0)
        mode = d["replication_type"]
        if d["configured_sync_type"] != mode:
            mode += f" (configured {d['configured_sync_type']})"
        address = str(d["address"] or "-")
        if "(back over" in address:  # the peer dialled; this link rides its connection
            address = address.partition(" (")[0] + " *"
            back_note = True
        remote = d["remote_name"]
        table.add_row(
            name if remote in (name, "", None) else f"{name} (instance {remote})",
            mode,
            "yes" if d["is_connected"] else "NO",
            address,
            str(d["sent_txid"]),
            str(d["acked_txid"]),
            f"{d['seconds_behind']:.1f}",
            f"{_bar(lag / committed, 10)} {lag}" if lag and committed else "0",
            str(d.get("downgrades", 0)),
        )
    if back_note:
        table.caption = "* back replication over the connection the peer opened"
    return table


def _clients_line(instance: dict[str, Any]) -> str:
    """``clients N``, plus the client with the most output queued when one has any."""
    clients = instance.get("clients", {})
    if not isinstance(clients, dict):  # an instance from before the clients tree
        return f"clients {clients}"
    line = f"clients {instance.get('client_count', len(clients))}"
    backlog = max(clients.items(), key=lambda kv: kv[1]["queued_bytes"], default=None)
    if backlog is not None and backlog[1]["queued_bytes"] > 0:
        line += f" (most queued: {backlog[0]}, {_size(backlog[1]['queued_bytes'])})"
    return line


def status_screen(instance: dict[str, Any]) -> Group:
    """The ``status`` screen of an ``/amps/instance`` document, as one renderable."""
    parts: list[RenderableType] = []

    def line(text: str) -> None:
        parts.append(Text(text))

    journal = instance.get("transaction_log", {})
    parts.append(
        Text.assemble(
            (str(instance["name"]), "bold"),
            f" (group {instance['group']}) amps-py {instance['version']}, "
            f"up {instance['uptime_s']:.0f} s",
        )
    )
    line(
        f"{_clients_line(instance)}, subscriptions {instance['subscriptions']}, "
        f"published {instance['statistics']['published']}, "
        f"delivered {instance['statistics']['delivered']}"
    )
    if journal:
        segments = len(journal.get("journals") or {})
        line(
            f"journal: txids {journal.get('first_txid', 0)}..{journal.get('last_txid', 0)}, "
            f"{journal.get('records', 0)} records in {segments} "
            f"segment{'s' if segments != 1 else ''}, "
            f"{_size(int(journal.get('file_bytes', 0))).replace(' ', chr(0xA0))}, durability "
            f"{journal.get('durability', '?')}"
        )
        line(f"  at {journal.get('path', '?')}")
        maintenance = journal.get("maintenance") or {}
        pending = maintenance.get("pending_removal") or []
        if pending:
            held = "; ".join(map(str, maintenance.get("held_by") or [])) or "in progress"
            line(f"  removal pending for journals {', '.join(map(str, pending))}: {held}")
        if maintenance.get("failures"):
            line(f"  {maintenance['failures']} journal maintenance step(s) failed (log 05-0005)")
    transports = ", ".join(f"{n}:{t['port']}" for n, t in instance.get("transports", {}).items())
    line(f"transports {transports}")
    if instance.get("replication", {}).get("destinations"):
        parts.append(destinations_table(instance))
    upstreams = instance.get("replication", {}).get("upstreams", {})
    if upstreams:
        line(
            "upstreams: "
            + ", ".join(
                f"{n} ({u['address']}, {u['messages_in']} messages in)"
                for n, u in upstreams.items()
            )
        )
    return Group(*parts)


def print_status(console: Console, instance: dict[str, Any]) -> None:
    console.print(status_screen(instance))


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def clients_table(clients: dict[str, Any]) -> Table:
    """``/amps/instance/clients`` as a table; the queued column is the slow-client
    indicator (a bar of the bytes waiting against the slow-client limit)."""
    table = Table(title="clients", expand=False)
    table.add_column("client", no_wrap=True)
    table.add_column("user")
    table.add_column("remote", no_wrap=True)
    for column in ("up", "subs", "in", "out"):
        table.add_column(column, justify="right")
    table.add_column("queued", no_wrap=True)
    table.add_column("state")
    for key, c in clients.items():
        queued, limit = int(c["queued_bytes"]), int(c["queued_limit_bytes"]) or 1
        state = "ok" if c["logged_on"] else "no logon"
        if c.get("closing"):
            state = f"closing: {c['closing']}"
        table.add_row(
            key,
            c["user"] or "-",
            c["remote_address"],
            _duration(float(c["connected_s"])),
            str(c["subscriptions"]),
            str(c["messages_in"]),
            str(c["messages_out"]),
            f"{_bar(queued / limit, 6)} {_size(queued)}",
            state,
        )
    return table


def print_clients(console: Console, clients: dict[str, Any]) -> None:
    if not clients:
        console.print("no clients connected")
        return
    console.print(clients_table(clients))


def watch(
    console: Console,
    url: str,
    *,
    interval: float,
    count: int | None,
    user: str | None = None,
    password: str = "",
) -> AdminError | None:
    """Redraw the ``status`` screen every ``interval`` seconds (``count`` screens, or
    until Ctrl-C, which returns normally).

    Returns the error of the last refresh when it failed (so a ``--count`` run can exit
    non-zero), else None.

    Raises:
        AdminError: the first fetch fails. A later failure (the instance restarting)
            is shown on the screen, and the next refresh tries again.
    """
    path = "/amps/instance.json"
    last_good = status_screen(fetch(url, path, user=user, password=password))
    failure: AdminError | None = None
    shown = 1
    try:
        with Live(last_good, console=console, auto_refresh=False) as live:
            while count is None or shown < count:
                time.sleep(interval)  # the refresh period the operator asked for
                screen: RenderableType
                try:
                    screen = last_good = status_screen(
                        fetch(url, path, user=user, password=password)
                    )
                    failure = None
                except AdminError as exc:
                    failure = exc
                    screen = Group(last_good, Text(f"{exc} (retrying)", style="red"))
                live.update(screen, refresh=True)
                shown += 1
    except KeyboardInterrupt:
        return None
    return failure


def journal_table(journal: dict[str, Any]) -> Table:
    """The transaction log: range, size, durability, and what its commits cost."""
    table = Table(title="transaction log", show_header=False)
    table.add_column("field")
    table.add_column("value")
    writer = journal.get("writer") or {}
    commits = int(writer.get("commits", 0))
    rows = [
        ("path", str(journal.get("path", "?"))),
        ("txids", f"{journal.get('first_txid', 0)}..{journal.get('last_txid', 0)}"),
        ("records", str(journal.get("records", 0))),
        ("file", _size(int(journal.get("file_bytes", 0)))),
        ("durability", str(journal.get("durability", "?"))),
        ("compression", str(journal.get("compression", "?"))),
        ("commits", str(commits)),
    ]
    if commits:
        rows.append(("mean commit", f"{1000 * writer['commit_seconds'] / commits:.2f} ms"))
        rows.append(("mean fsync wait", f"{1000 * writer['sync_seconds'] / commits:.2f} ms"))
        rows.append(("largest batch", str(writer.get("max_batch", 0))))
    for field, value in rows:
        table.add_row(field, value)
    return table


def segments_table(journal: dict[str, Any]) -> Table:
    """The journal segments (AMPS's journal files): state, txids, size, time span."""
    table = Table(title="journals")
    for col in ("id", "state", "txids", "records", "size", "newest record", "file"):
        table.add_column(col, justify="right" if col in ("id", "records", "size") else "left")
    for seg in (journal.get("journals") or {}).values():
        state = str(seg.get("state", "?"))
        if seg.get("is_current"):
            state += " (current)"
        if seg.get("pending_removal"):
            state += ", removal pending"
        table.add_row(
            str(seg.get("id", "?")),
            state,
            f"{seg.get('first_txid', 0)}..{seg.get('last_txid', 0)}",
            str(seg.get("records", 0)),
            _size(int(seg.get("bytes", 0))),
            str(seg.get("max_timestamp", "")).replace("T", " ")[:19],
            str(seg.get("file_name", "")),
        )
    maintenance = journal.get("maintenance") or {}
    held = maintenance.get("held_by") or []
    notes = []
    if maintenance.get("pending_removal") and held:
        notes.append("removal waits for: " + "; ".join(map(str, held)))
    if maintenance.get("failures"):
        notes.append(
            f"{maintenance['failures']} maintenance step(s) failed and were retried (log 05-0005)"
        )
    if notes:
        table.caption = "\n".join(notes)
    return table


def journals_view(journal: dict[str, Any]) -> Group:
    """``amps-py admin journals``: the transaction log summary, then its segments."""
    return Group(journal_table(journal), segments_table(journal))
