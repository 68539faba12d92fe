"""An instance started while its disk is full says so, in one line, and loses nothing.

The journal of a stopped instance holds acknowledged records that only its commit log
has (the instance stopped without closing it), so opening it must write them into
LMDB; its SOW store lags behind them, so catching up must write too. With the
journal's file system full, ``amps-py serve`` refuses to start with one line naming the
journal directory, the bytes free and the fix; with the journal's room back but the SOW
store's file system full, naming the SOW store directory; once both have room it starts
with every record, in order, and the SOW holds every key.

The full disks are small tmpfs mounts (root only, as in test_journal_failures.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import trio
from harness import ServerProcess, assert_journal_sound, write_config
from test_journal_failures import small_tmpfs

from amps_py.client import open_client
from amps_py.sow.keys import SowKeyer
from txlog import Journal, Record, publisher_hash
from txlog.commitlog import log_files
from txlog.opening import FULL_DISK_MARGIN, is_full_disk

PAD = "x" * 2000
#: records published through the instance, per topic, before it stops
PUBLISHED = 100
#: records added afterwards that only the commit log holds (per topic): about 2 MB
#: each, more than LMDB's free pages, so opening must grow the files
LOGGED = 1000


def serve(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``amps-py serve`` as an operator runs it (it exits at once when it cannot start)."""
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "serve", "--config", str(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def fill(disk: Path) -> int:
    """Fill the file system of ``disk`` to the last byte with a ballast file (removed
    to make room again); returns its size."""
    ballast = disk / "ballast"
    written = 0
    with open(ballast, "wb", buffering=0) as f:
        chunk = b"\0" * (1 << 20)
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    return written


def logs_of(directory: Path) -> dict[str, str]:
    """Name -> SHA-256 of each commit log file in ``directory``: a refused start must
    leave them as they were (they hold what LMDB lacks). (``data.mdb`` itself may
    differ in pages no transaction reached: LMDB writes a commit's pages before the
    one that fails; the records it holds are checked once the instance starts.)"""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for _, p in log_files(directory)}


def add_logged_records(journal_dir: Path, name: str, scratch: Path) -> None:
    """Give the stopped instance's journal :data:`LOGGED` records per topic that only
    its commit log holds: staged (durable, acknowledged) by a writer that is then
    "killed": the directory as it was before the writer closed (copied through
    ``scratch``, on another file system) replaces it."""
    crashed = scratch / "crashed"
    pub = "late"
    keyer = SowKeyer("state", ["/id"])
    journal = Journal(journal_dir, instance_name=name)
    try:
        seq = 0
        for start in range(0, 2 * LOGGED, 50):
            batch = []
            for k in range(start, start + 50):
                seq += 1
                topic = "orders" if k % 2 else "state"
                doc = {"id": 1000 + k, "n": seq, "pad": PAD}
                batch.append(
                    Record(
                        topic=topic,
                        payload=json.dumps(doc).encode(),
                        pub_hash=publisher_hash(pub),
                        seq=seq,
                        client_name=pub,
                        origin=name,
                        # as the instance journals a SOW topic's record: with its key
                        sow_key=keyer.key_of(doc) if topic == "state" else "",
                    )
                )
            journal.stage(batch, 1_700_000_000_000_000 + seq)
        shutil.copytree(journal_dir, crashed, ignore=shutil.ignore_patterns("sow"))
    finally:
        journal.close()
    for entry in journal_dir.iterdir():
        if entry.name == "sow":
            continue
        if entry.is_dir():  # e.g. client-names: copied to `crashed` with the rest
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in crashed.iterdir():
        shutil.move(entry, journal_dir / entry.name)
    assert log_files(journal_dir), "the set-up must leave records only the commit log has"


