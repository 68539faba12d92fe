"""`amps-py admin` as a new user runs it: `--json` before or after the subcommand,
`admin replication --json` printing the destinations, every table readable at 80
columns when piped, and a compressed journal's size on disk.

One fabric serves every test: ``chicago-primary`` (admin API, 10 MB journals, an
on-admin action) replicates sync to ``chicago-secondary`` (running) and async to
``london-disaster-recovery`` (never started), with two `amps-py subscribe` clients
connected and journal 1 compressed. Real processes, the real `amps-py` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from admin_screens import admin_cli, admin_json, admin_url, table, words
from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until_sync

from amps_py.admin.console import _size
from amps_py.client import open_client

PRIMARY, SECONDARY, REMOTE = "chicago-primary", "chicago-secondary", "london-disaster-recovery"
SUBSCRIBERS = ("order-router-east-primary-7", "risk")
#: 16 KB messages enough to fill one 10 MB journal and start a second
MESSAGES, PAD = 700, 16 * 1024
ACTIONS = """
<Actions>
  <Action>
    <On><Module>amps-action-on-admin</Module>
        <Options><Path>say-hello</Path><Name>hello</Name>
                 <Description>publish a greeting on [greetings]</Description>
                 <RequiredParameter>who</RequiredParameter></Options></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>greetings</Topic><Data>{"hello":"{{who}}"}</Data></Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""
COMMANDS = ("status", "replication", "clients", "journals", "actions")


@dataclass
class Fabric:
    cluster: Cluster
    url: str
    journal_dir: Path


def primary_body(view) -> str:  # type: ignore[no-untyped-def]
    one_way = ("replicate",)
    return (
        replication_xml(
            destination_xml(SECONDARY, "chicago", True, view.addr(SECONDARY), exclude=one_way),
            destination_xml(REMOTE, "london", False, view.addr(REMOTE), exclude=one_way),
        )
        + ACTIONS
    )


