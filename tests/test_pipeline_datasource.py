"""The ``amps_txlog`` PySpark data source on real Spark (local mode, the session-scoped
``spark`` fixture): it returns what ``amps-py txlog dump`` prints, also while a real
instance keeps writing; options on txid, local time and topic narrow the read (the
partitions' own reports say how many records they read, and a damaged record outside
the range does not fail the read) while ``where`` filters are Spark's and give the
same rows; one DataFrame answers every query rightly whatever ran before; a directory
of journals reads each; a damaged record fails the job with an error naming its
txid."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from clirun import amps_py_command, cli_env
from harness import start_instance, wait_until_sync
from pipeline_journals import BASE_US, dump, dumped_payload, fill_varied, varied_record

from txlog import Journal

#: the columns compared with the dump, as the dump names them
COMPARED = """txid, bookmark, client_name, seq, topic, message_type, kind, origin,
    origin_txid, path, path_groups, unix_micros(origin_ts) AS origin_ts_us,
    unix_micros(local_ts) AS local_ts_us, sow_key, correlation_id, payload"""


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 records of every kind (tests/pipeline_journals.py), batch i of 100 stored
    at BASE_US + i seconds."""
    path = tmp_path_factory.mktemp("ds") / "journal"
    fill_varied(path, 3000)
    return path


def rows_of(
    spark: Any, journal: Path, where: str | None = None, **options: str
) -> list[dict[str, Any]]:
    df = spark.read.format("amps_txlog").options(**options).load(str(journal))
    if where:
        df = df.where(where)
    table = df.selectExpr(*COMPARED.split(",")).toArrow()
    return sorted(table.to_pylist(), key=lambda r: r["txid"])


def as_dumped(row: dict[str, Any]) -> dict[str, Any]:
    """A data source row in the shape of a dumped record, for comparison."""
    out = dict(row)
    out["path"] = [list(hop) for hop in zip(row["path"], row["path_groups"], strict=True)]
    del out["path_groups"]
    return out


def comparable(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rec.items() if k not in ("payload_encoding",)}
    out["payload"] = dumped_payload(rec)
    return out


def read_reports(directory: Path) -> dict[str, int]:
    """What the partitions of the last read report: records scanned, rows yielded."""
    reports = [json.loads(p.read_text()) for p in directory.glob("partition-*.json")]
    for p in directory.glob("partition-*.json"):
        p.unlink()
    return {
        "partitions": len(reports),
        "scanned": sum(r["scanned"] for r in reports),
        "rows": sum(r["rows"] for r in reports),
    }


# --------------------------------------------------------------------------- equivalence
def test_every_column_matches_txlog_dump(spark: Any, varied: Path, tmp_path: Path) -> None:
    rows = rows_of(spark, varied, partition_records="1000")
    dumped = dump(varied, tmp_path)
    assert len(rows) == len(dumped) == 3000
    for row, rec in zip(rows, dumped, strict=True):
        assert as_dumped(row) == comparable(rec), f"txid {rec['txid']}"


