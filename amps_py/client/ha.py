"""The HA client: one logical connection to a fabric of equivalent servers.

Use it through :func:`open_ha_client`; it connects in the background, and reconnects
and fails over by itself for as long as the block runs::

    async with open_ha_client("pub", ["tcp://a:9007/amps/json", "tcp://b:9007/amps/json"],
                              heartbeat=1.0, on_state=print) as ha:
        seq = await ha.publish("orders", b'{"id": 1}')
        await ha.wait_persisted(seq)
        async with ha.subscribe("orders", bookmark="0", sub_id="orders-reader") as sub:
            async for message in sub:
                handle(message, again=message.possible_duplicate)
                message.processed()

Connections: ``servers`` is a list of equivalent URIs (tried in turn) or a callable
returning the URI to try (see :mod:`amps_py.client.ha_policy` for the order and the
back-off). Every connection logs on with the same client name, so the server knows
the publisher again. ``on_state(state, detail)`` is called (and the change logged) with
:data:`CONNECTED` after each logon and replay, :data:`FAILED_OVER` right after it when
the server differs from the previous one, :data:`RESUBSCRIBED` once every subscription
is re-established after a reconnect, and :data:`DISCONNECTED` when a connection is
lost (``detail["reason"]``).

Publishing: every publish goes into the publish store first (it waits while the store
is full, until persisted acks free room) and is sent from there, the store synced
once per group of sends. After each logon the client discards what the logon ack's
``s`` covers (the server holds everything of this client name up to ``s``), and
republishes the rest in sequence order before any new publish is sent. Persisted acks
discard what they cover; :meth:`HAClient.wait_persisted` waits for one.

Subscriptions: a bookmark subscription (``bookmark=`` given) passes each message
through the bookmark store: one the application already processed is dropped, one
that may have been delivered before (after a reconnect) is handed over with
``message.possible_duplicate`` set. Call ``message.processed()`` when done with a
message: after a reconnect the subscription resumes after the last message processed
(per publisher, contiguously), not the last one received. A live subscription (no
bookmark) is re-established as it was; what was published while it was down is not
replayed.

Queues: a subscription to a queue's name (``max_backlog=``, ``auto_ack=``) is renewed
after a reconnect like any other and goes on consuming where it is, on the same server
or the other one of a replicated-queue pair. What it had leased and not acknowledged
went back to the queue when its connection dropped (the server does that; if the
server died, its peers hold the messages: they deliver a dead owner's messages once
proxied transfer is enabled there) and is delivered again. ``message.ack()`` sends a
plain acknowledgement on the current connection; one the server had not confirmed when
the connection was lost, or made while there was none, is sent on the next connection
before the subscriptions are renewed. A cancel or expire of a message leased on a
connection that is gone is not sent (see :meth:`HAClient.ack` for why each is safe).

Heartbeats: with ``heartbeat=seconds`` the server is asked to heartbeat at that
interval; a connection from which nothing arrives for two intervals (any frame
re-arms the watchdog) is dropped and the client fails over.

Resource handling: leaving the block closes the connection, ends every subscription
iterator and syncs both stores; stores passed in are not closed (their owner closes
them), the default in-memory ones are dropped. Publishes not yet persisted stay in the
publish store: call :meth:`HAClient.flush` first to wait for them.

Error handling: losing a connection, failing to connect or log on, and a silent
server are never raised to the caller: the client retries, for as long as the block
runs, or until ``failover_timeout`` seconds pass without a logon: then the block ends
with :class:`NoServerReachable` (what waited is cancelled; the publish store keeps what
was not acknowledged). A subscription the server
refuses raises :class:`CommandError` from :meth:`HAClient.subscribe`, or, when the
refusal comes at a resubscribe, ends that subscription's iterator (``sub.failure``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from amps_py import offload
from amps_py.protocol import encode_frame
from amps_py.redact import redact_uris
from amps_py.trio_util import unwrapping_groups

from .bookmark_store import MemoryBookmarkStore
from .client import Client, open_client
from .ha_policy import Backoff, ServerChooser
from .ha_sow import HASowSubscription
from .ha_subscription import HAMessage as HAMessage
from .ha_subscription import HASubscription
from .publish_store import MemoryPublishStore
from .queue import DEFAULT_ACK_BATCH_SIZE, DEFAULT_ACK_TIMEOUT
from .queue import send_pending as send_pending_acks
from .sow import MAX_BATCH_SIZE
from .store_api import (
    SOW_DELETE_BY_DATA,
    SOW_DELETE_BY_FILTER,
    SOW_DELETE_BY_KEYS,
    SOW_DELETES,
    BookmarkStore,
    PublishStore,
    StoredPublish,
)
from .subscription import AMPSError, CommandError, ConnectionLost

__all__ = [
    "CONNECTED",
    "DISCONNECTED",
    "FAILED_OVER",
    "RESUBSCRIBED",
    "HAClient",
    "HAMessage",
    "HASowSubscription",
    "HASubscription",
    "NoServerReachable",
    "ServerSilent",
    "open_ha_client",
]

log = logging.getLogger("amps_py.client.ha")

#: a connection is logged on and the unacknowledged publishes are republished
CONNECTED: Final = "connected"
#: the connection was lost (``detail["reason"]`` says why)
DISCONNECTED: Final = "disconnected"
#: the new connection is to another server than the previous one
FAILED_OVER: Final = "failed_over"
#: every subscription was re-established after a reconnect
RESUBSCRIBED: Final = "resubscribed"

#: a silent server is dropped after this many heartbeat intervals without a frame
SILENT_INTERVALS: Final = 2
#: a connection lost sooner than this after its logon counts as a failed attempt (the
#: back-off keeps growing): a server that accepts logons and drops them at once is not
#: redialled in a tight loop
HEALTHY_CONNECTION: Final = 2.0
#: bytes of replayed publishes written to the socket at a time
REPLAY_CHUNK: Final = 1024 * 1024

StateCallback = Callable[[str, dict[str, Any]], None]

# what ends a connection (and makes the client try again), as opposed to a bug
_CONNECTION_ERRORS: Final = (
    ConnectionLost,
    CommandError,  # a refused logon or heartbeat request
    OSError,
    TimeoutError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


#: what a send on a connection that is going raises
_LOST: Final = (ConnectionLost, trio.BrokenResourceError, trio.ClosedResourceError)


class ServerSilent(ConnectionLost):
    """Nothing arrived from the server for two heartbeat intervals."""


class NoServerReachable(ConnectionLost):
    """No server could be reached for ``failover_timeout`` seconds: the HA client gave
    up (the message names each server and why its last attempt failed)."""


@dataclass
class _Live:
    """The current connection, once logged on and replayed."""

    client: Client
    uri: str
    nursery: trio.Nursery
    #: its number (:attr:`HAClient.connections` when it logged on)
    connection: int
    #: set once the connection is over
    ended: trio.Event = field(default_factory=trio.Event)


class HAClient:
    """A publisher and subscriber that survives failures. Create it with
    :func:`open_ha_client` (which documents the arguments).

    Attributes:
        uri: the server of the current (or last) connection; "" before the first.
        connections: successful logons so far.
        failed_publishes: publishes the server reported as not stored: seq -> the
            failure ack (a later persisted ack still discards them from the store).
        not_journaled_seq: the newest seq whose persisted ack said the topic is not
            journaled on that instance (acknowledged, not stored); 0 if none.
        acks_resent: queue acknowledgements sent on a later connection than the one
            they were made for (see :meth:`ack`).
        stale_acks_dropped: cancels and expires not sent because the message's lease
            ended with its connection (see :meth:`ack`).
    """

    def __init__(
        self,
        name: str,
        servers: Sequence[str] | Callable[[], str],
        *,
        publish_store: PublishStore | None = None,
        bookmark_store: BookmarkStore | None = None,
        heartbeat: float | None = None,
        reconnect_delay: float = 0.05,
        max_reconnect_delay: float = 5.0,
        connect_timeout: float = 10.0,
        on_state: StateCallback | None = None,
        ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        failover_timeout: float | None = None,
        **logon_fields: Any,
    ) -> None:
        if failover_timeout is not None and failover_timeout <= 0:
            raise ValueError(
                f"failover_timeout must be a positive number of seconds, got {failover_timeout:g}"
            )
        if ack_batch_size < 1:
            raise ValueError(f"ack_batch_size must be 1 or more, got {ack_batch_size}")
        if ack_timeout <= 0:
            raise ValueError(f"ack_timeout must be more than 0 seconds, got {ack_timeout:g}")
        if heartbeat is not None and heartbeat <= 0:
            raise ValueError(f"heartbeat must be a positive number of seconds, got {heartbeat:g}")
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be positive, got {connect_timeout:g}")
        self.name = name
        self.chooser = ServerChooser(servers)
        self.backoff = Backoff(
            reconnect_delay, max_reconnect_delay, round_size=self.chooser.round_size
        )
        # (an empty store is falsy: it has __len__)
        self.publish_store: PublishStore = (
            MemoryPublishStore() if publish_store is None else publish_store
        )
        self.bookmark_store: BookmarkStore = (
            MemoryBookmarkStore() if bookmark_store is None else bookmark_store
        )
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self.on_state = on_state
        self.logon_fields = logon_fields
        self.uri = ""
        self.connections = 0
        self.failed_publishes: dict[int, dict[str, Any]] = {}
        self.not_journaled_seq = 0
        self.ack_batch_size = ack_batch_size
        self.ack_timeout = ack_timeout
        self.failover_timeout = failover_timeout
        self.acks_resent = 0
        self.stale_acks_dropped = 0
        #: queue acknowledgements for the next connection: topic -> bookmarks (a dict
        #: for its order and to hold each once)
        self._unsent_acks: dict[str, dict[str, None]] = {}
        self._live: _Live | None = None
        self._connected = trio.Event()
        self._subs: dict[str, HASubscription] = {}
        self._sub_ids = itertools.count(1)
        # the stores are used from one task at a time (store_api): this lock
        self._store_lock = trio.Lock()
        self._pending: list[StoredPublish] = []  # stored, not yet sent on this connection
        self._pending_ready = trio.Event()
        self._discarded = trio.Event()  # replaced after each discard or failure ack

    # ---------------------------------------------------------------- state
    @property
    def connected(self) -> bool:
        """Whether a connection is logged on (and its replay written)."""
        return self._live is not None

    async def wait_connected(self, timeout: float = 30) -> str:
        """Wait until a connection is logged on; returns its URI.

        Raises:
            TimeoutError: no server could be reached within ``timeout`` seconds.
        """
        with trio.move_on_after(timeout):
            await self._connected.wait()
            return self.uri
        raise TimeoutError(f"{self.name}: no server reachable within {timeout:g} s")

    def _state(self, state: str, **detail: Any) -> None:
        log.info("HA client %r: %s %s", self.name, state, detail)
        if self.on_state is not None:
            try:
                self.on_state(state, detail)
            except Exception:
                log.exception("HA client %r: on_state(%r) raised; ignored", self.name, state)

    # ---------------------------------------------------------------- connecting
    async def _run(self) -> None:
        """Connect, serve the connection until it is lost, and again; forever, or until
        ``failover_timeout`` passes without a logon (then raise
        :class:`NoServerReachable`)."""
        failures = 0
        previous = ""
        down_since = trio.current_time()
        errors: dict[str, str] = {}  # uri -> why its last attempt failed
        while True:
            deadline = math.inf
            if self.failover_timeout is not None:
                deadline = down_since + self.failover_timeout
            delay = self.backoff.delay(failures)
            if delay:
                await trio.sleep_until(min(trio.current_time() + delay, deadline))
            if trio.current_time() >= deadline:
                raise self._unreachable(errors)
            uri = self.chooser.choose()
            logged_on = False
            logged_on_at = 0.0
            attempt = trio.CancelScope(deadline=deadline)

            def on_logon(uri: str = uri, attempt: trio.CancelScope = attempt) -> None:
                nonlocal logged_on, logged_on_at, previous
                logged_on = True
                logged_on_at = trio.current_time()
                attempt.deadline = math.inf  # in service: no failover deadline
                if previous and uri != previous:
                    self._state(FAILED_OVER, uri=uri, previous=previous)
                previous = uri

            reason: BaseException = ConnectionLost("connection ended")
            with attempt:
                try:
                    await self._session(uri, on_logon)
                except _CONNECTION_ERRORS as exc:
                    reason = exc
            if attempt.cancelled_caught:
                reason = TimeoutError("still trying when failover_timeout ran out")
            if self._live is not None:
                self._live.ended.set()
            self._live = None
            if self._connected.is_set():  # (an unset one has waiters: keep it)
                self._connected = trio.Event()
            self.chooser.advance()
            if logged_on:
                self._state(DISCONNECTED, uri=uri, reason=str(reason))
                lasted = trio.current_time() - logged_on_at
                failures = 0 if lasted >= HEALTHY_CONNECTION else failures + 1
                down_since = trio.current_time()
                errors.clear()
            else:
                failures += 1
                errors[uri] = str(reason)
                log.warning(
                    "HA client %r: cannot use %s (%s); next attempt in %.3g s",
                    self.name,
                    redact_uris(uri),
                    reason,
                    self.backoff.delay(failures),
                )

    def _unreachable(self, errors: dict[str, str]) -> NoServerReachable:
        """The error that ends the client when ``failover_timeout`` ran out."""
        tried = "; ".join(f"{redact_uris(uri)}: {why}" for uri, why in errors.items())
        kept = len(self.publish_store)
        exc = NoServerReachable(
            f"{self.name}: no server could be reached for {self.failover_timeout:g} s "
            f"(failover_timeout): {tried or 'no attempt finished'}. "
            + (
                f"The publish store keeps {kept} publish(es) not acknowledged: open the "
                "client again with the same store to send them. "
                if kept
                else ""
            )
            + "Check that the servers run and that their client transports listen "
            "where the URIs say."
        )
        log.error("HA client %r: %s", self.name, exc)
        return exc

    async def _session(self, uri: str, on_logon: Callable[[], None]) -> None:
        """One connection, from logon until it is lost (raises why)."""
        async with open_client(
            uri,
            self.name,
            timeout=self.connect_timeout,
            ack_batch_size=self.ack_batch_size,
            ack_timeout=self.ack_timeout,
            **self.logon_fields,
        ) as client:
            try:
                async with unwrapping_groups(_CONNECTION_ERRORS), trio.open_nursery() as nursery:
                    await self._serve(client, uri, nursery, on_logon)
            finally:
                live = self._live
                if live is not None and live.client is client:
                    self._live = None  # from here on, acks are kept for the next one
                    live.ended.set()
                if client.closed is not None:
                    self._take_over_acks(client)

    async def _serve(
        self, client: Client, uri: str, nursery: trio.Nursery, on_logon: Callable[[], None]
    ) -> None:
        """Bring a logged-on connection into service: heartbeats, the publish replay,
        the queue acknowledgements kept from the last one, every subscription."""
        if self.heartbeat is not None:
            nursery.start_soon(self._watchdog, client, uri, self.heartbeat)
            await client.heartbeat(self.heartbeat)
        held = int(client.logon_ack.get("s", 0) or 0)
        republished, discarded = await self._replay(client, held)
        self.uri = uri
        self.connections += 1
        reconnect = self.connections > 1
        self._state(CONNECTED, uri=uri, held=held, republished=republished, discarded=discarded)
        on_logon()
        nursery.start_soon(self._sender, client)
        nursery.start_soon(self._ack_watcher, client)
        live = self._live = _Live(client, uri, nursery, self.connections)
        # before the resubscribes, so that the server removes what the application
        # processed before it could lease it again (new acks go to ``client`` now)
        await self._resend_acks(client)
        subs = list(self._subs.values())  # later ones subscribe themselves
        for sub in subs:
            await self._start_pump(live, sub, resubscribe=True)
        if reconnect:
            self._state(RESUBSCRIBED, uri=uri, subscriptions=len(subs))
        self._connected.set()

    # ---------------------------------------------------------------- queue acks
    def _take_over_acks(self, client: Client) -> None:
        """The connection of ``client`` is lost: keep the plain acknowledgements it had
        not had confirmed (batched, or sent and not answered) to send on the next one
        (see :meth:`ack`)."""
        for topic, bookmarks in client._acks.unconfirmed().items():
            kept = self._unsent_acks.setdefault(topic, {})
            kept.update(dict.fromkeys(bookmarks))
        client._acks.forget()

    async def _resend_acks(self, client: Client) -> None:
        """Send the acknowledgements kept from earlier connections (each topic's as one
        batch through ``client``'s batching)."""
        pending, self._unsent_acks = self._unsent_acks, {}
        try:
            for topic, marks in pending.items():
                log.info(
                    "HA client %r: acknowledging %d message(s) of %r on %s (made while no "
                    "connection could take them, or not confirmed before one was lost)",
                    self.name,
                    len(marks),
                    topic,
                    redact_uris(self.uri),
                )
                for bookmark in marks:
                    await client.ack(topic, bookmark)
                self.acks_resent += len(marks)
            await send_pending_acks(client)
        except BaseException:
            # lost meanwhile: keep them all (one acknowledged twice is harmless)
            for topic, marks in pending.items():
                self._unsent_acks.setdefault(topic, {}).update(marks)
            raise

    async def ack(
        self, topic: str, bookmark: str, *, cancel: bool = False, expire: bool = False
    ) -> None:
        """Acknowledge the queue message ``bookmark`` of ``topic`` (``message.ack()``
        of an :class:`HAMessage` calls this for its own connection).

        A plain acknowledgement (processed: the message leaves the queue) goes through
        the current connection's batching (``ack_batch_size``, ``ack_timeout``). When
        there is no connection, or the connection is lost before the server confirmed
        it, it is kept and sent again on the next connection, before the
        subscriptions are renewed. That is harmless whatever happened meanwhile: the
        server removes a message it still holds (it was processed: nobody needs it
        again; under ``Leasing`` ``strict`` not one leased to another consumer
        meanwhile, which then acknowledges it itself), and ignores a bookmark it no
        longer holds (acknowledged already). Bookmarks name the same message on every
        instance, so this holds on the server failed over to as well.
        The lease the message had ended with its connection, though: the server
        returned it to the queue, and it may have been delivered again (to this
        consumer or another) before the acknowledgement arrives.

        ``cancel=True`` (return it to the queue) and ``expire=True`` (expire it) act
        on the lease, so they are only sent for a message leased on the current
        connection (see :meth:`HAMessage.ack`); through this method they go to the
        current connection, or nowhere when there is none (counted in
        :attr:`stale_acks_dropped`): the lease is gone, the message is back in the
        queue and will be delivered again.

        Raises:
            CommandError: the server refused an earlier acknowledgement.
            ValueError: no bookmark, or both ``cancel`` and ``expire``.
        """
        await self._ack(topic, bookmark, cancel, expire, None)

    async def _ack(
        self, topic: str, bookmark: str, cancel: bool, expire: bool, connection: int | None
    ) -> None:
        """:meth:`ack`; ``connection``: the connection (:attr:`connections` count) the
        message was leased on, None when not known (the current one)."""
        if not bookmark:
            raise ValueError(
                f"acknowledging a message of {topic!r} needs its bookmark (message.bookmark)"
            )
        if cancel and expire:
            raise ValueError("give cancel=True or expire=True, not both")
        live = self._live
        current = live is not None and (connection is None or connection == live.connection)
        if (cancel or expire) and not current:
            self.stale_acks_dropped += 1
            log.info(
                "HA client %r: %s of %s on %r not sent: it was leased on a connection "
                "that is gone, so the server has returned it to the queue already",
                self.name,
                "cancel" if cancel else "expire",
                bookmark,
                topic,
            )
            return
        if live is not None:
            try:
                await live.client.ack(topic, bookmark, cancel=cancel, expire=expire)
                return
            except _LOST:
                if cancel or expire:
                    self.stale_acks_dropped += 1
                    return
                if self._live is not live:  # the session is over: keep it for the next
                    self._unsent_acks.setdefault(topic, {})[bookmark] = None
                else:  # the session ends soon and takes over what its client holds
                    live.client._acks.keep(topic, [bookmark])
                return
        self._unsent_acks.setdefault(topic, {})[bookmark] = None

    async def flush_acks(self, *, timeout: float = 30) -> None:
        """Wait until every acknowledgement made so far was sent and answered by the
        server, across reconnects (those kept from a lost connection are sent on the
        next one first).

        Raises:
            CommandError: the server refused an acknowledgement.
            TimeoutError: not done within ``timeout`` seconds (e.g. no server).
        """
        with trio.move_on_after(timeout):
            while True:
                live = self._live
                if live is None:
                    await self._connected.wait()
                    continue
                try:
                    if self._unsent_acks:
                        await self._resend_acks(live.client)
                    await live.client.flush_acks(timeout=math.inf)
                except _LOST:
                    await live.ended.wait()  # then the next connection sends them
                    continue
                return
        raise TimeoutError(
            f"{self.name}: acknowledgements not confirmed within {timeout:g} s "
            f"({'connected to ' + self.uri if self.connected else 'not connected'})"
        )

    async def _watchdog(self, client: Client, uri: str, interval: float) -> None:
        """Drop the connection when nothing arrived for ``SILENT_INTERVALS`` intervals;
        every frame received re-arms it (the deadline follows ``client.received_at``)."""
        limit = SILENT_INTERVALS * interval
        while True:
            deadline = client.received_at + limit
            now = trio.current_time()
            if now >= deadline:
                exc = ServerSilent(
                    f"{redact_uris(uri)} sent nothing for {now - client.received_at:.2f} s "
                    f"(heartbeat every {interval:g} s); failing over"
                )
                client._shutdown(exc)  # no goodbyes (unsubscribes) to a silent server
                raise exc
            await trio.sleep_until(deadline)

    # ---------------------------------------------------------------- publishing
    async def _replay(self, client: Client, held: int) -> tuple[int, int]:
        """After a logon: discard what the server holds (``held``, the logon ack's
        ``s``), republish the rest in order; new publishes wait (the store lock) until
        it is written. Returns (republished, discarded)."""
        store = self.publish_store
        async with self._store_lock:
            before = store.discarded_through
            discarded = await offload.run_sync(store.discard_through, held)
            if held < before:
                log.warning(
                    "HA client %r: %s holds this client's publishes only up to seq %d, but "
                    "seqs up to %d were acknowledged before (by another server that has "
                    "not replicated them here); they are not republished",
                    self.name,
                    client.name,
                    held,
                    before,
                )
            if store.last_seq < held:
                log.error(
                    "HA client %r: the server already holds seq %d of this client name but "
                    "the publish store assigned only up to %d; new publishes would be taken "
                    "for duplicates. Use the store that belongs to this client name, or "
                    "another client name",
                    self.name,
                    held,
                    store.last_seq,
                )
            tail = await offload.run_sync(lambda: list(store.unacked()))
            self._pending.clear()  # the replay covers them
            await offload.run_sync(store.sync)
            chunk: list[bytes] = []
            size = 0
            for kept in tail:
                frame = _publish_frame(kept)
                chunk.append(frame)
                size += len(frame)
                if size >= REPLAY_CHUNK:
                    await client.send_raw(b"".join(chunk))
                    chunk, size = [], 0
            if chunk:
                await client.send_raw(b"".join(chunk))
        if discarded:
            self._discard_done()
        return len(tail), discarded

    async def _sender(self, client: Client) -> None:
        """Send what publishers stored, a group at a time: one store sync per group,
        then one socket write.

        The group is what was stored since the last one: while a sync runs, publishers
        store the next group, if the store allows it (:func:`_sync_is_concurrent`);
        otherwise they wait for the sync (the store lock)."""
        store = self.publish_store
        concurrent = _sync_is_concurrent(store)
        while True:
            await self._pending_ready.wait()
            self._pending_ready = trio.Event()
            if not self._pending:
                continue
            batch, self._pending = self._pending, []
            if concurrent:
                await offload.run_sync(store.sync)
            else:
                async with self._store_lock:
                    await offload.run_sync(store.sync)
            await client.send_raw(b"".join(_publish_frame(kept) for kept in batch))

    async def _ack_watcher(self, client: Client) -> None:
        """Discard what persisted acks cover; raises ConnectionLost when the
        connection ends (that ends the session)."""
        store = self.publish_store
        while True:
            changed = client._persisted_changed
            if client.failed_publishes:
                self.failed_publishes.update(client.failed_publishes)
                client.failed_publishes.clear()
                self._discard_done()
            if client.not_journaled_seq > self.not_journaled_seq:
                self.not_journaled_seq = client.not_journaled_seq
            if client.persisted_seq > store.discarded_through:
                async with self._store_lock:
                    seq = client.persisted_seq
                    await offload.run_sync(store.discard_through, seq)
                self._discard_done()
                continue  # acks may have come meanwhile
            if client.closed is not None:
                raise ConnectionLost(str(client.closed))
            await changed.wait()

    def _discard_done(self) -> None:
        event = self._discarded
        self._discarded = trio.Event()
        event.set()

    async def publish(self, topic: str, data: bytes | str, *, sow_key: str | None = None) -> int:
        """Store a publish and send it (now, or after the next logon); returns its
        sequence number.

        Waits while the publish store has no room for it, until persisted acks
        discard enough (a message larger than the store's bound still goes into an
        empty store).

        Raises:
            OSError: a file store could not write (the message names the file).
        """
        return await self._publish("publish", topic, data, sow_key)

    async def delta_publish(
        self, topic: str, data: bytes | str, *, sow_key: str | None = None
    ) -> int:
        """As :meth:`publish`, for a delta the server merges into the SOW record."""
        return await self._publish("delta_publish", topic, data, sow_key)

    async def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        keys: str | Iterable[str] | None = None,
        data: bytes | str | None = None,
    ) -> int:
        """Delete records of the SOW topic ``topic`` through the publish store; returns
        the delete's sequence number. Exactly one of ``filter`` (a content filter;
        ``"1=1"`` deletes every record), ``keys`` (SOW keys, a list or a comma list)
        or ``data`` (a message whose key fields name the record).

        The delete is a message of this publisher like a publish: it takes the next
        sequence number, is kept in the publish store and sent (now, or after the
        next logon), and is sent again after every reconnect until a persisted ack
        covers it, in sequence order with the publishes around it (a publish made
        after the delete is never applied before it). The server that receives it
        selects the records then; a copy it already holds (it was received before a
        failover) is recognised by its sequence number and not applied twice.
        :meth:`wait_persisted` (or :meth:`flush`) waits until it is persisted. The
        server's counts (``records_deleted``) are not returned: a delete sent again
        may be counted by an instance that did not apply it; use the plain client's
        :meth:`Client.sow_delete` for them.

        Raises:
            ValueError: not exactly one selector, or an empty one.
            OSError: a file store could not write.

        A delete the server refuses (``invalid topic``: not a SOW topic; ``bad
        filter``) is reported like a refused publish: :attr:`failed_publishes` and
        :meth:`wait_persisted` raising :class:`CommandError`.
        """
        given = [
            (name, value)
            for name, value in (("filter", filter), ("keys", keys), ("data", data))
            if value is not None
        ]
        if len(given) != 1:
            got = ", ".join(f"{name}=" for name, _ in given) or "none"
            raise ValueError(
                "sow_delete needs exactly one of filter=, keys= or data= (got "
                f"{got}); filter='1=1' deletes every record"
            )
        selector: str | bytes
        if filter is not None:
            command, selector = SOW_DELETE_BY_FILTER, filter
        elif keys is not None:
            command = SOW_DELETE_BY_KEYS
            selector = keys if isinstance(keys, str) else ",".join(keys)
        else:
            assert data is not None
            command, selector = SOW_DELETE_BY_DATA, data
        if not selector:
            raise ValueError(f"sow_delete: {given[0][0]}= is empty; it would select nothing")
        return await self._publish(command, topic, selector, None)

    async def _publish(
        self, command: str, topic: str, data: bytes | str, sow_key: str | None
    ) -> int:
        payload = data.encode() if isinstance(data, str) else data
        store = self.publish_store
        while True:
            async with self._store_lock:
                if store.has_room(len(payload)):
                    seq = store.store(command, topic, payload, sow_key or "")
                    self._pending.append(StoredPublish(seq, command, topic, payload, sow_key or ""))
                    self._pending_ready.set()
                    return seq
                room = self._discarded
            await room.wait()

    async def wait_persisted(self, seq: int, *, timeout: float = 30) -> None:
        """Wait until a persisted ack (or a logon ack's ``s``) covers ``seq``, across
        reconnects.

        Raises:
            CommandError: the server reported that ``seq`` was not stored.
            TimeoutError: not covered within ``timeout`` seconds.
        """
        store = self.publish_store
        if store.discarded_through >= seq:
            return  # covered already (a pipelining publisher's usual case): no cancel scope
        with trio.move_on_after(timeout):
            while store.discarded_through < seq:
                if seq in self.failed_publishes:
                    raise CommandError("publish", self.failed_publishes[seq])
                await self._discarded.wait()
            return
        raise TimeoutError(
            f"{self.name}: seq {seq} not persisted within {timeout:g} s (persisted through "
            f"{store.discarded_through}, {len(store)} kept, "
            f"{'connected to ' + self.uri if self.connected else 'not connected'})"
        )

    async def flush(self, *, timeout: float = 30) -> None:
        """Wait until every publish made so far is persisted (the store is empty)."""
        await self.wait_persisted(self.publish_store.last_seq, timeout=timeout)

    # ---------------------------------------------------------------- subscribing
    @asynccontextmanager
    async def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        bookmark: str | None = None,
        options: str | None = None,
        sub_id: str | None = None,
        max_backlog: int | None = None,
        auto_ack: bool = False,
    ) -> AsyncIterator[HASubscription]:
        """Subscribe, now and after every reconnect, until the block is left.

        Args:
            topic: the topic (or regex), or a queue's name.
            filter: a content filter.
            bookmark: makes it a bookmark subscription starting there (``"0"``: EPOCH,
                ``"0|1|"``: NOW, a bookmark, a timestamp); resubscribes resume after
                the last processed message (the bookmark store), or start here again
                when nothing was processed yet. None: a live subscription.
            options: subscribe options (``o``).
            sub_id: the subscription id, the bookmark store's key; give a stable one
                for a durable bookmark store to resume after a restart (default: a
                fresh one).
            max_backlog: a queue subscription: how many unacknowledged messages the
                server may lease to it at a time (as :meth:`Client.subscribe`).
            auto_ack: a queue subscription: acknowledge each message when the loop
                moves past it, or when the block exits normally; not when the block
                exits with an exception (the message is delivered again).

        Queues: a subscription to a queue's name (no ``bookmark``) leases messages;
        acknowledge each with ``await message.ack()`` (see :meth:`HAMessage.ack`) or
        ``auto_ack=True``. After a reconnect (to the same server or another of the
        fabric) the subscription is renewed there and goes on consuming. What it had
        leased and not acknowledged on the lost connection went back to the queue
        (the server that leased it returns it when the connection drops; if that
        server died, its peers hold the message) and is delivered again, to this
        consumer or another; ``sub.max_backlog`` is the backlog the current server
        put in force. Acknowledgements are as :meth:`ack` says.

        When connected, the subscribe is sent at once and the server's processed ack
        awaited; when not, it is sent after the next logon.

        Raises:
            CommandError: the server refused it (bad filter, topic not journaled for a
                bookmark subscription, ...).
            AMPSError: ``auto_ack=True`` on a topic that is not a queue.
            ValueError: ``sub_id`` is already used by a subscription of this client,
                or ``max_backlog`` is less than 1.
        """
        if max_backlog is not None and max_backlog < 1:
            raise ValueError(f"max_backlog must be 1 or more, got {max_backlog}")
        sid = self._new_sub_id(sub_id)
        sub = HASubscription(
            self, sid, topic, filter, bookmark, options, max_backlog=max_backlog, auto_ack=auto_ack
        )
        async with self._subscribed(sub):
            try:
                yield sub
            except BaseException:
                sub._current = None  # not processed: left to be delivered again
                raise
            await sub._ack_current()

    @asynccontextmanager
    async def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        options: str | None = None,
        top_n: int | None = None,
        orderby: str | None = None,
        batch_size: int = 10,
        sub_id: str | None = None,
    ) -> AsyncIterator[HASowSubscription]:
        """Query ``topic``'s State of the World and subscribe to it, atomically, and
        keep the application's view of it current across reconnects, until the block
        is left.

        Iterate the subscription for the snapshot records (``message.snapshot``),
        then the live messages (``publish``; ``oof`` with option ``oof``), as with
        :meth:`Client.sow_and_subscribe`; ``sub.snapshot_done`` is set once the whole
        snapshot was handed over. Each message carries its bookmark (option
        ``bookmark`` is added).

        After a reconnect (to the same server or another of the fabric) it is not
        issued again as it was, which would hand the whole snapshot over again as new
        records (AMPS's HAClient re-issues a command as it was first issued, unless it
        is a bookmark subscription: this is not one, but every SOW topic is journaled,
        so it can resume like one). It resumes with a bookmark subscription from what
        it had handed over (each publisher's last message), so the application gets
        every update it missed, in order, and nothing it already had:

        * a replayed message it was given, or that a message it was given overtook, is
          dropped (``sub.duplicates_dropped``); so is one older than the version of
          its record it holds from another publisher (``sub.superseded_dropped``);
        * deletes are not replayed (and a record that stopped matching the filter
          just stops coming): once the replay reached the live stream the
          subscription's records are queried once (``sow``), and a record that
          differs from the version the application holds is handed over as an
          update (a ``publish`` message; ``possible_duplicate`` set if its publisher's
          message may have been handed over before), and, with option ``oof``, a
          record it holds that is gone comes as an ``oof`` (reason ``deleted``, or
          ``match`` when the record is still there but no longer matches the filter;
          its data is empty). ``sub.resynced`` counts them.

        Nothing handed over yet (an empty snapshot, no live message): it is issued
        again as it was. ``top_n`` and ``orderby`` shape the first snapshot only; with
        ``top_n`` a record the application never held is not added by the check.
        What the application holds lives in memory (``sub.view``): a restarted
        process starts with a new snapshot.

        Args: as :meth:`Client.sow_and_subscribe` (``sub_id``: default a fresh one).

        Raises:
            CommandError: the server refused it (``invalid topic``, ``bad filter``).
            ValueError: ``sub_id`` is already used by a subscription of this client,
                or ``batch_size``/``top_n`` out of range.
        """
        if top_n is not None and top_n < 0:
            raise ValueError(f"top_n must be 0 or more, got {top_n}")
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
        sub = HASowSubscription(
            self,
            self._new_sub_id(sub_id),
            topic,
            filter,
            options,
            top_n=top_n,
            orderby=orderby,
            batch_size=batch_size,
        )
        async with self._subscribed(sub):
            yield sub

    def _new_sub_id(self, sub_id: str | None) -> str:
        sid = sub_id or f"ha{next(self._sub_ids)}"
        if sid in self._subs:
            raise ValueError(f"sub_id {sid!r} is already subscribed on this client; give another")
        return sid

    @asynccontextmanager
    async def _subscribed(self, sub: HASubscription) -> AsyncIterator[None]:
        """Keep ``sub`` subscribed (now if connected, and after every logon) for the
        duration of the block."""
        sid = sub.sub_id
        self._subs[sid] = sub
        try:
            live = self._live
            # a connection whose nursery is cancelled is ending: the next one subscribes
            if live is not None and not live.nursery.cancel_scope.cancel_called:
                with contextlib.suppress(  # lost meanwhile: subscribed after the next logon
                    ConnectionLost, trio.BrokenResourceError, trio.ClosedResourceError
                ):
                    await self._start_pump(live, sub, resubscribe=False)
            yield
        finally:
            self._subs.pop(sid, None)
            sub._end()

    async def _start_pump(self, live: _Live, sub: HASubscription, *, resubscribe: bool) -> None:
        """Subscribe ``sub`` on ``live`` and hand its messages over in the background
        (a refused resubscribe ends ``sub``; a refused first subscribe raises)."""
        try:
            await live.nursery.start(self._pump, live, sub)
        except AMPSError as exc:
            if isinstance(exc, ConnectionLost) or not resubscribe:
                raise
            log.error("HA client %r: resubscribe of %s refused: %s", self.name, sub.sub_id, exc)
            self._subs.pop(sub.sub_id, None)
            sub._end(exc)

    async def _pump(
        self,
        live: _Live,
        sub: HASubscription,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        client = live.client
        with trio.CancelScope() as scope:
            sub._scope = scope
            failure = await sub._serve(client, live.connection, task_status)
            if failure is not None and client.closed is None:
                log.error("HA client %r: subscription %s ended: %s", self.name, sub.sub_id, failure)
                self._subs.pop(sub.sub_id, None)
                sub._end(failure)


def _sync_is_concurrent(store: PublishStore) -> bool:
    """Whether ``store`` declares (attribute ``concurrent_sync = True``) that its
    ``sync()`` may run in a worker thread while its other methods are called; then
    publishers keep storing during a sync, and groups grow with the sync's cost.
    Without it the client keeps to the protocol's one-call-at-a-time rule."""
    return bool(getattr(store, "concurrent_sync", False))


def _publish_frame(kept: StoredPublish) -> bytes:
    """The frame that (re)sends a stored publish or ``sow_delete``: its seq, asking
    for persisted acks only (they are conflated per connection)."""
    command = kept.command
    if command in SOW_DELETES:
        header: dict[str, Any] = {"c": "sow_delete", "t": kept.topic, "s": kept.seq}
        header["a"] = "persisted"
        if command == SOW_DELETE_BY_FILTER:
            header["f"] = kept.data.decode()
            return encode_frame(header)
        if command == SOW_DELETE_BY_KEYS:
            header["sow_keys"] = kept.data.decode()
            return encode_frame(header)
        return encode_frame(header, kept.data)
    header = {"c": command, "t": kept.topic, "s": kept.seq, "a": "persisted"}
    if kept.sow_key:
        header["k"] = kept.sow_key
    return encode_frame(header, kept.data)


@asynccontextmanager
async def open_ha_client(
    name: str,
    servers: Sequence[str] | Callable[[], str],
    *,
    publish_store: PublishStore | None = None,
    bookmark_store: BookmarkStore | None = None,
    heartbeat: float | None = None,
    reconnect_delay: float = 0.05,
    max_reconnect_delay: float = 5.0,
    connect_timeout: float = 10.0,
    on_state: StateCallback | None = None,
    ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE,
    ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    failover_timeout: float | None = None,
    **logon_fields: Any,
) -> AsyncIterator[HAClient]:
    """An :class:`HAClient` connecting in the background for as long as the block runs.

    Args:
        name: the client name, the same on every connection (the server identifies
            the publisher by it: it must be unique in the fabric).
        servers: equivalent URIs tried in turn, or a callable returning the URI to try.
        publish_store: keeps publishes until persisted (default: in memory).
        bookmark_store: keeps what bookmark subscriptions delivered and processed
            (default: in memory).
        heartbeat: seconds between server heartbeats; a server silent for two of them
            is dropped. None: no heartbeats.
        reconnect_delay: seconds waited after the first whole round of failed
            attempts (doubling each round).
        max_reconnect_delay: the cap on that wait.
        connect_timeout: seconds allowed for each connect and logon.
        on_state: called as ``on_state(state, detail)`` on each state change (see the
            module doc); an exception it raises is logged and ignored.
        ack_batch_size: queue acknowledgements sent in one command (default 1: each
            at once); see :meth:`HAClient.ack`.
        ack_timeout: seconds a partial batch of acknowledgements waits before it is
            sent (default 1.0).
        failover_timeout: give up when no server could be logged on to for this many
            seconds (from the start, or from the loss of a connection): the block
            ends with :class:`NoServerReachable`, naming each server and why its last
            attempt failed. None (the default): keep trying for as long as the block
            runs.
        logon_fields: further logon header fields (also ``ca_file`` and friends of
            :func:`open_client`).

    The block is entered at once, before any connection: publishes are stored and wait
    to be sent, subscriptions wait to be subscribed; :meth:`HAClient.wait_connected`
    waits for the first logon.

    Raises:
        ValueError: ``servers`` is empty or holds a malformed URI, or an argument is
            out of range.
        NoServerReachable: (from the block) ``failover_timeout`` ran out.
    """
    ha = HAClient(
        name,
        servers,
        publish_store=publish_store,
        bookmark_store=bookmark_store,
        heartbeat=heartbeat,
        reconnect_delay=reconnect_delay,
        max_reconnect_delay=max_reconnect_delay,
        connect_timeout=connect_timeout,
        on_state=on_state,
        ack_batch_size=ack_batch_size,
        ack_timeout=ack_timeout,
        failover_timeout=failover_timeout,
        **logon_fields,
    )
    try:
        # an exception raised in the caller's block comes out as itself, as from
        # open_client, not wrapped in the nursery's ExceptionGroup
        async with unwrapping_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(ha._run)
            try:
                yield ha
            finally:
                nursery.cancel_scope.cancel()
    finally:
        for sub in list(ha._subs.values()):
            sub._end()
        with trio.CancelScope(shield=True):
            await offload.run_sync(ha.publish_store.sync)
            await offload.run_sync(ha.bookmark_store.sync)
        if publish_store is None:
            ha.publish_store.close()
        if bookmark_store is None:
            ha.bookmark_store.close()
