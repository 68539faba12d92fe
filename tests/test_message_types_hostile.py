"""Hostile payloads, for every message type (hypothesis, derandomized: the same examples
on every run, so a failure reproduces without a seed).

Invariants, whatever the bytes:

1. ``document()`` returns a document or None, and never raises;
2. a content filter over that document never raises;
3. ``to_jsonable()`` never raises and what it returns serialises as JSON;
4. ``merge()`` returns bytes or raises :class:`MergeError`, nothing else; and a merge
   result is a message of the type again (its document is not None).

The payloads: random bytes, and valid messages with bytes flipped, cut, inserted or
duplicated (the mutations that reach a decoder's corner cases).
"""

from __future__ import annotations

import bson
import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.filters import compile_filter
from amps_py.message_types import MergeError, MessageType, default_types, make_type

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
FILTER = compile_filter(
    "/55 = 'IBM' OR /Order/@id = 5 OR /Order/Leg[1] > 2 OR /sym LIKE 'I' OR /a/b/c IS NULL"
)
TYPES = {**default_types(), "fix-pipe": make_type("fix-pipe", "fix", field_separator=b"|")}

SAMPLES: dict[str, list[bytes]] = {
    "fix": [b"35=D\x0155=IBM\x0138=100\x01448=A\x01448=B\x01", b"1=FOO\x015=TEST1"],
    "fix-pipe": [b"35=D|55=IBM|38=100|"],
    "nvfix": [b"Symbol=IBM\x01Qty=100\x01Order Type=limit\x01", b"a=\x01b==\x01"],
    "xml": [
        b'<?xml version="1.0"?><Order id="5"><Leg side="b">1</Leg><Leg>3</Leg>'
        b"<Px ccy='USD'>1.5</Px><![CDATA[x]]><!-- c --></Order>",
        b'<o:Order xmlns:o="urn:o"><o:Qty>3</o:Qty>text<b/></o:Order>',
    ],
    "json": [b'{"sym": "IBM", "a": {"b": [1, {"c": null}]}}'],
    "bson": [
        bson.encode(
            {
                "sym": "IBM",
                "id": bson.ObjectId("65a1b2c3d4e5f60718293a4b"),
                "q": bson.Int64(7),
                "d": bson.Decimal128("1.5"),
                "a": {"b": [1, {"c": None}], "bin": bson.Binary(b"\x00\xff", 5)},
                "ts": bson.Timestamp(1, 2),
                "re": bson.Regex("x"),
            }
        )
    ],
    "msgpack": [
        msgpack.packb(
            {
                "sym": "IBM",
                "a": {"b": [1, {"c": None}], 7: b"\xff"},
                "e": msgpack.ExtType(1, b"z"),
                "t": msgpack.Timestamp(1, 2),
            },
            use_bin_type=True,
        )
    ],
    "binary": [b"\x00\x01\x02"],
}


@st.composite
def mutated(draw: st.DrawFn, samples: list[bytes]) -> bytes:
    """A valid sample with a few bytes flipped, removed, inserted or repeated."""
    data = bytearray(draw(st.sampled_from(samples)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if not data:
            data.extend(draw(st.binary(min_size=1, max_size=4)))
            continue
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "truncate"]))
        if action == "flip":
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif action == "cut":
            del data[at]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "repeat":
            data[at:at] = data[at : at + draw(st.integers(min_value=1, max_value=16))]
        else:
            del data[at:]
    return bytes(data)


def check_document(t: MessageType, payload: bytes) -> None:
    doc = t.document(payload)
    FILTER.matches(doc)
    shown = t.to_jsonable(payload)
    if shown is not None:
        orjson.dumps(shown)


def check_merge(t: MessageType, stored: bytes, delta: bytes) -> None:
    try:
        merged = t.merge(stored, delta)
    except MergeError as exc:
        assert str(exc)
        return
    assert isinstance(merged, bytes)
    assert t.document(merged) is not None


def payloads(name: str) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=200) | mutated(SAMPLES[name])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_are_valid(name: str) -> None:
    for sample in SAMPLES[name]:
        assert (TYPES[name].document(sample) is None) == (name == "binary")


@pytest.mark.parametrize("name", sorted(SAMPLES))
@SETTINGS
@given(data=st.data())
def test_document_never_raises(name: str, data: st.DataObject) -> None:
    check_document(TYPES[name], data.draw(payloads(name)))


@pytest.mark.parametrize("name", sorted(SAMPLES))
@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_merge_returns_a_message_or_raises_merge_error(name: str, data: st.DataObject) -> None:
    stored = data.draw(st.sampled_from(SAMPLES[name]) | payloads(name))
    delta = data.draw(st.sampled_from(SAMPLES[name]) | payloads(name))
    check_merge(TYPES[name], stored, delta)


def reference_fields(payload: bytes, sep: bytes) -> dict[str, object] | None:
    """FIX/NVFIX fields the plain way: split the bytes, then decode each field."""
    doc: dict[str, object] = {}
    for raw in payload.split(sep):
        if not raw:
            continue
        tag, eq, value = raw.partition(b"=")
        if not eq or not tag:
            return None
        key, text = tag.decode("utf-8", "replace"), value.decode("utf-8", "replace")
        previous = doc.get(key)
        doc[key] = (
            text
            if previous is None
            else [*previous, text]
            if isinstance(previous, list)
            else [previous, text]
        )
    return doc


@SETTINGS
@given(
    payload=st.lists(
        st.sampled_from([b"=", b"|", b"\x01", b"a", b"\xc3", b"\xa9", b"\xff", b"\xe2\x82"]),
        max_size=40,
    ).map(b"".join),
    sep=st.sampled_from([b"|", b"\x01", b"\xa9"]),
)
def test_nvfix_fields_are_the_bytes_split_at_the_separator(payload: bytes, sep: bytes) -> None:
    """Decoding before splitting (the fast path for an ASCII separator) must cut the
    fields where the bytes are cut, whatever invalid UTF-8 surrounds the separator."""
    nvfix = make_type("nv", "nvfix", field_separator=sep)
    assert nvfix.document(payload) == reference_fields(payload, sep)
