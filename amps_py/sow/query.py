"""SOW query results: ``OrderBy``, ``top_n``, ``skip_n`` and result batches.

``OrderBy`` (AMPS command header) is a comma-separated list of terms, each a field
identifier optionally followed by ``ASC`` or ``DESC`` (default ``ASC``) and optionally
``TEXT``, all case-insensitive::

    /orderDate DESC, /customerName
    /orderId TEXT, /updated DESC

Ordering (AMPS's "mixed-type sort"; its exact rules are not published, these are ours):

* the value of a term is the field's value as the filter language sees it; a field
  that occurs several times (an array) sorts by its first value;
* a missing field (NULL: absent, ``null``, ``""``, an object) sorts **first** in
  ascending order, like SQL's ``NULLS FIRST``; a descending term is the exact reverse
  of the ascending one, so NULLs come last there;
* then numbers (booleans count as 1 and 0; a string that spells a number sorts as that
  number, as in filter comparisons), then NaN, then the other strings (by code point);
  values of different kinds compare by that rank, so sorting never raises;
* with ``TEXT`` every non-NULL value sorts by its text (``10`` before ``9``);
* records that tie on every term keep the store's key order.

Without ``OrderBy`` results come in the store's key order.

Pure: no I/O, no trio.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson

from amps_py.filters.context import DEFAULT_CONTEXT
from amps_py.filters.errors import FilterError
from amps_py.filters.lexer import PathStep, Tok, tokenize
from amps_py.filters.paths import make_getter
from amps_py.filters.values import Value, to_number
from amps_py.protocol.header import split_outside_brackets

from .entry import SowEntry

T = TypeVar("T")

_RANK_NULL: Final = 0
_RANK_NUMBER: Final = 1
_RANK_NAN: Final = 2
_RANK_STRING: Final = 3


class OrderByError(ValueError):
    """Bad ``OrderBy`` text; the message says which term and how to write it."""


@dataclass(frozen=True, slots=True)
class OrderTerm:
    """One ``OrderBy`` term.

    Attributes:
        path: the field identifier as written (``/orderDate``).
        steps: the parsed path.
        descending: ``DESC`` was given.
        text: ``TEXT`` was given: sort by the textual representation.
    """

    path: str
    steps: tuple[PathStep, ...]
    descending: bool = False
    text: bool = False


def _bad(term: str, problem: str) -> OrderByError:
    return OrderByError(
        f"bad OrderBy term {term!r}: {problem}; write terms like '/field', '/field DESC' "
        "or '/field TEXT ASC', separated by commas"
    )


def _parse_term(term: str) -> OrderTerm:
    try:
        tokens = tokenize(term)
    except FilterError as exc:
        raise _bad(term, exc.problem) from None
    if not tokens or tokens[0].kind is not Tok.PATH:
        raise _bad(term, "a term starts with a field identifier such as /price")
    steps = tokens[0].value
    assert isinstance(steps, tuple)
    descending = text = False
    direction_seen = False
    for token in tokens[1:]:
        if token.kind is Tok.EOF:
            break
        word = token.value if token.kind is Tok.WORD else None
        if word in ("ASC", "DESC") and not direction_seen:
            direction_seen = True
            descending = word == "DESC"
        elif word == "TEXT" and not text:
            text = True
        else:
            raise _bad(term, f"unexpected {token.text!r} (only ASC, DESC and TEXT may follow)")
    return OrderTerm(tokens[0].text, steps, descending, text)


def parse_orderby(text: str) -> tuple[OrderTerm, ...]:
    """Parse an ``OrderBy`` header.

    Returns:
        The terms in order; empty for an empty or blank header.

    Raises:
        OrderByError: a term is empty, does not start with a field identifier, or has
            anything but ``ASC``/``DESC``/``TEXT`` after it (each at most once).
    """
    if not text.strip():
        return ()
    terms: list[OrderTerm] = []
    for part in split_outside_brackets(text):
        if not part.strip():
            raise _bad(text, "empty term (two commas in a row, or a trailing comma)")
        terms.append(_parse_term(part.strip()))
    return tuple(terms)


# ---------------------------------------------------------------- sort keys


def _mixed_key(value: Value) -> tuple[int, Any]:
    if type(value) is list:
        value = value[0]
    if value is None:
        return (_RANK_NULL, 0)
    if type(value) is str:
        number = to_number(value)
        if number is None:
            return (_RANK_STRING, value)
        value = number
    if type(value) is float and math.isnan(value):
        return (_RANK_NAN, 0)
    return (_RANK_NUMBER, value)  # int, float, bool


def _text_key(value: Value) -> tuple[int, Any]:
    if type(value) is list:
        value = value[0]
    if value is None:
        return (_RANK_NULL, "")
    if type(value) is bool:
        return (_RANK_STRING, "true" if value else "false")
    if type(value) is float:
        return (_RANK_STRING, repr(value))
    return (_RANK_STRING, str(value))


class _Reversed:
    """Wraps a sort key so that it sorts in the opposite order."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, Any]) -> None:
        self.key = key

    def __lt__(self, other: _Reversed) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.key == other.key

    __hash__ = None  # type: ignore[assignment]


