"""The runtime value model: what an expression evaluates to, and how values compare.

A value is one of:

* ``None``: NULL (missing field, empty string, empty array, an object, JSON null);
  an object that carries text (:class:`TextNode`, an XML element with attributes and
  text) has that text as its value;
* a scalar: ``bool``, ``int``, ``float`` or a non-empty ``str`` (exact types, never
  subclasses);
* a ``list`` of two or more scalars: a field that occurs more than once (a JSON array, or a
  path that passes through arrays). Comparisons test every element ("any element");
  arithmetic and functions use the first element.

Truth values are ``True``, ``False`` and ``None`` (SQL UNKNOWN).

Conversions follow AMPS: a string compared with a number is converted to a number; a
string that does not look like a number compares greater than every number; arithmetic on
such a string gives NaN. Booleans act as 1 and 0 in comparisons and arithmetic.
"""

from __future__ import annotations

import math
import re
from typing import TypeAlias

Scalar: TypeAlias = bool | int | float | str
Value: TypeAlias = Scalar | list[Scalar] | None
Truth: TypeAlias = bool | None

NAN = math.nan

# Result of compare_sign when either side is NaN.
UNORDERED = 2

_NUMBER_RE = re.compile(
    r"\s*[+-]?(?:(?P<int>[0-9]+)|[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+|inf|infinity|nan)\s*",
    re.IGNORECASE,
)


def to_number(text: str) -> int | float | None:
    """The number a string spells (``' 42 '``, ``'-1.5e3'``, ``'NaN'``), else None."""
    m = _NUMBER_RE.fullmatch(text)
    if m is None:
        return None
    if m.group("int") is not None:
        try:
            return int(text)
        except ValueError:  # more digits than int() will convert
            return float(text)
    return float(text)


class TextNode(dict[str, object]):
    """An object that also has a value of its own: an XML element with attributes or
    child elements *and* text, e.g. ``<Price currency="USD">10.5</Price>``.

    Paths step into it like any object (``/Order/Price/@currency``), and where a path
    ends on it the value is its text (``/Order/Price`` is ``'10.5'``), as XPath reads
    an element. Every other object (a plain ``dict``) has no value (NULL).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


def scalar_of(leaf: object) -> Scalar | None:
    """Normalise one JSON leaf to a scalar; '' and non-scalars (objects, arrays) are NULL,
    except a :class:`TextNode`, whose value is its text."""
    if type(leaf) is str:
        return leaf or None
    if type(leaf) is int or type(leaf) is float or type(leaf) is bool:
        return leaf
    if type(leaf) is TextNode:
        return leaf.text or None
    # Subclasses (IntEnum, str subclasses, numpy-like floats) from hand-built documents.
    if isinstance(leaf, bool):
        return bool(leaf)
    if isinstance(leaf, int):
        return int(leaf)
    if isinstance(leaf, float):
        return float(leaf)
    if isinstance(leaf, str):
        return str(leaf) or None
    return None


def first(value: Value) -> Scalar | None:
    """The value scalar operators see: the first element of a multi-value, else itself."""
    if type(value) is list:
        return value[0]
    return value  # type: ignore[return-value]


def as_number(value: Scalar | None) -> int | float | None:
    """A scalar as a number for arithmetic: NULL stays NULL, bad numeric strings are NaN."""
    if type(value) is int or type(value) is float:
        return value
    if value is None:
        return None
    if type(value) is bool:
        return int(value)
    assert isinstance(value, str)
    number = to_number(value)
    return NAN if number is None else number


def to_text(value: Scalar | None) -> str | None:
    """A scalar as text for string functions and LIKE; NULL stays NULL."""
    if type(value) is str:
        return value
    if value is None:
        return None
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is int:
        try:
            return str(value)
        except ValueError:  # too many digits to print
            return None
    return repr(value)


def is_nan(value: Scalar) -> bool:
    """True for float NaN and for strings that spell NaN."""
    if type(value) is float:
        return value != value
    if type(value) is str:
        number = to_number(value)
        return number is not None and number != number
    return False


def truth(value: Value) -> Truth:
    """A value used as a condition (``/flag AND ...``, ``IF(/n, ...)``).

    Booleans are themselves; numbers are TRUE when non-zero (NaN is FALSE); the strings
    'true' and 'false' (any case) and numeric strings convert; anything else is NULL.
    """
    if value is None or value is True or value is False:
        return value
    scalar = first(value)
    if type(scalar) is bool:
        return scalar
    if type(scalar) is int:
        return scalar != 0
    if type(scalar) is float:
        return scalar != 0 and scalar == scalar
    assert isinstance(scalar, str)
    word = scalar.strip().lower()
    if word == "true":
        return True
    if word == "false":
        return False
    number = to_number(scalar)
    if number is None:
        return None
    return number != 0 and number == number


def compare_sign(a: Scalar, b: Scalar) -> int:
    """Order two scalars: -1, 0 or 1, or UNORDERED when a NaN is involved.

    Two strings compare as text (by code point). A string against a number converts to a
    number; if it cannot, the string is the greater.
    """
    x: int | float
    y: int | float
    if type(a) is str:
        if type(b) is str:
            return (a > b) - (a < b)
        number = to_number(a)
        if number is None:
            return 1
        x = number
    else:
        x = a  # type: ignore[assignment]
    if type(b) is str:
        number = to_number(b)
        if number is None:
            return -1
        y = number
    else:
        y = b  # type: ignore[assignment]
    if x < y:
        return -1
    if x > y:
        return 1
    if x == y:
        return 0
    return UNORDERED


def elements(value: Scalar | list[Scalar]) -> list[Scalar]:
    """The elements of a non-NULL value (a scalar is a one-element list)."""
    if type(value) is list:
        return value
    return [value]  # type: ignore[list-item]
