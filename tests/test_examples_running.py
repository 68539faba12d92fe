"""The shipped example configs (config/examples), run as they are.

Each example's XML files are copied into ``tmp_path`` (with the files they name by
``${AMPS_CONFIG_DIRECTORY}``: the replication password files) with two kinds of edits only:
every port named in an ``InetAddr`` element (client, replication and Admin) is mapped to
a freshly allocated free port (the same map for every file of the example, so the
instances still find each other),
and ``JournalDirectory`` / log ``FileName`` point into ``tmp_path``. Nothing else in
the files changes (checked line by line), so these tests exercise the topology, sync
types, PassThrough rules and failover addresses exactly as a user would run them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
import trio
from admin_screens import table
from checker import Pub, Report, Stored, classify, payload, replay_instance
from harness import REPO, ServerProcess, reserve_port, wait_until, wait_until_sync

from amps_py.client import CommandError, ConnectionLost, open_client
from amps_py.config import load_config

EXAMPLES = REPO / "config" / "examples"
TOPIC = "orders"

_INET = re.compile(r"(<InetAddr>\s*)(?:([^<]*):)?(\d+)(\s*</InetAddr>)")
_JOURNAL = re.compile(r"<JournalDirectory>[^<]*</JournalDirectory>")
_FILENAME = re.compile(r"<FileName>([^<]*)</FileName>")
_EDITABLE_LINE = re.compile(r"<(InetAddr|JournalDirectory|FileName)>")
_BESIDE = re.compile(r"\$\{AMPS_CONFIG_DIRECTORY\}/([^<\s]+)")


# ---------------------------------------------------------------------- running examples


#: ports reserved for the example being run; released after each test
_RESERVED: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _release_reserved_ports() -> Iterator[None]:
    yield
    while _RESERVED:
        _RESERVED.pop().close()


def _fresh_ports(ports: set[int]) -> dict[int, int]:
    """Map each port to a distinct port reserved for this test (none of them equal to
    an original).

    The examples' configs name each other's ports (hot-hot pairs replicate to each
    other), so they cannot listen on port 0 and learn their ports afterwards: each
    port is reserved with :func:`harness.reserve_port` and held until the test ends."""
    mapping: dict[int, int] = {}
    for port in sorted(ports):
        reservation = reserve_port()
        while reservation.getsockname()[1] in ports:
            reservation.close()
            reservation = reserve_port()
        _RESERVED.append(reservation)
        mapping[port] = int(reservation.getsockname()[1])
    return mapping


def rewrite(text: str, name: str, workdir: Path, ports: Mapping[int, int]) -> str:
    """``text`` (the config of instance ``name``) with every InetAddr port mapped through
    ``ports``, the journal in ``workdir/<name>-journal`` and log files in ``workdir``."""
    journal_xml = f"<JournalDirectory>{escape(str(workdir / f'{name}-journal'))}</JournalDirectory>"

    def port_of(m: re.Match[str]) -> str:
        host = f"{m.group(2)}:" if m.group(2) is not None else ""
        return f"{m.group(1)}{host}{ports[int(m.group(3))]}{m.group(4)}"

    def log_file(m: re.Match[str]) -> str:
        target = workdir / f"{name}-{Path(m.group(1)).name}"
        return f"<FileName>{escape(str(target))}</FileName>"

    text = _INET.sub(port_of, text)
    text = _JOURNAL.sub(lambda _m: journal_xml, text)
    return _FILENAME.sub(log_file, text)


def copy_example(files: Sequence[Path], workdir: Path) -> dict[str, ServerProcess]:
    """Copy ``files`` (one example) into ``workdir`` with fresh ports and local journals.

    Returns a (not started) :class:`ServerProcess` per instance, by instance name.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    texts = {path: path.read_text() for path in files}
    # the files the configs name beside themselves (${AMPS_CONFIG_DIRECTORY}/...)
    for folder in {path.parent for path in files}:
        for name in sorted({n for t in texts.values() for n in _BESIDE.findall(t)}):
            shutil.copy(folder / name, workdir / name)
    ports = {int(m.group(3)) for text in texts.values() for m in _INET.finditer(text)}
    mapping = _fresh_ports(ports)
    servers: dict[str, ServerProcess] = {}
    for path, text in texts.items():
        name = load_config(path, environ={}).name
        new = rewrite(text, name, workdir, mapping)
        old_lines, new_lines = text.splitlines(), new.splitlines()
        assert len(old_lines) == len(new_lines), f"rewriting {path} changed its line count"
        for old_line, new_line in zip(old_lines, new_lines, strict=True):
            assert old_line == new_line or _EDITABLE_LINE.search(old_line), (
                f"rewriting {path} changed a line it must keep:\n{old_line}\n{new_line}"
            )
        target = workdir / path.name
        target.write_text(new)
        cfg = load_config(target, environ={})
        assert cfg.name == name
        (client,) = [t for t in cfg.transports if t.type in ("tcp", "tcps")]
        servers[name] = ServerProcess(target, workdir, client.port, name)
    return servers


