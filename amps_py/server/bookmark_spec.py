"""Parsing the ``bm`` field of a bookmark subscription (pure; no I/O).

Accepted forms (AMPS-NOTES section 2.2):

- ``0`` — EPOCH: replay the whole journal, then go live.
- ``0|1|`` — NOW: no replay.
- ``<hash>|<seq>|`` — resume after that message.
- a comma list of bookmarks — resume after the earliest one found in the journal.
- a UTC timestamp — the first message at or after that instant: AMPS's
  ``YYYYMMDDTHHMMSS[Z]``, with optional fractional seconds (``.f`` up to nanoseconds;
  kept to the microsecond), and the same in ISO-8601's extended form
  ``YYYY-MM-DDTHH:MM:SS[.f][Z]``. The only zone accepted is ``Z`` (as in AMPS); without
  it the time is UTC too.
- a range ``[a:b)``, ``(a:b]``, ... whose ends are any of the above.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from amps_py import reasons
from txlog import BadBookmark, parse_bookmark

EPOCH: Final = "0"
NOW: Final = "0|1|"

_TIMESTAMP = re.compile(
    r"^(\d{4})(-?)(\d{2})\2(\d{2})T(\d{2})(:?)(\d{2})\6(\d{2})(?:[.,](\d{1,9}))?(Z?)$"
)
#: something that starts like a timestamp (to explain why it was not accepted)
_LOOKS_LIKE_TIME = re.compile(r"^\d{4}-?\d{2}-?\d{2}T")
_TIMESTAMP_FORMS: Final = (
    "20240131T120000, 20240131T120000Z, 20240131T120000.123456Z or "
    "2024-01-31T12:00:00.123Z (UTC; the only zone accepted is Z)"
)


class BadBookmarkSpec(ValueError):
    """A ``bm`` value that is not any accepted form; the text shows the accepted ones."""

    reason = reasons.INVALID_BOOKMARK


@dataclass(frozen=True)
class Point:
    """One end of a replay: EPOCH, NOW, a timestamp (µs) or a list of bookmarks."""

    kind: str  # "epoch" | "now" | "time" | "bookmarks"
    time_us: int = 0
    bookmarks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class BookmarkSpec:
    """A parsed ``bm`` field: where replay starts and, for ranges, where it ends."""

    start: Point
    end: Point | None = None
    start_inclusive: bool = False
    end_inclusive: bool = False


def parse_timestamp_us(text: str) -> int | None:
    """A UTC timestamp (see the module doc) as µs since the epoch, or None if ``text``
    is not one."""
    m = _TIMESTAMP.match(text)
    if not m:
        return None
    year, _, month, day, hour, _, minute, second, frac, _ = m.groups()
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=UTC
        )
    except ValueError:
        return None
    micros = int((frac or "0")[:6].ljust(6, "0"))
    return int(moment.timestamp()) * 1_000_000 + micros


def _parse_point(text: str) -> Point:
    text = text.strip()
    if text == EPOCH or text == "":
        return Point("epoch")
    if text == NOW:
        return Point("now")
    ts = parse_timestamp_us(text)
    if ts is not None:
        return Point("time", time_us=ts)
    if _LOOKS_LIKE_TIME.match(text):
        raise BadBookmarkSpec(
            f"{text!r} is not a timestamp amps-py accepts (or not a real date); use "
            f"{_TIMESTAMP_FORMS}"
        )
    marks = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part == EPOCH:
            return Point("epoch")
        if part == NOW:
            continue
        try:
            marks.append(parse_bookmark(part))
        except BadBookmark as exc:
            raise BadBookmarkSpec(str(exc)) from None
    if not marks:
        return Point("now")
    return Point("bookmarks", bookmarks=tuple(marks))


def parse_bookmark_spec(text: str) -> BookmarkSpec:
    """Parse a ``bm`` field.

    Raises:
        BadBookmarkSpec: the text is none of the accepted forms.
    """
    text = text.strip()
    if text[:1] in "[(" and text[-1:] in "])":
        inner = text[1:-1]
        if ":" not in inner:
            raise BadBookmarkSpec(
                f"bookmark range {text!r} needs a ':' between its start and end, "
                "e.g. [20240101T000000:20240102T000000)"
            )
        first, _, last = inner.partition(":")
        return BookmarkSpec(
            start=_parse_point(first),
            end=_parse_point(last),
            start_inclusive=text[0] == "[",
            end_inclusive=text[-1] == "]",
        )
    return BookmarkSpec(start=_parse_point(text))
