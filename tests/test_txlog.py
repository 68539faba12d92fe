"""The journal library on real LMDB in temp dirs: append, dedup, read, indexes,
compression, ownership, and corruption detection (library and CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from txlog import (
    CorruptRecord,
    Journal,
    JournalError,
    Record,
    RecordCodec,
    ReplicaReader,
    format_bookmark,
    parse_bookmark,
    publisher_hash,
)
from txlog.record import check_stored_records


def make(ph: int, seq: int, topic: str = "orders", payload: bytes | None = None) -> Record:
    return Record(
        topic=topic,
        payload=payload if payload is not None else b'{"seq":%d,"pad":"%s"}' % (seq, b"x" * 200),
        pub_hash=ph,
        seq=seq,
        client_name="pub",
    )


@pytest.fixture(params=["none", "zstd"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "j", instance_name="a", compression=request.param)
    request.addfinalizer(j.close)
    return j


def test_publisher_hash_is_stable() -> None:
    # fixed values: the hash must never change across versions or processes
    assert publisher_hash("pubber") == publisher_hash("pubber")
    assert publisher_hash("a") != publisher_hash("b")
    assert publisher_hash("pubber") == int.from_bytes(
        __import__("hashlib").blake2b(b"pubber", digest_size=8).digest(), "big"
    )
    assert parse_bookmark(format_bookmark(12, 34)) == (12, 34)
    with pytest.raises(ValueError, match="expected '<publisher hash>"):
        parse_bookmark("12|x|")


def test_append_assigns_txids_and_discards_duplicates(journal: Journal) -> None:
    ph = publisher_hash("pub")
    txids = journal.append([make(ph, 1), make(ph, 2), make(ph, 2), make(ph, 1), make(ph, 3)], 1000)
    assert txids == [1, 2, 0, 0, 3]
    assert journal.append([make(ph, 3), make(ph, 4)], 2000) == [0, 4]
    assert journal.last_txid == 4
    assert journal.publisher_last_seq(ph) == 4
    assert journal.lookup_bookmark(ph, 2) == 2
    assert journal.lookup_bookmark(ph, 9) is None
    recs = journal.read(0, 100)
    assert [r.seq for r in recs] == [1, 2, 3, 4]
    assert [r.txid for r in recs] == [1, 2, 3, 4]
    assert recs[0].payload.startswith(b'{"seq":1')
    assert recs[0].origin_txid == 1 and recs[3].local_ts == 2000
    assert [r.seq for r in journal.read(2, 100)] == [3, 4]
    assert [r.seq for r in journal.read(0, 100, max_txid=2)] == [1, 2]
    assert journal.statistics().duplicates == 3


def test_replicated_records_are_stored_restamped_and_deduplicated(tmp_path: Path) -> None:
    """A record received by replication is stored from its received bytes: new txid,
    local timestamp and the upstream appended to its path, everything else (payload
    compression included) as it arrived; copies arriving again or out of order are
    judged by exact bookmark."""
    ph = publisher_hash("pub")
    with Journal(tmp_path / "up", instance_name="a", compression="zstd") as up:
        recs = [make(ph, s) for s in (1, 2, 3, 4, 5)]
        for rec in recs:
            rec.origin = "a"
        recs[4].correlation_id = "c-5"
        up.append(recs[:4], 1000)
        up.append(recs[4:], 1500)
        sent, damage = up.read_route_views(0, 100)
    assert damage is None
    raws = [v.raw for v in sent]
    reader = ReplicaReader(("a", "ga"))
    with Journal(tmp_path / "down", instance_name="b") as down:
        # 3 and 1 arrive first over another path; 1 arrives twice in one batch
        assert down.append([reader(raws[2]), reader(raws[0]), reader(raws[0])], 2000) == [1, 2, 0]
        txids = down.append([reader(r) for r in raws], 3000)
        assert txids == [0, 3, 0, 4, 5]
        stored = down.read(0, 10)
        assert down.verify() == []
        assert down.origin_high_water() == {"a": 5}
    assert [r.seq for r in stored] == [3, 1, 2, 4, 5]
    for rec in stored:
        assert rec.path == (("a", "ga"),)
        assert rec.origin == "a" and rec.origin_txid == rec.seq
        assert rec.payload.startswith(b'{"seq":%d,' % rec.seq)
        assert rec.client_name == "pub" and rec.topic == "orders"
    assert [r.local_ts for r in stored] == [2000, 2000, 3000, 3000, 3000]
    assert stored[4].correlation_id == "c-5" and stored[4].origin_ts == 1500


def test_replica_reader_refuses_damaged_bytes() -> None:
    codec = RecordCodec()
    raw = codec.encode(make(publisher_hash("pub"), 1))
    reader = ReplicaReader(("a", "ga"))
    rec = reader(raw)
    assert rec.payload == make(publisher_hash("pub"), 1).payload
    flipped = bytearray(raw)
    flipped[-3] ^= 0xFF
    with pytest.raises(CorruptRecord, match="CRC mismatch"):
        reader(bytes(flipped))
    with pytest.raises(CorruptRecord, match="truncated"):
        reader(raw[:20])


def test_reopen_keeps_state_without_scanning(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    with Journal(tmp_path / "j", instance_name="a") as j:
        for b in range(10):
            j.append([make(ph, b * 100 + i + 1) for i in range(100)], 1000 + b)
    with Journal(tmp_path / "j", instance_name="a") as j:
        assert j.last_txid == 1000
        assert j.publisher_last_seq(ph) == 1000
        assert j.append([make(ph, 1000)], 5000) == [0]
        assert j.append([make(ph, 1001)], 5000) == [1001]


def test_time_index_finds_the_first_record_at_or_after(journal: Journal) -> None:
    ph = publisher_hash("pub")
    for i in range(50):
        journal.append([make(ph, i + 1)], 1_000_000 + i * 20_000)
    assert journal.txid_before_time(0) == 0
    assert journal.txid_before_time(1_000_000 + 10 * 20_000) == 10
    assert journal.txid_before_time(1_000_000 + 10 * 20_000 + 1) == 11
    assert journal.txid_before_time(10**15) == 50


def test_compression_round_trips_and_shrinks(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    payload = b'{"text":"' + b"abcdefgh" * 200 + b'"}'
    with Journal(tmp_path / "z", compression="zstd") as z, Journal(tmp_path / "n") as n:
        z.append([make(ph, 1, payload=payload)], 1)
        n.append([make(ph, 1, payload=payload)], 1)
        assert z.read(0, 1)[0].payload == payload
        assert n.read(0, 1)[0].payload == payload
    # a journal written compressed reads back with compression off
    with Journal(tmp_path / "z") as z:
        assert z.read(0, 1)[0].payload == payload


def test_journal_belongs_to_one_instance(tmp_path: Path) -> None:
    Journal(tmp_path / "j", instance_name="a").close()
    with pytest.raises(JournalError, match="belongs to instance 'a', not 'b'"):
        Journal(tmp_path / "j", instance_name="b")
    with pytest.raises(JournalError, match="holds no journal"):
        Journal(tmp_path / "missing", readonly=True)
    with pytest.raises(JournalError, match="unknown durability"):
        Journal(tmp_path / "k", durability="sometimes")


def flip_byte_in(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    pos = data.find(needle)
    assert pos >= 0, "needle not found in the journal file"
    data[pos + len(needle) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def test_flipped_byte_is_detected_by_read_and_verify(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    with Journal(tmp_path / "j", instance_name="a") as j:
        j.append([make(ph, i + 1, payload=b'{"id":"record-%03d"}' % i) for i in range(20)], 1)
    flip_byte_in(tmp_path / "j" / "data.mdb", b"record-007")
    with Journal(tmp_path / "j", instance_name="a") as j:
        problems = j.verify()
        assert [(p.txid, "CRC" in p.problem) for p in problems] == [(8, True)]
        assert [r.seq for r in j.read(0, 7)] == [1, 2, 3, 4, 5, 6, 7]
        with pytest.raises(CorruptRecord, match="record txid 8 is corrupt"):
            j.read(0, 20)
        # the pipeline's read of stored values makes the same checks
        assert [f[4] for f in j.read_stored(0, 7).fields] == [1, 2, 3, 4, 5, 6, 7]
        with pytest.raises(CorruptRecord, match="record txid 8 is corrupt: CRC mismatch"):
            j.read_stored(0, 20)
        sound = j.read_stored(8, 1).values[0]
    with pytest.raises(CorruptRecord, match="record txid 9 is corrupt: value of 5 bytes"):
        check_stored_records([(9, sound[:5])])
    with pytest.raises(CorruptRecord, match="record txid 10 is corrupt: record claims txid 9"):
        check_stored_records([(10, sound)])
    cli = [sys.executable, "-m", "amps_py", "txlog"]
    out = subprocess.run(
        [*cli, "verify", str(tmp_path / "j")], capture_output=True, text=True, check=False
    )
    assert out.returncode == 3
    assert "CORRUPT txid 8" in out.stdout
    assert "1 damaged record" in out.stderr
    dump = subprocess.run(
        [*cli, "dump", str(tmp_path / "j")], capture_output=True, text=True, check=False
    )
    assert dump.returncode == 3
    assert len(dump.stdout.splitlines()) == 7, "records before the damage are still dumped"
    assert "record txid 8 is corrupt" in dump.stderr


def test_cli_info_and_dump(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    with Journal(tmp_path / "j", instance_name="a") as j:
        j.append([make(ph, i + 1) for i in range(3)], 1)
    cli = [sys.executable, "-m", "amps_py", "txlog"]
    info = subprocess.run(
        [*cli, "info", str(tmp_path / "j")], capture_output=True, text=True, check=True
    )
    assert '"records": 3' in info.stdout
    dump = subprocess.run(
        [*cli, "dump", str(tmp_path / "j"), "--from-txid", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    import json

    rows = [json.loads(line) for line in dump.stdout.splitlines()]
    assert [r["txid"] for r in rows] == [2, 3]
    assert rows[0]["bookmark"] == f"{ph}|2|"
    ok = subprocess.run(
        [*cli, "verify", str(tmp_path / "j")], capture_output=True, text=True, check=True
    )
    assert "OK" in ok.stdout