def start_all(servers: Mapping[str, ServerProcess], timeout: float = 120) -> None:
    """Start every instance at once (each one waits for its own ready file)."""
    with ThreadPoolExecutor(len(servers)) as pool:
        for future in [pool.submit(s.start, timeout) for s in servers.values()]:
            future.result()


@pytest.fixture
def running() -> Iterator[list[ServerProcess]]:
    """Holds the servers a test started; stops them at teardown and fails the test if
    one that was still running does not exit cleanly."""
    started: list[ServerProcess] = []
    yield started
    problems = []
    for server in started:
        if not server.alive:
            continue
        try:
            code = server.stop()
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        if code != 0:
            problems.append(f"{server.name} exited with {code}:\n{server.tail()}")
    assert not problems, "\n".join(problems)


def records(server: ServerProcess) -> int:
    return int(server.statistics()["journal"]["records"])


async def wait_records(
    servers: Mapping[str, ServerProcess], want: int, timeout: float = 60
) -> None:
    def check() -> str | None:
        have = {name: records(s) for name, s in servers.items()}
        wrong = {name: n for name, n in have.items() if n != want}
        return None if not wrong else f"journal records {wrong}, want {want} on every instance"

    await wait_until(check, timeout)


async def publish_checked(
    uri: str, publisher: str, seqs: range, published: dict[str, list[Pub]]
) -> None:
    """Publish checker-convention payloads and wait for the persisted ack of the last."""
    async with open_client(uri, publisher) as client:
        last = 0
        for seq in seqs:
            last = await client.publish(TOPIC, payload(publisher, seq, f"{publisher}-{seq}"))
        await client.wait_persisted(last, timeout=20)
    published.setdefault(publisher, []).extend(Pub(s, f"{publisher}-{s}") for s in seqs)


async def replay_all(servers: Mapping[str, ServerProcess]) -> dict[str, list[Stored]]:
    """Replay every instance from EPOCH, all at once."""
    stored: dict[str, list[Stored]] = {}

    async def one(name: str, server: ServerProcess) -> None:
        stored[name] = await replay_instance(server.uri, TOPIC, timeout=20, quiet=0.3)

    async with trio.open_nursery() as nursery:
        for name, server in servers.items():
            nursery.start_soon(one, name, server)
    return {name: stored[name] for name in servers}


def check_report(report: Report, title: str, servers: Mapping[str, ServerProcess]) -> None:
    print(f"\n{title}\n{report.describe()}")
    if report.errors:
        logs = "\n".join(s.tail(15) for s in servers.values())
        pytest.fail(f"{title}: {report.errors} bad findings\n{report.describe()}\n{logs}")


# ---------------------------------------------------------------------- hot-hot


