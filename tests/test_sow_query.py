"""SOW query results: OrderBy parsing, filter + order + top_n/skip_n, batches."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.filters import compile_filter
from amps_py.sow import OrderByError, SowEntry, batches, parse_orderby, select

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)


def entry(key: str, doc: Any) -> SowEntry:
    return SowEntry(key, 1, "", "", 0, orjson.dumps(doc))


def entries_of(*docs: Any) -> list[SowEntry]:
    """Entries keyed k00, k01, ... (so the key order is the argument order)."""
    return [entry(f"k{i:02d}", doc) for i, doc in enumerate(docs)]


def keys(result: list[SowEntry]) -> list[str]:
    return [e.key for e in result]


# ---------------------------------------------------------------- parse_orderby


def test_orderby_terms_directions_and_text_hints() -> None:
    terms = parse_orderby("/orderDate DESC, /customerName asc ,/id, /n Text DESC, [/odd, name]")
    assert [(t.path, t.descending, t.text) for t in terms] == [
        ("/orderDate", True, False),
        ("/customerName", False, False),
        ("/id", False, False),
        ("/n", True, True),
        ("[/odd, name]", False, False),
    ]


def test_an_empty_orderby_means_no_ordering() -> None:
    assert parse_orderby("") == ()
    assert parse_orderby("   ") == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("/a,", "empty term"),
        ("/a,,/b", "empty term"),
        ("a", "field identifier"),
        ("/a UP", "'UP'"),
        ("/a ASC DESC", "'DESC'"),
        ("/a TEXT TEXT", "'TEXT'"),
        ("/a + 1", "'+'"),
        ("/a/", "end with '/'"),
        ("ASC", "field identifier"),
    ],
)
def test_bad_orderby_says_which_term_and_how_to_write_it(text: str, words: str) -> None:
    with pytest.raises(OrderByError) as info:
        parse_orderby(text)
    message = str(info.value)
    assert words in message
    assert "/field DESC" in message  # the how-to


# ---------------------------------------------------------------- select


def test_without_orderby_results_keep_the_store_order() -> None:
    rows = entries_of({"n": 3}, {"n": 1}, {"n": 2})
    assert keys(select(rows)) == ["k00", "k01", "k02"]


def test_the_filter_selects_records() -> None:
    rows = entries_of({"n": 3}, {"n": 1}, {"n": 2})
    f = compile_filter("/n >= 2")
    assert keys(select(rows, lambda e: f.matches_json(e.payload))) == ["k00", "k02"]


def test_orderby_ascending_descending_and_ties_in_key_order() -> None:
    rows = entries_of(
        {"d": 2, "c": "b"}, {"d": 1, "c": "z"}, {"d": 2, "c": "a"}, {"d": 1, "c": "z"}
    )
    assert keys(select(rows, orderby=parse_orderby("/d"))) == ["k01", "k03", "k00", "k02"]
    assert keys(select(rows, orderby=parse_orderby("/d DESC"))) == ["k00", "k02", "k01", "k03"]
    two = parse_orderby("/d DESC, /c")
    assert keys(select(rows, orderby=two)) == ["k02", "k00", "k01", "k03"]


def test_missing_values_sort_first_ascending_and_last_descending() -> None:
    rows = entries_of({"p": 2}, {}, {"p": None}, {"p": 1}, {"p": ""})
    assert keys(select(rows, orderby=parse_orderby("/p"))) == ["k01", "k02", "k04", "k03", "k00"]
    assert keys(select(rows, orderby=parse_orderby("/p DESC"))) == [
        "k00",
        "k03",
        "k01",
        "k02",
        "k04",
    ]


def test_mixed_types_sort_by_rank_and_never_raise() -> None:
    rows = entries_of(
        {"v": "zeta"}, {"v": 10}, {"v": "9.5"}, {"v": True}, {"v": "alpha"}, {"v": 2.5}, {}
    )
    # NULL, numbers (true = 1, "9.5" as a number), then the other strings
    assert keys(select(rows, orderby=parse_orderby("/v"))) == [
        "k06",
        "k03",
        "k05",
        "k02",
        "k01",
        "k04",
        "k00",
    ]


def test_text_hint_sorts_by_the_textual_value() -> None:
    rows = entries_of({"v": 10}, {"v": 9}, {"v": "10a"})
    assert keys(select(rows, orderby=parse_orderby("/v"))) == ["k01", "k00", "k02"]
    assert keys(select(rows, orderby=parse_orderby("/v TEXT"))) == ["k00", "k02", "k01"]


def test_an_array_sorts_by_its_first_value_and_nested_paths_work() -> None:
    rows = entries_of({"a": [5, 0]}, {"a": [1, 9]}, {"o": {"p": 0}}, {"o": {"p": -1}})
    assert keys(select(rows, orderby=parse_orderby("/a"))) == ["k02", "k03", "k01", "k00"]
    assert keys(select(rows, orderby=parse_orderby("/o/p"))) == ["k00", "k01", "k03", "k02"]


def test_an_unparsable_payload_sorts_with_the_missing_values() -> None:
    rows = [entry("a", {"n": 1}), SowEntry("b", 1, "", "", 0, b"not json"), entry("c", {"n": 0})]
    assert keys(select(rows, orderby=parse_orderby("/n"))) == ["b", "c", "a"]


def test_top_n_and_skip_n_paginate_in_order() -> None:
    rng = random.Random(1414)
    print("seed 1414")
    rows = entries_of(*({"n": rng.randint(0, 20)} for _ in range(50)))
    order = parse_orderby("/n DESC")
    everything = keys(select(rows, orderby=order))
    pages = [keys(select(rows, None, order, top_n=7, skip_n=skip)) for skip in range(0, 50, 7)]
    assert [k for page in pages for k in page] == everything
    assert all(len(page) == 7 for page in pages[:-1])
    assert keys(select(rows, None, order, top_n=None, skip_n=45)) == everything[45:]


def test_top_n_without_orderby_stops_reading_early() -> None:
    read: list[int] = []

    def source() -> Iterator[SowEntry]:
        for i in range(1000):
            read.append(i)
            yield entry(f"k{i:04d}", {"n": i})

    f = compile_filter("/n % 2 = 0")
    got = select(source(), lambda e: f.matches_json(e.payload), top_n=3, skip_n=2)
    assert keys(got) == ["k0004", "k0006", "k0008"]
    assert len(read) < 20


def test_top_n_zero_and_bad_counts() -> None:
    rows = entries_of({"n": 1})
    assert select(rows, top_n=0) == []
    assert select(rows, skip_n=5) == []
    with pytest.raises(ValueError, match="top_n"):
        select(rows, top_n=-1)
    with pytest.raises(ValueError, match="skip_n"):
        select(rows, skip_n=-1)


sortable = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.sampled_from(["", "a", "b", "3", "x1", "-2.5"]),
    st.booleans(),
)


@SETTINGS
@given(
    st.lists(st.fixed_dictionaries({}, optional={"a": sortable, "b": sortable}), max_size=25),
    st.sampled_from(["/a", "/a DESC", "/a, /b DESC", "/b TEXT, /a", "/b DESC, /a DESC"]),
    st.integers(0, 30),
    st.integers(0, 10),
)
def test_paged_results_are_slices_of_the_full_ordering(
    docs: list[dict[str, Any]], orderby: str, top_n: int, skip_n: int
) -> None:
    rows = entries_of(*docs)
    order = parse_orderby(orderby)
    full = select(rows, orderby=order)
    assert sorted(keys(full)) == keys(rows)  # a permutation: nothing lost or repeated
    assert select(rows, None, order, top_n, skip_n) == full[skip_n : skip_n + top_n]
    assert select(rows, None, order, None, skip_n) == full[skip_n:]


# ---------------------------------------------------------------- batches


def test_batches_split_and_keep_order() -> None:
    assert list(batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batches([], 3)) == []
    assert list(batches(range(4), 4)) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="batch_size"):
        list(batches(range(3), 0))
