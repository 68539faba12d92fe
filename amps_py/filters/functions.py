"""Built-in functions.

Scalar functions receive the first element of each argument (functions are not array
aware) and return a scalar or NULL; an empty-string result is NULL, like every other
empty string. Unless stated otherwise, a NULL argument gives a NULL result.

A few functions need more than their argument values and are built by the compiler
instead: IF and COALESCE (lazy), ARRAY_COUNT (sees the whole multi-value), REGEXP_MATCH
(precompiles a literal pattern), and the context functions (read the EvalContext).
"""

from __future__ import annotations

import difflib
import math
import re
import time
import warnings
import zlib
from collections.abc import Callable

from .context import EvalContext
from .values import NAN, Scalar, as_number, to_text

ScalarFunction = Callable[..., Scalar | None]


def _upper(s: Scalar | None) -> Scalar | None:
    text = to_text(s)
    return None if text is None else text.upper() or None


def _lower(s: Scalar | None) -> Scalar | None:
    text = to_text(s)
    return None if text is None else text.lower() or None


def _instr(s: Scalar | None, t: Scalar | None) -> Scalar | None:
    hay, needle = to_text(s), to_text(t)
    if hay is None or needle is None:
        return None
    return hay.find(needle) + 1


def _instr_i(s: Scalar | None, t: Scalar | None) -> Scalar | None:
    hay, needle = to_text(s), to_text(t)
    if hay is None or needle is None:
        return None
    return hay.lower().find(needle.lower()) + 1


def _strequal_i(a: Scalar | None, b: Scalar | None) -> Scalar | None:
    x, y = to_text(a), to_text(b)
    if x is None or y is None:
        return None
    return x.lower() == y.lower()


def _concat(*args: Scalar | None) -> Scalar | None:
    # NULL arguments contribute nothing (so CONCAT(/first, ' ', /last) survives a gap).
    parts = [text for text in map(to_text, args) if text is not None]
    return "".join(parts) or None


def _whole(value: Scalar | None) -> int | None:
    """A numeric argument as a whole number (truncated), or None for NULL/NaN/infinite."""
    number = as_number(value)
    if number is None:
        return None
    if isinstance(number, float):
        if not math.isfinite(number):
            return None
        return int(number)
    return number


_OMITTED = object()


def _substr(s: Scalar | None, start: Scalar | None, length: object = _OMITTED) -> Scalar | None:
    """SUBSTR(s, start[, length]): 1-based start; a negative start counts from the end;
    start 0 is treated as 1; a length of zero or less (or NULL) gives NULL."""
    text = to_text(s)
    begin = _whole(start)
    if text is None or begin is None:
        return None
    if begin > 0:
        begin -= 1
    elif begin < 0:
        begin = max(0, len(text) + begin)
    if length is _OMITTED:
        return text[begin:] or None
    assert length is None or isinstance(length, bool | int | float | str)
    count = _whole(length)
    if count is None or count <= 0:
        return None
    return text[begin : begin + count] or None


def _replace(s: Scalar | None, old: Scalar | None, new: Scalar | None) -> Scalar | None:
    """REPLACE(s, old, new); a NULL (or '') ``new`` deletes, a NULL ``old`` changes nothing."""
    text = to_text(s)
    if text is None:
        return None
    target = to_text(old)
    if target is None:
        return text
    return text.replace(target, to_text(new) or "") or None


def _abs(x: Scalar | None) -> Scalar | None:
    number = as_number(x)
    return None if number is None else abs(number)


def _crc32(s: Scalar | None) -> Scalar | None:
    text = to_text(s)
    if text is None:
        return None
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _char_value(n: Scalar | None) -> Scalar | None:
    code = _whole(n)
    if code is None or not 0 <= code <= 0x10FFFF:
        return None
    return chr(code)


