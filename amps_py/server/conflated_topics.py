"""Conflated topics (``SOW/ConflatedTopic``): a SOW topic of its own holding the latest
record of each key of an underlying SOW topic, brought up to date once per interval.

How it stays current:

- every commit (and every expiry) that changes keys of the underlying store tells the
  conflated topic which (:meth:`SowState.follow`); it only notes them (:attr:`dirty`);
- every ``Interval``, :meth:`ConflatedTopic.tick` reads the noted keys' current
  records from the underlying store: one that exists and matches the ``Filter`` is
  copied into the conflated store, one that is gone (deleted, expired) or no longer
  matches is removed from it; one write for the lot;
- subscribers to the conflated topic's name get each copied record as a message (its
  SOW key in ``k``, no bookmark: it is not journaled) and, with option ``oof``, an
  ``oof`` (reason ``deleted``) for each removed one. So a key gets at most one update
  per interval, carrying its latest value.

It is derived, never journaled: its store is transient, wiped and filled from the
underlying store at start (:func:`open_conflated`). Queries (``sow``,
``sow_and_subscribe``) read it as any SOW topic; publishes and ``sow_delete`` on it
are refused (they belong to the underlying topic).

A ``sow_and_subscribe`` registers its subscription paused in the step that takes the
snapshot; what ticks produce meanwhile is held for it (:meth:`ConflatedTopic.hold`)
and sent right after the snapshot, before it goes live, so nothing is lost or sent
before the older snapshot record.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from amps_py import events
from amps_py.config.sow_model import ConflatedTopicConfig, SowTopicConfig
from amps_py.filters import Filter, compile_filter
from amps_py.protocol import messages
from amps_py.sow.expiry import is_expired
from amps_py.sow.store import SowEntry, SowStore, SowStoreError

from .sowing import SowState, SowTopic

if TYPE_CHECKING:
    from .delivery import Delivery
    from .subscriptions import Subscription, SubscriptionRegistry

log = logging.getLogger("amps_py.server.sow")


class ConflatedTopic(SowTopic):
    """One conflated topic: a transient store of its own, the underlying SOW topic it
    copies, its filter and the keys changed since the last tick."""

    def __init__(self, config: ConflatedTopicConfig, underlying: SowTopic, store: SowStore) -> None:
        sow_config = SowTopicConfig(
            name=config.name,
            message_type=config.message_type,
            keys=underlying.config.keys,
            durability="transient",
            key_domain=underlying.config.key_domain or underlying.config.name,
        )
        super().__init__(sow_config, store, underlying.clock, underlying.reader)
        self.conflated = config
        self.underlying = underlying
        self.derived_from = underlying.name
        self.interval = config.interval
        self.filter: Filter | None = compile_filter(config.filter) if config.filter else None
        #: keys of the underlying store changed since the last tick
        self.dirty: set[str] = set()
        #: paused sow_and_subscribe subscriptions -> the updates held for them
        self._held: dict[Subscription, list[tuple[SowEntry, bool]]] = {}
        #: ticks run (statistics, tests)
        self.ticks = 0

    def keeps(self, entry: SowEntry | None, now_us: int) -> bool:
        """Whether an underlying record belongs in the conflated topic."""
        if entry is None or is_expired(entry, now_us):
            return False
        if self.filter is None:
            return True
        return bool(self.filter.matches(self.reader.document(entry.payload)))

    def noted(self, keys: list[str]) -> None:
        """Keys of the underlying store changed (:meth:`SowState.follow`)."""
        self.dirty.update(keys)

    def fill(self) -> int:
        """Copy every record of the underlying store it keeps (blocking: at start, in a
        worker thread); returns how many."""
        now_us = self.clock()
        copies: list[SowEntry] = []
        snapshot = self.underlying.store.snapshot()
        try:
            copies = [_copy(e) for e in snapshot if self.keeps(e, now_us)]
        finally:
            snapshot.close()
        self.store.apply(copies, [], 0)
        return len(copies)

    def tick(self) -> tuple[list[SowEntry], list[SowEntry]]:
        """Bring the store up to date with the keys noted since the last tick: (the
        records copied, the records removed). One write."""
        dirty, self.dirty = self.dirty, set()
        self.ticks += 1
        if not dirty:
            return [], []
        now_us = self.clock()
        copies: list[SowEntry] = []
        gone: list[SowEntry] = []
        source = self.underlying.store
        for key in sorted(dirty):
            entry = source.get(key)
            if self.keeps(entry, now_us):
                assert entry is not None
                copies.append(_copy(entry))
                continue
            old = self.store.get(key)
            if old is not None:
                gone.append(old)
        self.store.apply(copies, [g.key for g in gone], 0)
        return copies, gone

    def hold(self, sub: Subscription) -> None:
        """Hold the updates of ticks for paused ``sub`` until :meth:`release`."""
        self._held[sub] = []

    def release(self, sub: Subscription) -> list[tuple[SowEntry, bool]]:
        """The updates held for ``sub`` ((entry, removed) in order); holds no more."""
        return self._held.pop(sub, [])

    def held_for(self, copies: list[SowEntry], gone: list[SowEntry]) -> None:
        """Keep a tick's updates for the paused subscriptions."""
        for updates in self._held.values():
            updates.extend((e, False) for e in copies)
            updates.extend((e, True) for e in gone)


