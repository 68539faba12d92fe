"""The HTTP admin API over real HTTP, /metrics, and the `amps-py admin` console, against
real instance processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import ServerProcess, reserve_port, security_xml, start_instance, wait_until
from lxml import etree

from amps_py.client import ConnectionLost, open_client
from txlog import publisher_hash

ADMIN_XML = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"


def admin_url(server: ServerProcess) -> str:
    ready = json.loads(server.ready_file.read_text())
    return f"http://127.0.0.1:{ready['transports']['admin']}"


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["content-type"], exc.read()


def admin_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def server(tmp_path: Path) -> Any:
    proc = start_instance(tmp_path, "adm", extra=ADMIN_XML)
    yield proc
    proc.stop()


def test_every_tree_path_answers_json_and_xml(server: ServerProcess) -> None:
    base = admin_url(server)
    status, kind, body = get(f"{base}/amps.json")
    assert status == 200 and kind.startswith("application/json")
    tree = json.loads(body)
    assert tree["instance"]["name"] == "adm"
    assert tree["instance"]["transaction_log"]["durability"] == "fsync"
    # walk every documented node: each answers valid JSON and valid XML
    paths = ["/amps", "/amps/host", "/amps/instance"]
    paths += [f"/amps/instance/{key}" for key in tree["instance"]]
    paths += [f"/amps/host/{key}" for key in tree["host"]]
    paths += [
        f"/amps/instance/transaction_log/{key}" for key in tree["instance"]["transaction_log"]
    ]
    assert "/amps/instance/transaction_log/journals" in paths
    for path in paths:
        status, kind, body = get(f"{base}{path}.json")
        assert status == 200, path
        json.loads(body)
        status, kind, body = get(f"{base}{path}.xml")
        assert status == 200 and kind == "application/xml", path
        etree.fromstring(body)  # raises on invalid XML
    status, _, body = get(f"{base}/amps/instance/nothing.json")
    assert status == 404
    message = json.loads(body)["error"]
    assert "has no 'nothing'" in message and "replication" in message
    assert get(f"{base}/elsewhere")[0] == 404


async def test_metrics_follow_the_traffic(server: ServerProcess) -> None:
    base = admin_url(server)
    async with open_client(server.uri, "metrics-pub") as pub:
        for i in range(5):
            await pub.publish("orders", b'{"i":%d}' % i)
        await pub.wait_persisted(pub.seq, timeout=30)

    def published() -> str | None:
        status, kind, body = get(f"{base}/metrics")
        assert status == 200 and kind.startswith("text/plain")
        text = body.decode()
        line = next(x for x in text.splitlines() if x.startswith("amps_published_messages_total"))
        return None if float(line.split()[-1]) == 5 else f"metrics say {line}"

    await wait_until(published, 60)
    text = get(f"{base}/metrics")[2].decode()
    assert 'amps_journal_commits_total{instance="adm"}' in text
    assert "amps_uptime_seconds" in text
    # the start: how long, and how much of the journal it read (none: a fresh journal)
    assert 'amps_startup_journal_records_read{instance="adm"} 0.0' in text, text
    assert "amps_startup_seconds" in text
    # histograms: cumulative buckets ending in +Inf, whose count is the commit count
    commits = next(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith("amps_journal_commits_total")
    )
    inf = next(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith("amps_journal_commit_duration_seconds_bucket") and 'le="+Inf"' in x
    )
    assert inf == commits > 0
    assert "amps_journal_batch_records_bucket" in text
    assert "amps_client_queued_bytes" in text


def test_console_status_screen_and_json(server: ServerProcess) -> None:
    base = admin_url(server)
    screen = admin_cli("--url", base, "status")
    assert screen.returncode == 0, screen.stderr
    assert "adm" in screen.stdout and "journal" in screen.stdout and "json-tcp" in screen.stdout
    as_json = admin_cli("--url", base, "--json", "status")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["name"] == "adm"


def test_console_says_why_it_cannot_connect() -> None:
    result = admin_cli("--url", "http://127.0.0.1:1", "status")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the admin interface at http://127.0.0.1:1" in lines[0]
    assert "is that its Admin/InetAddr?" in lines[0]
    assert "pass --url" not in lines[0], "--url was given: telling the user to pass it misleads"
    missing = admin_cli("--url", "http://127.0.0.1:1", "downgrade", "x")
    assert missing.returncode == 2


async def test_manual_downgrade_releases_waiting_acks_and_upgrade_restores_sync(
    cluster: Cluster,
) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        dest = destination_xml("B", "g", True, view.addr("B"), exclude=("replicate",))
        return replication_xml(dest) + ADMIN_XML

    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", lambda view: "")
    cluster.start_all()
    base = admin_url(cluster.server("A"))
    cluster.kill("B")

    def mode() -> str:
        d = json.loads(get(f"{base}/amps/instance/replication/destinations/B.json")[2])
        return str(d["replication_type"])

    assert mode() == "sync"
    async with open_client(cluster.uri("A"), "waiting-pub") as pub:
        for i in range(3):
            await pub.publish("orders", b'{"i":%d}' % i)
        with trio.move_on_after(1):
            await pub.wait_persisted(pub.seq, timeout=1)
        assert pub.persisted_seq < pub.seq, "a sync destination is down: no persisted ack yet"
        result = await trio.to_thread.run_sync(lambda: admin_cli("--url", base, "downgrade", "B"))
        assert result.returncode == 0 and "downgraded to async" in result.stdout
        await pub.wait_persisted(pub.seq, timeout=10)  # released at once
    assert mode() == "async"
    assert (
        'amps_replication_sync{destination="B",instance="A"} 0.0'
        in get(f"{base}/metrics")[2].decode()
    )
    cluster.start("B")
    result = await trio.to_thread.run_sync(
        lambda: admin_cli("--url", base, "--json", "upgrade", "B")
    )
    assert json.loads(result.stdout)["result"].startswith(("upgraded", "upgrade pending"))

    def upgraded() -> str | None:
        return None if mode() == "sync" else f"B is still {mode()}"

    await wait_until(upgraded, 30)
    d = json.loads(get(f"{base}/amps/instance/replication/destinations/B.json")[2])
    assert d["downgrades"] == 1 and d["upgrades"] == 1
    # AMPS's monitoring fields of a destination
    assert (d["client_type"], d["destination_name"], d["destination_group_name"]) == (
        "destination",
        "B",
        "g",
    )
    assert d["client_name"] == "A->B" and d["authenticated_id"] == ""
    # B was killed right after starting: A may or may not have reached it before
    assert bool(d["disconnect_time"]) == (d["disconnect_count"] > 0)
    assert d["disconnect_time"] <= d["connect_time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", d["connect_time"])
    assert isinstance(d["messages_out_per_sec"], float)
    assert isinstance(d["bytes_out_per_sec"], float)
    unknown = admin_cli("--url", base, "downgrade", "nobody")
    assert unknown.returncode == 1 and "no replication destination 'nobody'" in unknown.stderr


# ---------------------------------------------------------------------------- clients


def clients_of(base: str) -> dict[str, Any]:
    status, kind, body = get(f"{base}/amps/instance/clients.json")
    assert status == 200 and kind.startswith("application/json"), body
    return dict(json.loads(body))


async def test_clients_are_listed_by_name_with_their_counters(server: ServerProcess) -> None:
    base = admin_url(server)
    async with (
        open_client(server.uri, "alpha") as alpha,
        open_client(server.uri, "1st-feed") as feed,
        open_client(server.uri, "", logon=False),
        feed.subscribe("orders") as orders,
    ):
        for i in range(3):
            await alpha.publish("orders", b'{"i":%d}' % i)
        await alpha.wait_persisted(alpha.seq, timeout=30)
        for _ in range(3):
            await orders.get(10)

        def counted() -> str | None:
            clients = clients_of(base)
            if len(clients) != 3 or not {"alpha", "1st-feed"} <= set(clients):
                return f"clients are {sorted(clients)}"
            a, f = clients["alpha"], clients["1st-feed"]
            if (a["messages_in"], f["messages_out"], f["subscriptions"]) != (3, 3, 1):
                return f"alpha {a}, 1st-feed {f}"
            return None

        await wait_until(counted, 60)
        clients = clients_of(base)
        assert len(clients) == 3
        alpha_entry = clients["alpha"]
        assert alpha_entry["client_name"] == "alpha" and alpha_entry["user"] == "alpha"
        assert alpha_entry["logged_on"] is True and alpha_entry["transport"] == "json-tcp"
        assert alpha_entry["remote_address"].startswith("127.0.0.1:")
        assert alpha_entry["queued_bytes"] >= 0 and alpha_entry["queued_limit_bytes"] > 0
        assert alpha_entry["connected_s"] >= 0 and alpha_entry["connected_at"].endswith("Z")
        # AMPS's names for the same facts
        assert alpha_entry["connect_time"] == alpha_entry["connected_at"]
        assert alpha_entry["authenticated_id"] == "alpha"
        assert alpha_entry["client_name_hash"] == str(publisher_hash("alpha"))
        assert clients["1st-feed"]["subscription_count"] == 1
        assert alpha_entry["queued_bytes_out"] == alpha_entry["queued_bytes"]
        # a connection that has not logged on is keyed by its connection id
        (anonymous,) = [k for k in clients if k.startswith("connection-")]
        assert clients[anonymous]["logged_on"] is False
        assert clients[anonymous]["connection"] == int(anonymous.split("-")[1])
        # the count still follows, and one client answers by its own path
        instance = json.loads(get(f"{base}/amps/instance.json")[2])
        assert instance["client_count"] == 3
        status, _, body = get(f"{base}/amps/instance/clients/alpha.json")
        assert status == 200 and json.loads(body)["messages_in"] == 3

        # the XML form is valid XML; a name that is no XML element name becomes an item
        status, kind, body = get(f"{base}/amps/instance/clients.xml")
        assert status == 200 and kind == "application/xml"
        root = etree.fromstring(body)
        assert root.tag == "clients"
        assert root.findtext("alpha/client_name") == "alpha"
        (item,) = root.findall("item[@name='1st-feed']")
        assert item.findtext("subscriptions") == "1"

        listed = await trio.to_thread.run_sync(
            lambda: admin_cli("--url", base, "--json", "clients")
        )
        assert listed.returncode == 0, listed.stderr
        assert {"alpha", "1st-feed", anonymous} == set(json.loads(listed.stdout))
        table = await trio.to_thread.run_sync(lambda: admin_cli("--url", base, "clients"))
        assert table.returncode == 0, table.stderr
        assert "alpha" in table.stdout and "1st-feed" in table.stdout
    text = get(f"{base}/amps/instance/clients.json")[2].decode()
    assert "pw" not in text and "password" not in text


async def test_admin_disconnect_closes_that_client_only(server: ServerProcess) -> None:
    base = admin_url(server)
    async with (
        open_client(server.uri, "victim") as victim,
        open_client(server.uri, "bystander") as bystander,
        victim.subscribe("orders") as orders,
    ):
        await wait_until(
            lambda: (
                None
                if {"victim", "bystander"} <= set(clients_of(base))
                else f"clients are {sorted(clients_of(base))}"
            ),
            60,
        )
        done = await trio.to_thread.run_sync(
            lambda: admin_cli("--url", base, "disconnect", "victim")
        )
        assert done.returncode == 0, done.stderr
        assert "victim: disconnected" in done.stdout

        # the client sees the server close its connection: the subscription ends
        with trio.fail_after(60):
            remaining = [message async for message in orders]
        assert remaining == []
        assert isinstance(victim.closed, ConnectionLost)
        assert "server closed the connection" in str(victim.closed)
        with pytest.raises(ConnectionLost):
            await victim.publish("orders", b'{"late":1}')

        def gone() -> str | None:
            clients = clients_of(base)
            return None if set(clients) == {"bystander"} else f"clients are {sorted(clients)}"

        await wait_until(gone, 60)
        # the other client is untouched
        await bystander.publish_persisted("orders", b'{"still":"here"}', timeout=30)
    log = server.log_file.read_text()
    assert "07-0013 administrator disconnects client 'victim'" in log
    assert "disconnected: disconnected by the administrator" in log

    unknown = admin_cli("--url", base, "disconnect", "nobody")
    assert unknown.returncode == 1
    lines = unknown.stderr.strip().splitlines()
    assert len(lines) == 1 and "HTTP 404: no client 'nobody' is connected" in lines[0]
    as_json = admin_cli("--url", base, "--json", "disconnect", "nobody")
    assert as_json.returncode == 1 and as_json.stdout == ""
    assert admin_cli("--url", "http://127.0.0.1:1", "disconnect", "x").returncode == 2


async def test_shared_client_names_are_told_apart_by_connection(tmp_path: Path) -> None:
    # without a transaction log client names need not be unique
    server = start_instance(tmp_path, "nolog", journal=False, extra=ADMIN_XML)
    try:
        base = admin_url(server)
        async with open_client(server.uri, "twin") as first, open_client(server.uri, "twin"):

            def two() -> str | None:
                keys = sorted(clients_of(base))
                return None if len(keys) == 2 else f"clients are {keys}"

            await wait_until(two, 60)
            keys = sorted(clients_of(base), key=lambda k: int(k.split("-")[1]))
            assert all(k.startswith("connection-") for k in keys)
            ambiguous = await trio.to_thread.run_sync(
                lambda: admin_cli("--url", base, "disconnect", "twin")
            )
            assert ambiguous.returncode == 1
            assert "HTTP 409: 2 connections use client name 'twin'" in ambiguous.stderr
            assert keys[0] in ambiguous.stderr and keys[1] in ambiguous.stderr
            done = await trio.to_thread.run_sync(
                lambda: admin_cli("--url", base, "--json", "disconnect", keys[0])
            )
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
            assert answer == {
                "client": keys[0],
                "action": "disconnect",
                "result": "disconnected",
                "connection": int(keys[0].split("-")[1]),
                "remote_address": answer["remote_address"],
            }

            def first_closed() -> str | None:
                return None if first.closed is not None else "the first twin is still open"

            await wait_until(first_closed, 60)

            def one_left() -> str | None:
                keys_now = sorted(clients_of(base))
                return None if keys_now == ["twin"] else f"clients are {keys_now}"

            # the name is unique again, so the remaining connection is keyed by it
            await wait_until(one_left, 60)
            assert clients_of(base)["twin"]["connection"] == int(keys[1].split("-")[1])
    finally:
        server.stop()


async def test_disconnect_needs_the_admin_right(tmp_path: Path) -> None:
    security = security_xml(
        tmp_path,
        {"alice": "alice-secret-9", "bob": "bob-secret-9"},
        {"alice": {"read": ".*", "write": ".*", "admin": True}, "bob": {"read": ".*"}},
    )
    server = start_instance(tmp_path, "sec", extra=security + ADMIN_XML)

    def as_user(user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
        credentials = ["--user", user] if user else []
        return subprocess.run(
            [sys.executable, "-m", "amps_py", "admin", "--url", base, *credentials, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "AMPS_PY_ADMIN_PASSWORD": f"{user}-secret-9"},
        )

    try:
        base = admin_url(server)
        uri = f"tcp://bob:bob-secret-9@127.0.0.1:{server.port}/amps/json"
        async with open_client(uri, "reader") as reader:
            # with an Authentication module, reading the tree needs the admin right too
            listed = await trio.to_thread.run_sync(lambda: as_user("alice", "--json", "clients"))
            assert listed.returncode == 0, listed.stderr
            assert json.loads(listed.stdout)["reader"]["user"] == "bob"
            anonymous = await trio.to_thread.run_sync(lambda: as_user(None, "disconnect", "reader"))
            assert anonymous.returncode == 1 and "HTTP 401" in anonymous.stderr
            refused = await trio.to_thread.run_sync(lambda: as_user("bob", "disconnect", "reader"))
            assert refused.returncode == 1 and "HTTP 403" in refused.stderr
            assert "has no admin right" in refused.stderr
            assert reader.closed is None
            done = await trio.to_thread.run_sync(lambda: as_user("alice", "disconnect", "reader"))
            assert done.returncode == 0, done.stderr
            await wait_until(lambda: None if reader.closed else "reader still connected", 60)
        assert "administrator 'alice' disconnects client 'reader'" in server.log_file.read_text()
    finally:
        server.stop()


def test_console_watch_refreshes_and_stops_after_count(server: ServerProcess) -> None:
    base = admin_url(server)
    watched = admin_cli("--url", base, "watch", "--count", "2", "--interval", "0.2")
    assert watched.returncode == 0, watched.stderr
    assert "adm" in watched.stdout and "transports" in watched.stdout
    as_json = admin_cli("--url", base, "--json", "watch", "--count", "2", "--interval", "0.2")
    assert as_json.returncode == 0, as_json.stderr
    screens = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [s["name"] for s in screens] == ["adm", "adm"]
    assert screens[1]["uptime_s"] > screens[0]["uptime_s"]
    unreachable = admin_cli("--url", "http://127.0.0.1:1", "watch", "--count", "1")
    assert unreachable.returncode == 2
    assert len(unreachable.stderr.strip().splitlines()) == 1


def test_console_journals(server: ServerProcess) -> None:
    base = admin_url(server)
    screen = admin_cli("--url", base, "journals")
    assert screen.returncode == 0, screen.stderr
    assert "durability" in screen.stdout and "fsync" in screen.stdout
    as_json = admin_cli("--url", base, "--json", "journals")
    assert json.loads(as_json.stdout)["durability"] == "fsync"


@pytest.fixture
def reopening_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """``server`` on a reserved client port: a transport enabled again listens on its
    configured port, and clients come back to that address."""
    with reserve_port() as held:
        proc = start_instance(tmp_path, "adm", port=held.getsockname()[1], extra=ADMIN_XML)
        yield proc
        proc.stop()


async def test_transport_disable_disconnects_and_refuses_then_enable_listens_again(
    reopening_server: ServerProcess,
) -> None:
    server = reopening_server
    base = admin_url(server)
    async with open_client(server.uri, "on-the-transport") as client:
        result = await trio.to_thread.run_sync(
            lambda: admin_cli("--url", base, "transport", "disable", "json-tcp")
        )
        assert result.returncode == 0 and "1 client(s) disconnected" in result.stdout

        def closed() -> str | None:
            return None if client.closed is not None else "client still connected"

        await wait_until(closed, 60)
    with pytest.raises(OSError):
        async with open_client(server.uri, "refused", timeout=2):
            pass
    result = await trio.to_thread.run_sync(
        lambda: admin_cli("--url", base, "transport", "enable", "json-tcp")
    )
    assert result.returncode == 0 and "enabled" in result.stdout
    async with open_client(server.uri, "back-again") as client:
        await client.publish("orders", b'{"ok":1}')
        await client.wait_persisted(client.seq, timeout=10)
    unknown = admin_cli("--url", base, "transport", "disable", "nope")
    assert unknown.returncode == 1 and "no client transport 'nope'" in unknown.stderr
