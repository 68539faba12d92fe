"""The HTTP admin API over real HTTP, /metrics, and the `amps-py admin` console, against
real instance processes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import ServerProcess, start_instance, wait_until
from lxml import etree

from amps_py.client import open_client

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

    await wait_until(published, 10)
    text = get(f"{base}/metrics")[2].decode()
    assert 'amps_journal_commits_total{instance="adm"}' in text
    assert "amps_uptime_seconds" in text


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
    unknown = admin_cli("--url", base, "downgrade", "nobody")
    assert unknown.returncode == 1 and "no replication destination 'nobody'" in unknown.stderr
