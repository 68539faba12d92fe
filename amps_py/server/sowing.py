"""State of the World in the server: which topics keep one, their stores, and what a
publish, a commit and a delete do to them (no trio: the session and the publish path
call it synchronously).

SOW state is derived from the journal. Every committed record of a SOW topic, published
here or received by replication, is applied to its topic's store in txid order, in the
same synchronous step that fans it out (:meth:`SowState.apply` from
``PublishPath.on_commit``). So at any point the event loop runs, a store holds exactly
the committed records that were delivered, which is what makes ``sow_and_subscribe``
atomic; replicas build the same state from the same records; and a store that is
missing is rebuilt by applying the journal again (:meth:`SowState.catch_up`).

Record kinds (:class:`txlog.record.Kind`):

- ``PUBLISH``: insert or replace the record of ``Record.sow_key``;
- ``DELTA_PUBLISH``: its payload is the message already merged with the stored one
  (:meth:`SowState.prepare`), stored like a publish;
- ``SOW_DELETE``: ``{"keys": [...]}`` names the records a ``sow_delete`` removed; the
  keys were resolved where the command ran, so every instance removes the same ones.

Expiration (:mod:`amps_py.sow.expiry`): a record of a topic with an ``Expiration``
interval expires that long after its origin time (``Record.origin_ts``, the same on
every instance), so replicas and a rebuild agree. A publish's own lifetime (the ``e``
header, on ``enabled`` and interval topics alike) is **not journaled**: the txlog
record format has no field for it, and hiding it in another field (the SOW key, the
flags) would leak into deliveries (``k``), exports and dumps. So ``e`` is honoured by
the instance that accepted the publish, and kept there in its store (a persistent
store keeps it across restarts); a replica, or a store rebuilt from the journal, gives
that record its topic's interval instead (no expiry on an ``enabled`` topic). Removing
expired records is a local decision from that replicated data
(:mod:`amps_py.server.sow_expiry`), never journaled; reads skip a record whose time
has passed even before it is removed.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from amps_py import events, reasons
from amps_py.config.model import SowTopicConfig
from amps_py.message_types import JSON, MergeError, MessageType, MessageTypes, default_types
from amps_py.protocol.server.commands import CommandFailed
from amps_py.sow.expiry import BadExpiration, expires_at, is_expired, parse_lifetime, wall_clock_us
from amps_py.sow.keys import MAX_KEY_BYTES, SowKeyer, SowKeyError
from amps_py.sow.slots import MatchingSnapshot, TopicRegex, TopicSnapshot, slot_of, split_slot
from amps_py.sow.store import SowEntry, SowSnapshot, SowStore, SowStoreError
from txlog import Journal, Record
from txlog.record import Kind

log = logging.getLogger("amps_py.server.sow")

PUBLISH: Final = int(Kind.PUBLISH)
DELTA_PUBLISH: Final = int(Kind.DELTA_PUBLISH)
SOW_DELETE: Final = int(Kind.SOW_DELETE)

#: records read per journal batch while a store catches up
CATCH_UP_BATCH: Final = 4096


def parse_document(payload: bytes, sow: SowTopic) -> Any:
    """The document of a message for a SOW topic (read by the topic's message type).

    Raises:
        CommandFailed: the payload is not a well-formed message of the topic's type
            (its key cannot be read).
    """
    doc = sow.reader.document(payload)
    if doc is None:
        raise CommandFailed(
            reasons.PARSE_ERROR,
            f"SOW topic {sow.name!r} reads its key from the message, which is not a "
            f"well-formed {sow.reader.name} message: fix the payload",
        )
    return doc


@dataclass
class Removed:
    """Records a commit removed from a SOW topic (their ``oof`` messages go out)."""

    topic: str
    entries: list[SowEntry]
    reason: str


class SowTopic:
    """One SOW topic: its config, its key rule, its store, and the publishes queued for
    it that are not committed yet (a delta merges onto the newest of them).

    ``clock`` gives now in µs since the epoch: a stored record whose expiry time has
    passed is no longer current.
    """

    def __init__(
        self,
        config: SowTopicConfig,
        store: SowStore,
        clock: Callable[[], int] = wall_clock_us,
        reader: MessageType | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        #: the topic's message type (only messages of that type are its records)
        self.message_type = config.message_type
        #: reads and merges payloads of that type (None: the default reader of the type)
        self.reader: MessageType = reader or default_types().get(config.message_type, JSON)
        self.store = store
        self.clock = clock
        self.keyer = SowKeyer(config.name, config.keys, config.key_domain)
        #: key -> the newest record queued for the journal and not committed yet
        self.queued: dict[str, Record] = {}
        #: a stamp of the store failed (said once in the log)
        self.stamp_failed = False
        #: the SOW topic a conflated topic copies (None: a journaled SOW topic)
        self.derived_from: str | None = None

    def key_of(self, header: dict[str, Any], doc: Any) -> str:
        """The SOW key of a message: from its configured Key fields, else the
        publisher's explicit ``k``."""
        if self.config.keys:
            try:
                return self.keyer.key_of(doc)
            except SowKeyError as exc:
                raise CommandFailed(reasons.PARSE_ERROR, str(exc)) from None
        k = header.get("k")
        if not k:
            raise CommandFailed(
                reasons.BAD_SOW_KEY,
                f"SOW topic {self.name!r} has no Key: publish with an explicit SOW key (k)",
            )
        try:
            return self.keyer.explicit_key(str(k))
        except SowKeyError as exc:
            raise CommandFailed(reasons.BAD_SOW_KEY, str(exc)) from None

    @property
    def container(self) -> SowTopic:
        """The SOW topic whose store holds this topic's records (itself, or for a
        topic a Pattern matches, the Pattern topic)."""
        return self

    def slot(self, key: str) -> str:
        """The store key (and :attr:`queued` key) of SOW key ``key`` of this topic."""
        return key

    def stored(self, key: str) -> SowEntry | None:
        """The stored record of ``key`` (expired or not), or None."""
        return self.store.get(key)

    def snapshot(self) -> SowSnapshot | TopicSnapshot:
        """This topic's records as they are now (see :meth:`SowStore.snapshot`)."""
        return self.store.snapshot()

    def count(self) -> int:
        """Records of this topic now."""
        return self.store.count

    def queued_records(self) -> Iterable[tuple[str, Record]]:
        """(SOW key, record) of this topic's records queued for the journal."""
        return self.queued.items()

    def current(self, key: str) -> bytes | None:
        """The newest message of ``key``: queued, else stored and not expired, else None."""
        rec = self.queued.get(self.slot(key))
        if rec is not None:
            return None if rec.kind == SOW_DELETE else rec.payload
        entry = self.stored(key)
        if entry is None or is_expired(entry, self.clock()):
            return None
        return entry.payload

    def lifetime(self, header: dict[str, Any]) -> float | None:
        """The lifetime in seconds a publish asks for with ``e``; None when it gives
        none or the topic's records do not expire (``e`` is then ignored).

        Raises:
            CommandFailed: ``e`` is not a number of seconds above 0.
        """
        if not self.config.expires:
            return None
        try:
            return parse_lifetime(header.get("e"))
        except BadExpiration as exc:
            raise CommandFailed(reasons.INVALID_OPTIONS, str(exc)) from None

    def expires_us(self, record: Record, lifetime: float | None) -> int:
        """When ``record``'s value expires (µs, 0 = never): ``lifetime`` (its ``e``),
        else the topic's ``Expiration`` interval, from the record's origin time."""
        if lifetime is None:
            lifetime = self.config.expiration
        return expires_at(record.origin_ts or record.local_ts, lifetime)


class LogicalTopic(SowTopic):
    """One topic a Pattern SOW topic (:attr:`container`) matches: its settings, key
    rule and store are the container's; its records are the store's slots of this
    topic (:mod:`amps_py.sow.slots`), and its queued publishes share the container's
    :attr:`queued`, by slot."""

    def __init__(self, container: SowTopic, topic: str) -> None:
        self.config = container.config
        self.name = topic
        self.message_type = container.message_type
        self.reader = container.reader
        self.store = container.store
        self.clock = container.clock
        self.keyer = container.keyer
        self.queued = container.queued
        self.stamp_failed = False
        self.derived_from = None
        self._container = container

    @property
    def container(self) -> SowTopic:
        return self._container

    def slot(self, key: str) -> str:
        return slot_of(self.name, key)

    def stored(self, key: str) -> SowEntry | None:
        entry = self.store.get(slot_of(self.name, key))
        if entry is not None:
            entry.key, entry.topic = key, self.name
        return entry

    def snapshot(self) -> TopicSnapshot:
        return TopicSnapshot(self.store.snapshot(), self.name)

    def count(self) -> int:
        """Records of this topic now (one read of its slots)."""
        snapshot = self.snapshot()
        try:
            return sum(1 for _ in snapshot)
        finally:
            snapshot.close()

    def queued_records(self) -> Iterable[tuple[str, Record]]:
        for slot, rec in list(self.queued.items()):
            topic, key = split_slot(slot)
            if topic == self.name:
                yield key, rec


class PatternQuery:
    """A regex query's view of a Pattern SOW topic: the records of every topic it
    holds that ``regex`` matches, each carrying its own topic."""

    def __init__(self, container: SowTopic, regex: TopicRegex) -> None:
        self.container = container
        self.name = container.name
        self.message_type = container.message_type
        self.regex = regex

    def snapshot(self) -> MatchingSnapshot:
        return MatchingSnapshot(self.container.store.snapshot(), self.regex)


class SowSource(Protocol):
    """What a SOW query reads: a SOW topic, a topic of a Pattern SOW topic, or a regex
    query's view of a Pattern SOW topic."""

    @property
    def name(self) -> str: ...

    def snapshot(self) -> SowSnapshot | TopicSnapshot | MatchingSnapshot: ...


#: topics whose SOW topic is remembered (:meth:`SowState.resolve`) before the cache is
#: cleared
RESOLVED_CACHE_LIMIT: Final = 100_000


class SowState:
    """The instance's SOW topics (none when the config has no ``SOW``).

    :attr:`topics` holds one :class:`SowTopic` per ``SOW/Topic`` (by Name), each with
    its store; :meth:`resolve` finds the SOW topic a topic's records belong to: the one
    of that Name without Pattern, else a :class:`LogicalTopic` of the first Pattern
    topic that matches it (in config order).
    """

    def __init__(
        self,
        configs: Sequence[SowTopicConfig],
        journal_directory: Path,
        types: MessageTypes | None = None,
    ) -> None:
        self.configs = tuple(configs)
        #: the instance's message types (SOW keys and deltas read payloads by type)
        self.types = types if types is not None else default_types()
        self.base = journal_directory / "sow"
        self.topics: dict[str, SowTopic] = {}
        #: the newest SOW record queued for the journal (a sow_delete waits for it)
        self.last_queued: Record | None = None
        #: now in µs since the epoch (tests replace it with a fake clock)
        self.clock: Callable[[], int] = wall_clock_us
        #: id(record) -> (record, its ``e`` lifetime) for queued publishes that gave one
        self._lifetimes: dict[int, tuple[Record, float]] = {}
        #: the newest committed txid applied (every store is current through it)
        self.applied_txid = 0
        #: journal records the last :meth:`catch_up` read (statistics, tests)
        self.records_read = 0
        #: the topics without Pattern, by Name
        self._literal: dict[str, SowTopic] = {}
        #: the Pattern topics, in config order
        self._patterns: list[SowTopic] = []
        #: topic -> its SOW topic (None: none), for topics Patterns were tried on
        self._resolved: dict[str, SowTopic | None] = {}
        #: SOW topic Name -> what to tell when its store's keys change (:meth:`follow`)
        self._followers: dict[str, list[Callable[[list[str]], None]]] = {}
        #: the conflated topics, by name (``amps_py.server.conflated_topics``): queried
        #: like SOW topics, never journaled, so never what :meth:`resolve` finds
        self.conflated: dict[str, SowTopic] = {}

    def __bool__(self) -> bool:
        return bool(self.configs)

    def find(self, topic: str) -> SowTopic | None:
        """The SOW topic a query on ``topic`` reads (any message type): a conflated
        topic of that name, else :meth:`resolve`'s."""
        found = self.conflated.get(topic) if self.conflated else None
        return found if found is not None else self.resolve(topic)

    def now_us(self) -> int:
        """Now, by :attr:`clock`."""
        return self.clock()

    @property
    def expiring(self) -> list[SowTopic]:
        """The topics whose records can expire."""
        return [t for t in self.topics.values() if t.config.expires]

    def store_directory(self, config: SowTopicConfig) -> Path:
        if config.file_name is not None:
            return config.file_name
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in config.name)
        return self.base / safe

    def open(self) -> None:
        """Open every topic's store (blocking: run it in a worker thread). A store that
        cannot be read is set aside and rebuilt from the journal, saying so."""
        for config in self.configs:
            directory = self.store_directory(config)
            transient = config.durability == "transient"
            try:
                store = SowStore(directory, config.name, transient=transient)
            except SowStoreError as exc:
                if not exc.damaged:  # locked, a full disk: setting it aside cannot help
                    raise
                aside = directory.with_name(directory.name + ".damaged")
                shutil.rmtree(aside, ignore_errors=True)
                directory.rename(aside)
                log.error(
                    "SOW store of topic %s cannot be read (%s); moved to %s and rebuilt "
                    "from the journal",
                    config.name,
                    exc,
                    aside,
                    extra=events.extra(events.SOW_STORE_REBUILT),
                )
                store = SowStore(directory, config.name, transient=transient)
            reader = self.types.get(config.message_type, JSON)
            topic = SowTopic(config, store, self.now_us, reader)
            self.topics[config.name] = topic
            if config.pattern is None:
                self._literal[config.name] = topic
            else:
                self._patterns.append(topic)

    def stamp(self) -> int:
        """Record in every store that lags :attr:`applied_txid` that it is current
        through it (a store's own records may be older: it saw no record of its topic
        since). A start then reads the journal from there, not from its topic's last
        record. Small writes (no sync, like every store write); returns how many
        stores were stamped. A store that cannot be written is left as it is (a start
        reads more of the journal), and the log says why once."""
        stamped = 0
        for sow in self.topics.values():
            store = sow.store
            if store.applied_txid >= self.applied_txid:
                continue
            try:
                store.apply([], [], self.applied_txid)
            except SowStoreError as exc:
                if not sow.stamp_failed:
                    sow.stamp_failed = True
                    log.warning(
                        "SOW store of topic %s: cannot record that it is current through "
                        "txid %d (%s); a start reads the journal from txid %d",
                        sow.name,
                        self.applied_txid,
                        exc,
                        store.applied_txid,
                        extra=events.extra(events.SOW_STORE_REBUILT),
                    )
                continue
            stamped += 1
        return stamped

    def checkpoint_txids(self) -> dict[str, int]:
        """Per SOW topic with a persistent store, the txid the store is current
        through (journal removal keeps what is after it: a start applies it). A
        transient store is rebuilt from the whole journal at each start anyway."""
        return {
            name: t.store.applied_txid
            for name, t in self.topics.items()
            if t.config.durability != "transient"
        }

    def close(self) -> None:
        """Stamp the stores (:meth:`stamp`) and close them."""
        if self.topics:
            self.stamp()
        for topic in [*self.topics.values(), *self.conflated.values()]:
            topic.store.close()

    def resolve(self, topic: str) -> SowTopic | None:
        """The SOW topic whose records ``topic``'s publishes are (any message type):
        the one without Pattern named ``topic``, else a :class:`LogicalTopic` of the
        first Pattern topic that matches it, else None."""
        found = self._literal.get(topic)
        if found is not None or not self._patterns:
            return found
        resolved = self._resolved
        if topic in resolved:
            return resolved[topic]
        holder = next((p for p in self._patterns if p.config.holds(topic)), None)
        view = None if holder is None else LogicalTopic(holder, topic)
        if len(resolved) >= RESOLVED_CACHE_LIMIT:
            resolved.clear()
        resolved[topic] = view
        return view

    def get(self, topic: str, message_type: str = "json") -> SowTopic | None:
        """The SOW topic ``topic`` of ``message_type`` (a topic of another type is
        another topic: None), as :meth:`resolve` finds it."""
        found = self.find(topic)
        if found is None or found.message_type != message_type:
            return None
        return found

    def matching(self, pattern: Any, topic: str, message_type: str = "json") -> list[SowSource]:
        """What a query on ``topic`` of ``message_type`` reads, in configuration
        order: the SOW topic of ``topic`` (:meth:`get`), or for a regex topic every SOW
        topic without Pattern it matches and a :class:`PatternQuery` of every Pattern
        topic (its records of the topics the regex matches)."""
        if pattern is None:
            found = self.get(topic, message_type)
            return [found] if found is not None else []
        out: list[SowSource] = []
        for t in self.topics.values():
            if t.message_type != message_type:
                continue
            if t.config.pattern is not None:
                out.append(PatternQuery(t, pattern))
            elif pattern.search(t.name):
                out.append(t)
        out.extend(
            t
            for t in self.conflated.values()
            if t.message_type == message_type and pattern.search(t.name)
        )
        return out

    def of_record(self, record: Record) -> SowTopic | None:
        """The SOW topic a journal record belongs to (its topic and message type), or
        None."""
        found = self.resolve(record.topic)
        if found is None or found.message_type != record.message_type:
            return None
        return found

    def removals(self, sow: SowTopic, entries: list[SowEntry], reason: str) -> list[Removed]:
        """``entries`` read from ``sow``'s store (by slot) as :class:`Removed` per
        topic, each entry with its SOW key alone."""
        if sow.config.pattern is None:
            return [Removed(sow.name, entries, reason)]
        by_topic: dict[str, list[SowEntry]] = {}
        for entry in entries:
            topic, entry.key = split_slot(entry.key)
            entry.topic = topic
            by_topic.setdefault(topic, []).append(entry)
        return [Removed(topic, gone, reason) for topic, gone in by_topic.items()]

    # ---------------------------------------------------------------- publishing
    def prepare(
        self, sow: SowTopic, header: dict[str, Any], payload: bytes, delta: bool
    ) -> tuple[int, str, bytes]:
        """(record kind, SOW key, payload to journal) of a publish to ``sow``. A delta
        is merged onto the newest message of its key here, so the merged message is
        what is journaled, replicated and delivered; a delta to no record is an insert.
        """
        reader = sow.reader
        if delta and not reader.supports_delta:
            # as in AMPS: a type without a delta merge stores the delta as the whole
            # message
            delta = False
        doc = parse_document(payload, sow) if sow.config.keys else None
        key = sow.key_of(header, doc)
        if not delta:
            return PUBLISH, key, payload
        stored = sow.current(key)
        if stored is None:
            if not sow.config.keys:
                parse_document(payload, sow)  # a delta must be a well-formed message
            return DELTA_PUBLISH, key, payload
        try:
            return DELTA_PUBLISH, key, reader.merge(stored, payload)
        except MergeError as exc:
            raise CommandFailed(
                reasons.PARSE_ERROR, f"SOW topic {sow.name!r}: delta not merged: {exc}"
            ) from None

    def queued(self, record: Record, lifetime: float | None = None) -> None:
        """``record`` (of a SOW topic) was queued for the journal: until it commits, it
        is the newest message of its key(s) (a delta merges onto it). ``lifetime``:
        the seconds its publish's ``e`` asked for (:meth:`SowTopic.lifetime`)."""
        sow = self.of_record(record)
        if sow is not None:
            for key in _keys_of(record):
                sow.queued[sow.slot(key)] = record
        if lifetime is not None:
            self._lifetimes[id(record)] = (record, lifetime)
        self.last_queued = record

    def forget(self, records: Iterable[Record]) -> None:
        """These queued records will never commit (the commit failed)."""
        for rec in records:
            self._take_lifetime(rec)
            sow = self.of_record(rec)
            if sow is not None:
                for key in _keys_of(rec):
                    slot = sow.slot(key)
                    if sow.queued.get(slot) is rec:
                        del sow.queued[slot]

    def _take_lifetime(self, record: Record) -> float | None:
        """The ``e`` lifetime of a queued record, forgotten (None for any other)."""
        if not self._lifetimes:
            return None
        held = self._lifetimes.pop(id(record), None)
        if held is None:
            return None
        if held[0] is not record:  # another record under a recycled id: not this one's
            self._lifetimes[id(record)] = held
            return None
        return held[1]

    # ---------------------------------------------------------------- applying commits
    def apply(self, records: Sequence[Record]) -> list[Removed]:
        """Apply committed records to their topics' stores (one write per topic);
        return what deletes removed, for ``oof`` messages."""
        by_store: dict[str, list[tuple[SowTopic, Record]]] = {}
        for rec in records:
            sow = self.of_record(rec)
            if sow is not None:
                by_store.setdefault(sow.container.name, []).append((sow, rec))
        removed: list[Removed] = []
        for name, recs in by_store.items():
            container = self.topics[name]
            gone = self._apply_topic(container, recs)
            if gone:
                removed.extend(self.removals(container, gone, "deleted"))
        if records:
            # only once every store took its records: a stamp (stamp(), close()) after
            # a failed write must not mark that store current past what it lacks
            self.applied_txid = max(self.applied_txid, records[-1].txid)
        return removed

    def _apply_topic(
        self, container: SowTopic, records: list[tuple[SowTopic, Record]]
    ) -> list[SowEntry]:
        """Apply ``records`` (each with the SOW topic it belongs to, all kept in
        ``container``'s store) in one write; the entries deletes removed, by slot."""
        upserts: dict[str, SowEntry] = {}
        deletes: dict[str, None] = {}
        gone: list[SowEntry] = []
        store = container.store
        queued = container.queued
        for sow, rec in records:
            slots = [sow.slot(key) for key in _keys_of(rec)]
            for slot in slots:
                if queued.get(slot) is rec:
                    del queued[slot]
            if rec.kind == SOW_DELETE:
                for slot in slots:
                    old = upserts.pop(slot, None) or store.get(slot)
                    if old is not None:
                        gone.append(old)
                        deletes[slot] = None
                continue
            if not rec.sow_key:
                continue  # journaled before the topic kept a SOW: nothing to key it by
            slot = sow.slot(rec.sow_key)
            if not usable_key(slot):  # a forged or damaged record from a peer
                _unreadable(rec, f"its SOW key is {len(rec.sow_key)} characters long")
                continue
            deletes.pop(slot, None)
            expires = sow.expires_us(rec, self._take_lifetime(rec)) if sow.config.expires else 0
            upserts[slot] = SowEntry(
                slot, rec.txid, rec.bookmark, rec.correlation_id, rec.local_ts, rec.payload, expires
            )
        store.apply(list(upserts.values()), list(deletes), records[-1][1].txid)
        self.changed(container, list(upserts) + list(deletes))
        return gone

    def follow(self, name: str, on_change: Callable[[list[str]], None]) -> None:
        """Call ``on_change`` with the store keys of SOW topic ``name`` each time a
        commit or an expiry changes them (a conflated topic over it)."""
        self._followers.setdefault(name, []).append(on_change)

    def changed(self, container: SowTopic, slots: list[str]) -> None:
        """``slots`` of ``container``'s store changed: tell who follows it."""
        for on_change in self._followers.get(container.name, ()):
            on_change(slots)

    def expire(self, sow: SowTopic, now_us: int, limit: int) -> list[SowEntry]:
        """Remove up to ``limit`` records of ``sow`` whose expiry time is at or before
        ``now_us``, soonest first; return them (for ``oof`` messages). One write; not
        journaled (every instance removes them by itself), so the store's applied txid
        stays where it is."""
        store = sow.store
        gone = store.expired(now_us, limit)
        if gone:
            slots = [e.key for e in gone]
            store.apply([], slots, store.applied_txid)
            self.changed(sow, slots)
        return gone

    def catch_up(self, journal: Journal) -> int:
        """Apply the journal records each store has not applied yet (blocking: at
        startup, in a worker thread); returns how many records were applied."""
        if not self.topics:
            return 0
        for sow in self.topics.values():
            if sow.store.applied_txid > journal.last_txid:
                # the journal lost a tail (a machine crash) the store had applied
                log.warning(
                    "SOW store of topic %s has applied txid %d but the journal ends at %d; "
                    "rebuilding it from the journal",
                    sow.name,
                    sow.store.applied_txid,
                    journal.last_txid,
                    extra=events.extra(events.SOW_STORE_REBUILT),
                )
                sow.store.clear()
        start = min(t.store.applied_txid for t in self.topics.values())
        applied = 0
        read = 0
        after = start
        while True:
            batch = journal.read(after, CATCH_UP_BATCH)
            if not batch:
                break
            after = batch[-1].txid
            read += len(batch)
            fresh = []
            for rec in batch:
                owner = self.of_record(rec)
                if owner is not None and rec.txid > owner.store.applied_txid:
                    fresh.append(rec)
            if fresh:
                self.apply(fresh)
                applied += len(fresh)
        self.applied_txid = max(after, start)
        self.records_read = read
        log.info(
            "SOW: read %d journal record(s) past the stores' txid %d and applied %d to the "
            "stores of %s",
            read,
            start,
            applied,
            ", ".join(self.topics),
            extra=events.extra(events.SOW_STORE_REBUILT),
        )
        return applied

    def statistics(self) -> dict[str, dict[str, int]]:
        return {
            name: {
                "records": t.store.count,
                "bytes": t.store.bytes,
                "file_bytes": t.store.file_bytes,
                "applied_txid": t.store.applied_txid,
            }
            for name, t in [*self.topics.items(), *self.conflated.items()]
        }


def _keys_of(record: Record) -> list[str]:
    """The SOW keys a record changes."""
    if record.kind == SOW_DELETE:
        return _delete_keys(record)
    return [record.sow_key] if record.sow_key else []


def usable_key(key: str) -> bool:
    """Can ``key`` name a record in a store (not empty, at most LMDB's key size)?"""
    return 0 < len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES


def _unreadable(record: Record, why: str) -> None:
    log.error(
        "SOW record %s (txid %d, topic %.80r) cannot be applied and is left out of the "
        "State of the World: %s",
        record.bookmark,
        record.txid,
        record.topic,
        why,
        extra=events.extra(events.SOW_RECORD_UNREADABLE),
    )


def _delete_keys(record: Record) -> list[str]:
    """The keys a SOW delete record names (a damaged or forged one names none)."""
    try:
        keys = orjson.loads(record.payload).get("keys", [])
    except (orjson.JSONDecodeError, AttributeError):
        keys = None
    if not isinstance(keys, list) or not all(isinstance(k, str) and usable_key(k) for k in keys):
        _unreadable(record, 'its payload is not {"keys": [SOW keys]}; nothing removed')
        return []
    return keys
