"""Bad filters: each row is (filter text, fragment of the problem, 0-based position).

Every error must also carry a hint and render the text with a caret under ``position``.
"""

from __future__ import annotations

import pytest

from amps_py.filters import FilterError, compile_filter

BAD_FILTERS = [
    # empty
    ("", "the filter is empty", 0),
    ("  \n ", "the filter is empty", 0),
    # strings and escapes
    ("/a = 'abc", "unterminated string", 5),
    ('/a = "abc', "unterminated string", 5),
    ("/a = r'abc", "unterminated string", 5),
    ("/a = 'abc\\", "ends with a backslash", 9),
    ("/a = '\\xZZ'", "\\x escape without hex digits", 6),
    # stray characters and foreign operators
    ("/a && /b", "unexpected '&&'", 3),
    ("/a || /b", "unexpected '||'", 3),
    ("/a & /b", "unexpected '&'", 3),
    ("!(/a = 1)", "unexpected '!'", 0),
    ("/a = 1 ^ 2", "unexpected character '^'", 7),
    ("/a = #", "unexpected character '#'", 5),
    ("/a = 1 AND /b = 'x' && /c = 2", "unexpected '&&'", 20),
    # paths
    ("/", "expected a field name after '/'", 1),
    ("/a = /", "expected a field name after '/'", 6),
    ("/a/ = 1", "cannot end with '/'", 2),
    ("/a//b = 1", "'//' is not supported", 2),
    ("[/x y]/b = 1", "cannot end with '/'", 6),
    ("/a[x] = 1", "bad array subscript", 2),
    ("/a[-1] = 1", "bad array subscript", 2),
    ("/a[1 = 1", "bad array subscript", 2),
    ("/a[1234567890123456789] = 1", "bad array subscript", 2),
    ("/a = 1 AND [0] = 1", "bracketed field name must start with '/'", 12),
    ("[odd] = 1", "bracketed field name must start with '/'", 1),
    ("[/odd = 1", "unterminated bracketed field name", 0),
    ("[/a//b] = 1", "empty field name inside brackets", 4),
    ("/a = 1 /b = 2", "unknown word 'b' after '/'", 8),
    ("/a [0] = 1", "unexpected '['", 3),
    # missing values and operators
    ("/a =", "ends where a value was expected", 4),
    ("/a = = 1", "expected a value, found '='", 5),
    ("= 1", "expected a value, found '='", 0),
    ("/a 1", "unexpected '1' after a complete expression", 3),
    ("/a = 1,", "unexpected ',' after a complete expression", 6),
    ("/a = 1 /b", "unknown word 'b' after '/'", 8),
    ("foo = 1", "unknown word 'foo'", 0),
    ("/a = foo", "unknown word 'foo'", 5),
    ("/a = 1 foo", "unexpected word 'foo' after a complete expression", 7),
    ("AND /a = 1", "expected a value, found keyword AND", 0),
    ("/a = 1 AND", "ends where a value was expected", 10),
    ("/a = 1 OR OR /b = 2", "expected a value, found keyword OR", 10),
    ("NOT", "ends where a value was expected", 3),
    ("/a = NOT 1", "expected a value, found keyword NOT", 5),
    ("IN (1)", "expected a value, found keyword IN", 0),
    ("/a = 1 /", "ends where a value was expected", 8),
    # parentheses
    ("(/a = 1", "expected ')' to close the '(' at column 1", 7),
    ("((/a = 1)", "expected ')' to close the '(' at column 1", 9),
    ("/a = 1)", "unbalanced ')'", 6),
    (")", "expected a value, found ')'", 0),
    ("(", "ends where a value was expected", 1),
    ("()", "expected a value, found ')'", 1),
    # functions
    ("UPPR(/a) = 'A'", "unknown function UPPR()", 0),
    ("/a = 1 AND frobnicate(/a)", "unknown function FROBNICATE()", 11),
    ("SUBSTR(/a)", "SUBSTR() takes 2 or 3 arguments, but was given 1", 0),
    ("UPPER(/a, /b)", "UPPER() takes 1 argument, but was given 2", 0),
    ("TRUE_VALUE(1)", "TRUE_VALUE() takes no arguments, but was given 1", 0),
    ("IF(/a, 1)", "IF() takes 3 arguments, but was given 2", 0),
    ("COALESCE()", "COALESCE() takes at least 1 argument, but was given 0", 0),
    ("/x = REPLACE(/a, 'x')", "REPLACE() takes 3 arguments, but was given 2", 5),
    ("UPPER(/a", "expected ')' to close the '(' at column 6 of UPPER(", 8),
    ("UPPER(/a,)", "expected a value, found ')'", 9),
    ("CONCAT(/a /b)", "unknown word 'b' after '/'", 11),
    # regular expressions
    ("/a LIKE '('", "bad regular expression in LIKE: missing ), unterminated subpattern", 9),
    ("/a LIKE 'ab[c'", "bad regular expression in LIKE: unterminated character set", 11),
    ("/a LIKE r'(?<'", "bad regular expression in LIKE", 13),
    ("/a LIKE 'x(?i)'", "bad regular expression in LIKE: global flags not at the start", 10),
    ("REGEXP_MATCH(/a, '*x')", "bad regular expression in REGEXP_MATCH: nothing to repeat", 18),
    ("/a LIKE 5", "LIKE needs a quoted pattern, found '5'", 8),
    ("/a LIKE /b", "LIKE needs a quoted pattern, found '/b'", 8),
    # BETWEEN, IN, BEGINS/ENDS WITH, IS
    ("/a BETWEEN 1", "expected AND in BETWEEN, found the end of the filter", 12),
    ("/a BETWEEN 1 OR 2", "expected AND in BETWEEN, found keyword OR", 13),
    ("/a IN 1, 2", "IN needs a list in parentheses, found '1'", 6),
    ("/a IN ()", "empty list after IN", 7),
    ("/a IN (1 2)", "expected ')' to close the '(' at column 7 after IN, found '2'", 9),
    ("/a IN (1,", "ends where a value was expected", 9),
    ("/a BEGINS ('x')", "expected WITH after BEGINS", 10),
    ("/a BEGINS WITH 'x'", "BEGINS WITH needs a list in parentheses", 15),
    ("/a ENDS WITH (/b)", "ENDS WITH needs literal strings in its list", 14),
    ("/a BEGINS WITH (NULL)", "BEGINS WITH needs literal strings in its list", 16),
    ("/a IS 5", "expected NULL or NAN after IS, found '5'", 6),
    ("/a IS NOT 5", "expected NULL or NAN after IS NOT, found '5'", 10),
    ("/a NOT 5", "expected BETWEEN, IN, LIKE, BEGINS WITH or ENDS WITH after NOT", 7),
    ("/a NOT = 5", "expected BETWEEN, IN, LIKE, BEGINS WITH or ENDS WITH after NOT", 7),
    ("/a = 1 NOT", "unexpected NOT after a complete condition", 7),
    # chained comparisons
    ("1 < /a < 5", "comparisons cannot be chained", 7),
    ("/a = 1 = 2", "comparisons cannot be chained", 7),
    ("/a = 1 IS NULL", "comparisons cannot be chained", 7),
    # limits
    ("(" * 40 + "/a = 1" + ")" * 40, "nested more than 32 levels deep", 32),
    ("NOT " * 40 + "TRUE", "nested more than 32 levels deep", 128),
    ("- " * 40 + "1 = 1", "nested more than 32 levels deep", 64),
    (" + ".join(["1"] * 70) + " = 1", "more than 64 operations deep", 254),
]


