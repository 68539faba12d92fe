"""The publish path: from an accepted publish to its delivery and persisted ack.

::

    publish_command.on_publish -> PublishPath.publish (dedup against the ledgers)
        journaled:     JournalWriter.submit -> one commit (one fsync) -> on_commit
                       -> Delivery.fan_out to live subscriptions (fully_durable ones
                          wait for the durable watermark)
                       -> DurableWindow: which records are durable (committed here and
                          acknowledged by the sync destinations they are routed to;
                          the acks arrive via ``replication_acked``), and the watermark
                       -> Ledgers.settle -> Session.persisted_progress (persisted acks)
        not journaled: Delivery.fan_out at once; the publish is done

The decisions (dedup, what is durable, which acks advance) are pure and live in
:mod:`.durability` and :mod:`.durable_window`; this module wires them to the writer,
the subscriptions and the sessions, and wakes whoever waits for a commit (bookmark
replays, destinations).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from amps_py import events, reasons
from amps_py.message_types import MessageTypes, default_types
from amps_py.protocol import messages
from amps_py.protocol.server.commands import CommandFailed
from txlog import Journal, Record, publisher_hash

from .counters import Counters
from .delivery import Delivery
from .durability import Ledgers, PublisherLedger
from .durable_window import DurableWindow, Release, SyncHolder
from .queues import QUEUE_ACK, QueueBook
from .sowing import PUBLISH, SOW_DELETE, Removed, SowState, SowTopic
from .subscriptions import SubscriptionRegistry
from .writer import JournalWriter

log = logging.getLogger("amps_py.server")


class Publisher(Protocol):
    """Who publishes: a client session, or the instance itself (actions)."""

    pub_hash: int
    client_name: str
    #: the message type of what it publishes (its connection's)
    message_type: str


class PublisherSession(Publisher, Protocol):
    """The connection of a named publisher: told when its persisted acks advance and
    when publishes of its failed."""

    def persisted_progress(self) -> None: ...

    def publishes_failed(self, seqs: list[int], reason: str, detail: str) -> None: ...


class SyncAcks(Protocol):
    """What the publish path needs of replication: the sync destinations' acks."""

    def sync_holders(self) -> Sequence[SyncHolder]:
        """The destinations persisted acks wait for now (sync, not downgraded)."""
        ...

    def reset_upstreams(self, why: str) -> None: ...


@dataclass
class InternalPublisher:
    """The instance publishing on its own behalf (``amps-action-do-publish-message``):
    a publisher like any other, named ``<instance>-internal``, with its own seqs."""

    pub_hash: int
    client_name: str
    message_type: str = "json"


