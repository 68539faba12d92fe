"""Evaluation semantics of the content-filter language: expressions x documents -> bool.

Each table row is (filter text, expected result of ``matches``) against ``DOC`` unless the
table says otherwise. ``truth_of`` tells FALSE from NULL by also evaluating ``NOT (...)``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import orjson
import pytest

from amps_py.filters import EvalContext, Filter, FilterError, compile_filter

DOC: dict[str, object] = {
    "a": 5,
    "b": "xyz",
    "f": 2.5,
    "neg": -7,
    "zero": 0,
    "s_num": "12",
    "s_float": " 3.5 ",
    "s_word": "abc",
    "empty": "",
    "nul": None,
    "t": True,
    "fl": False,
    "nan_s": "NaN",
    "obj": {"x": 1, "y": {"z": "deep"}},
    "items": [{"qty": 1, "sku": "p-1"}, {"qty": 5, "sku": "p-2"}],
    "data": [1, 2, 3, "zebra", 5],
    "other": [14, 34, 23, 5],
    "none_arr": [],
    "blank_arr": ["", None],
    "one": [42],
    "m": [[1, 2], [3, 4]],
    "odd name": {"x y": 7},
    "name": "Kim O'Hara",
    "path": "/public/dropbox/x.txt",
    "55": "IBM",
    "@qty": 9,
    "u": "MixedCase",
    "dash-key": "d",
    "dotted.key": "e",
}


def truth_of(text: str, doc: object = DOC, context: EvalContext | None = None) -> bool | None:
    """The SQL truth value of a condition: True, False, or None for NULL."""
    if compile_filter(text).matches(doc, context):
        return True
    if compile_filter(f"NOT ({text})").matches(doc, context):
        return False
    return None


def check(text: str, expected: bool) -> None:
    assert compile_filter(text).matches(DOC) is expected, text


PATHS = [
    ("/a = 5", True),
    ("/obj/x = 1", True),
    ("/obj/y/z = 'deep'", True),
    ("/obj/y/z/w IS NULL", True),
    ("/obj IS NULL", True),  # objects have no scalar value
    ("/obj/y IS NULL", True),
    ("/missing IS NULL", True),
    ("/missing/deeper IS NULL", True),
    ("/a/b IS NULL", True),  # walking into a scalar finds nothing
    ("/items/qty = 5", True),
    ("/items/qty = 1", True),
    ("/items/qty = 3", False),
    ("/items/sku = 'p-2'", True),
    ("/items[1]/qty = 5", True),
    ("/items[1]/qty = 1", False),
    ("/items[7]/qty IS NULL", True),
    ("/data[0] = 1", True),
    ("/data[3] = 'zebra'", True),
    ("/data[1] != 1", True),
    ("/data[9] IS NULL", True),
    ("/other[1] LIKE '4'", True),
    ("/m[0][1] = 2", True),
    ("/m[1][0] = 3", True),
    ("/m = 4", True),  # nested arrays flatten
    ("/none_arr IS NULL", True),  # empty array is NULL
    ("/blank_arr IS NULL", True),  # nothing but empty string and null
    ("/one = 42", True),
    ("[/odd name/x y] = 7", True),
    ("[/odd name/x y][0] = 7", True),
    ("/55 = 'IBM'", True),
    ("/@qty = 9", True),
    ("/dash-key = 'd'", True),
    ("/dotted.key = 'e'", True),
    ("/empty IS NULL", True),
    ("/nul IS NULL", True),
    ("/a IS NOT NULL", True),
    ("/empty IS NOT NULL", False),
]


@pytest.mark.parametrize(("text", "expected"), PATHS)
def test_paths(text: str, expected: bool) -> None:
    check(text, expected)


def test_path_over_top_level_array() -> None:
    f = compile_filter("/qty > 3")
    assert f.matches([{"qty": 1}, {"qty": 5}])
    assert not f.matches([{"qty": 1}, {"qty": 2}])
    assert not f.matches("not an object")
    assert not f.matches(None)
    assert not f.matches(17)


def test_path_through_dict_subclass_and_odd_leaf_types() -> None:
    from collections import OrderedDict

    assert compile_filter("/a/b = 2").matches(OrderedDict(a=OrderedDict(b=2)))
    assert compile_filter("/a IS NULL").matches({"a": (1, 2)})  # tuples are not JSON
    assert compile_filter("/a IS NULL").matches({"a": b"bytes"})


LITERALS = [
    ("3.14 = 3.14", True),
    ("6.02E23 > 6e23", True),
    ("1e3 = 1000", True),
    (".5 = 0.5", True),
    ("5. = 5", True),
    ("18446744073709551615 > 9223372036854775807", True),  # unsigned 64-bit
    ("'abc' = \"abc\"", True),
    (r"'a\tb' = CONCAT('a', CHAR_VALUE(9), 'b')", True),
    (r"'\x41\102' = 'AB'", True),
    (r"'\q' = 'q'", True),  # any other \c is c
    ("'it\\'s' = \"it's\"", True),
    (r"r'C++' = 'C++'", True),
    (r"r'\d' = '\\d'", True),
    (r"R'a\nb' = 'a\\nb'", True),
    (
        r"'\a\b\f\n\r' = CONCAT(CHAR_VALUE(7), CHAR_VALUE(8), CHAR_VALUE(12), "
        r"CHAR_VALUE(10), CHAR_VALUE(13))",
        True,
    ),
    ("'' IS NULL", True),  # empty string is NULL
    ("NULL IS NULL", True),
    ("TRUE", True),
    ("FALSE", False),
    ("true AND True", True),
    ('/name = "Kim O\'Hara"', True),
]


@pytest.mark.parametrize(("text", "expected"), LITERALS)
def test_literals(text: str, expected: bool) -> None:
    check(text, expected)


ARITHMETIC = [
    ("1 + 2 = 3", True),
    ("/a + 1 = 6", True),
    ("/a - 10 = -5", True),
    ("/a * /f = 12.5", True),
    ("7 / 2 = 3", True),  # int / int is integer division
    ("-7 / 2 = -3", True),  # truncating toward zero
    ("7 / -2 = -3", True),
    ("7.0 / 2 = 3.5", True),
    ("7 % 3 = 1", True),
    ("-7 % 3 = -1", True),  # sign of the left operand
    ("7 % -3 = 1", True),
    ("-7.5 % 2 = -1.5", True),
    ("7 MOD 3 = 1", True),
    ("7 mod 3 = 1", True),
    ("1 + 2 * 3 = 7", True),
    ("(1 + 2) * 3 = 9", True),
    ("10 - 4 - 3 = 3", True),  # left associative
    ("100 / 10 / 5 = 2", True),
    ("2 * 3 % 4 = 2", True),
    ("-/a = -5", True),
    ("- -5 = 5", True),
    ("+/s_num = 12", True),
    ("/s_num + 1 = 13", True),  # numeric strings convert
    ("/s_float * 2 = 7", True),
    ("/s_word + 1 IS NAN", True),  # unconvertible strings give NaN
    ("/a / 0 IS NAN", True),
    ("/a % 0 IS NAN", True),
    ("/a + /missing IS NULL", True),
    ("/missing * 2 IS NULL", True),
    ("-/missing IS NULL", True),
    ("/data + 1 = 2", True),  # arithmetic uses the first element
    ("/t + 1 = 2", True),  # booleans are 1 and 0
    ("/a/2 IS NULL", True),  # a path, not a division: write a / 2
    ("/a / 2 = 2", True),
    ("10/2 = 5", True),
    ("99999999999999999999 * 1.5 > 0", True),
]


@pytest.mark.parametrize(("text", "expected"), ARITHMETIC)
def test_arithmetic(text: str, expected: bool) -> None:
    check(text, expected)


COMPARISONS = [
    ("/a = 5", True),
    ("/a == 5", True),
    ("/a != 5", False),
    ("/a <> 4", True),
    ("/a < 6", True),
    ("/a <= 5", True),
    ("/a > 5", False),
    ("/a >= 5", True),
    ("5 = /a", True),
    ("6 > /a", True),  # constant on the left
    ("/a = 5.0", True),
    ("/f > 2", True),
    ("/b = 'xyz'", True),
    ("/b = 'XYZ'", False),  # case-sensitive
    ("/b < 'y'", True),
    ("/b > 'xy'", True),
    ("'abc' < 'abd'", True),
    # strings convert to numbers when compared with numbers
    ("/s_num = 12", True),
    ("/s_num > 9", True),  # numerically, not as text ('12' < '9')
    ("/s_float = 3.5", True),
    ("/a = '5'", True),
    ("/a = ' 5 '", True),
    ("/s_num = '12.0'", False),  # two strings compare as text
    # an unconvertible string is greater than any number
    ("/s_word > 1000000", True),
    ("/s_word < 5", False),
    ("/s_word = 5", False),
    ("/s_word != 5", True),
    ("/b > -1e308", True),
    ("/t = TRUE", True),
    ("/fl = FALSE", True),
    ("/t = 1", True),
    ("/t != FALSE", True),
    ("/a = /a", True),
    ("/a < /f * 3", True),
    ("/s_num > /a", True),
    ("NAN_VALUE() = NAN_VALUE()", False),
    ("NAN_VALUE() != NAN_VALUE()", True),
    ("NAN_VALUE() < 1", False),
    ("/nan_s = 1", False),
]


@pytest.mark.parametrize(("text", "expected"), COMPARISONS)
def test_comparisons(text: str, expected: bool) -> None:
    check(text, expected)


NULL_COMPARISONS = [
    "/missing = NULL",
    "/missing != NULL",
    "/a = NULL",
    "/a != NULL",
    "NULL = NULL",
    "/missing = 1",
    "/missing != 1",
    "/missing < 1",
    "/missing > 1",
    "1 = /missing",
    "/missing = /missing",
    "/missing = /a",
    "/empty = ''",
    "/missing LIKE 'x'",
    "/missing IN (1, 2)",
    "/missing BETWEEN 1 AND 2",
    "/a BETWEEN /missing AND 10",
    "/missing BEGINS WITH ('x')",
    "/missing ENDS WITH ('x')",
    "/none_arr = 1",
    "/obj = 1",
]


@pytest.mark.parametrize("text", NULL_COMPARISONS)
def test_comparisons_with_null_are_null(text: str) -> None:
    assert truth_of(text) is None


def test_null_comparisons_in_not_forms_are_null_too() -> None:
    for text in ["/missing NOT LIKE 'x'", "/missing NOT IN (1)", "/missing NOT BETWEEN 1 AND 2"]:
        assert truth_of(text) is None, text
    assert truth_of("/missing NOT BEGINS WITH ('x')") is None
    assert truth_of("/a NOT IN (1, NULL)") is None  # SQL: NOT IN with a NULL is never TRUE
    assert truth_of("/a IN (1, NULL)") is None
    assert truth_of("/a IN (5, NULL)") is True


T, F, N = "(1 = 1)", "(1 = 2)", "(/missing = 1)"
VALUES = {T: True, F: False, N: None}


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        (T, T, True),
        (T, F, False),
        (T, N, None),
        (F, T, False),
        (F, F, False),
        (F, N, False),
        (N, T, None),
        (N, F, False),
        (N, N, None),
    ],
)
def test_and_truth_table(left: str, right: str, expected: bool | None) -> None:
    assert truth_of(f"{left} AND {right}") is expected
    assert truth_of(f"{left} AND {right} AND {T}") is expected  # the n-ary form


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        (T, T, True),
        (T, F, True),
        (T, N, True),
        (F, T, True),
        (F, F, False),
        (F, N, None),
        (N, T, True),
        (N, F, None),
        (N, N, None),
    ],
)
def test_or_truth_table(left: str, right: str, expected: bool | None) -> None:
    assert truth_of(f"{left} OR {right}") is expected
    assert truth_of(f"{left} OR {right} OR {F}") is expected  # the n-ary form


@pytest.mark.parametrize(("operand", "expected"), [(T, False), (F, True), (N, None)])
def test_not_truth_table(operand: str, expected: bool | None) -> None:
    assert truth_of(f"NOT {operand}") is expected


def test_truth_table_operands_are_what_they_claim() -> None:
    for text, value in VALUES.items():
        assert truth_of(text) is value


ARRAYS = [
    ("/data = 1", True),
    ("/data = 'zebra'", True),
    ("/data != 'zebra'", True),  # some element is not 'zebra'
    ("/data = 42", False),
    ("/data LIKE 'z'", True),
    ("/data NOT LIKE 'z'", False),  # NOT of "any element matches"
    ("/other > 30", True),
    ("/other > 50", False),
    ("/other < 6", True),
    ("/other BETWEEN 30 AND 40", True),
    ("/other BETWEEN 15 AND 20", False),
    ("/other NOT BETWEEN 15 AND 20", True),
    ("/other IN (1, 23)", True),
    ("/other NOT IN (1, 23)", False),
    ("/other NOT IN (1, 2)", True),
    ("/data IN ('zebra')", True),
    ("/items/sku BEGINS WITH ('p-')", True),
    ("/items/sku ENDS WITH ('-2')", True),
    ("/items/sku NOT ENDS WITH ('-2')", False),
    ("/data = /other", True),  # any pair: 5 = 5
    ("/data IS NOT NULL", True),
    ("/data IS NAN", False),
    ("UPPER(/data) = '1'", True),  # functions use the first element
    ("ARRAY_COUNT(/data) = 5", True),
    ("ARRAY_COUNT(/items) = 2", True),  # objects count as elements
    ("ARRAY_COUNT(/items/qty) = 2", True),
    ("ARRAY_COUNT(/a) = 1", True),
    ("ARRAY_COUNT(/missing) = 0", True),
    ("ARRAY_COUNT(/none_arr) = 0", True),
    ("ARRAY_COUNT(/m) = 4", True),
    ("ARRAY_COUNT(COALESCE(/missing, /data)) = 1", True),
]


@pytest.mark.parametrize(("text", "expected"), ARRAYS)
def test_arrays(text: str, expected: bool) -> None:
    check(text, expected)


OPERATORS = [
    ("/a BETWEEN 1 AND 5", True),  # inclusive
    ("/a BETWEEN 5 AND 9", True),
    ("/a BETWEEN 6 AND 9", False),
    ("/a NOT BETWEEN 6 AND 9", True),
    ("/b BETWEEN 'x' AND 'y'", True),
    ("/s_num BETWEEN 10 AND 20", True),
    ("/a BETWEEN 1 AND 5 AND /b = 'xyz'", True),
    ("/a IN (1, 5, 9)", True),
    ("/a IN (1, 2)", False),
    ("/a NOT IN (1, 2)", True),
    ("/a NOT IN (5)", False),
    ("/a IN ('5')", True),  # '=' conversion rules apply
    ("/s_num IN (12)", True),
    ("/s_num IN ('12.0')", False),
    ("/s_num IN ('12', 'x')", True),
    ("/b IN ('abc', 'xyz')", True),
    ("/a IN (/zero, /a)", True),  # non-literal items
    ("/a IN (/zero, 2 + 2)", False),
    ("/t IN (1)", True),
    ("/f IN (2.5)", True),
    ("/b LIKE 'y'", True),  # unanchored
    ("/b LIKE '^y'", False),
    ("/b LIKE '^x.z$'", True),
    ("/b LIKE 'XYZ'", False),  # case-sensitive
    ("/b LIKE '(?i)XYZ'", True),
    ("/b NOT LIKE 'q'", True),
    ("/a LIKE '^5$'", True),  # numbers are matched as text
    ("/f LIKE '2\\.5'", True),
    (r"/s_num LIKE r'^\d+$'", True),
    ("/s_num LIKE '^\\d+$'", False),  # '\d' is just 'd' in a normal string
    ("/s_num LIKE '^\\\\d+$'", True),
    ("/t LIKE 'true'", True),
    ("/name LIKE '(.)\\1'", False),
    ("/b LIKE '(.)\\1'", False),
    ("'abba' LIKE r'(.)\\1'", True),
    ("/path BEGINS WITH ('/public')", True),
    ("/path BEGINS WITH ('/private', '/public')", True),
    ("/path NOT BEGINS WITH ('/public/dropbox')", False),
    ("/path ENDS WITH ('gif', 'txt')", True),
    ("/path ENDS WITH ('TXT')", False),
    ("/path NOT ENDS WITH ('gif')", True),
    ("/a ENDS WITH (5)", True),
    ("/f BEGINS WITH ('2.')", True),
    ("/a IS NULL", False),
    ("/a IS NOT NULL", True),
    ("/missing IS NOT NULL", False),
    ("/nan_s IS NAN", True),
    ("NAN_VALUE() IS NAN", True),
    ("/a / 0 IS NOT NAN", False),
    ("/a IS NAN", False),
    ("/a IS NOT NAN", True),
    ("/missing IS NAN", False),
    ("/s_word IS NAN", False),
]


@pytest.mark.parametrize(("text", "expected"), OPERATORS)
def test_operators(text: str, expected: bool) -> None:
    check(text, expected)


FUNCTIONS = [
    ("IF(/a > 1, 'big', 'small') = 'big'", True),
    ("IF(/a > 9, 'big', 'small') = 'small'", True),
    ("IF(/missing > 1, 'big', 'small') = 'small'", True),  # NULL condition takes else
    ("IF(/a, 1, 2) = 1", True),
    ("COALESCE(/missing, /empty, /a) = 5", True),
    ("COALESCE(/missing, /nul) IS NULL", True),
    ("COALESCE(/data) = 1", True),
    ("UPPER(/b) = 'XYZ'", True),
    ("LOWER(/u) = 'mixedcase'", True),
    ("upper(/b) = 'XYZ'", True),  # function names are case-insensitive
    ("UPPER(/missing) IS NULL", True),
    ("UPPER(5) = '5'", True),
    ("INSTR(/b, 'yz') = 2", True),
    ("INSTR(/b, 'q') = 0", True),
    ("INSTR(/b, 'Y') = 0", True),
    ("INSTR_I(/b, 'Y') = 2", True),
    ("INSTR(/missing, 'x') IS NULL", True),
    ("STREQUAL_I(/u, 'MIXEDCASE')", True),
    ("STREQUAL_I(/u, 'MIXEDCASE') = 1", True),
    ("STREQUAL_I(/u, 'other')", False),
    ("CONCAT(/b, '-', /a) = 'xyz-5'", True),
    ("CONCAT(/missing, /b) = 'xyz'", True),
    ("CONCAT(/missing) IS NULL", True),
    ("SUBSTR('fandango', 5) = 'ango'", True),
    ("SUBSTR('fandango', 2, 3) = 'and'", True),
    ("SUBSTR('fandango', -3) = 'ngo'", True),
    ("SUBSTR('fandango', 0, 1) = 'f'", True),
    ("SUBSTR('fandango', 20) IS NULL", True),
    ("SUBSTR('fandango', 2, 0) IS NULL", True),
    ("SUBSTR('fandango', /missing) IS NULL", True),
    ("REPLACE(/b, 'y', 'Y') = 'xYz'", True),
    ("REPLACE(/b, 'y', '') = 'xz'", True),
    ("REPLACE(/b, /missing, 'Q') = 'xyz'", True),
    ("REPLACE(/b, 'xyz', NULL) IS NULL", True),
    ("REGEXP_MATCH(/b, '^x')", True),
    ("REGEXP_MATCH(/b, '^y')", False),
    ("REGEXP_MATCH(/b, CONCAT('^', /b, '$'))", True),  # pattern known only at run time
    ("REGEXP_MATCH(/b, CONCAT('(', /b))", False),  # a bad run-time pattern is NULL
    ("REGEXP_MATCH(/b, NULL) IS NULL", True),
    ("ABS(/neg) = 7", True),
    ("ABS(-2.5) = 2.5", True),
    ("ABS(/missing) IS NULL", True),
    ("ABS(/s_word) IS NAN", True),
    ("CRC32('abc') = 891568578", True),
    ("CRC32(/missing) IS NULL", True),
    ("TRUE_VALUE()", True),
    ("FALSE_VALUE()", False),
    ("TRUE_VALUE() = TRUE", True),
    ("NAN_VALUE() IS NAN", True),
    ("CHAR_VALUE(65) = 'A'", True),
    ("CHAR_VALUE(-1) IS NULL", True),
    ("CHAR_VALUE(1114112) IS NULL", True),
    ("UPPER(SUBSTR('fandango', 5)) = 'ANGO'", True),
]


@pytest.mark.parametrize(("text", "expected"), FUNCTIONS)
def test_functions(text: str, expected: bool) -> None:
    check(text, expected)


def test_context_functions() -> None:
    ctx = EvalContext(client_name="pub-1", instance_name="amps-a", message_size=321, now=1000.5)
    assert compile_filter("CLIENT_NAME() = 'pub-1'").matches({}, ctx)
    assert compile_filter("AMPS_INSTANCE_NAME() = 'amps-a'").matches({}, ctx)
    assert compile_filter("MESSAGE_SIZE() = 321").matches({}, ctx)
    assert compile_filter("UNIX_TIMESTAMP() = 1000.5").matches({}, ctx)
    assert compile_filter("UNIX_TIMESTAMP() > 1600000000").matches({})  # real clock
    assert compile_filter("CLIENT_NAME() IS NULL").matches({})  # default context
    assert compile_filter("unix_timestamp() - 1000 < 1").matches({}, ctx)


def test_message_size_defaults_to_payload_length_in_matches_json() -> None:
    payload = b'{"a": 1}'
    f = compile_filter(f"MESSAGE_SIZE() = {len(payload)}")
    assert f.matches_json(payload)
    assert not f.matches_json(payload, EvalContext(message_size=3))
    assert compile_filter("MESSAGE_SIZE() = 3").matches_json(payload, EvalContext(message_size=3))


PRECEDENCE = [
    ("TRUE OR TRUE AND FALSE", True),  # AND binds tighter than OR
    ("(TRUE OR TRUE) AND FALSE", False),
    ("NOT FALSE AND FALSE", False),  # NOT binds tighter than AND
    ("NOT (FALSE AND FALSE)", True),
    ("NOT /a = 4", True),  # NOT applies to the whole comparison
    ("NOT NOT /a = 5", True),
    ("/a = 5 OR /b = 'q' AND /a = 0", True),
    ("(/a = 5 OR /b = 'q') AND /a = 0", False),
    ("/a + 1 * 2 = 7", True),
    ("/a - 2 - 1 = 2", True),
    ("/a = 5 AND NOT /b = 'q'", True),
    ("/a BETWEEN 1 AND 9 OR FALSE", True),
    ("NOT /a IN (5)", False),
    ("((((/a = 5))))", True),
    ("/a = 2 + 3", True),
    ("2 * /a > 9 AND 2 * /a < 11", True),
]


@pytest.mark.parametrize(("text", "expected"), PRECEDENCE)
def test_precedence(text: str, expected: bool) -> None:
    check(text, expected)


@pytest.mark.parametrize(
    "text",
    [
        "/a = 5 and /b like 'x'",
        "/a = 5 AnD /b LiKe 'x'",
        "/a not in (1) and /a between 1 and 9",
        "/b begins with ('x') or /b ends with ('q')",
        "/missing is null and /a is not null and not /a is nan",
        "null is null and true and not false",
        "7 mod 2 = 1",
    ],
)
def test_keywords_are_case_insensitive(text: str) -> None:
    check(text, True)


def test_top_level_values_are_conditions() -> None:
    assert compile_filter("/a").matches(DOC)  # non-zero number
    assert not compile_filter("/zero").matches(DOC)
    assert compile_filter("/t").matches(DOC)
    assert not compile_filter("/fl").matches(DOC)
    assert not compile_filter("/b").matches(DOC)  # a word is NULL as a condition
    assert compile_filter("/flag").matches({"flag": "TRUE"})
    assert not compile_filter("/missing").matches(DOC)
    assert compile_filter("/a AND /t").matches(DOC)
    assert not compile_filter("NAN_VALUE()").matches(DOC)


def test_whitespace_and_newlines() -> None:
    check("  /a\n=\t5\r\nAND\n/b = 'xyz'  ", True)


def test_matches_json() -> None:
    f = compile_filter("/a = 5 AND /items/qty = 5")
    assert f.matches_json(orjson.dumps(DOC))
    assert not f.matches_json(b'{"a": 5}')
    assert not f.matches_json(b"not json at all")
    assert not f.matches_json(b"")
    # An invalid payload makes every path NULL: IS NULL holds.
    assert compile_filter("/a IS NULL").matches_json(b"{broken")
    assert compile_filter("/a IS NULL").matches_json(b"\xff\xfe")
    assert not compile_filter("NOT (/a = 1)").matches_json(b"{broken")  # NOT NULL is NULL


def test_filter_object() -> None:
    f = compile_filter("/a = 5")
    assert isinstance(f, Filter)
    assert f.source == "/a = 5"
    assert repr(f) == "Filter('/a = 5')"
    assert f.matches(DOC, None)


def test_constant_filters_fold() -> None:
    assert compile_filter("1 = 1").matches(None)
    assert not compile_filter("1 = 2").matches(None)
    assert compile_filter("UPPER('a') = 'A' AND -(2 * 3) = -6").matches(None)


def test_error_attributes_and_rendering() -> None:
    with pytest.raises(FilterError) as info:
        compile_filter("/a = 'abc")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.reason == "bad filter"
    assert err.position == 5
    assert err.column == 6
    assert str(err).splitlines() == [
        "bad filter: unterminated string at column 6",
        "  /a = 'abc",
        "       ^",
        "  hint: close the string with a matching ' quote",
    ]


def test_error_on_second_line_shows_that_line() -> None:
    with pytest.raises(FilterError) as info:
        compile_filter("/a = 1\nAND /b = 'x")
    err = info.value
    assert err.line == 2
    assert err.column == 10
    assert "at line 2, column 10" in str(err)
    assert "  AND /b = 'x\n           ^" in str(err)


def test_error_pickles() -> None:
    with pytest.raises(FilterError) as info:
        compile_filter("/a && /b")
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value)
    assert copy.position == info.value.position


def test_package_imports_no_trio_and_no_socket() -> None:
    code = (
        "import sys, amps_py.filters as f; "
        "f.compile_filter('/a = 1').matches_json(b'{}'); "
        "bad = sorted(m for m in ('trio', 'socket', 'ssl', 'asyncio') if m in sys.modules); "
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_a_value_expression_gives_its_value_or_none() -> None:
    from amps_py.filters import compile_expression

    assert compile_expression("/p * 2").value({"p": 3}) == 6
    assert compile_expression("/p").value({}) is None
    assert compile_expression("IF(/vip = 1, 10, 1)").value({"vip": 1}) == 10
    with pytest.raises(FilterError):
        compile_expression("/p +")