async def test_hot_hot_example_runs(tmp_path: Path, running: list[ServerProcess]) -> None:
    servers = copy_example(sorted((EXAMPLES / "hot-hot").glob("*.xml")), tmp_path / "hot-hot")
    assert sorted(servers) == ["amps-a", "amps-b"]
    a, b = servers["amps-a"], servers["amps-b"]
    running.extend(servers.values())
    start_all(servers)

    n = 100
    published: dict[str, list[Pub]] = {}
    expected = {(p, s) for p in ("pub-a", "pub-b") for s in range(1, n + 1)}
    async with (
        open_client(a.uri, "live-a") as live_a_client,
        open_client(b.uri, "live-b") as live_b_client,
        live_a_client.subscribe(TOPIC) as live_a,
        live_b_client.subscribe(TOPIC) as live_b,
    ):
        # sync pair: the persisted ack of each publisher covers both journals
        await publish_checked(a.uri, "pub-a", range(1, n + 1), published)
        await publish_checked(b.uri, "pub-b", range(1, n + 1), published)
        for where, sub in (("amps-a", live_a), ("amps-b", live_b)):
            got: list[tuple[str, int]] = []
            with trio.move_on_after(15):
                while len(got) < 2 * n:
                    doc = (await sub.get(15)).json()
                    got.append((doc["p"], doc["s"]))
            assert len(got) == len(set(got)) and set(got) == expected, (
                f"live subscriber on {where} got {len(got)} messages "
                f"({len(set(got))} distinct), want the {2 * n} published; "
                f"missing {sorted(expected - set(got))[:10]}"
            )

    # the pair logs on to each other with the example's replication user
    def authenticated() -> str | None:
        ids = {p: s.destination(p)["authenticated_id"] for s, p in ((a, "amps-b"), (b, "amps-a"))}
        wrong = {p: i for p, i in ids.items() if i != "replication"}
        return f"destinations log on as {wrong}, want 'replication'" if wrong else None

    await wait_until(authenticated, 60)

    # replay right after the acks, without waiting for anything: sync means stored
    stored = await replay_all(servers)
    check_report(classify(published, stored), "hot-hot replay from EPOCH", servers)
    marks = {name: {(m.publisher, m.seq): m.bookmark for m in got} for name, got in stored.items()}
    differ = [k for k in marks["amps-a"] if marks["amps-a"][k] != marks["amps-b"].get(k)]
    assert not differ, f"different bookmarks on amps-a and amps-b for {differ[:10]}"

    # a subscriber reads part of the stream on amps-a, then resumes on amps-b
    part = 130
    seen: list[tuple[str, int]] = []
    last_bookmark = ""
    async with open_client(a.uri, "mover") as ca, ca.subscribe(TOPIC, bookmark="0") as sub:
        for _ in range(part):
            message = await sub.get(10)
            seen.append((message.json()["p"], message.json()["s"]))
            last_bookmark = message.bookmark
    async with (
        open_client(b.uri, "mover") as cb,
        cb.subscribe(TOPIC, bookmark=last_bookmark) as sub,
    ):
        with trio.fail_after(60):
            await sub.completed.wait()
        while True:
            with trio.move_on_after(0.3) as quiet:
                message = await sub.get(10)
            if quiet.cancelled_caught:
                break
            seen.append((message.json()["p"], message.json()["s"]))
    duplicates = sorted({k for k in seen if seen.count(k) > 1})
    gaps = sorted(expected - set(seen))
    assert not duplicates and not gaps, (
        f"after resuming on amps-b from bookmark {last_bookmark} (message {part} on "
        f"amps-a): duplicates {duplicates[:10]}, missing {gaps[:10]}"
    )


# ---------------------------------------------------------------------- hot-hot, watched


def admin_url(server: ServerProcess) -> str:
    """The admin interface of ``server``, from its (rewritten) config; the ready file
    must report the same port, so the URL is the one a user reading the config uses."""
    address = load_config(server.config, environ={}).admin
    assert address is not None, f"{server.config} has no Admin/InetAddr"
    ready = json.loads(server.ready_file.read_text())
    assert ready["transports"]["admin"] == address[1], ready
    return f"http://{address[0]}:{address[1]}"


def admin_get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as response:
        return json.loads(response.read())


