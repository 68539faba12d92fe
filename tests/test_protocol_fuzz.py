"""Property tests for the frame decoder, in the spirit of h11's ``fuzz/afl-server.py``.

Invariant: whatever bytes arrive, and however they are split into reads, the decoder
either yields :class:`Frame` objects or raises :class:`ProtocolError`; never anything
else. It also behaves the same whatever the split: the same frames, then the same
error (or the same number of bytes left buffered).

Runs are derandomised (the examples depend only on the test and the Hypothesis
version) and use no example database, so every run tests the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.protocol import (
    LONG_TO_SHORT,
    Frame,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    normalise_header,
)
from amps_py.protocol.header import INTEGER_FIELDS

#: A small limit so random length prefixes often fit and bodies get parsed.
MAX_FRAME = 512

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Outcome:
    """What a decoder made of one input: frames, then an error or leftover bytes."""

    frames: list[Frame]
    error: tuple[type[ProtocolError], str] | None
    buffered: int


def run(chunks: list[bytes], max_frame_size: int = MAX_FRAME) -> Outcome:
    """Feed ``chunks`` one read at a time; only ProtocolError may escape the decoder."""
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    frames: list[Frame] = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            frames.extend(decoder.frames())
    except ProtocolError as exc:
        # Broken for good: every later call re-raises the same error.
        for call in (lambda: decoder.receive_data(b"x"), decoder.next_frame):
            try:
                call()
            except ProtocolError as again:
                assert again is exc
            else:
                raise AssertionError("decoder accepted input after a ProtocolError") from exc
        return Outcome(frames, (type(exc), str(exc)), decoder.buffered)
    return Outcome(frames, None, decoder.buffered)


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    """Cut ``data`` into reads of the given sizes (cycled), the last one shorter."""
    chunks: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(data):
        size = sizes[i % len(sizes)] if sizes else len(data)
        chunks.append(data[pos : pos + size])
        pos += size
        i += 1
    return chunks


def check_frame(frame: Frame) -> None:
    """Every frame the decoder produces is well formed and re-encodes to itself."""
    assert isinstance(frame, Frame)
    assert type(frame.header) is dict
    assert type(frame.payload) is bytes
    assert isinstance(frame.command, str)
    assert frame.command
    assert frame.command != "p"
    for key, value in frame.header.items():
        assert isinstance(key, str)
        assert key not in LONG_TO_SHORT
        assert isinstance(value, str | int | float | bool)
        if key in INTEGER_FIELDS:
            assert type(value) is int
    # Normalising is idempotent: the frame survives a trip through the encoder.
    again = run([encode_frame(frame.header, frame.payload)], max_frame_size=1 << 24)
    assert again == Outcome([frame], None, 0)


def check_invariant(data: bytes, sizes: list[int]) -> Outcome:
    whole = run([data])
    chunked = run(split(data, sizes))
    assert chunked == whole
    if len(data) <= 128:
        assert run(split(data, [1])) == whole
    for frame in whole.frames:
        check_frame(frame)
    return whole


# ----------------------------------------------------------------------- strategies

#: header keys worth drawing: every long and short key and a few long-only ones.
KEYS = sorted({*LONG_TO_SHORT, *LONG_TO_SHORT.values(), "client_name", "sub_id", "status"})
#: keys that stress the header scanner or look like something they are not.
ODD_KEYS = ["", "0", "12", "}", "{", '"', "\\", '\\"}', "c ", "C", "CMD", "\u00e9"]

read_sizes = st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8)

#: bytes that matter to the header parser, so random bodies reach deep code paths.
JSONISH = b'{}[]":,\\ cpstu01-.e'
jsonish_bytes = st.lists(st.sampled_from(list(JSONISH)), max_size=60).map(bytes)

#: a body framed with its true length, made of random or JSON-flavoured bytes.
framed_body = st.one_of(st.binary(max_size=60), jsonish_bytes).map(
    lambda body: len(body).to_bytes(4, "big") + body
)

#: command names: canonical, the "p" alias, and ones the codec must pass through.
command = st.sampled_from(["p", "publish", "sow", "subscribe", "ack", "logon", "x"])
#: a value a flat header may hold.
header_value = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)
#: any JSON value, nested ones included (which a header must refuse).
json_value = st.recursive(
    st.none() | header_value,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
#: a header value that is usually legal, sometimes null, nested or an integer as text.
maybe_bad_value = st.one_of(
    header_value,
    header_value,
    st.integers(min_value=0, max_value=2**64 - 1).map(str),
    json_value,
)
#: a body whose header is an arbitrary JSON object: any keys, any values, maybe a command.
json_object_body = st.builds(
    lambda obj, cmd, payload: orjson.dumps({**obj, **cmd}) + payload,
    st.dictionaries(
        st.text(max_size=6) | st.sampled_from(KEYS + ODD_KEYS), maybe_bad_value, max_size=5
    ),
    st.fixed_dictionaries({"c": command})
    | st.fixed_dictionaries({"cmd": command})
    | st.fixed_dictionaries({"c": json_value})
    | st.just({}),
    st.binary(max_size=20) | st.sampled_from([b"}", b'{"a":"}"}', b'"']),
).map(lambda body: len(body).to_bytes(4, "big") + body)
json_stream = st.lists(json_object_body, min_size=1, max_size=4).map(b"".join)

#: inputs that are mostly plausible frames, with some raw noise.
stream = st.lists(st.one_of(framed_body, json_object_body, st.binary(max_size=8)), max_size=6).map(
    b"".join
)


@st.composite
def valid_header(draw: st.DrawFn) -> dict[str, Any]:
    """A flat header that must decode: integer fields get integers (or digit strings)."""
    header: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=6, unique=True)):
        if LONG_TO_SHORT.get(key, key) in INTEGER_FIELDS:
            number = draw(st.integers(min_value=0, max_value=2**64 - 1))
            header[key] = draw(st.sampled_from([number, str(number)]))
        elif LONG_TO_SHORT.get(key, key) == "c":
            continue
        else:
            header[key] = draw(header_value)
    header[draw(st.sampled_from(["c", "cmd"]))] = draw(command)
    return header


valid_frame = st.builds(encode_frame, valid_header(), st.binary(max_size=40))
valid_stream = st.lists(valid_frame, min_size=1, max_size=4).map(b"".join)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """Valid frames damaged by a few flips, inserts, deletes, new prefixes or a cut."""
    data = bytearray(draw(valid_stream))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "length", "truncate", "splice"]))
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(min_value=1, max_value=255))
        elif kind == "insert":
            data[at:at] = draw(
                st.binary(min_size=1, max_size=4) | st.sampled_from([b"}", b'"', b"{", b"\\"])
            )
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(min_value=1, max_value=4))]
        elif kind == "length" and len(data) >= 4:
            old = int.from_bytes(data[:4], "big")
            new = draw(
                st.integers(min_value=0, max_value=old + 8)
                | st.integers(min_value=0, max_value=2**32 - 1)
            )
            data[:4] = new.to_bytes(4, "big")
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            data[at:at] = draw(jsonish_bytes)
    return bytes(data)


# --------------------------------------------------------------------------- tests


@FUZZ
@given(data=st.binary(max_size=300), sizes=read_sizes)
def test_random_bytes_parse_or_raise_protocol_error(data: bytes, sizes: list[int]) -> None:
    check_invariant(data, sizes)


@FUZZ
@given(data=stream | json_stream, sizes=read_sizes)
def test_random_framed_bodies_parse_or_raise_protocol_error(data: bytes, sizes: list[int]) -> None:
    check_invariant(data, sizes)


@settings(FUZZ, max_examples=1000)
@given(data=mutated(), sizes=read_sizes)
def test_mutated_frames_parse_or_raise_protocol_error(data: bytes, sizes: list[int]) -> None:
    check_invariant(data, sizes)


@FUZZ
@given(
    headers=st.lists(st.tuples(valid_header(), st.binary(max_size=40)), min_size=1, max_size=4),
    sizes=read_sizes,
)
def test_valid_frames_round_trip(
    headers: list[tuple[dict[str, Any], bytes]], sizes: list[int]
) -> None:
    wire = b"".join(encode_frame(header, payload) for header, payload in headers)
    expected = [Frame(normalise_header(orjson.loads(orjson.dumps(h))), p) for h, p in headers]
    outcome = run(split(wire, sizes), max_frame_size=1 << 24)
    assert outcome == Outcome(expected, None, 0)
    for frame in outcome.frames:
        check_frame(frame)
