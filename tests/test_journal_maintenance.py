"""Journal maintenance on real processes: compress and archive through
``amps-py admin journal``, then replay and replication still read every message from
the segment files; remove waits while a disconnected destination still needs the
segments and happens by itself once it has caught up; bad requests get clear errors;
the actions run on a schedule."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import ServerProcess, assert_journal_sound, start_instance, wait_until

from amps_py.client import open_client
from txlog import format_bookmark, publisher_hash

PAYLOAD_PAD = 16 * 1024
#: enough 16 KB messages to fill three 10 MB segments and start a fourth
MESSAGES = 2_300
#: published while B is down: fills at least one more journal past what B acknowledged
MORE = 1_500
JOURNAL_XML = "<JournalSize>10MB</JournalSize><JournalArchiveDirectory>{}</JournalArchiveDirectory>"


def add_pair(cluster: Cluster, archive: Path, *, sync: bool) -> None:
    """A (10 MB journals, archive directory, admin API) replicating to B."""

    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        dest = destination_xml("B", "g", sync, view.addr("B"), exclude=("replicate",))
        return replication_xml(dest) + "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"

    cluster.add_instance("A", "g", a_body, journal_extra=JOURNAL_XML.format(archive))
    cluster.add_instance("B", "g", lambda view: "")


def start_maintained(tmp_path: Path, name: str) -> ServerProcess:
    """A standalone instance with 10 MB journals, ``tmp_path/archive`` and the admin API."""
    return start_instance(
        tmp_path,
        name,
        extra="<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>",
        journal_extra=JOURNAL_XML.format(tmp_path / "archive"),
    )


def admin_base(cluster: Cluster) -> str:
    """A's admin URL (its port is chosen at each start)."""
    ready = json.loads(cluster.server("A").ready_file.read_text())
    return f"http://127.0.0.1:{ready['transports']['admin']}"


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as response:
        return json.loads(response.read())


def metrics_text(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        return str(response.read().decode())


def post_error(base: str, path: str) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{base}{path}", method="POST", headers={"X-AMPS-Admin": "1"}
    )
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    raise AssertionError(f"POST {path} succeeded")