@pytest.mark.slow
def test_reads_what_txlog_dump_prints_while_the_instance_writes(spark: Any, tmp_path: Path) -> None:
    """100,000 messages published to a real instance, then a publisher keeps going
    while Spark reads: the rows are exactly the dump up to the newest txid read."""
    server = start_instance(tmp_path, "live", journal_extra="<Compression>zstd</Compression>")
    journal = server.journal_dir
    try:
        publishers = []
        for name, topic, count in (("fill-a", "orders", 60_000), ("fill-b", "trades", 40_000)):
            lines = tmp_path / f"{name}.jsonl"
            with lines.open("w") as f:
                for i in range(count):
                    pad = "abcdefgh" * (40 if i % 10 == 0 else 1)  # some large enough for zstd
                    f.write(f'{{"pub":"{name}","i":{i},"pad":"{pad}"}}\n')
            publishers.append(
                subprocess.Popen(
                    [
                        *amps_py_command(),
                        "publish",
                        server.uri,
                        topic,
                        "--file",
                        str(lines),
                        "--name",
                        name,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=cli_env(),
                )
            )
        for proc in publishers:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()
        assert last_txid(journal) == 100_000

        live, feeder, stop = start_live_publisher(server.uri)
        try:
            wait_until_sync(
                lambda: (
                    None
                    if last_txid(journal) > 101_000
                    else f"the live publisher has stored {last_txid(journal) - 100_000} messages"
                ),
                timeout=60,
            )
            before = last_txid(journal)
            rows = rows_of(spark, journal)
            after = last_txid(journal)
        finally:
            stop.set()
            feeder.join(timeout=60)
            _, err = live.communicate(timeout=120)  # closes its stdin: it ends
        assert live.returncode == 0, err.decode()
    finally:
        server.stop()
    newest = rows[-1]["txid"]
    print(f"live read: {len(rows)} rows; journal at {before} before the read, {after} after")
    assert newest >= before, "the read missed records committed before it began"
    assert after > newest, "the instance wrote nothing while Spark read"
    dumped = [rec for rec in dump(journal, tmp_path) if rec["txid"] <= newest]
    assert len(rows) == len(dumped) == newest
    assert [r["bookmark"] for r in rows] == [d["bookmark"] for d in dumped]
    assert [r["payload"] for r in rows] == [dumped_payload(d) for d in dumped]
    assert [as_dumped(r) for r in rows] == [comparable(d) for d in dumped]
    assert {r["topic"] for r in rows} == {"orders", "trades", "live"}


def last_txid(journal: Path) -> int:
    with Journal(journal, readonly=True) as j:
        return j.last_txid


def start_live_publisher(
    uri: str,
) -> tuple[subprocess.Popen[bytes], threading.Thread, threading.Event]:
    """``amps-py publish URI live --file -`` fed about 2,000 lines a second until
    ``stop`` (paced so the journal grows during the read but not by much more than the
    100,000 already there)."""
    proc = subprocess.Popen(
        [*amps_py_command(), "publish", uri, "live", "--file", "-", "--name", "live-pub"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    stop = threading.Event()

    def feed() -> None:
        assert proc.stdin is not None
        i = 0
        while not stop.wait(0.05):  # the pace of a load generator, not a synchronisation
            chunk = b"".join(b'{"live":%d}\n' % (i + k) for k in range(100))
            i += 100
            try:
                proc.stdin.write(chunk)
                proc.stdin.flush()
            except BrokenPipeError:
                return

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return proc, thread, stop


# --------------------------------------------------------------------------- narrowing
def test_txid_options_read_only_their_range_and_where_gets_the_same_rows(
    spark: Any, varied: Path, tmp_path: Path
) -> None:
    metrics = {"metrics_dir": str(tmp_path), "partition_records": "1000"}
    rows = rows_of(spark, varied, min_txid="1001", max_txid="1500", **metrics)
    assert [r["txid"] for r in rows] == list(range(1001, 1501))
    assert read_reports(tmp_path) == {"partitions": 1, "scanned": 500, "rows": 500}

    # where is Spark's: the same rows, from a read of the whole journal
    for where, txids in (
        ("txid > 1000 AND txid <= 1500", list(range(1001, 1501))),
        ("txid >= 2991", list(range(2991, 3001))),
        ("txid IN (5, 7, 2000)", [5, 7, 2000]),
    ):
        rows = rows_of(spark, varied, where, **metrics)
        assert [r["txid"] for r in rows] == txids, where
        assert read_reports(tmp_path)["scanned"] == 3000, where

    everything = rows_of(spark, varied, **metrics)
    assert len(everything) == 3000
    assert read_reports(tmp_path) == {"partitions": 3, "scanned": 3000, "rows": 3000}


def test_topic_options_decode_only_those_topics_and_where_combines(
    spark: Any, varied: Path, tmp_path: Path
) -> None:
    metrics = {"metrics_dir": str(tmp_path)}
    rows = rows_of(spark, varied, topics="orders,quotes", **metrics)
    assert len(rows) == 2000 and {r["topic"] for r in rows} == {"orders", "quotes"}
    assert read_reports(tmp_path) == {"partitions": 1, "scanned": 3000, "rows": 2000}

    rows = rows_of(spark, varied, "topic = 'trades'", **metrics)
    assert len(rows) == 1000 and {r["topic"] for r in rows} == {"trades"}
    assert read_reports(tmp_path)["rows"] == 3000  # every topic decoded: Spark filters

    rows = rows_of(
        spark, varied, "topic IN ('orders', 'trades')", topics="orders,quotes", **metrics
    )
    assert len(rows) == 1000 and {r["topic"] for r in rows} == {"orders"}
    assert read_reports(tmp_path)["rows"] == 2000  # the option's topics were decoded

    rows = rows_of(spark, varied, "topic = 'trades'", topics="orders", **metrics)
    assert rows == []


def test_time_options_read_only_their_range_and_where_gets_the_same_rows(
    spark: Any, varied: Path, tmp_path: Path
) -> None:
    """Batch i of 100 records was stored at BASE_US + i s: batches 3..6 are txids
    301..700."""
    start = datetime.fromtimestamp((BASE_US + 3_000_000) / 1e6, UTC)
    end = datetime.fromtimestamp((BASE_US + 7_000_000) / 1e6, UTC)
    metrics = {"metrics_dir": str(tmp_path)}
    rows = rows_of(
        spark,
        varied,
        start_time=start.isoformat(),
        end_time=end.isoformat().replace("+00:00", "Z"),
        **metrics,
    )
    assert [r["txid"] for r in rows] == list(range(301, 701))
    assert read_reports(tmp_path) == {"partitions": 1, "scanned": 400, "rows": 400}

    where = f"local_ts >= '{start:%Y-%m-%d %H:%M:%S}' AND local_ts < '{end:%Y-%m-%d %H:%M:%S}'"
    rows = rows_of(spark, varied, where)
    assert [r["txid"] for r in rows] == list(range(301, 701))

    rows = rows_of(spark, varied, f"local_ts > '{start:%Y-%m-%d %H:%M:%S}'")
    assert rows[0]["txid"] == 401 and len(rows) == 2600


# --------------------------------------------------------------------------- one DataFrame
def test_one_dataframe_answers_filtered_and_unfiltered_queries_rightly_in_any_order(
    spark: Any, tmp_path: Path
) -> None:
    """Spark 4.3 keeps the partitions planned for one query of a DataFrame for its
    next unfiltered query: a reader narrowed by a filter made ``df.count()`` after
    ``df.where("topic = 'orders'").count()`` return the filtered count. Every query
    of one DataFrame must give its own right answer, whatever ran before; and the
    DataFrame reads the journal as it was at ``load()``, also after more records
    are stored."""
    journal = tmp_path / "journal"
    fill_varied(journal, 3000)
    df = spark.read.format("amps_txlog").load(str(journal))
    with Journal(journal, instance_name="inst", durability="page-cache") as j:
        j.append([varied_record(k, random.Random(5)) for k in range(3000, 3300)], BASE_US)
    by_topic = {"orders": 1000, "trades": 1000, "quotes": 1000}

    def grouped(frame: Any) -> dict[str, int]:
        return {r["topic"]: r["count"] for r in frame.groupBy("topic").count().collect()}

    df.createOrReplaceTempView("journal_view")
    answers = [
        ("count", lambda: df.count(), 3000),
        ("orders", lambda: df.where("topic = 'orders'").count(), 1000),
        ("count after a topic filter", lambda: df.count(), 3000),
        ("txid <= 100", lambda: df.where("txid <= 100").count(), 100),
        ("count after a txid filter", lambda: df.count(), 3000),
        ("groupBy after a txid filter", lambda: grouped(df), by_topic),
        (
            "groupBy of txid <= 99",
            lambda: grouped(df.where("txid <= 99")),
            {"orders": 33, "trades": 33, "quotes": 33},
        ),
        (
            "view filtered",
            lambda: spark.sql(
                "SELECT count(*) AS n FROM journal_view WHERE topic = 'trades'"
            ).first()["n"],
            1000,
        ),
        ("view", lambda: spark.sql("SELECT count(*) AS n FROM journal_view").first()["n"], 3000),
        ("groupBy after the view", lambda: grouped(df), by_topic),
        ("count last", lambda: df.count(), 3000),
    ]
    for what, query, expected in answers:
        assert query() == expected, f"{what}: expected {expected}"
    fresh = spark.read.format("amps_txlog").load(str(journal))
    assert fresh.count() == 3300, "a new load() reads the records stored since"
    assert df.count() == 3000


def test_a_directory_of_journals_reads_each_instance_and_no_store(
    spark: Any, tmp_path: Path
) -> None:
    """``load("./amps-data")`` where amps-data holds amps-a and amps-b (as the hot-hot
    walkthrough lays them out), each with a SOW store of its own inside it."""
    data = tmp_path / "amps-data"
    fill_varied(data / "amps-a", 1200, name="amps-a")
    fill_varied(data / "amps-b", 700, name="amps-b", seed=3)
    for name in ("amps-a", "amps-b"):  # an LMDB store inside a journal is not a journal
        store = data / name / "sow" / "orders"
        store.mkdir(parents=True)
        (store / "data.mdb").write_bytes(b"\0" * 4096)
    df = spark.read.format("amps_txlog").load(str(data))
    counts = {r["instance"]: r["count"] for r in df.groupBy("instance").count().collect()}
    assert counts == {"amps-a": 1200, "amps-b": 700}
    assert df.where("instance = 'amps-b' AND txid <= 10").count() == 10


# --------------------------------------------------------------------------- damage
def test_a_damaged_record_fails_the_job_naming_its_txid(
    spark: Any, varied: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    shutil.copytree(varied, journal)
    data = bytearray((journal / "data.mdb").read_bytes())
    needle = b'{"k":1234,'  # record k = 1234 is txid 1235 (a trades record)
    assert data.count(needle) == 1
    data[data.find(needle) + 3] ^= 0x20
    (journal / "data.mdb").write_bytes(bytes(data))

    df = spark.read.format("amps_txlog").load(str(journal))
    with pytest.raises(Exception, match=r"record txid 1235 is corrupt: CRC mismatch") as err:
        df.count()
    assert str(journal) in str(err.value)
    # filtering its topic out does not skip it: every record read is checked
    with pytest.raises(Exception, match=r"record txid 1235 is corrupt"):
        df.where("topic = 'orders'").count()
    # ranges that leave it out are never read, so they succeed
    after = spark.read.format("amps_txlog").option("min_txid", "1236").load(str(journal))
    assert after.count() == 1765
    up_to = spark.read.format("amps_txlog").option("max_txid", "1234").load(str(journal))
    assert up_to.count() == 1234


def test_bad_paths_and_options_say_what_to_do(spark: Any, tmp_path: Path, varied: Path) -> None:
    with pytest.raises(Exception, match=r"missing: no such directory; pass an instance's"):
        spark.read.format("amps_txlog").load(str(tmp_path / "missing")).count()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=r"holds no journal \(no data.mdb in it or below it\)"):
        spark.read.format("amps_txlog").load(str(tmp_path / "empty")).count()
    with pytest.raises(Exception, match="amps_txlog has no option topic; the options are"):
        spark.read.format("amps_txlog").option("topic", "a").load(str(varied)).count()