async def publish_all(uri: str) -> None:
    pad = "p" * PAD
    async with open_client(uri, "loader") as pub:
        for n in range(1, MESSAGES + 1):
            await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
        await pub.wait_persisted(pub.seq, timeout=120)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    cluster = Cluster(tmp_path_factory.mktemp("console"))
    subscribers: list[subprocess.Popen[bytes]] = []
    try:
        cluster.add_instance(
            PRIMARY, "chicago", primary_body, journal_extra="<JournalSize>10MB</JournalSize>"
        )
        cluster.add_instance(SECONDARY, "chicago", lambda view: "")
        cluster.add_instance(REMOTE, "london", lambda view: "")
        cluster.start(SECONDARY)
        primary = cluster.start(PRIMARY)
        url = admin_url(primary)
        trio.run(publish_all, primary.uri)
        script = Path(sys.executable).with_name("amps-py")
        for name in SUBSCRIBERS:
            subscribers.append(
                subprocess.Popen(
                    [str(script), "subscribe", primary.uri, "orders", "--name", name],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        def settled() -> str | None:
            tree = admin_json(url, "status")
            d = tree["replication"]["destinations"][SECONDARY]
            last = tree["transaction_log"]["last_txid"]
            if d["acked_txid"] < last:
                return f"{SECONDARY} acknowledged {d['acked_txid']} of {last}"
            missing = set(SUBSCRIBERS) - set(tree["clients"])
            if missing or any(tree["clients"][n]["subscriptions"] != 1 for n in SUBSCRIBERS):
                return f"subscribers not yet listed: {sorted(tree['clients'])}"
            if len(tree["transaction_log"]["journals"]) < 2:
                return "one journal only"
            return None

        wait_until_sync(settled, 60, interval=0.2)
        compressed = admin_cli(url, "journal", "compress", "1")
        assert compressed.returncode == 0, compressed.stderr
        yield Fabric(cluster, url, cluster.journal_dir(PRIMARY))
    finally:
        for proc in subscribers:
            proc.terminate()
            proc.wait(timeout=30)
        cluster.stop_all()


# ---------------------------------------------------------------------- --json


@pytest.mark.parametrize("command", [*COMMANDS, "watch --count 1"])
def test_json_is_accepted_after_the_subcommand_too(fabric: Fabric, command: str) -> None:
    before = admin_cli(fabric.url, "--json", *command.split())
    after = admin_cli(fabric.url, *command.split(), "--json")
    for result in (before, after):
        assert result.returncode == 0, result.stderr
    first, second = json.loads(before.stdout), json.loads(after.stdout)
    assert isinstance(second, dict) and set(first) == set(second)


def test_json_replication_prints_the_destinations_and_upstreams(fabric: Fabric) -> None:
    for args in (("--json", "replication"), ("replication", "--json")):
        tree = json.loads(admin_cli(fabric.url, *args).stdout)
        assert set(tree) == {"destinations", "upstreams"}, sorted(tree)
        destinations = tree["destinations"]
        assert sorted(destinations) == [SECONDARY, REMOTE]
        assert destinations[SECONDARY]["is_connected"] is True
        assert destinations[REMOTE]["is_connected"] is False
        assert destinations[REMOTE]["down_since"] and destinations[REMOTE]["failed_attempts"]


# ---------------------------------------------------------------------- 80 columns


def screen(url: str, command: str, columns: int | None) -> str:
    """What ``amps-py admin COMMAND`` prints, piped, checked to be 80 columns at most
    with nothing cut off."""
    result = admin_cli(url, command, columns=columns)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    print(f"\n$ amps-py admin {command}   (COLUMNS={columns}, piped)\n{result.stdout}")
    widest = max(len(line) for line in result.stdout.splitlines())
    assert widest <= 80, f"{command}: a line of {widest} columns"
    assert "…" not in result.stdout, f"{command}: a cell was cut"
    return result.stdout


def check_destinations(text: str, tree: dict[str, Any]) -> None:
    rows = {row["destination"]: row for row in table(text, "destination")}
    assert sorted(rows) == [SECONDARY, REMOTE], rows
    for name, row in rows.items():
        d = tree["destinations"][name]
        assert row["mode"] == d["replication_type"], row
        assert row["connected"] == ("yes" if d["is_connected"] else "NO"), row
        assert row["sent txid"] == str(d["sent_txid"]), row
        assert row["acked txid"] == str(d["acked_txid"]), row
        assert row["lag (msgs)"] == str(d["lag_txids"]), row
    assert f"{REMOTE} DOWN since {tree['destinations'][REMOTE]['down_since']}" in words(text)


@pytest.mark.parametrize("columns", [80, None], ids=["COLUMNS=80", "no-COLUMNS"])
def test_every_table_keeps_its_key_columns_at_80_columns_piped(
    fabric: Fabric, columns: int | None
) -> None:
    url = fabric.url
    replication = admin_json(url, "replication")

    check_destinations(screen(url, "status", columns), replication)
    check_destinations(screen(url, "replication", columns), replication)

    clients = admin_json(url, "clients")
    rows = {row["client"]: row for row in table(screen(url, "clients", columns), "client")}
    assert set(SUBSCRIBERS) <= set(rows), rows
    for name in SUBSCRIBERS:
        c, row = clients[name], rows[name]
        assert (row["subs"], row["state"]) == ("1", "ok"), row
        assert row["in"] == str(c["messages_in"]) and row["out"] == str(c["messages_out"])
        assert row["queued"] == _size(c["queued_bytes"]), row

    journal = admin_json(url, "journals")
    rows = {row["id"]: row for row in table(screen(url, "journals", columns), "id")}
    assert sorted(rows) == sorted(journal["journals"]), rows
    for key, seg in journal["journals"].items():
        row = rows[key]
        assert row["state"].split()[0] == seg["state"], row
        assert row["txids"] == f"{seg['first_txid']}..{seg['last_txid']}", row
        assert row["records"] == str(seg["records"]) and row["size"] == _size(seg["bytes"])
    assert rows["1"]["state"] == "compressed"

    actions = words(screen(url, "actions", columns))
    assert actions == "say-hello: hello (who) publish a greeting on [greetings]", actions


# ---------------------------------------------------------------------- journals


def test_journals_show_a_compressed_segments_size_on_disk(fabric: Fabric) -> None:
    journal = admin_json(fabric.url, "journals")
    compressed, live = journal["journals"]["1"], journal["journals"]["2"]
    assert compressed["is_compressed"] and compressed["state"] == "compressed"
    on_disk = Path(compressed["file_name"])
    assert on_disk.parent == fabric.journal_dir and on_disk.name.endswith(".zst")
    assert compressed["file_bytes"] == on_disk.stat().st_size
    assert 0 < compressed["file_bytes"] < compressed["bytes"]  # 16 KB pads compress well
    assert live["file_bytes"] is None  # still in data.mdb
    rows = {row["id"]: row for row in table(screen(fabric.url, "journals", 80), "id")}
    assert rows["1"]["size"] == _size(compressed["bytes"])
    assert rows["1"]["on disk"] == _size(compressed["file_bytes"])
    assert rows["2"]["on disk"] == "-"
