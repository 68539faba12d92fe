"""Damaged journal files never take down the server or a tool, and never start over
silently.

Real journals (written by a real instance, or by ``txlog.Journal``) are damaged the
ways disks and operators damage them: ``data.mdb`` truncated (50 %, 90 %, down to its
two meta pages), emptied or deleted beside the rest of a journal, the newest record's
bytes flipped, an LMDB page's header overwritten. Then ``amps-py serve`` and the
``amps-py txlog`` tools run as real processes. Each must end with an exit status (no
SIGBUS, no abort), print one line on stderr naming the journal and the fix, show no
traceback, and leave the files as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb
import pytest
import trio
from harness import write_config
from page_damage import damage_leaf, damage_root

from amps_py.client import open_client
from txlog import Journal, Record, publisher_hash
from txlog.offline import maintain_offline

NAME = "inst"
MESSAGES = 400
#: exit statuses of a process killed by a signal (what the damage used to cause)
KILLED = {-signal.SIGBUS: "SIGBUS", -signal.SIGABRT: "SIGABRT", -signal.SIGSEGV: "SIGSEGV"}
P_LEAF = 0x02
#: the seed of the random bytes written over a page (printed by damage_leaf)
SEED = 26_06


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def amps_py(*args: str | Path) -> Done:
    run = subprocess.run(
        [sys.executable, "-m", "amps_py", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Done(run.returncode, run.stdout, run.stderr)


class Serve:
    """``amps-py serve --config CONFIG --ready-file ...`` in its own process."""

    def __init__(self, workdir: Path, *flags: str) -> None:
        self.workdir = workdir
        self.ready = workdir / "ready.json"
        self.ready.unlink(missing_ok=True)
        self.out, self.err = workdir / "serve.out", workdir / "serve.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "amps_py",
                    "serve",
                    "--config",
                    str(workdir / f"{NAME}.xml"),
                    "--ready-file",
                    str(self.ready),
                    *flags,
                ],
                cwd=workdir,
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def wait_ready_or_exit(self, timeout: float = 60) -> bool:
        """True once the instance is ready, False once it has exited."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and not self.ready.exists():
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"after {timeout} s the instance is neither ready nor gone")
            time.sleep(0.05)  # polling the two conditions above
        return self.ready.exists() and self.proc.poll() is None

    @property
    def uri(self) -> str:
        port = json.loads(self.ready.read_text())["transports"]["json-tcp"]
        return f"tcp://127.0.0.1:{port}/amps/json"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def done(self) -> Done:
        self.proc.wait(timeout=60)
        return Done(self.proc.returncode, self.out.read_text(), self.err.read_text())


def refused_start(workdir: Path) -> Done:
    """Start the instance and expect it to refuse (stop it and fail if it starts)."""
    server = Serve(workdir)
    if server.wait_ready_or_exit():
        server.stop()
        log = (workdir / f"{NAME}.log").read_text()
        raise AssertionError(f"the instance started on a damaged journal; its log:\n{log}")
    return server.done()


