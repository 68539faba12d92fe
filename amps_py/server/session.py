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

The parts, around this module's read loop, dispatch, outbox and publish path:
reading headers (``commands.py``), logon (``logon.py``), subscription commands
(``subscribing.py``, with ``replay.py``), the limits' decisions (``limits.py``) and
their acting across connections (``flow.py``).
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
from amps_py.auth_backoff import shown_user
from amps_py.protocol import Frame, FrameDecoder, ProtocolError, messages
from amps_py.protocol.compression import CompressionError, Deflater, Inflater, sniff
from amps_py.trio_util import CONNECTION_ERRORS, connection_error_words, unwrapping_groups
from txlog import publisher_hash

from .commands import (
    MAX_FIELD_BYTES,
    MAX_SEQ,
    CommandFailed,
    Disconnect,
    ack_types,
    check_field_size,
    failure_acks,
    heartbeat_start,
)
from .durability import PublisherLedger
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
    ReadDeadline,
    read_deadline,
    spill_failed_closing,
)
from .logon import (
    LogonRefused,
    LogonRequest,
    check_authenticated,
    check_claimed,
    check_owner,
    choose_message_type,
    logon_ack_fields,
    read_logon,
)
from .outbox import SpillError, SpillingOutbox
from .sow_commands import on_sow, on_sow_delete
from .subscribing import on_sow_and_subscribe, on_subscribe, on_unsubscribe
from .subscriptions import BadTopic, EntitledTopics, Subscription, TopicPattern, compile_topic

if TYPE_CHECKING:
    from amps_py.auth import AuthResult
    from amps_py.auth_gate import GateVerdict

    from .host import SessionHost

log = logging.getLogger("amps_py.server.session")

RECEIVE_SIZE: Final = 256 * 1024
#: bytes of an offlined client's moved backlog written to its spill file per step
SPILL_STEP: Final = 1024 * 1024
#: a replay pauses while this many bytes wait in the session's outbox
REPLAY_HIGH_WATER: Final = 4 * 1024 * 1024
#: a heartbeating client silent for more than this many intervals is disconnected
HEARTBEAT_GRACE_INTERVALS: Final = 3
#: the failure reason of a journaled publish while journal writes are failing
JOURNAL_UNAVAILABLE: Final = reasons.JOURNAL_UNAVAILABLE
#: sessions that end between two full garbage collections (see Session._let_go)
COLLECT_EVERY_ENDED: Final = 1000


class EndedSessions:
    """Counts ended sessions and says when a full garbage collection is due (pure).

    An ended session's tasks leave exceptions in reference cycles (trio's, with their
    frames) that refer to the session; the server's tuned collector runs a full
    collection only after some hundred million allocations, which a quiet instance
    whose clients come and go (health checks, short-lived replays) may take days to
    reach. Collecting after every ``every`` ended sessions bounds what they keep.
    """

    def __init__(self, every: int = COLLECT_EVERY_ENDED) -> None:
        self.every = every
        self.since_collection = 0

    def ended(self) -> bool:
        """A session ended: whether to collect now."""
        self.since_collection += 1
        if self.since_collection < self.every:
            return False
        self.since_collection = 0
        return True


