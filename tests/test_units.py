"""amps_py.units: every accepted form, every refusal, and the one-exception promise."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amps_py.units import UnitError, parse_bytes, parse_count, parse_duration, parse_percent

KIB = 1024

DURATIONS = [
    ("0", 0.0),
    ("1", 1.0),
    ("2.5", 2.5),
    ("100ns", 100e-9),
    ("1us", 1e-6),
    ("250us", 250e-6),
    ("100ms", 0.1),
    ("1000ms", 1.0),
    ("1s", 1.0),
    ("1.5s", 1.5),
    (".5s", 0.5),
    ("10m", 600.0),
    ("2h", 7200.0),
    ("1d", 86400.0),
    ("1w", 604800.0),
    ("10MS", 0.01),
    ("5M", 300.0),
    ("3 s", 3.0),
    ("  7ms  ", 0.007),
]

BYTES = [
    ("0", 0),
    ("512", 512),
    ("512b", 512),
    ("1k", KIB),
    ("1kb", KIB),
    ("1KB", KIB),
    ("1KiB", KIB),
    ("10M", 10 * KIB**2),
    ("16mb", 16 * KIB**2),
    ("16MiB", 16 * KIB**2),
    ("2G", 2 * KIB**3),
    ("1GB", KIB**3),
    ("64gib", 64 * KIB**3),
    ("1t", KIB**4),
    ("1TB", KIB**4),
    ("1TiB", KIB**4),
    ("1.5KB", 1536),
    ("1.3k", 1331),  # fractions of a byte are dropped
    ("2 GB", 2 * KIB**3),
]

PERCENTS = [("50%", 0.5), ("0%", 0.0), ("100%", 1.0), ("12.5%", 0.125), ("150 %", 1.5)]

COUNTS = [("0", 0), ("500", 500), ("10k", 10_000), ("10K", 10_000), ("2M", 2_000_000)]
COUNTS += [("2m", 2_000_000), ("1.5k", 1_500), ("0.5M", 500_000)]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=0)


def test_duration_bounds_are_exact() -> None:
    # FlushInterval's range is checked with ==/<= against these values.
    assert parse_duration("1us") == 1e-6
    assert parse_duration("1000ms") == 1.0


@pytest.mark.parametrize(("text", "size"), BYTES)
def test_parse_bytes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(("text", "fraction"), PERCENTS)
def test_parse_percent(text: str, fraction: float) -> None:
    assert parse_percent(text) == pytest.approx(fraction)


@pytest.mark.parametrize(("text", "count"), COUNTS)
def test_parse_count(text: str, count: int) -> None:
    assert parse_count(text) == count


BAD = [
    (parse_duration, "10 parsecs", "duration"),
    (parse_duration, "", "duration"),
    (parse_duration, "ms", "duration"),
    (parse_duration, "-1s", "duration"),
    (parse_duration, "1e3ms", "duration"),
    (parse_duration, "inf", "duration"),
    (parse_duration, "nan", "duration"),
    (parse_duration, "1.2.3s", "duration"),
    (parse_duration, "5 minutes", "duration"),
    (parse_bytes, "1PB", "byte size"),
    (parse_bytes, "ten", "byte size"),
    (parse_bytes, "1 kilobyte", "byte size"),
    (parse_bytes, "-5MB", "byte size"),
    (parse_bytes, "1,024", "byte size"),
    (parse_percent, "50", "percentage"),
    (parse_percent, "0.5", "percentage"),
    (parse_percent, "%", "percentage"),
    (parse_percent, "-5%", "percentage"),
    (parse_count, "1.5", "count"),
    (parse_count, "1g", "count"),
    (parse_count, "10 thousand", "count"),
    (parse_count, "0.0001k", "count"),
]


@pytest.mark.parametrize(("parse", "text", "kind"), BAD)
def test_bad_values_name_the_text_and_the_accepted_forms(
    parse: object, text: str, kind: str
) -> None:
    assert callable(parse)
    with pytest.raises(UnitError) as info:
        parse(text)
    error = info.value
    assert isinstance(error, ValueError)
    assert repr(text) in str(error)
    assert f"not a valid {kind}" in str(error)
    assert error.text == text
    assert error.kind == kind
    assert error.accepted in str(error)
    assert "e.g." in error.accepted  # every error shows an example of a good value


def test_duration_error_lists_every_unit() -> None:
    with pytest.raises(UnitError) as info:
        parse_duration("3 fortnights")
    for unit in ("ns", "us", "ms", "s", "m (minutes)", "h", "d", "w"):
        assert unit in info.value.accepted


def test_bytes_error_says_powers_of_1024() -> None:
    with pytest.raises(UnitError) as info:
        parse_bytes("1 PB")
    assert "1024" in info.value.accepted
    assert "KiB" in info.value.accepted


PARSERS = [parse_duration, parse_bytes, parse_percent, parse_count]


@given(st.sampled_from(PARSERS), st.text(max_size=12))
def test_any_text_parses_or_raises_unit_error(parse: object, text: str) -> None:
    assert callable(parse)
    with contextlib.suppress(UnitError):
        parse(text)


BYTE_UNITS = {"": 1, "b": 1, "k": KIB, "KB": KIB, "KiB": KIB, "M": KIB**2, "mb": KIB**2}
BYTE_UNITS |= {"G": KIB**3, "gib": KIB**3, "T": KIB**4, "tb": KIB**4}


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(sorted(BYTE_UNITS)))
def test_whole_byte_sizes_scale_exactly(number: int, unit: str) -> None:
    assert parse_bytes(f"{number}{unit}") == number * BYTE_UNITS[unit]


DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(DURATION_UNITS)))
def test_whole_durations_scale(number: int, unit: str) -> None:
    assert parse_duration(f"{number}{unit}") == pytest.approx(number * DURATION_UNITS[unit])


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "K", "m", "M"]))
def test_counts_scale(number: int, unit: str) -> None:
    scale = {"": 1, "k": 1000, "m": 1_000_000}[unit.lower()]
    assert parse_count(f"{number}{unit}") == number * scale
