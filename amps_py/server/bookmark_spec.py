"""Parsing the ``bm`` field of a bookmark subscription (pure; no I/O).

Accepted forms (AMPS-NOTES section 2.2):

- ``0`` — EPOCH: replay the whole journal, then go live.
- ``0|1|`` — NOW: no replay.
- ``<hash>|<seq>|`` — resume after that message.
- a comma list of bookmarks — resume after the earliest one found in the journal.
- ``YYYYMMDDTHHMMSS[Z]`` (optionally with ``.ffffff``) — the first message at or after
  that UTC instant.
- a range ``[a:b)``, ``(a:b]``, ... whose ends are any of the above.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from typing import Final

from txlog import BadBookmark, parse_bookmark

EPOCH: Final = "0"
NOW: Final = "0|1|"

_TIMESTAMP = re.compile(r"^(\d{8})T(\d{6})(?:\.(\d{1,6}))?Z?$")


class BadBookmarkSpec(ValueError):
    """A ``bm`` value that is not any accepted form; the text shows the accepted ones."""

    reason = "invalid bookmark"


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
    """``YYYYMMDDTHHMMSS[.ffffff][Z]`` (UTC) as µs since the epoch, or None if not one."""
    m = _TIMESTAMP.match(text)
    if not m:
        return None
    date, clock, frac = m.groups()
    try:
        secs = calendar.timegm(
            (
                int(date[:4]),
                int(date[4:6]),
                int(date[6:8]),
                int(clock[:2]),
                int(clock[2:4]),
                int(clock[4:6]),
                0,
                0,
                0,
            )
        )
    except (ValueError, OverflowError):
        return None
    if not (1 <= int(date[4:6]) <= 12 and 1 <= int(date[6:8]) <= 31):
        return None
    micros = int((frac or "0").ljust(6, "0"))
    return secs * 1_000_000 + micros


def _parse_point(text: str) -> Point:
    text = text.strip()
    if text == EPOCH or text == "":
        return Point("epoch")
    if text == NOW:
        return Point("now")
    ts = parse_timestamp_us(text)
    if ts is not None:
        return Point("time", time_us=ts)
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
