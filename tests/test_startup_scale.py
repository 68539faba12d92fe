"""Start-up follows live state, not the journal's length (real server processes).

What a user relies on: a restart, after a clean stop or a kill -9, reads only the
journal records after the newest checkpoints of the SOW stores and queues (counted by
the server in its statistics, never timed), whatever the journal's length; anonymous
memory after start is the same for a short and a long journal holding the same live
state; a damaged or stale queue checkpoint is rebuilt from the journal, saying so,
with the same messages in the queue.

The journals are written straight through txlog (tools/bench/synthetic_journal.py):
the same SOW keys and queue depth spread over histories of two lengths, plus an
empty SOW topic (which once held every start's catch-up at txid 0).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import lmdb
from harness import REPO, ServerProcess, publish_persisted, wait_until_sync, write_config

sys.path.insert(0, str(REPO / "tools" / "bench"))
from synthetic_journal import build_journal, padded

NAME = "big"
SOW_KEYS = 2_000
QUEUE_MESSAGES = 8_000  # half acknowledged: 4,000 live
SOW_XML = """<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
  <Queue><Name>work</Name><MessageType>json</MessageType><LeasePeriod>1m</LeasePeriod></Queue>
</SOW>"""


def server_for(tmp_path: Path, records: int) -> ServerProcess:
    """An instance whose journal holds ``records`` records of the same live state."""
    workdir = tmp_path / f"j{records}"
    port = 0
    admin = f"<Admin><InetAddr>127.0.0.1:{port}</InetAddr></Admin>"
    config = write_config(workdir, NAME, port, extra=SOW_XML + admin)
    made = build_journal(workdir / f"{NAME}-journal", NAME, records, SOW_KEYS, QUEUE_MESSAGES)
    assert made["queue"] == QUEUE_MESSAGES and made["total"] == records, made
    return ServerProcess(config, workdir, 0, NAME)


def instance_tree(server: ServerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.ports['admin']}/amps/instance"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return dict(json.loads(reply.read()))


def rss_anon_kb(server: ServerProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/PID/status")


def publish(port: int, count: int) -> None:
    """``count`` publishes across the SOW topic, the queue and a plain topic, each
    persisted before this returns."""
    topics = ("orders", "work", "trades")
    publish_persisted(
        port,
        "tail-feed",
        [(topics[i % 3], padded({"id": i % 50, "tail": i})) for i in range(count)],
    )


def queue_depth(tree: dict[str, Any]) -> int:
    return int(tree["queues"]["work"]["depth"])


def test_a_start_reads_only_the_journal_after_the_checkpoints_at_two_lengths(
    tmp_path: Path,
) -> None:
    figures = {}
    for records in (40_000, 300_000):
        server = server_for(tmp_path, records)
        try:
            server.start(timeout=120)  # the first start reads everything: no checkpoint yet
            first = instance_tree(server)
            assert first["startup"]["journal_records_read"] >= records, first["startup"]
            assert queue_depth(first) == QUEUE_MESSAGES // 2
            assert first["sow"]["orders"]["records"] == SOW_KEYS
            server.stop()

            server.start(timeout=60)  # after a clean stop: nothing past the checkpoints
            clean = instance_tree(server)
            anon = rss_anon_kb(server)
            assert clean["startup"]["journal_records_read"] == 0, clean["startup"]
            assert clean["startup"]["queue_messages_loaded"] == QUEUE_MESSAGES // 2
            assert queue_depth(clean) == QUEUE_MESSAGES // 2
            assert clean["sow"]["orders"]["records"] == SOW_KEYS

            tail = 300  # 100 to each of orders, work and trades
            publish(server.port, tail)
            server.kill()
            server.start(timeout=60)  # after kill -9: the records since the last checkpoint
            killed = instance_tree(server)
            read = killed["startup"]["journal_records_read"]
            # at most the records published since the checkpoints (the SOW catch-up
            # and the queues each read them once)
            assert read <= 2 * tail, (read, killed["startup"])
            assert queue_depth(killed) == QUEUE_MESSAGES // 2 + tail // 3
            assert killed["sow"]["orders"]["records"] == SOW_KEYS
            figures[records] = anon
        finally:
            server.stop()
    print(f"RssAnon after a clean start (KiB) by journal length: {figures}")
    small, large = figures[40_000], figures[300_000]
    # the same live state: the longer history adds no anonymous memory
    assert large <= small + 10 * 1024, figures


def test_a_damaged_queue_checkpoint_is_rebuilt_from_the_journal(tmp_path: Path) -> None:
    server = server_for(tmp_path, 20_000)
    try:
        server.start(timeout=60)
        depth = queue_depth(instance_tree(server))
        server.stop()
        checkpoint = server.journal_dir / "queues" / "work"
        # bit rot inside one chunk of rows: LMDB reads it, its CRC does not match
        env = lmdb.open(str(checkpoint), max_dbs=2)
        chunks = env.open_db(b"chunks")
        with env.begin(write=True) as txn:
            key, value = next(iter(txn.cursor(db=chunks)))
            rotten = bytearray(value)
            rotten[-3] ^= 0x20
            txn.put(key, bytes(rotten), db=chunks)
        env.close()
        server.start(timeout=60)
        tree = instance_tree(server)
        assert queue_depth(tree) == depth
        assert tree["startup"]["journal_records_read"] >= 20_000  # rebuilt from the journal
        log = server.log_file.read_text()
        assert "its checkpoint is not used: it is damaged" in log and "CRC" in log, log[-2000:]
        server.stop()

        # a truncated file: set aside, rebuilt, and the next start uses the new one
        data = checkpoint / "data.mdb"
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)
        server.start(timeout=60)
        assert queue_depth(instance_tree(server)) == depth
        assert (checkpoint.parent / "work.damaged").is_dir()
        assert "moved to" in server.log_file.read_text()
        server.stop()
        server.start(timeout=60)
        again = instance_tree(server)
        assert again["startup"]["journal_records_read"] == 0, again["startup"]
        assert queue_depth(again) == depth
    finally:
        server.stop()


def test_a_changed_queue_filter_rebuilds_the_queue_and_says_why(tmp_path: Path) -> None:
    server = server_for(tmp_path, 15_000)
    try:
        server.start(timeout=60)
        assert queue_depth(instance_tree(server)) == QUEUE_MESSAGES // 2
        server.stop()
        # only the newer half of the jobs from now on: the checkpoint no longer
        # describes the queue (jobs 4000-7999 are live; 6000 and up pass the filter)
        xml = server.config.read_text().replace(
            "<LeasePeriod>1m</LeasePeriod>",
            "<LeasePeriod>1m</LeasePeriod><Filter>/job &gt;= 6000</Filter>",
        )
        server.config.write_text(xml)
        server.start(timeout=60)
        assert queue_depth(instance_tree(server)) == QUEUE_MESSAGES // 4
        assert "the queue's definition changed" in server.log_file.read_text()
    finally:
        server.stop()


def test_a_clean_stop_checkpoints_every_queue_through_the_last_commit(tmp_path: Path) -> None:
    """Traffic on other topics only (the queue unchanged): a clean stop still records
    that the queue's checkpoint covers it, so the next start reads nothing."""
    server = server_for(tmp_path, 12_000)
    try:
        server.start(timeout=60)
        # the first checkpoint (the rebuild's messages) is written before the traffic
        wait_until_sync(
            lambda: None
            if instance_tree(server)["queues"]["work"]["checkpoint_txid"] == 12_000
            else "the first checkpoint is not written yet",
            timeout=30,
        )
        publish_persisted(server.port, "plain-feed", [("trades", b'{"px": 1}')] * 200)
        server.stop()
        server.start(timeout=60)
        tree = instance_tree(server)
        assert tree["startup"]["journal_records_read"] == 0, tree["startup"]
        assert tree["queues"]["work"]["checkpoint_txid"] == 12_200
    finally:
        server.stop()
