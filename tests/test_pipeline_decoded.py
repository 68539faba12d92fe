"""The ``decoded`` column (amps_py.pipeline.with_decoded): every message type's body
as JSON text a Spark query can look into, the same document ``amps-py txlog dump``
prints; from a real journal (txlog.Journal, real LMDB) and its Parquet export, read
by real local Spark."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

import bson
import msgpack
from clirun import run
from pipeline_journals import BASE_US

from amps_py.pipeline.decode import stored_to_batch
from amps_py.pipeline.decoded import add_decoded, decode_body
from txlog import Journal, Record, publisher_hash

#: one body per message type, and what ``decoded`` holds for it
BODIES: dict[str, tuple[bytes, Any]] = {
    "json": (b'{"id": 1, "sym": "IBM"}', {"id": 1, "sym": "IBM"}),
    "fix": (b"35=D\x0155=IBM\x0138=100\x01", {"35": "D", "55": "IBM", "38": "100"}),
    "nvfix": (b"Symbol=IBM\x01Price=140.5\x01", {"Symbol": "IBM", "Price": "140.5"}),
    "xml": (b"<Order id='7'><Qty>5</Qty></Order>", {"Order": {"@id": "7", "Qty": "5"}}),
    "bson": (
        bson.encode({"sym": "IBM", "qty": 5, "at": datetime.datetime(2026, 1, 1)}),
        {"sym": "IBM", "qty": 5, "at": 1767225600000},
    ),
    "msgpack": (msgpack.packb({"sym": "IBM", "legs": [1, 2]}), {"sym": "IBM", "legs": [1, 2]}),
    "binary": (b"\xde\xad\xbe\xef", None),
    "bflat": (b"\x00\x01", None),  # a type amps-py does not decode
}
#: bodies that do not parse as their type: decoded is null, never an error
MALFORMED = {"json": b"hello", "xml": b"<Order", "bson": b"\x05\x00", "msgpack": b"\xc1"}


def write_journal(path: Path) -> None:
    records = [(t, body) for t, (body, _) in BODIES.items()] + list(MALFORMED.items())
    with Journal(path, instance_name="inst", durability="page-cache") as j:
        j.append(
            [
                Record(
                    topic=f"t-{mtype}",
                    payload=body,
                    pub_hash=publisher_hash("p"),
                    seq=i + 1,
                    client_name="p",
                    message_type=mtype,
                )
                for i, (mtype, body) in enumerate(records)
            ],
            BASE_US,
        )


def expected_rows() -> list[tuple[str, Any]]:
    good = [(t, want) for t, (_, want) in BODIES.items()]
    return good + [(t, None) for t in MALFORMED]


def test_decoded_is_each_types_document_as_json_and_null_when_it_does_not_parse(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path / "j")
    with Journal(tmp_path / "j", readonly=True) as j:
        batch = add_decoded(stored_to_batch("inst", j.read_stored(0, 100)))
    got = [
        (mtype, None if text is None else json.loads(text))
        for mtype, text in zip(
            batch.column("message_type").to_pylist(),
            batch.column("decoded").to_pylist(),
            strict=True,
        )
    ]
    assert got == expected_rows()
    # a JSON body is kept as it was written, not rewritten
    assert batch.column("decoded")[0].as_py() == BODIES["json"][0].decode()


def test_decoded_is_what_txlog_dump_prints_for_every_decoded_type(tmp_path: Path) -> None:
    write_journal(tmp_path / "j")
    res = run("txlog", "dump", str(tmp_path / "j"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        row = json.loads(line)
        if "decoded" in row and row["decoded"] is not None:
            payload = next(body for t, (body, _) in BODIES.items() if t == row["message_type"])
            ours = decode_body(row["message_type"], payload)
            assert ours is not None and json.loads(ours) == row["decoded"], row


def test_spark_queries_every_type_through_decoded_from_a_journal_and_its_export(
    spark: Any, tmp_path: Path
) -> None:
    from amps_py.pipeline import with_decoded
    from amps_py.pipeline.sources import read_export

    write_journal(tmp_path / "j")
    res = run("pipeline", "export", str(tmp_path / "j"), str(tmp_path / "out"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for df in (
        spark.read.format("amps_txlog").load(str(tmp_path / "j")),
        read_export(spark, tmp_path / "out"),
    ):
        frame = with_decoded(df)
        assert frame.columns[-1] == "decoded"
        rows = frame.orderBy("txid").select("message_type", "decoded").collect()
        got = [(r.message_type, None if r.decoded is None else json.loads(r.decoded)) for r in rows]
        assert got == expected_rows()
        # one query over every type: the symbol, wherever each type keeps it
        symbols = {
            r.message_type: r.sym
            for r in frame.selectExpr(
                "message_type",
                "coalesce(get_json_object(decoded, '$.sym'), "
                "get_json_object(decoded, \"$['55']\"), "
                "get_json_object(decoded, '$.Symbol')) AS sym",
            ).collect()
            if r.sym is not None
        }
        assert symbols == {t: "IBM" for t in ("json", "fix", "nvfix", "bson", "msgpack")}


def test_with_decoded_names_the_columns_it_needs(spark: Any, tmp_path: Path) -> None:
    from amps_py.pipeline import with_decoded

    write_journal(tmp_path / "j")
    df = spark.read.format("amps_txlog").load(str(tmp_path / "j"))
    with pytest.raises(ValueError, match=r"lacks payload \(select them too"):
        with_decoded(df.select("txid", "message_type"))
    with pytest.raises(ValueError, match="already has a decoded column"):
        with_decoded(with_decoded(df))
