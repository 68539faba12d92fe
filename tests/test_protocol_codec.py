"""Table-driven tests for the sans-IO frame codec (``amps_py.protocol``).

Every sample in ``SAMPLES`` is decoded three ways, as h11's ``tr()`` does: all at
once, one byte at a time, and followed by trailing bytes that must stay buffered
(and still decode to the right frame once the rest of it arrives). ``BAD_FRAMES``
is the matching table of inputs that must raise :class:`ProtocolError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from amps_py.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    LONG_TO_SHORT,
    Frame,
    FrameDecoder,
    FrameTooLarge,
    ProtocolError,
    encode_frame,
    encode_raw,
    normalise_header,
    split_header,
)

Header = dict[str, Any]
Expected = list[tuple[Header, bytes]]


def framed(body: bytes) -> bytes:
    """Prefix ``body`` with its 4-byte big-endian length, as the wire does."""
    return len(body).to_bytes(4, "big") + body


# --------------------------------------------------------------------------- samples

#: one header per long key, the value as sent and the value after normalisation.
LONG_KEY_SAMPLES: dict[str, tuple[Any, Any]] = {
    "cmd": ("sow", "sow"),
    "cmd_id": ("cmd-1", "cmd-1"),
    "topic": ("orders", "orders"),
    "ack_type": ("processed,completed", "processed,completed"),
    "bookmark": ("7094790850998930143|12|", "7094790850998930143|12|"),
    "batch_size": ("100", 100),
    "correlation_id": ("YWJjZA==", "YWJjZA=="),
    "expiration": (60, 60),
    "filter": ("/price > 10 AND /sym = 'IBM'", "/price > 10 AND /sym = 'IBM'"),
    "msg_len": (5, 5),
    "opts": ("oof,replace", "oof,replace"),
    "options": ("timestamp", "timestamp"),
    "seq": ("42", 42),
    "sow_key": ("1234567", "1234567"),
    "timestamp": ("20240101T120000.123456Z", "20240101T120000.123456Z"),
    "leaseperiod": ("20240101T120100.000000Z", "20240101T120100.000000Z"),
    "password": ("s3cret", "s3cret"),
}


def _long_key_sample(long_key: str) -> tuple[str, bytes, Expected]:
    sent, normalised = LONG_KEY_SAMPLES[long_key]
    short = LONG_TO_SHORT[long_key]
    if long_key == "cmd":
        raw_header: Header = {"cmd": sent}
        expected: Header = {"c": normalised}
    else:
        raw_header = {"c": "publish", long_key: sent}
        expected = {"c": "publish", short: normalised}
    body = orjson.dumps(raw_header) + b"payload"
    return (f"long-key-{long_key}", framed(body), [(expected, b"payload")])


#: (id, raw bytes on the wire, expected [(normalised header, payload), ...]).
SAMPLES: list[tuple[str, bytes, Expected]] = [
    # Literal length prefixes, so the framing itself is pinned down byte for byte.
    (
        "literal-short-publish",
        b'\x00\x00\x00\x23{"c":"publish","t":"orders"}{"a":1}',
        [({"c": "publish", "t": "orders"}, b'{"a":1}')],
    ),
    (
        "literal-p-alias",
        b'\x00\x00\x00\x11{"c":"p","t":"x"}',
        [({"c": "publish", "t": "x"}, b"")],
    ),
    (
        "short-keys-all",
        framed(
            b'{"c":"sow","cid":"q1","t":"orders","a":"processed,stats","bm":"0|1|",'
            b'"bs":"10","x":"abc","e":30,"f":"/a = 1","l":"0","o":"oof","s":"7",'
            b'"k":"key1","ts":"20240101T000000Z","lp":"20240101T000100Z","pw":"pw"}'
        ),
        [
            (
                {
                    "c": "sow",
                    "cid": "q1",
                    "t": "orders",
                    "a": "processed,stats",
                    "bm": "0|1|",
                    "bs": 10,
                    "x": "abc",
                    "e": 30,
                    "f": "/a = 1",
                    "l": 0,
                    "o": "oof",
                    "s": 7,
                    "k": "key1",
                    "ts": "20240101T000000Z",
                    "lp": "20240101T000100Z",
                    "pw": "pw",
                },
                b"",
            )
        ],
    ),
    *(_long_key_sample(key) for key in LONG_KEY_SAMPLES),
    (
        "c-vs-cmd",
        framed(b'{"cmd":"subscribe","topic":"t1"}') + framed(b'{"c":"subscribe","t":"t1"}'),
        [({"c": "subscribe", "t": "t1"}, b""), ({"c": "subscribe", "t": "t1"}, b"")],
    ),
    (
        "p-alias-long-key",
        framed(b'{"cmd":"p","topic":"t"}data'),
        [({"c": "publish", "t": "t"}, b"data")],
    ),
    (
        "other-commands-not-aliased",
        framed(b'{"c":"sow_and_delta_subscribe","t":"t"}') + framed(b'{"c":"P","t":"t"}'),
        [({"c": "sow_and_delta_subscribe", "t": "t"}, b""), ({"c": "P", "t": "t"}, b"")],
    ),
    (
        "seq-as-string",
        framed(b'{"c":"p","t":"t","s":"18446744073709551615"}x'),
        [({"c": "publish", "t": "t", "s": 18446744073709551615}, b"x")],
    ),
    (
        "seq-as-number",
        framed(b'{"c":"p","t":"t","s":18446744073709551615}x'),
        [({"c": "publish", "t": "t", "s": 18446744073709551615}, b"x")],
    ),
    (
        "integer-fields-as-integral-float",
        framed(b'{"c":"sow","t":"t","bs":10.0,"top_n":"5","max_msgs":3}'),
        [({"c": "sow", "t": "t", "bs": 10, "top_n": 5, "max_msgs": 3}, b"")],
    ),
    (
        "payload-with-braces",
        framed(b'{"c":"p","t":"t"}{"a":{"b":"}{"},"c":"{}}}"}}'),
        [({"c": "publish", "t": "t"}, b'{"a":{"b":"}{"},"c":"{}}}"}}')],
    ),
    (
        "payload-starting-with-close-brace",
        framed(b'{"c":"p","t":"t"}}}}'),
        [({"c": "publish", "t": "t"}, b"}}}")],
    ),
    (
        "header-string-with-brace-and-escaped-quotes",
        framed(b'{"c":"p","t":"t","f":"/a = \\"}\\" OR /b = \'{}\'"}{"a":"}"}'),
        [({"c": "publish", "t": "t", "f": "/a = \"}\" OR /b = '{}'"}, b'{"a":"}"}')],
    ),
    (
        "header-string-with-escaped-backslash-before-quote",
        framed(b'{"c":"p","t":"a\\\\","x":"}"}tail'),
        [({"c": "publish", "t": "a\\", "x": "}"}, b"tail")],
    ),
    (
        "header-with-json-whitespace",
        framed(b'{ "c" : "p" ,\n\t"t" : "t" }\n'),
        [({"c": "publish", "t": "t"}, b"\n")],
    ),
    (
        "empty-payload",
        framed(b'{"c":"heartbeat"}'),
        [({"c": "heartbeat"}, b"")],
    ),
    (
        "binary-payload",
        framed(b'{"c":"p","t":"bin"}' + bytes(range(256))),
        [({"c": "publish", "t": "bin"}, bytes(range(256)))],
    ),
    (
        "unicode-topic",
        framed('{"c":"p","t":"prix/€/日本","x":"\\u00e9"}é'.encode()),
        [({"c": "publish", "t": "prix/€/日本", "x": "é"}, "é".encode())],
    ),
    (
        "xml-payload-after-json-header",
        framed(b'{"c":"p","t":"xml"}<m><a>1</a></m>'),
        [({"c": "publish", "t": "xml"}, b"<m><a>1</a></m>")],
    ),
    (
        "unknown-keys-kept-and-number-types",
        framed(b'{"c":"ack","matches":3,"ratio":0.5,"flag":true,"status":"success"}'),
        [({"c": "ack", "matches": 3, "ratio": 0.5, "flag": True, "status": "success"}, b"")],
    ),
    (
        "several-frames-one-buffer",
        framed(b'{"c":"logon","cid":"1","client_name":"pubber"}')
        + framed(b'{"c":"p","t":"a"}1')
        + framed(b'{"c":"p","t":"b"}22')
        + framed(b'{"c":"flush","cid":"2","a":"persisted"}'),
        [
            ({"c": "logon", "cid": "1", "client_name": "pubber"}, b""),
            ({"c": "publish", "t": "a"}, b"1"),
            ({"c": "publish", "t": "b"}, b"22"),
            ({"c": "flush", "cid": "2", "a": "persisted"}, b""),
        ],
    ),
    # Frames shaped like the real-server traces quoted in AMPS-NOTES.md section 1.
    (
        "trace-logon-ack",
        framed(
            b'{"c":"ack","cid":"0","s":0,"bm":"7094790850998930143|0|",'
            b'"client_name":"pubber","a":"processed","status":"success",'
            b'"reason":"authentication disabled","version":"5.2.1.17.717892.e742467"}'
        ),
        [
            (
                {
                    "c": "ack",
                    "cid": "0",
                    "s": 0,
                    "bm": "7094790850998930143|0|",
                    "client_name": "pubber",
                    "a": "processed",
                    "status": "success",
                    "reason": "authentication disabled",
                    "version": "5.2.1.17.717892.e742467",
                },
                b"",
            )
        ],
    ),
    (
        "trace-short-publish",
        framed(b'{"c":"p","t":"test"}{"id":1}'),
        [({"c": "publish", "t": "test"}, b'{"id":1}')],
    ),
    (
        "trace-delivery",
        framed(
            b'{"c":"p","t":"orders","sub_id":"1","bm":"1574996045124547752|17|","k":"128374"}{"id":1}'
        ),
        [
            (
                {
                    "c": "publish",
                    "t": "orders",
                    "sub_id": "1",
                    "bm": "1574996045124547752|17|",
                    "k": "128374",
                },
                b'{"id":1}',
            )
        ],
    ),
    (
        # A sow batch is one frame; the per-record headers are payload to the codec.
        "trace-sow-batch",
        framed(
            b'{"c":"sow","t":"orders","query_id":"q1","bs":2}'
            b'{"k":"11","l":8}{"id":1}{"k":"12","l":8,"x":"abc"}{"id":2}'
        ),
        [
            (
                {"c": "sow", "t": "orders", "query_id": "q1", "bs": 2},
                b'{"k":"11","l":8}{"id":1}{"k":"12","l":8,"x":"abc"}{"id":2}',
            )
        ],
    ),
    (
        "trace-logon-nvfix",
        framed(b'{"c":"logon","cid":"1","client_name":"c1","mt":"nvfix","a":"processed"}'),
        [({"c": "logon", "cid": "1", "client_name": "c1", "mt": "nvfix", "a": "processed"}, b"")],
    ),
]

#: A frame whose prefix is used as "trailing bytes" after every sample.
TRAILER_FRAME = framed(b'{"c":"p","t":"trailer"}tail')
TRAILER_EXPECTED = Frame({"c": "publish", "t": "trailer"}, b"tail")
#: cut points inside TRAILER_FRAME: inside the prefix, just after it, mid-header, last byte.
TRAILER_CUTS = [1, 3, 4, 5, 12, len(TRAILER_FRAME) - 1]


def _frames(expected: Expected) -> list[Frame]:
    return [Frame(header, payload) for header, payload in expected]


def _typed(frames: list[Frame]) -> list[tuple[list[tuple[str, str, Any]], bytes]]:
    """Frames with each header value's type spelled out, since ``True == 1 == 1.0``."""
    return [
        (sorted((k, type(v).__name__, v) for k, v in f.header.items()), f.payload) for f in frames
    ]


