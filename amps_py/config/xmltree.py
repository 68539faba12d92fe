"""Small helpers over lxml elements and the words of messages, shared by every section."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Protocol, cast

from lxml import etree


class _LogEntry(Protocol):
    """The fields of an lxml error-log entry that the loader reads."""

    line: int
    level: int
    message: str
    path: str | None


#: libxml2's error level for errors (warnings are 1, fatal errors 3).
_LIBXML_ERROR = 2


def _log_entries(log: object) -> list[_LogEntry]:
    """The entries of an lxml error log (typed; lxml-stubs leave the log opaque)."""
    return list(cast("Iterable[_LogEntry]", log))


def _line(el: etree._Element) -> int | None:
    """The source line of ``el`` (lxml-stubs do not type ``sourceline``)."""
    return cast("int | None", el.sourceline)


def _element_path(el: etree._Element) -> str:
    names = [str(a.tag) for a in el.iterancestors()][::-1]
    return "/".join([*names, str(el.tag)])


def _child_elements(el: etree._Element) -> list[etree._Element]:
    return [c for c in el if isinstance(c.tag, str)]


def _children(el: etree._Element | None, name: str) -> list[etree._Element]:
    if el is None:
        return []
    return [c for c in el if c.tag == name]


def _first(el: etree._Element | None, name: str) -> etree._Element | None:
    found = _children(el, name)
    return found[0] if found else None


def _closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (ignoring case), or None if none is close."""
    by_lower = {c.lower(): c for c in candidates}
    lower = word.lower()
    match = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=0.6)
    if match:
        return by_lower[match[0]]
    # A shortened or extended spelling ("warn", "fsync-always") is close as well.
    related = [c for c in by_lower if min(len(c), len(lower)) >= 3]
    related = [c for c in related if c.startswith(lower) or lower.startswith(c)]
    return by_lower[max(related, key=len)] if related else None


def _one_of(values: Iterable[str]) -> str:
    return ", ".join(values)


def _snippet(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]
