"""A damaged LMDB page on any read path ends in a clear failure: never a raw ``lmdb``
error, a traceback in the log, a silent close or an abort (issue 24, item 4).

One leaf page in the middle of a real journal (or SOW store) of thousands of records is
overwritten with 4 KiB of random bytes (seeded, printed: ``page_damage.py``), and each
reader runs for real:

- the txlog reads return the records before the damage and then an
  ``UnreadableRecords`` naming the txid range (what ``txlog verify`` lists), also where
  LMDB would abort the process on a step onto the page (a child process reads it);
- bookmark replay from EPOCH in a real instance: every record before the damage, then a
  ``journal corrupt`` failure ack naming the range; the same connection goes on;
- ``sow`` / ``sow_and_subscribe`` / ``sow_delete`` on a damaged SOW store: a failure ack
  ``sow store unreadable`` naming the file and the fix; the connection goes on;
- replication catch-up from a damaged journal: one hole over the range, logged once and
  shown by ``amps-py admin status``, the destination gets every other record, the
  source keeps serving;
- the Spark data source and the Parquet export: an error naming the journal, the range
  and ``amps-py txlog verify``.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import orjson
import pytest
import trio
from admin_screens import admin_cli, admin_url, words
from clirun import run
from cluster import Cluster, destination_xml, replication_xml
from harness import start_instance, wait_until_sync
from page_damage import clear_page_type, damage_leaf

from amps_py.client import CommandError, open_client
from txlog import Journal, Record, UnreadableRecords, publisher_hash

#: the seed of the random bytes written over the page (printed by damage_leaf)
SEED = 24_04
RECORDS = 4_000
#: the record whose page is damaged
MIDDLE = RECORDS // 2
PUBLISHER = "pub"
U64 = struct.Struct(">Q")


def fill(journal: Path, instance: str, count: int = RECORDS) -> None:
    """``count`` records of ``instance`` on topic ``orders`` from :data:`PUBLISHER`,
    seq = txid, payload ``{"id": txid, ...}`` of about 300 bytes (about ten a page)."""
    with Journal(journal, instance_name=instance) as j:
        for first in range(1, count + 1, 500):
            batch = [
                Record(
                    topic="orders",
                    payload=orjson.dumps({"id": n, "qty": n % 97, "pad": "p" * 260}),
                    pub_hash=publisher_hash(PUBLISHER),
                    seq=n,
                    client_name=PUBLISHER,
                    message_type="json",
                )
                for n in range(first, min(first + 500, count + 1))
            ]
            j.append(batch, 1_790_000_000_000_000 + first)


def damage_journal(journal: Path, txid: int = MIDDLE) -> tuple[int, int]:
    """Random bytes over the records page holding ``txid``; returns the range of txids
    that no longer read, as ``amps-py txlog verify`` (a real process) lists it."""
    damage_leaf(journal / "data.mdb", b"records", U64.pack(txid), SEED)
    verify = run("txlog", "verify", str(journal), cwd=journal.parent, timeout=120)
    assert verify.returncode == 3, verify.stdout + verify.stderr
    found = re.findall(r"txids (\d+) to (\d+) unreadable", verify.stdout)
    assert len(found) == 1, verify.stdout
    first, last = int(found[0][0]), int(found[0][1])
    assert 1 < first <= txid <= last < RECORDS, (first, last)
    print(f"txids {first} to {last} are on the damaged page")
    return first, last


def assert_no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-4000:]


# ------------------------------------------------------------------------- txlog
def test_journal_reads_stop_at_a_damaged_page_naming_the_txid_range(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    fill(journal, "inst")
    first, last = damage_journal(journal)
    with Journal(journal, readonly=True) as j:
        views, damage = j.read_views(0, RECORDS)
        assert [v.txid for v in views] == list(range(1, first)), "the records before it"
        assert isinstance(damage, UnreadableRecords), damage
        assert (damage.txid, damage.through) == (first, last)
        assert f"txids {first} to {last} unreadable: LMDB reports a damaged page" in str(damage)
        assert "amps-py txlog verify" in str(damage)
        routes, damage = j.read_route_views(first - 5, RECORDS)
        assert [v.txid for v in routes] == list(range(first - 4, first))
        assert damage is not None and (damage.txid, damage.through) == (first, last)
        # after the range everything reads again
        assert [r.txid for r in j.read(last, 3)] == [last + 1, last + 2, last + 3]
        with pytest.raises(UnreadableRecords, match=f"txids {first} to {last} unreadable"):
            j.read(0, RECORDS)
        with pytest.raises(UnreadableRecords, match=f"txids {first} to {last} unreadable"):
            j.read_stored(first - 1, 10)
        with pytest.raises(UnreadableRecords, match=f"txids {first} to {last} unreadable"):
            j.get(first)
        seen = []
        with pytest.raises(UnreadableRecords, match=f"txids {first} to {last}"):
            for rec in j.iter_records(0, chunk=300):
                seen.append(rec.txid)
        assert seen == list(range(1, first))


def test_a_damaged_index_page_is_named_not_raised_raw(tmp_path: Path) -> None:
    """The bookmark index (replay's start, dedup): its damage names the index."""
    journal = tmp_path / "journal"
    fill(journal, "inst")
    pub = publisher_hash(PUBLISHER)
    damage_leaf(journal / "data.mdb", b"bookmarks", struct.pack(">QQ", pub, MIDDLE), SEED)
    with Journal(journal, readonly=True) as j:
        with pytest.raises(UnreadableRecords, match="the journal's bookmarks index is unreadable"):
            j.lookup_bookmark(pub, MIDDLE)
        assert [r.txid for r in j.read(MIDDLE - 1, 2)] == [MIDDLE, MIDDLE + 1], "records read"


def test_a_page_lmdb_would_abort_on_stepping_onto_is_reported(tmp_path: Path) -> None:
    """A leaf whose page-type flags are cleared: LMDB's step from the page before onto
    it fails an assertion and aborts the process; journal reads search instead, so a
    reader (a child process here, so that an abort cannot take pytest down) gets the
    records before it and the range."""
    journal = tmp_path / "journal"
    fill(journal, "inst")
    clear_page_type(journal / "data.mdb", b"records", U64.pack(MIDDLE))
    script = (
        "import sys\n"
        "from txlog import Journal\n"
        "with Journal(sys.argv[1], readonly=True) as j:\n"
        "    after, count = 0, 0\n"
        "    while True:\n"
        "        views, damage = j.read_views(after, 512)\n"
        "        count += len(views)\n"
        "        if damage is not None:\n"
        "            print(count, damage.txid, damage.through)\n"
        "            break\n"
        "        if not views:\n"
        "            break\n"
        "        after = views[-1].txid\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(journal)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    count, first, last = map(int, done.stdout.split())
    assert count == first - 1 and first <= MIDDLE <= last < RECORDS, done.stdout


# ------------------------------------------------------------------------- replay
async def test_replay_from_epoch_delivers_up_to_the_damage_then_fails_naming_the_range(
    tmp_path: Path,
) -> None:
    fill(tmp_path / "inst-journal", "inst")
    first, last = damage_journal(tmp_path / "inst-journal")
    inst = start_instance(tmp_path, "inst")
    try:
        async with open_client(inst.uri, "reader") as client:
            ids: list[int] = []
            with trio.fail_after(60):
                async with client.subscribe("orders", bookmark="0") as sub:
                    async for message in sub:
                        ids.append(orjson.loads(message.data)["id"])
            assert ids == list(range(1, first)), "every record before the damage, in order"
            failure = sub.failure
            assert failure is not None, "the replay ended without a failure ack"
            assert failure["reason"] == "journal corrupt", failure
            assert f"txids {first} to {last} unreadable" in failure["detail"], failure
            assert "amps-py txlog verify" in failure["detail"], failure

            # the same connection goes on: a replay from after the damage, then live
            after = f"{publisher_hash(PUBLISHER)}|{last + 1}|"
            async with client.subscribe("orders", bookmark=after) as resumed:
                got = []
                with trio.fail_after(60):
                    async for message in resumed:
                        got.append(orjson.loads(message.data)["id"])
                        if len(got) == RECORDS - last - 1:
                            break
                assert got == list(range(last + 2, RECORDS + 1))
                with trio.fail_after(30):
                    await resumed.completed.wait()
                seq = await client.publish("orders", b'{"id":-1}')
                await client.wait_persisted(seq, timeout=30)
                with trio.fail_after(30):
                    live = await resumed.__anext__()
                assert orjson.loads(live.data) == {"id": -1}
        assert inst.alive
    finally:
        inst.stop()
    log = inst.log_file.read_text()
    lines = [line for line in log.splitlines() if " 05-0003 " in line]
    assert len(lines) == 1, lines
    assert f"txids {first} to {last} unreadable" in lines[0], lines[0]
    assert str(inst.journal_dir) in lines[0], lines[0]
    assert_no_traceback(log, inst.output.read_text())


# ------------------------------------------------------------------------- SOW
SOW_XML = """
<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
  <Topic><Name>news</Name><MessageType>json</MessageType><Key>/n</Key></Topic>
</SOW>
"""


def middle_key(store: Path) -> bytes:
    """The middle SOW key (in key order) of the store in ``store``."""
    env = lmdb.open(str(store), readonly=True, lock=False, max_dbs=4)
    try:
        with env.begin(db=env.open_db(b"records", create=False)) as txn:
            keys = [bytes(k) for k in txn.cursor().iternext(values=False)]
    finally:
        env.close()
    assert len(keys) == RECORDS, len(keys)
    return keys[len(keys) // 2]


async def test_sow_queries_on_a_damaged_store_fail_clearly_and_the_connection_goes_on(
    tmp_path: Path,
) -> None:
    inst = start_instance(tmp_path, "inst", extra=SOW_XML)
    async with open_client(inst.uri, PUBLISHER) as pub:
        for n in range(1, RECORDS + 1):
            await pub.publish("orders", orjson.dumps({"id": n, "qty": n % 97, "pad": "p" * 260}))
        await pub.wait_persisted(pub.seq, timeout=60)
    store = inst.journal_dir / "sow" / "orders"
    inst.stop()
    key = middle_key(store)
    damage_leaf(store / "data.mdb", b"records", key, SEED)
    inst.start()
    try:
        async with open_client(inst.uri, "q") as client:
            with trio.fail_after(60), pytest.raises(CommandError) as failed:
                await client.sow("orders", batch_size=100)
            assert failed.value.reason == "sow store unreadable", failed.value
            assert str(store / "data.mdb") in failed.value.detail
            assert "MDB_CORRUPTED" in failed.value.detail
            assert f"delete the directory {store}" in failed.value.detail, "the fix"

            with trio.fail_after(60):
                async with client.sow_and_subscribe("orders") as sub:
                    async for _message in sub:
                        pass
            assert sub.failure is not None and sub.failure["reason"] == "sow store unreadable"

            with trio.fail_after(60), pytest.raises(CommandError) as failed:
                await client.sow_delete("orders", filter="/qty > 1000")
            assert failed.value.reason == "sow store unreadable", failed.value

            # the connection and the instance go on: another topic, its own store
            async with client.subscribe("news") as news:
                seq = await client.publish("news", b'{"n":1}')
                await client.wait_persisted(seq, timeout=30)
                with trio.fail_after(30):
                    message = await news.__anext__()
            assert orjson.loads(message.data) == {"n": 1}
            result = await client.sow("news")
            assert [orjson.loads(r.data) for r in result] == [{"n": 1}]
        assert inst.alive
    finally:
        inst.stop()
    log = inst.log_file.read_text()
    assert len([line for line in log.splitlines() if " 17-0004 " in line]) == 3, log[-3000:]
    assert_no_traceback(log, inst.output.read_text())


# ------------------------------------------------------------------------- replication
ADMIN = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"


def hole_lines(cluster: Cluster) -> list[str]:
    return [line for line in cluster.log("A").splitlines() if " 15-0006 " in line]


def test_replication_catch_up_reports_a_damaged_range_once_and_goes_on(
    cluster: Cluster,
) -> None:
    cluster.add_instance(
        "A",
        "g",
        lambda view: replication_xml(
            destination_xml("B", "g", False, view.addr("B"), exclude=("replicate",))
        )
        + ADMIN,
    )
    cluster.add_instance("B", "g", lambda view: "")
    a_journal = cluster.root / "A" / "A-journal"
    fill(a_journal, "A")
    first, last = damage_journal(a_journal)
    cluster.start("B")
    a = cluster.start("A")

    def caught_up(txid: int) -> str | None:
        d = a.destination("B")
        return None if d["acked_txid"] >= txid else f"B acknowledged {d['acked_txid']}"

    wait_until_sync(lambda: caught_up(RECORDS), 120, interval=0.1)
    d = a.destination("B")
    assert d["holes"] == 1 and d["is_connected"], d
    assert d["last_hole"].startswith(f"txids {first} to {last} not sent"), d["last_hole"]
    assert f"amps-py txlog verify {a_journal}" in d["last_hole"], d["last_hole"]
    lines = hole_lines(cluster)
    assert len(lines) == 1, lines
    assert f"cannot receive txids {first} to {last}, damaged in journal {a_journal}" in lines[0]
    assert f"the stream goes on after txid {last}" in lines[0]

    # `amps-py admin status` shows it
    status = admin_cli(admin_url(a), "status", columns=200)
    assert status.returncode == 0, status.stderr
    assert f"B: 1 replication hole; last: txids {first} to {last} not sent" in words(
        status.stdout
    ), status.stdout

    # the source keeps serving: a publish on A reaches a subscriber there and B
    async def publish_and_receive() -> None:
        async with open_client(a.uri, "live") as client:
            async with client.subscribe("orders") as sub:
                seq = await client.publish("orders", b'{"id":-1}')
                await client.wait_persisted(seq, timeout=30)
                with trio.fail_after(30):
                    message = await sub.__anext__()
            assert orjson.loads(message.data) == {"id": -1}

    trio.run(publish_and_receive)
    wait_until_sync(lambda: caught_up(RECORDS + 1), 60, interval=0.1)

    # a new connection resumes after what B holds: no second hole, no resend
    cluster.restart("B")
    a_stats: dict[str, Any] = {}

    def reconnected() -> str | None:
        a_stats.update(a.destination("B"))
        if a_stats["resyncs"] < 2 or not a_stats["is_connected"]:
            return f"destination B: {a_stats['resyncs']} connections so far"
        return None

    wait_until_sync(reconnected, 60, interval=0.1)
    assert len(hole_lines(cluster)) == 1, hole_lines(cluster)
    assert a.alive
    cluster.stop("B")
    with Journal(cluster.root / "B" / "B-journal", readonly=True) as b:
        origins = [rec.origin_txid for rec in b.iter_records()]
    expected = [*range(1, first), *range(last + 1, RECORDS + 2)]
    assert origins == expected, "B holds every record but the damaged range, once"
    assert_no_traceback(cluster.log("A"), a.output.read_text())


# ------------------------------------------------------------------------- pipeline
def test_the_spark_data_source_fails_naming_the_journal_range_and_fix(
    spark: Any, tmp_path: Path
) -> None:
    from amps_py.cli.pipeline import _spark_failure

    journal = tmp_path / "journal"
    fill(journal, "inst")
    first, last = damage_journal(journal)
    df = spark.read.format("amps_txlog").load(str(journal))
    with pytest.raises(Exception, match=f"txids {first} to {last} unreadable") as err:
        df.count()
    message, code = _spark_failure(err.value)
    print(message)
    assert code == 3
    assert message.startswith(f"journal {journal}: txids {first} to {last} unreadable"), message
    assert "LMDB reports a damaged page" in message and "amps-py txlog verify" in message
    assert "\n" not in message
    # what lies outside the range is read
    before = spark.read.format("amps_txlog").option("max_txid", str(first - 1))
    assert before.load(str(journal)).count() == first - 1
    after = spark.read.format("amps_txlog").option("min_txid", str(last + 1))
    assert after.load(str(journal)).count() == RECORDS - last

    # the command (its own Spark): one line and exit status 3, no wall of stack traces
    done = run("pipeline", "stats", str(journal), cwd=tmp_path, timeout=300)
    print(done.stderr)
    assert done.returncode == 3, done.stdout + done.stderr
    assert_no_traceback(done.stdout, done.stderr)
    assert "\tat org.apache" not in done.stderr and "Exception" not in done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"amps-py: journal {journal}: txids {first} to {last} unreadable")
    assert "amps-py txlog verify" in last_line


def test_the_export_stops_at_the_damaged_range_naming_it_and_the_fix(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    fill(journal, "inst")
    first, last = damage_journal(journal)
    out = tmp_path / "out"
    done = run("pipeline", "export", str(journal), str(out), cwd=tmp_path, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert_no_traceback(done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"journal {journal}: txids {first} to {last} are damaged" in lines[0], lines[0]
    assert f"holds every record through txid {first - 1}" in lines[0], lines[0]
    assert f"amps-py txlog verify {journal}" in lines[0], lines[0]
