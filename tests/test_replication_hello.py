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
