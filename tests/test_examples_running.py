"""The shipped example configs (config/examples), run as they are.

Each example's XML files are copied into ``tmp_path`` with two kinds of edits only:
every port named in an ``InetAddr`` element is mapped to a freshly allocated free port
(the same map for every file of the example, so the instances still find each other),
and ``JournalDirectory`` / log ``FileName`` point into ``tmp_path``. Nothing else in
the files changes (checked line by line), so these tests exercise the topology, sync
types, PassThrough rules and failover addresses exactly as a user would run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
import trio
from harness import REPO, ServerProcess, free_port, wait_until

from amps_py.client import open_client
from amps_py.config import load_config

sys.path.insert(0, str(REPO / "tools"))

from checker import Pub, Report, Stored, classify, payload, replay_instance

EXAMPLES = REPO / "config" / "examples"
TOPIC = "orders"

_INET = re.compile(r"(<InetAddr>\s*)(?:([^<]*):)?(\d+)(\s*</InetAddr>)")
_JOURNAL = re.compile(r"<JournalDirectory>[^<]*</JournalDirectory>")
_FILENAME = re.compile(r"<FileName>([^<]*)</FileName>")
_EDITABLE_LINE = re.compile(r"<(InetAddr|JournalDirectory|FileName)>")


# ---------------------------------------------------------------------- running examples


def _fresh_ports(ports: set[int]) -> dict[int, int]:
    """Map each port to a distinct free port (none of them equal to an original)."""
    mapping: dict[int, int] = {}
    taken = set(ports)
    for port in sorted(ports):
        new = free_port()
        while new in taken:
            new = free_port()
        taken.add(new)
        mapping[port] = new
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
        (client,) = [t for t in cfg.transports if t.type == "tcp"]
        servers[name] = ServerProcess(target, workdir, client.port, name)
    return servers


def start_all(servers: Mapping[str, ServerProcess], timeout: float = 30) -> None:
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
    servers: Mapping[str, ServerProcess], want: int, timeout: float = 20
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
        with trio.fail_after(10):
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

    await wait_until(via_ny2, 10)
    stored = await replay_all(live)
    check_report(
        classify(published, stored), "geo-ha: ny-1 killed, 20 more published at chi-1", live
    )

    # ny-1 comes back and catches up with everything, exactly once
    ny1.start()
    await wait_records(servers, 3 * n + m)
    stored = await replay_all(servers)
    check_report(classify(published, stored), "geo-ha: ny-1 restarted and caught up", servers)


# ---------------------------------------------------------------------- config check


@pytest.mark.parametrize(
    "path",
    sorted(EXAMPLES.rglob("*.xml")),
    ids=lambda p: str(p.relative_to(EXAMPLES)),
)
def test_example_passes_config_check(path: Path) -> None:
    """tests/test_config_replication.py loads every example with load_config; this runs
    the command a user runs, ``amps-py config check``, on each."""
    res = subprocess.run(
        [sys.executable, "-m", "amps_py", "config", "check", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and ": OK" in res.stdout, (
        f"amps-py config check {path} exited {res.returncode}\n{res.stdout}{res.stderr}"
    )
