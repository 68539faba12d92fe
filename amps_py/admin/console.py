"""``amps-py admin``: a console client of the HTTP admin API.

Every command reads or posts one admin path and prints a readable screen (rich), or the
raw JSON with ``--json``. A connection or HTTP error prints one line saying what failed
and how to fix it, and exits with status 2 (connection) or 1 (refused by the server).
``watch`` redraws the status screen in place (:func:`watch`).
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Final

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from amps_py.config import DEFAULT_ADMIN_ADDRESS

from .guard import ADMIN_HEADER
from .tables import Column, fit_table

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
    url: str,
    path: str,
    *,
    method: str = "GET",
    user: str | None = None,
    password: str = "",
    ca_file: str | None = None,
) -> Any:
    """The JSON document at ``url + path``.

    A POST (an administrator action) carries the ``X-AMPS-Admin: 1`` header the server
    requires of state changes. An ``https://`` URL is verified against ``ca_file`` (a
    PEM file of CA certificates, or the server's self-signed certificate), else the
    system's CAs; a certificate that does not verify is refused.
    """
    timeout = ACTION_TIMEOUT if method == "POST" else READ_TIMEOUT
    request = urllib.request.Request(url.rstrip("/") + path, method=method)
    if method == "POST":
        request.add_header(ADMIN_HEADER, "1")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = _tls_context(ca_file) if url.lower().startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
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
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _unreachable(url, getattr(exc, "reason", exc)) from None


def _unreachable(url: str, reason: object) -> AdminError:
    """The error for an admin interface that did not answer with HTTP: a certificate
    that does not verify, TLS to a plain port or plain HTTP to a TLS port, or nothing
    listening."""
    if isinstance(reason, ssl.SSLCertVerificationError):
        return AdminError(
            f"the admin interface at {url} presented a certificate that does not verify "
            f"({reason.verify_message}); pass --ca-file with the PEM file of the CA that "
            "issued it (or the certificate itself if it is self-signed)",
            2,
        )
    if isinstance(reason, ssl.SSLError):
        return AdminError(
            f"TLS with the admin interface at {url} failed ({reason}); if it serves plain "
            "HTTP (no Admin Certificate), use an http:// URL",
            2,
        )
    if isinstance(reason, ConnectionResetError | http.client.HTTPException):
        # RemoteDisconnected is both: the server closed the connection without an answer
        return AdminError(
            f"the admin interface at {url} closed the connection without an HTTP answer "
            f"({type(reason).__name__}: {reason}); if it is served over HTTPS (Admin "
            "Certificate), use an https:// URL with --ca-file",
            2,
        )
    return AdminError(
        f"cannot reach the admin interface at {url} ({reason}); is the instance running, "
        "and is that its Admin/InetAddr? The URL is http://HOST:PORT of the config's "
        "Admin/InetAddr (https:// when it serves HTTPS), given with --url",
        2,
    )


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and host name
    against ``ca_file`` (PEM), or the system's CAs."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except FileNotFoundError:
        raise AdminError(
            f"CA file {ca_file!r} does not exist; give the PEM file of the CA that issued "
            "the admin interface's certificate (or that certificate if it is self-signed)",
            2,
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise AdminError(
            f"CA file {ca_file!r} holds no PEM certificate ({exc}); give a PEM file "
            "starting with -----BEGIN CERTIFICATE-----",
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


DESTINATION_COLUMNS: Final = (
    Column("destination"),
    Column("mode"),
    Column("connected"),
    Column("address", drop=3),
    Column("sent txid", "right"),
    Column("acked txid", "right"),
    Column("behind (s)", "right", drop=2),
    Column("lag (msgs)", "right"),
    Column("downgrades", "right", drop=4),
)


def destinations_table(replication: Mapping[str, Any], width: int | None = None) -> RenderableType:
    """The destinations of an ``/amps/instance/replication`` document as a table that
    fits ``width`` (the key columns always; address, behind and downgrades as room
    allows)."""
    rows = []
    notes = []
    back = downgraded = False
    for name, d in sorted(replication.get("destinations", {}).items()):
        mode = d["replication_type"]
        if d["configured_sync_type"] != mode:
            mode += "*"
            downgraded = True
        address = str(d["address"] or "-")
        if "(back over" in address:  # the peer dialled; this link rides its connection
            address = address.partition(" (")[0] + " †"
            back = True
        remote = d["remote_name"]
        rows.append(
            (
                name if remote in (name, "", None) else f"{name} (instance {remote})",
                mode,
                "yes" if d["is_connected"] else "NO",
                address,
                str(d["sent_txid"]),
                str(d["acked_txid"]),
                f"{d['seconds_behind']:.1f}",
                str(d.get("lag_txids", 0)),
                str(d.get("downgrades", 0)),
            )
        )
    if downgraded:
        notes.append("* downgraded from sync: `amps-py admin upgrade NAME` makes it sync again")
    if back:
        notes.append("† back replication over the connection the peer opened")
    return fit_table("replication destinations", DESTINATION_COLUMNS, rows, width, notes=notes)


def down_lines(replication: Mapping[str, Any]) -> list[Text]:
    """One line per destination that is not connected: since when it is down, how
    many attempts failed, the last error, and whether persisted acks wait for it (a
    sync destination holds the acks of the messages routed to it only)."""
    lines = []
    for name, d in sorted(replication.get("destinations", {}).items()):
        if d["is_connected"]:
            continue
        waits = _acks_waiting(d)
        attempts = int(d.get("failed_attempts", 0))
        error = d.get("last_error") or ""
        if d.get("down_since"):
            text = (
                f"{name} DOWN since {d['down_since']} ({_duration(float(d.get('down_s', 0)))})"
                f", {attempts} failed attempt{'s' if attempts != 1 else ''}"
            )
        elif not d.get("address"):
            text = f"{name} not connected: waiting for the peer to connect"
        else:
            text = f"{name} not connected yet"
        if error:
            text += f"; last error: {error}"
        lines.append(Text(text + waits, style="red"))
    return lines


def _acks_waiting(d: Mapping[str, Any]) -> str:
    """What a destination that is down means for persisted acks, for
    :func:`down_lines`."""
    if d["replication_type"] != "sync":
        return ""
    if "acks_waiting" not in d:  # an instance from before acks followed routing
        return "; persisted acks wait for it"
    waiting = int(d["acks_waiting"] or 0)
    if not waiting:
        return "; sync, but no persisted ack waits for it (nothing routed to it is unacknowledged)"
    return (
        f"; persisted acks wait for it ({waiting} message{'s' if waiting != 1 else ''} "
        "routed to it not acknowledged)"
    )


def hole_lines(replication: Mapping[str, Any]) -> list[Text]:
    """One line per destination that was not sent records this journal holds damaged
    (replication holes): how many, and the last one with its txids and the fix."""
    lines = []
    for name, d in sorted(replication.get("destinations", {}).items()):
        holes = int(d.get("holes", 0) or 0)
        if not holes:
            continue
        text = f"{name}: {holes} replication hole{'s' if holes != 1 else ''}"
        if d.get("last_hole"):
            text += f"; last: {d['last_hole']}"
        lines.append(Text(text, style="red"))
    return lines


def upstreams_line(replication: Mapping[str, Any]) -> Text | None:
    upstreams = replication.get("upstreams", {})
    if not upstreams:
        return None
    return Text(
        "upstreams: "
        + ", ".join(
            f"{n} ({u['address']}, {u['messages_in']} messages in)" for n, u in upstreams.items()
        )
    )


def replication_view(replication: Mapping[str, Any], width: int | None = None) -> Group:
    """``amps-py admin replication``: the destinations table, what is down, the
    upstreams."""
    parts: list[RenderableType] = []
    if replication.get("destinations"):
        parts.append(destinations_table(replication, width))
        parts.extend(down_lines(replication))
        parts.extend(hole_lines(replication))
    else:
        parts.append(Text("no replication destinations"))
    upstreams = upstreams_line(replication)
    if upstreams is not None:
        parts.append(upstreams)
    return Group(*parts)


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


def status_screen(instance: dict[str, Any], width: int | None = None) -> Group:
    """The ``status`` screen of an ``/amps/instance`` document, as one renderable whose
    tables fit ``width`` columns."""
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
    sow = instance.get("sow") or {}
    if sow:
        line(
            "sow: "
            + ", ".join(
                f"{topic}{_sow_kind(figures)} {figures['records']} records "
                f"({_size(int(figures['bytes'])).replace(' ', chr(0xA0))})"
                for topic, figures in sow.items()
            )
        )
    queues = instance.get("queues") or {}
    if queues:
        line(queues_line(queues))
    unparsed = instance["statistics"].get("unparsed_payloads") or {}
    if unparsed:
        line(
            "not JSON (skipped by every content filter): "
            + ", ".join(f"{topic} {n}" for topic, n in sorted(unparsed.items()))
        )
    transports = ", ".join(f"{n}:{t['port']}" for n, t in instance.get("transports", {}).items())
    line(f"transports {transports}")
    replication = instance.get("replication", {})
    if replication.get("destinations"):
        parts.append(destinations_table(replication, width))
        parts.extend(down_lines(replication))
        parts.extend(hole_lines(replication))
    upstreams = upstreams_line(replication)
    if upstreams is not None:
        parts.append(upstreams)
    return Group(*parts)


def print_status(console: Console, instance: dict[str, Any]) -> None:
    console.print(status_screen(instance, console.width))


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


CLIENT_COLUMNS: Final = (
    Column("client"),
    Column("user", drop=3),
    Column("remote", drop=4),
    Column("up", "right", drop=2),
    Column("subs", "right"),
    Column("in", "right"),
    Column("out", "right"),
    Column("queued", "right"),
    Column("state"),
)


def clients_table(clients: dict[str, Any], width: int | None = None) -> RenderableType:
    """``/amps/instance/clients`` as a table that fits ``width``; the queued column is
    the slow-client indicator (bytes waiting to be written, and their share of the
    client's limit)."""
    rows = []
    for key, c in clients.items():
        queued, limit = int(c["queued_bytes"]), int(c["queued_limit_bytes"])
        share = f" ({100 * queued / limit:.0f}%)" if queued and limit else ""
        state = "ok" if c["logged_on"] else "no logon"
        if c.get("offline"):
            state = f"offline, {_size(int(c.get('spill_bytes', 0)))} on disk"
        if c.get("closing"):
            state = f"closing: {c['closing']}"
        rows.append(
            (
                key,
                c["user"] or "-",
                c["remote_address"],
                _duration(float(c["connected_s"])),
                str(c["subscriptions"]),
                str(c["messages_in"]),
                str(c["messages_out"]),
                _size(queued) + share,
                state,
            )
        )
    return fit_table("clients", CLIENT_COLUMNS, rows, width)


DISCONNECT_COLUMNS: Final = (
    Column("when"),
    Column("client"),
    Column("remote", drop=2),
    Column("transport", drop=1),
    Column("reason"),
    Column("detail", drop=3),
)

#: how many recent disconnects ``amps-py admin clients`` lists
RECENT_DISCONNECTS_SHOWN: Final = 10


def disconnects_table(recent: list[dict[str, Any]], width: int | None = None) -> RenderableType:
    """The newest entries of ``/amps/instance/disconnects`` ``recent`` as a table:
    when, who, and why (the close reason and what the client was told)."""
    rows = [
        (
            time.strftime("%H:%M:%S", time.localtime(float(d["at"]))),
            d["client_name"] or f"connection {d['connection']}",
            d["remote_address"],
            d["transport"],
            d["reason"],
            d.get("detail") or "",
        )
        for d in recent
    ]
    return fit_table("recent disconnects", DISCONNECT_COLUMNS, rows, width)


def print_clients(
    console: Console, clients: dict[str, Any], recent: list[dict[str, Any]] | None = None
) -> None:
    """The connected clients, then (when given) the newest of the recent disconnects
    with their reasons."""
    if not clients:
        console.print("no clients connected")
    else:
        console.print(clients_table(clients, console.width))
    if recent:
        console.print(disconnects_table(recent[:RECENT_DISCONNECTS_SHOWN], console.width))


def watch(
    console: Console,
    url: str,
    *,
    interval: float,
    count: int | None,
    user: str | None = None,
    password: str = "",
    ca_file: str | None = None,
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

    def read() -> Any:
        return fetch(url, path, user=user, password=password, ca_file=ca_file)

    last_good = status_screen(read(), console.width)
    failure: AdminError | None = None
    shown = 1
    try:
        with Live(last_good, console=console, auto_refresh=False) as live:
            while count is None or shown < count:
                time.sleep(interval)  # the refresh period the operator asked for
                screen: RenderableType
                try:
                    screen = last_good = status_screen(read(), console.width)
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
    table = Table(
        title="transaction log",
        show_header=False,
        title_justify="left",
        box=box.SIMPLE,
        show_edge=False,
    )
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
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


SEGMENT_COLUMNS: Final = (
    Column("id", "right"),
    Column("state"),
    Column("txids"),
    Column("records", "right"),
    Column("size", "right"),
    Column("on disk", "right"),
    Column("newest record", drop=2),
    Column("file", drop=3),
)


def segments_table(journal: dict[str, Any], width: int | None = None) -> RenderableType:
    """The journal segments (AMPS's journal files): state, txids, records, their size
    and, for a segment in a file of its own (compressed, archived), the file's size on
    disk; the newest record's time and the file as room allows."""
    rows = []
    directory = str(journal.get("path", ""))
    for seg in (journal.get("journals") or {}).values():
        state = str(seg.get("state", "?"))
        if seg.get("is_current"):
            state += " (current)"
        if seg.get("pending_removal"):
            state += ", removal pending"
        file_bytes = seg.get("file_bytes")
        file_name = str(seg.get("file_name", ""))
        if directory and file_name.startswith(directory.rstrip("/") + "/"):
            file_name = file_name[len(directory.rstrip("/")) + 1 :]  # in the journal dir
        rows.append(
            (
                str(seg.get("id", "?")),
                state,
                f"{seg.get('first_txid', 0)}..{seg.get('last_txid', 0)}",
                str(seg.get("records", 0)),
                _size(int(seg.get("bytes", 0))),
                "-" if file_bytes is None else _size(int(file_bytes)),
                str(seg.get("max_timestamp", "")).replace("T", " ")[:19],
                file_name,
            )
        )
    maintenance = journal.get("maintenance") or {}
    held = maintenance.get("held_by") or []
    notes = ["size: the records' bytes; on disk: the segment file's size ('-': in data.mdb)"]
    if maintenance.get("pending_removal") and held:
        notes.append("removal waits for: " + "; ".join(map(str, held)))
    if maintenance.get("failures"):
        notes.append(
            f"{maintenance['failures']} maintenance step(s) failed and were retried (log 05-0005)"
        )
    return fit_table("journals", SEGMENT_COLUMNS, rows, width, notes=notes)


def journals_view(journal: dict[str, Any], width: int | None = None) -> Group:
    """``amps-py admin journals``: the transaction log summary, then its segments."""
    return Group(journal_table(journal), segments_table(journal, width))


def actions_view(document: Mapping[str, Any]) -> Group:
    """``amps-py admin actions``: one line per amps-action-on-admin action (its Path,
    name, the parameters it needs, its description); long lines wrap."""
    actions = document.get("actions") or []
    if not actions:
        return Group(Text("no amps-action-on-admin actions are configured"))
    lines = []
    for a in actions:
        needs = ", ".join(a["required_parameters"]) or "no parameters"
        lines.append(Text(f"{a['path']}: {a['name']} ({needs}) {a['description']}".rstrip()))
    return Group(*lines)


def queues_line(queues: Mapping[str, Any]) -> str:
    """The status screen's one line on queues: per queue its depth, leased messages
    and, when it has any waiting, how long the oldest has waited."""
    parts = []
    for name, q in queues.items():
        text = f"{name} {q.get('depth', 0)} in queue ({q.get('leased', 0)} leased"
        behind = float(q.get("seconds_behind", 0))
        if q.get("depth") and behind >= 1:
            text += f", oldest {_duration(behind)}"
        parts.append(text + ")")
    return "queues: " + ", ".join(parts)


QUEUE_COLUMNS: Final = (
    Column("queue"),
    Column("kind", drop=5),
    Column("depth", "right"),
    Column("leased", "right"),
    Column("owned", "right", drop=3),
    Column("backlog", "right", drop=4),
    Column("delivered", "right", drop=2),
    Column("acked", "right"),
    Column("expired", "right", drop=1),
    Column("behind (s)", "right"),
    Column("transfers in/out", "right", drop=6),
    Column("underlying topic", drop=7),
)


def queues_table(queues: Mapping[str, Any], width: int | None = None) -> RenderableType:
    """``amps-py admin queues``: ``/amps/instance/queues`` as a table that fits
    ``width``: per queue its depth (waiting or leased), leased, owned here, backlog
    (leased / the subscriptions' capacity, and the MaxBacklog cap), deliveries, acks,
    expiries, seconds behind (how long the oldest message has waited), ownership
    transfers and the underlying topic; the key columns always, the others as room
    allows."""
    if not queues:
        return Text("no queues are configured")
    rows = []
    for name, q in queues.items():
        backlog = f"{q.get('leased', 0)}/{q.get('backlog_capacity', 0)}"
        if q.get("max_backlog") is not None:
            backlog += f" (max {q['max_backlog']})"
        kind = str(q.get("kind", "?"))
        if q.get("semantics") == "at-most-once":
            kind += ", at-most-once"
        rows.append(
            (
                name,
                kind,
                str(q.get("depth", 0)),
                str(q.get("leased", 0)),
                str(q.get("owned", 0)),
                backlog,
                str(q.get("delivered", 0)),
                str(q.get("acked", 0)),
                str(q.get("expired", 0)),
                f"{float(q.get('seconds_behind', 0)):.1f}",
                f"{q.get('transferred_in', 0)}/{q.get('transferred_out', 0)}",
                str(q.get("underlying_topic", "")),
            )
        )
    notes = []
    proxied = [name for name, q in queues.items() if q.get("proxied_transfer")]
    if proxied:
        notes.append(
            f"proxied transfer enabled on {', '.join(proxied)}: this instance claims "
            "messages whose owner is unreachable"
        )
    timeouts = sum(int(q.get("lease_timeouts", 0)) for q in queues.values())
    if timeouts:
        notes.append(f"{timeouts} lease(s) timed out (expired_leases in --json)")
    return fit_table("queues", QUEUE_COLUMNS, rows, width, notes=notes)


def _sow_kind(figures: dict[str, Any]) -> str:
    """`` [Pattern ^orders/]`` or `` [conflated orders]`` after a SOW topic's name in
    the status; "" for a plain SOW topic."""
    if figures.get("pattern"):
        return f" [Pattern {figures['pattern']}]"
    if figures.get("conflated_from"):
        return f" [conflated {figures['conflated_from']}]"
    return ""
