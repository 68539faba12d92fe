"""Message queues on this instance: subscriptions, deliveries, acknowledgements.

A queue is derived from the journal like a SOW topic. Every committed publish on its
underlying topic (published here or replicated in) enters it in txid order
(:meth:`QueueBook.on_commit`). An acknowledgement or an expiry leaves it as a journaled
``QUEUE_ACK`` record naming the bookmarks, so every queue host removes the same
messages. Leases, delivery counts and cancel counts live only here, as in AMPS.

**Checkpoints.** What the committed records did to each queue is collected
(:class:`~.queue_checkpoint.Changes`) and written about once a second, off the event
loop, to the queue's checkpoint (:mod:`.queue_checkpoint`) with the txid it covers
(:meth:`QueueBook.checkpoint`). A start loads the checkpoint and applies only the
journal records after it (:meth:`QueueBook.open`); a missing, damaged or stale one
(the queue's definition changed) is rebuilt from the journal, saying so.

**Memory.** A queued message is kept compact: its identity and delivery state
(:class:`~amps_py.queue.QueueMessage`), not its data. Its payload is held only while
the queue is shallow (:data:`PAYLOAD_IN_MEMORY`); deeper, and for every message loaded
from a checkpoint, it is read from the journal record when the message is sent.

**Confirmed acks are durable.** A consumer's ``processed`` ack for an acknowledgement
is sent once the ``QUEUE_ACK`` record is committed (synced with the writer's next
group commit), so an acknowledgement the server confirmed survives a crash.

The delivery rules are the pure core's (:mod:`amps_py.queue`). This module connects it
to sessions:

* a ``subscribe`` to a queue's name without a bookmark is a queue subscription
  (:func:`subscribe_to_queue`); its ack reports the effective ``max_backlog``;
* after anything that may free a delivery, the queue is *pumped*: the core says which
  message goes to which subscription and the session sends it, with its bookmark
  (what the subscriber acknowledges) and ``lp``, the lease's expiry;
* ``sow_delete`` on a queue acknowledges (:func:`acknowledge`): by ``bm`` (a
  comma-separated list of bookmarks, with option ``cancel`` or ``expire``) or by
  filter;
* an unsubscribe or a disconnect returns the subscription's leases to the queue;
* :meth:`QueueBook.run` sleeps until the next lease or message expiry, expires what is
  due (journaling expiries and running ``amps-action-on-sow-expire-message``) and
  pumps again.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from amps_py import events, offload
from amps_py.config import QueueConfig
from amps_py.filters import compile_expression
from amps_py.message_types import JSON, MessageTypes, default_types
from amps_py.protocol import messages
from amps_py.queue import QueueMessage, QueuePolicy, QueueState, QueueSub
from txlog import BadBookmark, CorruptRecord, Journal, Kind, Record, parse_bookmark

from .queue_checkpoint import (
    Changes,
    CheckpointDamaged,
    CheckpointError,
    QueueCheckpoint,
    row_of,
    set_aside,
)
from .recipient import Recipient

if TYPE_CHECKING:
    from amps_py.filters import Filter

    from .subscriptions import Subscription

log = logging.getLogger("amps_py.server.queues")

__all__ = ["QUEUE_ACK", "QueueBook", "ServedQueue"]

QUEUE_ACK: Final = int(Kind.QUEUE_ACK)
QUEUE_TRANSFER: Final = int(Kind.QUEUE_TRANSFER)
#: how often an instance with idle queue subscribers looks for messages to ask for
TRANSFER_INTERVAL: Final = 0.1
#: how long a message must have waited before it is asked for, until acks have shown
#: the queue's typical arrival-to-ack time
DEFAULT_ACK_TIME: Final = 0.5
#: a request the owner did not answer may be repeated after this long
REQUEST_RETRY: Final = 2.0
#: weight of each new arrival-to-ack sample in the queue's typical time
ACK_TIME_WEIGHT: Final = 0.1
_MESSAGE_KINDS: Final = frozenset({int(Kind.PUBLISH), int(Kind.DELTA_PUBLISH)})
#: journal records read per step when a queue is rebuilt at start
REBUILD_BATCH: Final = 4096
#: a message keeps its payload in memory when it enters a queue holding fewer
#: messages than this; deeper ones are read from the journal when sent (so the
#: payloads in memory are at most this many per queue)
PAYLOAD_IN_MEMORY: Final = 1000
#: how often the queues' checkpoints are written (seconds)
CHECKPOINT_INTERVAL: Final = 1.0
#: a checkpoint that only moves its txid is written once the journal moved this far
CHECKPOINT_TXIDS: Final = 10_000

#: called once the record of an acknowledgement commits: (stored?, failure detail)
Committed = Callable[[bool, str], None]


def queue_definition(config: QueueConfig, instance_name: str) -> str:
    """What decides which journal records enter the queue and how (its checkpoint is
    useless under another): the underlying topic, the Filter, Priority and
    BarrierExpression, the ownership rule, and this instance's name."""
    return "\n".join(
        (
            config.underlying_topic,
            config.filter or "",
            config.priority or "",
            config.barrier_expression or "",
            config.kind,
            config.initial_owner or "",
            instance_name,
        )
    )


