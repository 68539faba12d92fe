"""AMPS configuration units: durations, byte sizes, percentages and counts.

AMPS config values may carry a unit suffix (``100ms``, ``2GB``, ``50%``, ``10k``). These
parsers turn such text into plain numbers, and every one of them either returns a value
or raises :class:`UnitError`; no other exception escapes, whatever the input.

The accepted forms, all case-insensitive and with optional spaces between the number and
the unit:

=============  ========================================================================
parser         forms
=============  ========================================================================
duration       ``ns``, ``us``, ``ms``, ``s``, ``m`` (minutes), ``h``, ``d``, ``w``;
               a bare number means seconds. Returns seconds as ``float``.
bytes          ``k``/``kb``/``kib``, ``m``/``mb``/``mib``, ``g``/``gb``/``gib``,
               ``t``/``tb``/``tib`` are all powers of 1024; ``b`` or a bare number
               means bytes. Returns ``int`` (fractions of a byte are dropped).
percent        a number followed by ``%``. Returns the fraction (``50%`` -> ``0.5``).
count          ``k`` = 10^3, ``m`` = 10^6; a bare number is the count itself. The
               result must be a whole number. Returns ``int``.
=============  ========================================================================

Numbers are plain decimals (``10``, ``1.5``, ``.5``); signs, exponents, ``inf`` and
``nan`` are refused because no AMPS setting takes them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from fractions import Fraction

__all__ = ["UnitError", "parse_bytes", "parse_count", "parse_duration", "parse_percent"]


class UnitError(ValueError):
    """A config value is not a number with one of the accepted units.

    The message names the offending text and lists the forms that would be accepted, so
    it can be shown to an operator as is. ``text`` is the value as given and ``kind`` the
    kind of quantity that was expected (``"duration"``, ``"byte size"``, ...).
    """

    def __init__(self, text: str, kind: str, accepted: str) -> None:
        super().__init__(f"{text!r} is not a valid {kind}; {accepted}")
        self.text = text
        self.kind = kind
        self.accepted = accepted


# A decimal number, then an optional unit made of letters or '%'.
_VALUE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z%]*)\s*")

_DURATION_UNITS: Mapping[str, Fraction] = {
    "": Fraction(1),
    "ns": Fraction(1, 1_000_000_000),
    "us": Fraction(1, 1_000_000),
    "ms": Fraction(1, 1_000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3_600),
    "d": Fraction(86_400),
    "w": Fraction(604_800),
}
DURATION_FORMS = (
    "use a number with an optional unit: ns, us, ms, s, m (minutes), h, d or w, "
    "e.g. 100ms, 1.5s, 10m; a bare number means seconds"
)

_KIB = 1024
_BYTE_UNITS: Mapping[str, int] = {
    "": 1,
    "b": 1,
    **{unit: _KIB for unit in ("k", "kb", "kib")},
    **{unit: _KIB**2 for unit in ("m", "mb", "mib")},
    **{unit: _KIB**3 for unit in ("g", "gb", "gib")},
    **{unit: _KIB**4 for unit in ("t", "tb", "tib")},
}
BYTES_FORMS = (
    "use a number with an optional unit: KB, MB, GB, TB (also K, M, G, T or KiB, MiB, "
    "GiB, TiB; all powers of 1024), e.g. 16MB, 1.5GB; a bare number means bytes"
)

PERCENT_FORMS = "use a number followed by %, e.g. 50% or 12.5%"

_COUNT_UNITS: Mapping[str, int] = {"": 1, "k": 1_000, "m": 1_000_000}
COUNT_FORMS = (
    "use a whole number with an optional multiplier: k (thousand) or M (million), e.g. 500, 10k, 2M"
)


def _split(text: str, kind: str, accepted: str) -> tuple[Fraction, str]:
    """Split ``text`` into an exact number and a lower-case unit, or raise UnitError."""
    if not isinstance(text, str):
        raise UnitError(repr(text), kind, accepted)
    match = _VALUE.fullmatch(text)
    if match is None:
        raise UnitError(text, kind, accepted)
    return Fraction(match.group(1)), match.group(2).lower()


def utc_timestamp(ts_us: int, *, style: str = "iso", precision: str = "us") -> str:
    """A time (µs since the epoch) in UTC, the one timestamp format of the project:

    - ``style="iso"``: ISO 8601, ``2026-11-23T17:47:00.123456Z`` (the admin tree);
    - ``style="amps"``: AMPS's compact form, ``20261123T174700.123456Z`` (the ``ts``
      header, bookmark timestamps);
    - ``precision="s"`` drops the fraction.
    """
    secs, micros = divmod(ts_us, 1_000_000)
    pattern = "%Y-%m-%dT%H:%M:%S" if style == "iso" else "%Y%m%dT%H%M%S"
    text = time.strftime(pattern, time.gmtime(secs))
    return f"{text}.{micros:06d}Z" if precision == "us" else f"{text}Z"


def utc_iso(ts: float) -> str:
    """A wall-clock time (seconds since the epoch) as ISO 8601 UTC to the second, e.g.
    ``2026-11-23T17:47:00Z``; ``""`` for 0 (never)."""
    return utc_timestamp(round(ts * 1_000_000), precision="s") if ts else ""


def parse_duration(text: str) -> float:
    """Parse an AMPS interval such as ``100ms`` or ``5m`` into seconds.

    Args:
        text: a decimal number with an optional unit (ns, us, ms, s, m, h, d, w; any
            case). A bare number means seconds.

    Returns:
        The duration in seconds. ``"1us"`` is exactly ``1e-06``.

    Raises:
        UnitError: ``text`` is not a non-negative number with one of those units.
    """
    number, unit = _split(text, "duration", DURATION_FORMS)
    scale = _DURATION_UNITS.get(unit)
    if scale is None:
        raise UnitError(text, "duration", DURATION_FORMS)
    return float(number * scale)


def parse_bytes(text: str) -> int:
    """Parse an AMPS byte size such as ``16MB``, ``2G`` or ``512KiB``.

    Args:
        text: a decimal number with an optional unit. ``k``, ``kb`` and ``kib`` (and the
            m/g/t equivalents, any case) all mean powers of 1024, as in AMPS. ``b`` or
            no unit means bytes.

    Returns:
        The size in bytes; a fractional result is rounded down (``1.5k`` is 1536).

    Raises:
        UnitError: ``text`` is not a non-negative number with one of those units.
    """
    number, unit = _split(text, "byte size", BYTES_FORMS)
    scale = _BYTE_UNITS.get(unit)
    if scale is None:
        raise UnitError(text, "byte size", BYTES_FORMS)
    return int(number * scale)


def parse_percent(text: str) -> float:
    """Parse a percentage such as ``50%`` into a fraction (``0.5``).

    Args:
        text: a decimal number followed by ``%``. The sign is required so that ``0.5``
            cannot be misread as either a half or half a percent.

    Returns:
        The fraction; values above 100% are returned as they are (above 1.0).

    Raises:
        UnitError: ``text`` is not a non-negative number followed by ``%``.
    """
    number, unit = _split(text, "percentage", PERCENT_FORMS)
    if unit != "%":
        raise UnitError(text, "percentage", PERCENT_FORMS)
    return float(number / 100)


def parse_count(text: str) -> int:
    """Parse a count such as ``500``, ``10k`` or ``2M``.

    Args:
        text: a decimal number with an optional multiplier ``k`` (10^3) or ``M`` (10^6),
            any case. ``1.5k`` is allowed because it is a whole number (1500).

    Returns:
        The count.

    Raises:
        UnitError: ``text`` is not such a number, or the result is not whole.
    """
    number, unit = _split(text, "count", COUNT_FORMS)
    scale = _COUNT_UNITS.get(unit)
    if scale is None:
        raise UnitError(text, "count", COUNT_FORMS)
    value = number * scale
    if value.denominator != 1:
        raise UnitError(text, "count", COUNT_FORMS)
    return int(value)