def admin_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``amps-py admin --url URL ARGS`` as a user runs it: the venv's console script, on
    a 120-column terminal without colour."""
    script = Path(sys.executable).with_name("amps-py")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "amps_py"]
    return subprocess.run(
        [*command, "admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "120", "LINES": "50", "NO_COLOR": "1", "TERM": "dumb"},
    )


def caught_up(url: str, peer: str, records: int) -> str | None:
    """None once the instance at ``url`` journals ``records`` records and ``peer``
    acknowledged all of them; else what is still missing."""
    instance = admin_get(url, "/amps/instance.json")
    journal = instance["transaction_log"]
    d = instance["replication"]["destinations"][peer]
    if (
        journal["records"] == records
        and d["is_connected"]
        and d["acked_txid"] >= journal["last_txid"]
    ):
        return None
    return (
        f"{instance['name']}: {journal['records']} records (want {records}), last txid "
        f"{journal['last_txid']}; destination {peer} connected={d['is_connected']} "
        f"acked {d['acked_txid']}"
    )


DESTINATION_COLUMNS = [
    "destination",
    "mode",
    "connected",
    "address",
    "sent txid",
    "acked txid",
    "behind (s)",
    "lag (msgs)",
    "downgrades",
]


def check_status_screen(
    screen: str,
    name: str,
    peer: str,
    *,
    clients: int,
    subscriptions: int,
    published: int,
    records: int,
) -> None:
    """What an operator must be able to read on ``name``'s status screen, replication
    with ``peer`` caught up."""
    lines = screen.splitlines()
    assert max(len(line) for line in lines) <= 120, "wider than the terminal"
    assert "\x1b[" not in screen, "colour codes with NO_COLOR and TERM=dumb"
    assert "…" not in screen, "a truncated cell"
    assert lines[0].startswith(f"{name} (group hot) amps-py "), lines[0]
    assert lines[1].startswith(f"clients {clients}, subscriptions {subscriptions}, "), lines[1]
    assert f"published {published}, " in lines[1], lines[1]
    # the journal: a summary line, then its directory on a line of its own
    journal_at = next(i for i, line in enumerate(lines) if line.startswith("journal: "))
    transports_at = next(i for i, line in enumerate(lines) if line.startswith("transports "))
    journal = lines[journal_at]
    assert journal.startswith(f"journal: txids 1..{records}, {records} records in 1 segment, ")
    assert re.search(r", [0-9.]+\xa0[KMG]?B, durability fsync$", journal), journal
    assert transports_at == journal_at + 2, "the journal summary fits on one line"
    assert lines[journal_at + 1].strip().endswith(f"{name}-journal"), lines[journal_at + 1]
    assert "json-tcp:" in lines[transports_at] and "admin:" in lines[transports_at]
    # the destination table: a header naming every column (120 columns are room for
    # all), then one row, for the peer
    (header,) = [line for line in lines if line.startswith(" destination ")]
    assert re.split(r"\s{2,}", header.strip()) == DESTINATION_COLUMNS, header
    (cells,) = table(screen, "destination")
    assert cells["destination"] == peer and cells["mode"] == "sync", cells
    assert cells["connected"] == "yes" and cells["behind (s)"] == "0.0", cells
    assert cells["lag (msgs)"] == "0", cells
    assert int(cells["sent txid"]) == int(cells["acked txid"]) == records, cells
    assert lines[-1].startswith(f"upstreams: {peer} ("), lines[-1]


async def test_hot_hot_example_status_screen(tmp_path: Path, running: list[ServerProcess]) -> None:
    """`amps-py admin status` against the running hot-hot pair prints a screen an
    operator can read at 120 columns, and --json prints JSON."""
    files = sorted((EXAMPLES / "hot-hot").glob("*.xml"))
    shipped = {load_config(f, environ={}).name: load_config(f, environ={}).admin for f in files}
    assert shipped == {"amps-a": ("127.0.0.1", 9108), "amps-b": ("127.0.0.1", 9208)}, (
        "the README documents the admin ports 9108 (amps-a) and 9208 (amps-b)"
    )
    servers = copy_example(files, tmp_path / "hot-hot")
    a, b = servers["amps-a"], servers["amps-b"]
    running.extend(servers.values())
    start_all(servers)
    urls = {name: admin_url(s) for name, s in servers.items()}
    assert len(set(urls.values())) == 2
    assert not {u.rsplit(":", 1)[1] for u in urls.values()} & {"9108", "9208"}

    published: dict[str, list[Pub]] = {}
    await publish_checked(a.uri, "pub-a", range(1, 6), published)
    await publish_checked(b.uri, "pub-b", range(1, 4), published)
    await wait_until(lambda: caught_up(urls["amps-a"], "amps-b", 8), 60)
    await wait_until(lambda: caught_up(urls["amps-b"], "amps-a", 8), 60)

    async with open_client(a.uri, "watcher") as watcher, watcher.subscribe(TOPIC):

        def watcher_listed() -> str | None:
            clients = admin_get(urls["amps-a"], "/amps/instance/clients.json")
            return None if "watcher" in clients else f"clients are {sorted(clients)}"

        await wait_until(watcher_listed, 60)
        screens = {
            name: await trio.to_thread.run_sync(lambda url=url: admin_cli(url, "status"))
            for name, url in urls.items()
        }
        as_json = await trio.to_thread.run_sync(
            lambda: admin_cli(urls["amps-a"], "--json", "status")
        )
    for name, result in screens.items():
        print(f"\n$ amps-py admin --url {urls[name]} status\n{result.stdout}{result.stderr}")
    for name, result in screens.items():
        assert result.returncode == 0 and result.stderr == "", f"{name}: {result.stderr}"
    check_status_screen(
        screens["amps-a"].stdout,
        "amps-a",
        "amps-b",
        clients=1,
        subscriptions=1,
        published=5,
        records=8,
    )
    check_status_screen(
        screens["amps-b"].stdout,
        "amps-b",
        "amps-a",
        clients=0,
        subscriptions=0,
        published=3,
        records=8,
    )

    # --json: the same documents, machine-readable
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    assert {"name", "group", "version", "uptime_s", "clients", "client_count"} <= set(status)
    assert {"transaction_log", "replication", "transports", "statistics"} <= set(status)
    assert (status["name"], status["group"]) == ("amps-a", "hot")
    assert status["transaction_log"]["records"] == 8
    assert "watcher" in status["clients"]
    replication = await trio.to_thread.run_sync(
        lambda: admin_cli(urls["amps-b"], "--json", "replication")
    )
    assert replication.returncode == 0, replication.stderr
    tree = json.loads(replication.stdout)  # the destinations and upstreams, by name
    assert set(tree) == {"destinations", "upstreams"} and set(tree["upstreams"]) == {"amps-a"}
    d = tree["destinations"]["amps-a"]
    assert {"remote_name", "replication_type", "is_connected", "sent_txid", "acked_txid"} <= set(d)
    assert (d["remote_name"], d["replication_type"], d["is_connected"]) == ("amps-a", "sync", True)
    assert d["lag_txids"] == 0 and d["acked_txid"] >= 8


# ---------------------------------------------------------------------- geo-ha


async def test_geo_ha_example_runs(tmp_path: Path, running: list[ServerProcess]) -> None:
    order = ["chi-1", "chi-2", "ny-1", "ny-2", "ldn-1", "ldn-2"]
    copied = copy_example(sorted((EXAMPLES / "geo-ha").glob("*.xml")), tmp_path / "geo-ha")
    assert sorted(copied) == sorted(order)
    servers = {name: copied[name] for name in order}
    running.extend(servers.values())
    start_all(servers)

    n = 30
    published: dict[str, list[Pub]] = {}
    async with trio.open_nursery() as nursery:
        for origin in ("chi-1", "ny-1", "ldn-1"):
            nursery.start_soon(
                publish_checked, servers[origin].uri, f"pub@{origin}", range(1, n + 1), published
            )
    await wait_records(servers, 3 * n)
    stored = await replay_all(servers)
    check_report(classify(published, stored), "geo-ha: 30 published at chi-1, ny-1, ldn-1", servers)

    # ny-1 dies; what chi-1 publishes now reaches NewYork through its failover address
    ny1, ny2 = servers["ny-1"], servers["ny-2"]
    ny2_repl = next(
        f"{t.host}:{t.port}"
        for t in load_config(ny2.config, environ={}).transports
        if t.type == "amps-replication"
    )
    ny1.kill()
    m = 20
    await publish_checked(servers["chi-1"].uri, "pub@chi-1", range(n + 1, n + m + 1), published)
    live = {name: s for name, s in servers.items() if name != "ny-1"}
    await wait_records(live, 3 * n + m)

    def via_ny2() -> str | None:
        d = servers["chi-1"].destination("NewYork")
        if d["is_connected"] and d["address"] == ny2_repl:
            return None
        return (
            f"chi-1's NewYork destination: connected={d['is_connected']} to "
            f"{d['address'] or '-'} ({d['remote_name'] or '?'}), want {ny2_repl} (ny-2); "
            f"last error {d['last_error']!r}"
        )

    await wait_until(via_ny2, 60)
    stored = await replay_all(live)
    check_report(
        classify(published, stored), "geo-ha: ny-1 killed, 20 more published at chi-1", live
    )

    # ny-1 comes back and catches up with everything, exactly once
    ny1.start()
    await wait_records(servers, 3 * n + m)
    stored = await replay_all(servers)
    check_report(classify(published, stored), "geo-ha: ny-1 restarted and caught up", servers)


# ---------------------------------------------------------------------- a quiet start

#: a log line at warning level or above (the console format: time [thread] level: ...)
_LOUD = re.compile(r"^\S+ \[[^\]]*\] (warning|error|critical): ")


def all_connected(servers: Mapping[str, ServerProcess]) -> str | None:
    """None once every destination of every instance is connected, else which is not."""
    for server in servers.values():
        repl = server.statistics().get("replication") or {}
        for d in repl.get("destinations", []):
            if not d["is_connected"]:
                return f"{server.name}'s destination {d['name']} is not connected"
    return None


@pytest.mark.parametrize("example", ["hot-hot", "geo-ha"])
def test_a_normal_start_logs_no_warning(
    example: str, tmp_path: Path, running: list[ServerProcess]
) -> None:
    """Every instance of the example started at once, the secrets made 0600 as the
    example's README says: once all of them replicate to each other, no instance has
    logged a warning (peers dialing each other before every one listens, and the two
    connections a mutually replicating pair opens, are what a start does)."""
    servers = copy_example(sorted((EXAMPLES / example).glob("*.xml")), tmp_path / example)
    for secret in ("replication-users.pw", "replication.secret"):
        (tmp_path / example / secret).chmod(0o600)
    running.extend(servers.values())
    start_all(servers, timeout=120)
    wait_until_sync(lambda: all_connected(servers), 120)
    loud = [
        f"{server.name}: {line}"
        for server in servers.values()
        for line in server.output.read_text().splitlines()
        if _LOUD.match(line)
    ]
    assert not loud, "\n".join(loud)


# ---------------------------------------------------------------------- secure


async def test_secure_example_runs(tmp_path: Path, running: list[ServerProcess]) -> None:
    """config/examples/secure: TLS, password logons and per-user entitlements, used the
    way its README says."""
    folder = EXAMPLES / "secure"
    servers = copy_example([folder / "secure.xml"], tmp_path)
    server = servers["amps-secure"]
    running.append(server)
    server.start()
    ca = tmp_path / "server.pem"
    port = server.port

    def uri(user: str, password: str) -> str:
        return f"tcps://{user}:{password}@localhost:{port}/amps/json"

    async with open_client(uri("alice", "example-only-alice-pw"), "alice-1", ca_file=ca) as alice:
        await alice.publish_persisted(TOPIC, b'{"id":1}')
        with pytest.raises(CommandError) as denied:
            await alice.command({"c": "p", "t": "audit", "a": "processed", "s": 9}, b"{}")
        assert denied.value.reason == "not entitled"
    async with (
        open_client(uri("bob", "example-only-bob-pw"), "bob-1", ca_file=ca) as bob,
        bob.subscribe(TOPIC, bookmark="0") as replay,
    ):
        assert (await replay.get(10)).json() == {"id": 1}
        with pytest.raises(CommandError) as denied:
            await bob.command({"c": "p", "t": TOPIC, "a": "processed", "s": 1}, b"{}")
        assert denied.value.reason == "not entitled"
    with pytest.raises(CommandError) as refused:
        async with open_client(uri("bob", "not-bobs-password"), "bob-2", ca_file=ca):
            pass
    assert refused.value.reason == "auth failure"

    # its <Logging> writes to the console: the refused logon is recorded, the password not
    def auth_failure_logged() -> str | None:
        text = server.output.read_text(errors="replace")
        return None if "07-0050" in text else "no 07-0050 on the console yet"

    await wait_until(auth_failure_logged, 60)
    console = server.output.read_text(errors="replace")
    (line,) = [ln for ln in console.splitlines() if "07-0050" in ln]
    assert "'bob'" in line and "not-bobs-password" not in console, line
    with pytest.raises(ConnectionLost, match="tcps://"):
        async with open_client(f"tcp://localhost:{port}/amps/json", "plain", timeout=5):
            pass
    config = load_config(tmp_path / "secure.xml", environ={})
    admin = config.admin
    assert admin is not None and config.admin_tls is not None  # HTTPS, as the README says
    url = f"https://localhost:{admin[1]}"
    status = [sys.executable, "-m", "amps_py", "admin", "--url", url, "--ca-file", str(ca)]
    anonymous = subprocess.run(
        [*status, "--json", "status"], capture_output=True, text=True, timeout=60, check=False
    )
    assert anonymous.returncode != 0 and "401" in anonymous.stderr, anonymous.stderr
    env = {**os.environ, "AMPS_PY_ADMIN_PASSWORD": "example-only-ops-pw"}

    def as_ops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*status, "--user", "ops", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )

    ops = as_ops("--json", "status")
    assert ops.returncode == 0, ops.stderr
    assert json.loads(ops.stdout)["name"] == "amps-secure"
    unknown = as_ops("disconnect", "alice-1")  # an action: POST with its header, over TLS
    assert unknown.returncode == 1 and "HTTP 404: no client 'alice-1'" in unknown.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "amps_py", "admin", "--url", f"http://127.0.0.1:{admin[1]}",
         "status"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plain.returncode == 2 and "HTTPS" in plain.stderr, plain.stderr


# ---------------------------------------------------------------------- config check


#: the example files holding secrets: git checks them out readable by everyone (it
#: stores no 0600), so each example's README says to `chmod 600` them after copying
SECRET_EXAMPLE_FILES = ("users.pw", "server-key.pem", "replication-users.pw", "replication.secret")


@pytest.mark.parametrize(
    "path",
    sorted(EXAMPLES.rglob("*.xml")),
    ids=lambda p: str(p.relative_to(EXAMPLES)),
)
def test_example_passes_config_check(path: Path, tmp_path: Path) -> None:
    """tests/test_config_replication.py loads every example with load_config; this runs
    the command a user runs, ``amps-py config check``, on each: as checked out, it warns
    only that the secret files are readable by others (with the chmod); copied and
    chmod-ed as its README says, it is clean."""

    def check(target: Path) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [sys.executable, "-m", "amps_py", "config", "check", str(target)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0 and ": OK" in res.stdout, (
            f"amps-py config check {target} exited {res.returncode}\n{res.stdout}{res.stderr}"
        )
        return res

    res = check(path)
    config = load_config(path, environ={})
    admin = config.admin
    scheme = "https" if config.admin_tls is not None else "http"
    shown = f"; admin {scheme}://{admin[0]}:{admin[1]}" if admin else "; admin none"
    ok_line = res.stdout.splitlines()[0]
    assert ok_line.endswith(shown), res.stdout
    # then one line listing the SOW topics, for an example that has them
    assert [line.split(":")[0] for line in res.stdout.splitlines()[1:]] in ([], ["  sow"]), (
        res.stdout
    )
    for line in res.stderr.splitlines():
        assert "Fix: chmod 600 " in line, f"config check warns about an example: {line}"
    copy = tmp_path / path.parent.name
    shutil.copytree(path.parent, copy)
    for name in SECRET_EXAMPLE_FILES:
        if (copy / name).exists():
            (copy / name).chmod(0o600)
    res = check(copy / path.name)
    assert res.stderr == "", f"config check warns about an example: {res.stderr}"
    if config.replication_transport is not None:  # replicating examples authenticate
        assert config.replication_authentication.module == "amps-password-file"
        assert all(d.authenticator is not None for d in config.replication)


def test_the_readme_runs_the_standalone_example_where_the_default_ran() -> None:
    """The README starts the embedded default, then config/examples/standalone.xml from
    the same directory: a journal belongs to the instance that created it, so the two
    must not share a JournalDirectory (the second start was refused)."""
    from amps_py.config import default_config

    example = load_config(REPO / "config" / "examples" / "standalone.xml")
    default = default_config()
    assert example.name != default.name
    assert example.transaction_log is not None and default.transaction_log is not None
    assert (
        example.transaction_log.journal_directory.resolve()
        != default.transaction_log.journal_directory.resolve()
    )
