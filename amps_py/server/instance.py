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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import auth, events
from amps_py.config import (
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_LOGON_TIMEOUT,
    InstanceConfig,
    TransactionLogConfig,
    TransportConfig,
)
from amps_py.errors import JournalMaintenanceError
from amps_py.replication import ReplicationManager
from amps_py.statistics import InstanceStatistics
from txlog import Journal, publisher_hash

from .counters import Counters
from .delivery import Delivery
from .limits import InstanceLimits
from .listeners import Listeners, cannot_listen
from .maintenance import JournalMaintenance, MaintenanceResult
from .publishing import PublishPath
from .replay import ActiveReplays
from .session import CommandFailed, Session
from .startup import ConfigurationError, listen_failure, open_journal, os_error_in
from .statsfile import write_ready_file, write_statistics
from .subscriptions import SubscriptionRegistry
from .writer import JournalWriter

if TYPE_CHECKING:
    from amps_py.actions import ActionRunner

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
        self.sessions: set[Session] = set()
        self._names: dict[str, Session] = {}
        self._conn_ids = itertools.count(1)
        self._journaled: dict[str, bool] = {}
        self._filters: dict[str, Any] = {}
        self.replication: ReplicationManager | None = None
        #: journal segment maintenance (with a TransactionLog, once serving)
        self.maintenance: JournalMaintenance | None = None
        #: per running bookmark replay, the txid it has read through (journal removal
        #: never deletes what a replay still has to read)
        self.active_replays = ActiveReplays()
        self.group = config.group
        self.started_at = time.time()
        #: the transports (and the admin interface) and their bound addresses
        self.listeners = Listeners(
            config.transports, self._serve_client, self._setting, self._close_clients
        )
        #: message and command counts (sessions, replay and this instance count)
        self.counters = Counters()
        self.delivery = Delivery(self.counters)
        #: publishes in, deliveries and persisted acks out (see publishing.py)
        self.publishing = PublishPath(
            self.name, self.registry, self.delivery, self.counters, self.journals_topic
        )
        p = self.publishing
        # the publish path's entry points, bound once (publish is the hot path)
        self.publish = p.publish
        self.publish_internal = p.publish_internal
        self.wait_for_commit = p.wait_for_commit
        self.visible_txid = p.visible_txid
        self.held_seq = p.held_seq
        self.ledger = p.ledger
        self.note_replicated = p.note_replicated
        self.bytes_after = p.bytes_after
        self.bookmark_of = p.bookmark_of
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
                raise CommandFailed("bad filter", str(exc)) from None
            if len(self._filters) > 10_000:
                self._filters.clear()
            self._filters[text] = flt
        return flt

    def journals_topic(self, topic: str) -> bool:
        known = self._journaled.get(topic)
        if known is None:
            tl = self.config.transaction_log
            known = tl is not None and tl.journals(topic, self.publishing.message_type)
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
            current.close("name in use")
        # the new session inherits what an earlier one still waits for: the ledger
        # lives on the instance
        self._names[name] = session
        self.publishing.sessions[publisher_hash(name)] = session
        return ""

    def session_ended(self, session: Session) -> None:
        self.sessions.discard(session)
        for sub in list(session.subscriptions.values()):
            self.registry.remove(sub)
        session.subscriptions.clear()
        if session.client_name and self._names.get(session.client_name) is session:
            del self._names[session.client_name]
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
                    journal = await trio.to_thread.run_sync(self._open_journal, tl)
                    log.info(
                        "journal %s opened: last txid %d, durability %s, compression %s",
                        tl.journal_directory,
                        journal.last_txid,
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
                    writer = self.publishing.open(journal)
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


if TYPE_CHECKING:
    from amps_py.admin.host import AdminHost
    from amps_py.replication.host import ReplicationHost

    from .host import MaintenanceHost, SessionHost

    def _instance_is_every_host(
        instance: Instance,
    ) -> tuple[AdminHost, ReplicationHost, SessionHost, MaintenanceHost]:
        """For mypy only: the instance satisfies each narrow view its parts take."""
        return instance, instance, instance, instance
