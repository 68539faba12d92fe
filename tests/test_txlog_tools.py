"""`amps-py txlog info|dump|verify|compress|archive|remove` on a real journal with
compressed, archived and removed segments, run as real subprocesses: counts that are
true, progress on a terminal only, and a dump that a pipe may close."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

from clirun import amps_py_command, cli_env, run, run_on_terminal

from txlog import Journal, Record, publisher_hash

SEGMENT_SIZE = 20_000  # bytes of records per segment: about 60 records of ~330 bytes
PUBLISHERS = ("alice", "bob", "carol")


def make_journal(path: Path, per_publisher: int = 200) -> None:
    """Each publisher's records in a run of its own (alice: txids 1-200, bob: 201-400,
    carol: 401-600), in segments of about 60 records, so removing the oldest segments
    removes every record of alice."""
    rng = random.Random(11)
    print("seed 11")
    with Journal(path, instance_name="tools", segment_size=SEGMENT_SIZE) as journal:
        for name in PUBLISHERS:
            ph = publisher_hash(name)
            for start in range(1, per_publisher + 1, 10):
                batch = [
                    Record(
                        topic="orders",
                        payload=b'{"pad":"%s"}' % rng.randbytes(120).hex().encode(),
                        pub_hash=ph,
                        seq=seq,
                        client_name=name,
                    )
                    for seq in range(start, start + 10)
                ]
                journal.append(batch, 1_000_000 + start)


def dumped(path: Path, cwd: Path) -> list[dict[str, Any]]:
    res = run("txlog", "dump", str(path), cwd=cwd)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def info(path: Path, cwd: Path) -> dict[str, Any]:
    res = run("txlog", "info", str(path), cwd=cwd)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def assert_info_matches_dump(path: Path, cwd: Path) -> dict[str, Any]:
    """Every count `txlog info` gives equals what `txlog dump` shows the journal holds."""
    records = dumped(path, cwd)
    summary = info(path, cwd)
    assert summary["records"] == len(records)
    assert summary["first_txid"] == records[0]["txid"]
    assert summary["last_txid"] == records[-1]["txid"]
    assert summary["publishers"] == len({r["client_name"] for r in records})
    assert summary["about"] == {}
    assert summary["segments"] == len(summary["segment_table"])
    return summary


def test_info_counts_what_the_journal_holds(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    make_journal(journal)
    fresh = assert_info_matches_dump(journal, tmp_path)
    assert (fresh["records"], fresh["publishers"], fresh["publishers_known"]) == (600, 3, 3)
    # session counters of the tool's own open said nothing about the journal
    assert not {"commits", "appended", "duplicates"} & set(fresh)
    steps = (
        ("compress", "3"),
        ("archive", "5", "--archive-dir", str(tmp_path / "archive")),
        ("remove", "4"),
    )
    for step in steps:
        done = run("txlog", *step[:1], str(journal), *step[1:], cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        summary = assert_info_matches_dump(journal, tmp_path)
    # journals 1-4 (txids 1-240) removed: alice's records are all gone, her last seq
    # is still known (logon acks report it)
    assert (summary["records"], summary["first_txid"], summary["last_txid"]) == (360, 241, 600)
    assert (summary["publishers"], summary["publishers_known"]) == (2, 3)
    assert summary["segment_file_bytes"] > 0  # journal 5 lives in the archive
    assert [s["state"] for s in summary["segment_table"]][:2] == ["archived", "live"]


def test_info_says_about_while_a_removal_is_being_purged(tmp_path: Path) -> None:
    path = tmp_path / "j"
    make_journal(path)
    with Journal(path, instance_name="tools") as journal:
        journal.mark_removed(4)  # a running instance purges the rest step by step
    summary = info(path, tmp_path)
    assert summary["records"] == 360 and summary["first_txid"] == 241
    assert summary["about"]["publishers"].startswith("about: a removal is still being purged")


def test_txlog_tools_show_progress_on_a_terminal_only(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    make_journal(journal)
    code, out, screen = run_on_terminal("txlog", "verify", str(journal), cwd=tmp_path)
    assert code == 0, screen
    # the path may be shortened in the middle to leave the counts their room
    assert "verifying /" in screen and f"{journal.name} " in screen, screen
    assert "600/600" in screen, screen
    assert out == f"{journal}: OK — 600 records, txids 1..600\n"
    code, out, screen = run_on_terminal("txlog", "compress", str(journal), "2", cwd=tmp_path)
    assert code == 0, screen
    assert "compressing" in screen and "purging LMDB" in screen, screen
    assert out == "compress through journal 2: compressed journals 1, 2\n"
    archive = ["--archive-dir", str(tmp_path / "archive")]
    code, out, screen = run_on_terminal("txlog", "archive", str(journal), "3", *archive,
                                        cwd=tmp_path)  # fmt: skip
    assert code == 0, screen
    assert "archiving" in screen, screen
    # piped: the result line on stdout, nothing on stderr
    for args in (("verify", str(journal)), ("compress", str(journal), "4")):
        piped = run("txlog", *args, cwd=tmp_path)
        assert piped.returncode == 0 and piped.stderr == "", piped.stderr
        assert len(piped.stdout.splitlines()) == 1


def test_dump_into_a_reader_that_stops_ends_quietly(tmp_path: Path) -> None:
    """`amps-py txlog dump J | head -1`: no error when head stops reading."""
    journal = tmp_path / "j"
    make_journal(journal)
    proc = subprocess.Popen(
        [*amps_py_command(), "txlog", "dump", str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()  # what head does after its line
    errors = proc.stderr.read().decode()
    proc.stderr.close()
    code = proc.wait(timeout=60)
    assert first["txid"] == 1
    assert errors == "" and code == 0, (code, errors)
