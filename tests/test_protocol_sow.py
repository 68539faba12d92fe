"""Taking a ``sow`` batch frame apart (amps_py.protocol.split_sow_batch): the records
a client gets back are exactly the ones the server put in, and a damaged batch is
refused with a ProtocolError that names the record and the problem."""

from __future__ import annotations

import random

import pytest

from amps_py.protocol import (
    Frame,
    FrameDecoder,
    ProtocolError,
    SowRecord,
    encode_frame,
    messages,
    split_sow_batch,
)

SEED = 14
print(f"test_protocol_sow: random seed {SEED}")


def decode_one(data: bytes) -> Frame:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    (frame,) = list(decoder.frames())
    return frame


def batch(header: dict[str, object], body: bytes) -> Frame:
    return decode_one(encode_frame(header, body))


def test_records_come_back_as_sent_whole_and_byte_by_byte() -> None:
    rng = random.Random(SEED)
    records: list[messages.SowBatchRecord] = []
    for i in range(40):
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
        if i % 3 == 0:
            payload = b'{"id":%d,"note":"} { \\" }"}' % i  # braces and quotes inside
        correlation = f"corr{i}" if i % 2 else None
        bookmark = f"{i}|{i * 7}|" if i % 5 else ""
        records.append((f"key-{i}", payload, correlation, bookmark, 0))
    data = messages.sow_batch("orders", "q7", records, sub_id="s1")
    decoder = FrameDecoder()
    frames = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        frames.extend(decoder.frames())
    assert len(frames) == 1
    for frame in (frames[0], decode_one(data)):
        got = split_sow_batch(frame)
        assert got == [
            SowRecord("orders", key, payload, correlation or "", bookmark)
            for key, payload, correlation, bookmark, _ in records
        ]


def test_timestamp_key_forms_and_long_header_names() -> None:
    data = messages.sow_batch("t", "q", [("k", b"{}", None, "", 1_706_702_400_123_456)])
    (record,) = split_sow_batch(decode_one(data))
    assert record.timestamp == "20240131T120000.123456Z"
    # what another server may send: long names, a numeric l given as text
    frame = batch(
        {"c": "sow", "t": "t", "bs": 1},
        b'{"sow_key":"a}b","msg_len":"2","correlation_id":"x1"}{}',
    )
    assert split_sow_batch(frame) == [SowRecord("t", "a}b", b"{}", "x1")]
    assert split_sow_batch(frame)[0].json() == {}


def test_an_empty_batch_and_a_batch_without_bs() -> None:
    assert split_sow_batch(decode_one(messages.sow_batch("t", "q", []))) == []
    frame = batch({"c": "sow", "t": "t"}, b'{"k":"1","l":1}a{"k":"2","l":1}b')
    assert [r.data for r in split_sow_batch(frame)] == [b"a", b"b"]


DAMAGED = [
    (
        "l too long: truncated record",
        {"c": "sow", "t": "t", "bs": 2},
        b'{"k":"1","l":3}abc{"k":"2","l":9}{"id":2}',
        r"sow record 2 \(key '2'\) says l=9 but only 8 byte\(s\) follow its header: "
        r"the record is truncated or its l is wrong",
    ),
    (
        "l too short: the next record does not start with a header",
        {"c": "sow", "t": "t", "bs": 2},
        b'{"k":"1","l":5}{"id":1}{"k":"2","l":2}{}',
        r"sow record 2 at byte 20 of the batch does not start with a JSON header '\{'; "
        r"record 1 \(key '1'\) has a wrong l",
    ),
    (
        "l too short, landing on a brace inside the payload",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1","l":5}{"a":{"b":1}}',
        r"sow record 2 has no 'l' \(msg_len\) field.*record 1 \(key '1'\) has a wrong l",
    ),
    (
        "no l",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1"}{}',
        r"sow record 1 has no 'l' \(msg_len\) field; every record header must give the "
        r"exact byte length of its payload",
    ),
    (
        "l not a number",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1","l":"two"}ab',
        r"sow record 1: header field 'l' must be an integer, got 'two'",
    ),
    (
        "negative l",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1","l":-1}ab',
        r"sow record 1 has a negative length l=-1",
    ),
    (
        "bs larger than the records",
        {"c": "sow", "t": "t", "bs": 3},
        b'{"k":"1","l":1}a{"k":"2","l":1}b',
        r"sow batch header says bs=3 but the frame holds 2 record\(s\)",
    ),
    (
        "bs smaller than the records",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1","l":1}a{"k":"2","l":1}b',
        r"sow batch header says bs=1 but the frame holds 2 record\(s\)",
    ),
    (
        "records cut off after the outer header",
        {"c": "sow", "t": "t", "bs": 2},
        b"",
        r"sow batch header says bs=2 but the frame holds 0 record\(s\)",
    ),
    (
        "record header cut in half",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":"1","l',
        r"sow record 1 at byte 0 has no complete JSON header; the batch is damaged",
    ),
    (
        "nested record header",
        {"c": "sow", "t": "t", "bs": 1},
        b'{"k":{"x":1},"l":0}',
        r"sow record 1 header field 'k' is not a string or a number",
    ),
]


@pytest.mark.parametrize("name,header,body,message", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_batches_are_refused_naming_the_problem(
    name: str, header: dict[str, object], body: bytes, message: str
) -> None:
    with pytest.raises(ProtocolError, match=message) as caught:
        split_sow_batch(batch(header, body))
    assert caught.value.reason == "invalid sow batch"


def test_a_frame_that_is_not_a_sow_batch_is_refused() -> None:
    with pytest.raises(ProtocolError, match=r"only frames with \"c\":\"sow\" hold sow records"):
        split_sow_batch(decode_one(messages.group_begin("q")))


def test_every_truncation_of_a_batch_is_refused() -> None:
    """Whatever number of bytes is lost from the end of a batch's records (a server
    that wrote a short frame), the client is told, never handed fewer records."""
    data = messages.sow_batch(
        "t", "q", [("1", b'{"id":1}', "c", "1|1|", 0), ("2", b'{"id":2}', None, "", 0)]
    )
    frame = decode_one(data)
    for cut in range(len(frame.payload)):
        short = Frame(frame.header, frame.payload[:cut])
        with pytest.raises(ProtocolError):
            split_sow_batch(short)
