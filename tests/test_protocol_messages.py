"""The frames the server sends (amps_py.protocol.messages), decoded back by the codec:
whole, byte by byte, and followed by trailing bytes."""

from __future__ import annotations

from typing import Any

import pytest

from amps_py.protocol import FrameDecoder, encode_frame, messages
from amps_py.units import utc_timestamp


def delivery(*pieces: bytes, payload: bytes) -> bytes:
    return messages.frame_head(b"".join(pieces), len(payload)) + payload


CASES: list[tuple[str, bytes, dict[str, Any], bytes]] = [
    (
        "delivery",
        delivery(
            messages.topic_head("orders"),
            messages.sub_id_part("s1"),
            messages.bookmark_part("12|3|"),
            messages.correlation_part("abc"),
            payload=b'{"id":1}',
        ),
        {"c": "publish", "t": "orders", "sub_id": "s1", "bm": "12|3|", "x": "abc"},
        b'{"id":1}',
    ),
    (
        "delivery to several subscriptions, odd topic",
        delivery(
            messages.topic_head('we"ird\\topic ü'),
            messages.sub_id_part("a"),
            messages.sids_part(["a", "b"]),
            messages.bookmark_part_of(2**64 - 1, 2**63),
            payload=b"",
        ),
        {
            "c": "publish",
            "t": 'we"ird\\topic ü',
            "sub_id": "a",
            "sids": "a,b",
            "bm": f"{2**64 - 1}|{2**63}|",
        },
        b"",
    ),
    (
        "no bookmark, no correlation id",
        delivery(
            messages.topic_head("t"),
            messages.sub_id_part("s"),
            messages.bookmark_part(""),
            messages.correlation_part(None),
            payload=b"x" * 300,
        ),
        {"c": "publish", "t": "t", "sub_id": "s"},
        b"x" * 300,
    ),
    (
        "timestamp",
        delivery(
            messages.topic_head("t"),
            messages.sub_id_part("s"),
            messages.timestamp_part(1_706_702_400_123_456),
            payload=b"{}",
        ),
        {"c": "publish", "t": "t", "sub_id": "s", "ts": "20240131T120000.123456Z"},
        b"{}",
    ),
    (
        "ack",
        messages.ack("processed", "failure", "7", reason="bad filter", detail="why"),
        {
            "c": "ack",
            "a": "processed",
            "cid": "7",
            "status": "failure",
            "reason": "bad filter",
            "detail": "why",
        },
        b"",
    ),
    (
        "persisted ack",
        messages.persisted_ack(42, 99),
        {"c": "ack", "a": "persisted", "status": "success", "s": 42, "bm": "99|42|"},
        b"",
    ),
    (
        "persisted ack of a publish that was not journaled",
        messages.persisted_ack(7, 99, messages.NOT_JOURNALED),
        {
            "c": "ack",
            "a": "persisted",
            "status": "success",
            "s": 7,
            "bm": "99|7|",
            "reason": "not journaled",
        },
        b"",
    ),
    (
        "publish failed",
        messages.publish_failed(5, "journal write failed", "no space"),
        {
            "c": "ack",
            "a": "persisted",
            "status": "failure",
            "s": 5,
            "reason": "journal write failed",
            "detail": "no space",
        },
        b"",
    ),
    (
        "subscription persisted",
        messages.subscription_persisted("s", "1|2|"),
        {"c": "ack", "a": "persisted", "status": "success", "sub_id": "s", "bm": "1|2|"},
        b"",
    ),
    ("heartbeat", messages.HEARTBEAT, {"c": "heartbeat"}, b""),
    ("group begin", messages.group_begin("q"), {"c": "group_begin", "query_id": "q"}, b""),
    ("group end", messages.group_end("q"), {"c": "group_end", "query_id": "q"}, b""),
    (
        "sow batch",
        messages.sow_batch(
            "orders",
            "q1",
            [
                ("11", b'{"id":11}', None, "", 0),
                ("12", b'{"id":12,"s":"}{"}', "abc", "5|7|", 1_706_702_400_123_456),
            ],
        ),
        {"c": "sow", "t": "orders", "query_id": "q1", "bs": 2},
        b'{"k":"11","l":9}{"id":11}'
        b'{"k":"12","l":18,"x":"abc","bm":"5|7|","ts":"20240131T120000.123456Z"}'
        b'{"id":12,"s":"}{"}',
    ),
    (
        "sow batch of a sow_and_subscribe, empty payload",
        messages.sow_batch("t", "q", [("k1", b"", "", "", 0)], sub_id="s9"),
        {"c": "sow", "t": "t", "query_id": "q", "sub_id": "s9", "bs": 1},
        b'{"k":"k1","l":0}',
    ),
    (
        "oof deleted",
        messages.oof("orders", "s1", "11", "deleted", b'{"id":11}', "abc"),
        {
            "c": "oof",
            "t": "orders",
            "sub_id": "s1",
            "k": "11",
            "reason": "deleted",
            "x": "abc",
            "l": 9,
        },
        b'{"id":11}',
    ),
    (
        "oof to several subscriptions",
        messages.oof("orders", ["a", "b"], "12", "match", b"{}"),
        {
            "c": "oof",
            "t": "orders",
            "sub_id": "a",
            "sids": "a,b",
            "k": "12",
            "reason": "match",
            "l": 2,
        },
        b"{}",
    ),
    (
        "sow stats ack",
        messages.ack(
            "stats", cid="4", query_id="q1", records_returned=2, topic_matches=10, matches=3
        ),
        {
            "c": "ack",
            "a": "stats",
            "cid": "4",
            "status": "success",
            "query_id": "q1",
            "records_returned": 2,
            "topic_matches": 10,
            "matches": 3,
        },
        b"",
    ),
    (
        "sow_delete stats ack",
        messages.ack("stats", cid="5", records_deleted=4, topic_matches=9, matches=4),
        {
            "c": "ack",
            "a": "stats",
            "cid": "5",
            "status": "success",
            "records_deleted": 4,
            "topic_matches": 9,
            "matches": 4,
        },
        b"",
    ),
]


@pytest.mark.parametrize("name,data,header,payload", CASES, ids=[c[0] for c in CASES])
def test_frames_decode_whole_byte_by_byte_and_with_trailing_bytes(
    name: str, data: bytes, header: dict[str, Any], payload: bytes
) -> None:
    whole = FrameDecoder()
    whole.receive_data(data)
    (frame,) = list(whole.frames())
    assert (frame.header, frame.payload) == (header, payload)

    split = FrameDecoder()
    got = []
    for i in range(len(data)):
        split.receive_data(data[i : i + 1])
        got.extend(split.frames())
    assert [(f.header, f.payload) for f in got] == [(header, payload)]

    trailing = FrameDecoder()
    following = encode_frame({"c": "heartbeat"})
    trailing.receive_data(data + following[:3])
    (first,) = list(trailing.frames())
    assert (first.header, first.payload) == (header, payload)
    assert trailing.buffered == 3, "the start of the next frame stays buffered"


def test_one_timestamp_format() -> None:
    assert utc_timestamp(1_706_702_400_123_456) == "2024-01-31T12:00:00.123456Z"
    assert utc_timestamp(1_706_702_400_123_456, style="amps") == "20240131T120000.123456Z"
    assert utc_timestamp(1_706_702_400_123_456, precision="s") == "2024-01-31T12:00:00Z"