def queue_policy(config: QueueConfig) -> QueuePolicy:
    """The core's delivery rules from the queue's configuration."""
    return QueuePolicy(
        semantics=config.semantics,
        lease_period=config.lease_period,
        max_backlog=config.max_backlog,
        max_per_subscription_backlog=config.max_per_subscription_backlog,
        expiration=config.expiration,
        max_deliveries=config.max_deliveries,
        max_cancels=config.max_cancels,
        leasing=config.leasing,
        fairness=config.fairness,
        kind=config.kind,
    )


def ack_payload(bookmarks: Iterable[str], reason: str) -> bytes:
    """The payload of a ``QUEUE_ACK`` record: the bookmarks it removes and why
    (``ack``, ``expire``, ``sent``: an at-most-once delivery)."""
    return orjson.dumps({"bookmarks": list(bookmarks), "reason": reason})


def transfer_payload(op: str, bookmarks: Iterable[str], to: str) -> bytes:
    """The payload of a ``QUEUE_TRANSFER`` record: a ``request`` by instance ``to``
    for the messages ``bookmarks``, or the owner's ``grant`` of them to ``to``."""
    return orjson.dumps({"op": op, "bookmarks": list(bookmarks), "to": to})


def parse_transfer_payload(payload: bytes) -> tuple[str, list[str], str] | None:
    """(op, bookmarks, to) of a ``QUEUE_TRANSFER`` record; None when the payload is not
    one (a forged or damaged record: the caller logs it and leaves it out)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    op, marks, to = doc.get("op"), doc.get("bookmarks"), doc.get("to")
    if op not in ("request", "grant") or not isinstance(to, str) or not to:
        return None
    if not isinstance(marks, list) or not all(isinstance(m, str) for m in marks):
        return None
    return op, marks, to


def parse_ack_payload(payload: bytes) -> list[str] | None:
    """The bookmarks a ``QUEUE_ACK`` record removes; None when the payload is not one
    (a forged or damaged record: the caller logs it and leaves it out)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    marks = doc.get("bookmarks") if isinstance(doc, dict) else None
    if not isinstance(marks, list) or not all(isinstance(m, str) for m in marks):
        return None
    return marks


@dataclass(eq=False)
class QueueSubscriber:
    """What a queue subscription needs to be sent a message (the core's
    ``QueueSub.context``)."""

    session: Recipient
    subscription: Subscription
    filter: Filter | None
    head: bytes