def admin(base: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "admin", "--url", base, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def journals(base: str) -> dict[str, dict[str, Any]]:
    return dict(get(base, "/amps/instance/transaction_log/journals.json"))


async def replay_all(uri: str, name: str, count: int = MESSAGES) -> list[int]:
    """The ``n`` of the first ``count`` messages a bookmark replay from EPOCH delivers."""
    seen: list[int] = []
    async with open_client(uri, name) as client, client.subscribe("orders", bookmark="0") as sub:
        while True:
            with trio.fail_after(60):
                msg = await sub.get(60)
            seen.append(int(msg.json()["n"]))
            if len(seen) == count:
                break
    return seen


async def test_archived_and_compressed_journals_replay_and_removal_waits_for_destination(
    cluster: Cluster, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    add_pair(cluster, archive, sync=False)
    cluster.start("A")  # B stays down: a destination that has never acknowledged anything
    base = admin_base(cluster)

    pad = "p" * PAYLOAD_PAD
    async with open_client(cluster.uri("A"), "pub") as pub:
        for n in range(1, MESSAGES + 1):
            await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
        await pub.flush(timeout=60)
    segs = journals(base)
    assert len(segs) >= 4, f"expected four 10 MB journals, got {list(segs.values())}"
    assert [s["state"] for s in segs.values()] == ["live"] * len(segs)

    # compress 1, archive 1-2 (1 stays compressed inside the archive)
    done = admin(base, "journal", "compress", "1")
    assert done.returncode == 0, done.stderr
    assert "compressed journal 1" in done.stdout
    done = admin(base, "journal", "archive", "2")
    assert done.returncode == 0, done.stderr
    assert "archived journals 1, 2" in done.stdout
    segs = journals(base)
    assert [segs[i]["state"] for i in ("1", "2", "3")] == ["archived", "archived", "live"]
    assert segs["1"]["is_compressed"] and not segs["2"]["is_compressed"]
    assert sorted(p.name for p in archive.iterdir()) == [
        "A.0000000001.journal.zst",
        "A.0000000002.journal",
    ]

    # the current journal, an unknown one and a bad id are refused with the reason
    current = max(segs, key=int)
    status, text = post_error(
        base, f"/amps/administrator/transaction_log/journals/{current}/remove"
    )
    assert status == 409 and "is the current one" in text
    status, text = post_error(base, "/amps/administrator/transaction_log/journals/99/archive")
    assert status == 404 and "there is no journal 99" in text
    refused = admin(base, "journal", "remove", str(current))
    assert refused.returncode != 0 and "is the current one" in refused.stderr

    # remove 1-2: B has acknowledged nothing, so they stay, marked
    done = admin(base, "journal", "remove", "2")
    assert done.returncode == 0, done.stderr
    assert "journals 1, 2 marked" in done.stdout and "destination B" in done.stdout
    status = admin(base, "status")
    assert "removal pending for journals 1, 2: destination B has acknowledged through txid 0" in (
        status.stdout
    ), status.stdout
    listing = admin(base, "journals")
    print(listing.stdout)
    assert "removal pending" in listing.stdout and "destination B" in listing.stdout
    metrics = metrics_text(base)
    assert 'amps_journal_removal_pending{instance="A"} 2.0' in metrics
    assert 'amps_journal_segments{instance="A",state="archived"} 2.0' in metrics
    assert 'amps_journal_maintenance_requests_total{action="remove",instance="A"} 1.0' in metrics
    # B has acknowledged nothing: its lag is every stored byte, in the metric and the tree
    stored = sum(int(s["bytes"]) for s in journals(base).values())
    assert stored > 30_000_000, stored
    (lag_line,) = [m for m in metrics.splitlines() if m.startswith("amps_replication_lag_bytes{")]
    assert float(lag_line.split()[-1]) == stored, lag_line
    dest = get(base, "/amps/instance/replication/destinations/B.json")
    assert (dest["lag_txids"], dest["lag_bytes"]) == (MESSAGES, stored)
    # the space left where journals and archives go
    disks = get(base, "/amps/host/disks.json")
    assert set(disks) == {"journal", "archive"} and disks["archive"]["path"] == str(archive)
    assert all(0 < d["free_bytes"] <= d["total_bytes"] for d in disks.values()), disks
    assert 'amps_disk_free_bytes{holds="archive",instance="A"}' in metrics

    # replay on A reads every message, from the archived files and LMDB, in order
    assert await replay_all(cluster.uri("A"), "replayer") == list(range(1, MESSAGES + 1))

    # B comes up empty: A sends it everything, from the archived files too; once B has
    # acknowledged past journal 2, A removes 1-2 by itself
    cluster.start("B")

    def removed() -> str | None:
        left = journals(base)
        if "1" in left or "2" in left:
            dest = get(base, "/amps/instance/replication/destinations/B.json")
            return f"journals 1-2 still there; B acked through txid {dest.get('acked_txid')}"
        files = sorted(p.name for p in archive.iterdir())
        return f"journals 1-2 removed but their files remain: {files}" if files else None

    await wait_until(removed, 60)
    assert await replay_all(cluster.uri("B"), "b-replayer") == list(range(1, MESSAGES + 1))
    first_kept = int(journals(base)["3"]["first_txid"])
    kept: list[int] = []
    async with (
        open_client(cluster.uri("A"), "after") as client,
        client.subscribe("orders", bookmark="0") as sub,
    ):
        msg = await sub.get(30)
        kept.append(int(msg.json()["n"]))
    assert kept == [first_kept], "replay after removal starts at the first kept message"
    # a subscriber resuming from a bookmark in a removed journal gets everything still
    # held after it (not NOW: that would skip what the journal still has)
    removed_mark = format_bookmark(publisher_hash("pub"), 5)
    async with (
        open_client(cluster.uri("A"), "resumer") as client,
        client.subscribe("orders", bookmark=removed_mark) as sub,
    ):
        assert int((await sub.get(30)).json()["n"]) == first_kept

    # B goes down having acknowledged everything so far; more is published; A restarts.
    # A remembers how far B got (saved in its journal): what B has is removable, the
    # rest waits for B.
    cluster.stop("B")
    acked = int(get(base, "/amps/instance/replication/destinations/B.json")["acked_txid"])
    assert acked == MESSAGES
    async with open_client(cluster.uri("A"), "pub") as pub:
        for n in range(MESSAGES + 1, MESSAGES + MORE + 1):
            await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
        await pub.flush(timeout=60)
    cluster.stop("A")
    cluster.start("A")
    base = admin_base(cluster)
    segs = journals(base)
    newest_sealed = sorted(map(int, segs))[-2]
    held = [s["id"] for s in segs.values() if s["last_txid"] > acked and not s["is_current"]]
    free = [s["id"] for s in segs.values() if s["last_txid"] <= acked]
    assert held and free, f"the test needs journals on both sides of txid {acked}: {segs}"
    done = admin(base, "--json", "journal", "remove", str(newest_sealed))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["done"] == free and result["pending"] == held, result
    assert result["blockers"] == [f"destination B has acknowledged through txid {acked} only"]

    # the mark survives another restart of A
    cluster.stop("A")
    cluster.start("A")
    base = admin_base(cluster)
    segs = journals(base)
    assert [int(i) for i, s in segs.items() if s["pending_removal"]] == held, segs

    cluster.start("B")

    def caught_up() -> str | None:
        left = [int(i) for i in journals(base)]
        still = [i for i in held if i in left]
        return f"journals {still} still wait for B" if still else None

    await wait_until(caught_up, 60)
    total = MESSAGES + MORE
    assert await replay_all(cluster.uri("B"), "b-again", total) == list(range(1, total + 1))
    cluster.stop_all()


def post(base: str, path: str) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", method="POST", headers={"X-AMPS-Admin": "1"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


async def test_maintenance_while_publishing_replaying_and_replicating_loses_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Every journal sealed while a publisher writes is compressed, archived and removed
    at once, while a bookmark replay reads A from the start and B replicates in sync:
    the replay and B each get every message exactly once, in order."""
    archive = tmp_path / "archive"
    add_pair(cluster, archive, sync=True)
    cluster.start_all()
    base = admin_base(cluster)
    total = 3_000  # 16 KB each: about four 10 MB journals
    pad = "p" * PAYLOAD_PAD
    published = trio.Event()
    maintained: list[int] = []
    replayed: list[int] = []

    async def publish() -> None:
        async with open_client(cluster.uri("A"), "pub") as pub:
            for n in range(1, total + 1):
                await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
            await pub.flush(timeout=120)
        published.set()

    async def maintain() -> None:
        # each journal as soon as it is sealed: compress, archive, remove; one last pass
        # once everything is published
        while True:
            last_pass = published.is_set()
            segs = await trio.to_thread.run_sync(journals, base)
            sealed = [int(k) for k, s in segs.items() if not s["is_current"]]
            fresh = [i for i in sealed if i not in maintained]
            for seg in fresh:
                for action in ("compress", "archive", "remove"):
                    path = f"/amps/administrator/transaction_log/journals/{seg}/{action}"
                    await trio.to_thread.run_sync(post, base, path)
                maintained.append(seg)
            if last_pass:
                return
            await trio.sleep(0.05)  # polling interval of this loop, not synchronisation

    async def replay() -> None:
        async with (
            open_client(cluster.uri("A"), "replayer") as client,
            client.subscribe("orders", bookmark="0") as sub,
        ):
            while len(replayed) < total:
                replayed.append(int((await sub.get(60)).json()["n"]))

    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            nursery.start_soon(maintain)
            nursery.start_soon(replay)
    print(f"journals maintained during the run: {maintained}")
    assert len(maintained) >= 3, f"only journals {maintained} were sealed during the run"
    assert replayed == list(range(1, total + 1)), "the replay lost or repeated messages"

    def removed() -> str | None:
        left = [int(i) for i in journals(base)]
        still = [i for i in maintained if i in left]
        return f"journals {still} are not removed yet" if still else None

    await wait_until(removed, 60)
    assert await replay_all(cluster.uri("B"), "b-check", total) == list(range(1, total + 1))
    first_kept = min(int(s["first_txid"]) for s in journals(base).values())
    async with (
        open_client(cluster.uri("A"), "tail") as client,
        client.subscribe("orders", bookmark="0") as sub,
    ):
        tail = [int((await sub.get(30)).json()["n"]) for _ in range(total - first_kept + 1)]
    assert tail == list(range(first_kept, total + 1))
    cluster.stop_all()
    assert_journal_sound(cluster.journal_dir("A"))


SEED = int(os.environ.get("AMPS_PY_TEST_SEED", "20261123"))


async def test_kill_9_during_journal_maintenance_loses_nothing(tmp_path: Path) -> None:
    """kill -9 at a random moment of compress, archive and remove (files being written,
    the journal table changing, LMDB records being purged), three times: after each
    restart every message still replays exactly once, in order, from wherever its
    journal lives, and the journal verifies sound."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    server = start_maintained(tmp_path, "crashy")
    pad = "p" * PAYLOAD_PAD
    try:
        async with open_client(server.uri, "pub") as pub:
            for n in range(1, MESSAGES + 1):
                await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
            await pub.flush(timeout=60)
        # nothing replicates here, so remove goes through at once: replays keep less
        kept_from = 1
        for action in ("compress", "archive", "remove"):
            ready = json.loads(server.ready_file.read_text())
            base = f"http://127.0.0.1:{ready['transports']['admin']}"
            through = max(int(k) for k, s in journals(base).items() if not s["is_current"])
            before = journals(base)
            path = f"/amps/administrator/transaction_log/journals/{through}/{action}"
            delay = rng.uniform(0.0, 0.4)
            print(f"{action} through journal {through}; kill -9 after {delay:.3f} s")
            async with trio.open_nursery() as nursery:

                async def request(path: str = path, base: str = base) -> None:
                    # the server dies while answering: any way a request can fail
                    with contextlib.suppress(OSError, http.client.HTTPException):
                        await trio.to_thread.run_sync(post, base, path)

                nursery.start_soon(request)
                await trio.sleep(delay)  # the random moment of the crash, not a wait
                server.kill()
            server.start()
            ready = json.loads(server.ready_file.read_text())
            base = f"http://127.0.0.1:{ready['transports']['admin']}"
            after = journals(base)
            print("  after restart:", {k: s["state"] for k, s in after.items()})
            if action == "remove" and set(after) != set(before):
                kept_from = min(int(s["first_txid"]) for s in after.values())
            count = MESSAGES - kept_from + 1
            async with (
                open_client(server.uri, f"check-{action}") as client,
                client.subscribe("orders", bookmark="0") as sub,
            ):
                got = [int((await sub.get(30)).json()["n"]) for _ in range(count)]
            assert got == list(range(kept_from, MESSAGES + 1)), f"after {action}"
            server.stop()
            assert_journal_sound(server.journal_dir)
            server.start()
    finally:
        server.stop()


def replace_with_directory(path: Path) -> None:
    """Put a directory where the file ``path`` was: deleting it fails, even for root."""
    path.unlink()
    path.mkdir()


async def test_a_failing_purge_is_logged_and_retried_and_the_instance_serves_on(
    tmp_path: Path,
) -> None:
    """An archived journal's file that cannot be deleted (here a directory stands in
    its place) makes the background purge fail: logged with 05-0005, counted, retried;
    publishing and replay go on."""
    server = start_maintained(tmp_path, "stubborn")
    try:
        ready = json.loads(server.ready_file.read_text())
        base = f"http://127.0.0.1:{ready['transports']['admin']}"
        pad = "p" * PAYLOAD_PAD
        async with open_client(server.uri, "pub") as pub:
            for n in range(1, 800):
                await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
            await pub.flush(timeout=60)
        assert "1" in journals(base) and not journals(base)["1"]["is_current"]
        post(base, "/amps/administrator/transaction_log/journals/1/archive")
        replace_with_directory(Path(journals(base)["1"]["file_name"]))
        post(base, "/amps/administrator/transaction_log/journals/1/remove")

        def failed() -> str | None:
            tree = get(base, "/amps/instance/transaction_log/maintenance.json")
            return None if tree["failures"] >= 1 else f"no failure counted yet: {tree}"

        await wait_until(failed, 30)
        logged = [line for line in server.log_file.read_text().splitlines() if "05-0005" in line]
        assert logged and "stubborn.0000000001.journal" in logged[0], "it names the file"
        status = admin(base, "status")
        assert "journal maintenance step(s) failed (log 05-0005)" in status.stdout, status.stdout
        async with open_client(server.uri, "after") as client:
            await client.publish_persisted("orders", b'{"n":0}', timeout=10)
            async with client.subscribe("orders", bookmark="0") as sub:
                first = int((await sub.get(30)).json()["n"])
        assert first > 1, "journal 1 is removed for readers even while its purge retries"
    finally:
        server.stop()