@pytest.mark.parametrize(("text", "fragment", "position"), BAD_FILTERS)
def test_bad_filter(text: str, fragment: str, position: int) -> None:
    with pytest.raises(FilterError) as info:
        compile_filter(text)
    err = info.value
    assert fragment in err.problem, str(err)
    assert err.position == position, str(err)
    assert err.reason == "bad filter"
    assert err.hint, "every error needs a hint on how to fix it"
    rendered = str(err)
    assert rendered.startswith(f"bad filter: {err.problem} at ")
    assert f"hint: {err.hint}" in rendered
    # The caret sits under the reported position on the reported line.
    lines = rendered.splitlines()
    caret_line = next(line for line in lines[1:] if line.strip() == "^")
    assert len(caret_line) - 3 == err.column - 1


@pytest.mark.parametrize(
    ("text", "hint_fragment"),
    [
        ("/a && /b", "use AND, not &&"),
        ("/a || /b", "use OR, not ||"),
        ("!(/a = 1)", "use NOT"),
        ("UPPR(/a)", "did you mean UPPER()?"),
        ("INSTRI(/a, 'x')", "did you mean INSTR_I()?"),
        ("SUBSTRING(/a, 1)", "did you mean SUBSTR()?"),
        ("FROBNICATE(/a)", "all known functions: ABS, AMPS_INSTANCE_NAME"),
        ("1 < /a < 5", "combine them with AND"),
        ("foo = 1", "fields start with '/' (/foo)"),
        ("/a = 1 /b = 2", "join the conditions with AND or OR"),
        ("/a LIKE '\\d('", "use a raw string r'\\d'"),
        ("/a/ 2", "put spaces around it: /a / 2"),
        ("/a = 1 foo", "join conditions with AND or OR"),
    ],
)
def test_hints(text: str, hint_fragment: str) -> None:
    with pytest.raises(FilterError) as info:
        compile_filter(text)
    assert hint_fragment in info.value.hint


def test_regex_error_points_into_the_pattern_when_it_can() -> None:
    with pytest.raises(FilterError) as info:
        compile_filter("/a LIKE 'abc)'")
    assert info.value.position == 12  # the ')' itself
    # With escapes in the literal the offsets differ, so the caret marks the literal and
    # the message says where in the pattern the problem is.
    with pytest.raises(FilterError) as info:
        compile_filter("/a LIKE '\\t)'")
    assert info.value.position == 8
    assert "at character 2 of the pattern" in info.value.problem


def test_tabs_keep_the_caret_aligned() -> None:
    with pytest.raises(FilterError) as info:
        compile_filter("\t/a = 'x")
    assert str(info.value).splitlines()[2] == "  \t     ^"