def _copy(entry: SowEntry) -> SowEntry:
    """An underlying record as the conflated store keeps it (it never expires there:
    the underlying topic's expiry removes it at the next tick)."""
    return SowEntry(entry.key, entry.txid, "", entry.correlation_id, entry.ts_us, entry.payload, 0)


def open_conflated(
    state: SowState, configs: tuple[ConflatedTopicConfig, ...]
) -> dict[str, ConflatedTopic]:
    """Open each conflated topic's transient store (under ``<JournalDirectory>/sow/
    conflated/``), fill it from its underlying topic and have it follow that topic
    (blocking: at start, in a worker thread, after the SOW stores caught up)."""
    opened: dict[str, ConflatedTopic] = {}
    for config in configs:
        underlying = state.topics[config.underlying_topic]
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in config.name)
        directory = state.base / "conflated" / safe
        try:
            store = SowStore(directory, config.name, transient=True)
        except SowStoreError as exc:
            if not exc.damaged:
                raise
            shutil.rmtree(directory, ignore_errors=True)
            store = SowStore(directory, config.name, transient=True)
        topic = ConflatedTopic(config, underlying, store)
        copied = topic.fill()
        state.follow(underlying.name, topic.noted)
        opened[config.name] = topic
        log.info(
            "conflated topic %s: %d record(s) copied from SOW topic %s; updated every %gs",
            config.name,
            copied,
            underlying.name,
            config.interval,
            extra=events.extra(events.CONFLATED_TOPIC_FILLED),
        )
    return opened


def deliver(
    topic: ConflatedTopic,
    copies: list[SowEntry],
    gone: list[SowEntry],
    registry: SubscriptionRegistry,
    delivery: Delivery,
) -> None:
    """Send a tick's updates to the live subscriptions of the conflated topic: each
    copied record as a message, each removed one as an ``oof`` (reason ``deleted``)
    to those with option ``oof``; and hold them for paused ``sow_and_subscribe``s."""
    topic.held_for(copies, gone)
    subs = registry.match(topic.name, topic.message_type)
    if not subs:
        return
    for entry in copies:
        delivery.fan_out(
            topic.name,
            entry.payload,
            "",
            0,
            subs,
            entry.correlation_id or None,
            entry.ts_us,
            entry.key,
            topic.message_type,
        )
    if gone:
        send_oofs(topic, gone, [s for s in subs if "oof" in s.options])


def send_oofs(topic: ConflatedTopic, gone: list[SowEntry], subs: list[Subscription]) -> None:
    """``oof`` (reason ``deleted``) for each removed record to each of ``subs`` its
    filter matched."""
    for entry in gone:
        doc: Any = None
        for sub in subs:
            if sub.filter is not None:
                doc = doc if doc is not None else topic.reader.document(entry.payload)
                if not sub.filter.matches(doc):
                    continue
            sub.session.send(
                messages.oof(
                    topic.name,
                    [sub.sub_id],
                    entry.key,
                    "deleted",
                    entry.payload,
                    entry.correlation_id or None,
                )
            )


async def run_conflated(
    topic: ConflatedTopic,
    registry: SubscriptionRegistry,
    delivery: Delivery,
    sleep: Callable[[float], Any] = trio.sleep,
) -> None:
    """Tick ``topic`` every interval and send the updates, until cancelled. A store
    that fails is logged and tried again at the next tick (its keys stay noted)."""
    while True:
        await sleep(topic.interval)
        noted = set(topic.dirty)
        try:
            copies, gone = topic.tick()
        except SowStoreError as exc:
            topic.dirty |= noted
            log.error(
                "conflated topic %s not updated (the next interval tries again): %s",
                topic.name,
                exc,
                extra=events.extra(events.CONFLATED_TOPIC_FAILED),
            )
            continue
        deliver(topic, copies, gone, registry, delivery)
