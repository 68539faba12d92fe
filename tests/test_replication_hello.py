"""The handshake codec (:mod:`amps_py.replication.hello`): what one end builds, the
other end parses back unchanged, and :mod:`amps_py.replication.link` still gives it."""

from __future__ import annotations

import orjson
import pytest

from amps_py import reasons
from amps_py.replication import hello, link


def test_a_hello_built_parses_back_with_credentials_and_back_offer() -> None:
    topics = [{"name": "orders", "message_type": "json", "filter": None}]
    body = hello.hello_body(
        name="a",
        group="g",
        destination="b",
        sync="sync",
        compression="zstd",
        topics=topics,
        expected_group="h",
        credentials=("repl", "secret"),
        back=True,
    )
    parsed = hello.parse_hello(hello.decode_payload(orjson.dumps(body), "repl_hello"))
    assert parsed == hello.Hello(
        version=hello.PROTOCOL_VERSION,
        name="a",
        group="g",
        destination="b",
        sync="sync",
        compression="zstd",
        topics=tuple(topics),
        expected_group="h",
        user_id="repl",
        pw="secret",
        back=True,
    )
    assert "secret" not in repr(parsed)


def test_a_hello_without_credentials_or_back_sends_neither_field() -> None:
    body = hello.hello_body(
        name="a", group="a", destination="b", sync="async", compression="none", topics=[]
    )
    assert "user_id" not in body and "pw" not in body and "back" not in body


def test_a_welcome_built_parses_back() -> None:
    body = hello.welcome_body(name="b", group="g", cursor=(42, "bm"))
    parsed = hello.parse_welcome(hello.decode_payload(orjson.dumps(body), "repl_welcome"))
    assert parsed == hello.Welcome(name="b", group="g", cursor_txid=42, cursor_bm="bm")


def test_a_payload_that_is_not_a_json_object_is_a_protocol_violation() -> None:
    with pytest.raises(link.RemoteProtocolError) as caught:
        hello.decode_payload(b"[1]", "repl_hello")
    assert caught.value.reason == reasons.PROTOCOL_VIOLATION


def test_link_still_gives_the_codec_and_the_errors() -> None:
    for name in ("Hello", "Welcome", "parse_hello", "parse_welcome", "PROTOCOL_VERSION"):
        assert getattr(link, name) is getattr(hello, name)
    assert issubclass(link.RemoteProtocolError, link.LinkError)
    assert issubclass(link.LocalProtocolError, RuntimeError)


# ----------------------------------------------------------------- the resync exchange


def test_the_exchange_fields_parse_back_and_are_optional() -> None:
    body = hello.hello_body(
        name="a",
        group="a",
        destination="b",
        sync="async",
        compression="none",
        topics=[],
        holdings={"a": 2**64 - 1, "x": 5, "": 0},
    )
    parsed = hello.parse_hello(orjson.loads(orjson.dumps(body)))
    assert parsed.holdings == {"a": 2**64 - 1, "x": 5, "": 0}
    held = {
        "a": hello.HeldOrigin(700, 2**64 - 2, ((1, 3), (0, 9))),
        "x": hello.HeldOrigin(None, 0, ((4, 4),)),
    }
    welcome = hello.welcome_body(name="b", group="g", cursor=(0, ""), holdings=held)
    assert hello.parse_welcome(orjson.loads(orjson.dumps(welcome))).holdings == held
    # an older peer sends neither: the field reads as absent, not empty
    old = hello.hello_body(
        name="a", group="a", destination="b", sync="async", compression="none", topics=[]
    )
    assert "holdings" not in old and hello.parse_hello(old).holdings is None
    assert hello.parse_welcome({"name": "b", "cursor_txid": 0}).holdings is None


def test_fields_a_newer_peer_adds_are_ignored() -> None:
    body = hello.hello_body(
        name="a", group="a", destination="b", sync="async", compression="none", topics=[]
    )
    assert hello.parse_hello({**body, "future": {"x": [1]}}).name == "a"
    assert hello.parse_welcome({"name": "b", "cursor_txid": 3, "future": 1}).cursor_txid == 3
    held = {"a": {"upto": 5, "digest": 7, "cuts": [], "future": True}}
    welcome = hello.parse_welcome({"name": "b", "holdings": held})
    assert welcome.holdings == {"a": hello.HeldOrigin(5, 7, ())}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"holdings": [1]}, "'holdings'"),
        ({"holdings": {"a": "5"}}, "'holdings.a'"),
        ({"holdings": {"a": -1}}, "'holdings.a'"),
        ({"holdings": {"x" * 65: 1}}, "'holdings'"),
    ],
)
def test_a_malformed_hello_holdings_is_refused_naming_the_field(
    body: dict[str, object], field: str
) -> None:
    good = hello.hello_body(
        name="a", group="a", destination="b", sync="async", compression="none", topics=[]
    )
    with pytest.raises(link.RemoteProtocolError) as caught:
        hello.parse_hello({**good, **body})
    assert caught.value.reason == reasons.MALFORMED_HELLO and field in str(caught.value)


@pytest.mark.parametrize(
    ("held", "field"),
    [
        ({"a": [[1, 2]]}, "'holdings.a'"),
        ({"a": {"cuts": [[1]]}}, "'holdings.a.cuts'"),
        ({"a": {"cuts": [[1, 2**64]]}}, "'holdings.a.cuts'"),
        ({"a": {"upto": 5}}, "'holdings.a'"),
        ({"a": {"digest": 5, "cuts": []}}, "'holdings.a'"),
        ({"a": {"upto": "5", "digest": 1}}, "'holdings.a'"),
    ],
)
def test_a_malformed_welcome_holdings_is_refused_naming_the_field(
    held: dict[str, object], field: str
) -> None:
    with pytest.raises(link.RemoteProtocolError) as caught:
        hello.parse_welcome({"name": "b", "cursor_txid": 0, "holdings": held})
    assert caught.value.reason == reasons.MALFORMED_WELCOME and field in str(caught.value)


def test_a_hello_too_large_with_its_holdings_goes_without_them() -> None:
    up = link.UpstreamLink(0.0, 1.0)
    many = {f"origin-{i:05d}": 2**63 for i in range(3000)}  # far beyond MAX_ORIGINS
    frame = up.hello(
        name="a", group="a", destination="b", sync="async", topics=[], now=0.0, holdings=many
    )
    down = link.DownstreamLink(0.0, 1.0)
    [received] = down.receive_data(frame, 0.0)
    assert isinstance(received, hello.Hello) and received.holdings is None
