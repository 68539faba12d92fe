"""The replication link protocol, sans-IO: two state machines talking through bytes,
with time passed in. Every exchange is also fed byte by byte."""

from __future__ import annotations

import functools
import json

import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.config import InstanceConfig, parse_config
from amps_py.protocol import encode_frame
from amps_py.replication.link import (
    MAX_HANDSHAKE_FRAME,
    MAX_REFUSAL_DETAIL,
    MAX_REPLICATION_FRAME,
    PROTOCOL_VERSION,
    Ack,
    Data,
    DownstreamLink,
    Hello,
    LinkError,
    LinkState,
    LocalProtocolError,
    Refused,
    RemoteProtocolError,
    UpstreamLink,
    Welcome,
    _Inflater,
    parse_hello,
    parse_welcome,
)
from amps_py.replication.validation import TopicDescriptor, validate
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


def test_an_unexpected_frame_names_the_state_the_link_was_in() -> None:
    """The error says where in the protocol the frame arrived (handshake or streaming),
    and the link is closed afterwards."""
    down = DownstreamLink(0.0, 1.0)
    with pytest.raises(RemoteProtocolError) as info:
        down.receive_data(encode_frame({"c": "repl_data", "upto": 1, "n": 0}), 0)
    assert info.value.detail == "unexpected 'repl_data' in state handshake"
    assert down.state is LinkState.CLOSED
    up, down = handshake()
    with pytest.raises(RemoteProtocolError) as info:
        up.receive_data(encode_frame({"c": "repl_welcome"}, b"{}"), 1)
    assert info.value.detail == "unexpected 'repl_welcome' in state streaming"
    hello = UpstreamLink(0.0, 1.0).hello(
        name="a", group="g", destination="b", sync="sync", topics=[], now=0
    )
    with pytest.raises(RemoteProtocolError) as info:
        down.receive_data(hello, 1)
    assert info.value.detail == "unexpected 'repl_hello' in state streaming"
    assert (up.state, down.state) == (LinkState.CLOSED, LinkState.CLOSED)


def test_link_errors_say_whose_fault_they_are() -> None:
    """What the peer sent wrong is a RemoteProtocolError; this end calling the link
    wrongly is a LocalProtocolError. Both are LinkErrors, so one ``except`` still
    catches every link failure."""
    assert issubclass(RemoteProtocolError, LinkError)
    assert issubclass(LocalProtocolError, LinkError)
    assert not issubclass(RemoteProtocolError, LocalProtocolError)
    with pytest.raises(RemoteProtocolError) as remote:
        DownstreamLink(0.0, 1.0).receive_data(b"GET / HTTP/1.1\r\n\r\n", 0)
    assert remote.value.reason == "not a replication peer"
    with pytest.raises(RemoteProtocolError, match="peer silent"):
        UpstreamLink(0.0, 1.0).handle_timer(60.0)
    with pytest.raises(LocalProtocolError) as local:
        UpstreamLink(0.0, 1.0).data([], 1, "", 0)
    assert local.value.reason == "link misuse" and "state handshake" in local.value.detail
    with pytest.raises(LocalProtocolError) as local:
        DownstreamLink(0.0, 1.0).welcome(name="b", group="g", cursor=(0, ""), now=0)
    assert local.value.reason == "link misuse" and "before a hello" in local.value.detail


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


@given(st.floats(min_value=1.0, max_value=1e6, allow_nan=False))
@settings(max_examples=300, derandomize=True)
def test_the_timer_acts_at_its_own_deadline(heard_at: float) -> None:
    """Woken exactly at next_deadline(), handle_timer sends a heartbeat or declares the
    peer silent: it never returns nothing, which made the heartbeat loop spin (found by
    the simulator, seed 2: 1.1 + 15.0 - 1.1 rounds below 15.0)."""
    up, down = handshake()
    reply = down.handle_timer(down.next_deadline())
    assert reply, "the downstream's heartbeat"
    feed(up, reply, heard_at, False)  # the last thing heard, at an awkward float
    assert up.handle_timer(heard_at), "a heartbeat was due (the last went at 0.0)"
    for _ in range(20):
        deadline = up.next_deadline()
        try:
            sent = up.handle_timer(deadline)
        except LinkError as exc:
            assert exc.reason == "peer silent"
            return
        assert sent, f"nothing to do at the link's own deadline {deadline!r}"
    pytest.fail("twenty heartbeats and the silent peer was never declared silent")


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


