"""The message types a filter, a SOW key and ``delta_publish`` rely on: fix, nvfix, xml,
bson and msgpack beside json and binary.

For each type: what its document looks like (how paths address fields), that content
filters and SOW keys read it, what ``delta_publish`` makes of a delta, and what a
malformed payload gives (no document, a MergeError that says what to publish).
"""

from __future__ import annotations

import datetime
import uuid

import bson
import msgpack
import orjson
import pytest

from amps_py.filters import compile_expression, compile_filter
from amps_py.message_types import (
    AMPS_ONLY_MODULES,
    BINARY,
    BSON,
    BUILT_MODULES,
    FIX,
    JSON,
    MSGPACK,
    NVFIX,
    XML,
    MergeError,
    MessageTypes,
    default_types,
    make_type,
)
from amps_py.sow.keys import SowKeyer

SOH = "\x01"


def fix(*fields: str, sep: str = SOH) -> bytes:
    return "".join(f + sep for f in fields).encode()


def matches(type_: object, payload: bytes, text: str) -> bool:
    doc = type_.document(payload)  # type: ignore[attr-defined]
    return compile_filter(text).matches(doc)


# ---------------------------------------------------------------- the default set


def test_default_types_are_the_ones_amps_loads() -> None:
    types = default_types()
    assert set(types) == {"fix", "nvfix", "xml", "json", "msgpack", "bson", "binary"}
    assert set(types) == set(BUILT_MODULES)
    assert not set(types) & set(AMPS_ONLY_MODULES)
    for name, t in types.items():
        assert t.name == name and t.module == name
    assert {n for n, t in types.items() if not t.supports_delta} == {"binary"}


def test_later_types_replace_earlier_ones_of_the_same_name() -> None:
    piped = make_type("fix", "fix", field_separator=b"|")
    types = MessageTypes((*default_types().values(), piped))
    assert types["fix"] is piped
    assert len(types) == len(default_types())
    assert types.document("fix", b"55=IBM|") == {"55": "IBM"}
    assert types.document("no-such-type", b"55=IBM|") is None
    assert hash(types) != hash(default_types()) and types != default_types()
    assert MessageTypes(default_types().values()) == default_types()


def test_make_type_refuses_what_the_config_checks_first() -> None:
    with pytest.raises(ValueError, match="unknown message type module 'bflat'"):
        make_type("b", "bflat")
    with pytest.raises(ValueError, match="apply to the fix and nvfix modules only, not to xml"):
        make_type("x", "xml", field_separator=b"|")
    with pytest.raises(ValueError, match="exactly one byte"):
        make_type("f", "fix", field_separator=b"||")
    with pytest.raises(ValueError, match="cannot be '='"):
        make_type("f", "nvfix", field_separator=b"=")


def test_renamed_json_and_binary_behave_as_their_module() -> None:
    js = make_type("orders-json", "json")
    assert (js.name, js.module, js.supports_delta) == ("orders-json", "json", True)
    assert js.document(b'{"a": 1}') == {"a": 1}
    assert js == make_type("orders-json", "json") and js != JSON
    blob = make_type("blob", "binary")
    assert blob.document(b"anything") is None and not blob.supports_delta
    assert make_type("json", "json") is JSON and make_type("binary", "binary") is BINARY


# ---------------------------------------------------------------- FIX


ORDER_FIX = fix("35=D", "55=IBM", "38=100", "44=101.25", "54=1", "448=A", "448=B")


def test_fix_document_is_tags_to_string_values() -> None:
    assert FIX.document(ORDER_FIX) == {
        "35": "D",
        "55": "IBM",
        "38": "100",
        "44": "101.25",
        "54": "1",
        "448": ["A", "B"],
    }
    # no trailing separator, a value holding '=', an empty value, empty fields
    assert FIX.document(b"55=IBM\x01\x0158=a=b\x0199=") == {"55": "IBM", "58": "a=b", "99": ""}
    assert FIX.document(b"") == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/55 = 'IBM'", True),
        ("/38 > 50 AND /38 < 150", True),  # numeric strings compare as numbers
        ("/44 * 2 = 202.5", True),
        ("/448 = 'B'", True),  # a repeated tag: any occurrence
        ("/448[0] = 'A' AND /448[1] = 'B'", True),
        ("/448[0] = 'B'", False),
        ("/99 IS NULL", True),
        ("/55 IN ('MSFT', 'IBM') AND /35 = 'D'", True),
    ],
)
def test_filters_over_fix(text: str, expected: bool) -> None:
    assert matches(FIX, ORDER_FIX, text) is expected


