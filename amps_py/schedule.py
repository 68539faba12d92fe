"""When an ``amps-action-on-schedule`` fires next (pure: time is passed in).

``Every`` is one of:

- an interval (``15s``, ``5m``, ``4h``): every interval from startup;
- a time of day, 24-hour (``17:47`` or ``17:47:30``): every day at that local time;
- a weekday and a time (``Monday at 17:47``, ``Mon at 17:47``): every week;
- either time form with ``Z`` appended (``17:47Z``): UTC instead of local time.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Final

from amps_py.units import UnitError, parse_duration

_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TIME = re.compile(
    r"^(?:(?P<day>[A-Za-z]+)\s+at\s+)?(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?(?P<z>Z)?$"
)


class ScheduleError(ValueError):
    """``Every`` cannot be understood; the message says what is accepted."""


@dataclass(frozen=True)
class Schedule:
    """A parsed ``Every``: an interval, or a clock time (daily or on one weekday)."""

    interval: float | None = None
    clock: datetime.time | None = None
    weekday: int | None = None  # 0 = Monday
    utc: bool = False

    def next_after(self, now: float, started: float) -> float:
        """The first firing time (epoch seconds) strictly after ``now``; intervals
        count from ``started``."""
        if self.interval is not None:
            elapsed = max(now - started, 0.0)
            return started + (int(elapsed // self.interval) + 1) * self.interval
        assert self.clock is not None
        tz = datetime.UTC if self.utc else None
        current = datetime.datetime.fromtimestamp(now, tz)
        candidate = current.replace(
            hour=self.clock.hour, minute=self.clock.minute, second=self.clock.second, microsecond=0
        )
        step = datetime.timedelta(days=1)
        for _ in range(8):
            if candidate.timestamp() > now and (
                self.weekday is None or candidate.weekday() == self.weekday
            ):
                return candidate.timestamp()
            candidate = (candidate + step).replace(
                hour=self.clock.hour, minute=self.clock.minute, second=self.clock.second
            )
        raise AssertionError("unreachable: a weekday recurs within 8 days")


def parse_every(text: str) -> Schedule:
    """Parse ``Every``.

    Raises:
        ScheduleError: naming the accepted forms.
    """
    value = text.strip()
    match = _TIME.match(value)
    if match is None:
        try:
            seconds = parse_duration(value)
        except UnitError:
            raise ScheduleError(
                f"Every {text!r} is neither an interval (30s, 5m, 4h), a time of day "
                "(17:47, 17:47Z for UTC) nor a weekday and time (Monday at 17:47)"
            ) from None
        if seconds <= 0:
            raise ScheduleError(f"Every {text!r} must be longer than 0")
        return Schedule(interval=seconds)
    hour, minute = int(match["h"]), int(match["m"])
    second = int(match["s"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ScheduleError(f"Every {text!r} is not a time of day: use 00:00 to 23:59")
    weekday = None
    if match["day"]:
        day = match["day"].lower()
        found = [i for i, name in enumerate(_WEEKDAYS) if name.startswith(day) and len(day) >= 3]
        if len(found) != 1:
            raise ScheduleError(
                f"Every {text!r}: {match['day']!r} is not a weekday; write Monday ... Sunday "
                "(or Mon ... Sun)"
            )
        weekday = found[0]
    return Schedule(
        clock=datetime.time(hour, minute, second), weekday=weekday, utc=bool(match["z"])
    )
