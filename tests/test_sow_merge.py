"""delta_publish merge: the documented rules, our deep-merge reading, and properties
(hypothesis, derandomized: the same examples on every run)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.sow import delta_merge

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow],
)


# ---------------------------------------------------------------- the documented rules


def test_a_present_field_replaces_the_stored_value() -> None:
    assert delta_merge({"id": 42, "qty": 1}, {"id": 42, "qty": 5}) == {"id": 42, "qty": 5}


def test_an_absent_field_is_unchanged() -> None:
    stored = {"id": 42, "flowers": "roses", "qty": 1}
    assert delta_merge(stored, {"id": 42, "qty": 2}) == {"id": 42, "flowers": "roses", "qty": 2}


def test_an_array_is_replaced_wholesale() -> None:
    """The AMPS documentation's example."""
    stored = {"id": 42, "contents": {"packages": [{"box": "chocolates"}, {"bowl": "noodles"}]}}
    delta = {"id": 42, "contents": {"packages": [{"basket": "eggs"}]}}
    assert delta_merge(stored, delta) == {"id": 42, "contents": {"packages": [{"basket": "eggs"}]}}


def test_new_fields_are_appended_after_the_stored_ones() -> None:
    merged = delta_merge({"b": 1, "a": 2}, {"z": 0, "a": 3, "c": 4})
    assert list(merged) == ["b", "a", "z", "c"]
    assert merged == {"b": 1, "a": 3, "z": 0, "c": 4}


def test_sub_documents_merge_per_leaf_path() -> None:
    """Our reading of the UNCONFIRMED point: objects merge field by field at any depth."""
    stored = {"id": 1, "px": {"bid": 1.0, "ask": 2.0, "src": {"venue": "X", "seq": 1}}}
    delta = {"px": {"ask": 2.5, "src": {"seq": 2}}}
    assert delta_merge(stored, delta) == {
        "id": 1,
        "px": {"bid": 1.0, "ask": 2.5, "src": {"venue": "X", "seq": 2}},
    }


def test_an_object_meeting_a_non_object_replaces_it_either_way() -> None:
    assert delta_merge({"a": 1}, {"a": {"x": 1}}) == {"a": {"x": 1}}
    assert delta_merge({"a": {"x": 1}}, {"a": 7}) == {"a": 7}
    assert delta_merge({"a": {"x": 1}}, {"a": None}) == {"a": None}
    assert delta_merge({"a": [1]}, {"a": {"x": 1}}) == {"a": {"x": 1}}


def test_a_non_object_record_or_delta_replaces_wholesale() -> None:
    assert delta_merge([1, 2], {"a": 1}) == {"a": 1}
    assert delta_merge({"a": 1}, [3]) == [3]
    assert delta_merge(None, {"a": 1}) == {"a": 1}
    assert delta_merge("text", 5) == 5


def test_neither_argument_is_modified() -> None:
    stored = {"a": {"b": {"c": 1}}, "l": [1]}
    delta = {"a": {"b": {"d": 2}}, "l": [2], "n": {"m": 1}}
    before = copy.deepcopy((stored, delta))
    merged = delta_merge(stored, delta)
    assert (stored, delta) == before
    merged["a"]["b"]["c"] = 99  # the result's merged objects are its own
    assert stored["a"]["b"]["c"] == 1


def test_very_deep_documents_merge_without_recursion_errors() -> None:
    depth = 5000
    stored: dict[str, Any] = {"v": 0}
    delta: dict[str, Any] = {"w": 1}
    for _ in range(depth):
        stored, delta = {"n": stored}, {"n": delta}
    merged = delta_merge(stored, delta)
    node = merged
    for _ in range(depth):
        node = node["n"]
    assert node == {"v": 0, "w": 1}


# ---------------------------------------------------------------- properties

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
field_names = st.sampled_from(["a", "b", "c", "id", "x", ""])
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(field_names, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(field_names, json_values, max_size=5)


def leaves(
    doc: dict[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of every non-object value of ``doc``, descending through objects."""
    for name, value in doc.items():
        if type(value) is dict:
            yield from leaves(value, (*prefix, name))
        else:
            yield (*prefix, name), value


def at(doc: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        doc = doc[name]
    return doc


def touches(delta: Any, path: tuple[str, ...]) -> bool:
    """Does ``delta`` set ``path`` itself, or replace one of its ancestors?"""
    node = delta
    for name in path:
        if type(node) is not dict or name not in node:
            return False
        node = node[name]
        if type(node) is not dict:
            return True
    return True


@SETTINGS
@given(json_objects)
def test_merging_into_an_empty_record_gives_the_delta(delta: dict[str, Any]) -> None:
    assert delta_merge({}, delta) == delta


@SETTINGS
@given(json_values)
def test_merging_a_record_with_itself_changes_nothing(record: Any) -> None:
    assert delta_merge(record, record) == record


@SETTINGS
@given(json_objects, json_objects)
def test_every_leaf_of_the_delta_is_in_the_result(stored: Any, delta: Any) -> None:
    merged = delta_merge(stored, delta)
    for path, value in leaves(delta):
        assert at(merged, path) == value


@SETTINGS
@given(json_objects, json_objects)
def test_stored_leaves_the_delta_does_not_touch_survive(stored: Any, delta: Any) -> None:
    merged = delta_merge(stored, delta)
    for path, value in leaves(stored):
        if not touches(delta, path):
            assert at(merged, path) == value


@SETTINGS
@given(json_objects, json_objects)
def test_stored_fields_keep_their_order_and_new_ones_follow(stored: Any, delta: Any) -> None:
    merged = delta_merge(stored, delta)
    assert list(merged)[: len(stored)] == list(stored)
    assert list(merged)[len(stored) :] == [name for name in delta if name not in stored]


@SETTINGS
@given(json_objects, json_objects)
def test_merging_the_same_delta_twice_is_the_same_as_once(stored: Any, delta: Any) -> None:
    once = delta_merge(stored, delta)
    assert delta_merge(once, delta) == once
