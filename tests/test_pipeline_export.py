"""`amps-py pipeline export JOURNAL OUT`: journals to Parquet, read back with pyarrow.

Journals come from a real instance the tests start (published to over the wire) or,
for odd topic names, damage and many commits, from the txlog library. The export runs
as the real command in a subprocess (crashes are SIGKILLs of that process) or through
its library function. Every comparison is against what ``txlog.Journal.read`` returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import signal
import struct
import subprocess
import sys
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lmdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import trio
import trio.lowlevel
from clirun import amps_py_command, cli_env, run, run_on_terminal
from harness import ServerProcess, start_instance, wait_until_sync
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_py.client import open_client
from amps_py.pipeline.export import (
    ExportError,
    export_journal,
    exported_dataset,
    verify_export,
)
from amps_py.pipeline.export_layout import decode_name, encode_name
from amps_py.pipeline.export_manifest import instance_lock
from amps_py.pipeline.schema import ARROW_SCHEMA
from txlog import Journal, Record, publisher_hash

#: topics published over the wire (the server takes any of these)
WIRE_TOPICS = ("orders", "trades/eu", "x=y", "sp ace", "100%", "ü/ñ", "a.b.c")
#: topics only the journal library writes: every character a path might choke on
ODD_TOPICS = (
    "a/b", "..", ".", "_hidden", ".dot", "x=y", "100%", "%2F", "q?*:\"<>|\\", "tab\there",
    "line\nbreak", "nul\x00byte", "日本/東京", "~tilde", "plus+sign", "#hash&amp;",
    "__HIVE_DEFAULT_PARTITION__", "topic=orders", "  ", "ü",
)  # fmt: skip
DAY_US = 86_400_000_000
T0 = 1_790_000_000_000_000  # 2026-09-21, µs


# ------------------------------------------------------------------ journals
async def publish(uri: str, client: str, count: int, first: int = 0) -> None:
    """``count`` JSON messages spread over :data:`WIRE_TOPICS`, waited for until
    persisted."""
    async with open_client(uri, client) as pub:
        for n in range(first, first + count):
            topic = WIRE_TOPICS[n % len(WIRE_TOPICS)]
            await pub.publish(topic, json.dumps({"n": n, "pad": "p" * (n % 97)}))
        await pub.flush(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real instance with 1,500 messages on :data:`WIRE_TOPICS` in its journal."""
    inst = start_instance(tmp_path_factory.mktemp("instance"), "inst")
    try:
        trio.run(publish, inst.uri, "pub", 1_500)
        yield inst
    finally:
        inst.stop()