# ---------------------------------------------------------------- what a peer may send


GOOD_HELLO = {
    "version": PROTOCOL_VERSION,
    "name": "a",
    "group": "g",
    "destination": "b",
    "sync": "sync",
    "compression": "zstd",
    "topics": [{"name": ".*", "message_type": "json", "filter": None, "exclude_validation": []}],
    "expected_group": "",
    "user_id": "repl",
    "pw": "secret",
    "back": True,
}

#: a hello field change that removes the field
class _Delete:
    """Marks a hello field to leave out; its repr is the test id, the same in every
    pytest-xdist worker (an ``object()``'s repr holds its address)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()

#: (hello field changes, the field the refusal names)
MALFORMED_HELLOS = [
    ({"name": [1]}, "'name'"),
    ({"name": None}, "'name'"),
    ({"name": ""}, "'name'"),
    ({"name": "x" * 65}, "'name'"),
    ({"name": "a/b"}, "'name'"),
    ({"name": "a\x1fb"}, "'name'"),
    ({"version": DELETE}, "'version'"),
    ({"name": DELETE}, "'name'"),
    ({"version": "2"}, "'version'"),
    ({"version": True}, "'version'"),
    ({"group": 7}, "'group'"),
    ({"destination": {"x": 1}}, "'destination'"),
    ({"sync": "maybe"}, "'sync'"),
    ({"sync": None}, "'sync'"),
    ({"compression": 1}, "'compression'"),
    ({"topics": "zz"}, "'topics'"),
    ({"topics": {"name": ".*"}}, "'topics'"),
    ({"topics": [["orders"]]}, "'topics[0]'"),
    ({"topics": [{"name": 5}]}, "'topics[0].name'"),
    ({"topics": [{"message_type": ""}]}, "'topics[0].message_type'"),
    ({"topics": [{"message_type": None}]}, "'topics[0].message_type'"),
    ({"topics": [{"filter": ["/a > 1"]}]}, "'topics[0].filter'"),
    ({"topics": [{"exclude_validation": "txlog"}]}, "'topics[0].exclude_validation'"),
    ({"topics": [{"exclude_validation": [1]}]}, "'topics[0].exclude_validation'"),
    ({"expected_group": ["g"]}, "'expected_group'"),
    ({"user_id": 42}, "'user_id'"),
    ({"pw": 42}, "'pw'"),
    ({"back": "yes"}, "'back'"),
]


def hello_with(changes: dict[str, object]) -> dict[str, object]:
    body = {**GOOD_HELLO, **changes}
    return {k: v for k, v in body.items() if v is not DELETE}


def test_a_well_formed_hello_parses() -> None:
    hello = parse_hello(GOOD_HELLO)
    assert (hello.name, hello.group, hello.sync, hello.compression) == ("a", "g", "sync", "zstd")
    assert (hello.user_id, hello.pw, hello.back) == ("repl", "secret", True)
    assert hello.topics == tuple(GOOD_HELLO["topics"])  # type: ignore[arg-type]
    minimal = parse_hello({"version": PROTOCOL_VERSION, "name": "a"})
    assert (minimal.group, minimal.sync, minimal.topics, minimal.back) == ("a", "async", (), False)


@pytest.mark.parametrize(("changes", "field"), MALFORMED_HELLOS, ids=repr)
def test_malformed_hello_fields_are_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(LinkError) as info:
        parse_hello(hello_with(changes))
    assert info.value.reason == "malformed hello"
    assert f"repl_hello field {field}: expected " in info.value.detail
    # the same through the link, whole and byte by byte: the downstream refuses it
    frame = encode_frame({"c": "repl_hello"}, orjson.dumps(hello_with(changes)))
    for bytewise in (False, True):
        down = DownstreamLink(0.0, 1.0)
        with pytest.raises(LinkError, match="malformed hello"):
            feed(down, frame, 0.0, bytewise)


def test_another_protocol_version_is_named_before_field_types() -> None:
    with pytest.raises(LinkError) as info:
        parse_hello({"version": PROTOCOL_VERSION + 1, "name": 7, "topics": "new shape"})
    assert info.value.reason == "protocol version"


@pytest.mark.parametrize(
    ("welcome", "field"),
    [
        ({"name": [1]}, "'name'"),
        ({}, "'name'"),
        ({"name": "b", "group": ["g"]}, "'group'"),
        ({"name": "b", "cursor_txid": "7"}, "'cursor_txid'"),
        ({"name": "b", "cursor_txid": -1}, "'cursor_txid'"),
        ({"name": "b", "cursor_txid": 2**64}, "'cursor_txid'"),
        ({"name": "b", "cursor_bm": 7}, "'cursor_bm'"),
    ],
    ids=repr,
)
def test_a_forged_welcome_is_refused(welcome: dict[str, object], field: str) -> None:
    with pytest.raises(LinkError) as info:
        parse_welcome(welcome)
    assert info.value.reason == "malformed welcome"
    assert f"repl_welcome field {field}" in info.value.detail
    up = UpstreamLink(0.0, 1.0)
    up.hello(name="a", group="g", destination="b", sync="async", topics=[], now=0)
    payload = json.dumps(welcome).encode()
    with pytest.raises(LinkError, match="malformed welcome"):
        up.receive_data(encode_frame({"c": "repl_welcome"}, payload), 0)
    assert up.max_frame_size == MAX_HANDSHAKE_FRAME  # never opened up


def test_frames_are_small_until_the_handshake_completes() -> None:
    """An oversized frame before the handshake is refused from its length prefix
    alone (nothing of it buffered); after it, frames up to the replication limit."""
    big = (MAX_HANDSHAKE_FRAME + 1).to_bytes(4, "big")
    for link in (DownstreamLink(0.0, 1.0), UpstreamLink(0.0, 1.0)):
        with pytest.raises(LinkError) as info:
            link.receive_data(big, 0)
        assert info.value.reason == "not a replication peer"
        assert f"at most {MAX_HANDSHAKE_FRAME} bytes" in info.value.detail
    up, down = handshake()
    assert up.max_frame_size == down.max_frame_size == MAX_REPLICATION_FRAME
    recs = [b"x" * (MAX_HANDSHAKE_FRAME + 10)]
    (event,) = down.receive_data(up.data(recs, 8, "", 1.0), 1.0)
    assert isinstance(event, Data) and event.records == recs
    with pytest.raises(LinkError) as info:
        down.receive_data((MAX_REPLICATION_FRAME + 1).to_bytes(4, "big"), 1.0)
    assert info.value.reason == "frame too large"


def test_realistic_hellos_fit_the_handshake_limit() -> None:
    """250 Topic entries with 150-character Filters fit (the limit's stated margin);
    a hello that does not is refused by the sender, naming the fix."""
    topics = [
        {
            "name": f"orders.region{i:04d}.*",
            "message_type": "json",
            "filter": "/status = 'open' AND " + "x" * 129,
            "exclude_validation": ["replicate"],
        }
        for i in range(250)
    ]
    hello = UpstreamLink(0.0, 1.0).hello(
        name="a" * 64, group="g" * 64, destination="d" * 64, sync="sync", topics=topics, now=0
    )
    print(f"hello of 250 topics with filters: {len(hello)} bytes")
    assert len(hello) <= MAX_HANDSHAKE_FRAME
    assert isinstance(feed(DownstreamLink(0.0, 1.0), hello, 0, False)[0], Hello)
    with pytest.raises(LocalProtocolError) as info:
        UpstreamLink(0.0, 1.0).hello(
            name="a", group="g", destination="d", sync="sync", topics=topics * 2, now=0
        )
    assert info.value.reason == "hello too large" and "500 Topic entries" in info.value.detail


def test_a_zstd_bomb_stops_at_the_limit() -> None:
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    bomb = compressor.compress(bytes(64 * 1024 * 1024))
    bomb += compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    assert len(bomb) < 4096
    inflater = _Inflater(1024 * 1024)
    with pytest.raises(LinkError) as info:
        inflater.inflate(bomb)
    assert info.value.reason == "data too large" and "1048576" in info.value.detail
    # a frame within the limit inflates exactly, and the stream goes on across frames
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    inflater = _Inflater(1024 * 1024)
    for i in range(5):
        data = bytes([i]) * (1024 * 1024)  # exactly the limit
        frame = compressor.compress(data) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        assert inflater.inflate(frame) == data
    with pytest.raises(LinkError, match="does not decode"):
        _Inflater(1024).inflate(b"\x28\xb5\x2f\xfd" + b"\xff" * 20)


def test_refusals_are_bounded_both_ways() -> None:
    up = UpstreamLink(0.0, 1.0)
    up.hello(name="a", group="g", destination="b", sync="async", topics=[], now=0)
    down = DownstreamLink(0.0, 1.0)
    (event,) = up.receive_data(down.refuse("validation failed", "x" * 100_000, 0), 0)
    assert isinstance(event, Refused) and len(event.detail) <= MAX_REFUSAL_DETAIL
    assert "more characters in this instance's log" in event.detail
    odd = encode_frame({"c": "repl_refuse", "r": "d"}, b'{"reason": [1], "detail": 5}')
    up = UpstreamLink(0.0, 1.0)
    assert up.receive_data(odd, 0) == [Refused("refused", "")]


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        ({"upto": 2**64}, "bad upto"),
        ({"upto": -1}, "bad upto"),
        ({"from": -1}, "bad from"),
        ({"n": -1}, "bad record count"),
        ({"upto_bm": "x" * 1000}, "bad upto_bm"),
    ],
    ids=repr,
)
def test_data_headers_that_would_not_fit_the_journal(
    header: dict[str, object], fragment: str
) -> None:
    _, down = handshake()
    full = {"c": "repl_data", "from": 0, "upto": 8, "upto_bm": "", "n": 0, **header}
    head = json.dumps(full).encode()
    with pytest.raises(LinkError, match=fragment):
        down.receive_data(len(head).to_bytes(4, "big") + head, 1.0)


# ------------------------------------------------------ any hello: refused or checkable


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
#: a field of a hello: usually the right kind, sometimes anything
_FIELDS = {
    "version": st.just(PROTOCOL_VERSION) | _JSON,
    "name": st.sampled_from(["a", "b", "a" * 64]) | _JSON,
    "group": st.sampled_from(["g", ""]) | _JSON,
    "sync": st.sampled_from(["sync", "async"]) | _JSON,
    "compression": st.sampled_from(["none", "zstd"]) | _JSON,
    "topics": st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "name": st.none() | st.sampled_from([".*", "orders", "o(r"]) | _JSON,
                "message_type": st.just("json") | _JSON,
                "filter": st.none() | st.just("/a > 1") | _JSON,
                "exclude_validation": st.lists(st.sampled_from(["txlog", "replicate"])) | _JSON,
            },
        )
        | _JSON,
        max_size=3,
    )
    | _JSON,
    "expected_group": st.just("") | _JSON,
    "user_id": st.just("repl") | _JSON,
    "pw": st.just("pw") | _JSON,
    "back": st.booleans() | _JSON,
}
_HELLOS = st.fixed_dictionaries({}, optional=_FIELDS)


@settings(
    derandomize=True,
    max_examples=500,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_HELLOS)
def test_any_hello_is_refused_or_safe_to_check(body: dict[str, object]) -> None:
    """Whatever a peer puts in a hello, it parses into a Hello that the downstream's
    checks (validation against a real config) handle, or it is refused with a
    LinkError; nothing else is raised."""
    try:
        hello = parse_hello(body)
    except LinkError as exc:
        assert exc.reason in ("malformed hello", "protocol version")
        return
    descriptors = [TopicDescriptor.from_wire(t) for t in hello.topics]
    validate(descriptors, _downstream_config(), hello.name, hello.group)


@functools.cache
def _downstream_config() -> InstanceConfig:
    return parse_config(
        "<AMPSConfig><Name>b</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
        "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic></TransactionLog>"
        "</AMPSConfig>",
        "b.xml",
        environ={},
    )