def assert_full_disk_line(stderr: str, what: str, directory: Path, fix: str) -> int:
    """The one line of a start refused for a full disk; returns the bytes free it says."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    refusals = [line for line in lines if line.startswith("amps-py: cannot start: ")]
    # (a line before it may say what the open did first, e.g. records recovered)
    assert len(refusals) == 1 and lines[-1] == refusals[0], f"one refusal line:\n{stderr}"
    line = lines[-1]
    assert line.startswith(f"amps-py: cannot start: {what} {directory} cannot be written"), line
    assert f"no space left on device: the file system of {directory} has " in line, line
    found = re.search(r"has (\d+) bytes free", line)
    assert found, f"the bytes free are not given: {line}"
    assert "nothing stored was lost or changed" in line, line
    assert f"Fix: free space on the file system of {directory}, or move {fix}" in line, line
    return int(found.group(1))


async def test_a_start_on_a_full_disk_says_so_and_loses_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "24m") as journal_disk, small_tmpfs(tmp_path, "8m") as sow_disk:
        name = "full"
        sow_dir = sow_disk / "state-store"
        config = write_config(
            tmp_path,
            name,
            0,
            extra=(
                "<SOW><Topic><Name>state</Name><MessageType>json</MessageType><Key>/id</Key>"
                f"<FileName>{sow_dir}</FileName></Topic></SOW>"
            ),
        )
        journal_dir = journal_disk / "journal"
        text = config.read_text().replace(str(tmp_path / f"{name}-journal"), str(journal_dir))
        config.write_text(text)

        # 1. an instance stores PUBLISHED records per topic, persisted, and stops
        server = ServerProcess(config, tmp_path, 0, name).start()
        try:
            async with open_client(server.uri, "early") as pub:
                for i in range(1, 2 * PUBLISHED + 1):
                    topic = "orders" if i % 2 else "state"
                    await pub.publish_persisted(
                        topic, f'{{"id":{i % 50},"n":{i},"pad":"{PAD}"}}'.encode()
                    )
        finally:
            assert server.stop() == 0
        add_logged_records(journal_dir, name, tmp_path)

        # 2. the journal's disk is full: refused, naming the journal directory
        fill(journal_disk)
        before = logs_of(journal_dir)
        assert before, "the set-up must leave commit log files"
        refused = serve(config, tmp_path)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        free = assert_full_disk_line(
            refused.stderr,
            "the journal directory",
            journal_dir,
            "TransactionLog/JournalDirectory (the whole directory: data.mdb with its "
            "commit-*.log files) to a larger disk",
        )
        assert free < 4 * 1024 * 1024, f"{free} bytes free is not a full 24 MB disk"
        assert logs_of(journal_dir) == before, "a refused start changed the commit log"
        log_text = (tmp_path / f"{name}.log").read_text()
        assert "05-0020" in log_text and "no space left on device" in log_text
        # without LMDB's lock file too (LMDB would create it and die with SIGBUS)
        (journal_dir / "lock.mdb").unlink()
        refused = serve(config, tmp_path)
        assert refused.returncode == 1, f"exit status {refused.returncode}: {refused.stderr}"
        assert_full_disk_line(refused.stderr, "the journal directory", journal_dir, "")
        assert "lock.mdb" in refused.stderr, refused.stderr
        assert logs_of(journal_dir) == before, "a refused start changed the commit log"

        # 3. room for the journal, but the SOW store's disk is full: refused, naming it
        (journal_disk / "ballast").unlink()
        fill(sow_disk)
        refused = serve(config, tmp_path)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert_full_disk_line(
            refused.stderr,
            "the SOW store of topic 'state' in",
            sow_dir,
            "the store (SOW/Topic/FileName of topic 'state') to a larger disk",
        )
        assert not list(sow_disk.glob("*.damaged")), "a full disk is not damage"

        # 4. room everywhere: it starts with every record, in order, and the whole SOW
        (sow_disk / "ballast").unlink()
        server = ServerProcess(config, tmp_path, 0, name).start()
        try:
            async with open_client(server.uri, "checker") as checker:
                seen: list[tuple[int, int]] = []
                async with checker.subscribe(".*", bookmark="0") as replay:
                    with trio.fail_after(60):
                        while len(seen) < 2 * (PUBLISHED + LOGGED):
                            pub_hash, seq, _ = (await replay.get(30)).bookmark.split("|")
                            seen.append((int(pub_hash), int(seq)))
                        await replay.completed.wait()
                early, late = publisher_hash("early"), publisher_hash("late")
                expected_order = [(early, s) for s in range(1, 2 * PUBLISHED + 1)]
                expected_order += [(late, s) for s in range(1, 2 * LOGGED + 1)]
                assert seen == expected_order, "records lost, repeated or out of order"
                result = await checker.sow("state")
                ids = sorted(r.json()["id"] for r in result)
                # 50 keys published early (ids 0..49 of the even records) and the
                # LOGGED "state" records of the late publisher (even k: ids 1000, 1002, ...)
                expected = sorted({i % 50 for i in range(2, 2 * PUBLISHED + 1, 2)})
                expected += [1000 + k for k in range(0, 2 * LOGGED, 2)]
                assert ids == expected
        finally:
            assert server.stop() == 0
        assert_journal_sound(journal_dir)


def test_an_io_error_is_a_full_disk_only_when_the_disk_is_nearly_full() -> None:
    """LMDB reports space that ran out during write-back as an I/O error: the free
    space decides, as it does for a running instance's failed commits."""
    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    assert is_full_disk(eio, 0)
    assert is_full_disk(eio, FULL_DISK_MARGIN - 1)
    assert is_full_disk(eio, FULL_DISK_MARGIN + 10, needed=4 * 1024 * 1024)
    assert not is_full_disk(eio, 10 * FULL_DISK_MARGIN), "an I/O error on a roomy disk"
    assert not is_full_disk(eio, -1), "free space unknown: not taken for a full disk"
    assert is_full_disk(lmdb.DiskError("mdb_txn_commit: No space left on device"), 10**12)
    assert is_full_disk(OSError(errno.ENOSPC, "No space left on device"), 10**12)
    assert not is_full_disk(OSError(errno.EACCES, "Permission denied"), 0)