def assert_one_line(done: Done, *needles: str, status: int | None = None) -> str:
    """Ended by itself with a non-zero status, one line on stderr holding ``needles``,
    no traceback anywhere."""
    assert done.returncode not in KILLED, (
        f"killed by {KILLED[done.returncode]}; stderr: {done.stderr[-2000:]}"
    )
    assert done.returncode != 0, f"exit status 0; stdout: {done.stdout[-2000:]}"
    if status is not None:
        assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{done.stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in: {lines[0]}"
    return lines[0]


def snapshot(*directories: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under ``directories``: path -> sha256 of its bytes."""
    files = {}
    for directory in directories:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and path.name not in skip:
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


# ------------------------------------------------------------------------ journals
async def _publish(uri: str, count: int, first: int = 0) -> None:
    async with open_client(uri, "pub") as pub:
        seq = 0
        for i in range(first, first + count):
            seq = await pub.publish("orders", b'{"id":%d,"pad":"%s"}' % (i, b"x" * 1000))
        await pub.wait_persisted(seq, timeout=60)


@pytest.fixture(scope="module")
def server_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A journal written by a real instance: MESSAGES publishes of ~1 KB, then SIGTERM."""
    workdir = tmp_path_factory.mktemp("written")
    write_config(workdir, NAME, 0)
    server = Serve(workdir)
    assert server.wait_ready_or_exit(), server.done()
    try:
        trio.run(_publish, server.uri, MESSAGES)
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.done()
    return workdir / f"{NAME}-journal"


@pytest.fixture
def workdir(tmp_path: Path, server_journal: Path) -> Path:
    """A config (port 0) and a copy of the server-written journal in ``tmp_path``."""
    write_config(tmp_path, NAME, 0)
    shutil.copytree(server_journal, journal_of(tmp_path))
    return tmp_path


def journal_of(workdir: Path) -> Path:
    return workdir / f"{NAME}-journal"


def stored_value(journal: Path, txid: int) -> bytes:
    """The record ``txid`` as LMDB stores it (found with LMDB's own API)."""
    env = lmdb.open(str(journal), readonly=True, max_dbs=16, lock=False)
    try:
        records = env.open_db(b"records", create=False)
        with env.begin(db=records) as txn:
            value = txn.get(struct.pack(">Q", txid))
    finally:
        env.close()
    assert value is not None, f"no record {txid} in LMDB"
    return bytes(value)


def newest_txid(journal: Path) -> int:
    with Journal(journal, readonly=True) as j:
        return j.last_txid


def flip_record(journal: Path, txid: int) -> None:
    """Flip one byte in the middle of record ``txid``'s stored value, in every copy of
    it in data.mdb (LMDB's older copies of a page are unused, so only the live one
    counts, whichever it is)."""
    value = stored_value(journal, txid)
    data = bytearray((journal / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0, "the record is not stored contiguously"
    while at >= 0:
        data[at + len(value) // 2] ^= 0x20
        at = data.find(value, at + 1)
    (journal / "data.mdb").write_bytes(bytes(data))


def break_leaf_pages(journal: Path, txid: int) -> int:
    """Clear the page-type flags of every LMDB leaf page holding record ``txid`` (its
    live page among them): LMDB then reports, or asserts on, a page of the wrong type.
    Returns how many pages were damaged."""
    value = stored_value(journal, txid)
    data = bytearray((journal / "data.mdb").read_bytes())
    page_size = 4096
    damaged = 0
    for no in range(2, len(data) // page_size):
        start = no * page_size
        pgno, _pad, flags = struct.unpack_from("=QHH", data, start)
        if pgno == no and flags & P_LEAF and value in data[start : start + page_size]:
            struct.pack_into("=H", data, start + 10, 0)
            damaged += 1
    assert damaged, f"no leaf page holds record {txid}"
    (journal / "data.mdb").write_bytes(bytes(data))
    return damaged


# ------------------------------------------------------------------------ tests
@pytest.mark.parametrize("size", ["50%", "90%", "8KB"])
def test_truncated_data_mdb_is_refused_never_sigbus(workdir: Path, size: str) -> None:
    journal = journal_of(workdir)
    data = journal / "data.mdb"
    full = data.stat().st_size
    cut = 8192 if size == "8KB" else full * int(size[:-1]) // 100 // 4096 * 4096 + 100
    os.truncate(data, cut)
    before = snapshot(journal)

    line = assert_one_line(refused_start(workdir), str(journal), "data.mdb", status=1)
    assert f"data.mdb is {cut} bytes but LMDB needs {full}" in line, line
    assert "truncated" in line and "restore" in line and "--allow-empty-journal" in line, line
    for tool in (["info"], ["verify"], ["dump"], ["compress", "1"]):
        done = amps_py("txlog", tool[0], journal, *tool[1:])
        assert_one_line(done, str(journal), f"needs {full}", "Fix:", status=3)
    assert snapshot(journal) == before, "a refused start or a tool changed the journal"


@pytest.mark.parametrize("state", ["empty", "missing"])
def test_empty_or_missing_data_mdb_where_a_journal_was_is_refused(
    workdir: Path, state: str
) -> None:
    journal = journal_of(workdir)
    if state == "empty":
        os.truncate(journal / "data.mdb", 0)
    else:
        (journal / "data.mdb").unlink()
    before = snapshot(journal)

    line = assert_one_line(refused_start(workdir), str(journal), status=1)
    assert "amps-py.lock" in line and "lock.mdb" in line, "the message names what it found"
    assert ("empty (0 bytes)" if state == "empty" else "missing") in line
    assert "--allow-empty-journal" in line and "restore" in line, line
    assert snapshot(journal) == before, "a refused start changed the journal directory"
    if state == "empty":
        done = amps_py("txlog", "verify", journal)
        assert_one_line(done, str(journal), "empty (0 bytes)", status=3)
        assert snapshot(journal) == before


def test_allow_empty_journal_starts_empty_loudly_and_keeps_the_old_segment_files(
    tmp_path: Path,
) -> None:
    journal = journal_of(tmp_path)
    write_config(tmp_path, NAME, 0)
    ph = publisher_hash("pub")
    with Journal(journal, instance_name=NAME, segment_size=4_000) as j:
        for batch in range(12):
            j.append(
                [
                    Record(topic="orders", payload=b'{"n":%d}' % n, pub_hash=ph, seq=n)
                    for n in range(batch * 20 + 1, batch * 20 + 21)
                ],
                1,
            )
        maintain_offline(j, "compress", j.segments()[-2].id)
    segment_files = {p.name: p.read_bytes() for p in journal.glob("*.journal.zst")}
    assert len(segment_files) >= 2, "the journal should have compressed segment files"
    os.truncate(journal / "data.mdb", 0)
    before = snapshot(journal)

    line = assert_one_line(refused_start(tmp_path), str(journal), status=1)
    assert f"{NAME}.0000000001.journal.zst" in line, line
    assert snapshot(journal) == before

    server = Serve(tmp_path, "--allow-empty-journal")
    try:
        assert server.wait_ready_or_exit(), server.done()
        log = (tmp_path / f"{NAME}.log").read_text()
        assert "STARTED EMPTY" in log and "05-0021" in log, log
        assert "every message it held is absent" in log, log
        trio.run(_publish, server.uri, 3)
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.done()
    kept = {p.name: p.read_bytes() for p in journal.glob("discarded-*/*.journal.zst")}
    assert kept == segment_files, "the old segment files must be set aside, not lost"
    with Journal(journal, readonly=True) as j:
        assert [r.seq for r in j.iter_records()] == [1, 2, 3]


def test_a_fresh_journal_directory_starts_without_a_flag(tmp_path: Path) -> None:
    """Guard: nothing there (no journal directory at all) still starts empty."""
    write_config(tmp_path, NAME, 0)
    server = Serve(tmp_path)
    try:
        assert server.wait_ready_or_exit(), server.done()
        assert "STARTED EMPTY" not in (tmp_path / f"{NAME}.log").read_text()
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_damaged_newest_record_refuses_start_naming_the_txid(workdir: Path) -> None:
    journal = journal_of(workdir)
    last = newest_txid(journal)
    flip_record(journal, last)
    before = snapshot(journal, skip=("amps-py.lock", "lock.mdb"))

    line = assert_one_line(refused_start(workdir), str(journal), status=1)
    assert f"newest record, txid {last}, is damaged" in line, line
    assert f"amps-py txlog verify {journal}" in line and "restore" in line, line
    assert snapshot(journal, skip=("amps-py.lock", "lock.mdb")) == before
    log = (workdir / f"{NAME}.log").read_text()
    assert "05-0020" in log and f"txid {last}" in log, log

    verify = amps_py("txlog", "verify", journal)
    assert verify.returncode == 3, verify
    assert f"CORRUPT txid {last}: " in verify.stdout, verify.stdout
    dump = amps_py("txlog", "dump", journal)
    assert_one_line(dump, f"record txid {last} is corrupt", status=3)
    assert len(dump.stdout.splitlines()) == last - 1, "the sound records are still dumped"


def test_damaged_lmdb_page_is_listed_by_verify_not_a_crash(workdir: Path) -> None:
    """Random bytes (seed printed) over the live leaf that holds a middle record: which
    page that is depends on how the server batched its commits, and LMDB's words for
    the damage on what the bytes say, so only what holds for any damaged leaf is
    checked: one range of txids, holding the record, with records after it."""
    journal = journal_of(workdir)
    middle = newest_txid(journal) // 2
    damage_leaf(journal / "data.mdb", b"records", struct.pack(">Q", middle), SEED)

    verify = amps_py("txlog", "verify", journal)
    line = assert_one_line(verify, "damaged record", "Fix:", status=3)
    assert "txlog verify" not in line.split("Fix:")[1], f"the fix is not verify itself: {line}"
    found = re.findall(
        r"txids (\d+) to (\d+) unreadable: LMDB reports a damaged page", verify.stdout
    )
    assert len(found) == 1, verify.stdout
    first, last = int(found[0][0]), int(found[0][1])
    assert first <= middle <= last, verify.stdout
    assert last < newest_txid(journal), "verify goes on after the damaged page"


@pytest.mark.parametrize("database", [None, b"records"], ids=["main", "records"])
def test_a_damaged_root_page_gets_a_fix_from_verify_that_is_not_verify(
    workdir: Path, database: bytes | None
) -> None:
    """Random bytes (seed printed) over the root of the main database (LMDB cannot
    open a sub-database) or of the records (LMDB flags the read failed: MDB_BAD_TXN):
    every tool says the file is damaged in one line; the others send the user to
    verify, and verify to the repair."""
    journal = journal_of(workdir)
    damage_root(journal / "data.mdb", database, SEED)

    verify = amps_py("txlog", "verify", journal)
    print(verify.stderr)
    line = assert_one_line(verify, str(journal), "the file is damaged. Fix: restore", status=3)
    assert "txlog verify" not in line, line
    assert "--allow-empty-journal" in line, line
    for tool in ("info", "dump"):
        line = assert_one_line(amps_py("txlog", tool, journal), "the file is damaged", status=3)
        assert f"Fix: amps-py txlog verify {journal} lists the damage" in line, line


def test_damaged_newest_lmdb_page_is_one_line_from_serve_and_every_tool(
    workdir: Path,
) -> None:
    journal = journal_of(workdir)
    last = newest_txid(journal)
    break_leaf_pages(journal, last)
    before = snapshot(journal, skip=("amps-py.lock", "lock.mdb"))

    line = assert_one_line(refused_start(workdir), str(journal), status=1)
    assert "MDB_CORRUPTED" in line and "damaged" in line and "restore" in line, line
    assert snapshot(journal, skip=("amps-py.lock", "lock.mdb")) == before
    for tool in ("info", "dump"):
        assert_one_line(amps_py("txlog", tool, journal), str(journal), "MDB_CORRUPTED", status=3)
    verify = amps_py("txlog", "verify", journal)
    assert_one_line(verify, "damaged record", status=3)
    damage = [line for line in verify.stdout.splitlines() if "damaged page" in line]
    assert len(damage) == 1 and "unreadable: LMDB reports a damaged page" in damage[0], damage
    assert int(damage[0].split("txids from ")[1].split()[0]) <= last, damage
