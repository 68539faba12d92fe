"""``amps-py admin``: a console client of the HTTP admin API.

Every command reads or posts one admin path and prints a readable screen (rich), or the
raw JSON with ``--json``. A connection or HTTP error prints one line saying what failed
and how to fix it, and exits with status 2 (connection) or 1 (refused by the server).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console
from rich.table import Table

from amps_py.config import DEFAULT_ADMIN_ADDRESS

DEFAULT_URL = f"http://{DEFAULT_ADMIN_ADDRESS[0]}:{DEFAULT_ADMIN_ADDRESS[1]}"


class AdminError(Exception):
    """One line for the operator; ``exit_code`` 2 = not reachable, 1 = refused."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fetch(
    url: str, path: str, *, method: str = "GET", user: str | None = None, password: str = ""
) -> Any:
    """The JSON document at ``url + path``."""
    request = urllib.request.Request(url.rstrip("/") + path, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except (ValueError, AttributeError):
            detail = ""
        raise AdminError(f"{url}{path}: HTTP {exc.code}: {detail or exc.reason}", 1) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminError(
            f"cannot reach the admin interface at {url} ({reason}); is the instance running "
            "with an Admin/InetAddr? pass --url http://HOST:PORT",
            2,
        ) from None


def _bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def destinations_table(instance: dict[str, Any]) -> Table:
    table = Table(title="replication destinations", expand=False)
    for column in (
        "destination",
        "remote",
        "mode",
        "connected",
        "address",
        "sent",
        "acked",
        "behind (s)",
        "lag",
        "downgrades",
    ):
        table.add_column(column)
    committed = int(instance.get("transaction_log", {}).get("last_txid", 0))
    for name, d in sorted(instance.get("replication", {}).get("destinations", {}).items()):
        lag = max(committed - int(d["acked_txid"]), 0)
        mode = d["replication_type"]
        if d["configured_sync_type"] != mode:
            mode += f" (configured {d['configured_sync_type']})"
        table.add_row(
            name,
            d["remote_name"] or "?",
            mode,
            "yes" if d["is_connected"] else "NO",
            d["address"] or "-",
            str(d["sent_txid"]),
            str(d["acked_txid"]),
            f"{d['seconds_behind']:.1f}",
            f"{_bar(lag / committed if committed else 0.0, 10)} {lag}",
            str(d.get("downgrades", 0)),
        )
    return table


def print_status(console: Console, instance: dict[str, Any]) -> None:
    journal = instance.get("transaction_log", {})
    console.print(
        f"[bold]{instance['name']}[/bold] (group {instance['group']}) amps-py "
        f"{instance['version']}, up {instance['uptime_s']:.0f} s"
    )
    console.print(
        f"clients {instance['clients']}, subscriptions {instance['subscriptions']}, "
        f"published {instance['statistics']['published']}, "
        f"delivered {instance['statistics']['delivered']}"
    )
    if journal:
        console.print(
            f"journal {journal.get('path', '?')}: txids {journal.get('first_txid', 0)}.."
            f"{journal.get('last_txid', 0)}, {journal.get('records', 0)} records, "
            f"{int(journal.get('file_bytes', 0)) / 1e6:.1f} MB, durability "
            f"{journal.get('durability', '?')}"
        )
    transports = ", ".join(f"{n}:{t['port']}" for n, t in instance.get("transports", {}).items())
    console.print(f"transports {transports}")
    if instance.get("replication", {}).get("destinations"):
        console.print(destinations_table(instance))
    upstreams = instance.get("replication", {}).get("upstreams", {})
    if upstreams:
        console.print(
            "upstreams: "
            + ", ".join(
                f"{n} ({u['address']}, {u['messages_in']} in)" for n, u in upstreams.items()
            )
        )