SCALAR_FUNCTIONS: dict[str, ScalarFunction] = {
    "UPPER": _upper,
    "LOWER": _lower,
    "INSTR": _instr,
    "INSTR_I": _instr_i,
    "STREQUAL_I": _strequal_i,
    "CONCAT": _concat,
    "SUBSTR": _substr,
    "REPLACE": _replace,
    "ABS": _abs,
    "CRC32": _crc32,
    "CHAR_VALUE": _char_value,
    "TRUE_VALUE": lambda: True,
    "FALSE_VALUE": lambda: False,
    "NAN_VALUE": lambda: NAN,
}

CONTEXT_FUNCTIONS: dict[str, Callable[[EvalContext], Scalar | None]] = {
    "UNIX_TIMESTAMP": lambda ctx: time.time() if ctx.now is None else ctx.now,
    "CLIENT_NAME": lambda ctx: ctx.client_name or None,
    "AMPS_INSTANCE_NAME": lambda ctx: ctx.instance_name or None,
    "MESSAGE_SIZE": lambda ctx: ctx.message_size,
}

# name -> (fewest, most) arguments; most=None means any number.
ARITY: dict[str, tuple[int, int | None]] = {
    "IF": (3, 3),
    "COALESCE": (1, None),
    "UPPER": (1, 1),
    "LOWER": (1, 1),
    "INSTR": (2, 2),
    "INSTR_I": (2, 2),
    "STREQUAL_I": (2, 2),
    "CONCAT": (1, None),
    "SUBSTR": (2, 3),
    "REPLACE": (3, 3),
    "REGEXP_MATCH": (2, 2),
    "ABS": (1, 1),
    "CRC32": (1, 1),
    "UNIX_TIMESTAMP": (0, 0),
    "CLIENT_NAME": (0, 0),
    "AMPS_INSTANCE_NAME": (0, 0),
    "MESSAGE_SIZE": (0, 0),
    "ARRAY_COUNT": (1, 1),
    "TRUE_VALUE": (0, 0),
    "FALSE_VALUE": (0, 0),
    "NAN_VALUE": (0, 0),
    "CHAR_VALUE": (1, 1),
}

KNOWN_FUNCTIONS = tuple(sorted(ARITY))


def describe_arity(name: str) -> str:
    """'takes 2 or 3 arguments', 'takes no arguments', ... for error messages."""
    low, high = ARITY[name]
    if high is None:
        return f"takes at least {low} argument{'s' if low != 1 else ''}"
    if low == high:
        if low == 0:
            return "takes no arguments"
        return f"takes {low} argument{'s' if low != 1 else ''}"
    if high == low + 1:
        return f"takes {low} or {high} arguments"
    return f"takes {low} to {high} arguments"


def closest_function(name: str) -> tuple[str, bool]:
    """The known function name nearest to ``name``, and whether it is a likely typo."""
    upper = name.upper()
    scored = [
        (difflib.SequenceMatcher(None, upper, known).ratio(), known) for known in KNOWN_FUNCTIONS
    ]
    ratio, best = max(scored)
    return best, ratio >= 0.75


_REGEX_CACHE: dict[str, re.Pattern[str] | None] = {}
_REGEX_CACHE_LIMIT = 256


def runtime_regex(pattern: str) -> re.Pattern[str] | None:
    """Compile a pattern that only exists at evaluation time; None if it is invalid."""
    try:
        return _REGEX_CACHE[pattern]
    except KeyError:
        pass
    try:
        compiled: re.Pattern[str] | None = quiet_compile(pattern)
    except (re.error, ValueError, OverflowError, RecursionError):
        compiled = None
    if len(_REGEX_CACHE) >= _REGEX_CACHE_LIMIT:
        _REGEX_CACHE.clear()
    _REGEX_CACHE[pattern] = compiled
    return compiled


def quiet_compile(pattern: str) -> re.Pattern[str]:
    """re.compile without FutureWarnings (e.g. 'possible nested set'), which would be
    raised as errors under ``-W error``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return re.compile(pattern)
