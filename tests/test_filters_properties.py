"""Property tests for the filter language (hypothesis, derandomized: the same examples on
every run, so a failure reproduces without a seed).

Invariants:

1. Any text either compiles to a Filter or raises FilterError, never anything else.
2. Evaluating a compiled filter never raises, whatever the document holds.
3. Well-formed generated filters always compile.
4. ``matches(doc)`` agrees with ``matches_json(orjson.dumps(doc))``.
5. A filter and its negation are never both TRUE.
"""

from __future__ import annotations

import math

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amps_py.filters import EvalContext, Filter, FilterError, compile_filter

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow],
)
# Generated-expression tests build bigger examples; fewer of them keep the suite quick.
HEAVY_SETTINGS = settings(SETTINGS, max_examples=250)
CONTEXT = EvalContext(client_name="c1", instance_name="i1", message_size=99, now=1_700_000_000.0)

KEYS = ["a", "b", "l", "x", "odd key", "55", "@q", ""]

# -- documents ----------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8)
    | st.sampled_from(["", "12", " 3.5 ", "NaN", "abc", "true", "-0", "1e400"])
)
json_docs = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=5)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.sampled_from(KEYS), json_docs, max_size=6)

# Documents no JSON parser would produce: NaN, infinities, huge ints, surrogates, tuples.
wild_scalars = (
    json_scalars
    | st.floats()
    | st.integers()
    | st.text()
    | st.binary(max_size=4)
    | st.tuples(st.integers())
    | st.just(object())
)
wild_docs = st.recursive(
    wild_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=5)
    ),
    max_leaves=25,
)

# -- filter text --------------------------------------------------------------------------

TOKENS = [
    "/a", "/b", "/a/b", "/l", "/l[0]", "/l/x", "/l[1]/x", "[/odd key]", "/55", "/@q",
    "1", "0", "-1", "2.5", "6.02E23", "'x'", "'12'", '"a b"', "r'\\d+'", "'\\x41'", "''",
    "NULL", "TRUE", "FALSE", "NAN",
    "AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "BEGINS", "ENDS", "WITH", "IS", "MOD",
    "(", ")", ",", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%",
    "UPPER", "IF", "COALESCE", "SUBSTR", "ARRAY_COUNT", "REGEXP_MATCH", "CONCAT", "ABS",
    "INSTR", "CHAR_VALUE", "NAN_VALUE", "UNIX_TIMESTAMP", "MESSAGE_SIZE", "CLIENT_NAME",
    "'('", "'['", "'\\'", "'", '"', "&&", "||", "!", "[", "]", "@", "\\", "r", "#", "\n",
]  # fmt: skip

token_soup = st.lists(st.sampled_from(TOKENS), max_size=14)
spaced_soup = token_soup.map(" ".join)
glued_soup = token_soup.map("".join)
any_text = st.text(max_size=40) | spaced_soup | glued_soup


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


PATHS = ["/a", "/b", "/a/b", "/l", "/l[0]", "/l/x", "/x", "[/odd key]", "/55", "/@q"]
PATTERNS = ["'a'", "'^1'", "'(?i)X'", "r'\\d'", "'.'", "'b$'", "'^$'"]

leaf_exprs = (
    st.sampled_from(PATHS)
    | st.integers(min_value=-(2**63), max_value=2**64 - 1).map(str)
    | st.floats(allow_nan=False, allow_infinity=False).map(repr)
    | st.text(alphabet="abxyzXYZ 0123.-_%", max_size=5).map(_quote)
    | st.sampled_from(["NULL", "TRUE", "FALSE", "NAN_VALUE()", "CLIENT_NAME()", "MESSAGE_SIZE()"])
)