#: the instance's ended sessions (one count per process: the collection is too)
ENDED_SESSIONS: Final = EndedSessions()


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
        self.decoder = FrameDecoder(instance.max_frame_size(transport))
        self.client_name = ""
        self.user_id = ""
        self.client_version = ""
        #: the modules of this connection's transport (its own, else the instance's)
        self.authenticator = instance.authenticator_for(transport)
        self.entitler = instance.entitler_for(transport)
        # transport compression (see amps_py.protocol.compression): decided by the
        # connection's first two bytes
        self._sniffing = True
        self._sniff_buf = bytearray()
        self._inflater: Inflater | None = None
        self._deflater: Deflater | None = None
        self.pub_hash = 0
        self.logged_on = False
        #: when ``start_timer`` ran (monotonic seconds; None: no timer running)
        self._timer_started: float | None = None
        #: the type of every message this connection publishes and receives (its
        #: transport's MessageType, else the logon's ``mt``, else json)
        self.message_type = instance.transport_config(transport).message_type or "json"
        self.subscriptions: dict[str, Subscription] = {}
        # entitlement answers per topic for this session's user (fixed for its lifetime)
        self._entitled: dict[tuple[bool, str], bool] = {}
        # outbox: the bytes waiting for the client, in order (see amps_py.server.outbox)
        self._outbox = SpillingOutbox(f"{transport}-{self.conn_id}")
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
        # persisted-ack state (docs/GUARANTEES.md, "Persisted acks"): the ledger is the instance's,
        # shared with an earlier connection of the same client name
        self.wants_persisted = False
        self.ledger: PublisherLedger | None = None
        #: queue name -> DefaultPublishTarget, for queues whose publishes are journaled
        #: on another topic; None (the publish path's one test) when there are none
        queues = instance.queues
        self._publish_routes = queues.publish_routes() if queues is not None else None
        self._flush_waiters: list[tuple[str, frozenset[str]]] = []
        self._auto_seq = 0
        self.last_receive = trio.current_time()
        self.heartbeat_interval = 0.0
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
        logon_timeout, self.frame_timeout, self.queue_limit = instance.client_limits(transport)
        #: ClientMaxCapacity while offline: its share of MessageDiskLimit
        self.disk_queue_limit = instance.client_disk_capacity(transport)
        #: Transport/AlwaysSendPersistedAcks: persisted acks for every publish with ``s``
        self._always_persisted = instance.transport_config(transport).always_persisted_acks
        self.logon_timeout = logon_timeout
        self._logon_deadline = trio.current_time() + logon_timeout
        #: bytes of the partial frame counted in the IncompleteMessageMemoryLimit pool
        self.incomplete_held = 0
        #: set once the connection is being closed as a slow client (or has ended):
        #: nothing more is queued and its bytes no longer count in the pool
        self.discarding = False
        #: a replay pauses while this many bytes wait (well below ClientMaxCapacity)
        self._replay_high_water = min(REPLAY_HIGH_WATER, max(1, self.queue_limit // 4))

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
        every :data:`COLLECT_EVERY_ENDED` ended sessions one runs
        (:class:`EndedSessions`)."""
        self._nursery = None
        self._cancel = None
        self._inflater = None
        self._deflater = None
        self._sniff_buf = bytearray()
        self._entitled.clear()
        self._flush_waiters.clear()
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
        decoder = self.decoder
        handlers = self._handlers()
        while True:
            data: bytes | bytearray | None = None
            if self.logged_on and not self.incomplete_held:
                # the steady state: no deadline applies (no cancel scope to pay for)
                data = await stream.receive_some(RECEIVE_SIZE)
            else:
                deadline = read_deadline(
                    logon_deadline=None if self.logged_on else self._logon_deadline,
                    partial=decoder.partial_frame() if self.incomplete_held else None,
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
            now = trio.current_time()
            self.last_receive = now
            if self._sniffing:
                data = self._sniff_compression(data)
                if not data:
                    continue  # one byte so far: not enough to tell
            try:
                if self._inflater is None:
                    decoder.receive_data(data, now)
                    if self.logged_on:
                        for frame in decoder.frames():
                            self._dispatch(frame, handlers)
                    else:
                        await self._dispatch_until_logged_on(decoder.frames(), handlers)
                else:
                    for piece in self._inflater.feed(data):
                        decoder.receive_data(piece, now)
                        if self.logged_on:
                            for frame in decoder.frames():
                                self._dispatch(frame, handlers)
                        else:
                            await self._dispatch_until_logged_on(decoder.frames(), handlers)
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
            await self._stop_reading(reason)
            return

    def _sniff_compression(self, data: bytes | bytearray) -> bytes | bytearray:
        """Look at the connection's first bytes: a zlib stream (a client that connected
        with ``compression=zlib``) turns on transport compression both ways. Returns
        the bytes to decode ("" while fewer than two bytes are known)."""
        self._sniff_buf += data
        verdict = sniff(self._sniff_buf)
        if verdict is None:
            return b""
        data, self._sniff_buf = self._sniff_buf, bytearray()
        self._sniffing = False
        if verdict:
            self._inflater = Inflater()
            self._deflater = Deflater()
            log.info(
                "connection %d from %s uses zlib transport compression",
                self.conn_id,
                self.peer,
                extra=events.extra(events.CLIENT_CONNECTED),
            )
        return data

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

    def _handlers(self) -> dict[str, Callable[[Frame], None]]:
        return {
            "logon": self._on_logon,
            "publish": self._on_publish,
            "delta_publish": self._on_publish,
            "subscribe": partial(on_subscribe, self),
            "delta_subscribe": partial(on_subscribe, self),
            "sow_and_subscribe": partial(on_sow_and_subscribe, self),
            "sow_and_delta_subscribe": partial(on_sow_and_subscribe, self),
            "unsubscribe": partial(on_unsubscribe, self),
            "heartbeat": self._on_heartbeat,
            "flush": self._on_flush,
            "start_timer": self._on_start_timer,
            "stop_timer": self._on_stop_timer,
            "sow": partial(on_sow, self),
            "sow_delete": partial(on_sow_delete, self),
        }

    async def _dispatch_until_logged_on(
        self, frames: Iterator[Frame], handlers: dict[str, Callable[[Frame], None]]
    ) -> None:
        """Handle ``frames`` in order on a connection that has not logged on yet: a
        logon is awaited (its password is checked off the event loop, see
        :mod:`amps_py.auth_gate`) before the next frame is looked at, so what a client
        sends behind its logon is handled after the logon's answer, as ever. Other
        connections are served meanwhile; this one's bytes wait in its socket."""
        for frame in frames:
            if not self.logged_on and frame.header.get("c") == "logon":
                try:
                    await self._logon(frame)
                except CommandFailed as exc:
                    self._command_failed("logon", frame.header, exc)
            else:
                self._dispatch(frame, handlers)

    def _dispatch(self, frame: Frame, handlers: dict[str, Callable[[Frame], None]]) -> None:
        header = frame.header
        command = header["c"]
        handler = handlers.get(command)
        try:
            if handler is None:
                raise CommandFailed(
                    reasons.UNKNOWN_COMMAND,
                    f"unknown command {command!r}; see the AMPS command reference",
                )
            if not self.logged_on:
                self._refuse_before_logon(header)
                return
            handler(frame)
        except CommandFailed as exc:
            self._command_failed(command, header, exc)

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
        self._fail(header, exc)

    def _refuse_before_logon(self, header: dict[str, Any]) -> None:
        self._fail(
            header,
            CommandFailed(
                reasons.LOGON_REQUIRED,
                "the first command on a connection must be logon (with client_name)",
            ),
        )
        raise Disconnect(reasons.LOGON_REQUIRED)

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
            deflater = self._deflater
            await stream.send_all(piece if deflater is None else deflater.compress(piece))
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
        self.send(messages.ack(ack_type, status, header.get("cid"), **fields))

    def _fail(self, header: dict[str, Any], exc: CommandFailed) -> None:
        """Answer a refused command at once: a failure ack in every ack type it asked
        for (so a client never waits for an ack that cannot come), or ``processed``
        when it asked for none."""
        for ack_type, fields in failure_acks(header, exc):
            self.ack(header, ack_type, "failure", **fields)

    @property
    def awaiting_persisted(self) -> int:
        """How many of this publisher's seqs wait to be durable."""
        return len(self.ledger.pending) if self.ledger is not None else 0

    def persisted_progress(self, not_journaled: int = 0) -> None:
        """Send a conflated persisted ack if the safe sequence moved forward; when it
        is ``not_journaled`` (a publish to a topic this instance does not journal), the
        ack says so in its ``reason``."""
        ledger = self.ledger
        if ledger is None:
            return
        safe = ledger.advance()
        if safe is not None and self.wants_persisted:
            reason = messages.NOT_JOURNALED if safe == not_journaled else ""
            self.send(messages.persisted_ack(safe, self.pub_hash, reason))
        if not ledger.pending and self._flush_waiters:
            for cid, types in self._flush_waiters:
                self.ack({"cid": cid}, "persisted")
                if "completed" in types:
                    self.ack({"cid": cid}, "completed")
            self._flush_waiters.clear()

    def publishes_failed(self, seqs: list[int], reason: str, detail: str) -> None:
        """These publishes were not stored: a persisted failure ack for each (when
        this connection asked for persisted acks), so the publisher never waits for
        them."""
        if not self.wants_persisted:
            return
        for seq in seqs:
            self.send(messages.publish_failed(seq, reason, detail))

    # ---------------------------------------------------------------- commands
    def _on_logon(self, frame: Frame) -> None:
        """A logon on a connection that has logged on (the first one is awaited by
        :meth:`_logon`)."""
        raise CommandFailed(reasons.INVALID_LOGON, "this connection is already logged on")

    async def _logon(self, frame: Frame) -> None:
        """The connection's logon: check the credentials (through the instance's
        :class:`amps_py.auth_gate.AuthGate`: off the event loop, backed off after
        failures, logged), claim the client name, answer.

        Raises:
            Disconnect: the logon was refused (a failure ack is queued), or its check
                did not end by the transport's LogonTimeout.
            CommandFailed: the logon's ack types are invalid (the connection stays).
        """
        header = frame.header
        acks = ack_types(header)
        instance = self.instance
        authenticator = self.authenticator
        try:
            request = read_logon(header, journaled=instance.journal is not None)
            message_type = choose_message_type(
                header,
                self.transport,
                instance.transport_config(self.transport).message_type,
                instance.message_types,
            )
            # the password is used for this check only: never stored, logged or echoed
            verdict: GateVerdict | None = None
            with trio.move_on_at(self._logon_deadline):
                verdict = await instance.auth_gate.check(
                    authenticator,
                    request.user,
                    request.password,
                    self.peer,
                    f"client {shown_user(request.name)} on transport {self.transport}",
                    events.CLIENT_AUTH_FAILED,
                )
            if verdict is None:
                # the check (waiting for a free check thread) outlasted LogonTimeout
                late = ReadDeadline(self._logon_deadline, "logon")
                raise Disconnect(deadline_passed(self, late, instance.limits))
            check_authenticated(request, verdict.ok, verdict.refusal)
            check_owner(request, instance.name_owner_refusal(request.name, request.user), self.peer)
            check_claimed(
                request, instance.claim_client_name(self, request.name, request.user), self.peer
            )
        except LogonRefused as exc:
            if exc.message:
                log.warning(exc.message, *exc.log_args, extra=events.extra(exc.event))
            self._fail(header, exc)
            raise Disconnect(exc.disconnect) from None
        assert verdict.result is not None  # accepted: the authenticator answered
        self.message_type = message_type
        self._logged_on(header, acks, request, verdict.result)

    def _logged_on(
        self,
        header: dict[str, Any],
        acks: frozenset[str],
        request: LogonRequest,
        verdict: AuthResult,
    ) -> None:
        """The logon was accepted: take the name, answer with the success ack."""
        instance = self.instance
        name = self.client_name = request.name
        self.user_id = request.user
        self.client_version = request.version
        self.pub_hash = publisher_hash(name) if name else 0
        self.logged_on = True
        last = 0
        if name and instance.journal is not None:
            # the highest seq held here from any source, durable or not (a publisher
            # that failed over must never reuse a seq that names another message)
            last = instance.held_seq(self.pub_hash)
            self.ledger = instance.ledger(self.pub_hash)
        # logon option ack_conflation: accepted, nothing to do (acks conflate per commit)
        log.info(
            "client %r logged on from %s (user %r, last seq held %d, version %s)",
            name,
            self.peer,
            request.user,
            last,
            self.client_version or "not given",
            extra=events.extra(events.CLIENT_LOGON),
        )
        instance.fire_action("logon-client", client_variables(self, connected=False))
        if "processed" in acks or not acks:
            self.ack(header, "processed", **logon_ack_fields(request, verdict, self.pub_hash, last))

    def is_entitled(self, topic: str, *, write: bool) -> bool:
        """Whether this session's user may read/write the concrete topic ``topic``
        (cached per topic for the session; nothing counted)."""
        key = (write, topic)
        allowed = self._entitled.get(key)
        if allowed is None:
            entitler = self.entitler
            if write:
                allowed = entitler.can_write(self.user_id, topic)
            else:
                allowed = entitler.can_read(self.user_id, topic)
            if len(self._entitled) >= 4096:
                self._entitled.clear()
            self._entitled[key] = allowed
        return allowed

    def may_read(self, topic: str) -> bool:
        """:meth:`is_entitled` for reading: what :class:`EntitledTopics` asks per topic."""
        return self.is_entitled(topic, write=False)

    def topics_to_read(self, topic: str, non_regex: bool) -> TopicPattern | None:
        """What a subscription, SOW query or replay on ``topic`` may run over: None
        for an exact topic (which this user may read), else the topic regex, limited
        to the topics this user may read unless the user reads everything. A regex is
        never judged by its text: entitlement is decided per concrete topic
        (docs/GUARANTEES.md, "Security").

        Raises:
            CommandFailed: ``not entitled`` for an exact topic the user may not read,
                or a regex when the user may read no topic at all; ``bad regex
                topic`` for a regex that does not compile.
        """
        try:
            regex = compile_topic(topic, non_regex)
        except BadTopic as exc:
            raise CommandFailed(exc.reason, str(exc)) from None
        if regex is None:
            self.require_entitled(topic, write=False)
            return None
        entitler = self.entitler
        if entitler.reads_everything(self.user_id):
            return regex
        if entitler.reads_nothing(self.user_id):
            self.instance.counters.count_denied(write=False)
            raise CommandFailed(
                reasons.NOT_ENTITLED,
                f"user {self.user_id!r} may read no topic (asked for topic expression "
                f"{topic!r}); the {entitler.module} rules decide",
            )
        return EntitledTopics(regex, self.may_read)

    def require_entitled(self, topic: str, *, write: bool, action: str = "") -> None:
        """Raise ``not entitled`` unless this session's user may read/write the
        concrete topic ``topic`` (reads over a topic expression go through
        :meth:`topics_to_read` instead). Refusals are counted (``denied_commands``,
        and ``denied_writes`` for writes); the connection stays open. ``action`` names
        what was refused in the detail ("delete from"; default "publish to" or "read").
        """
        if self.is_entitled(topic, write=write):
            return
        self.instance.counters.count_denied(write=write)
        action = action or ("publish to" if write else "read")
        raise CommandFailed(
            reasons.NOT_ENTITLED,
            f"user {self.user_id!r} may not {action} topic {topic!r}; the "
            f"{self.entitler.module} rules decide",
        )

    def _on_publish(self, frame: Frame) -> None:
        header = frame.header
        topic = header.get("t")
        if not topic or not isinstance(topic, str):
            raise CommandFailed(reasons.NO_TOPIC, "publish needs a topic (t)")
        if len(topic) > MAX_FIELD_BYTES // 4:
            check_field_size(topic, "topic", reasons.INVALID_TOPIC)
        cid = header.get("x")
        if cid is not None:
            check_field_size(str(cid), "correlation id (x)", reasons.INVALID_CORRELATION_ID)
        self.require_entitled(topic, write=True)
        conflated = self.instance.sow.conflated
        if conflated and topic in conflated:
            underlying = conflated[topic].derived_from
            raise CommandFailed(
                reasons.INVALID_TOPIC,
                f"{topic!r} is a conflated topic, derived from SOW topic {underlying!r}: "
                f"publish to {underlying} instead",
            )
        routes = self._publish_routes
        if routes is not None:
            topic = routes.get(topic, topic)  # a queue's name: to its DefaultPublishTarget
        acks = ack_types(header)
        self.messages_in += 1
        seq = header.get("s")
        ledger = self.ledger
        if seq is None or type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            seq = self.publish_seq(header, acks)  # the rare cases, with their errors
        elif "persisted" in acks or (self._always_persisted and "s" in header):
            self.wants_persisted = True
        outcome = self.instance.publish(self, topic, seq, frame.payload, header)
        if outcome == "done" and ledger is not None:
            ledger.resent_durable(seq)
        if "received" in acks:
            self.ack(header, "received", s=seq)
        if "processed" in acks:
            self.ack(header, "processed", s=seq)
        if "completed" in acks:
            self.ack(header, "completed", s=seq)
        if outcome == "done":
            journaled = self.instance.journals_topic(topic, self.message_type)
            if ledger is not None:
                self.persisted_progress(0 if journaled else seq)
            elif self.wants_persisted and not journaled:
                # no ledger (no transaction log, or no client name): nothing is stored,
                # and a publisher that asked for persisted acks is told so, not left
                # waiting
                self.send(messages.persisted_ack(seq, self.pub_hash, messages.NOT_JOURNALED))

    def publish_seq(self, header: dict[str, Any], acks: frozenset[str]) -> int:
        """The seq of a publish or sow_delete: its ``s``, or the next one above every
        seq held or queued here for this client name. Notes a wish for persisted acks.

        Raises:
            CommandFailed: ``s`` is not a whole number in range.
        """
        seq = header.get("s")
        if seq is None:
            ledger = self.ledger
            if ledger is not None:
                seq = ledger.high + 1
            else:  # no journal: the seq only numbers the acks
                self._auto_seq += 1
                seq = self._auto_seq
        elif type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            raise CommandFailed(
                reasons.INVALID_SEQ, f"seq (s) must be an integer from 0 to {MAX_SEQ}, got {seq!r}"
            )
        if "persisted" in acks or (self._always_persisted and "s" in header):
            self.wants_persisted = True
        return int(seq)

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

    def _on_heartbeat(self, frame: Frame) -> None:
        header = frame.header
        interval = heartbeat_start(header)
        if interval is not None:
            first = self.heartbeat_interval == 0
            self.heartbeat_interval = interval
            if first and self._nursery is not None:
                self._nursery.start_soon(self._heartbeat_loop)
        acks = ack_types(header)
        if "processed" in acks:
            self.ack(header, "processed")

    async def _heartbeat_loop(self) -> None:
        while True:
            interval = self.heartbeat_interval
            await trio.sleep(interval)
            self.send(messages.HEARTBEAT)
            silent = trio.current_time() - self.last_receive
            # grace: two intervals plus one more without a byte from the client (AMPS
            # clients answer our beat when it arrives, so a reply can trail it)
            if silent > HEARTBEAT_GRACE_INTERVALS * interval:
                log.warning(
                    "client %r sent nothing for %.1f s (heartbeat %.1f s); disconnecting",
                    self.client_name,
                    silent,
                    interval,
                    extra=events.extra(events.CLIENT_HEARTBEAT_MISSED),
                )
                self.close("heartbeat")
                return

    def _on_start_timer(self, frame: Frame) -> None:
        """``start_timer``: start (or restart) this connection's timer; answered in the
        ack types asked for (``processed`` when none)."""
        header = frame.header
        self._timer_started = time.monotonic()
        for kind in ack_types(header) or frozenset({"processed"}):
            self.ack(header, kind)

    def _on_stop_timer(self, frame: Frame) -> None:
        """``stop_timer``: stop the timer and answer with the time since
        ``start_timer`` in the ack's ``reason`` (``elapsed <seconds> s``), in the ack
        types asked for (``completed`` when none).

        Raises:
            CommandFailed: no ``start_timer`` came first on this connection.
        """
        header = frame.header
        started = self._timer_started
        if started is None:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                "stop_timer needs a start_timer first on this connection",
            )
        self._timer_started = None
        elapsed = time.monotonic() - started
        for kind in ack_types(header) or frozenset({"completed"}):
            self.ack(header, kind, reason=f"elapsed {elapsed:.6f} s")

    def _on_flush(self, frame: Frame) -> None:
        header = frame.header
        acks = ack_types(header) or frozenset({"processed"})
        for kind in ("received", "processed"):
            if kind in acks:
                self.ack(header, kind)
        if "persisted" in acks:
            if self.awaiting_persisted:
                self._flush_waiters.append((header.get("cid", ""), acks))
                return
            self.ack(header, "persisted")
        if "completed" in acks:
            self.ack(header, "completed")
