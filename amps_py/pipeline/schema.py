"""The columns of a journal record, as Arrow and as Spark see them (pyarrow only).

One row per journal record. Every field of :class:`txlog.Record` has a column; the
message identity is ``bookmark`` (``<publisher hash>|<seq>|``, the same on every
instance). The unsigned 64-bit publisher hash does not fit Spark's signed long, so it
is a decimal string (as in the bookmark); seqs and txids are longs.

Columns, in order:

================  ==================  ==============================================
column            type                what
================  ==================  ==============================================
instance          string              the instance whose journal holds the record
txid              int64               its local transaction id there
bookmark          string              ``<publisher hash>|<seq>|``
publisher_hash    string              the publisher hash (decimal)
seq               int64               the publisher's sequence number
client_name       string              the publisher's client name
origin            string              the instance where it was published
origin_txid       int64               its txid at the origin
path              list<string>        instances it passed through, origin first
                                      (empty where it was published)
path_groups       list<string>        their groups, in the same order
topic             string
message_type      string              ``json``, ...
kind              string              ``publish``, ``delta_publish``, ``sow_delete``
origin_ts         timestamp[us, UTC]  when the origin stored it
local_ts          timestamp[us, UTC]  when this instance stored it
sow_key           string              "" when none
correlation_id    string              "" when none
flags             int32
payload           binary              the message body (decompressed)
payload_text      string              the body as text for text message types (json,
                                      xml, fix, nvfix), else null
================  ==================  ==============================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa

from txlog import Record
from txlog.record import Kind

#: message types whose bodies are text (AMPS's json, xml, fix and nvfix): their
#: ``payload_text`` is the body as text; binary types (bflat, bson, msgpack,
#: protobuf, binary, ...) have none (read ``payload``)
TEXT_TYPES: Final = ("json", "xml", "fix", "nvfix")

ARROW_SCHEMA: Final = pa.schema(
    [
        ("instance", pa.string()),
        ("txid", pa.int64()),
        ("bookmark", pa.string()),
        ("publisher_hash", pa.string()),
        ("seq", pa.int64()),
        ("client_name", pa.string()),
        ("origin", pa.string()),
        ("origin_txid", pa.int64()),
        ("path", pa.list_(pa.string())),
        ("path_groups", pa.list_(pa.string())),
        ("topic", pa.string()),
        ("message_type", pa.string()),
        ("kind", pa.string()),
        ("origin_ts", pa.timestamp("us", tz="UTC")),
        ("local_ts", pa.timestamp("us", tz="UTC")),
        ("sow_key", pa.string()),
        ("correlation_id", pa.string()),
        ("flags", pa.int32()),
        ("payload", pa.binary()),
        ("payload_text", pa.string()),
    ]
)

#: the same columns as a Spark DDL string (a data source's ``schema()``)
SPARK_DDL: Final = ", ".join(
    [
        "instance STRING",
        "txid BIGINT",
        "bookmark STRING",
        "publisher_hash STRING",
        "seq BIGINT",
        "client_name STRING",
        "origin STRING",
        "origin_txid BIGINT",
        "path ARRAY<STRING>",
        "path_groups ARRAY<STRING>",
        "topic STRING",
        "message_type STRING",
        "kind STRING",
        "origin_ts TIMESTAMP",
        "local_ts TIMESTAMP",
        "sow_key STRING",
        "correlation_id STRING",
        "flags INT",
        "payload BINARY",
        "payload_text STRING",
    ]
)

_KIND_NAMES: Final = {int(k): k.name.lower() for k in Kind}
_I64_MAX: Final = (1 << 63) - 1


class RecordTooLarge(ValueError):
    """A seq or txid above what a signed 64-bit column holds."""


def records_to_batch(instance: str, records: Sequence[Record]) -> pa.RecordBatch:
    """One Arrow record batch (:data:`ARROW_SCHEMA`) holding ``records`` of
    ``instance``'s journal, in the order given.

    Raises:
        RecordTooLarge: a seq above 2**63-1 (the message names the txid).
    """
    n = len(records)
    txid: list[int] = []
    bookmark: list[str] = []
    pub: list[str] = []
    seq: list[int] = []
    client: list[str] = []
    origin: list[str] = []
    origin_txid: list[int] = []
    path: list[list[str]] = []
    path_groups: list[list[str]] = []
    topic: list[str] = []
    mtype: list[str] = []
    kind: list[str] = []
    origin_ts: list[int] = []
    local_ts: list[int] = []
    sow_key: list[str] = []
    cid: list[str] = []
    flags: list[int] = []
    payload: list[bytes] = []
    text: list[str | None] = []
    kinds = _KIND_NAMES
    for rec in records:
        if rec.seq > _I64_MAX:
            raise RecordTooLarge(
                f"txid {rec.txid}: seq {rec.seq} does not fit a 64-bit signed column"
            )
        ph = str(rec.pub_hash)
        txid.append(rec.txid)
        pub.append(ph)
        seq.append(rec.seq)
        bookmark.append(f"{ph}|{rec.seq}|")
        client.append(rec.client_name)
        origin.append(rec.origin)
        origin_txid.append(rec.origin_txid)
        hops = rec.path
        path.append([name for name, _ in hops])
        path_groups.append([group for _, group in hops])
        topic.append(rec.topic)
        mt = rec.message_type
        mtype.append(mt)
        kind.append(kinds.get(rec.kind, str(rec.kind)))
        origin_ts.append(rec.origin_ts)
        local_ts.append(rec.local_ts)
        sow_key.append(rec.sow_key)
        cid.append(rec.correlation_id)
        flags.append(rec.flags)
        body = rec.payload
        payload.append(body)
        text.append(body.decode("utf-8", "replace") if mt in TEXT_TYPES else None)
    columns: list[Any] = [
        pa.array([instance] * n, pa.string()),
        pa.array(txid, pa.int64()),
        pa.array(bookmark, pa.string()),
        pa.array(pub, pa.string()),
        pa.array(seq, pa.int64()),
        pa.array(client, pa.string()),
        pa.array(origin, pa.string()),
        pa.array(origin_txid, pa.int64()),
        pa.array(path, pa.list_(pa.string())),
        pa.array(path_groups, pa.list_(pa.string())),
        pa.array(topic, pa.string()),
        pa.array(mtype, pa.string()),
        pa.array(kind, pa.string()),
        pa.array(origin_ts, pa.timestamp("us", tz="UTC")),
        pa.array(local_ts, pa.timestamp("us", tz="UTC")),
        pa.array(sow_key, pa.string()),
        pa.array(cid, pa.string()),
        pa.array(flags, pa.int32()),
        pa.array(payload, pa.binary()),
        pa.array(text, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
