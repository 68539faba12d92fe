"""amps-action-on-schedule's Every: intervals, times of day, weekdays, UTC (pure)."""

from __future__ import annotations

import datetime

import pytest

from amps_py.schedule import ScheduleError, parse_every

UTC = datetime.UTC


def at(*args: int) -> float:
    return datetime.datetime(*args, tzinfo=UTC).timestamp()


def test_interval_counts_from_startup_and_skips_to_the_next_multiple() -> None:
    every = parse_every("15s")
    start = at(2026, 3, 2, 10, 0, 0)
    assert every.next_after(start, start) == start + 15
    assert every.next_after(start + 15, start) == start + 30
    assert every.next_after(start + 47, start) == start + 60  # missed ones are skipped


def test_time_of_day_in_utc_fires_daily() -> None:
    every = parse_every("17:47Z")
    assert every.next_after(at(2026, 3, 2, 10, 0), 0) == at(2026, 3, 2, 17, 47)
    assert every.next_after(at(2026, 3, 2, 17, 47), 0) == at(2026, 3, 3, 17, 47)
    assert parse_every("08:00:30Z").next_after(at(2026, 3, 2, 9, 0), 0) == at(2026, 3, 3, 8, 0, 30)


def test_weekday_fires_weekly() -> None:
    every = parse_every("Friday at 06:15Z")  # 2026-03-02 is a Monday
    assert every.next_after(at(2026, 3, 2, 12, 0), 0) == at(2026, 3, 6, 6, 15)
    assert every.next_after(at(2026, 3, 6, 6, 15), 0) == at(2026, 3, 13, 6, 15)
    assert parse_every("mon at 00:00Z").next_after(at(2026, 3, 2, 0, 0), 0) == at(2026, 3, 9)


def test_local_time_of_day_is_local() -> None:
    every = parse_every("03:00")
    now = datetime.datetime(2026, 3, 2, 12, 0).timestamp()  # local noon
    fired = datetime.datetime.fromtimestamp(every.next_after(now, 0))
    assert (fired.hour, fired.minute, fired.day) == (3, 0, 3)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("soon", "neither an interval"),
        ("25:00", "not a time of day"),
        ("Caturday at 10:00", "'Caturday' is not a weekday"),
        ("0s", "longer than 0"),
    ],
)
def test_bad_every_says_what_is_accepted(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment):
        parse_every(text)
