"""The column-at-a-time decoder and the read plan of the ``amps_txlog`` data source,
without Spark: real journals in temp dirs (txlog.Journal), real LMDB."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

import pyarrow as pa
from pipeline_journals import BASE_US, fill_varied

from amps_py.pipeline.decode import select_stored, stored_to_batch
from amps_py.pipeline.readplan import BadOption, ReadPlan, parse_time_us, read_range
from amps_py.pipeline.schema import RecordTooLarge, records_to_batch
from txlog import CorruptRecord, Journal, JournalDamaged, Record, publisher_hash
from txlog.offline import maintain_offline
from txlog.record import StoredRecords


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("decode") / "journal"
    fill_varied(path, 3000)
    return path


def test_stored_to_batch_builds_exactly_what_records_to_batch_builds(varied: Path) -> None:
    with Journal(varied, readonly=True) as j:
        assert j.last_txid == 3000
        for after, limit in ((0, 1), (0, 1000), (1000, 2000), (2999, 5)):
            fast = stored_to_batch("inst", j.read_stored(after, limit))
            slow = records_to_batch("inst", j.read(after, limit))
            assert fast.num_rows == slow.num_rows == min(limit, 3000 - after)
            assert fast.equals(slow), _first_difference(fast, slow)
        empty = stored_to_batch("inst", StoredRecords([], []))
        assert empty.num_rows == 0 and empty.schema == slow.schema


def test_every_kind_of_record_is_in_the_varied_journal(varied: Path) -> None:
    """The equality above covers every decoding path only if the journal has them."""
    with Journal(varied, readonly=True) as j:
        rows = stored_to_batch("inst", j.read_stored(0, 3000)).to_pylist()
    assert {r["kind"] for r in rows} == {"publish", "delta_publish", "sow_delete"}
    assert {len(r["path"]) for r in rows} == {0, 1, 2}
    assert {r["message_type"] for r in rows} == {"json", "binary"}
    assert any(r["payload_text"] is None for r in rows)  # binary
    assert any(r["payload_text"] and "\ufffd" in r["payload_text"] for r in rows)
    assert any(r["payload"] == b"" for r in rows)
    assert any(len(r["payload"]) > 1000 for r in rows)  # stored compressed
    assert any(r["sow_key"] for r in rows) and any(r["correlation_id"] for r in rows)
    with Journal(varied, readonly=True) as j:
        flags = {f[3] for f in j.read_stored(0, 3000).fields}
    assert flags == {0, 1}, "some payloads are stored zstd-compressed, some not"


def test_text_message_types_have_payload_text_and_binary_ones_none(tmp_path: Path) -> None:
    bodies = {
        "json": b'{"id":1}',
        "xml": b"<order id='1'/>",
        "fix": b"35=D\x0155=IBM\x0138=100\x01",
        "nvfix": b"id=1\x01sym=IBM\x01",
        "bflat": b"\x00\x01\xff\x10",
        "binary": b"\xde\xad\xbe\xef",
    }
    with Journal(tmp_path / "j", instance_name="inst", durability="page-cache") as j:
        j.append(
            [
                Record(
                    topic="t",
                    payload=body,
                    pub_hash=publisher_hash("p"),
                    seq=i + 1,
                    client_name="p",
                    message_type=mtype,
                )
                for i, (mtype, body) in enumerate(bodies.items())
            ],
            BASE_US,
        )
        fast = stored_to_batch("inst", j.read_stored(0, 10))
        slow = records_to_batch("inst", j.read(0, 10))
    assert fast.equals(slow), _first_difference(fast, slow)
    texts = dict(
        zip(
            fast.column("message_type").to_pylist(),
            fast.column("payload_text").to_pylist(),
            strict=True,
        )
    )
    assert texts == {
        "json": '{"id":1}',
        "xml": "<order id='1'/>",
        "fix": "35=D\x0155=IBM\x0138=100\x01",
        "nvfix": "id=1\x01sym=IBM\x01",
        "bflat": None,
        "binary": None,
    }


def test_seq_beyond_a_signed_long_names_the_txid(tmp_path: Path) -> None:
    ph = publisher_hash("big")
    with Journal(tmp_path / "j", instance_name="a") as j:
        j.append([Record(topic="t", payload=b"{}", pub_hash=ph, seq=s) for s in (1, 2**63)], 1)
        with pytest.raises(RecordTooLarge, match="txid 2: seq 9223372036854775808"):
            stored_to_batch("a", j.read_stored(0, 10))


def test_select_stored_keeps_only_the_topics_and_times_asked(varied: Path) -> None:
    with Journal(varied, readonly=True) as j:
        stored = j.read_stored(0, 3000)
    rows = stored_to_batch("inst", stored).to_pylist()
    start, end = BASE_US + 3_000_000, BASE_US + 7_000_000  # batches 3..6: txids 301..700
    chosen = select_stored(stored, {b"orders", b"quotes"}, start, end)
    expected = [
        r["txid"] for r in rows if r["topic"] in ("orders", "quotes") and 301 <= r["txid"] <= 700
    ]
    assert [f[4] for f in chosen.fields] == expected
    assert [v[:4] for v in chosen.values] == [v[:4] for v in stored.values if v in chosen.values]
    assert select_stored(stored) is stored


def test_plan_ranges_split_the_snapshot_without_gap_or_overlap(varied: Path) -> None:
    plan = ReadPlan.from_options({"path": str(varied), "partition_records": "700"})
    with Journal(varied, readonly=True) as j:
        ranges = plan.ranges(j)
        assert len(ranges) == 5  # ceil(3000 / 700)
        assert ranges[0][0] == 0 and ranges[-1][1] == 3000
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        narrowed = plan.txids_within(101, 200).txids_within(150, None)
        assert narrowed.ranges(j) == [(149, 200)]
        assert plan.txids_within(2000, 1000).ranges(j) == []
        timed = ReadPlan(
            path=str(varied),
            start_us=BASE_US + 3_000_000,
            end_us=BASE_US + 7_000_000,
            partitions=2,
        )
        assert timed.ranges(j) == [(300, 500), (500, 700)]
        assert plan.topics_within(frozenset({"a"})).topics_within(frozenset({"b"})).ranges(j) == []


def test_read_range_reports_what_it_read(varied: Path, tmp_path: Path) -> None:
    plan = ReadPlan(path=str(varied), topics=frozenset({"trades"}), metrics_dir=str(tmp_path))
    batches = list(read_range(plan, 1000, 1600, index=3))
    rows = [r for b in batches for r in b.to_pylist()]
    assert {r["topic"] for r in rows} == {"trades"}
    assert [r["txid"] for r in rows] == [t for t in range(1001, 1601) if (t - 1) % 3 == 1]
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("partition-*.json")]
    assert report == {
        "partition": 3,
        "after_txid": 1000,
        "max_txid": 1600,
        "scanned": 600,
        "rows": 200,
    }


def test_compressed_archived_and_removed_segments_read_like_the_journal(tmp_path: Path) -> None:
    """Records in segment files read the same; removed ones are not read at all."""
    path = tmp_path / "j"
    fill_varied(path, 2000, segment_size=64 * 1024)
    with Journal(path, instance_name="inst", segment_size=64 * 1024) as j:
        ids = [seg.id for seg in j.segments()]
        assert len(ids) >= 5
        maintain_offline(j, "remove", ids[0])
        maintain_offline(j, "compress", ids[2])
        expected = records_to_batch("inst", list(j.iter_records()))
        first = j.first_txid()
        assert first > 1 and any(seg.state == "compressed" for seg in j.segments())
    plan = ReadPlan(path=str(path), partitions=3)
    with Journal(path, readonly=True) as j:
        ranges = plan.ranges(j)
    assert ranges[0][0] == first - 1
    batches = [b for after, last in ranges for b in read_range(plan, after, last)]
    got = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    assert got.equals(expected), _first_difference(got, expected)


def test_read_range_raises_naming_the_damaged_txid(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    records = [
        Record(topic="t", payload=b'{"id":"record-%03d"}' % i, pub_hash=ph, seq=i + 1)
        for i in range(20)
    ]
    with Journal(tmp_path / "j", instance_name="a") as j:
        j.append(records, 1)
    data = bytearray((tmp_path / "j" / "data.mdb").read_bytes())
    pos = data.find(b"record-007")
    data[pos + 5] ^= 0x20
    (tmp_path / "j" / "data.mdb").write_bytes(bytes(data))
    plan = ReadPlan(path=str(tmp_path / "j"))
    assert sum(b.num_rows for b in read_range(plan, 0, 7)) == 7
    with pytest.raises(JournalDamaged, match=r"journal .*/j: record txid 8 is corrupt: CRC") as err:
        list(read_range(plan, 0, 20))
    assert isinstance(err.value.__cause__, CorruptRecord)


def test_options_are_checked_with_messages_that_say_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BadOption, match="needs the journal directory"):
        ReadPlan.from_options({})
    with pytest.raises(BadOption, match="has no option topic; the options are"):
        ReadPlan.from_options({"path": "x", "topic": "a"})
    with pytest.raises(BadOption, match="min_txid='ten' is not a whole number"):
        ReadPlan.from_options({"path": "x", "min_txid": "ten"})
    with pytest.raises(BadOption, match="partitions='0' must be at least 1"):
        ReadPlan.from_options({"path": "x", "partitions": "0"})
    with pytest.raises(BadOption, match="start_time='soon' is not a time"):
        ReadPlan.from_options({"path": "x", "start_time": "soon"})
    plan = ReadPlan.from_options(
        {
            "path": "x",
            "MIN_TXID": "5",
            "topics": "a, b,",
            "start_time": "2026-11-24T10:00:00Z",
            "end_time": "1790000000000000",
        }
    )
    assert plan.min_txid == 5 and plan.topics == frozenset({"a", "b"})
    assert plan.start_us == parse_time_us("2026-11-24T10:00:00+00:00", "t")
    assert plan.start_us == parse_time_us("2026-11-24T10:00:00", "t")  # no zone: UTC
    assert plan.end_us == 1_790_000_000_000_000


def _first_difference(a: object, b: object) -> str:
    left, right = a.to_pylist(), b.to_pylist()  # type: ignore[attr-defined]
    for i, (x, y) in enumerate(zip(left, right, strict=True)):
        if x != y:
            diff = {k: (x[k], y[k]) for k in x if x[k] != y[k]}
            return f"row {i}: {diff}"
    return "schemas differ"
