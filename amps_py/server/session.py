"""One client connection: read frames, run commands, write acks and messages.

Reading and command handling happen in one task; every handler but the logon is
synchronous (no ``await``), so commands from one client are processed strictly in
order and a publish is queued for the journal before the next frame is looked at. The
logon awaits its password check (on a worker thread, :mod:`amps_py.auth_gate`) before
the read loop looks at the next frame, so order holds there too. Writing
happens in a second task that drains an outbox, so many small messages leave in one
``send_all``. Bookmark replays run as their own tasks and pace themselves on the
outbox size.

Error handling: a frame the codec rejects closes the connection with a logged
reason; a command the server refuses gets a failure ack (when the command asked for
one) and the connection stays open. Nothing a client sends can stop the instance.

Limits (see :mod:`amps_py.server.limits`): a connection that does not log on within
its transport's LogonTimeout, or leaves a frame unfinished past IncompleteMessageTimeout,
is closed; partial frames count against the instance's IncompleteMessageMemoryLimit and
bytes waiting to be sent against the MessageMemoryLimit of the client's transport (its
own pool or the instance's) and the client's ClientMaxCapacity. When the pool is over,
the client with the most bytes waiting in memory (and no bookmark replay running) is
offlined: its backlog spills to disk (:mod:`amps_py.server.outbox`) and drains from
there in order until it has caught up. A slow client (past its capacity,
or the biggest offline one when spilled bytes pass MessageDiskLimit) is sent a last
``slow client`` failure ack when it can still take it, then its socket is closed (it
sees EOF).

The parts, around this module's read loop, send loop, outbox and spill: the wire
protocol's state, sans-IO (:mod:`amps_py.protocol.server`: frame decoding, transport
compression, logon state, command validation, heartbeat timing, acks), the logon
exchange (``logon_exchange.py``), entitlement answers (``entitlements.py``), the
commands (``publish_command.py``, ``subscribing.py`` with ``replay.py``,
``sow_commands.py``; they take narrow protocols, ``command_session.py``), the limits'
decisions (``limits.py``) and their acting across connections (``flow.py``).
"""

from __future__ import annotations

import gc
import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import events, reasons
from amps_py.actions import client_variables
from amps_py.protocol import Frame, ProtocolError, messages
from amps_py.protocol.compression import CompressionError
from amps_py.protocol.server.acks import PublishAcks, ack, failure_frames
from amps_py.protocol.server.commands import (
    CommandFailed,
    Disconnect,
)
from amps_py.protocol.server.connection import (
    CloseConnection,
    CommandRefused,
    CompressionStarted,
    LogonRequested,
    ServerConnection,
)
from amps_py.trio_util import CONNECTION_ERRORS, connection_error_words, unwrapping_groups

from .durability import PublisherLedger
from .ended_sessions import ENDED_SESSIONS
from .entitlements import TopicEntitlements
from .flow import (
    SEND_CHUNK,
    close_over_incomplete_limit,
    deadline_passed,
    disconnect_if_too_old,
    disconnect_slow_clients,
)
from .limits import (
    CLOSE_FLUSH_TIMEOUT,
    SLOW_CLIENT_FLUSH_TIMEOUT,
    Closing,
    read_deadline,
    spill_failed_closing,
)
from .logon_exchange import log_on
from .outbox import SpillError, SpillingOutbox
from .publish_command import on_publish
from .session_commands import on_flush, on_heartbeat, on_start_timer, on_stop_timer
from .sow_commands import on_sow, on_sow_delete
from .subscribing import on_sow_and_subscribe, on_subscribe, on_unsubscribe
from .subscriptions import Subscription, TopicPattern

if TYPE_CHECKING:
    from .host import SessionHost

log = logging.getLogger("amps_py.server.session")

RECEIVE_SIZE: Final = 256 * 1024
#: bytes of an offlined client's moved backlog written to its spill file per step
SPILL_STEP: Final = 1024 * 1024
#: a replay pauses while this many bytes wait in the session's outbox
REPLAY_HIGH_WATER: Final = 4 * 1024 * 1024