@pytest.mark.parametrize(
    "payload",
    [b"55=IBM\x01junk\x01", b"=IBM\x01", b"Symbol=IBM\x01", b"5x=1\x01", b'{"55": "IBM"}'],
)
def test_malformed_fix_has_no_document(payload: bytes) -> None:
    assert FIX.document(payload) is None
    assert not matches(FIX, payload, "/55 = 'IBM' OR /55 IS NULL AND 1 = 0")


def test_fix_with_a_configured_separator() -> None:
    piped = make_type("fix-pipe", "fix", field_separator=b"|")
    assert piped.document(b"55=IBM|38=5|") == {"55": "IBM", "38": "5"}
    assert FIX.document(b"55=IBM|38=5") == {"55": "IBM|38=5"}  # '|' separates nothing
    assert piped.merge(b"55=IBM|38=5|", b"38=6|") == b"55=IBM|38=6|"
    high = make_type("fix-a5", "fix", field_separator=b"\xa5")  # not an ASCII byte
    assert high.document(b"55=\xc3\xa9\xa538=5") == {"55": "é", "38": "5"}


def test_fix_delta_merge_follows_amps() -> None:
    # The AMPS FAQ's example: fields replace or append, every field ends with SOH.
    assert FIX.merge(b"1=FOO\x015=TEST1", b"5=TEST1\x012=BAR") == b"1=FOO\x015=TEST1\x012=BAR\x01"
    # a replaced field keeps its place; untouched ones stay byte for byte
    assert FIX.merge(fix("55=IBM", "38=100", "44=1"), fix("38=200")) == fix(
        "55=IBM", "38=200", "44=1"
    )
    # a repeated tag is replaced as a whole (an array), where it first was
    assert FIX.merge(fix("55=IBM", "448=A", "38=1", "448=B"), fix("448=C")) == fix(
        "55=IBM", "448=C", "38=1"
    )
    assert FIX.merge(fix("55=IBM", "448=A"), fix("448=C", "448=D", "11=x")) == fix(
        "55=IBM", "448=C", "448=D", "11=x"
    )
    assert FIX.merge(b"", fix("55=IBM")) == fix("55=IBM")


def test_fix_merge_of_malformed_messages_says_what_to_publish() -> None:
    with pytest.raises(MergeError, match=r"the delta message is not FIX: 'oops' is not a numeric"):
        FIX.merge(fix("55=IBM"), b"oops\x01")
    with pytest.raises(MergeError, match="the stored message is not FIX"):
        FIX.merge(b'{"a": 1}', fix("55=IBM"))


def test_fix_sow_keys_read_tags() -> None:
    keyer = SowKeyer("t", ("/55", "/11"))
    doc = FIX.document(fix("11=ord-1", "55=IBM", "38=5"))
    other = FIX.document(fix("55=IBM", "11=ord-1", "38=6"))
    assert keyer.key_of(doc) == keyer.key_of(other)


# ---------------------------------------------------------------- NVFIX


def test_nvfix_document_names_and_odd_names() -> None:
    payload = fix("Symbol=IBM", "Qty=100", "Order Type=limit", "Leg=1", "Leg=2", "@x=y")
    assert NVFIX.document(payload) == {
        "Symbol": "IBM",
        "Qty": "100",
        "Order Type": "limit",
        "Leg": ["1", "2"],
        "@x": "y",
    }
    assert matches(NVFIX, payload, "/Symbol = 'IBM' AND /Qty >= 100")
    assert matches(NVFIX, payload, "[/Order Type] = 'limit' AND /Leg[1] = 2 AND /@x = 'y'")
    assert NVFIX.document(b"Symbol=IBM\x01no-equals\x01") is None
    assert NVFIX.document(b"=x\x01") is None