def library_journal(
    path: Path,
    name: str,
    count: int,
    topics: tuple[str, ...] = ("orders",),
    *,
    seed: int = 7,
    publisher: str = "pub",
    segment_size: int = 1024**3,
) -> None:
    """``count`` records of instance ``name`` on ``topics`` (picked at random, seeded)
    from ``publisher``, local timestamps over about four days; appended after what
    ``path`` holds."""
    rng = random.Random(seed)
    print(f"journal {path}: seed {seed}")
    with Journal(
        path, instance_name=name, durability="page-cache", segment_size=segment_size
    ) as journal:
        ph = publisher_hash(publisher)
        seq = journal.publisher_last_seq(ph)
        for start in range(0, count, 100):
            batch = [
                Record(
                    topic=rng.choice(topics),
                    payload=b'{"seq":%d,"pad":"%s"}'
                    % (seq + i, rng.randbytes(i % 60).hex().encode()),
                    pub_hash=ph,
                    seq=seq + i,
                    client_name=publisher,
                    correlation_id=f"c{seq + i}",
                )
                for i in range(start + 1, min(count, start + 100) + 1)
            ]
            journal.append(batch, T0 + (seq + start) * (4 * DAY_US // max(count, 1)))


def journal_records(path: Path, through: int | None = None) -> list[Record]:
    with Journal(path, readonly=True) as journal:
        return journal.read(0, 10**9, through)


# ------------------------------------------------------------------ reading back
def exported(out: Path) -> pa.Table:
    """Every row in ``out`` as pyarrow reads the directory (date from the partition
    directories), in txid order."""
    table = exported_dataset(out).to_table()
    return table.sort_by([("instance", "ascending"), ("txid", "ascending")])


def assert_rows_are(table: pa.Table, records: list[Record], instance: str) -> None:
    """``table`` holds exactly ``records``: same count, and field by field the same
    values (bookmarks, payload bytes, timestamps, the partition columns)."""
    rows = table.to_pylist()
    assert len(rows) == len(records), f"{len(rows)} rows exported, the journal has {len(records)}"
    txids = table.column("txid").to_pylist()
    assert len(set(txids)) == len(txids), "a txid is exported twice"
    local = table.column("local_ts").cast(pa.int64()).to_pylist()
    origin = table.column("origin_ts").cast(pa.int64()).to_pylist()
    for row, rec, local_us, origin_us in zip(rows, records, local, origin, strict=True):
        expected = {
            "instance": instance,
            "txid": rec.txid,
            "bookmark": rec.bookmark,
            "publisher_hash": str(rec.pub_hash),
            "seq": rec.seq,
            "client_name": rec.client_name,
            "origin": rec.origin,
            "origin_txid": rec.origin_txid,
            "topic": rec.topic,
            "message_type": rec.message_type,
            "sow_key": rec.sow_key,
            "correlation_id": rec.correlation_id,
            "flags": rec.flags,
            "payload": rec.payload,
        }
        got = {key: row[key] for key in expected}
        assert got == expected, f"txid {rec.txid}"
        assert (local_us, origin_us) == (rec.local_ts, rec.origin_ts), f"txid {rec.txid}"
        assert row["date"].isoformat() == utc_day(rec.local_ts), f"txid {rec.txid}"


def utc_day(ts_us: int) -> str:
    return datetime.fromtimestamp(ts_us // 1_000_000, UTC).date().isoformat()


def manifest(out: Path, instance: str) -> dict[str, Any]:
    path = out / "_manifests" / encode_name(instance) / "export.json"
    return dict(json.loads(path.read_text()))


def export_cli(journal: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run("pipeline", "export", str(journal), str(out), *args, cwd=out.parent, timeout=120)


def data_files(out: Path) -> set[str]:
    """The published data files in ``out`` (not hidden ones)."""
    return {str(p.relative_to(out)) for p in out.glob("date=*/part-*")}


# ------------------------------------------------------------------ tests
def test_export_of_a_real_journal_reads_back_to_exactly_its_records(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = export_cli(server.journal_dir, out)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # piped: no progress bar, one summary line
    last = manifest(out, "inst")["last_txid"]
    assert done.stdout.startswith(f"exported {last:,} records of instance inst (txids 1..{last})")
    assert len(done.stdout.splitlines()) == 1
    records = journal_records(server.journal_dir, last)
    assert len(records) >= 1_500 and records[-1].txid == last
    assert_rows_are(exported(out), records, "inst")
    # the layout: one directory per UTC date, files named by instance and txids
    files = data_files(out)
    assert {f.split("/")[0] for f in files} == {f"date={utc_day(r.local_ts)}" for r in records}
    assert all(f.split("/")[1].startswith("part-inst-") for f in files), files
    # every file alone is a zstd Parquet file of the schema's columns, topic included,
    # in topic and txid order with a row group per topic (its statistics name it)
    topics: set[str] = set()
    for f in files:
        parquet = pq.ParquetFile(out / f)
        assert parquet.schema_arrow.names == ARROW_SCHEMA.names
        table = parquet.read()
        keys = list(
            zip(table.column("topic").to_pylist(), table.column("txid").to_pylist(), strict=True)
        )
        assert keys == sorted(keys)
        meta = parquet.metadata
        topic_column = ARROW_SCHEMA.get_field_index("topic")
        for group in range(meta.num_row_groups):
            assert meta.row_group(group).column(0).compression == "ZSTD"
            stats = meta.row_group(group).column(topic_column).statistics
            assert stats.min == stats.max
        assert meta.num_row_groups == len(set(table.column("topic").to_pylist()))
        topics.update(table.column("topic").to_pylist())
    assert topics == set(WIRE_TOPICS)
    assert verify_export(out) == []


def test_a_second_export_holds_only_the_new_records(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = export_cli(server.journal_dir, out)
    assert first.returncode == 0, first.stderr
    before = data_files(out)
    through = manifest(out, "inst")["last_txid"]
    trio.run(publish, server.uri, "pub-more", 700, 100_000)
    second = export_cli(server.journal_dir, out)
    assert second.returncode == 0, second.stderr
    assert f"(txids {through + 1}.." in second.stdout
    new_files = data_files(out) - before
    assert new_files and before <= data_files(out)
    new_rows = pa.concat_tables(pq.read_table(out / f) for f in sorted(new_files))
    new_txids = sorted(new_rows.column("txid").to_pylist())
    last = manifest(out, "inst")["last_txid"]
    assert new_txids == list(range(through + 1, last + 1)), "only the new records, each once"
    # the union is the whole journal, nothing twice
    assert_rows_are(exported(out), journal_records(server.journal_dir, last), "inst")
    # and a third run finds nothing new (and writes nothing)
    third = export_cli(server.journal_dir, out)
    assert third.returncode == 0 and third.stdout.startswith("nothing new to export"), third.stdout
    assert len(manifest(out, "inst")["runs"]) == 2
    runs = sorted((out / "_manifests" / "inst").glob("run-*.json"))
    assert [json.loads(r.read_text())["through_txid"] for r in runs] == [through, last]
    assert verify_export(out) == []


async def test_export_while_the_instance_keeps_writing(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    publishing = trio.Event()
    stop = trio.Event()
    sent = 0

    async def keep_publishing() -> None:
        nonlocal sent
        async with open_client(server.uri, "live-pub") as pub:
            while not stop.is_set():
                await pub.publish("orders", json.dumps({"live": sent}))
                sent += 1
                if sent == 200:
                    await pub.flush()
                    publishing.set()
                if sent % 100 == 0:
                    await trio.lowlevel.checkpoint()
            await pub.flush(timeout=60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_publishing)
        await publishing.wait()
        with Journal(server.journal_dir, readonly=True) as journal:
            at_start = journal.last_txid
        done = await trio.to_thread.run_sync(export_cli, server.journal_dir, out)
        assert done.returncode == 0, done.stderr
        exported_through = manifest(out, "inst")["last_txid"]
        # the instance went on writing during and after the run

        def wrote_more() -> str | None:
            with Journal(server.journal_dir, readonly=True) as journal:
                if journal.last_txid > exported_through:
                    return None
                return f"the journal ends at {journal.last_txid}, the export at {exported_through}"

        await trio.to_thread.run_sync(wait_until_sync, wrote_more, 30)
        stop.set()
    assert exported_through >= at_start, "the export stopped before the records it saw at start"
    assert_rows_are(exported(out), journal_records(server.journal_dir, exported_through), "inst")
    # the next run takes the rest: the whole journal, each record once
    again = export_cli(server.journal_dir, out)
    assert again.returncode == 0, again.stderr
    everything = journal_records(server.journal_dir)
    assert manifest(out, "inst")["last_txid"] == everything[-1].txid
    assert_rows_are(exported(out), everything, "inst")
    assert verify_export(out) == []


def readers_txids(out: Path) -> dict[str, list[int]]:
    """The txids each reader of the directory sees, sorted: pyarrow's dataset,
    ``pq.read_table`` and ``pq.ParquetDataset`` (warnings are errors) and DuckDB's
    ``read_parquet`` of ``**/*.parquet``."""
    import duckdb

    if not data_files(out):
        return {"dataset": [], "read_table": [], "ParquetDataset": [], "duckdb": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = {
            "dataset": exported(out).column("txid").to_pylist(),
            "read_table": pq.read_table(out).column("txid").to_pylist(),
            "ParquetDataset": pq.ParquetDataset(out).read().column("txid").to_pylist(),
        }
    rows = duckdb.sql(
        f"select txid from read_parquet('{out}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()
    seen["duckdb"] = [txid for (txid,) in rows]
    return {name: sorted(txids) for name, txids in seen.items()}


def kill_at(proc: subprocess.Popen[bytes], out: Path, more: int, staged: bool) -> bool:
    """SIGKILL ``proc`` once ``more`` data files were published in ``out`` and then,
    when ``staged``, once a commit's file is being written or is committed and not
    published yet (a hidden ``.part-...tmp`` exists); polled every millisecond.
    Returns whether it was still running then."""
    seen = len(data_files(out))

    def published() -> str | None:
        if proc.poll() is not None:
            return None  # it finished first: nothing left to kill
        now = len(data_files(out))
        return None if now >= seen + more else f"{now - seen} of {more} new files"

    def staging() -> str | None:
        if proc.poll() is not None or any(out.glob("date=*/.part-*.tmp")):
            return None
        return "no commit under way"

    wait_until_sync(published, 60, interval=0.001)
    if staged:
        wait_until_sync(staging, 60, interval=0.001)
    running = proc.poll() is None
    if running:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return running


def test_export_killed_at_random_moments_readers_never_see_past_the_manifest(
    tmp_path: Path,
) -> None:
    """After a kill at any moment, every reader of the directory sees exactly the
    records the manifest commits (through its last_txid), except a file the manifest
    lists whose rename the kill beat (it is there under its hidden name; the next run
    publishes it); a rerun completes the export."""
    seed = 20261128
    rng = random.Random(seed)
    print(f"seed {seed}")
    journal = tmp_path / "journal"
    library_journal(journal, "crashy", 8_000, ("orders", "trades", "a/b", "x=y"), seed=seed)
    out = tmp_path / "out"
    command = [*amps_py_command(), "pipeline", "export", str(journal), str(out)]
    command += ["--batch-rows", "250"]
    killed_mid_run = inside_commit = unpublished = 0
    for round_ in range(8):
        more, staged = rng.randint(0, 4), rng.random() < 0.75
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env()
        )
        if kill_at(proc, out, more, staged):
            killed_mid_run += 1
        path = out / "_manifests" / "crashy" / "export.json"
        doc = manifest(out, "crashy") if path.exists() else {"files": [], "last_txid": 0}
        listed = {f["path"]: f for f in doc["files"]}
        staged_now = {str(p.relative_to(out)) for p in out.glob("date=*/.part-*.tmp")}
        inside_commit += bool(staged_now)
        waiting = {
            p for p in listed if not (out / p).exists() and
            str(Path(p).with_name(f".{Path(p).name}.tmp")) in staged_now
        }  # fmt: skip
        unpublished += len(waiting)
        assert set(listed) - waiting == data_files(out), f"round {round_}"
        expected = sorted(
            txid
            for p, f in listed.items()
            if p not in waiting
            for txid in range(f["first_txid"], f["last_txid"] + 1)
        )
        if not waiting:  # the manifest's files are the records 1..last_txid
            assert expected == list(range(1, doc["last_txid"] + 1)), f"round {round_}"
        seen = readers_txids(out)
        print(f"round {round_}: {more} more file(s), staged {staged}, exit {proc.returncode}, "
              f"manifest through {doc['last_txid']}, {len(staged_now)} hidden file(s), "
              f"{len(waiting)} committed and not published, readers see "
              f"{len(seen['duckdb'])} rows")  # fmt: skip
        for reader, txids in seen.items():
            assert txids == expected, f"round {round_}: {reader} sees other rows"
    assert killed_mid_run == 8, "the export ended before a kill: make the journal larger"
    assert inside_commit, "no kill landed inside a commit (a hidden file left)"
    print(f"{inside_commit} kill(s) inside a commit, {unpublished} file(s) left unpublished")
    done = subprocess.run(command, capture_output=True, text=True, env=cli_env(), check=False)
    assert done.returncode == 0, done.stderr
    print(done.stdout, done.stderr)
    assert not list(out.glob("**/.part-*")), "a hidden file is left"
    everything = journal_records(journal)
    assert_rows_are(exported(out), everything, "crashy")
    for reader, txids in readers_txids(out).items():
        assert txids == [r.txid for r in everything], reader
    assert verify_export(out) == []


def test_a_file_committed_and_not_published_is_published_by_the_next_run(
    tmp_path: Path,
) -> None:
    """The moment between the manifest listing a file and its rename, made by hand:
    readers see the records before it, --verify names it, the next run publishes it
    (its bytes checked) and exports the rest."""
    journal = tmp_path / "journal"
    library_journal(journal, "late", 1_000, ("orders", "trades"))
    out = tmp_path / "out"
    assert export_journal(journal, out, batch_rows=400).rows == 1_000
    doc = manifest(out, "late")
    last = out / doc["files"][-1]["path"]
    hidden = last.with_name(f".{last.name}.tmp")
    last.rename(hidden)  # what a kill just before the rename leaves
    assert readers_txids(out)["read_table"] == list(range(1, doc["files"][-1]["first_txid"]))
    problems = verify_export(out)
    assert len(problems) == 1 and "committed, not published yet" in problems[0], problems
    library_journal(journal, "late", 100, ("orders",), seed=9)
    done = export_cli(journal, out, "--verify")
    assert done.returncode == 0, done.stderr
    assert "published 1 file(s) an interrupted export had committed" in done.stderr
    assert last.exists() and not hidden.exists()
    assert readers_txids(out)["duckdb"] == list(range(1, 1_101))
    # a hidden file whose bytes are not those listed is not published: deleted, and
    # the file listed stays missing (--verify names it)
    doc = manifest(out, "late")
    last = out / doc["files"][-1]["path"]
    hidden = last.with_name(f".{last.name}.tmp")
    hidden.write_bytes(last.read_bytes()[:-1])
    last.unlink()
    done = export_cli(journal, out, "--verify")
    assert "deleted 1 file(s)" in done.stderr and not hidden.exists()
    assert done.returncode == 3 and "cannot be read" in done.stdout, done.stdout


def test_topic_names_with_any_characters_round_trip(tmp_path: Path) -> None:
    """Topics are only in the files (no directory is named after one), so any topic,
    of any length, is exported as it is."""
    journal = tmp_path / "journal"
    long_topic = "long/" + "x" * 300
    library_journal(journal, "odd", 2_000, (*ODD_TOPICS, long_topic))
    out = tmp_path / "out"
    result = export_journal(journal, out)
    assert result.rows == 2_000
    table = exported(out)
    assert set(table.column("topic").to_pylist()) == {*ODD_TOPICS, long_topic}
    assert_rows_are(table, journal_records(journal), "odd")
    assert {p.name.split("=")[0] for p in out.iterdir()} == {"date", "_manifests"}
    assert verify_export(out) == []
    # the option that renamed long topics' directories is accepted, and changes nothing
    library_journal(journal, "odd", 100, (long_topic,), seed=5)
    done = export_cli(journal, out, "--shorten-long-topics")
    assert done.returncode == 0, done.stderr
    assert_rows_are(exported(out), journal_records(journal), "odd")


@settings(derandomize=True, max_examples=300, database=None, deadline=None)
@given(st.text())
def test_instance_names_in_file_names_decode_back_exactly(name: str) -> None:
    """Any instance name is one path component that percent-decodes (as readers do)
    back to it."""
    encoded = encode_name(name)
    assert "/" not in encoded and "\x00" not in encoded
    assert decode_name(encoded) == name
    assert urllib.parse.unquote(encoded, errors="strict") == name


def rows_digest(table: pa.Table) -> str:
    """The manifest's row checksum of a file, computed here from its rows (the
    definition in amps_py/pipeline/export_manifest.py)."""
    digest = hashlib.sha256()
    for txid in table.column("txid").to_pylist():
        digest.update(struct.pack("<q", txid))
    for bookmark in table.column("bookmark").to_pylist():
        digest.update(bookmark.encode())
    return digest.hexdigest()


def test_manifest_checksums_verify_and_tampering_is_named(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    library_journal(journal, "sums", 3_000, ("orders", "trades", "x/y"))
    out = tmp_path / "out"
    done = export_cli(journal, out, "--batch-rows", "1000", "--verify")
    assert done.returncode == 0, done.stderr
    assert "verified:" in done.stdout
    doc = manifest(out, "sums")
    assert (doc["rows"], doc["first_txid"], doc["last_txid"]) == (3_000, 1, 3_000)
    total = 0
    for f in doc["files"]:
        data = (out / f["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (f["bytes"], f["sha256"])
        table = pq.read_table(out / f["path"])
        assert table.num_rows == f["rows"] and rows_digest(table) == f["rows_sha256"]
        total += int(f["rows_sha256"], 16)
    assert f"{total % (1 << 256):064x}" == doc["rows_checksum"]
    (run_doc,) = [json.loads(p.read_text()) for p in (out / "_manifests" / "sums").glob("run-*")]
    assert run_doc["rows_checksum"] == doc["rows_checksum"] and run_doc["rows"] == 3_000

    victim, other = doc["files"][0], doc["files"][1]
    # a row dropped (file rewritten)
    table = pq.read_table(out / victim["path"])
    pq.write_table(table.slice(1), out / victim["path"], compression="zstd")
    problems = verify_export(out)
    assert any(victim["path"] in p and "not those written" in p for p in problems), problems
    # a file copied in under another name: its rows would be read twice
    stray = (out / other["path"]).with_name("part-sums-000000999990-000000999999.parquet")
    shutil.copy(out / other["path"], stray)
    problems = verify_export(out)
    assert any(str(stray.relative_to(out)) in p and "does not list" in p for p in problems)
    # a file gone
    (out / other["path"]).unlink()
    problems = verify_export(out)
    assert any(other["path"] in p and "cannot be read" in p for p in problems), problems
    checked = export_cli(journal, out, "--verify")
    assert checked.returncode == 3 and "problem(s) in the export of sums" in checked.stderr


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """The bar shows the counts on a 120-column terminal however long the path (a
    long one, as pytest-xdist's temporary paths, once squeezed them to ``3000/…``)."""
    journal = tmp_path / ("long-directory-name-" * 6) / "journal"
    library_journal(journal, "bar", 3_000)
    code, out, screen = run_on_terminal(
        "pipeline", "export", str(journal), str(tmp_path / "tty"), cwd=tmp_path
    )
    assert code == 0, screen
    assert "exporting /" in screen and "3000/3000" in screen, screen
    assert out.startswith("exported 3,000 records") and len(out.splitlines()) == 1
    piped = export_cli(journal, tmp_path / "piped")
    assert piped.returncode == 0 and piped.stderr == ""
    assert piped.stdout.startswith("exported 3,000 records") and len(piped.stdout.splitlines()) == 1


def test_the_plain_script_exports_like_the_command(tmp_path: Path) -> None:
    """tools/pipeline/export.py runs with plain Python (no spark-submit)."""
    journal = tmp_path / "journal"
    library_journal(journal, "script", 500)
    script = Path(__file__).resolve().parents[1] / "tools" / "pipeline" / "export.py"
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(script), str(journal), str(out), "--verify"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("exported 500 records of instance script")
    assert_rows_are(exported(out), journal_records(journal), "script")


def damage_record(journal: Path, txid: int) -> None:
    """Flip a byte in the middle of record ``txid`` where data.mdb stores it."""
    env = lmdb.open(str(journal), readonly=True, max_dbs=16, lock=False)
    try:
        with env.begin(db=env.open_db(b"records", create=False)) as txn:
            value = bytes(txn.get(struct.pack(">Q", txid)))
    finally:
        env.close()
    data = bytearray((journal / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0
    while at >= 0:
        data[at + len(value) // 2] ^= 0x20
        at = data.find(value, at + 1)
    (journal / "data.mdb").write_bytes(bytes(data))


def test_a_damaged_record_stops_the_export_naming_its_txid(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    library_journal(journal, "hurt", 1_000, ("orders", "trades"))
    damage_record(journal, 640)
    out = tmp_path / "out"
    for attempt in range(2):  # never skipped, however often it runs
        done = export_cli(journal, out, "--batch-rows", "250")
        assert done.returncode == 3, (attempt, done.stdout, done.stderr)
        assert "record txid 640 is damaged" in done.stderr
        assert "holds every record through txid 639" in done.stderr
        assert "amps-py txlog verify" in done.stderr
        assert manifest(out, "hurt")["last_txid"] == 639
        txids = exported(out).column("txid").to_pylist()
        assert txids == list(range(1, 640)), "the export holds the records before the damage"
    runs = [json.loads(p.read_text()) for p in sorted((out / "_manifests" / "hurt").glob("run-*"))]
    assert runs[0]["stopped"].startswith("damaged record at txid 640")
    assert verify_export(out) == []


def test_compressed_journals_are_exported_and_removed_ones_are_named(tmp_path: Path) -> None:
    """Journal housekeeping: records in compressed segment files are exported like any;
    records removed before any export held them are named (warning, manifest), never
    skipped in silence."""
    journal = tmp_path / "journal"
    library_journal(journal, "kept", 300, ("orders", "trades"), segment_size=20_000)
    out = tmp_path / "out"
    assert export_cli(journal, out).returncode == 0
    library_journal(journal, "kept", 700, ("orders",), seed=8, segment_size=20_000)
    with Journal(journal, readonly=True) as j:
        segments = j.segments()
    removed = next(seg for seg in segments if seg.first_txid <= 450 <= seg.last_txid)
    compressed = next(seg for seg in segments if seg.id == removed.id + 1)
    done = run("txlog", "compress", str(journal), str(compressed.id), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with Journal(journal, instance_name="kept", segment_size=20_000) as j:
        j.mark_removed(removed.id)
    done = export_cli(journal, out)
    assert done.returncode == 0, done.stderr
    gone = (301, removed.last_txid)
    assert f"txids {gone[0]}..{gone[1]} were removed from the journal before any export" in (
        done.stderr
    )
    assert manifest(out, "kept")["removed_before_export"] == [list(gone)]
    txids = exported(out).column("txid").to_pylist()
    assert txids == [*range(1, 301), *range(removed.last_txid + 1, 1001)]
    held = [r for r in journal_records(journal) if r.txid > removed.last_txid]
    assert_rows_are(exported(out).slice(300), held, "kept")
    assert verify_export(out) == []


def test_several_instances_share_one_export_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for name, count in (("alpha", 900), ("beta", 600)):
        library_journal(tmp_path / name, name, count, ("orders", "trades"), seed=len(name))
        assert export_journal(tmp_path / name, out).rows == count
    library_journal(tmp_path / "alpha", "alpha", 100, ("orders",), seed=99)
    assert export_journal(tmp_path / "alpha", out).rows == 100
    assert export_journal(tmp_path / "beta", out).rows == 0
    table = exported(out)
    for name in ("alpha", "beta"):
        mine = table.filter(pc.equal(table.column("instance"), name))
        assert_rows_are(mine, journal_records(tmp_path / name), name)
    names = {Path(f).name.split("-")[1] for f in data_files(out)}
    assert names == {"alpha", "beta"}
    assert verify_export(out) == []
    # another journal of the same name does not go into alpha's export
    library_journal(tmp_path / "impostor", "alpha", 2_000, seed=3, publisher="other")
    with pytest.raises(ExportError, match="another journal of that name"):
        export_journal(tmp_path / "impostor", out)
    library_journal(tmp_path / "short", "alpha", 10, seed=4)
    with pytest.raises(ExportError, match="another \\(or a restored\\) journal"):
        export_journal(tmp_path / "short", out)


def test_a_second_export_of_the_same_instance_at_once_is_refused(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    library_journal(journal, "busy", 100)
    out = tmp_path / "out"
    lock_dir = out / "_manifests" / "busy"
    lock_dir.mkdir(parents=True)
    with instance_lock(lock_dir, "busy"):  # what a running export holds
        done = export_cli(journal, out)
    assert done.returncode == 2
    assert "another export of instance 'busy'" in done.stderr and "is running" in done.stderr
    assert export_cli(journal, out).returncode == 0


# ------------------------------------------------------------------ readers
def old_layout_export(out: Path, records: pa.Table) -> None:
    """What the previous export wrote (format amps-py-export-1): ``topic=...``
    directories with the topic column in the files too, and its manifest."""
    for topic in set(records.column("topic").to_pylist()):
        if len(encode_name(topic)) > 200:
            continue  # it renamed those: not needed here
        rows = records.filter(pc.equal(records.column("topic"), topic))
        directory = out / f"topic={encode_name(topic)}" / "date=2026-09-21"
        directory.mkdir(parents=True)
        pq.write_table(rows, directory / "part-old-000000000001-000000000009.parquet")
    (out / "_manifests" / "old").mkdir(parents=True)
    (out / "_manifests" / "old" / "export.json").write_text(
        json.dumps({"format": "amps-py-export-1", "instance": "old", "files": []}, indent=1)
    )


@contextlib.contextmanager
def spark_log(spark: Any) -> Iterator[Callable[[], str]]:
    """What Spark's driver logs (WARN and above, the session's level) while the block
    runs: a log4j appender writing into a string, read by the function yielded."""
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    writer = jvm.java.io.StringWriter()
    layout = log4j.core.layout.PatternLayout.createDefaultLayout()
    name = f"test-capture-{id(writer)}"
    appender = log4j.core.appender.WriterAppender.createAppender(
        layout, None, writer, name, False, True
    )
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    try:
        yield lambda: str(writer.toString())
    finally:
        config.getRootLogger().removeAppender(name)
        context.updateLoggers()
        appender.stop()


def test_pyarrow_duckdb_and_spark_read_the_export_whole(tmp_path: Path, spark: Any) -> None:
    """Each reader reads the whole directory with no error or warning, every record
    once, with its topic; Spark prunes dates by directory. The same readers fail or
    warn on the previous layout (so these checks would see it)."""
    from amps_py.pipeline.sources import read_export

    topics = ("orders", "trades/eu", "x=y", "long/" + "y" * 300)
    for name, count in (("alpha", 1_500), ("beta", 700)):
        library_journal(tmp_path / name, name, count, topics, seed=len(name))
        assert export_journal(tmp_path / name, tmp_path / "out", batch_rows=300).rows == count
    out = tmp_path / "out"
    records = {(r.txid, r.topic) for r in journal_records(tmp_path / "alpha")}
    expected = sorted(
        [("alpha", *r) for r in records]
        + [("beta", r.txid, r.topic) for r in journal_records(tmp_path / "beta")]
    )
    assert len(expected) == 2_200

    def keys(table: pa.Table) -> list[tuple[str, int, str]]:
        columns = [table.column(c).to_pylist() for c in ("instance", "txid", "topic")]
        return sorted(zip(*columns, strict=True))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keys(pq.read_table(out)) == expected
        assert keys(pq.ParquetDataset(out).read()) == expected
    import duckdb

    for hive in ("true", "false"):
        rows = duckdb.sql(
            f"select instance, txid, topic from read_parquet('{out}/**/*.parquet', "
            f"hive_partitioning={hive})"
        ).fetchall()
        assert sorted(rows) == expected, hive
    days = duckdb.sql(
        f"select count(distinct date) from read_parquet('{out}/**/*.parquet', "
        "hive_partitioning=true)"
    ).fetchall()
    assert days[0][0] >= 4  # about four days of local timestamps

    with spark_log(spark) as logged:
        spark.read.parquet(str(out)).count()
        assert "COLUMN_ALREADY_EXISTS" not in logged() and "WARN" not in logged(), logged()
    df = spark.read.parquet(str(out))
    assert sorted(df.columns) == sorted([*ARROW_SCHEMA.names, "date"])
    got = sorted(
        (r.instance, r.txid, r.topic) for r in df.select("instance", "txid", "topic").collect()
    )
    assert got == expected
    first_day = min(f["date"] for f in manifest(out, "alpha")["files"])
    on_first_day = df.where(f"date = '{first_day}'")
    assert (
        "PartitionFilters: [isnotnull(date"
        in on_first_day._jdf.queryExecution().executedPlan().toString()
    )
    assert on_first_day.count() == sum(
        1 for r in journal_records(tmp_path / "alpha") + journal_records(tmp_path / "beta")
        if utc_day(r.local_ts) == first_day
    )  # fmt: skip
    assert read_export(spark, out, "beta").columns == ARROW_SCHEMA.names
    assert read_export(spark, out, "beta").count() == 700

    # the previous layout: pyarrow refuses it, Spark warns (seen in the same capture)
    old = tmp_path / "old"
    old_layout_export(old, exported(out).drop_columns(["date"]))
    with pytest.raises(pa.ArrowTypeError, match="topic"):
        pq.read_table(old)
    with spark_log(spark) as logged:
        spark.read.parquet(str(old)).count()
        assert "COLUMN_ALREADY_EXISTS" in logged(), logged()
    with pytest.raises(ValueError, match="previous layout"):
        read_export(spark, old)
    from amps_py.pipeline.stats import StatsError, StatsRequest, journal_stats

    with pytest.raises(StatsError, match="export into a new, empty directory"):
        journal_stats(spark, StatsRequest((str(old),)))
    assert journal_stats(spark, StatsRequest((str(out),)))["topics"], "stats of the export"


def test_an_export_in_the_previous_layout_is_refused_naming_the_fix(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    library_journal(journal, "old", 300)
    out = tmp_path / "out"
    old_layout_export(out, exported_table_of(journal))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    done = export_cli(journal, out)
    assert done.returncode == 2, done.stderr
    assert "holds an export in the previous layout" in done.stderr
    assert "export into a new, empty directory" in done.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before, "it wrote nothing"
    problems = verify_export(out)
    assert len(problems) == 1 and "previous layout" in problems[0], problems
    from amps_py.pipeline.audit import AuditError, find_journals

    with pytest.raises(AuditError, match="previous layout"):
        find_journals([out])
    # the fix the message names works
    fresh = tmp_path / "fresh"
    assert export_cli(journal, fresh).returncode == 0
    assert_rows_are(exported(fresh), journal_records(journal), "old")


def exported_table_of(journal: Path) -> pa.Table:
    """The journal's records as Arrow rows (exported to a scratch directory)."""
    scratch = journal.parent / "scratch-export"
    export_journal(journal, scratch)
    return exported(scratch).drop_columns(["date"])


# ------------------------------------------------------------------ several journals
def add_stores(journal: Path) -> None:
    """LMDB stores of their own inside a journal directory, as a running instance
    keeps them (SOW, queue checkpoints, client names): not journals."""
    for store in ("sow/orders", "queues", "client-names"):
        (journal / store).mkdir(parents=True)
        env = lmdb.open(str(journal / store), map_size=1 << 20)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        env.close()


def test_export_of_a_directory_holding_several_journals(tmp_path: Path) -> None:
    """`pipeline export ./amps-data OUT`, as the hot-hot walkthrough lays journals
    out: each instance's journal is exported into OUT under its own name."""
    data = tmp_path / "amps-data"
    for name, count in (("amps-a", 800), ("amps-b", 500)):
        library_journal(data / name, name, count, ("orders", "trades"), seed=len(name) + count)
        add_stores(data / name)
    out = tmp_path / "export"
    done = run("pipeline", "export", "./amps-data", "./export", "--verify", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" records of instance ")[1].split()[0] for line in lines
            if line.startswith("exported ")] == ["amps-a", "amps-b"]  # fmt: skip
    assert sum(line.startswith("verified: ") for line in lines) == 2
    table = exported(out)
    for name in ("amps-a", "amps-b"):
        mine = table.filter(pc.equal(table.column("instance"), name))
        assert_rows_are(mine, journal_records(data / name), name)
    assert sorted(p.name for p in (out / "_manifests").iterdir()) == ["amps-a", "amps-b"]
    # again: nothing new for either
    again = run("pipeline", "export", "./amps-data", "./export", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("nothing new to export") == 2
    # --instance names one journal's export: refused for several
    renamed = run("pipeline", "export", "./amps-data", "./x", "--instance", "z", cwd=tmp_path)
    assert renamed.returncode == 2 and "holds 2 journals" in renamed.stderr
    # a directory holding none says so
    (tmp_path / "empty").mkdir()
    none = run("pipeline", "export", "./empty", "./x", cwd=tmp_path)
    assert none.returncode == 2 and "holds no journal (no data.mdb in it or below it)" in (
        none.stderr
    )