class ServedQueue:
    """One queue on this instance: its configuration, its core state and the sessions
    subscribed to it."""

    def __init__(
        self,
        config: QueueConfig,
        instance_name: str,
        compile_filter: Callable[[str], Filter],
        types: MessageTypes | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        #: reads a payload of the queue's message type for its Filter, Priority,
        #: BarrierExpression and its subscribers' filters
        self.document = (types or default_types()).get(config.message_type, JSON).document
        self.instance_name = instance_name
        self.filter = compile_filter(config.filter) if config.filter else None
        self.barrier = (
            compile_filter(config.barrier_expression) if config.barrier_expression else None
        )
        self.priority = compile_expression(config.priority) if config.priority else None
        self._parsed_message: QueueMessage | None = None
        self._parsed_doc: Any = None
        self.state = QueueState(queue_policy(config), instance_name, self.matches)
        self.head = messages.topic_head(config.name)
        #: the typical arrival-to-ack time (seconds; None until an ack was seen)
        self.ack_time: float | None = None
        #: requester side: bookmark -> when this instance asked its owner for it
        self.requested: dict[str, float] = {}
        #: owner side: messages a transfer request was received for (only the first
        #: request for a message may be granted)
        self.asked: set[str] = set()
        #: proxied transfer (admin, actions; off by default, not kept across a
        #: restart): this instance claims messages whose owner is not reachable
        self.proxied_transfer = False
        #: messages this instance claimed by proxied transfer
        self.proxied_claims = 0
        #: messages delivered here (leased) whose ownership another instance took by
        #: proxied transfer meanwhile: each may be processed twice
        self.proxied_conflicts = 0
        #: what committed records did since the last checkpoint (None: no checkpoint)
        self.changes: Changes | None = None
        self.checkpoint: QueueCheckpoint | None = None
        #: the journal record of a message whose payload is not held in memory
        self.read_record: Callable[[int], Record | None] | None = None
        #: bookmark -> txid of messages removed here whose QUEUE_ACK has not committed
        self.removed_here: dict[str, int] = {}
        #: while opening: records at or below this txid are in the loaded checkpoint
        self.floor = 0
        self._owners: dict[str, str] = {}

    @property
    def min_wait(self) -> float:
        """How long a message must have waited here before this instance asks its
        owner for it: the typical arrival-to-ack time."""
        return DEFAULT_ACK_TIME if self.ack_time is None else self.ack_time

    def note_acked(self, gone: Iterable[QueueMessage], now: float) -> None:
        """Messages acknowledged (here or by a peer): their arrival-to-ack times feed
        the queue's typical time."""
        for message in gone:
            sample = max(0.0, now - message.arrived_at)
            if self.ack_time is None:
                self.ack_time = sample
            else:
                self.ack_time += ACK_TIME_WEIGHT * (sample - self.ack_time)
            self.requested.pop(message.bookmark, None)
            self.asked.discard(message.bookmark)

    def matches(self, sub: QueueSub, message: QueueMessage) -> bool:
        """Whether queue subscription ``sub`` wants ``message`` (its filter)."""
        subscriber: QueueSubscriber = sub.context
        flt = subscriber.filter
        if flt is None:
            return True
        # the core asks about one message for several subscriptions in a row: parse
        # its payload once for them, not once per subscription
        if message is not self._parsed_message:
            try:
                payload = self.payload_of(message)
            except CorruptRecord:
                return True  # delivered to find out: the send drops it, saying why
            self._parsed_message, self._parsed_doc = message, self.document(payload)
        return flt.matches(self._parsed_doc)

    def payload_of(self, message: QueueMessage) -> bytes:
        """The data of ``message``: held in memory, or read from its journal record.

        Raises:
            CorruptRecord: the journal record is damaged, or gone (journal removal
                keeps what a queue holds, so only damage or an offline removal can
                take it).
        """
        payload = message.payload
        if payload is not None:
            return payload
        read = self.read_record
        record = read(message.txid) if read is not None else None
        if record is None:
            raise CorruptRecord(
                message.txid,
                f"queue {self.name}: the journal no longer holds the record of message "
                f"{message.bookmark}",
            )
        return record.payload

    def owner_of(self, record: Record) -> str:
        """Who owns a new message: the instance the client published to (a
        distributed queue), the configured InitialOwner (group-local), or this
        instance (local)."""
        if self.config.kind == "group-local":
            return self.config.initial_owner or self.instance_name
        if self.config.kind == "local":
            return self.instance_name
        return record.origin or self.instance_name

    def admit(self, record: Record, now: float | None) -> bool:
        """Enter a committed publish of the underlying topic, if the queue's Filter
        takes it; returns whether it entered."""
        if record.txid <= self.floor or record.bookmark in self.state:
            return False
        doc = None  # parsed once, only when a Filter, BarrierExpression or Priority reads it
        if self.filter is not None or self.barrier is not None or self.priority is not None:
            doc = self.document(record.payload)
        if self.filter is not None and not self.filter.matches(doc):
            return False
        owner = self.owner_of(record)
        message = QueueMessage(
            record.txid,
            record.bookmark,
            record.payload if len(self.state) < PAYLOAD_IN_MEMORY else None,
            record.correlation_id,
            (record.origin_ts or record.local_ts) / 1e6,
            self._owners.setdefault(owner, owner),  # one string per owner
            priority_of(self.priority.value(doc)) if self.priority else 0,
            self.barrier is not None and self.barrier.matches(doc),
        )
        self.state.add(message, now)
        if self.changes is not None:
            self.changes.admit(row_of(message))
        return True

    def seconds_behind(self, now: float) -> float:
        """How long (seconds) the oldest message still in the queue (first in txid
        order, waiting or leased) has been in it: since it arrived here, or since it
        was published for one rebuilt from the journal at start; 0 when the queue is
        empty. What the admin API and ``amps_queue_seconds_behind`` show."""
        first = next(self.state.messages(), None)
        if first is None:
            return 0.0
        return max(now - (first.arrived_at or first.published_at), 0.0)

    def take_changes(self, through_txid: int, *, always: bool = False) -> Changes | None:
        """The changes since the last checkpoint, to be written as one through
        ``through_txid``; None when there is nothing worth writing yet: no change, and
        the journal moved less than :data:`CHECKPOINT_TXIDS` (``always``: whenever it
        moved at all). The queue collects afresh from here."""
        cp, changes = self.checkpoint, self.changes
        if cp is None or changes is None or through_txid <= cp.applied_txid:
            return None
        if not (changes or always) and through_txid - cp.applied_txid < CHECKPOINT_TXIDS:
            return None
        self.changes = Changes()
        return changes


def priority_of(value: object) -> int:
    """A message's priority from its Priority expression's value: a whole number of 0
    or more (AMPS: an unsigned integer); anything else (NULL, text, negative) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return max(0, int(value))


class QueueBook:
    """The queues of this instance, by name, and the hooks the rest of the server
    calls."""

    def __init__(
        self,
        configs: Iterable[QueueConfig],
        instance_name: str,
        compile_filter: Callable[[str], Filter],
        journal: Callable[[str, bytes, int, Committed | None], None],
        on_expired: Callable[[ServedQueue, QueueMessage], None] | None = None,
        reachable: Callable[[], set[str]] | None = None,
        types: MessageTypes | None = None,
    ) -> None:
        """Args:
        configs: the configured queues.
        instance_name: this instance's name (message ownership).
        compile_filter: the instance's filter cache.
        journal: journals a queue record (queue name, payload, kind: ``QUEUE_ACK`` or
            ``QUEUE_TRANSFER``, and what to call once it is committed, or None).
        on_expired: told of each message this instance expires (the action hook).
        reachable: the instances known reachable through replication now (for proxied
            transfer; None: none is).
        types: the instance's message types (None: the defaults).
        """
        self.queues = {
            c.name: ServedQueue(c, instance_name, compile_filter, types) for c in configs
        }
        self._journal = journal
        self._on_expired = on_expired
        self._reachable = reachable or set
        self._by_topic: dict[str | tuple[str, str], tuple[ServedQueue, ...]] = {}
        self._wake = trio.Event()
        self.clock: Callable[[], float] = time.time
        self.journal: Journal | None = None
        #: the newest committed txid applied to the queues
        self.applied_txid = 0
        #: at the last open: journal records read, messages loaded from checkpoints
        self.records_read = 0
        self.messages_loaded = 0
        self._checkpoint_warned = -1e9

    def __bool__(self) -> bool:
        return bool(self.queues)

    def get(self, name: str, message_type: str | None = None) -> ServedQueue | None:
        """The queue ``name``; with ``message_type``, only when the queue is of that
        type (a topic of another type is another topic, not the queue)."""
        queue = self.queues.get(name)
        if queue is not None and message_type not in (None, queue.config.message_type):
            return None
        return queue

    def fed_by(self, topic: str, message_type: str = "json") -> tuple[ServedQueue, ...]:
        """The queues whose underlying topic is ``topic`` of ``message_type`` (cached
        per topic and type)."""
        key = topic if message_type == "json" else (message_type, topic)
        found = self._by_topic.get(key)
        if found is None:
            found = tuple(
                q
                for q in self.queues.values()
                if q.config.message_type == message_type and q.config.covers(topic)
            )
            if len(self._by_topic) > 100_000:
                self._by_topic.clear()
            self._by_topic[key] = found
        return found

    # ---------------------------------------------------------------- the journal
    def rebuild(self, read: Callable[[int, int], list[Record]], after: int = 0) -> int:
        """Apply the journal to every queue (at start, before anything commits):
        ``read(after_txid, limit)`` returns the next records, from ``after``. Returns
        how many records were read."""
        if not self.queues:
            return 0
        count = 0
        while True:
            batch = read(after, REBUILD_BATCH)
            if not batch:
                break
            after = batch[-1].txid
            count += len(batch)
            self._apply(batch, now=None)
        self.applied_txid = max(self.applied_txid, after)
        return count

    def open(self, journal: Journal, directory: Path) -> int:
        """Load every queue from its checkpoint under ``directory`` and apply the
        journal records after it (blocking: at start, in a worker thread, before
        anything commits). A checkpoint that is missing, damaged, stale (the queue's
        definition changed) or ahead of the journal (the journal lost a tail) is
        rebuilt from the journal, and the log says why. Returns how many journal
        records were read.

        Raises:
            CheckpointError: a checkpoint cannot be opened for another reason than
                damage (its directory is not writable, another process holds it).
        """
        self.journal = journal
        # hundreds of thousands of long-lived objects: a collection every few hundred
        # of them would rescan the ones before (a third of the load time)
        gc.disable()
        try:
            for queue in self.queues.values():
                queue.read_record = journal.get
                queue.changes = Changes()
                queue.checkpoint = self._load(queue, journal, directory / _safe_name(queue.name))
        finally:
            gc.enable()
        if not self.queues:
            return 0
        self.messages_loaded = sum(len(q.state) for q in self.queues.values())
        start = min(q.floor for q in self.queues.values())
        self.applied_txid = start
        read = self.records_read = self.rebuild(journal.read, start)
        for queue in self.queues.values():
            queue.floor = 0
        depth = sum(len(q.state) for q in self.queues.values())
        log.info(
            "queues %s: %d message(s) waiting; read %d journal record(s) past the "
            "checkpoints (txid %d to %d)",
            ", ".join(self.queues),
            depth,
            read,
            start,
            self.applied_txid,
            extra=events.extra(events.QUEUES_REBUILT),
        )
        return read

    def _load(self, queue: ServedQueue, journal: Journal, directory: Path) -> QueueCheckpoint:
        """Open ``queue``'s checkpoint and fill the queue from it (``queue.floor``: the
        txid it covers); an unusable one is emptied (or set aside) first, saying why."""
        definition = queue_definition(queue.config, queue.instance_name)
        try:
            cp = QueueCheckpoint(directory, queue.name, definition)
        except CheckpointDamaged as exc:
            aside = set_aside(directory)
            log.error(
                "queue %s: its checkpoint cannot be used (%s); moved to %s, and the queue "
                "is rebuilt from the journal",
                queue.name,
                exc,
                aside,
                extra=events.extra(events.QUEUES_REBUILT),
            )
            cp = QueueCheckpoint(directory, queue.name, definition)
        why = cp.stale
        if not why and cp.applied_txid > journal.last_txid:
            why = (
                f"it covers the journal through txid {cp.applied_txid} but the journal ends "
                f"at {journal.last_txid} (the journal lost a tail)"
            )
        elif not why and cp.applied_txid and cp.applied_txid + 1 < journal.first_txid():
            why = (
                f"journal records after it were removed (it covers txid {cp.applied_txid}, "
                f"the journal starts at {journal.first_txid()})"
            )
        if not why and cp.applied_txid:
            try:
                queue.state.restore(cp.messages())
                queue.floor = cp.applied_txid
            except (CheckpointDamaged, ValueError) as exc:
                why = f"it is damaged ({exc})"
                queue.state = QueueState(
                    queue_policy(queue.config), queue.instance_name, queue.matches
                )
        if why:
            log.warning(
                "queue %s: its checkpoint is not used: %s; the queue is rebuilt from the journal",
                queue.name,
                why,
                extra=events.extra(events.QUEUES_REBUILT),
            )
            cp.clear()
        elif cp.applied_txid:
            log.info(
                "queue %s: loaded %d message(s) from its checkpoint at txid %d",
                queue.name,
                len(queue.state),
                cp.applied_txid,
                extra=events.extra(events.QUEUES_REBUILT),
            )
        return cp

    async def run_checkpoints(self) -> None:
        """Write the queues' checkpoints every :data:`CHECKPOINT_INTERVAL` (runs until
        cancelled)."""
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL)
            await self.checkpoint()

    async def checkpoint(self) -> int:
        """Write what changed in each queue since its last checkpoint, as of the newest
        commit applied, in a worker thread. A write that fails leaves the previous
        checkpoint; its changes are kept for the next one. Returns how many
        checkpoints were written."""
        through = self.applied_txid
        jobs = [
            (q, ch) for q in self.queues.values() if (ch := q.take_changes(through)) is not None
        ]
        if not jobs:
            return 0
        failed = await offload.run_sync(self._write_checkpoints, through, jobs)
        for queue, changes in failed:
            queue.changes = changes.then(queue.changes or Changes())
        return len(jobs) - len(failed)

    def close(self) -> None:
        """Write the last checkpoints (blocking: at a clean stop, after the last
        commit) and close them."""
        through = self.applied_txid
        jobs = [
            (q, ch)
            for q in self.queues.values()
            if (ch := q.take_changes(through, always=True)) is not None
        ]
        if jobs:
            self._write_checkpoints(through, jobs)
        for queue in self.queues.values():
            if queue.checkpoint is not None:
                queue.checkpoint.close()
                queue.checkpoint = None

    def _write_checkpoints(
        self, through: int, jobs: list[tuple[ServedQueue, Changes]]
    ) -> list[tuple[ServedQueue, Changes]]:
        failed = []
        for queue, changes in jobs:
            assert queue.checkpoint is not None
            try:
                queue.checkpoint.write(through, changes, self._txid_of)
            except CheckpointError as exc:
                failed.append((queue, changes))
                now = time.monotonic()
                if now - self._checkpoint_warned >= 60:
                    self._checkpoint_warned = now
                    log.warning(
                        "queue %s: %s (a start reads the journal from the last checkpoint "
                        "written, txid %d)",
                        queue.name,
                        exc,
                        queue.checkpoint.applied_txid,
                        extra=events.extra(events.QUEUES_REBUILT),
                    )
        return failed

    def _txid_of(self, bookmark: str) -> int | None:
        """The local txid of the message ``bookmark`` (the journal's index)."""
        if self.journal is None:
            return None
        try:
            pub_hash, seq = parse_bookmark(bookmark)
        except BadBookmark:
            return None
        return self.journal.lookup_bookmark(pub_hash, seq)

    def checkpoint_txids(self) -> dict[str, int]:
        """Per queue, the txid its checkpoint covers (journal removal keeps what is
        after it: a start applies those records)."""
        return {
            name: q.checkpoint.applied_txid
            for name, q in self.queues.items()
            if q.checkpoint is not None
        }

    def on_commit(self, records: list[Record]) -> None:
        """Committed records (txid order): publishes enter the queues their topic
        feeds, acks and expiries leave; then every queue that changed is pumped. Then
        the acknowledgements waiting for these records are confirmed."""
        changed = self._apply(records, self.clock())
        self.applied_txid = records[-1].txid
        for queue in changed:
            self.pump(queue)

    def _apply(self, records: Iterable[Record], now: float | None) -> dict[ServedQueue, None]:
        changed: dict[ServedQueue, None] = {}  # in the order met (not by address)
        for rec in records:
            kind = rec.kind
            if kind in _MESSAGE_KINDS:
                for queue in self.fed_by(rec.topic, rec.message_type):
                    if queue.admit(rec, now):
                        changed[queue] = None
            elif kind == QUEUE_ACK:
                acked = self.queues.get(rec.topic)
                if acked is None:
                    continue
                marks = parse_ack_payload(rec.payload)
                if marks is None:
                    log.warning(
                        "queue %s: journal record %d is not a queue acknowledgement "
                        "(its payload names no bookmarks); left out",
                        rec.topic,
                        rec.txid,
                        extra=events.extra(events.QUEUE_RECORD_UNREADABLE),
                    )
                    continue
                if rec.txid <= acked.floor:
                    continue
                removed = acked.state.apply_removed(marks)
                if now is not None:
                    acked.note_acked(removed, now)
                changes = acked.changes
                if changes is not None:
                    known = {m.bookmark: m.txid for m in removed}
                    here = acked.removed_here
                    for mark in marks:
                        changes.remove(mark, known.get(mark) or here.pop(mark, 0))
                changed[acked] = None
            elif kind == QUEUE_TRANSFER:
                moved = self.queues.get(rec.topic)
                if moved is None or rec.txid <= moved.floor:
                    continue
                if self._apply_transfer(moved, rec, now):
                    changed[moved] = None
        return changed

    def _apply_transfer(self, queue: ServedQueue, rec: Record, now: float | None) -> bool:
        """A committed ownership record: a grant moves the messages to their new
        owner on every host; a request is answered by the owner (live only: at a
        rebuild, requests are history). Returns whether the queue may deliver more."""
        parsed = parse_transfer_payload(rec.payload)
        if parsed is None:
            log.warning(
                "queue %s: journal record %d is not a queue transfer (its payload is not "
                "a request or grant naming bookmarks and an instance); left out",
                rec.topic,
                rec.txid,
                extra=events.extra(events.QUEUE_RECORD_UNREADABLE),
            )
            return False
        op, marks, to = parsed
        if op == "grant":
            conflicts = []
            for mark in marks:
                message = queue.state.get(mark)
                if message is not None and message.lease is not None and to != queue.instance_name:
                    # an owner never grants what it leased: only a proxied claim does
                    conflicts.append(mark)
                queue.state.transfer(mark, to)
                queue.requested.pop(mark, None)
                if queue.changes is not None:
                    queue.changes.transfer(mark, to)
            if conflicts:
                queue.proxied_conflicts += len(conflicts)
                log.warning(
                    "queue %s: %s took over %d message(s) delivered here and not yet "
                    "acknowledged (proxied transfer while this instance was unreachable): "
                    "each may be processed twice; bookmarks %s",
                    queue.name,
                    to,
                    len(conflicts),
                    ", ".join(conflicts[:10]) + (" ..." if len(conflicts) > 10 else ""),
                    extra=events.extra(events.QUEUE_PROXIED_CLAIM),
                )
            return True
        if now is not None and to != queue.instance_name:
            self._answer(queue, marks, to)
        return False

    def _answer(self, queue: ServedQueue, marks: list[str], to: str) -> None:
        """The owner's answer to a transfer request: grant the messages that are the
        first asked for and that no local subscription can take now; the rest are
        kept (the owner delivers them itself)."""
        state = queue.state
        granted = []
        for mark in marks:
            message = state.get(mark)
            if message is None or not state.owns(message) or mark in queue.asked:
                continue
            queue.asked.add(mark)
            if state.may_grant(mark):
                # moved at once, before the grant commits: nothing here delivers it
                state.transfer(mark, to)
                granted.append(mark)
        if granted:
            self._journal(queue.name, transfer_payload("grant", granted, to), QUEUE_TRANSFER, None)

    def _ask_owners(self, queue: ServedQueue, now: float) -> None:
        """Ask the owners for messages this instance's idle subscriptions could take
        and that have waited longer than the typical arrival-to-ack time."""
        if queue.config.kind == "local":
            return
        candidates = queue.state.transfer_candidates(now, queue.min_wait)
        if queue.proxied_transfer and candidates:
            candidates = self._claim_unreachable(queue, candidates)
        wanted = [
            m.bookmark
            for m in candidates
            if now - queue.requested.get(m.bookmark, -REQUEST_RETRY) >= REQUEST_RETRY
        ]
        if wanted:
            for mark in wanted:
                queue.requested[mark] = now
            payload = transfer_payload("request", wanted, queue.instance_name)
            self._journal(queue.name, payload, QUEUE_TRANSFER, None)

    def _claim_unreachable(
        self, queue: ServedQueue, candidates: list[QueueMessage]
    ) -> list[QueueMessage]:
        """Proxied transfer: take over the candidates whose owner is not reachable
        through replication (a grant to this instance, journaled and replicated like
        an owner's); return the others, to be asked for as usual.

        The owner may have delivered a message before it became unreachable; if it
        was being processed, claiming it here delivers it a second time. Each claim is
        counted (``proxied_claims``) and logged, so duplicates can be traced."""
        up = self._reachable()
        claimed = [m.bookmark for m in candidates if m.owner not in up]
        if not claimed:
            return candidates
        for mark in claimed:
            queue.state.transfer(mark, queue.instance_name)
        queue.proxied_claims += len(claimed)
        log.warning(
            "queue %s: proxied transfer claimed %d message(s) whose owner is not "
            "reachable through replication; one its owner delivered before it went "
            "may be delivered again",
            queue.name,
            len(claimed),
            extra=events.extra(events.QUEUE_PROXIED_CLAIM),
        )
        payload = transfer_payload("grant", claimed, queue.instance_name)
        self._journal(queue.name, payload, QUEUE_TRANSFER, None)
        self.pump(queue)
        taken = set(claimed)
        return [m for m in candidates if m.bookmark not in taken]

    def set_proxied_transfer(self, name: str, enabled: bool) -> str:
        """Enable or disable proxied transfer on queue ``name``; returns what was done.

        Raises:
            KeyError: no queue ``name`` (the message lists the queues).
        """
        queue = self.queues.get(name)
        if queue is None:
            known = ", ".join(sorted(self.queues)) or "none"
            raise KeyError(f"there is no queue {name!r}; queues: {known}")
        queue.proxied_transfer = enabled
        state = "enabled" if enabled else "disabled"
        log.warning(
            "queue %s: proxied transfer %s",
            name,
            state,
            extra=events.extra(events.QUEUE_PROXIED_CLAIM),
        )
        self._wake.set()
        return f"proxied transfer {state} on queue {name}"

    # ---------------------------------------------------------------- delivery
    def pump(self, queue: ServedQueue) -> None:
        """Send every delivery the queue can make now."""
        now = self.clock()
        sent_at_most_once: list[QueueMessage] = []
        for sub, message in queue.state.assign(now):
            subscriber: QueueSubscriber = sub.context
            try:
                _send_message(queue, subscriber, message)
            except CorruptRecord as exc:
                self._unreadable(queue, message, exc)
                continue
            if not queue.state.policy.at_least_once and not message.barrier:
                sent_at_most_once.append(message)
        if sent_at_most_once:
            self.journal_removal(queue, sent_at_most_once, "sent")
        self._wake.set()

    def _unreadable(self, queue: ServedQueue, message: QueueMessage, exc: CorruptRecord) -> None:
        """A message whose journal record cannot be read: it leaves this instance's
        queue (not journaled: another queue host may hold a sound copy), saying so."""
        queue.state.drop(message.bookmark)
        log.error(
            "queue %s: message %s (txid %d) cannot be delivered: its journal record is "
            "damaged (%s); it is left out of the queue here. Run `amps-py txlog verify` "
            "on the journal to see the damage",
            queue.name,
            message.bookmark,
            message.txid,
            exc,
            extra=events.extra(events.QUEUE_RECORD_UNREADABLE),
        )

    def journal_removal(
        self,
        queue: ServedQueue,
        gone: list[QueueMessage],
        reason: str,
        on_committed: Committed | None = None,
    ) -> None:
        """Journal (and so replicate) that messages left ``queue`` here: ``ack``,
        ``expire``, or ``sent`` (an at-most-once delivery). ``on_committed`` is called
        once the record is committed (or failed)."""
        if queue.changes is not None:
            # their txids, for the checkpoint once the record commits
            queue.removed_here.update((m.bookmark, m.txid) for m in gone)
        marks = [m.bookmark for m in gone]
        self._journal(queue.name, ack_payload(marks, reason), QUEUE_ACK, on_committed)

    def commit_failed(self) -> None:
        """A journal commit failed: the removals made here that waited for it will
        never commit (their messages come back at the next start)."""
        for queue in self.queues.values():
            queue.removed_here.clear()

    def expired(
        self, queue: ServedQueue, gone: list[QueueMessage], on_committed: Committed | None = None
    ) -> None:
        """Messages this instance expired: journal their removal, tell the hook."""
        if not gone:
            return
        self.journal_removal(queue, gone, "expire", on_committed)
        if self._on_expired is not None:
            for message in gone:
                self._on_expired(queue, message)

    async def run(self) -> None:
        """Expire leases and messages when they are due, then pump; every
        :data:`TRANSFER_INTERVAL` while a replicated queue has subscriptions here, ask
        the owners for messages they leave waiting. Sleeps until the earliest of
        those, or until something changes."""
        last_ask = 0.0
        while True:
            now = self.clock()
            deadlines = [d for q in self.queues.values() if (d := q.state.next_deadline())]
            wait = min(deadlines) - now if deadlines else 3600.0
            asking = [
                q
                for q in self.queues.values()
                if q.config.kind != "local" and q.state.subscriptions()
            ]
            if asking:
                wait = min(wait, last_ask + TRANSFER_INTERVAL - now)
            self._wake = trio.Event()
            with trio.move_on_after(max(0.0, wait)):
                await self._wake.wait()
            now = self.clock()
            for queue in self.queues.values():
                due = queue.state.next_deadline()
                if due is not None and due <= now:
                    back = queue.state.expire_leases(now)
                    self.expired(queue, back.expired + queue.state.expire_messages(now))
                    self.pump(queue)
            if asking and now - last_ask >= TRANSFER_INTERVAL:
                last_ask = now
                for queue in asking:
                    self._ask_owners(queue, now)

    # ---------------------------------------------------------------- sessions
    def session_ended(self, session: Recipient) -> None:
        """A connection ended: its leases go back to their queues."""
        now = self.clock()
        for queue in self.queues.values():
            back = queue.state.disconnect(session.conn_id, now)
            self.expired(queue, back.expired)
            if back.returned or back.expired:
                self.pump(queue)

    def unsubscribed(self, sub: Subscription) -> None:
        queue = self.queues.get(sub.topic)
        if queue is None:
            return
        back = queue.state.unsubscribe((sub.session.conn_id, sub.sub_id), self.clock())
        self.expired(queue, back.expired)
        self.pump(queue)

    def oldest_txids(self) -> dict[str, int]:
        """Per queue holding messages, the txid of its oldest: journal removal keeps
        it (the queue is rebuilt from the journal at start)."""
        out: dict[str, int] = {}
        for name, queue in self.queues.items():
            first = next(iter(queue.state.messages()), None)
            if first is not None:
                out[name] = first.txid
        return out

    def statistics(self) -> dict[str, dict[str, Any]]:
        """Per queue, what the admin API and metrics show."""
        out: dict[str, dict[str, Any]] = {}
        for name, queue in self.queues.items():
            stats = queue.state.statistics()
            out[name] = {
                "kind": queue.config.kind,
                "underlying_topic": queue.config.underlying_topic,
                "proxied_transfer": queue.proxied_transfer,
                "proxied_claims": queue.proxied_claims,
                "proxied_conflicts": queue.proxied_conflicts,
                "checkpoint_txid": queue.checkpoint.applied_txid if queue.checkpoint else 0,
                **{field: getattr(stats, field) for field in stats.__dataclass_fields__},
            }
        return out

    def publish_routes(self) -> dict[str, str] | None:
        """Queue name -> DefaultPublishTarget for each queue whose publish target is
        not its name (a publish to the queue's name is journaled on the target); None
        when no queue needs one, so a session's publish path tests one attribute."""
        routes = {
            name: q.config.publish_target
            for name, q in self.queues.items()
            if q.config.publish_target != name
        }
        return routes or None


def _send_message(queue: ServedQueue, subscriber: QueueSubscriber, message: QueueMessage) -> None:
    header = queue.head + subscriber.head + messages.bookmark_part(message.bookmark)
    if message.correlation_id:
        header += messages.correlation_part(message.correlation_id)
    lease = message.lease
    if lease is not None and lease.expires_at is not None:
        expiry = datetime.fromtimestamp(lease.expires_at, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        header += b',"lp":"' + expiry.encode() + b'"'
    payload = queue.payload_of(message)
    subscriber.session.send(messages.frame_head(header, len(payload)))
    subscriber.session.send(payload)
    subscriber.session.messages_out += 1


def _safe_name(name: str) -> str:
    """A queue's name as a directory name."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
