"""SOW keys: generated keys are stable, opaque and distinct; explicit keys are checked."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from amps_py.sow import SowKeyer, SowKeyError, parse_key_paths
from amps_py.sow.keys import MAX_KEY_BYTES

ROOT = Path(__file__).resolve().parent.parent


def test_a_generated_key_is_unsigned_64_bit_decimal_digits() -> None:
    key = SowKeyer("orders", ["/id"]).key_of({"id": 42})
    assert key.isdigit() and key.isascii()
    assert 0 <= int(key) < 2**64
    assert str(int(key)) == key  # no leading zeros: the canonical decimal text


def test_generated_keys_are_pinned_so_every_instance_and_version_agrees() -> None:
    """Changing the encoding would split the SOW of a replicated pair mid-upgrade:
    these values must never change. The first is also computed by hand from the
    documented encoding (BLAKE2b-8 of the length-prefixed domain, then per value a type
    byte, a 4-byte big-endian length and the text)."""
    by_hand = hashlib.blake2b(
        struct.pack(">I", 6) + b"orders" + b"i" + struct.pack(">I", 2) + b"42", digest_size=8
    ).digest()
    assert SowKeyer("orders", ["/id"]).key_of({"id": 42}) == str(int.from_bytes(by_hand, "big"))
    assert SowKeyer("orders", ["/id"]).key_of({"id": 42}) == "9525531402570064256"
    doc = {"a": "x", "b": {"c": 1.5}}
    assert SowKeyer("t", ["/a", "/b/c"]).key_of(doc) == "14644230124558186134"


def test_generated_keys_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from amps_py.sow import SowKeyer\n"
        "print(SowKeyer('orders', ['/id', '/sym']).key_of({'sym': 'IBM', 'id': 'a-1'}))\n"
    )
    seen = set()
    for seed in ("1", "2", "random"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        seen.add(result.stdout.strip())
    assert seen == {SowKeyer("orders", ["/id", "/sym"]).key_of({"id": "a-1", "sym": "IBM"})}


def test_the_key_depends_only_on_the_key_fields() -> None:
    keyer = SowKeyer("orders", ["/id"])
    base = keyer.key_of({"id": 7, "qty": 1})
    assert keyer.key_of({"qty": 99, "extra": [1, 2], "id": 7}) == base
    assert keyer.key_of({"id": 8, "qty": 1}) != base


def test_composite_keys_use_every_path_in_order() -> None:
    keyer = SowKeyer("t", ["/a", "/b"])
    assert keyer.key_of({"a": "ab", "b": "c"}) != keyer.key_of({"a": "a", "b": "bc"})
    assert keyer.key_of({"a": 1, "b": 2}) != keyer.key_of({"a": 2, "b": 1})
    assert keyer.key_of({"a": 1, "b": 2}) == keyer.key_of({"b": 2, "a": 1})


def test_values_of_different_json_types_are_different_keys() -> None:
    keyer = SowKeyer("t", ["/id"])
    keys = {keyer.key_of({"id": v}) for v in (5, "5", 5.0, True, 1, "true")}
    assert len(keys) == 6


def test_the_key_domain_defaults_to_the_topic_and_can_be_shared() -> None:
    doc = {"id": 1}
    assert SowKeyer("a", ["/id"]).key_of(doc) != SowKeyer("b", ["/id"]).key_of(doc)
    shared_a = SowKeyer("a", ["/id"], key_domain="dom").key_of(doc)
    assert shared_a == SowKeyer("b", ["/id"], key_domain="dom").key_of(doc)
    assert SowKeyer("a", ["/id"], key_domain="a").key_of(doc) == SowKeyer("a", ["/id"]).key_of(doc)


def test_nested_and_array_key_paths() -> None:
    keyer = SowKeyer("t", ["/order/id"])
    assert keyer.key_of({"order": {"id": 3}}) != keyer.key_of({"order": {"id": 4}})
    listed = SowKeyer("t", ["/ids"])
    assert listed.key_of({"ids": [1, 2]}) != listed.key_of({"ids": [2, 1]})
    assert listed.key_of({"ids": [1, 2]}) != listed.key_of({"ids": [1]})
    first = SowKeyer("t", ["/ids[0]"])
    assert first.key_of({"ids": [1, 2]}) == first.key_of({"ids": [1, 9]})


@pytest.mark.parametrize("doc", [{}, {"id": None}, {"id": ""}, {"id": {}}, {"id": []}, [], "x"])
def test_a_missing_key_field_names_the_path_and_the_topic(doc: object) -> None:
    with pytest.raises(SowKeyError) as info:
        SowKeyer("orders", ["/id"]).key_of(doc)
    assert "/id" in str(info.value)
    assert "'orders'" in str(info.value)


def test_the_second_missing_path_is_the_one_named() -> None:
    with pytest.raises(SowKeyError, match="/b/c"):
        SowKeyer("t", ["/a", "/b/c"]).key_of({"a": 1, "b": {"d": 2}})


def test_a_topic_without_key_paths_asks_for_an_explicit_key() -> None:
    keyer = SowKeyer("t", [])
    assert not keyer.generates_keys
    with pytest.raises(SowKeyError, match="k header"):
        keyer.key_of({"id": 1})


@pytest.mark.parametrize("k", ["abc", "QUJD", "a+b/c==", "0123456789", "x" * MAX_KEY_BYTES])
def test_explicit_keys_of_base64_characters_are_returned_verbatim(k: str) -> None:
    assert SowKeyer("t", []).explicit_key(k) == k


@pytest.mark.parametrize(
    ("k", "words"),
    [
        ("", "empty"),
        ("has space", "' '"),
        ("semi;colon", "';'"),
        ("é", "'é'"),
        ("x" * (MAX_KEY_BYTES + 1), "limit"),
    ],
)
def test_bad_explicit_keys_are_refused_with_the_reason(k: str, words: str) -> None:
    with pytest.raises(SowKeyError) as info:
        SowKeyer("orders", []).explicit_key(k)
    assert words in str(info.value)
    assert "'orders'" in str(info.value)


def test_parse_key_paths_accepts_lists_and_comma_separated_text() -> None:
    assert parse_key_paths("/a, /b/c") == ("/a", "/b/c")
    assert parse_key_paths(["/a", " /b ", "/a"]) == ("/a", "/b")
    assert parse_key_paths(["[/odd name]", "/items[0]"]) == ("[/odd name]", "/items[0]")


@pytest.mark.parametrize("path", ["", "id", "/a/", "/a = 1", "//a", "/a /b", "5"])
def test_parse_key_paths_refuses_what_is_not_a_field_path(path: str) -> None:
    with pytest.raises(SowKeyError, match="SOW key path"):
        parse_key_paths([path])


def test_a_keyer_with_a_bad_path_fails_at_construction() -> None:
    with pytest.raises(SowKeyError, match="'nope'"):
        SowKeyer("t", ["nope"])
