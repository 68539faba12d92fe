"""Stored journal records to one Arrow batch, a column at a time (pyarrow only).

:func:`stored_to_batch` builds exactly the batch :func:`.schema.records_to_batch`
builds, from what :meth:`txlog.Journal.read_stored` returns (records already checked:
CRC, format version, txid), without a :class:`txlog.Record` per record: the fixed
fields become columns through one transpose, and every string is cut out of one Arrow
buffer holding all stored values by Arrow kernels instead of Python slicing. About
three times as fast as decoding Records (docs/BENCHMARKS.md, "Spark pipeline").

:func:`select_stored` drops records outside a topic set or a local time range before
anything is decoded (the data source's pushdown).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from txlog import CorruptRecord
from txlog.record import (
    FIXED_SIZE,
    STORED_FIELDS,
    ZSTD_FLAG,
    StoredRecords,
    decode_path,
    stored_payload,
)

from .schema import _I64_MAX, _KIND_NAMES, ARROW_SCHEMA, TEXT_TYPES, RecordTooLarge

_AT: Final = {name: i for i, name in enumerate(STORED_FIELDS)}
_KIND: Final = _AT["kind"]
_FLAGS: Final = _AT["flags"]
_TXID: Final = _AT["txid"]
_PUB: Final = _AT["pub_hash"]
_SEQ: Final = _AT["seq"]
_ORIGIN_TXID: Final = _AT["origin_txid"]
_ORIGIN_TS: Final = _AT["origin_ts"]
_LOCAL_TS: Final = _AT["local_ts"]
_N_CLIENT: Final = _AT["n_client_name"]
_N_ORIGIN: Final = _AT["n_origin"]
_N_TOPIC: Final = _AT["n_topic"]
#: the seven string lengths, in stored order
_STRINGS: Final = tuple(range(_N_CLIENT, _N_CLIENT + 7))

#: the ``kind`` column's value for every possible stored kind byte
_KIND_TABLE: Final = pa.array([_KIND_NAMES.get(k, str(k)) for k in range(256)], pa.string())
_NOT_ZSTD: Final = pa.scalar(0xFFFF & ~ZSTD_FLAG, pa.int32())
_TS: Final = pa.timestamp("us", tz="UTC")


def stored_to_batch(instance: str, stored: StoredRecords) -> pa.RecordBatch:
    """One Arrow batch (:data:`.schema.ARROW_SCHEMA`) of ``stored`` records of
    ``instance``'s journal, in the order given; the same as
    ``records_to_batch(instance, [decoded records])``.

    Raises:
        RecordTooLarge: a seq above 2**63-1 (the message names the txid).
        CorruptRecord: a text field is not UTF-8, or a compressed payload does not
            decompress (the txid named); cannot happen to a record that passed its CRC
            unless the writer stored it so.
    """
    values = stored.values
    n = len(values)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    fields = list(zip(*stored.fields, strict=True))
    txids = fields[_TXID]
    seqs = fields[_SEQ]
    if max(seqs) > _I64_MAX:
        txid = next(t for t, s in zip(txids, seqs, strict=True) if s > _I64_MAX)
        seq = next(s for s in seqs if s > _I64_MAX)
        raise RecordTooLarge(f"txid {txid}: seq {seq} does not fit a 64-bit signed column")
    # every stored value in one buffer; each string column is a gather out of it
    whole = pa.array(values, pa.large_binary())
    buffers = whole.buffers()
    data = buffers[2]
    starts = pa.Array.from_buffers(pa.int64(), n, [None, buffers[1]])
    ends = pa.Array.from_buffers(pa.int64(), n, [None, buffers[1]], offset=1)
    pos = pc.add(starts, pa.scalar(FIXED_SIZE, pa.int64()))
    strings: list[pa.Array] = []
    for k in _STRINGS:
        end = pc.add(pos, pa.array(fields[k], pa.int64()))
        strings.append(_cut(data, pos, end))
        pos = end
    client, origin, topic, mtype, sow_key, cid, path_raw = strings
    texts = [_text(col, txids) for col in (client, origin, topic, mtype, sow_key, cid)]
    client_s, origin_s, topic_s, mtype_s, sow_key_s, cid_s = texts
    path, path_groups = _paths(path_raw, fields[_AT["n_path"]], txids)
    flags = fields[_FLAGS]
    if any(f & ZSTD_FLAG for f in flags):
        body = pa.array(
            [
                stored_payload(value, _payload_at(f), f[_FLAGS], f[_TXID])
                for f, value in zip(stored.fields, values, strict=True)
            ],
            pa.binary(),
        )
    else:
        body = _cut(data, pos, ends).cast(pa.binary())
    pub = pa.array(fields[_PUB], pa.uint64()).cast(pa.string())
    seq_s = pa.array(seqs, pa.uint64()).cast(pa.string())
    columns = [
        pa.repeat(pa.scalar(instance, pa.string()), n),
        pa.array(txids, pa.int64()),
        pc.binary_join_element_wise(pub, seq_s, "", "|"),
        pub,
        pa.array(seqs, pa.int64()),
        client_s,
        origin_s,
        pa.array(fields[_ORIGIN_TXID], pa.int64()),
        path,
        path_groups,
        topic_s,
        mtype_s,
        _KIND_TABLE.take(pa.array(fields[_KIND], pa.uint8())),
        pa.array(fields[_ORIGIN_TS], pa.int64()).cast(_TS),
        pa.array(fields[_LOCAL_TS], pa.int64()).cast(_TS),
        sow_key_s,
        cid_s,
        pc.bit_wise_and(pa.array(flags, pa.int32()), _NOT_ZSTD),
        body,
        _payload_text(body, mtype_s),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def select_stored(
    stored: StoredRecords,
    topics: Collection[bytes] | None = None,
    start_us: int | None = None,
    end_us: int | None = None,
) -> StoredRecords:
    """The records of ``stored`` whose topic (UTF-8) is in ``topics`` and whose local
    timestamp is in ``[start_us, end_us)``; ``None`` places no bound. Decodes nothing
    but the bounds it checks."""
    if topics is None and start_us is None and end_us is None:
        return stored
    lo = start_us if start_us is not None else -1
    hi = end_us if end_us is not None else 1 << 64
    fields: list[tuple[int, ...]] = []
    values: list[bytes] = []
    for f, value in zip(stored.fields, stored.values, strict=True):
        if not lo <= f[_LOCAL_TS] < hi:
            continue
        if topics is not None:
            at = FIXED_SIZE + f[_N_CLIENT] + f[_N_ORIGIN]
            if value[at : at + f[_N_TOPIC]] not in topics:
                continue
        fields.append(f)
        values.append(value)
    return StoredRecords(fields, values)


def _payload_at(f: tuple[int, ...]) -> int:
    return FIXED_SIZE + sum(f[k] for k in _STRINGS)


@lru_cache(maxsize=16)
def _interleave(n: int) -> tuple[pa.Array, pa.Array]:
    """Indices that interleave two arrays of ``n`` (a0, b0, a1, b1, ...), and the even
    indices of ``2n - 1`` items."""
    both = pa.array([x for i in range(n) for x in (i, n + i)], pa.int64())
    return both, pa.array(range(0, 2 * n, 2), pa.int64())


def _cut(data: pa.Buffer, starts: pa.Array, ends: pa.Array) -> pa.Array:
    """The bytes ``data[starts[i]:ends[i]]`` for every i, as a large_binary array
    (``starts``/``ends`` ascending and not overlapping, as fields of consecutive
    records are). Built as one binary array whose offsets are the interleaved bounds
    (items: field 0, gap, field 1, gap, ...), then its even items taken."""
    n = len(starts)
    both, even = _interleave(n)
    bounds = pc.take(pa.concat_arrays([starts, ends]), both)
    spans = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, bounds.buffers()[1], data])
    return pc.take(spans, even)


def _text(column: pa.Array, txids: Sequence[int]) -> pa.Array:
    """``column`` as strings; CorruptRecord naming the first record not UTF-8."""
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        for txid, raw in zip(txids, column.to_pylist(), strict=True):
            try:
                raw.decode()
            except UnicodeDecodeError as exc:
                raise CorruptRecord(txid, f"text field is not UTF-8 ({exc})") from None
        raise


def _paths(
    raw: pa.Array, lengths: Sequence[int], txids: Sequence[int]
) -> tuple[pa.Array, pa.Array]:
    """The ``path`` and ``path_groups`` list columns: each distinct stored path is
    decoded once (a fabric has few), then taken per record."""
    list_type = pa.list_(pa.string())
    if not any(lengths):
        empty = pa.ListArray.from_arrays(
            pa.array([0] * (len(lengths) + 1), pa.int32()), pa.array([], pa.string())
        )
        return empty, empty
    encoded = pc.dictionary_encode(raw)
    names: list[list[str]] = []
    groups: list[list[str]] = []
    for distinct in encoded.dictionary.to_pylist():
        try:
            hops = decode_path(distinct)
        except UnicodeDecodeError as exc:
            txid = next(t for t, r in zip(txids, raw.to_pylist(), strict=True) if r == distinct)
            raise CorruptRecord(txid, f"path is not UTF-8 ({exc})") from None
        names.append([name for name, _ in hops])
        groups.append([group for _, group in hops])
    indices = encoded.indices
    return pa.array(names, list_type).take(indices), pa.array(groups, list_type).take(indices)


def _payload_text(body: pa.Array, mtype: pa.Array) -> pa.Array:
    """The ``payload_text`` column: the body as text for the :data:`TEXT_TYPES`
    (invalid UTF-8 replaced, as ``bytes.decode(errors="replace")``), else null."""
    is_text = pc.is_in(mtype, value_set=pa.array(TEXT_TYPES, pa.string()))
    every = pc.all(is_text).as_py()
    try:
        text = body.cast(pa.string())
    except pa.ArrowInvalid:
        flags = is_text.to_pylist()
        return pa.array(
            [
                raw.decode("utf-8", "replace") if t else None
                for raw, t in zip(body.to_pylist(), flags, strict=True)
            ],
            pa.string(),
        )
    if every:
        return text
    return pc.if_else(is_text, text, pa.scalar(None, pa.string()))
