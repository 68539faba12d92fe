"""``TransactionLog``: the journal's directory, topics, sizes and durability."""

from __future__ import annotations

import re
from pathlib import Path

from lxml import etree

from amps_py.config.model import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_JOURNAL_SIZE,
    DEFAULT_MAP_SIZE,
    DEFAULT_PREALLOCATED_JOURNAL_FILES,
    MAX_FLUSH_INTERVAL,
    MIN_FLUSH_INTERVAL,
    MIN_JOURNAL_SIZE,
    MIN_MAP_SIZE,
    JournalTopic,
    TransactionLogConfig,
)
from amps_py.config.problems import _Problems
from amps_py.config.values import _bytes_value, _duration_value, _optional_choice, _text
from amps_py.config.xmltree import _children, _first, _line


def _build_journal_topic(topic: etree._Element, problems: _Problems) -> JournalTopic | None:
    name_el = _first(topic, "Name")
    name = _text(name_el, problems)
    message_type = _text(_first(topic, "MessageType"), problems)
    if name_el is None or not name or not message_type:
        return None
    try:
        return JournalTopic(name, message_type)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        problems.add(
            name_el,
            f"Topic Name {name!r} is not a valid regular expression: {exc.msg}{where}",
            "correct the expression, or escape regex characters with a backslash to "
            "match them literally (e.g. orders\\.new)",
        )
        return None


def _build_transaction_log(
    root: etree._Element, problems: _Problems
) -> TransactionLogConfig | None:
    log = _first(root, "TransactionLog")
    if log is None:
        return None
    directory = _text(_first(log, "JournalDirectory"), problems)
    ok = bool(directory)
    topics, topics_ok = _journal_topics(log, problems)
    flush_interval = _flush_interval(log, problems)
    size_els = _children(log, "JournalSize") + _children(log, "MinJournalSize")
    journal_size = _journal_size(size_els, problems)
    archive_el = _first(log, "JournalArchiveDirectory")
    archive_directory = _text(archive_el, problems) if archive_el is not None else None
    preallocated = _preallocated_files(log, problems)
    durability = _optional_choice(log, "Durability", "fsync", problems)
    compression = _optional_choice(log, "Compression", "none", problems)
    map_size = _map_size(log, problems)
    ok = ok and topics_ok
    ok = ok and None not in (flush_interval, journal_size, preallocated, map_size)
    if ok and journal_size is not None and map_size is not None:
        ok = _segment_fits(size_els, journal_size, map_size, problems)

    if (
        not ok
        or directory is None
        or durability is None
        or compression is None
        or flush_interval is None
        or journal_size is None
        or preallocated is None
        or map_size is None
    ):
        return None
    return TransactionLogConfig(
        journal_directory=Path(directory),
        topics=topics,
        flush_interval=flush_interval,
        journal_size=journal_size,
        archive_directory=Path(archive_directory) if archive_directory else None,
        durability=durability,
        compression=compression,
        map_size=map_size,
        preallocated_journal_files=preallocated,
    )


def _journal_topics(
    log: etree._Element, problems: _Problems
) -> tuple[tuple[JournalTopic, ...], bool]:
    """(the Topic entries that are right, whether all are)."""
    ok = True
    topics: list[JournalTopic] = []
    for topic_el in _children(log, "Topic"):
        topic = _build_journal_topic(topic_el, problems)
        if topic is None:
            ok = False
        else:
            topics.append(topic)
    return tuple(topics), ok


def _flush_interval(log: etree._Element, problems: _Problems) -> float | None:
    """FlushInterval in seconds (1us to 1s), the default when not given; None (and a
    problem) when wrong."""
    flush_el = _first(log, "FlushInterval")
    if flush_el is None:
        return DEFAULT_FLUSH_INTERVAL
    value = _duration_value(flush_el, problems)
    if value is None:
        return None
    if not MIN_FLUSH_INTERVAL <= value <= MAX_FLUSH_INTERVAL:
        problems.add(
            flush_el,
            f"FlushInterval {_text(flush_el, problems)} is out of range",
            "use a value from 1us to 1s, e.g. 100ms (the default)",
        )
        return None
    return float(value)


def _journal_size(size_els: list[etree._Element], problems: _Problems) -> int | None:
    """JournalSize (or its other name MinJournalSize; not both), at least 10MB, the
    default when not given; None (and a problem) when wrong."""
    if len(size_els) > 1 and {str(e.tag) for e in size_els} == {"JournalSize", "MinJournalSize"}:
        later = max(size_els, key=lambda e: _line(e) or 0)
        problems.add(
            later,
            "JournalSize and MinJournalSize are the same setting and both are given",
            "keep only one of <JournalSize> and <MinJournalSize>",
        )
        return None
    if not size_els:
        return DEFAULT_JOURNAL_SIZE
    size = _bytes_value(size_els[0], problems)
    if size is not None and size < MIN_JOURNAL_SIZE:
        problems.add(
            size_els[0],
            f"{size_els[0].tag} {_text(size_els[0], problems)} is below the minimum "
            "journal size of 10MB",
            "use 10MB or more; the default is 1GB",
        )
        return None
    return size


def _preallocated_files(log: etree._Element, problems: _Problems) -> int | None:
    """PreallocatedJournalFiles, a whole number of at least 1 (2 when not given); None
    (and a problem) when wrong."""
    prealloc_el = _first(log, "PreallocatedJournalFiles")
    prealloc_text = _text(prealloc_el, problems)
    if prealloc_el is None or prealloc_text is None:
        return DEFAULT_PREALLOCATED_JOURNAL_FILES
    if prealloc_text.isascii() and prealloc_text.isdigit() and int(prealloc_text) >= 1:
        return int(prealloc_text)
    problems.add(
        prealloc_el,
        f"PreallocatedJournalFiles {prealloc_text!r} is not a whole number of at least 1",
        "use a whole number such as 2 (the default)",
    )
    return None


def _map_size(log: etree._Element, problems: _Problems) -> int | None:
    """MapSize in bytes, at least 1MB (64GB when not given); None (and a problem) when
    wrong."""
    map_el = _first(log, "MapSize")
    if map_el is None:
        return DEFAULT_MAP_SIZE
    value_bytes = _bytes_value(map_el, problems)
    if value_bytes is None:
        return None
    if value_bytes < MIN_MAP_SIZE:
        problems.add(
            map_el,
            f"MapSize {_text(map_el, problems)} is too small; the minimum is 1MB",
            "use a size of at least 1MB; the default is 64GB",
        )
        return None
    return value_bytes


def _segment_fits(
    size_els: list[etree._Element], journal_size: int, map_size: int, problems: _Problems
) -> bool:
    """Whether one journal segment fits in the map (false, and a problem, if not)."""
    if journal_size > map_size and size_els:
        problems.add(
            size_els[0],
            f"{size_els[0].tag} ({journal_size} bytes) is larger than MapSize "
            f"({map_size} bytes), so one journal segment could never fit",
            f"lower {size_els[0].tag} or raise MapSize",
        )
        return False
    return True