def _feed(
    chunks: Iterable[bytes], decoder: FrameDecoder | None = None
) -> tuple[list[Frame], FrameDecoder]:
    decoder = decoder or FrameDecoder()
    out: list[Frame] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        out.extend(decoder.frames())
    return out, decoder


def _bytewise(raw: bytes) -> list[bytes]:
    return [raw[i : i + 1] for i in range(len(raw))]


def test_samples_cover_every_long_key() -> None:
    """Adding a key to LONG_TO_SHORT without a sample here fails this test."""
    assert set(LONG_KEY_SAMPLES) == set(LONG_TO_SHORT)
    ids = [sample_id for sample_id, _, _ in SAMPLES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("raw", "expected"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_decode_whole(raw: bytes, expected: Expected) -> None:
    got, decoder = _feed([raw])
    assert _typed(got) == _typed(_frames(expected))
    assert decoder.buffered == 0
    assert decoder.next_frame() is None


@pytest.mark.parametrize(("raw", "expected"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_decode_byte_by_byte(raw: bytes, expected: Expected) -> None:
    got, decoder = _feed(_bytewise(raw))
    assert _typed(got) == _typed(_frames(expected))
    assert decoder.buffered == 0


@pytest.mark.parametrize(("raw", "expected"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_decode_with_next_frame(raw: bytes, expected: Expected) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(raw)
    got = []
    while (frame := decoder.next_frame()) is not None:
        got.append(frame)
    assert got == _frames(expected)
    assert decoder.buffered == 0


@pytest.mark.parametrize("cut", TRAILER_CUTS)
@pytest.mark.parametrize(("raw", "expected"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_decode_leaves_trailing_bytes_buffered(raw: bytes, expected: Expected, cut: int) -> None:
    trailing, rest = TRAILER_FRAME[:cut], TRAILER_FRAME[cut:]
    got, decoder = _feed([raw + trailing])
    assert got == _frames(expected)
    assert decoder.buffered == len(trailing)
    # The bytes left unread are intact: the rest of the frame completes them.
    assert list(decoder.frames()) == []
    decoder.receive_data(rest)
    assert list(decoder.frames()) == [TRAILER_EXPECTED]
    assert decoder.buffered == 0


def test_integer_fields_are_ints() -> None:
    header, _ = split_header(b'{"c":"p","seq":"5","bs":2.0,"e":"-1","l":7}')
    assert header == {"c": "publish", "s": 5, "bs": 2, "e": -1, "l": 7}
    assert all(type(header[k]) is int for k in ("s", "bs", "e", "l"))


def test_long_and_short_keys_share_one_slot() -> None:
    # Both spellings land on the short key; the later one in the object wins.
    header, _ = split_header(b'{"topic":"a","t":"b","cmd":"sow","opts":"x","options":"y"}')
    assert header == {"c": "sow", "t": "b", "o": "y"}


def test_frame_value_object() -> None:
    frame = Frame({"c": "publish", "t": "x"}, b"p" * 100)
    assert frame.command == "publish"
    assert frame == Frame({"c": "publish", "t": "x"}, b"p" * 100)
    assert frame != Frame({"c": "publish", "t": "x"}, b"q")
    assert frame != ("publish", b"p")
    assert "Frame(" in repr(frame) and len(repr(frame)) < 160
    with pytest.raises(TypeError):
        hash(frame)


def test_frame_exactly_max_size_is_accepted() -> None:
    body = b'{"c":"p"}' + b"x" * 55
    assert len(body) == 64
    got, decoder = _feed([framed(body)], FrameDecoder(max_frame_size=64))
    assert got == [Frame({"c": "publish"}, b"x" * 55)]
    assert decoder.buffered == 0


def test_max_frame_size_must_be_sane() -> None:
    with pytest.raises(ValueError, match="max_frame_size"):
        FrameDecoder(max_frame_size=1)
    assert FrameDecoder().max_frame_size == DEFAULT_MAX_FRAME_SIZE


def test_need_data_then_frame() -> None:
    decoder = FrameDecoder()
    raw = framed(b'{"c":"p","t":"t"}abc')
    decoder.receive_data(raw[:-1])
    assert decoder.next_frame() is None
    assert decoder.buffered == len(raw) - 1
    decoder.receive_data(raw[-1:])
    assert decoder.next_frame() == Frame({"c": "publish", "t": "t"}, b"abc")
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


def test_receive_data_accepts_any_bytes_like() -> None:
    raw = framed(b'{"c":"p","t":"t"}abc')
    decoder = FrameDecoder()
    decoder.receive_data(bytearray(raw[:5]))
    decoder.receive_data(memoryview(raw)[5:])
    assert list(decoder.frames()) == [Frame({"c": "publish", "t": "t"}, b"abc")]
    assert decoder.buffered == 0


def test_receive_empty_data_is_harmless() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    assert list(decoder.frames()) == []
    assert decoder.buffered == 0


# ------------------------------------------------------------------------- encoding


def test_encode_frame_exact_bytes() -> None:
    assert encode_frame({"c": "publish", "t": "orders"}, b'{"a":1}') == (
        b'\x00\x00\x00\x23{"c":"publish","t":"orders"}{"a":1}'
    )
    assert encode_frame({"c": "heartbeat"}) == b'\x00\x00\x00\x11{"c":"heartbeat"}'
    assert encode_raw(b'{"c":"p","t":"x"}') == b'\x00\x00\x00\x11{"c":"p","t":"x"}'
    assert encode_raw(b'{"c":"p"}', b"xyz") == encode_frame({"c": "p"}, b"xyz")


@pytest.mark.parametrize(("raw", "expected"), [s[1:] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_encode_round_trip(raw: bytes, expected: Expected) -> None:
    wire = b"".join(encode_frame(header, payload) for header, payload in expected)
    got, decoder = _feed([wire])
    assert got == _frames(expected)
    assert decoder.buffered == 0
    got, _ = _feed(_bytewise(wire))
    assert got == _frames(expected)


def test_encode_round_trip_normalises_long_keys() -> None:
    header = {"cmd": "p", "topic": "t", "seq": "9", "cmd_id": "c", "client_name": "me"}
    payload = b"{}\x00\xff"
    got, _ = _feed([encode_frame(header, payload)])
    assert got == [
        Frame({"c": "publish", "t": "t", "s": 9, "cid": "c", "client_name": "me"}, payload)
    ]
    assert got[0].header == normalise_header(header)


# ----------------------------------------------------------------------- bad frames

#: (id, raw bytes, exception type, fragment of the message, ProtocolError.reason).
BAD_FRAMES: list[tuple[str, bytes, type[ProtocolError], str, str]] = [
    ("not-starting-with-brace", framed(b"hello"), ProtocolError, "expected '{'", "invalid header"),
    ("leading-space", framed(b' {"c":"p"}'), ProtocolError, "expected '{'", "invalid header"),
    ("header-is-json-array", framed(b'["c","p"]'), ProtocolError, "expected '{'", "invalid header"),
    ("header-is-json-string", framed(b'"c"'), ProtocolError, "expected '{'", "invalid header"),
    (
        "unterminated-header",
        framed(b'{"c":"p","t":"x"'),
        ProtocolError,
        "not a complete JSON object",
        "invalid header",
    ),
    (
        "unterminated-string-with-braces",
        framed(b'{"c":"p","t":"a}b}c}'),
        ProtocolError,
        "unterminated string",
        "invalid header",
    ),
    (
        "invalid-json-header",
        framed(b'{"c" "p"}payload'),
        ProtocolError,
        "not a complete JSON object",
        "invalid header",
    ),
    (
        "invalid-utf8-in-header",
        framed(b'{"c":"p","t":"\xff"}'),
        ProtocolError,
        "not a complete JSON object",
        "invalid header",
    ),
    (
        "nested-object-value",
        framed(b'{"c":"p","t":"t","x":{"a":1}}'),
        ProtocolError,
        "'x' must be a string or a number, not dict",
        "invalid header",
    ),
    (
        "nested-array-value",
        framed(b'{"c":"p","sids":["1","2"]}'),
        ProtocolError,
        "not list",
        "invalid header",
    ),
    ("null-value", framed(b'{"c":"p","t":null}'), ProtocolError, "not NoneType", "invalid header"),
    ("missing-command", framed(b'{"t":"orders"}x'), ProtocolError, "no command", "invalid header"),
    ("empty-header", framed(b"{}"), ProtocolError, "no command", "invalid header"),
    ("empty-command", framed(b'{"c":""}'), ProtocolError, "no command", "invalid header"),
    ("numeric-command", framed(b'{"c":5}'), ProtocolError, "no command", "invalid header"),
    (
        "seq-not-integer",
        framed(b'{"c":"p","s":"abc"}'),
        ProtocolError,
        "'s' must be an integer, got 'abc'",
        "invalid header",
    ),
    (
        "long-seq-not-integer",
        framed(b'{"c":"p","seq":"12x"}'),
        ProtocolError,
        "'s' must be an integer",
        "invalid header",
    ),
    (
        "seq-fractional",
        framed(b'{"c":"p","s":1.5}'),
        ProtocolError,
        "'s' must be an integer, got 1.5",
        "invalid header",
    ),
    (
        "seq-boolean",
        framed(b'{"c":"p","s":true}'),
        ProtocolError,
        "'s' must be an integer, got True",
        "invalid header",
    ),
    (
        "seq-beyond-exact-float",
        framed(b'{"c":"p","s":1e300}'),
        ProtocolError,
        "'s' must be an integer",
        "invalid header",
    ),
    (
        "seq-with-underscore",
        framed(b'{"c":"p","s":"1_000"}'),
        ProtocolError,
        "'s' must be an integer",
        "invalid header",
    ),
    (
        "seq-non-ascii-digits",
        framed('{"c":"p","s":"١٢"}'.encode()),
        ProtocolError,
        "'s' must be an integer",
        "invalid header",
    ),
    (
        "batch-size-not-integer",
        framed(b'{"c":"sow","t":"t","batch_size":"ten"}'),
        ProtocolError,
        "'bs' must be an integer",
        "invalid header",
    ),
    (
        "length-prefix-0",
        b"\x00\x00\x00\x00",
        ProtocolError,
        "frame length 0 is too small",
        "invalid frame",
    ),
    (
        "length-prefix-1",
        b"\x00\x00\x00\x01{",
        ProtocolError,
        "frame length 1 is too small",
        "invalid frame",
    ),
    (
        "length-prefix-too-large",
        (DEFAULT_MAX_FRAME_SIZE + 1).to_bytes(4, "big"),
        FrameTooLarge,
        f"frame of {DEFAULT_MAX_FRAME_SIZE + 1} bytes exceeds the maximum",
        "frame too large",
    ),
    (
        "length-prefix-all-ones",
        b"\xff\xff\xff\xff",
        FrameTooLarge,
        "frame of 4294967295 bytes",
        "frame too large",
    ),
    (
        "http-request",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        FrameTooLarge,
        "exceeds the maximum",
        "frame too large",
    ),
    (
        "good-frame-then-bad",
        framed(b'{"c":"p","t":"ok"}') + framed(b'{"t":"no-command"}'),
        ProtocolError,
        "no command",
        "invalid header",
    ),
]

#: Frames a bad sample yields before its error (the others yield none).
FRAMES_BEFORE_ERROR = {"good-frame-then-bad": [Frame({"c": "publish", "t": "ok"}, b"")]}


def _feed_until_error(
    chunks: Iterable[bytes], decoder: FrameDecoder
) -> tuple[list[Frame], ProtocolError]:
    out: list[Frame] = []
    with pytest.raises(ProtocolError) as info:
        for chunk in chunks:
            decoder.receive_data(chunk)
            for frame in decoder.frames():
                out.append(frame)
    return out, info.value


def _assert_broken(decoder: FrameDecoder, error: ProtocolError) -> None:
    """After an error every call re-raises the same error and nothing is buffered."""
    assert decoder.buffered == 0
    with pytest.raises(ProtocolError) as info:
        decoder.receive_data(framed(b'{"c":"heartbeat"}'))
    assert info.value is error
    with pytest.raises(ProtocolError) as info:
        list(decoder.frames())
    assert info.value is error
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert info.value is error
    assert decoder.buffered == 0


_BAD_PARAMS = [
    pytest.param(raw, exc_type, fragment, reason, FRAMES_BEFORE_ERROR.get(bad_id, []), id=bad_id)
    for bad_id, raw, exc_type, fragment, reason in BAD_FRAMES
]


@pytest.mark.parametrize(("raw", "exc_type", "fragment", "reason", "before"), _BAD_PARAMS)
@pytest.mark.parametrize("mode", ["whole", "byte-by-byte", "with-trailing"])
def test_bad_frames(
    raw: bytes,
    exc_type: type[ProtocolError],
    fragment: str,
    reason: str,
    before: list[Frame],
    mode: str,
) -> None:
    chunks = {
        "whole": [raw],
        "byte-by-byte": _bytewise(raw),
        "with-trailing": [raw + TRAILER_FRAME],
    }[mode]
    decoder = FrameDecoder()
    got, error = _feed_until_error(chunks, decoder)
    assert type(error) is exc_type
    assert fragment in str(error)
    assert error.reason == reason
    assert got == before
    _assert_broken(decoder, error)


def test_frame_too_large_raised_on_prefix_alone() -> None:
    """The length prefix is enough: no body byte has to arrive (or be buffered)."""
    decoder = FrameDecoder(max_frame_size=1024)
    decoder.receive_data(b"\x00\x00\x04")
    assert list(decoder.frames()) == []
    decoder.receive_data(b"\x01")
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_frame()
    assert (info.value.size, info.value.limit) == (1025, 1024)
    assert isinstance(info.value, ProtocolError)
    assert "MaxMessageSize" in str(info.value)
    _assert_broken(decoder, info.value)


def test_frame_too_large_after_good_frames_in_same_chunk() -> None:
    decoder = FrameDecoder(max_frame_size=64)
    decoder.receive_data(framed(b'{"c":"p"}a') + (65).to_bytes(4, "big"))
    frames = decoder.frames()
    assert next(frames) == Frame({"c": "publish"}, b"a")
    with pytest.raises(FrameTooLarge) as info:
        next(frames)
    _assert_broken(decoder, info.value)


def test_normalise_header_rejects_non_objects() -> None:
    for raw in ([["c", "p"]], "publish", 5, None):
        with pytest.raises(ProtocolError, match="must be a JSON object"):
            normalise_header(raw)


def test_split_header_rejects_empty_body() -> None:
    with pytest.raises(ProtocolError, match=r"expected '\{'"):
        split_header(b"")


@pytest.mark.parametrize(
    "body",
    [
        b'{"c":"p","t":"' + b"}" * 200_000,
        b'{"c":"p","t":"' + b'\\"' * 200_000,
        b'{"c" "p"}' + b"}" * 200_000,
        b'{"c":"p","t":"x"' + b',"k":"}"' * 50_000,
    ],
    ids=["braces-in-open-string", "escaped-quotes", "bad-json-then-braces", "many-string-braces"],
)
def test_hostile_header_is_rejected_in_linear_time(body: bytes) -> None:
    """A frame full of '}' must not make the decoder re-parse the header per '}'.

    Retrying the JSON parser at each '}' took minutes for a 16 MiB frame; one pass
    over these 200-400 KB bodies takes milliseconds, so a generous bound is stable.
    """
    decoder = FrameDecoder()
    decoder.receive_data(framed(body))
    start = time.perf_counter()
    with pytest.raises(ProtocolError, match="not a complete JSON object"):
        decoder.next_frame()
    assert time.perf_counter() - start < 1.0