class PublishPath:
    """Accepts publishes, journals them through the writer, delivers what commits and
    advances persisted acks as records become durable.

    ``journal``/``writer`` are ``None`` until :meth:`open` (an instance without a
    TransactionLog never opens it: every publish is delivered at once);
    ``replication`` is set by the instance when it has destinations.
    """

    def __init__(
        self,
        instance_name: str,
        registry: SubscriptionRegistry,
        delivery: Delivery,
        counters: Counters,
        journals_topic: Any,
        types: MessageTypes | None = None,
    ) -> None:
        self.instance_name = instance_name
        self.registry = registry
        self.delivery = delivery
        self.counters = counters
        #: ``journals_topic(topic, message_type) -> bool``: does the TransactionLog
        #: record the topic
        self.journals_topic = journals_topic
        self.journal: Journal | None = None
        self.writer: JournalWriter | None = None
        self.replication: SyncAcks | None = None
        #: per publisher: what it has in flight here (see durability.py)
        self.ledgers = Ledgers(self.held_seq, self._queued_seq)
        #: what is committed but not yet durable by the persisted-ack rule
        self.window = DurableWindow()
        #: the connection of each named publisher (by publisher hash)
        self.sessions: dict[int, PublisherSession] = {}
        #: the SOW topics (none without SOW): commits are applied to their stores
        self.sow = SowState((), Path("."))
        self.sow_topics: dict[str, SowTopic] = {}
        #: the message queues (None without queues): commits feed them
        self.queues: QueueBook | None = None
        #: the instance's message types
        self.types = types if types is not None else default_types()
        self._commit_event = trio.Event()
        name = f"{instance_name}-internal"
        self._internal = InternalPublisher(publisher_hash(name), name)
        #: seq of the instance's own record -> called once it commits (or fails)
        self._commit_callbacks: dict[int, Callable[[bool, str], None]] = {}

    def open(self, journal: Journal, *, keep_recent: bool = True) -> JournalWriter:
        """Start journaling into ``journal``: its newest record is durable already.
        ``keep_recent``: keep the in-memory tail of new commits for replication
        destinations (see :class:`~.writer.RecentRecords`)."""
        self.journal = journal
        self.writer = JournalWriter(
            journal,
            self.on_commit,
            on_rejected=self.on_rejected,
            on_failed=self.on_commit_failed,
            on_recovered=self.on_writes_resumed,
            keep_recent=keep_recent,
        )
        self.window = DurableWindow(journal.last_txid, self.bookmark_of(journal.last_txid))
        return self.writer

    # ---------------------------------------------------------------- what is where
    @property
    def committed_txid(self) -> int:
        """The newest txid committed to the local journal (0 without a journal)."""
        return self.writer.committed_txid if self.writer is not None else 0

    @property
    def durable_txid(self) -> int:
        """The durable watermark: every record through it is durable by the
        persisted-ack rule (:mod:`.durable_window`)."""
        return self.window.durable_txid

    def visible_txid(self, durable: bool) -> int:
        """The newest txid a subscription may see: committed, or for ``fully_durable``
        subscriptions the durable watermark (every record through it committed and
        acknowledged by each sync destination it is routed to)."""
        if durable and self.window.holds_records:
            return self.window.durable_txid
        return self.committed_txid

    async def wait_for_commit(self, after_txid: int, *, durable: bool = False) -> None:
        """Wait until a txid after ``after_txid`` is committed (or, with ``durable``,
        until the durable watermark passes it)."""
        assert self.writer is not None
        while self.visible_txid(durable) <= after_txid:
            await self._commit_event.wait()

    async def wait_for_any_commit(self) -> None:
        """Wait for the next commit, or the next failed one."""
        await self._commit_event.wait()

    def bookmark_of(self, txid: int) -> str:
        if self.journal is None or txid <= 0:
            return ""
        rec = self.journal.get(txid)
        return rec.bookmark if rec is not None else ""

    def held_seq(self, pub_hash: int) -> int:
        """The highest seq this instance's journal holds for ``pub_hash``, from any
        source (published here or received by replication), durable or not: what a
        logon ack reports. It does not wait for sync destinations."""
        return self.journal.publisher_last_seq(pub_hash) if self.journal is not None else 0

    def _queued_seq(self, pub_hash: int) -> int:
        return self.writer.queued_high(pub_hash) if self.writer is not None else 0

    def ledger(self, pub_hash: int) -> PublisherLedger:
        """The publisher's ledger, built from the journal and the writer's queue on
        first use."""
        return self.ledgers.of(pub_hash)

    def note_replicated(self, records: Sequence[Record]) -> None:
        """Records received by replication were queued for the journal: seqs the
        server assigns later go above theirs."""
        self.ledgers.saw(records)

    def bytes_after(self, txid: int) -> int:
        """Stored bytes of the committed records after ``txid`` (a destination's lag in
        bytes): exact for the in-memory tail of recent commits, estimated per journal
        segment further back."""
        journal, writer = self.journal, self.writer
        if journal is None or writer is None or txid >= writer.committed_txid:
            return 0
        exact = writer.recent.bytes_after(txid)
        if exact is not None:
            return exact
        return max(journal.bytes_through(writer.committed_txid) - journal.bytes_through(txid), 0)

    # ---------------------------------------------------------------- publishing
    def publish(
        self,
        session: Publisher,
        topic: str,
        seq: int,
        payload: bytes,
        header: dict[str, Any],
        kind: int = PUBLISH,
        message_type: str = "",
    ) -> str:
        """Accept one publish (of ``message_type``; "" means the publisher's).
        Returns ``queued`` (waits for the journal), ``pending`` (a duplicate of a
        message not yet durable) or ``done`` (duplicate already durable, or a topic
        that is not journaled and was delivered at once).

        A publish is a duplicate only if that exact ``(publisher, seq)`` is journaled
        or in flight here; a seq below the publisher's highest that is neither is
        stored (a client may reorder its publishes after a failover). Seqs above the
        highest take the fast path: one comparison.
        """
        self.counters.count_published()
        writer = self.writer
        mtype = message_type or session.message_type
        if writer is not None and (self.journals_topic(topic, mtype) or kind >= QUEUE_ACK):
            if writer.failure:
                raise CommandFailed(reasons.JOURNAL_UNAVAILABLE, writer.failure)
            sow_key = ""
            lifetime = None
            if self.sow_topics:
                sow = self.sow.resolve(topic)
                if sow is not None and kind != SOW_DELETE and sow.message_type == mtype:
                    # before the ledger: a message whose key cannot be read is refused
                    kind, sow_key, payload = self.sow.prepare(
                        sow, header, payload, header.get("c") == "delta_publish"
                    )
                    lifetime = sow.lifetime(header)
            ph = session.pub_hash
            ledger = self.ledgers.of(ph)
            if seq > ledger.high:
                # the fast path: above every seq held, queued or in flight (so also
                # above every pending one: appending keeps ``pending`` ascending)
                ledger.high = seq
                ledger.pending.append(seq)
            else:
                if ledger.is_pending(seq):
                    self.counters.count_duplicate()
                    return "pending"
                held = self._held_txid(ph, seq)
                if held is not None:
                    self.counters.count_duplicate()
                    if self.window.is_durable(held):
                        return "done"
                    ledger.accept(seq)  # settled when that record is durable
                    return "pending"
                ledger.accept(seq)
            cid = header.get("x")
            record = Record.published(
                topic,
                payload,
                ph,
                seq,
                session.client_name,
                mtype,
                self.instance_name,
                str(cid) if cid else "",
            )
            if kind != PUBLISH or sow_key:
                # (set here, not as arguments: keyword arguments cost on the hot path)
                record.kind = kind
                record.sow_key = sow_key
                self.sow.queued(record, lifetime)
            writer.submit(record)
            return "queued"
        subs = self.registry.match(topic, mtype)
        if subs:
            self.delivery.fan_out(topic, payload, "", 0, subs, header.get("x"), 0, "", mtype)
        return "done"

    def publish_internal(
        self,
        topic: str,
        payload: bytes,
        kind: int = PUBLISH,
        on_committed: Callable[[bool, str], None] | None = None,
        message_type: str = "json",
    ) -> str:
        """Publish ``payload`` (of ``message_type``) to ``topic`` as the instance
        itself (``<name>-internal``, with its own seqs); same path, journal and dedup
        rules as a client's publish. ``on_committed(stored, detail)`` is called once
        the record is committed (``True``) or its commit failed (``False`` and why);
        at once with ``True`` when the topic is not journaled."""
        publisher = self._internal
        seq = self.ledger(publisher.pub_hash).high + 1
        outcome = self.publish(publisher, topic, seq, payload, {}, kind, message_type)
        if on_committed is not None:
            if outcome == "queued":
                self._commit_callbacks[seq] = on_committed
            else:
                on_committed(True, "")
        return outcome

    def _run_commit_callbacks(self, records: list[Record], stored: bool, detail: str) -> None:
        """Tell whoever waits for these of the instance's own records that they were
        committed (or not)."""
        waiting = self._commit_callbacks
        internal = self._internal.pub_hash
        for rec in records:
            if rec.pub_hash == internal:
                callback = waiting.pop(rec.seq, None)
                if callback is not None:
                    callback(stored, detail)

    def _held_txid(self, pub_hash: int, seq: int) -> int | None:
        """The txid holding ``(pub_hash, seq)`` in the journal; 0 when it was there
        and removal deleted it; ``None`` when this instance never stored it."""
        assert self.journal is not None
        txid = self.journal.lookup_bookmark(pub_hash, seq)
        if txid is None and seq <= self.journal.publisher_floor(pub_hash):
            return 0
        return txid

    # ---------------------------------------------------------------- after a commit
    def sync_holders(self) -> Sequence[SyncHolder]:
        """The replication destinations persisted acks wait for now."""
        replication = self.replication
        return replication.sync_holders() if replication is not None else ()

    def on_commit(self, records: list[Record], dropped: list[Record]) -> None:
        """After a journal commit: fan out, then advance persisted acks."""
        holders = self.sync_holders()
        if records:
            changes = None
            if self.sow_topics:
                if self.registry.oof_filtered:
                    changes = self._focus_changes(records)
                removed = self.sow.apply(records)
                if removed:
                    self.out_of_focus(removed)
            skip_durable = bool(holders) and self.registry.fully_durable > 0
            if changes:
                self._deliver_with_focus(records, skip_durable, changes)
            else:
                self._deliver(records, skip_durable, False)
            if self.queues is not None:
                self.queues.on_commit(records)
            if self._commit_callbacks:
                self._run_commit_callbacks(records, True, "")
        copies = [(rec.pub_hash, rec.seq, self._copy_txid(rec)) for rec in dropped]
        self._released(self.window.committed(records, copies, self.committed_txid, holders))

    def _copy_txid(self, rec: Record) -> int | None:
        """The txid of the stored copy of ``rec`` (a publish the journal found already
        stored): 0 when journal removal deleted it, ``None`` if it cannot be found."""
        if self.journal is None:
            return None
        return self._held_txid(rec.pub_hash, rec.seq)

    def advance_durable(self) -> None:
        """The sync destinations acknowledged more, or changed: release what is
        durable now."""
        if self.window.waiting:
            self._released(self.window.advance(self.sync_holders()))

    def acks_waiting_for(self, destination: str) -> int:
        """How many committed records routed to ``destination`` wait for its
        acknowledgement before they are durable (0 unless it is sync)."""
        return self.window.held_by(destination)

    def _deliver(self, records: list[Record], skip_durable: bool, durable_only: bool) -> None:
        """Fan committed records out to the live subscriptions of their topics: all,
        all but the ``fully_durable`` ones, or only those. A SOW delete is no message."""
        registry = self.registry
        fan_out = self.delivery.fan_out
        for rec in records:
            subs = registry.match(rec.topic, rec.message_type)
            if skip_durable:
                subs = tuple(s for s in subs if not s.fully_durable)
            elif durable_only:
                subs = tuple(s for s in subs if s.fully_durable)
            if subs and rec.kind < SOW_DELETE:  # a SOW delete or queue ack is no message
                fan_out(
                    rec.topic,
                    rec.payload,
                    rec.bookmark,
                    rec.txid,
                    subs,
                    rec.correlation_id,
                    rec.local_ts,
                    rec.sow_key,
                    rec.message_type,
                    rec.pub_hash,
                    rec.seq,
                )

    def _focus_changes(self, records: list[Record]) -> dict[int, list[tuple[Any, Record]]]:
        """Before a commit is applied: which of its SOW updates take a record out of the
        filter of a subscription with option ``oof`` (by the index of the update in
        ``records``, the subscription and the update). Updates of one key in one commit
        are taken in order, each against the one before it."""
        changes: dict[int, list[tuple[Any, Record]]] = {}
        current: dict[tuple[str, str], bytes | None] = {}
        for index, rec in enumerate(records):
            if not rec.sow_key or rec.kind == SOW_DELETE:
                continue
            sow = self.sow.of_record(rec)
            if sow is None:
                continue
            subs = [s for s in self.registry.match(rec.topic, rec.message_type) if s.oof_filtered]
            if not subs:
                continue
            place = (rec.topic, rec.sow_key)
            if place not in current:
                old = sow.stored(rec.sow_key)
                current[place] = old.payload if old is not None else None
            previous = current[place]
            current[place] = rec.payload
            if previous is None:
                continue
            was, now = sow.reader.document(previous), sow.reader.document(rec.payload)
            left = [
                (s, rec)
                for s in subs
                if s.filter is not None and s.filter.matches(was) and not s.filter.matches(now)
            ]
            if left:
                changes[index] = left
        return changes

    def _deliver_with_focus(
        self, records: list[Record], skip_durable: bool, changes: dict[int, list[Any]]
    ) -> None:
        """:meth:`_deliver`, one record at a time, each followed by the ``oof`` reason
        ``match`` (with the new message) its update causes."""
        for index, rec in enumerate(records):
            self._deliver([rec], skip_durable, False)
            for sub, update in changes.get(index, ()):
                sub.session.send(
                    messages.oof(
                        update.topic,
                        [sub.sub_id],
                        update.sow_key,
                        "match",
                        update.payload,
                        update.correlation_id or None,
                    )
                )

    def out_of_focus(self, removed: list[Removed]) -> None:
        """``oof`` messages for records a delete removed (or that expired), to the
        subscriptions that asked for them (option ``oof``) and that the removed
        message matched; the reason is the :class:`Removed`'s."""
        for gone in removed:
            sow = self.sow.resolve(gone.topic)
            if sow is None:
                continue
            subs = [
                s for s in self.registry.match(gone.topic, sow.message_type) if "oof" in s.options
            ]
            for entry in gone.entries:
                for sub in subs:
                    if sub.filter is None or sub.filter.matches(sow.reader.document(entry.payload)):
                        sub.session.send(
                            messages.oof(
                                gone.topic,
                                [sub.sub_id],
                                entry.key,
                                gone.reason,
                                entry.payload,
                                entry.correlation_id or None,
                            )
                        )

    def _released(self, release: Release) -> None:
        """Act on what became durable: ``fully_durable`` deliveries, persisted acks,
        and wake what waits for commits."""
        if release.records and self.registry.fully_durable:
            self._deliver(release.records, False, True)
        if release.settled:
            by_pub = self.sessions
            for ph in self.ledgers.settle(release.settled, by_pub):
                by_pub[ph].persisted_progress()
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Wake every task waiting in :meth:`wait_for_commit` (each checks again)."""
        event = self._commit_event
        self._commit_event = trio.Event()
        event.set()

    # ---------------------------------------------------------------- when writes fail
    def on_rejected(self, rejected: list[tuple[Record, str]]) -> None:
        """Records the journal could not store (the rest of their commit was)."""
        if self.sow_topics:
            self.sow.forget(rec for rec, _ in rejected)
        for rec, why in rejected:
            if rec.path:
                log.error(
                    "a record received from %s (bookmark %s, topic %.80r) cannot be "
                    "stored and is missing on this instance: %s",
                    rec.path[-1][0],
                    rec.bookmark,
                    rec.topic,
                    why,
                    extra=events.extra(events.REPLICATION_HOLE),
                )
                continue
            log.error(
                "publish seq %d of client %r (topic %.80r) was not stored: %s",
                rec.seq,
                rec.client_name,
                rec.topic,
                why,
                extra=events.extra(events.JOURNAL_RECORD_REJECTED),
            )
            self._fail_publishes([rec], reasons.JOURNAL_WRITE_FAILED, why)

    def on_commit_failed(self, records: list[Record], reason: str) -> None:
        """A commit stored nothing; the writer refuses writes until it recovers."""
        local = [rec for rec in records if not rec.path]
        log.error(
            "journal commit failed; %d queued publish(es) failed and %d replicated "
            "record(s) will be resent by their upstreams; journaled publishes are "
            "refused until writes succeed again: %s",
            len(local),
            len(records) - len(local),
            reason,
            extra=events.extra(events.JOURNAL_COMMIT_FAILED),
        )
        self._fail_publishes(local, reasons.JOURNAL_WRITE_FAILED, reason)
        if self._commit_callbacks:
            self._run_commit_callbacks(records, False, reason)
        if self.queues is not None:
            self.queues.commit_failed()
        if self.sow_topics:
            self.sow.forget(records)
        self._wake_waiters()  # what waits for these records learns they failed
        if self.replication is not None:
            # the positions they acknowledged may ride on the failed batch: start over
            self.replication.reset_upstreams("this instance's journal writes are failing")

    def on_writes_resumed(self) -> None:
        log.warning(
            "journal writes are accepted again (%s)",
            self.journal.path if self.journal is not None else "",
            extra=events.extra(events.JOURNAL_WRITES_RESUMED),
        )

    def _fail_publishes(self, records: list[Record], reason: str, detail: str) -> None:
        """Tell each publisher that these of its publishes were not stored: a persisted
        failure ack per seq; they no longer hold back its acks."""
        by_pub: dict[int, list[int]] = {}
        for rec in records:
            by_pub.setdefault(rec.pub_hash, []).append(rec.seq)
        for ph, seqs in by_pub.items():
            ledger = self.ledgers.get(ph)
            if ledger is not None:
                ledger.fail(seqs)
            session = self.sessions.get(ph)
            if session is not None:
                session.publishes_failed(seqs, reason, detail)
