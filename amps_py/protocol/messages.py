"""The frames the server sends: deliveries, acks, heartbeats and query groups (sans-IO).

A delivered message is the hot path. Its header is assembled from byte pieces that are
built once and reused (the topic head per topic, the ``sub_id`` piece per
subscription, the bookmark and correlation pieces per message), never through a dict
and a JSON encoder per message; :func:`frame_head` closes the header and puts the
length prefix in front, and the payload follows as its own buffer (no copy).

Everything else (acks, heartbeats, ``group_begin``/``group_end``) is rare enough to go
through :func:`amps_py.protocol.encode_frame`.

Every builder here returns bytes that :class:`amps_py.protocol.FrameDecoder` decodes
back to the fields given (tests/test_protocol_messages.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

import orjson

from amps_py.units import utc_timestamp

from .codec import encode_frame

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
    ``status`` and ``fields`` (``reason``, ``s``, ``sub_id``, ``bm``, ...)."""
    header: dict[str, Any] = {"c": "ack", "a": ack_type}
    if cid is not None:
        header["cid"] = cid
    header["status"] = status
    header.update(fields)
    return encode_frame(header)


def persisted_ack(seq: int, pub_hash: int) -> bytes:
    """The conflated ``persisted`` ack for a publisher: everything up to ``seq`` is
    durable (no ``cid``: it answers many publishes)."""
    return encode_frame(
        {"c": "ack", "a": "persisted", "status": "success", "s": seq, "bm": f"{pub_hash}|{seq}|"}
    )


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