def test_nvfix_delta_merge() -> None:
    merged = NVFIX.merge(fix("Symbol=IBM", "Qty=100"), fix("Qty=150", "Px=1.5"))
    assert merged == fix("Symbol=IBM", "Qty=150", "Px=1.5")
    with pytest.raises(MergeError, match="the delta message is not NVFIX: 'x' is not a name=value"):
        NVFIX.merge(fix("Symbol=IBM"), b"x")


# ---------------------------------------------------------------- XML

ORDER_XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<Order id="5" update="full">
  <!-- a comment -->
  <Symbol>IBM</Symbol>
  <Qty>10</Qty>
  <Price ccy="USD">101.5</Price>
  <Leg side="buy">a</Leg>
  <Leg side="sell">b</Leg>
  <Note/>
  <Trader><Desk>rates</Desk><Name>kim</Name></Trader>
</Order>"""


def test_xml_document_keeps_the_root_and_addresses_attributes() -> None:
    doc = XML.document(ORDER_XML)
    assert isinstance(doc, dict) and list(doc) == ["Order"]
    assert XML.to_jsonable(ORDER_XML) == {
        "Order": {
            "@id": "5",
            "@update": "full",
            "Symbol": "IBM",
            "Qty": "10",
            "Price": {"#text": "101.5", "@ccy": "USD"},
            "Leg": [{"#text": "a", "@side": "buy"}, {"#text": "b", "@side": "sell"}],
            "Note": "",
            "Trader": {"Desk": "rates", "Name": "kim"},
        }
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/Order/@id = 5", True),
        ("[/Order/@id] = '5'", True),
        ("/Order/@update = 'full'", True),
        ("/Order/Symbol = 'IBM' AND /Order/Qty > 5", True),
        ("/Order/Price > 100 AND /Order/Price/@ccy = 'USD'", True),  # text and attribute
        ("/Order/Leg = 'b' AND /Order/Leg/@side = 'sell'", True),
        ("/Order/Leg[1] = 'b'", True),
        ("/Order/Trader/Desk = 'rates'", True),
        ("/Order/Trader IS NULL", True),  # an element with only children has no value
        ("/Order/Note IS NULL", True),
        ("/Symbol = 'IBM'", False),  # the root element is part of the path
        ("/Order/@missing IS NULL", True),
    ],
)
def test_filters_over_xml(text: str, expected: bool) -> None:
    assert matches(XML, ORDER_XML, text) is expected


def test_xml_value_expressions_and_keys_read_the_same_document() -> None:
    doc = XML.document(ORDER_XML)
    assert compile_expression("/Order/Qty * 2").value(doc) == 20
    assert compile_expression("ARRAY_COUNT(/Order/Leg)").value(doc) == 2
    keyer = SowKeyer("t", ("/Order/@id",))
    same = XML.document(b'<Order id="5"><Qty>99</Qty></Order>')
    assert keyer.key_of(doc) == keyer.key_of(same)


def test_xml_namespaces_are_dropped_to_local_names() -> None:
    payload = b"""<o:Order xmlns:o="urn:orders" xmlns:x="urn:x" x:id="7">
        <o:Qty>3</o:Qty><x:Qty>4</x:Qty><![CDATA[ignored]]></o:Order>"""
    doc = XML.document(payload)
    assert XML.to_jsonable(payload) == {
        "Order": {"#text": "ignored", "@id": "7", "Qty": ["3", "4"]}
    }
    assert compile_filter("/Order/@id = 7 AND /Order/Qty = 4").matches(doc)


def test_xml_text_of_a_leaf_is_kept_as_written() -> None:
    assert XML.document(b"<a><b> x </b><c></c></a>") == {"a": {"b": " x ", "c": ""}}
    assert XML.document(b"<a>just text</a>") == {"a": "just text"}


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"<Order><Qty>1</Order>",
        b"<a/><b/>",
        b'{"a": 1}',
        b"<a>&undefined;</a>",
        # a DOCTYPE is refused, so no entity is ever expanded (billion laughs)
        b'<!DOCTYPE a [<!ENTITY x "xxxxxxxxxx"><!ENTITY y "&x;&x;&x;&x;&x;">]><a>&y;</a>',
        b'<!DOCTYPE a SYSTEM "http://example.invalid/a.dtd"><a/>',
        b'<!DOCTYPE a [<!ENTITY f SYSTEM "file:///etc/passwd">]><a>&f;</a>',
    ],
)
def test_malformed_or_dangerous_xml_has_no_document(payload: bytes) -> None:
    assert XML.document(payload) is None
    assert XML.to_jsonable(payload) is None


def test_xml_nesting_beyond_the_parser_limit_has_no_document() -> None:
    deep = b"<a>" * 5000 + b"x" + b"</a>" * 5000
    assert XML.document(deep) is None
    fine = b"<a>" * 200 + b"x" + b"</a>" * 200
    assert XML.document(fine) is not None


def test_xml_delta_merge_element_by_element() -> None:
    stored = b'<Order id="5"><Symbol>IBM</Symbol><Qty>10</Qty><Leg>a</Leg><Leg>b</Leg></Order>'
    delta = b'<Order st="open"><Qty>11</Qty><Leg>c</Leg><Px>1.5</Px></Order>'
    merged = XML.merge(stored, delta)
    assert merged == (
        b'<Order id="5" st="open"><Symbol>IBM</Symbol><Qty>11</Qty><Leg>c</Leg><Px>1.5</Px></Order>'
    )
    # deeper: a sub-element present once on both sides merges field by field
    stored = b"<O><T><Desk>rates</Desk><Name>kim</Name></T></O>"
    assert XML.merge(stored, b"<O><T><Name>lee</Name></T></O>") == (
        b"<O><T><Desk>rates</Desk><Name>lee</Name></T></O>"
    )
    # a leaf in the delta replaces the element's content; attributes are kept unless named
    stored = b'<O><Px ccy="USD" src="x">1</Px><T><Desk>d</Desk></T></O>'
    assert XML.merge(stored, b'<O><Px ccy="EUR">2</Px><T>none</T></O>') == (
        b'<O><Px ccy="EUR" src="x">2</Px><T>none</T></O>'
    )
    # a declaration in the stored message is kept; the result is UTF-8
    merged = XML.merge('<?xml version="1.0"?><a><b>é</b></a>'.encode(), b"<a><c>1</c></a>")
    assert merged.startswith(b"<?xml") and "é".encode() in merged
    assert XML.document(merged) == {"a": {"b": "é", "c": "1"}}


def test_xml_merge_refuses_another_root_and_malformed_messages() -> None:
    with pytest.raises(MergeError, match=r"the delta's root element <Trade> is not .* <Order>"):
        XML.merge(b"<Order/>", b"<Trade/>")
    with pytest.raises(MergeError, match="the delta message is not well-formed XML"):
        XML.merge(b"<Order/>", b"<Order>")
    with pytest.raises(MergeError, match="the stored message is not well-formed XML"):
        XML.merge(b"55=IBM\x01", b"<Order/>")


# ---------------------------------------------------------------- BSON


def test_bson_document_makes_bson_values_comparable() -> None:
    oid = bson.ObjectId("65a1b2c3d4e5f60718293a4b")
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, 678000)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    payload = bson.encode(
        {
            "_id": oid,
            "sym": "IBM",
            "qty": bson.Int64(2**40),
            "px": 101.25,
            "when": when,
            "exact": bson.Decimal128("12.50"),
            "tag": bson.Binary(b"raw"),
            "uid": bson.Binary.from_uuid(ident),
            "re": bson.Regex("^I", "i"),
            "code": bson.Code("x = 1"),
            "ts": bson.Timestamp(1700000000, 7),
            "lo": bson.MinKey(),
            "legs": [{"side": "buy"}, {"side": "sell"}],
            "nested": {"deep": {"n": 1}},
        }
    )
    doc = BSON.document(payload)
    assert doc == {
        "_id": "65a1b2c3d4e5f60718293a4b",
        "sym": "IBM",
        "qty": 2**40,
        "px": 101.25,
        "when": 1704164645678,
        "exact": "12.50",
        "tag": "raw",
        "uid": str(ident),
        "re": "^I",
        "code": "x = 1",
        "ts": {"t": 1700000000, "i": 7},
        "lo": None,
        "legs": [{"side": "buy"}, {"side": "sell"}],
        "nested": {"deep": {"n": 1}},
    }
    assert type(doc["qty"]) is int  # type: ignore[index]
    assert orjson.loads(orjson.dumps(BSON.to_jsonable(payload))) == doc
    f = compile_filter(
        "/_id = '65a1b2c3d4e5f60718293a4b' AND /qty > 1000 AND /exact = 12.5 AND "
        "/legs/side = 'sell' AND /nested/deep/n = 1 AND /when > 1700000000000 AND /lo IS NULL"
    )
    assert f.matches(doc)


def test_bson_dates_of_any_year_are_milliseconds() -> None:
    payload = b"\x10\x00\x00\x00\x09d\x00" + (2**62).to_bytes(8, "little") + b"\x00"
    assert BSON.document(payload) == {"d": 2**62}  # far beyond datetime's year 9999


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x05\x00\x00\x00",  # truncated
        bson.encode({"a": 1}) + b"\x00",  # trailing bytes
        bson.encode({"a": 1})[:-1],
        b"\xff\xff\xff\x7f" + b"\x00" * 8,  # a length far beyond the payload
        b'{"a": 1}',
    ],
)
def test_malformed_bson_has_no_document(payload: bytes) -> None:
    assert BSON.document(payload) is None


def test_bson_nested_too_deep_has_no_document() -> None:
    inner = b"\x05\x00\x00\x00\x00"
    for _ in range(3000):
        body = b"\x03a\x00" + inner + b"\x00"
        inner = (len(body) + 4).to_bytes(4, "little") + body
    assert BSON.document(inner) is None


def test_bson_delta_merge_keeps_every_bson_type() -> None:
    oid = bson.ObjectId()
    stored = bson.encode(
        {
            "_id": oid,
            "qty": bson.Int64(5),
            "px": bson.Decimal128("1.1"),
            "o": {"a": 1, "b": 2},
            "legs": [1, 2],
        }
    )
    merged = BSON.merge(
        stored, bson.encode({"qty": bson.Int64(6), "o": {"b": 3}, "legs": [9], "new": True})
    )
    back = bson.decode(merged)
    assert back == {
        "_id": oid,
        "qty": 6,
        "px": bson.Decimal128("1.1"),
        "o": {"a": 1, "b": 3},
        "legs": [9],
        "new": True,
    }
    assert type(back["qty"]) is bson.Int64  # still a BSON int64
    with pytest.raises(MergeError, match="the delta message is not a valid BSON document"):
        BSON.merge(stored, b"garbage")


# ---------------------------------------------------------------- MessagePack


def test_msgpack_document_follows_the_amps_mapping() -> None:
    payload = msgpack.packb(
        {
            "sym": "IBM",
            "qty": 100,
            "px": 1.5,
            "ok": True,
            "none": None,
            "blob": b"raw\xff",
            "ext": msgpack.ExtType(7, b"xyz"),
            "when": msgpack.Timestamp(1700000000, 5),
            b"bytes-key": 1,
            42: "int key",
            None: "dropped",
            "legs": [{"side": "buy"}, {"side": "sell"}],
        },
        use_bin_type=True,
    )
    doc = MSGPACK.document(payload)
    assert doc == {
        "sym": "IBM",
        "qty": 100,
        "px": 1.5,
        "ok": True,
        "none": None,
        "blob": "raw\ufffd",
        "ext": "xyz",
        "when": 1700000000_000000005,
        "bytes-key": 1,
        "42": "int key",
        "legs": [{"side": "buy"}, {"side": "sell"}],
    }
    f = compile_filter(
        "/sym = 'IBM' AND /qty > 50 AND /blob LIKE '^raw' AND /42 = 'int key' "
        "AND /legs/side = 'sell' AND /ext = 'xyz' AND /ok"
    )
    assert f.matches(doc)
    assert SowKeyer("t", ("/sym",)).key_of(doc) == SowKeyer("t", ("/sym",)).key_of({"sym": "IBM"})


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used
        b"\x92\x01",  # an array of 2 with 1 element
        msgpack.packb({"a": 1}) + b"\x00",  # trailing bytes
        b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 billion elements
        b"\xdf\xff\xff\xff\xff",  # a map header claiming 4 billion entries
        b"\xdb\xff\xff\xff\xff" + b"x" * 10,  # a str header claiming 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin 32 claiming 4 GiB
        b"\x91" * 100_000 + b"\xc0",  # nested far too deep
        b"\x81\x91\x01\x02",  # an array as a map key (unhashable)
    ],
)
def test_hostile_msgpack_has_no_document(payload: bytes) -> None:
    assert MSGPACK.document(payload) is None


def test_msgpack_scalar_and_array_messages_are_documents_too() -> None:
    assert MSGPACK.document(msgpack.packb([1, "a"])) == [1, "a"]
    assert MSGPACK.document(msgpack.packb(b"\x00")) == "\x00"


def test_msgpack_delta_merge_keeps_bin_and_ext() -> None:
    stored = msgpack.packb(
        {"sym": "IBM", "blob": b"\x00\x01", "o": {"a": 1, "b": 2}, "e": msgpack.ExtType(3, b"e")},
        use_bin_type=True,
    )
    merged = MSGPACK.merge(stored, msgpack.packb({"o": {"b": 3}, "qty": 5}))
    assert msgpack.unpackb(merged) == {
        "sym": "IBM",
        "blob": b"\x00\x01",
        "o": {"a": 1, "b": 3},
        "e": msgpack.ExtType(3, b"e"),
        "qty": 5,
    }
    with pytest.raises(MergeError, match="the stored message is not one well-formed MessagePack"):
        MSGPACK.merge(b"\xc1", merged)


# ---------------------------------------------------------------- binary and json


def test_binary_has_no_fields_and_no_merge() -> None:
    assert BINARY.document(b"55=IBM\x01") is None
    with pytest.raises(MergeError, match="publish the whole message instead"):
        BINARY.merge(b"a", b"b")


def test_every_type_reads_the_same_order_alike() -> None:
    """One order in every format: one filter, one key, the same answer."""
    order = {"id": "A-1", "sym": "IBM", "qty": 100}
    payloads = {
        "json": orjson.dumps(order),
        "nvfix": fix("id=A-1", "sym=IBM", "qty=100"),
        "bson": bson.encode(order),
        "msgpack": msgpack.packb(order),
    }
    f = compile_filter("/sym = 'IBM' AND /qty >= 100 AND /id = 'A-1'")
    keyer = SowKeyer("t", ("/id",))
    keys = set()
    for name, payload in payloads.items():
        doc = default_types().document(name, payload)
        assert f.matches(doc), name
        keys.add(keyer.key_of(doc))
    assert len(keys) == 1


# ---------------------------------------------------------------- path syntax


def test_attribute_steps_compile_for_every_type() -> None:
    """``@name`` is a path step anywhere; in JSON it is the key "@name"."""
    f = compile_filter("/Order/@id = 5 AND [/Order/@odd name] = 'x'")
    assert f.matches({"Order": {"@id": 5, "@odd name": "x"}})
    assert not f.matches({"Order": {"id": 5, "odd name": "x"}})


def test_an_object_with_text_is_its_text_where_a_path_ends() -> None:
    from amps_py.filters.values import TextNode

    price = TextNode("10.5")
    price["@ccy"] = "USD"
    doc = {"o": {"px": price, "legs": [TextNode("a"), TextNode(""), {"x": "1"}]}}
    assert compile_filter("/o/px = 10.5 AND /o/px/@ccy = 'USD'").matches(doc)
    assert compile_filter("/o/legs = 'a'").matches(doc)
    assert compile_expression("/o/legs").value(doc) == "a"  # '' and a plain object: no value
    assert compile_expression("ARRAY_COUNT(/o/legs)").value(doc) == 3
    assert compile_filter("/o IS NULL").matches(doc)


def test_message_types_survive_pickling_and_copying() -> None:
    """A configuration may be copied or sent to another process: its types stay equal."""
    import copy
    import pickle

    types = MessageTypes(
        (
            *default_types().values(),
            make_type("j2", "json"),
            make_type("fix-pipe", "fix", field_separator=b"|"),
        )
    )
    for clone in (pickle.loads(pickle.dumps(types)), copy.deepcopy(types)):
        assert clone == types and hash(clone) == hash(types)
        assert clone["fix-pipe"].document(b"55=IBM|") == {"55": "IBM"}


def test_xml_predefined_entities_and_character_references_are_text() -> None:
    assert XML.document(b"<a><b>&amp;&lt;&#65;&#x42;</b></a>") == {"a": {"b": "&<AB"}}
