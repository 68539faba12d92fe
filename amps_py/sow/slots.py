"""Many logical topics in one store: the keys of a Pattern SOW topic's store.

A SOW topic with ``Pattern`` keeps every topic the pattern matches in one
:class:`~amps_py.sow.store.SowStore`, a record per (topic, SOW key). Its LMDB key (a
*slot*) is the topic's length, ``:``, the topic and the SOW key: ``6:orders42`` is
key ``42`` of topic ``orders``. The length makes the split unambiguous whatever the
topic or key holds, and keeps each topic's records together in key order, so one
topic is read by a range scan from its prefix.

The views here turn a snapshot of such a store back into records of their topics:
:class:`TopicSnapshot` (one topic) and :class:`MatchingSnapshot` (every topic a
regular expression matches). Each yields entries with the SOW key alone in
``key`` and the topic in ``topic``. Pure: no trio, no I/O beyond the snapshot's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from .entry import SowEntry
from .store import SowSnapshot


def slot_prefix(topic: str) -> str:
    """The prefix every slot of ``topic`` starts with (and no other topic's does)."""
    return f"{len(topic)}:{topic}"


def slot_of(topic: str, key: str) -> str:
    """The store key of SOW key ``key`` of ``topic``."""
    return f"{len(topic)}:{topic}{key}"


def split_slot(slot: str) -> tuple[str, str]:
    """(topic, SOW key) of a slot.

    Raises:
        ValueError: ``slot`` is not one :func:`slot_of` makes (a damaged store).
    """
    length, colon, rest = slot.partition(":")
    if not colon or not length.isdigit() or int(length) > len(rest):
        raise ValueError(f"SOW store key {slot[:80]!r} names no topic")
    size = int(length)
    return rest[:size], rest[size:]


def as_record(entry: SowEntry) -> SowEntry:
    """``entry`` (read under its slot) with its topic and SOW key apart."""
    entry.topic, entry.key = split_slot(entry.key)
    return entry


class TopicRegex(Protocol):
    """What a regex topic offers (a compiled pattern, or one limited by entitlement)."""

    def search(self, topic: str) -> object: ...


class TopicSnapshot:
    """The records of one topic in a snapshot of a Pattern topic's store.

    :attr:`count` is the number of records iterated so far: read it once the
    iteration is done (it is the topic's record count then).
    """

    def __init__(self, snapshot: SowSnapshot, topic: str) -> None:
        self._snapshot = snapshot
        self.topic = topic
        self.count = 0

    def __iter__(self) -> Iterator[SowEntry]:
        prefix = slot_prefix(self.topic)
        self.count = 0
        for entry in self._snapshot.iter_from(prefix):
            if not entry.key.startswith(prefix):
                return
            self.count += 1
            entry.key = entry.key[len(prefix) :]
            entry.topic = self.topic
            yield entry

    def get(self, key: str) -> SowEntry | None:
        entry = self._snapshot.get(slot_of(self.topic, key))
        return None if entry is None else as_record(entry)

    def close(self) -> None:
        self._snapshot.close()


class MatchingSnapshot:
    """The records of every topic ``regex`` matches in a snapshot of a Pattern topic's
    store, topic by topic. :attr:`count`: records of those topics iterated so far."""

    def __init__(self, snapshot: SowSnapshot, regex: TopicRegex) -> None:
        self._snapshot = snapshot
        self._regex = regex
        self.count = 0

    def __iter__(self) -> Iterator[SowEntry]:
        self.count = 0
        verdicts: dict[str, bool] = {}
        for entry in self._snapshot:
            as_record(entry)
            wanted = verdicts.get(entry.topic)
            if wanted is None:
                wanted = verdicts[entry.topic] = bool(self._regex.search(entry.topic))
            if wanted:
                self.count += 1
                yield entry

    def close(self) -> None:
        self._snapshot.close()
