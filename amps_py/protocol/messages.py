"""The frames the server sends: deliveries, acks, heartbeats and query groups (sans-IO).

A delivered message is the hot path. Its header is assembled from byte pieces that are
built once and reused (the topic head per topic, the ``sub_id`` piece per
subscription, the bookmark and correlation pieces per message), never through a dict
and a JSON encoder per message; :func:`frame_head` closes the header and puts the
length prefix in front, and the payload follows as its own buffer (no copy).

A ``sow`` query result batch (:func:`sow_batch`) is built the same way, from pieces,
since a query may return a million records. Everything else (acks, heartbeats,
``group_begin``/``group_end``, ``oof``) is rare enough to go through
:func:`amps_py.protocol.encode_frame`.

Every builder here returns bytes that :class:`amps_py.protocol.FrameDecoder` decodes
back to the fields given (tests/test_protocol_messages.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Final, TypeAlias

import orjson

from amps_py.units import utc_timestamp

from .codec import encode_frame

#: one record of a sow batch: (sow key, payload, correlation id or None/"",
#: bookmark or "", timestamp in µs since the epoch or 0 for none)
SowBatchRecord: TypeAlias = tuple[str, bytes, Any, str, int]

#: the one heartbeat frame the server sends
HEARTBEAT: Final = encode_frame({"c": "heartbeat"})


# ---------------------------------------------------------------------- delivery pieces


def topic_head(topic: str) -> bytes:
    """The opening of a ``publish`` delivery header for ``topic``."""
    return b'{"c":"p","t":' + orjson.dumps(topic)


def sub_id_part(sub_id: str) -> bytes:
    """The ``sub_id`` piece of a delivery header (built once per subscription)."""
    return b',"sub_id":' + orjson.dumps(sub_id)


def sids_part(sub_ids: Iterable[str]) -> bytes:
    """The ``sids`` piece: one delivery for several subscriptions of a connection."""
    return b',"sids":' + orjson.dumps(",".join(sub_ids))


def bookmark_part(bookmark: str) -> bytes:
    """The ``bm`` piece (empty for a message without a bookmark)."""
    return b',"bm":"' + bookmark.encode() + b'"' if bookmark else b""


def bookmark_part_of(pub_hash: int, seq: int) -> bytes:
    """The ``bm`` piece of the message ``<pub_hash>|<seq>|``."""
    return b',"bm":"%d|%d|"' % (pub_hash, seq)


def correlation_part(correlation_id: Any) -> bytes:
    """The ``x`` piece (empty when there is no correlation id)."""
    return b',"x":' + orjson.dumps(str(correlation_id)) if correlation_id else b""


def sow_key_part(sow_key: str) -> bytes:
    """The ``k`` piece: the SOW key of a message of a SOW topic."""
    return b',"k":' + orjson.dumps(sow_key)


def timestamp_part(ts_us: int) -> bytes:
    """The ``ts`` piece for the ``timestamp`` option: ``ts_us`` (µs since the epoch,
    UTC), or now for 0."""
    stamp = utc_timestamp(ts_us or time.time_ns() // 1000, style="amps")
    return b',"ts":"' + stamp.encode() + b'"'


def frame_head(header: bytes, payload_size: int) -> bytes:
    """The length prefix and the closed header of a delivery whose header pieces are
    ``header`` (without the closing brace) and whose payload has ``payload_size``
    bytes; the payload is sent after it as it is."""
    header += b"}"
    return (len(header) + payload_size).to_bytes(4, "big") + header


# ---------------------------------------------------------------------- acks and others


def ack(ack_type: str, status: str = "success", cid: Any = None, **fields: Any) -> bytes:
    """An ``ack`` frame: ``a`` = ``ack_type``, ``cid`` when the command had one, then
    ``status`` and ``fields`` (``reason``, ``s``, ``sub_id``, ``bm``, ...).

    The ``stats`` ack of the sow family is ``ack("stats", cid=..., query_id=...,
    records_returned=n, topic_matches=n, matches=n)``; of ``sow_delete``,
    ``ack("stats", ..., records_deleted=n, topic_matches=n, matches=n)`` (integers
    stay JSON numbers)."""
    header: dict[str, Any] = {"c": "ack", "a": ack_type}
    if cid is not None:
        header["cid"] = cid
    header["status"] = status
    header.update(fields)
    return encode_frame(header)


#: the ``reason`` of a persisted ack whose ``s`` is a publish to a topic this
#: instance does not journal (acknowledged, as AMPS does, but not stored)
NOT_JOURNALED = "not journaled"


def persisted_ack(seq: int, pub_hash: int, reason: str = "") -> bytes:
    """The conflated ``persisted`` ack for a publisher: everything up to ``seq`` is
    durable (no ``cid``: it answers many publishes). ``reason``
    (:data:`NOT_JOURNALED`) says that the publish ``seq`` was not stored; clients that
    do not know the field ignore it."""
    header = {"c": "ack", "a": "persisted", "status": "success", "s": seq}
    header["bm"] = f"{pub_hash}|{seq}|"
    if reason:
        header["reason"] = reason
    return encode_frame(header)


def publish_failed(seq: int, reason: str, detail: str) -> bytes:
    """A ``persisted`` failure ack for one publish that was not stored."""
    return encode_frame(
        {
            "c": "ack",
            "a": "persisted",
            "status": "failure",
            "s": seq,
            "reason": reason,
            "detail": detail,
        }
    )


def subscription_persisted(sub_id: str, bookmark: str) -> bytes:
    """The periodic ``persisted`` ack of a bookmark subscription: the latest bookmark
    that is durable, a safe resume point even when no matching message flows."""
    return encode_frame(
        {"c": "ack", "a": "persisted", "status": "success", "sub_id": sub_id, "bm": bookmark}
    )


def group_begin(query_id: str) -> bytes:
    return encode_frame({"c": "group_begin", "query_id": query_id})


def group_end(query_id: str) -> bytes:
    return encode_frame({"c": "group_end", "query_id": query_id})


# ---------------------------------------------------------------------- sow results


def sow_batch(
    topic: str,
    query_id: str,
    records: Sequence[SowBatchRecord],
    *,
    sub_id: str | None = None,
) -> bytes:
    """One ``sow`` frame holding ``records`` (AMPS-NOTES 1.4.2): the outer header
    (``c`` = sow, ``t``, ``query_id``, ``sub_id`` for a ``sow_and_subscribe``, ``bs`` =
    the number of records), then per record a header with ``k``, ``l`` (the exact
    payload length), ``x`` when it has a correlation id, ``bm`` when it has a bookmark
    and ``ts`` when its timestamp is not 0, followed by the payload.

    The caller cuts the results into batches of at most the query's ``bs``;
    :func:`amps_py.protocol.sow.split_sow_batch` takes such a frame apart again.
    """
    dumps = orjson.dumps
    parts = [b""]
    for key, payload, correlation_id, bookmark, ts_us in records:
        head = b'{"k":' + dumps(key) + b',"l":%d' % len(payload)
        if correlation_id:
            head += correlation_part(correlation_id)
        if bookmark:
            head += bookmark_part(bookmark)
        if ts_us:
            head += timestamp_part(ts_us)
        parts.append(head + b"}")
        parts.append(payload)
    outer = b'{"c":"sow","t":' + dumps(topic) + b',"query_id":' + dumps(query_id)
    if sub_id is not None:
        outer += sub_id_part(sub_id)
    parts[0] = outer + b',"bs":%d}' % len(records)
    body = b"".join(parts)
    return len(body).to_bytes(4, "big") + body


def oof(
    topic: str,
    sub_ids: str | Sequence[str],
    key: str,
    reason: str,
    payload: bytes,
    correlation_id: Any = None,
) -> bytes:
    """An ``oof`` (out of focus) message (AMPS-NOTES 1.4.4): the record ``key`` of
    ``topic`` no longer matches the subscription(s) ``sub_ids`` because of ``reason``
    (``deleted``, ``expired``, ``match`` or ``entitlement``). ``payload`` is the new
    message for ``match`` and the last one otherwise. One subscription is named in
    ``sub_id``; several as in a delivery: ``sub_id`` (the first) and ``sids``."""
    ids = [sub_ids] if isinstance(sub_ids, str) else list(sub_ids)
    if not ids:
        raise ValueError("oof needs at least one subscription id in sub_ids")
    header: dict[str, Any] = {"c": "oof", "t": topic, "sub_id": ids[0]}
    if len(ids) > 1:
        header["sids"] = ",".join(ids)
    header["k"] = key
    header["reason"] = reason
    if correlation_id:
        header["x"] = str(correlation_id)
    header["l"] = len(payload)
    return encode_frame(header, payload)