class Session:
    """State and tasks of one client connection. Created and run by the instance."""

    def __init__(
        self, instance: SessionHost, stream: trio.abc.Stream, transport: str, peer: str
    ) -> None:
        self.instance = instance
        self.stream = stream
        self.transport = transport
        self.peer = peer
        self.conn_id = instance.next_connection_id()
        self.client_name = ""
        self.user_id = ""
        self.client_version = ""
        #: the modules of this connection's transport (its own, else the instance's)
        self.authenticator = instance.authenticator_for(transport)
        self.entitler = instance.entitler_for(transport)
        self.pub_hash = 0
        #: the type of every message this connection publishes and receives (its
        #: transport's MessageType, else the logon's ``mt``, else json)
        self.message_type = instance.transport_config(transport).message_type or "json"
        self.subscriptions: dict[str, Subscription] = {}
        #: entitlement answers per topic for this session's user (fixed for its lifetime)
        self.entitlements = TopicEntitlements(self.entitler, instance.counters)
        self._set_up_output()
        # persisted-ack state (docs/GUARANTEES.md, "Persisted acks"): the ledger is the
        # instance's, shared with an earlier connection of the same client name
        self.ledger: PublisherLedger | None = None
        #: queue name -> DefaultPublishTarget, for queues whose publishes are journaled
        #: on another topic; None (the publish path's one test) when there are none
        queues = instance.queues
        self.publish_routes = queues.publish_routes() if queues is not None else None
        self.close_reason = ""
        #: what the server told the client about why it closes the connection, if more
        #: than the reason (e.g. which slow-client limit it passed)
        self.close_detail = ""
        self._cancel: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.messages_in = 0
        self.messages_out = 0
        self.connected_at = time.time()
        # limits (see amps_py.server.limits)
        limits = instance.limits
        #: its transport's slow-client pools and policies (its own or the instance's)
        self.pools = pools = limits.pools_for(transport)
        self._queued_pool = pools.memory
        self._incomplete_pool = limits.incomplete
        self._disk_pool = pools.disk
        #: bookmark replays of this session running now (kept by replay.py): while any
        #: runs, the session is not offlined
        self.replaying = 0
        self.logon_timeout, self.frame_timeout, self.queue_limit = instance.client_limits(transport)
        #: ClientMaxCapacity while offline: its share of MessageDiskLimit
        self.disk_queue_limit = instance.client_disk_capacity(transport)
        self._handlers = self._command_handlers()
        #: the wire protocol's state: decoding, logon, acks, heartbeats (sans-IO)
        self.conn = ServerConnection(
            {"logon", *self._handlers},
            max_frame_size=instance.max_frame_size(transport),
            now=trio.current_time(),
            logon_timeout=self.logon_timeout,
            # Transport/AlwaysSendPersistedAcks: persisted acks for every publish with s
            always_persisted=instance.transport_config(transport).always_persisted_acks,
        )
        self.decoder = self.conn.decoder
        #: bytes of the partial frame counted in the IncompleteMessageMemoryLimit pool
        self.incomplete_held = 0
        #: set once the connection is being closed as a slow client (or has ended):
        #: nothing more is queued and its bytes no longer count in the pool
        self.discarding = False
        #: a replay pauses while this many bytes wait (well below ClientMaxCapacity)
        self._replay_high_water = min(REPLAY_HIGH_WATER, max(1, self.queue_limit // 4))

    def _set_up_output(self) -> None:
        """The state of the bytes waiting for the client (see amps_py.server.outbox)."""
        self._outbox = SpillingOutbox(f"{self.transport}-{self.conn_id}")
        #: the time pieces appended now are stamped with (coarse: refreshed when the
        #: session goes from idle to busy and on every write round, never per append);
        #: a piece's stamp is never later than its real append time
        self._stamp = trio.current_time()
        #: the (stamp) time of the oldest piece of the batch being written, if any
        self._inflight_since: float | None = None
        #: bytes queued (in memory or on disk) or being written
        self.out_bytes = 0
        #: of those, bytes spilled to disk (counted in MessageDiskLimit, not in
        #: MessageMemoryLimit)
        self.spilled = 0
        #: whether the backlog is on disk (offlined over MessageMemoryLimit)
        self.offline = False
        self._wake = trio.Event()
        self._drained = trio.Event()

    @property
    def logged_on(self) -> bool:
        return self.conn.logged_on

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats the client asked for (0: none)."""
        return self.conn.heartbeat.interval

    @property
    def wants_persisted(self) -> bool:
        return self.conn.publish_acks.wants_persisted

    @property
    def publish_acks(self) -> PublishAcks:
        return self.conn.publish_acks

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        """Serve the connection until the client leaves or the session is closed."""
        log.info(
            "client connected from %s on transport %s (connection %d)",
            self.peer,
            self.transport,
            self.conn_id,
            extra=events.extra(events.CLIENT_CONNECTED),
        )
        self.instance.fire_action("connect-client", client_variables(self, connected=True))
        broken = ""
        try:
            # a client that goes away abruptly (a reset) can break the read and the send
            # loop at once: such a group is one disconnect, not a failure
            async with unwrapping_groups(CONNECTION_ERRORS), trio.open_nursery() as nursery:
                self._nursery = nursery
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._send_loop)
                if self.pools.age_limit > 0:
                    nursery.start_soon(self._age_watch)
                await self._read_loop()
                self.close(reasons.CONNECTION_CLOSED)
        except CONNECTION_ERRORS as exc:
            self.close_reason = self.close_reason or reasons.CONNECTION_CLOSED
            broken = connection_error_words(exc)
            # its traceback is never shown: let go of the frames it holds (the batch
            # that was being written, the last bytes read), see _let_go
            traceback.clear_frames(exc.__traceback__)
        finally:
            self._release_memory()
            self.instance.session_ended(self)
            self.instance.fire_action("disconnect-client", client_variables(self, connected=False))
            log.info(
                "client %r (connection %d) disconnected: %s%s",
                self.client_name,
                self.conn_id,
                self.close_reason or reasons.CONNECTION_CLOSED,
                f" ({broken})" if broken else "",
                extra=events.extra(events.CLIENT_DISCONNECTED),
            )
            # forcefully: a send blocked on a client that does not read is abandoned,
            # the socket is closed at once (the client sees EOF after what its kernel
            # already holds), and TLS does not wait for a close_notify exchange
            await trio.aclose_forcefully(self.stream)
            self._let_go()

    def _let_go(self) -> None:
        """The session is over: drop what it still refers to beyond its counts and
        names (its nursery, transport compression state, entitlement answers, flush
        waiters). An ended task leaves exceptions whose frames refer to the session in
        reference cycles that only a full garbage collection frees (the server runs
        one rarely, see ``cli.serve.tune_garbage_collector``): until then such a session
        must hold little, or memory grows with every client that ever connected; and
        every :data:`~.ended_sessions.COLLECT_EVERY_ENDED` ended sessions one runs
        (:class:`~.ended_sessions.EndedSessions`)."""
        self._nursery = None
        self._cancel = None
        self.conn.release()
        self.entitlements.forget()
        if ENDED_SESSIONS.ended():
            started = time.perf_counter()
            found = gc.collect()
            log.debug(
                "full garbage collection after %d ended sessions: %d objects in %.1f ms",
                ENDED_SESSIONS.every,
                found,
                (time.perf_counter() - started) * 1000,
                extra=events.extra(events.CLIENT_DISCONNECTED),
            )

    def close(self, reason: str) -> None:
        """End the session (idempotent); the first reason given is the one logged."""
        if not self.close_reason:
            self.close_reason = reason
        if self._cancel is not None:
            self._cancel.cancel()

    async def _read_loop(self) -> None:
        stream = self.stream
        conn = self.conn
        while True:
            data: bytes | bytearray | None = None
            if conn.logged_on and not self.incomplete_held:
                # the steady state: no deadline applies (no cancel scope to pay for)
                data = await stream.receive_some(RECEIVE_SIZE)
            else:
                deadline = read_deadline(
                    logon_deadline=conn.logon_deadline,
                    partial=conn.decoder.partial_frame() if self.incomplete_held else None,
                    frame_timeout=self.frame_timeout,
                )
                with trio.move_on_at(deadline.at if deadline is not None else math.inf):
                    data = await stream.receive_some(RECEIVE_SIZE)
                if data is None:
                    assert deadline is not None
                    await self._stop_reading(deadline_passed(self, deadline, self.instance.limits))
                    return
            if not data:
                return
            if self.discarding:
                continue  # closing as a slow client: read (so the close is clean), ignore
            try:
                await self._handle_events(conn.receive_data(data, trio.current_time()))
                self._count_incomplete()
            except (ProtocolError, CompressionError) as exc:
                log.warning(
                    "closing connection %d (client %r, %s): %s",
                    self.conn_id,
                    self.client_name,
                    self.peer,
                    exc,
                    extra=events.extra(events.CLIENT_PROTOCOL_ERROR),
                )
                self.instance.counters.count_protocol_error()
                reason = exc.reason if isinstance(exc, ProtocolError) else reasons.BAD_COMPRESSION
            except Disconnect as exc:
                reason = exc.reason
            else:
                # (a close while handling, e.g. over IncompleteMessageMemoryLimit, cancels
                # the next receive; a slow-client close keeps reading until it is done)
                continue
            conn.close()
            await self._stop_reading(reason)
            return

    async def _handle_events(self, happened: Iterator[object]) -> None:
        """Run what the protocol made of the bytes read, in order: commands (each by
        its handler, synchronously), the logon (awaited: its password is checked off
        the event loop, see :mod:`amps_py.auth_gate`, before the next frame is looked
        at), refusals and closes.

        Raises:
            Disconnect: the connection is to be closed (after what is queued).
        """
        handlers = self._handlers
        for event in happened:
            if type(event) is Frame:
                header = event.header
                try:
                    handlers[header["c"]](event)
                except CommandFailed as exc:
                    self._command_failed(header["c"], header, exc)
            elif type(event) is LogonRequested:
                await log_on(self, event.frame, event.acks)
            elif type(event) is CommandRefused:
                self._command_failed(event.command, event.header, event.failure)
            elif type(event) is CloseConnection:
                self.send_all(event.output)
                raise Disconnect(event.reason)
            elif type(event) is CompressionStarted:
                log.info(
                    "connection %d from %s uses zlib transport compression",
                    self.conn_id,
                    self.peer,
                    extra=events.extra(events.CLIENT_CONNECTED),
                )

    async def _stop_reading(self, reason: str) -> None:
        """End the read loop: give the sender a moment to flush what is queued (acks,
        a failure ack), then let the session close."""
        if not self.close_reason:
            self.close_reason = reason
        self.drop_partial_frame(reason)
        # let the sender flush what was already queued (acks, the failure ack)
        with trio.move_on_after(CLOSE_FLUSH_TIMEOUT):
            await self._wait_drained(0)

    # ---------------------------------------------------------------- memory limits
    def _count_incomplete(self) -> None:
        """Count the partial frame the decoder now holds in the instance's
        IncompleteMessageMemoryLimit pool; if the pool is over, close the connection(s)
        holding the largest partial frames until it is not."""
        held = self.decoder.buffered
        delta = held - self.incomplete_held
        if not delta:
            return
        self.incomplete_held = held
        pool = self._incomplete_pool
        pool.total += delta
        if delta > 0:
            pool.note_peak()
            if pool.total > pool.limit:
                close_over_incomplete_limit(self.instance.limits, self.instance.sessions)

    def drop_partial_frame(self, reason: str) -> None:
        """Free the partial frame now (not when the task ends) and uncount it."""
        if self.incomplete_held:
            self._incomplete_pool.total -= self.incomplete_held
            self.incomplete_held = 0
            self.decoder.discard(reason)

    def disconnect_slow(self, closing: Closing) -> None:
        """Disconnect this client as a slow client: drop what it has not been sent yet
        and its subscriptions, queue a ``slow client`` failure ack behind what is being
        written, and close the socket once that is out or after
        :data:`SLOW_CLIENT_FLUSH_TIMEOUT`, whichever comes first."""
        if self.discarding:
            return
        log.warning(closing.message, *closing.args, extra=events.extra(closing.event))
        self.discarding = True
        if not self.close_reason:
            self.close_reason = closing.reason
            self.close_detail = closing.detail
        self._uncount_queued()
        # What waits in the outbox (and its spill file) is dropped; what the send loop
        # is writing ends on a frame boundary (it took whole frames), so the notice can
        # follow it.
        self.out_bytes -= self._outbox.queued_bytes
        self._outbox.discard()
        for sub in list(self.subscriptions.values()):
            self.end_subscription(sub)
        notice = messages.ack("processed", "failure", reason=closing.reason, detail=closing.detail)
        self._outbox.append(notice, trio.current_time())
        self.out_bytes += len(notice)
        self._wake.set()
        if self._cancel is not None:
            self._cancel.deadline = min(
                self._cancel.deadline, trio.current_time() + SLOW_CLIENT_FLUSH_TIMEOUT
            )

    def _uncount_queued(self) -> None:
        """Take this session's bytes out of the MessageMemoryLimit and MessageDiskLimit
        pools (it is being disconnected or has ended) and end its offline state."""
        self._queued_pool.total -= self.out_bytes - self.spilled
        self._disk_pool.total -= self.spilled
        self.spilled = 0
        if self.offline:
            self.offline = False
            self.instance.limits.offline_clients -= 1

    @property
    def memory_held(self) -> int:
        """Bytes waiting in memory that offlining would move to disk."""
        return self._outbox.memory_bytes

    def go_offline(self, directory: Path) -> bool:
        """Offline this client: spill its in-memory backlog to a file under
        ``directory`` (MessageDiskPath); later messages go there too, in order, until
        the send loop has caught up. Returns False when the spill failed: the client is
        then disconnected as a slow client (the error logged names the file and the
        fix)."""
        if self.offline or self.discarding:
            return False
        box = self._outbox
        try:
            box.go_offline(directory)
        except SpillError as exc:
            self._spill_failed(exc)
            return False
        moved = box.disk_bytes
        self.offline = True
        self.spilled = moved
        self._queued_pool.total -= moved
        disk = self._disk_pool
        disk.total += moved
        disk.note_peak()
        self.instance.limits.offline_clients += 1
        self._wake.set()
        if box.unwritten_backlog and self._nursery is not None:
            self._nursery.start_soon(self._write_backlog)
        self.instance.fire_action("offline-start", client_variables(self, connected=False))
        return True

    async def _write_backlog(self) -> None:
        """Write the backlog moved by offlining to the spill file a step at a time,
        between other work: offlining a client with hundreds of megabytes waiting
        does not stall the instance."""
        box = self._outbox
        while box.offline and not self.discarding:
            try:
                if not box.spill(SPILL_STEP):
                    return
            except SpillError as exc:
                self._spill_failed(exc)
                return
            await trio.lowlevel.checkpoint()

    def _spill_failed(self, exc: SpillError) -> None:
        self.instance.limits.slow_client_spill_errors += 1
        self.disconnect_slow(spill_failed_closing(self, exc))

    def _came_online(self) -> None:
        """The send loop caught up with everything spilled: online again."""
        self.offline = False
        self.instance.limits.offline_clients -= 1
        log.info(
            "client %r (connection %d, %s) caught up with its spilled backlog and is online again",
            self.client_name,
            self.conn_id,
            self.peer,
            extra=events.extra(events.CLIENT_OFFLINE_STOP),
        )
        self.instance.fire_action("offline-stop", client_variables(self, connected=False))

    def _release_memory(self) -> None:
        """The session ends: uncount its queued bytes and partial frame, and remove
        its spill file."""
        if not self.discarding:
            self.discarding = True
            self._uncount_queued()
        self._outbox.discard()
        self.out_bytes = 0
        self.drop_partial_frame(reasons.CONNECTION_CLOSED)

    def _command_handlers(self) -> dict[str, Callable[[Frame], None]]:
        """The handler of every command a logged-on client may send (the logon is
        :class:`ServerConnection`'s, then :func:`~.logon_exchange.log_on`'s)."""
        return {
            "publish": partial(on_publish, self),
            "delta_publish": partial(on_publish, self),
            "subscribe": partial(on_subscribe, self),
            "delta_subscribe": partial(on_subscribe, self),
            "sow_and_subscribe": partial(on_sow_and_subscribe, self),
            "sow_and_delta_subscribe": partial(on_sow_and_subscribe, self),
            "unsubscribe": partial(on_unsubscribe, self),
            "heartbeat": partial(on_heartbeat, self),
            "flush": partial(on_flush, self),
            "start_timer": partial(on_start_timer, self),
            "stop_timer": partial(on_stop_timer, self),
            "sow": partial(on_sow, self),
            "sow_delete": partial(on_sow_delete, self),
        }

    def _command_failed(self, command: str, header: dict[str, Any], exc: CommandFailed) -> None:
        """Count, log and answer a refused command (the connection stays open)."""
        self.instance.counters.count_failed_command()
        denied = exc.reason == reasons.NOT_ENTITLED
        log.info(
            "command %s from client %r failed: %s",
            command,
            self.client_name,
            exc.detail,
            extra=events.extra(
                events.CLIENT_NOT_ENTITLED if denied else events.CLIENT_COMMAND_FAILED
            ),
        )
        self.fail(header, exc)

    # ---------------------------------------------------------------- output
    def send(self, data: bytes) -> None:
        """Queue bytes for the client (never blocks).

        When all clients together pass their MessageMemoryLimit pool, the client
        with the most waiting in memory is offlined (its backlog goes to disk). A client
        past its ClientMaxCapacity (:attr:`queue_limit` online, :attr:`disk_queue_limit`
        offline), or the biggest offline client when spilled bytes pass
        MessageDiskLimit, is disconnected (reason ``slow client``); it can resume by
        bookmark. Bytes sent to a client being disconnected are dropped.
        """
        if self.discarding:
            return
        if not self.out_bytes:
            # idle until now (nothing queued or being written): a fresh stamp
            self._stamp = trio.current_time()
        if self.offline:
            self._send_spilled(data)
            return
        self._outbox.append(data, self._stamp)
        size = len(data)
        self.out_bytes += size
        pool = self._queued_pool
        pool.total += size
        if pool.total > pool.peak:
            pool.peak = pool.total
        self._wake.set()
        if self.out_bytes > self.queue_limit or pool.total > pool.limit:
            disconnect_slow_clients(self, self.instance.limits, self.instance.sessions)

    def _send_spilled(self, data: bytes) -> None:
        """Queue bytes for an offline client: to its spill file."""
        try:
            self._outbox.append(data, self._stamp)
        except SpillError as exc:
            self._spill_failed(exc)
            return
        size = len(data)
        self.out_bytes += size
        self.spilled += size
        disk = self._disk_pool
        disk.total += size
        if disk.total > disk.peak:
            disk.peak = disk.total
        self._wake.set()
        if self.spilled > self.disk_queue_limit or disk.total > disk.limit:
            disconnect_slow_clients(self, self.instance.limits, self.instance.sessions)

    async def _send_loop(self) -> None:
        """Write queued bytes; ``out_bytes`` counts queued plus in-flight bytes.

        Each round takes whole frames from the outbox, about
        :data:`~amps_py.server.flow.SEND_CHUNK` bytes (so what is being written always
        ends on a frame boundary), and writes them in one ``send_all``. Once a slow
        client's notice is written, the session is closed.
        """
        stream = self.stream
        pool = self._queued_pool
        box = self._outbox
        while True:
            if not len(box):
                if self.discarding:
                    self.close(self.close_reason or reasons.SLOW_CLIENT)
                    return
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            now = trio.current_time()
            if self.offline:
                try:
                    self._inflight_since = now - box.oldest_age(now)
                    batch = box.take(SEND_CHUNK)
                except SpillError as exc:
                    self._spill_failed(exc)
                    continue
                # what was read back from disk is in memory now, being written
                from_disk = self.spilled - box.disk_bytes
                self.spilled -= from_disk
                self._disk_pool.total -= from_disk
                pool.total += from_disk
                if box.poll_transition() is not None:
                    self._came_online()
            else:
                self._inflight_since = now - box.oldest_age(now)
                batch = box.take(SEND_CHUNK)
            self._stamp = now
            piece = batch[0] if len(batch) == 1 else b"".join(batch)
            del batch  # (this frame holds nothing big while it waits: see run())
            await stream.send_all(self.conn.encode(piece))
            self._inflight_since = None
            size = len(piece)
            del piece
            self.out_bytes -= size
            if not self.discarding:
                pool.total -= size
            self._drained.set()

    def oldest_age(self, now: float) -> float:
        """Seconds the oldest message not yet written to the client (queued, or in the
        batch being written) has waited. Stamps are coarse but never later than the
        real append time of anything still unwritten, so this never understates the
        real age and overstates it by at most the time since the writer last took.

        Raises:
            SpillError: reading the spill file's head failed.
        """
        age = self._outbox.oldest_age(now)
        since = self._inflight_since
        if since is not None:
            age = max(age, now - since)
        return age

    async def _age_watch(self) -> None:
        """ClientMessageAgeLimit: check about four times per limit whether the oldest
        message waiting for this client is older; if so, disconnect it as a slow client."""
        limits = self.instance.limits
        interval = max(0.05, self.pools.age_limit / 4)
        while not self.discarding:
            await trio.sleep(interval)
            try:
                if disconnect_if_too_old(self, limits, trio.current_time()):
                    return
            except SpillError as exc:
                self._spill_failed(exc)
                return

    async def _wait_drained(self, high_water: int) -> None:
        while self.out_bytes > high_water:
            self._drained = trio.Event()
            await self._drained.wait()

    async def wait_outbox_below(self, high_water: int | None = None) -> None:
        """Wait until at most ``high_water`` bytes are queued (replay pacing); the
        default is :data:`REPLAY_HIGH_WATER` or a quarter of ClientMaxCapacity, whichever
        is less, so a replay never makes its own client a slow client."""
        if high_water is None:
            high_water = self._replay_high_water
        if self.out_bytes > high_water:
            await self._wait_drained(high_water // 2)

    # ---------------------------------------------------------------- acks
    def ack(
        self, header: dict[str, Any], ack_type: str, status: str = "success", **fields: Any
    ) -> None:
        """Send an ack of ``ack_type`` for the command whose header is ``header``
        (its ``cid`` is echoed); ``fields`` become ack header fields."""
        self.send(ack(header, ack_type, status, **fields))

    def send_all(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.send(frame)

    def fail(self, header: dict[str, Any], exc: CommandFailed) -> None:
        """Answer a refused command at once (:func:`failure_frames`)."""
        self.send_all(failure_frames(header, exc))

    @property
    def awaiting_persisted(self) -> int:
        """How many of this publisher's seqs wait to be durable."""
        return len(self.ledger.pending) if self.ledger is not None else 0

    def persisted_progress(self, not_journaled: int = 0) -> None:
        """Send a conflated persisted ack if the safe sequence moved forward; when it
        is ``not_journaled`` (a publish to a topic this instance does not journal), the
        ack says so in its ``reason``. Held-back flushes are answered once nothing is
        in flight (:meth:`PublishAcks.progress`)."""
        ledger = self.ledger
        if ledger is None:
            return
        self.send_all(
            self.conn.publish_acks.progress(
                ledger.advance(), len(ledger.pending), self.pub_hash, not_journaled
            )
        )

    def publishes_failed(self, seqs: list[int], reason: str, detail: str) -> None:
        """These publishes were not stored: a persisted failure ack for each (when
        this connection asked for persisted acks), so the publisher never waits for
        them."""
        self.send_all(self.conn.publish_acks.failed(seqs, reason, detail))

    # ---------------------------------------------------------------- commands
    def topics_to_read(self, topic: str, non_regex: bool) -> TopicPattern | None:
        """:meth:`TopicEntitlements.topics_to_read` for this session's user."""
        return self.entitlements.topics_to_read(topic, non_regex)

    def require_entitled(self, topic: str, *, write: bool, action: str = "") -> None:
        """:meth:`TopicEntitlements.require` for this session's user."""
        self.entitlements.require(topic, write=write, action=action)

    def publish_seq(self, header: dict[str, Any], acks: frozenset[str]) -> int:
        """The seq of a publish or sow_delete (:meth:`PublishAcks.seq`).

        Raises:
            CommandFailed: ``s`` is not a whole number in range.
        """
        ledger = self.ledger
        return self.conn.publish_acks.seq(header, acks, None if ledger is None else ledger.high)

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of this session (it ends with the session)."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def subscription_failed(self, sub: Subscription, cid: Any, reason: str, detail: str) -> None:
        """A replay could not run: drop the subscription and tell the client."""
        self.end_subscription(sub)
        header: dict[str, Any] = {"cid": cid} if cid is not None else {}
        self.ack(
            header,
            "completed" if "completed" in sub.acks else "processed",
            "failure",
            sub_id=sub.sub_id,
            reason=reason,
            detail=detail,
        )

    def end_subscription(self, sub: Subscription) -> None:
        """``sub`` is over (unsubscribed, or a bookmark range replayed to its end):
        it leaves this session and the registry."""
        if self.subscriptions.get(sub.sub_id) is sub:
            del self.subscriptions[sub.sub_id]
        if sub.conflation is not None:
            sub.conflation.close()
        if sub.queue is not None:
            queues = self.instance.queues
            if queues is not None:
                queues.unsubscribed(sub)
            return
        self.instance.registry.remove(sub)