def _compound(child: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary_ops = ["+", "-", "*", "/", "%", "MOD", "=", "!=", "<", "<=", ">", ">=", "AND", "OR"]
    two = st.tuples(child, child)
    three = st.tuples(child, child, child)
    return st.one_of(
        st.tuples(child, st.sampled_from(binary_ops), child).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        child.map(lambda a: f"(NOT {a})"),
        child.map(lambda a: f"(-{a})"),
        three.map(lambda t: f"({t[0]} BETWEEN {t[1]} AND {t[2]})"),
        three.map(lambda t: f"({t[0]} NOT IN ({t[1]}, {t[2]}))"),
        two.map(lambda t: f"({t[0]} IN ({t[1]}, 1, 'x'))"),
        st.tuples(child, st.sampled_from(PATTERNS)).map(lambda t: f"({t[0]} LIKE {t[1]})"),
        child.map(lambda a: f"({a} BEGINS WITH ('a', '1'))"),
        child.map(lambda a: f"({a} NOT ENDS WITH ('z'))"),
        child.map(lambda a: f"({a} IS NULL)"),
        child.map(lambda a: f"({a} IS NOT NAN)"),
        child.map(lambda a: f"UPPER({a})"),
        child.map(lambda a: f"ABS({a})"),
        child.map(lambda a: f"CRC32({a})"),
        child.map(lambda a: f"CHAR_VALUE({a})"),
        child.map(lambda a: f"ARRAY_COUNT({a})"),
        two.map(lambda t: f"INSTR_I({t[0]}, {t[1]})"),
        two.map(lambda t: f"CONCAT({t[0]}, {t[1]})"),
        two.map(lambda t: f"COALESCE({t[0]}, {t[1]})"),
        two.map(lambda t: f"REGEXP_MATCH({t[0]}, {t[1]})"),
        three.map(lambda t: f"SUBSTR({t[0]}, {t[1]}, {t[2]})"),
        three.map(lambda t: f"REPLACE({t[0]}, {t[1]}, {t[2]})"),
        three.map(lambda t: f"IF({t[0]}, {t[1]}, {t[2]})"),
    )


well_formed = st.recursive(leaf_exprs, _compound, max_leaves=10)


def _evaluate_everything(f: Filter, doc: object) -> None:
    f.matches(doc)
    f.matches(doc, CONTEXT)


# -- properties ---------------------------------------------------------------------------


@SETTINGS
@given(text=any_text)
def test_any_text_compiles_or_raises_filter_error(text: str) -> None:
    try:
        f = compile_filter(text)
    except FilterError as err:
        assert 0 <= err.position <= len(text)
        assert str(err)
        return
    assert isinstance(f, Filter)
    assert f.source == text
    _evaluate_everything(f, {"a": 1, "b": "x", "l": [1, {"x": 2}], "odd key": "v"})


@SETTINGS
@given(text=spaced_soup, doc=wild_docs)
def test_compiled_soup_never_raises_on_any_document(text: str, doc: object) -> None:
    try:
        f = compile_filter(text)
    except FilterError:
        return
    _evaluate_everything(f, doc)


@HEAVY_SETTINGS
@given(text=well_formed)
def test_well_formed_filters_compile(text: str) -> None:
    assert isinstance(compile_filter(text), Filter)


@HEAVY_SETTINGS
@given(text=well_formed, doc=wild_docs)
def test_evaluation_never_raises(text: str, doc: object) -> None:
    _evaluate_everything(compile_filter(text), doc)


@HEAVY_SETTINGS
@given(text=well_formed, doc=json_objects)
def test_matches_agrees_with_matches_json(text: str, doc: dict[str, object]) -> None:
    f = compile_filter(text)
    payload = orjson.dumps(doc)
    assert f.matches(doc, CONTEXT) == f.matches_json(payload, CONTEXT)


@HEAVY_SETTINGS
@given(text=well_formed, doc=json_objects)
def test_a_filter_and_its_negation_are_never_both_true(text: str, doc: object) -> None:
    positive = compile_filter(text).matches(doc, CONTEXT)
    negative = compile_filter(f"NOT ({text})").matches(doc, CONTEXT)
    assert not (positive and negative)


@SETTINGS
@given(payload=st.binary(max_size=64))
def test_matches_json_never_raises_on_any_bytes(payload: bytes) -> None:
    for text in ["/a = 1", "/a IS NULL", "MESSAGE_SIZE() >= 0", "/l[0] LIKE 'x'"]:
        compile_filter(text).matches_json(payload)


@SETTINGS
@given(x=st.integers(-(10**6), 10**6), y=st.integers(-(10**6), 10**6).filter(bool))
def test_integer_division_and_modulo_match_c(x: int, y: int) -> None:
    quotient = int(x / y)  # exact for these magnitudes; truncates toward zero
    remainder = int(math.fmod(x, y))
    assert compile_filter(f"{x} / {y} = {quotient}").matches(None)
    assert compile_filter(f"{x} % {y} = {remainder}").matches(None)
    assert compile_filter(f"({x} / {y}) * {y} + {x} % {y} = {x}").matches(None)