def sort_key_function(orderby: tuple[OrderTerm, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function from a parsed document to its sort key under ``orderby``."""
    parts = []
    for term in orderby:
        getter = make_getter(term.steps)
        parts.append((getter, _text_key if term.text else _mixed_key, term.descending))

    def key(doc: Any) -> tuple[Any, ...]:
        out: list[Any] = []
        for getter, convert, descending in parts:
            value = convert(getter(doc, DEFAULT_CONTEXT))
            out.append(_Reversed(value) if descending else value)
        return tuple(out)

    return key


# ---------------------------------------------------------------- select


def _check_count(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be 0 or more, not {value}")


def select(
    entries: Iterable[SowEntry],
    matches: Callable[[SowEntry], bool] | None = None,
    orderby: tuple[OrderTerm, ...] = (),
    top_n: int | None = None,
    skip_n: int = 0,
    *,
    decode: Callable[[bytes], Any] = orjson.loads,
) -> list[SowEntry]:
    """The records a ``sow`` query returns, in order.

    Args:
        entries: the candidate records, in the store's key order (e.g.
            ``SowStore.entries()`` or a snapshot).
        matches: the query's filter: ``matches(entry)`` is True for a record to return;
            None returns every record.
        orderby: parsed ``OrderBy`` terms; empty keeps the store's order.
        top_n: return at most this many records (None: all).
        skip_n: skip this many matching records first (after ordering).
        decode: parses a payload for ``orderby``; a payload it cannot parse sorts as
            if every field were missing (NULL).

    Without ``orderby``, reading stops as soon as ``skip_n + top_n`` records matched.
    With it, the best ``skip_n + top_n`` are kept in a heap (all matches when no
    ``top_n``), so memory is bounded by the page, not the topic.

    Raises:
        ValueError: ``top_n`` or ``skip_n`` is negative.
    """
    _check_count("top_n", top_n)
    _check_count("skip_n", skip_n)
    if top_n == 0:
        return []
    matched: Iterable[SowEntry] = entries if matches is None else filter(matches, entries)
    if not orderby:
        stop = None if top_n is None else skip_n + top_n
        return list(itertools.islice(matched, skip_n, stop))
    key_of = sort_key_function(orderby)

    def entry_key(entry: SowEntry) -> tuple[Any, ...]:
        try:
            doc = decode(entry.payload)
        except Exception:  # an unparsable record sorts with NULLs, it never fails a query
            doc = None
        return key_of(doc)

    if top_n is None:
        ordered = sorted(matched, key=entry_key)
        return ordered[skip_n:]
    return heapq.nsmallest(skip_n + top_n, matched, key=entry_key)[skip_n:]


def batches(items: Iterable[T], batch_size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``batch_size`` (the last one may be shorter; none empty).

    Raises:
        ValueError: ``batch_size`` is below 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be 1 or more, not {batch_size}")
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, batch_size)):
        yield batch
