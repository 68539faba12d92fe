"""One amps-py instance: journal, writer, listeners, sessions and the publish path.

Where a message goes (DESIGN section 4)::

    Session._on_publish -> Instance.publish  (dedup, journaled?)
        journaled:     JournalWriter.submit -> commit (one fsync) -> Instance._on_commit
                       -> fan-out to live subscriptions + persisted acks
        not journaled: fan-out at once, ack at once

``serve_instance`` runs everything under one nursery and reports the bound listener
addresses through ``task_status.started`` (so a caller learns port-0 ports with no
sleep).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from amps_py import auth, events, reasons
from amps_py.config import (
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_LOGON_TIMEOUT,
    InstanceConfig,
    TransactionLogConfig,
    TransportConfig,
)
from amps_py.replication import ReplicationManager
from txlog import Journal, Record, publisher_hash

from .counters import Counters
from .delivery import Delivery
from .durability import DurableWindow, Ledgers, PublisherLedger, Release
from .limits import InstanceLimits
from .listeners import Listeners, cannot_listen
from .maintenance import JournalMaintenance, JournalMaintenanceError, MaintenanceResult
from .session import JOURNAL_UNAVAILABLE, CommandFailed, Session
from .startup import ConfigurationError, listen_failure, open_journal, os_error_in
from .statsfile import write_ready_file, write_statistics
from .subscriptions import SubscriptionRegistry
from .writer import JournalWriter

if TYPE_CHECKING:
    from amps_py.actions import ActionRunner

log = logging.getLogger("amps_py.server")



@dataclass(frozen=True)
class InstanceStatistics:
    name: str
    uptime: float
    clients: int
    subscriptions: int
    published: int
    delivered: int
    duplicates: int
    protocol_errors: int
    failed_commands: int
    #: commands refused because the user is not entitled (publish, subscribe, ...)
    denied_commands: int = 0
    #: the subset of denied_commands that were publishes (AMPS's denied_writes)
    denied_writes: int = 0
    journal: dict[str, Any] | None = None
    writer: dict[str, Any] | None = None
    listeners: dict[str, int] = field(default_factory=dict)
    replication: dict[str, Any] | None = None
    durable_txid: int = 0
    #: the client memory pools and the connections they closed (InstanceLimits)
    limits: dict[str, Any] | None = None


#: what a session of an unknown transport gets (tests drive sessions directly)
_DEFAULT_TRANSPORT: Final = TransportConfig(
    name="", type="tcp", host="", port=0, protocol="amps", message_type=None
)


class Publisher(Protocol):
    """Who publishes: a client session, or the instance itself (actions)."""

    pub_hash: int
    client_name: str


@dataclass
class InternalPublisher:
    """The instance publishing on its own behalf (``amps-action-do-publish-message``):
    a publisher like any other, named ``<instance>-internal``, with its own seqs."""

    pub_hash: int
    client_name: str


class Instance:
    """The running state of one instance. Create it, then ``await serve()``."""

    def __init__(self, config: InstanceConfig, *, allow_empty_journal: bool = False) -> None:
        self.config = config
        #: start an empty journal where one existed (``serve --allow-empty-journal``)
        self.allow_empty_journal = allow_empty_journal
        self.name = config.name
        self.journal: Journal | None = None
        self.writer: JournalWriter | None = None
        self.actions: ActionRunner | None = None
        #: per enabled transport, the scope that stops it (admin disable)
        self.registry = SubscriptionRegistry()
        self.sessions: set[Session] = set()
        self._names: dict[str, Session] = {}
        self._pub_sessions: dict[int, Session] = {}
        self._conn_ids = itertools.count(1)
        #: per publisher: what it has in flight here (see durability.py)
        self.ledgers = Ledgers(self.held_seq, self._queued_seq)
        #: what is committed but not yet durable by the persisted-ack rule
        self.window = DurableWindow()
        self._topic_json: dict[str, bytes] = {}
        self._journaled: dict[str, bool] = {}
        self._filters: dict[str, Any] = {}
        self._commit_event = trio.Event()
        self.replication: ReplicationManager | None = None
        #: journal segment maintenance (with a TransactionLog, once serving)
        self.maintenance: JournalMaintenance | None = None
        #: per running bookmark replay, the txid it has read through (journal removal
        #: never deletes what a replay still has to read)
        self.active_replays: dict[int, int] = {}
        self.group = config.group
        self.started_at = time.time()
        #: the transports (and the admin interface) and their bound addresses
        self.listeners = Listeners(
            config.transports, self._serve_client, self._setting, self._close_clients
        )
        #: message and command counts (sessions, replay and this instance count)
        self.counters = Counters()
        self.delivery = Delivery(self.counters)
        try:
            self.authenticator: auth.Authenticator = auth.open_authenticator(
                config.authentication.module, config.authentication.password_file
            )
            self.entitler: auth.Entitler = auth.open_entitler(
                config.entitlement.module, config.entitlement.rules_file
            )
            incoming = config.replication_authentication
            #: checks upstream instances' credentials (the replication transport's own
            #: Authentication, else the instance's)
            self.replication_authenticator: auth.Authenticator = (
                self.authenticator
                if incoming is config.authentication
                else auth.open_authenticator(incoming.module, incoming.password_file)
            )
        except (auth.AuthFileError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from None
        self._transports = {t.name: t for t in config.transports}
        self._message_type = "json"
        #: MessageMemoryLimit and IncompleteMessageMemoryLimit pools (sessions update them)
        self.limits = InstanceLimits(
            config.message_memory_budget(), config.incomplete_message_budget()
        )

    # ---------------------------------------------------------------- helpers for sessions
    def next_connection_id(self) -> int:
        return next(self._conn_ids)

    def transport_config(self, transport: str) -> TransportConfig:
        """The config of transport ``transport`` (a default one for an unknown name)."""
        return self._transports.get(transport) or _DEFAULT_TRANSPORT

    def max_frame_size(self, transport: str) -> int:
        t = self._transports.get(transport)
        return t.max_message_size if t is not None else 16 * 1024 * 1024

    def client_limits(self, transport: str) -> tuple[float, float, int]:
        """(LogonTimeout s, IncompleteMessageTimeout s, ClientMaxCapacity bytes) for a
        connection to client transport ``transport``."""
        t = self._transports.get(transport)
        capacity = self.config.client_capacity(t, self.limits.queued.limit)
        if t is None:
            return DEFAULT_LOGON_TIMEOUT, DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT, capacity
        return t.logon_timeout, t.incomplete_message_timeout, capacity

    def compile_filter(self, text: str) -> Any:
        flt = self._filters.get(text)
        if flt is None:
            from amps_py.filters import FilterError, compile_filter

            try:
                flt = compile_filter(text)
            except FilterError as exc:
                raise CommandFailed(reasons.BAD_FILTER, str(exc)) from None
            if len(self._filters) > 10_000:
                self._filters.clear()
            self._filters[text] = flt
        return flt

    def journals_topic(self, topic: str) -> bool:
        known = self._journaled.get(topic)
        if known is None:
            tl = self.config.transaction_log
            known = tl is not None and tl.journals(topic, self._message_type)
            self._journaled[topic] = known
        return known

    def claim_client_name(self, session: Session, name: str, user: str) -> str:
        """Register ``name`` for ``session``; return a refusal text, or "" when granted.

        With a transaction log, names are unique: the same name and user takes over
        (the old connection is closed, reason ``name in use``); a different user is
        refused.
        """
        if not name or self.journal is None:
            return ""
        current = self._names.get(name)
        if current is not None and current is not session:
            if current.user_id != user:
                return (
                    f"client name {name!r} is in use by another user; client names must be "
                    "unique per publisher"
                )
            log.warning(
                "client name %r logged on again from %s; disconnecting the older connection %d",
                name,
                session.peer,
                current.conn_id,
                extra=events.extra(events.NAME_IN_USE),
            )
            current.close(reasons.NAME_IN_USE)
        # the new session inherits what an earlier one still waits for: the ledger
        # lives on the instance
        self._names[name] = session
        self._pub_sessions[publisher_hash(name)] = session
        return ""

    def session_ended(self, session: Session) -> None:
        self.sessions.discard(session)
        for sub in list(session.subscriptions.values()):
            self.registry.remove(sub)
        session.subscriptions.clear()
        if session.client_name and self._names.get(session.client_name) is session:
            del self._names[session.client_name]
            self._pub_sessions.pop(session.pub_hash, None)
            self.ledgers.forget_if_idle(session.pub_hash)

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

    @property
    def durable_txid(self) -> int:
        """The newest txid durable by the persisted-ack rule."""
        return self.window.durable_txid

    @property
    def last_durable_bookmark(self) -> str:
        return self.window.last_bookmark

    def bookmark_of(self, txid: int) -> str:
        if self.journal is None or txid <= 0:
            return ""
        rec = self.journal.get(txid)
        return rec.bookmark if rec is not None else ""

    async def wait_for_commit(self, after_txid: int, *, durable: bool = False) -> None:
        """Wait until a txid after ``after_txid`` is committed (or, with ``durable``,
        acknowledged by every sync destination too)."""
        assert self.writer is not None
        while self.visible_txid(durable) <= after_txid:
            await self._commit_event.wait()

    def visible_txid(self, durable: bool) -> int:
        """The newest txid a subscription may see: committed, or for ``fully_durable``
        subscriptions, committed and acknowledged by every sync destination."""
        if durable and self.window.holds_records:
            return self.window.durable_txid
        return self.committed_txid

    # ---------------------------------------------------------------- publish path
    def publish(
        self, session: Publisher, topic: str, seq: int, payload: bytes, header: dict[str, Any]
    ) -> str:
        """Accept one publish. Returns ``queued`` (waits for the journal), ``pending``
        (a duplicate of a message not yet durable) or ``done`` (duplicate already
        durable, or a topic that is not journaled and was delivered at once).

        A publish is a duplicate only if that exact ``(publisher, seq)`` is journaled
        or in flight here; a seq below the publisher's highest that is neither is
        stored (a client may reorder its publishes after a failover). Seqs above the
        highest take the fast path: one comparison.
        """
        self.counters.count_published()
        writer = self.writer
        if writer is not None and self.journals_topic(topic):
            if writer.failure:
                raise CommandFailed(JOURNAL_UNAVAILABLE, writer.failure)
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
                    if held <= self.durable_txid:
                        return "done"
                    ledger.accept(seq)  # settled when that record is durable
                    return "pending"
                ledger.accept(seq)
            writer.submit(
                Record(
                    topic=topic,
                    payload=payload,
                    pub_hash=ph,
                    seq=seq,
                    client_name=session.client_name,
                    message_type=self._message_type,
                    origin=self.name,
                    correlation_id=str(header.get("x") or ""),
                )
            )
            return "queued"
        subs = self.registry.match(topic)
        if subs:
            self.delivery.fan_out(topic, payload, "", 0, subs, header.get("x"), 0)
        return "done"

    def _held_txid(self, pub_hash: int, seq: int) -> int | None:
        """The txid holding ``(pub_hash, seq)`` in the journal; 0 when it was there
        and removal deleted it; ``None`` when this instance never stored it."""
        assert self.journal is not None
        txid = self.journal.lookup_bookmark(pub_hash, seq)
        if txid is None and seq <= self.journal.publisher_floor(pub_hash):
            return 0
        return txid

    def _on_commit(self, records: list[Record], dropped: list[Record]) -> None:
        """After a journal commit: fan out, then advance persisted acks."""
        replication = self.replication
        upto = None
        if replication is not None and replication.has_sync:
            upto = replication.durable_txid(self.committed_txid)
        if records:
            self._fan_out_committed(records, holding=upto is not None)
        self._released(self.window.committed(records, dropped, self.committed_txid, upto))

    def _fan_out_committed(self, records: list[Record], holding: bool) -> None:
        """Deliver committed records to live subscriptions; ``fully_durable`` ones wait
        for the sync destinations when there are any (``holding``)."""
        registry = self.registry
        split = holding and registry.fully_durable > 0
        fan_out = self.delivery.fan_out
        for rec in records:
            subs = registry.match(rec.topic)
            if split:
                subs = tuple(s for s in subs if not s.fully_durable)
            if subs:
                fan_out(
                    rec.topic,
                    rec.payload,
                    rec.bookmark,
                    rec.txid,
                    subs,
                    rec.correlation_id,
                    rec.local_ts,
                )

    def _released(self, release: Release) -> None:
        """Act on what became durable: ``fully_durable`` deliveries, persisted acks,
        and wake what waits for commits."""
        registry = self.registry
        if release.records and registry.fully_durable:
            for rec in release.records:
                subs = tuple(s for s in registry.match(rec.topic) if s.fully_durable)
                if subs:
                    self.delivery.fan_out(
                        rec.topic,
                        rec.payload,
                        rec.bookmark,
                        rec.txid,
                        subs,
                        rec.correlation_id,
                        rec.local_ts,
                    )
        if release.settled:
            by_pub = self._pub_sessions
            for ph in self.ledgers.settle(release.settled, by_pub):
                by_pub[ph].persisted_progress()
        event = self._commit_event
        self._commit_event = trio.Event()
        event.set()

    def _on_rejected(self, rejected: list[tuple[Record, str]]) -> None:
        """Records the journal could not store (the rest of their commit was)."""
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

    def _on_commit_failed(self, records: list[Record], reason: str) -> None:
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
        if self.replication is not None:
            # the positions they acknowledged may ride on the failed batch: start over
            self.replication.reset_upstreams("this instance's journal writes are failing")

    def _on_writes_resumed(self) -> None:
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
            session = self._pub_sessions.get(ph)
            if session is not None:
                session.publishes_failed(seqs, reason, detail)

    @property
    def committed_txid(self) -> int:
        """The newest txid committed to the local journal (0 without a journal)."""
        return self.writer.committed_txid if self.writer is not None else 0

    def _advance_durable(self) -> None:
        """The sync destinations acknowledged more, or changed: release what is
        durable now."""
        if self.window.waiting:
            upto = self.committed_txid
            if self.replication is not None and self.replication.has_sync:
                upto = self.replication.durable_txid(upto)
            self._released(self.window.advance(upto))

    def disable_transport(self, name: str) -> str:
        """Stop listening on client transport ``name`` and disconnect its clients."""
        return self.listeners.disable(name)

    async def enable_transport(self, name: str) -> str:
        """Listen on client transport ``name`` again."""
        return await self.listeners.enable(name)

    def _close_clients(self, transport: str, reason: str) -> int:
        closed = 0
        for session in list(self.sessions):
            if session.transport == transport:
                session.close(reason)
                closed += 1
        return closed

    async def _serve_client(self, stream: trio.abc.Stream, transport: str, peer: str) -> None:
        session = Session(self, stream, transport, peer)
        self.sessions.add(session)
        try:
            await session.run()
        except Exception:
            # a bug in one session must not take the instance down
            log.exception(
                "session of client %r (%s) failed",
                session.client_name,
                peer,
                extra=events.extra(events.CLIENT_DISCONNECTED),
            )

    def publish_internal(self, topic: str, payload: bytes) -> str:
        """Publish ``payload`` to ``topic`` as the instance itself; same path, journal
        and dedup rules as a client's publish."""
        name = f"{self.name}-internal"
        publisher = InternalPublisher(publisher_hash(name), name)
        seq = self.ledger(publisher.pub_hash).high + 1
        return self.publish(publisher, topic, seq, payload, {})

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

    async def maintain_journal(
        self, action: str, *, through: int | None = None, older_than: float | None = None
    ) -> MaintenanceResult:
        """Compress, archive or remove journal segment ``through`` (or the newest sealed
        one older than ``older_than`` seconds) and every older one; see
        :mod:`amps_py.server.maintenance`.

        Raises:
            JournalMaintenanceError: no journal, an unknown journal or action, the
                current journal, or archiving without JournalArchiveDirectory.
        """
        if self.maintenance is None:
            raise JournalMaintenanceError(
                "this instance has no TransactionLog, so it has no journals to maintain"
            )
        return await self.maintenance.apply(action, through=through, older_than=older_than)

    def fire_action(self, on: str, variables: dict[str, str]) -> None:
        """Run the configured Actions with ``amps-action-on-<on>`` (in the background)."""
        if self.actions is not None:
            self.actions.fire(on, variables)

    def replication_acked(self) -> None:
        """A destination acknowledged more: persisted acks may advance."""
        self._advance_durable()

    def replication_changed(self) -> None:
        """A destination connected, disconnected or changed sync/async."""
        self._advance_durable()

    def _setting(self, setting: str, flag: str) -> str:
        """``setting`` as a startup error names it; for the embedded default (no config
        file to edit), the ``amps-py serve`` flag that changes it instead."""
        if self.config.source != "<embedded default>":
            return setting
        return (
            f"{setting} (the embedded default's: run `amps-py serve {flag} N`, 0 for any "
            "free port, or serve a config of your own from `amps-py config show-default`)"
        )

    # ---------------------------------------------------------------- serving
    async def serve(
        self, *, task_status: trio.TaskStatus[dict[str, tuple[str, int]]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the journal, start the writer and the listeners; run until cancelled."""
        config = self.config
        log.info(
            "instance %s starting (config %s)",
            self.name,
            config.source,
            extra=events.extra(events.INSTANCE_STARTING),
        )
        tl = config.transaction_log
        try:
            async with trio.open_nursery() as nursery:
                if tl is not None:
                    self.journal = await trio.to_thread.run_sync(self._open_journal, tl)
                    log.info(
                        "journal %s opened: last txid %d, durability %s, compression %s",
                        tl.journal_directory,
                        self.journal.last_txid,
                        tl.durability,
                        tl.compression,
                        extra=events.extra(events.JOURNAL_OPENED),
                    )
                    if tl.durability != "fsync":
                        log.warning(
                            "journal durability is %s: commits are not fsynced, a power loss "
                            "can lose acknowledged messages",
                            tl.durability,
                            extra=events.extra(events.JOURNAL_OPENED),
                        )
                    self.writer = JournalWriter(
                        self.journal,
                        self._on_commit,
                        on_rejected=self._on_rejected,
                        on_failed=self._on_commit_failed,
                        on_recovered=self._on_writes_resumed,
                    )
                    if self.journal.last_txid:
                        self.window.last_bookmark = self.bookmark_of(self.journal.last_txid)
                    nursery.start_soon(self._run_writer)
                    self.window.durable_txid = self.journal.last_txid
                    if config.replication or config.replication_transport is not None:
                        self.replication = ReplicationManager(self)
                    self.maintenance = JournalMaintenance(self)
                    nursery.start_soon(self.maintenance.run)
                elif config.replication or config.replication_transport is not None:
                    raise ConfigurationError(
                        "replication needs a TransactionLog: only journaled messages "
                        "replicate; add a TransactionLog with the replicated topics"
                    )
                self.listeners.replication = self.replication
                await self.listeners.start(nursery)
                if self.replication is not None:
                    nursery.start_soon(self.replication.run)
                if config.actions:
                    from amps_py.actions import ActionRunner

                    self.actions = ActionRunner(self, config.actions)
                    await nursery.start(self.actions.run)
                if config.admin is not None:
                    from amps_py.admin.http import serve_admin

                    host, port = config.admin
                    try:
                        bound = await nursery.start(serve_admin, self, host, port)
                    except (OSError, BaseExceptionGroup) as exc:
                        bind_error = os_error_in(exc)  # hypercorn raises it in a group
                        if bind_error is None:
                            raise
                        raise cannot_listen(
                            listen_failure(
                                "the admin interface",
                                host,
                                port,
                                bind_error,
                                self._setting("Admin/InetAddr", "--admin-port"),
                            )
                        ) from exc
                    self.listeners.bound["admin"] = (host, bound)
                log.info(
                    "instance %s ready: %s",
                    self.name,
                    ", ".join(f"{n}={h}:{p}" for n, (h, p) in self.listeners.bound.items()),
                    extra=events.extra(events.INSTANCE_READY),
                )
                task_status.started(dict(self.listeners.bound))
        finally:
            if self.journal is not None:
                self.journal.close()
            log.info("instance %s stopped", self.name, extra=events.extra(events.INSTANCE_STOPPED))

    def _open_journal(self, tl: TransactionLogConfig) -> Journal:
        """Open the journal (in a worker thread); see :func:`startup.open_journal`."""
        return open_journal(tl, self.name, allow_empty=self.allow_empty_journal)

    async def _run_writer(self) -> None:
        assert self.writer is not None
        try:
            await self.writer.run()
        except Exception as exc:
            log.critical(
                "the journal writer failed unexpectedly, stopping the instance so no "
                "unstored message is acknowledged: %s",
                exc,
                extra=events.extra(events.JOURNAL_COMMIT_FAILED),
            )
            raise

    def statistics(self) -> InstanceStatistics:
        return InstanceStatistics(
            name=self.name,
            uptime=time.time() - self.started_at,
            clients=len(self.sessions),
            subscriptions=self.registry.count,
            published=self.counters.published,
            delivered=self.counters.delivered,
            duplicates=self.counters.duplicates,
            protocol_errors=self.counters.protocol_errors,
            failed_commands=self.counters.failed_commands,
            denied_commands=self.counters.denied_commands,
            denied_writes=self.counters.denied_writes,
            journal=self.journal.statistics().__dict__ if self.journal else None,
            writer=self.writer.statistics().__dict__ if self.writer else None,
            listeners={n: p for n, (_, p) in self.listeners.bound.items()},
            replication=self.replication.statistics() if self.replication else None,
            durable_txid=self.durable_txid,
            limits=self.limits.statistics(),
        )


async def serve_instance(
    config: InstanceConfig,
    *,
    ready_file: str | os.PathLike[str] | None = None,
    stats_file: str | os.PathLike[str] | None = None,
    stats_interval: float = 0.25,
    allow_empty_journal: bool = False,
    task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an instance until cancelled; write ``ready_file`` (JSON) once listening.

    The ready file holds ``{"name": ..., "pid": ..., "transports": {name: port}}`` and
    is written atomically, so a test or script can poll for it. ``allow_empty_journal``
    lets the journal start empty where one existed (see :class:`txlog.Journal`).
    """
    instance = Instance(config, allow_empty_journal=allow_empty_journal)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(instance.serve)
        if stats_file is not None:
            # before the ready file: whoever sees "ready" finds this process's statistics
            await nursery.start(
                write_statistics, instance.statistics, Path(stats_file), stats_interval
            )
        if ready_file is not None:
            write_ready_file(Path(ready_file), instance.name, listeners)
        task_status.started(instance)
