"""The replication link protocol, sans-IO: two state machines talking through bytes,
with time passed in. Every exchange is also fed byte by byte."""

from __future__ import annotations

import pytest

from amps_py.protocol import encode_frame
from amps_py.replication.link import (
    PROTOCOL_VERSION,
    Ack,
    Data,
    DownstreamLink,
    Hello,
    LinkError,
    Refused,
    UpstreamLink,
    Welcome,
)
from txlog import Record, RecordCodec, publisher_hash


def feed(link, data: bytes, now: float, bytewise: bool):  # type: ignore[no-untyped-def]
    if not bytewise:
        return link.receive_data(data, now)
    events = []
    for i in range(len(data)):
        events.extend(link.receive_data(data[i : i + 1], now))
    return events


def handshake(compression: str = "none", bytewise: bool = False):  # type: ignore[no-untyped-def]
    up = UpstreamLink(0.0, 1.0, compression)
    down = DownstreamLink(0.0, 1.0)
    hello_bytes = up.hello(
        name="a", group="g1", destination="b", sync="sync", topics=[{"name": ".*"}], now=0.0
    )
    (hello,) = feed(down, hello_bytes, 0.1, bytewise)
    assert hello == Hello(PROTOCOL_VERSION, "a", "g1", "b", "sync", compression, ({"name": ".*"},))
    (welcome,) = feed(
        up, down.welcome(name="b", group="g2", cursor=(7, "1|7|"), now=0.2), 0.2, bytewise
    )
    assert welcome == Welcome("b", "g2", 7, "1|7|")
    return up, down


def records(n: int) -> list[bytes]:
    codec = RecordCodec()
    ph = publisher_hash("p")
    return [
        codec.encode(
            Record(
                topic="t",
                payload=b'{"i":%d,"pad":"%s"}' % (i, b"x" * 300),
                pub_hash=ph,
                seq=i + 1,
                txid=i + 1,
            )
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("bytewise", [False, True])
def test_handshake_data_and_acks(compression: str, bytewise: bool) -> None:
    up, down = handshake(compression, bytewise)
    recs = records(50)
    frames = (
        up.data(recs[:20], 20, "1|20|", 1.0)
        + up.data(recs[20:], 60, "1|60|", 1.0)
        + up.data([], 70, "1|70|", 1.0)
    )
    events = feed(down, frames, 1.0, bytewise)
    assert [type(e) for e in events] == [Data, Data, Data]
    assert [e.upto for e in events] == [20, 60, 70]
    assert events[0].records + events[1].records == recs
    assert events[2].records == []
    if compression == "zstd":
        assert up.bytes_out < up.raw_bytes_out / 3, "repetitive records should compress"
    assert feed(up, down.ack(60, 1.1), 1.1, bytewise) == [Ack(60)]


def test_refusal_reaches_the_other_side() -> None:
    up = UpstreamLink(0.0, 1.0)
    down = DownstreamLink(0.0, 1.0)
    feed(
        down,
        up.hello(name="a", group="g", destination="b", sync="async", topics=[], now=0),
        0,
        False,
    )
    (event,) = up.receive_data(down.refuse("protocol version", "use the same version", 0), 0)
    assert event == Refused("protocol version", "use the same version")


def test_garbage_is_not_a_replication_peer() -> None:
    down = DownstreamLink(0.0, 1.0)
    with pytest.raises(LinkError) as info:
        down.receive_data(b"GET / HTTP/1.1\r\n\r\n", 0)
    assert info.value.reason == "not a replication peer"


def test_out_of_order_frames_are_protocol_violations() -> None:
    down = DownstreamLink(0.0, 1.0)
    with pytest.raises(LinkError, match="unexpected 'repl_data'"):
        down.receive_data(encode_frame({"c": "repl_data", "upto": 1, "n": 0}), 0)
    up = UpstreamLink(0.0, 1.0)
    with pytest.raises(LinkError, match="unexpected 'repl_ack'"):
        up.receive_data(encode_frame({"c": "repl_ack", "upto": 1}), 0)
    with pytest.raises(RuntimeError):
        up.data([], 1, "", 0)


def test_truncated_record_lengths_are_bad_data() -> None:
    _, down = handshake()
    with pytest.raises(LinkError) as info:
        down.receive_data(
            encode_frame({"c": "repl_data", "upto": 3, "n": 1}, b"\x00\x00\x01\x00abc"), 1
        )
    assert info.value.reason == "bad data"


def test_heartbeats_and_silence() -> None:
    up, down = handshake()
    assert up.next_deadline() == pytest.approx(1.0)  # last sent at 0.0 (hello)
    beat = up.handle_timer(1.0)
    assert beat and feed(down, beat, 1.0, False) == []
    assert up.handle_timer(1.5) == b""  # not due yet
    # the upstream heard the welcome at 0.2; five silent intervals later it gives up
    with pytest.raises(LinkError) as info:
        up.handle_timer(5.3)
    assert info.value.reason == "peer silent"


def test_a_lost_frame_is_detected_not_skipped() -> None:
    up, down = handshake()  # the downstream holds the stream up to txid 7
    recs = records(3)
    first = up.data(recs[:1], 10, "1|10|", 1.0, start=7)
    lost = up.data(recs[1:2], 20, "1|20|", 1.0)  # never reaches the downstream
    after = up.data(recs[2:], 30, "1|30|", 1.0)
    assert lost
    (event,) = down.receive_data(first, 1.0)
    assert isinstance(event, Data) and event.upto == 10
    with pytest.raises(LinkError) as info:
        down.receive_data(after, 1.0)
    assert info.value.reason == "bad data" and "lost in transit" in info.value.detail
    # a replay from before what the downstream holds is fine (dedup drops the copies)
    _, again = handshake()
    assert isinstance(again.receive_data(up.data(recs, 30, "1|30|", 2.0, start=0), 2.0)[0], Data)


def test_record_lengths_that_do_not_add_up_are_bad_data() -> None:
    from amps_py.replication.link import join_records, split_records

    payload = join_records([b"abc", b"", b"defgh"])
    assert split_records(payload, 3) == [b"abc", b"", b"defgh"]
    with pytest.raises(LinkError, match="add up to"):
        split_records(payload[:-1], 3)  # truncated
    with pytest.raises(LinkError, match="add up to"):
        split_records(payload, 2)  # a count that does not match the lengths
    with pytest.raises(LinkError, match="cannot hold"):
        split_records(payload, 1000)
