"""One amps-py instance: wiring. Each part lives in its own module; this one builds
them, connects them and runs them under one nursery.

The whole path of a publish (docs/ARCHITECTURE.md, "The picture")::

    Listeners (listeners.py) -> Session (session.py): frame decoded, logon, entitled?
      -> PublishPath.publish (publishing.py): duplicate? (durability.Ledgers)
           not journaled: Delivery.fan_out at once (delivery.py); done
           journaled:     JournalWriter.submit (writer.py) -> one commit, one fsync
      -> PublishPath.on_commit, after each commit:
           Delivery.fan_out -> live subscriptions (subscriptions.py), not yet the
               fully_durable ones while sync destinations have not acknowledged
           replication Destinations wake (replication/destination_stream.py): send, get acks
           DurableWindow (durable_window.py): durable = committed here and
               acknowledged by every sync destination the record is routed to
               (Instance.replication_acked -> advance); the watermark below which
               every record is durable
           Ledgers.settle -> Session.persisted_progress: the persisted acks
      bookmark replays (replay.py) read the journal up to the same visible txid
      (the watermark for fully_durable ones),
      then go live with no gap and no duplicate at the seam.

Records from upstream instances (replication/incoming.py) enter at the writer
(``submit_replicated``) and take the same commit path. The parts see the instance
through narrow views: ``host.py`` (sessions, replay, maintenance),
``replication/host.py`` and ``admin/host.py``.

``run.serve_instance`` runs an instance and reports the bound listener addresses
through ``task_status.started`` (so a caller learns port-0 ports with no sleep).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import trio

from amps_py import events, offload, reasons
from amps_py.auth_gate import AuthGate
from amps_py.config import (
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_LOGON_TIMEOUT,
    InstanceConfig,
    TransactionLogConfig,
    TransportConfig,
    security_warnings,
)
from amps_py.errors import JournalMaintenanceError
from amps_py.message_types import MessageTypes
from amps_py.protocol.server.commands import CommandFailed
from amps_py.queue import QueueMessage
from amps_py.replication import ReplicationManager
from amps_py.statistics import InstanceStatistics
from txlog import CorruptRecord, Journal, publisher_hash

from .conflated_topics import ConflatedTopic, run_conflated
from .counters import Counters
from .delivery import Delivery
from .disconnects import Disconnect, RecentDisconnects
from .limits import InstanceLimits, PoolSettings
from .listeners import Listeners
from .maintenance import JournalMaintenance, MaintenanceResult
from .name_owners import NameOwners, NameOwnersError
from .names import ClientNames
from .publishing import PublishPath
from .queue_checkpoint import CheckpointError
from .queues import CHECKPOINT_INTERVAL, QueueBook, ServedQueue
from .replay_cursors import ActiveReplays
from .session import Session
from .sow_expiry import EXPIRE_EVENT, run_sow_expiry
from .sowing import SowState
from .startup import ConfigurationError, open_access_control, open_journal, open_sow
from .subscriptions import SubscriptionRegistry
from .writer import JournalWriter

if TYPE_CHECKING:
    from amps_py.actions import ActionRunner

    from .host import HostedSession

log = logging.getLogger("amps_py.server")

#: what a session of an unknown transport gets (tests drive sessions directly)
_DEFAULT_TRANSPORT: Final = TransportConfig(
    name="", type="tcp", host="", port=0, protocol="amps", message_type=None
)


class Instance:
    """The running state of one instance. Create it, then ``await serve()``."""

    def __init__(self, config: InstanceConfig, *, allow_empty_journal: bool = False) -> None:
        self.config = config
        #: start an empty journal where one existed (``serve --allow-empty-journal``)
        self.allow_empty_journal = allow_empty_journal
        self.name = config.name
        self.actions: ActionRunner | None = None
        #: per enabled transport, the scope that stops it (admin disable)
        self.registry = SubscriptionRegistry()
        #: the sessions open, in the order they connected (a dict, not a set: iterating
        #: it must not depend on object addresses, for a repeatable simulation)
        self.sessions: dict[Session, None] = {}
        #: the recent disconnects and their counts by reason (admin, metrics)
        self.disconnects = RecentDisconnects()
        self._names = ClientNames()
        #: who owns each client name that holds publisher state (with a journal)
        self.name_owners: NameOwners | None = None
        self._conn_ids = itertools.count(1)
        self._journaled: dict[tuple[str, str], bool] = {}
        #: the message types this instance loads (the defaults and <MessageTypes>)
        self.message_types: MessageTypes = config.message_types
        self._filters: dict[str, Any] = {}
        self.replication: ReplicationManager | None = None
        #: journal segment maintenance (with a TransactionLog, once serving)
        self.maintenance: JournalMaintenance | None = None
        #: per running bookmark replay, the txid it has read through (journal removal
        #: never deletes what a replay still has to read)
        self.active_replays = ActiveReplays()
        self.group = config.group
        self.started_at = time.time()
        #: the last start's figures (see InstanceStatistics.startup)
        self.startup: dict[str, Any] = {}
        #: the transports (and the admin interface) and their bound addresses
        self.listeners = Listeners(
            config.transports, self._serve_client, self._setting, self._close_clients
        )
        #: message and command counts (sessions, replay and this instance count)
        self.counters = Counters()
        self.delivery = Delivery(self.counters, self.message_types)
        #: publishes in, deliveries and persisted acks out (see publishing.py)
        self.publishing = PublishPath(
            self.name,
            self.registry,
            self.delivery,
            self.counters,
            self.journals_topic,
            self.message_types,
        )
        p = self.publishing
        # the publish path's entry points, bound once (publish is the hot path)
        self.publish = p.publish
        self.publish_internal = p.publish_internal
        self.wait_for_commit = p.wait_for_commit
        self.wait_for_any_commit = p.wait_for_any_commit
        self.visible_txid = p.visible_txid
        self.held_seq = p.held_seq
        self.ledger = p.ledger
        self.note_replicated = p.note_replicated
        self.bytes_after = p.bytes_after
        self.bookmark_of = p.bookmark_of
        access = open_access_control(config)
        self.authenticator = access.authenticator
        self.entitler = access.entitler
        self.replication_authenticator = access.replication_authenticator
        self.replication_entitler = access.replication_entitler
        #: each transport's modules (its own, else the instance's)
        self.authenticator_for = access.authenticator_for
        self.entitler_for = access.entitler_for
        #: every password check (clients, replication hellos, the admin API)
        self.auth_gate = AuthGate()
        self._transports = {t.name: t for t in config.transports}
        #: MessageMemoryLimit and IncompleteMessageMemoryLimit pools, the instance's and
        #: the transports' own (sessions update them)
        self.limits = InstanceLimits(
            config.message_memory_budget(),
            config.incomplete_message_budget(),
            config.message_disk_limit,
            Path(config.message_disk_path) if config.message_disk_path else None,
            config.client_message_age_limit,
            transports={t.name: PoolSettings.of(t) for t in config.client_transports},
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
        capacity = self.config.client_capacity(t, self.limits.pools_for(transport).memory.limit)
        if t is None:
            return DEFAULT_LOGON_TIMEOUT, DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT, capacity
        return t.logon_timeout, t.incomplete_message_timeout, capacity

    def client_disk_capacity(self, transport: str) -> int:
        """ClientMaxCapacity as a share of the MessageDiskLimit pool of ``transport``
        (bytes), for an offline client of it."""
        disk = self.limits.pools_for(transport).disk
        return self.config.client_capacity(self._transports.get(transport), disk.limit)

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

    def journals_topic(self, topic: str, message_type: str = "json") -> bool:
        """Whether the TransactionLog records ``topic`` of ``message_type``."""
        key = (topic, message_type)
        known = self._journaled.get(key)
        if known is None:
            tl = self.config.transaction_log
            known = tl is not None and tl.journals(topic, message_type)
            if len(self._journaled) > 100_000:
                self._journaled.clear()
            self._journaled[key] = known
        return known

    def claim_client_name(self, session: HostedSession, name: str, user: str) -> str:
        """Register ``name`` for ``session``; return a refusal text, or "" when granted.

        With a transaction log, names are unique: the same name and user takes over
        (the old connection is closed, reason ``name in use``); a different user is
        refused.
        """
        if not name or self.journal is None:
            return ""
        refusal = self._names.claim(session, name, user)
        if not refusal:
            # the new session inherits what an earlier one still waits for: the
            # ledger lives on the publish path, not on the connection
            self.publishing.sessions[publisher_hash(name)] = session
            self._record_name_owner(name, user)
        return refusal

    def name_owner_refusal(self, name: str, user: str) -> str:
        """Why ``user`` may not log on with client name ``name`` (it holds publisher
        state and belongs to another user: :mod:`amps_py.server.name_owners`), or ""
        when it may."""
        owners = self.name_owners
        if not name or owners is None:
            return ""
        owner = owners.owner(name)
        if owner is None or owner == user:
            return ""
        last = self.held_seq(publisher_hash(name))
        if last == 0:
            return ""  # no publisher state: whoever logs on next takes the name
        return (
            f"client name {name!r} belongs to user {owner!r}, who holds its publisher state "
            f"(last seq {last}); log on with a client name of your own, or have an "
            "administrator of this instance hand it over (amps-py names give)"
        )

    def _record_name_owner(self, name: str, user: str) -> None:
        """``user`` logged on with ``name``: make it the owner (synced) unless it is."""
        owners = self.name_owners
        if owners is None or owners.owner(name) == user:
            return
        try:
            owners.set_owner(name, user)
        except NameOwnersError as exc:
            log.error("%s", exc, extra=events.extra(events.NAME_OWNER_UNRECORDED))

    def session_ended(self, session: HostedSession) -> None:
        self.sessions.pop(cast("Session", session), None)
        self.disconnects.record(
            Disconnect(
                time.time(),
                session.client_name,
                session.conn_id,
                session.peer,
                session.transport,
                session.close_reason or reasons.CONNECTION_CLOSED,
                session.close_detail,
            )
        )
        for sub in list(session.subscriptions.values()):
            self.registry.remove(sub)
        session.subscriptions.clear()
        if self.queues is not None:
            self.queues.session_ended(session)
        if self._names.release(session, session.client_name):
            self.publishing.sessions.pop(session.pub_hash, None)
            self.publishing.ledgers.forget_if_idle(session.pub_hash)

    # ---------------------------------------------------------------- the journal
    @property
    def journal(self) -> Journal | None:
        return self.publishing.journal

    @property
    def writer(self) -> JournalWriter | None:
        return self.publishing.writer

    @property
    def committed_txid(self) -> int:
        """The newest txid committed to the local journal (0 without a journal)."""
        return self.publishing.committed_txid

    @property
    def durable_txid(self) -> int:
        """The newest txid durable by the persisted-ack rule."""
        return self.publishing.durable_txid

    @property
    def sow(self) -> SowState:
        """The SOW topics and their stores (empty without SOW)."""
        return self.publishing.sow

    @property
    def last_durable_bookmark(self) -> str:
        return self.publishing.window.last_bookmark

    # ---------------------------------------------------------------- operating

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
        self.sessions[session] = None
        try:
            await session.run()
        except Exception as exc:
            from amps_py.trio_util import connection_error_words, is_connection_error

            if is_connection_error(exc):
                # the connection broke (under several of the session's tasks at once):
                # a disconnect, not a failure
                log.info(
                    "client %r (%s) disconnected: %s",
                    session.client_name,
                    peer,
                    connection_error_words(exc),
                    extra=events.extra(events.CLIENT_DISCONNECTED),
                )
                return
            # a bug in one session must not take the instance down
            log.exception(
                "session of client %r (%s) failed",
                session.client_name,
                peer,
                extra=events.extra(events.CLIENT_DISCONNECTED),
            )

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
        self.publishing.advance_durable()

    def replication_changed(self) -> None:
        """A destination connected, disconnected or changed sync/async."""
        self.publishing.advance_durable()

    def acks_waiting_for(self, destination: str) -> int:
        """How many committed records routed to sync destination ``destination`` wait
        for its acknowledgement before they are durable."""
        return self.publishing.acks_waiting_for(destination)

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
        for warning in security_warnings(config):
            log.warning(warning, extra=events.extra(events.CONFIG_SECURITY_WARNING))
        tl = config.transaction_log
        try:
            async with trio.open_nursery() as nursery:
                if tl is not None:
                    journal = await offload.run_sync(self._open_journal, tl)
                    if config.sow_topics:
                        sow = await open_sow(
                            config.sow_topics,
                            journal,
                            tl,
                            self.message_types,
                            config.conflated_topics,
                        )
                        self.publishing.sow, self.publishing.sow_topics = sow, sow.topics
                    if config.queues:
                        self.publishing.queues = await self._open_queues(journal)
                    self.name_owners = await offload.run_sync(
                        self._open_name_owners, journal, tl.journal_directory
                    )
                    writer = self.publishing.open(
                        journal, keep_recent=bool(self.config.replication)
                    )
                    nursery.start_soon(self._run_writer, writer)
                    if config.replication or config.replication_transport is not None:
                        self.replication = ReplicationManager(self)
                        self.publishing.replication = self.replication
                    self.maintenance = JournalMaintenance(self)
                    nursery.start_soon(self.maintenance.run)
                elif config.replication or config.replication_transport is not None:
                    raise ConfigurationError(
                        "replication needs a TransactionLog: only journaled messages "
                        "replicate; add a TransactionLog with the replicated topics"
                    )
                nursery.start_soon(self.auth_gate.run)
                self.listeners.replication = self.replication
                await self.listeners.start(nursery)
                if self.replication is not None:
                    nursery.start_soon(self.replication.run)
                if config.actions:
                    from amps_py.actions import ActionRunner

                    self.actions = ActionRunner(self, config.actions)
                    await nursery.start(self.actions.run)
                if self.queues is not None:  # after the actions: expiries fire them
                    nursery.start_soon(self.queues.run)
                    nursery.start_soon(self.queues.run_checkpoints)
                if self.sow:
                    nursery.start_soon(self._stamp_sow_stores)
                for conflated in self.sow.conflated.values():
                    assert isinstance(conflated, ConflatedTopic)
                    nursery.start_soon(run_conflated, conflated, self.registry, self.delivery)
                if self.sow.expiring:  # after the actions: expiries fire them
                    p = self.publishing
                    nursery.start_soon(run_sow_expiry, p.sow, p.out_of_focus, self.fire_action)
                if config.admin is not None:
                    await self.listeners.start_admin(nursery, self, *config.admin, config.admin_tls)
                self.startup = {
                    "seconds": round(time.time() - self.started_at, 3),
                    "journal_records_read": self.sow.records_read
                    + (self.queues.records_read if self.queues is not None else 0),
                    "queue_messages_loaded": (
                        self.queues.messages_loaded if self.queues is not None else 0
                    ),
                }
                log.info(
                    "instance %s ready: %s",
                    self.name,
                    ", ".join(f"{n}={h}:{p}" for n, (h, p) in self.listeners.bound.items()),
                    extra=events.extra(events.INSTANCE_READY),
                )
                task_status.started(dict(self.listeners.bound))
        finally:
            try:
                if self.name_owners is not None:
                    self.name_owners.close()
                if self.queues is not None:
                    self.queues.close()  # the last checkpoints, before the journal closes
                self.publishing.sow.close()
            finally:
                if self.journal is not None:
                    self.journal.close()
            log.info("instance %s stopped", self.name, extra=events.extra(events.INSTANCE_STOPPED))

    @property
    def queues(self) -> QueueBook | None:
        """The message queues (None when none is configured)."""
        return self.publishing.queues

    @staticmethod
    def _open_name_owners(journal: Journal, directory: Path) -> NameOwners:
        """The client-name owners, without the names that hold no publisher state."""
        try:
            owners = NameOwners.of_journal(directory)
        except NameOwnersError as exc:
            raise ConfigurationError(str(exc)) from None
        forgotten = owners.forget_stateless(
            lambda name: journal.publisher_last_seq(publisher_hash(name)) > 0
        )
        if forgotten:
            log.info("%d client name(s) without publisher state left the owner list", forgotten)
        return owners

    async def _open_queues(self, journal: Journal) -> QueueBook:
        """Build the queues from the journal (before anything new commits)."""
        book = QueueBook(
            self.config.queues,
            self.name,
            self.compile_filter,
            self._journal_queue_record,
            self._queue_message_expired,
            self._reachable_peers,
            self.message_types,
        )
        tl = self.config.transaction_log
        assert tl is not None
        try:
            await offload.run_sync(book.open, journal, tl.journal_directory / "queues")
        except CheckpointError as exc:
            raise ConfigurationError(str(exc)) from None
        return book

    async def _stamp_sow_stores(self) -> None:
        """Every second, record in each SOW store that it is current through the
        newest commit applied, records of its topic or not (so a start reads only the
        journal after that, whichever topics were busy)."""
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL)
            self.sow.stamp()

    def _reachable_peers(self) -> set[str]:
        """The instances known reachable through replication now."""
        replication = self.replication
        return replication.connected_peers() if replication is not None else set()

    def set_proxied_transfer(self, queue: str, enabled: bool) -> str:
        """Enable or disable proxied transfer on ``queue`` (admin API, CLI, actions).

        Raises:
            KeyError: no such queue (the message lists them).
        """
        if self.queues is None:
            raise KeyError(f"there is no queue {queue!r}: this instance has no queues")
        return self.queues.set_proxied_transfer(queue, enabled)

    def _journal_queue_record(
        self,
        queue: str,
        payload: bytes,
        kind: int,
        on_committed: Callable[[bool, str], None] | None = None,
    ) -> None:
        """Journal (and so replicate) a record of ``queue``: messages leaving it
        (``QUEUE_ACK``), or ownership traffic (``QUEUE_TRANSFER``); ``on_committed`` is
        called once it is committed (or failed). The record has the queue's message
        type, so replication routes it with the queue's messages."""
        served = self.queues.get(queue) if self.queues is not None else None
        mtype = served.config.message_type if served is not None else "json"
        self.publishing.publish_internal(
            queue, payload, kind=kind, on_committed=on_committed, message_type=mtype
        )

    def _queue_message_expired(self, queue: ServedQueue, message: QueueMessage) -> None:
        """A queue message expired here: ``amps-action-on-sow-expire-message`` runs
        (the dead-letter hook)."""
        try:
            payload = queue.payload_of(message)
        except CorruptRecord:
            payload = b""  # the action still runs: AMPS_DATA_LENGTH 0 says there is none
        self.fire_action(
            EXPIRE_EVENT,
            {
                "AMPS_TOPIC": queue.name,
                "AMPS_DATA": payload.decode("utf-8", errors="replace"),
                "AMPS_DATA_LENGTH": str(len(payload)),
                "AMPS_REASON": "expired",
                "AMPS_CORRELATION_ID": message.correlation_id,
                "AMPS_BOOKMARK": message.bookmark,
                "AMPS_DELIVERIES": str(message.deliveries),
            },
        )

    def _open_journal(self, tl: TransactionLogConfig) -> Journal:
        """Open the journal (in a worker thread); see :func:`startup.open_journal`."""
        return open_journal(tl, self.name, allow_empty=self.allow_empty_journal)

    async def _run_writer(self, writer: JournalWriter) -> None:
        try:
            await writer.run()
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
            limits={
                **self.limits.statistics(),
                "connections": self.listeners.connection_statistics(),
                "replication_handshakes": (
                    self.replication.prehello.statistics() if self.replication else None
                ),
            },
            sow=self.publishing.sow.statistics(),
            queues=self.queues.statistics() if self.queues is not None else {},
            startup=dict(self.startup),
            unparsed_payloads=dict(self.counters.unparsed),
        )


if TYPE_CHECKING:
    from amps_py.admin.host import AdminHost
    from amps_py.replication.host import ReplicationHost

    from .host import MaintenanceHost, SessionHost

    def _instance_is_every_host(
        instance: Instance,
    ) -> tuple[AdminHost, ReplicationHost, SessionHost, MaintenanceHost]:
        """For mypy only: the instance satisfies each narrow view its parts take."""
        return instance, instance, instance, instance
