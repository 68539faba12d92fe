"""An outgoing destination's state and its stream over a connection it has:
:class:`DestinationStream`. :class:`.outgoing.Destination` adds how it gets one
(dialling, or back over the peer's connection).

Over a connection: the hello, the peer's welcome (:mod:`.handshake`), the resync
(from the peer's cursor, else as the resync exchange plans: :mod:`.resync_reading`),
then journal records as they commit, and the peer's acks. The sync/async decisions
are :mod:`.ackmode`'s, the outage log lines :mod:`.outage`'s, the statistics' shape
:mod:`.destination_stats`'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import trio

from amps_py import events, reasons
from amps_py.config import DestinationConfig, LinkCredentialsError
from amps_py.trio_util import unwrapping_groups
from amps_py.units import utc_iso
from txlog import CorruptRecord, UnreadableRecords

from .ackmode import AckMode, Downgraded, Observed, Upgraded, seconds_behind
from .backoff import ReconnectBackoff
from .destination_stats import DestinationStatistics, Rates
from .exchange import ResyncPlan
from .handshake import await_welcome, resync_point
from .link import Ack, LinkError, Refused, UpstreamLink, Welcome
from .mux import RoleStream
from .outage import OutageLog, duration
from .resync_reading import offered_holdings, read_plan
from .routing import Route

if TYPE_CHECKING:
    from txlog import Record
    from txlog.record import RouteView

    from .host import ReplicationHost

#: the outgoing driver's logger: these lines are a destination's, as before they moved
log = logging.getLogger("amps_py.replication.outgoing")

#: records read from the journal per data frame
SEND_BATCH: Final = 8192
#: stop sending while this many records are sent but not acknowledged
MAX_UNACKED_RECORDS: Final = 200_000
#: longest a destination goes without learning the stream's position while commits
#: hold nothing for it (their positions are passed over, see
#: DestinationStream._pass_over)
POSITION_INTERVAL: Final = 1.0
#: what a broken link raises, possibly in several of its tasks at once
CONNECTION_FAILURES: Final = (
    LinkError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
    trio.TooSlowError,
)


class DestinationStream:
    """Runtime state of one configured destination, and its stream over a connection
    (:meth:`_stream_session`); its counters, ack mode and statistics outlive
    connections."""

    def __init__(self, instance: ReplicationHost, config: DestinationConfig) -> None:
        self.instance = instance
        self.config = config
        self.name = config.name
        self.route = Route(config, instance.config.message_types)
        #: sync, downgraded or upgrade pending; the resync of the current connection
        self.ack_mode = AckMode(config.sync)
        self.remote_name = ""
        self.connected = False
        self.address = ""
        self.remote_group = ""
        self.authenticated_id = ""
        self.connect_time = 0.0
        self.disconnect_time = 0.0
        self._rates = Rates()
        self.sent_txid = 0
        self.acked_txid = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.raw_bytes_out = 0
        self.disconnect_count = 0
        self.resyncs = 0
        self.resync_records = 0
        self.resync_skipped = 0
        #: the resync exchange's plan of the current connection, until the stream
        #: passes its ``through``
        self._plan: ResyncPlan | None = None
        self.holes = 0
        #: the last hole in words (which txids were not sent, why, the fix); "" if none
        self.last_hole = ""
        self.last_error = ""
        self._ack_event = trio.Event()
        self._sending_upto = 0
        #: the ``upto`` of the last frame sent on this connection, and when (trio time)
        self._frame_upto = 0
        self._frame_sent_at = 0.0
        #: a position passed over, not yet sent: (txid, bookmark)
        self._owed: tuple[int, str] | None = None
        self._send_lock = trio.Lock()
        self._backoff = ReconnectBackoff(config.reconnect_delay)
        #: set when the peer connects to this instance: a back-off wait ends at once
        self._peer_up = trio.Event()
        #: the back-off wait in progress (seconds), 0 while connecting or connected
        self.reconnect_wait = 0.0
        #: whether it is down, since when, and when to log that (wall-clock time)
        self._outage = OutageLog()

    async def _send(self, stream: RoleStream, data: bytes) -> None:
        async with self._send_lock:
            await stream.send_all(data)

    # ---------------------------------------------------------------- stream
    async def _stream_session(self, stream: RoleStream, *, back: bool) -> bool:
        instance = self.instance
        cfg = self.config
        now = trio.current_time
        link = UpstreamLink(now(), cfg.heartbeat_interval, cfg.compression)
        credentials = None
        if cfg.authenticator is not None:
            try:  # read now, so a rotated PasswordFile or a new PasswordEnv value is used
                credentials = cfg.authenticator.credentials()
            except LinkCredentialsError as exc:
                raise LinkError(reasons.CREDENTIALS_UNAVAILABLE, str(exc)) from None
        await stream.send_all(
            link.hello(
                name=instance.name,
                group=instance.group,
                destination=cfg.name,
                sync=cfg.sync_type,
                topics=self.route.describe_topics(
                    instance.config.sow_topics, instance.config.queues
                ),
                now=now(),
                expected_group=cfg.group or "",
                credentials=credentials,
                back=back,
                holdings=offered_holdings(instance.journal, self.name),
            )
        )
        welcome = await await_welcome(stream, link, cfg, instance.name)
        # the welcome passed every check: full-size frames (the peer's stream back) from now
        stream.handshake_done()
        self.remote_name = welcome.name
        self.remote_group = welcome.group
        self.authenticated_id = credentials[0] if credentials else ""
        start = await self._resync_start(welcome)
        self.sent_txid = self.acked_txid = self._sending_upto = self._frame_upto = start
        if self._plan is not None:
            # the first frame follows on from the peer's own position: what lies between
            # it and the start is what the exchange proved it holds, not frames lost
            self._frame_upto = welcome.cursor_txid
        self._frame_sent_at = trio.current_time()
        self._owed = None
        self.connected = True
        self.connect_time = time.time()
        self._backoff.connected(now())
        recovery = self._outage.recovered(self.connect_time)
        if recovery is not None:
            log.info(
                "replication to %s (%s) is up again after %s down (%d failed attempt%s)",
                cfg.name,
                self.address,
                duration(recovery.down_for),
                recovery.total_attempts,
                "s" if recovery.total_attempts != 1 else "",
                extra=events.extra(events.REPLICATION_CONNECTED),
            )
        self._peer_up = trio.Event()  # a connection of the peer's from before does not count
        self.resyncs += 1
        resync_end = instance.committed_txid
        self.ack_mode.connected(resync_end)
        instance.fire_action("connect-replication", self._action_variables())
        self._check_resync_complete()
        log.info(
            "replication to %s (%s, instance %s, %s) connected; resuming after txid %d "
            "(local journal at %d)",
            cfg.name,
            self.address,
            welcome.name,
            "sync" if self.sync else "async",
            start,
            resync_end,
            extra=events.extra(events.REPLICATION_CONNECTED),
        )
        instance.replication_changed()
        async with unwrapping_groups(CONNECTION_FAILURES), trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop, stream, link, nursery.cancel_scope)
            nursery.start_soon(self._heartbeat_loop, stream, link)
            await self._send_loop(stream, link, resync_end)
        return True

    async def _resync_start(self, welcome: Welcome) -> int:
        """The txid the stream resumes after: the peer's cursor (:func:`resync_point`),
        else, when the welcome answered the resync exchange, after what the peer is
        proven to hold (the plan is kept until the stream passes its ``through``)."""
        exchange = welcome.holdings is not None
        start = resync_point(self.name, welcome, self.instance.journal, exchange=exchange)
        self._plan = None
        if start == 0 and exchange:
            self._plan = await read_plan(self.instance.journal, welcome, self.name)
            if self._plan is not None:
                start = self._plan.after
                self.resync_skipped += self._plan.held
        return start

    def _unheld(
        self, messages: Sequence[Record] | Sequence[RouteView], routed: list[int]
    ) -> list[int]:
        """Of the ``routed`` indexes of ``messages``, those the peer is not proven to
        hold (the resync exchange's plan)."""
        found = self._plan
        assert found is not None
        holds = found.holds
        return [
            i
            for i in routed
            if not holds(messages[i].txid, messages[i].origin, messages[i].origin_txid)
        ]

    async def _send_loop(self, stream: RoleStream, link: UpstreamLink, resync_end: int) -> None:
        instance = self.instance
        journal = instance.journal
        assert journal is not None
        select = self.route.select
        remote = self.remote_name
        writer = instance.writer
        assert writer is not None
        recent = writer.recent
        while True:
            committed = instance.committed_txid
            if self.sent_txid >= committed:
                owed = self._owed
                if owed is None:
                    await instance.wait_for_commit(self.sent_txid)
                    continue
                left = self._frame_sent_at + POSITION_INTERVAL - trio.current_time()
                with trio.move_on_after(max(left, 0.0)) as waiting:
                    await instance.wait_for_commit(self.sent_txid)
                if not waiting.cancelled_caught:
                    continue
                # quiet for a while: tell the destination where the stream is
                frame = link.data([], owed[0], owed[1], trio.current_time(), self._frame_upto)
                await self._sent(stream, frame, [], owed[0], resync_end, link)
                continue
            while self.sent_txid - self.acked_txid > MAX_UNACKED_RECORDS:
                self._ack_event = trio.Event()
                await self._ack_event.wait()
            if self._plan is not None and self.sent_txid >= self._plan.through:
                self._plan = None  # nothing after it is proven held
            fresh = recent.after(self.sent_txid, SEND_BATCH, committed)
            if fresh is not None:
                # just committed: the records and their stored bytes are in memory
                records, values = fresh
                if self._plan is None:
                    selected = select(records, values, remote, _record_payload)
                else:
                    routed = select(records, range(len(records)), remote, _record_payload)
                    selected = [values[i] for i in self._unheld(records, routed)]
                last = records[-1]
                upto, upto_bm = last.txid, last.bookmark
                if not selected and self._pass_over(upto, upto_bm):
                    continue
                frame = link.data(selected, upto, upto_bm, trio.current_time(), self._frame_upto)
                await self._sent(stream, frame, selected, upto, resync_end, link)
                continue
            # further behind: routing views decode only what routing needs; the stored
            # bytes go out as they are, and a payload is decoded only for a content filter
            batch, damage = journal.read_route_views(self.sent_txid, SEND_BATCH, committed)
            if self._plan is None:
                raws = [view.raw for view in batch]
                selected = select(batch, raws, remote, journal.route_payload)
            else:
                routed = select(batch, range(len(batch)), remote, journal.route_payload)
                selected = [batch[i].raw for i in self._unheld(batch, routed)]
            if damage is not None:
                # damaged records cannot be sent; say so once, never skip quietly
                upto = self._hole(damage, committed)
                upto_bm = batch[-1].bookmark if batch else ""
            elif batch:
                upto = batch[-1].txid
                upto_bm = batch[-1].bookmark
            else:
                await instance.wait_for_commit(self.sent_txid)
                continue
            frame = link.data(selected, upto, upto_bm, trio.current_time(), self._frame_upto)
            await self._sent(stream, frame, selected, upto, resync_end, link)

    def _hole(self, damage: CorruptRecord, committed: int) -> int:
        """Records after :attr:`sent_txid` cannot be sent: one that fails its CRC, or
        (:class:`~txlog.UnreadableRecords`) the range a damaged LMDB page hides. Count
        and log the hole once (``15-0006``, with the range and the fix), keep it for the
        statistics, and return the txid the stream goes on after (the end of the hole,
        at most ``committed``)."""
        first = damage.txid if damage.txid is not None else self.sent_txid + 1
        if isinstance(damage, UnreadableRecords) and damage.through is None:
            through = committed  # nothing after it reads (as far as is committed)
        else:
            through = damage.through if damage.through is not None else first
        through = max(first, min(through, committed))
        what = f"txid {first}" if through == first else f"txids {first} to {through}"
        journal = self.instance.journal
        path = journal.path if journal is not None else "?"
        self.holes += 1
        self.last_hole = (
            f"{what} not sent: {damage}; fix: amps-py txlog verify {path} on this "
            "instance lists the damage"
        )
        log.error(
            "replication hole: destination %s cannot receive %s, damaged in journal %s "
            "(%s); the stream goes on after txid %d",
            self.name,
            what,
            path,
            damage,
            through,
            extra=events.extra(events.REPLICATION_HOLE),
        )
        return through

    async def _sent(
        self,
        stream: RoleStream,
        frame: bytes,
        selected: list[bytes],
        upto: int,
        resync_end: int,
        link: UpstreamLink,
    ) -> None:
        """Send one data frame that brings the destination up to ``upto``; count it."""
        # the peer may ack this frame before send_all returns: count it as sent first
        self._sending_upto = upto
        await self._send(stream, frame)
        if self.sent_txid < resync_end:
            self.resync_records += len(selected)
        self.sent_txid = self._frame_upto = upto
        self._frame_sent_at = trio.current_time()
        self._owed = None
        self.messages_out += len(selected)
        self.bytes_out = link.bytes_out
        self.raw_bytes_out = link.raw_bytes_out

    def _pass_over(self, upto: int, upto_bm: str) -> bool:
        """Commits through ``upto`` hold nothing for this destination (filtered out,
        or its own records coming back). When it has acknowledged everything sent,
        count them as acknowledged without a frame: the round trip would only tell it
        the stream's position, and cost both instances a wake-up per commit (in a
        hot-hot pair, every commit of the other side's records). The position goes
        with the next frame, or alone after :data:`POSITION_INTERVAL`. Returns
        whether the commits were passed over."""
        if self.acked_txid < self.sent_txid:
            return False  # an ack is awaited: the next frame brings the position
        if trio.current_time() - self._frame_sent_at >= POSITION_INTERVAL:
            return False  # due: send the position now
        self._owed = (upto, upto_bm)
        self.sent_txid = self.acked_txid = self._sending_upto = upto
        self._acknowledged()
        return True

    def _acknowledged(self) -> None:
        """:attr:`acked_txid` moved on: wake what waits for it."""
        self._ack_event.set()
        upgraded = self.ack_mode.acked(self.acked_txid)
        if upgraded is not None:
            self._mode_changed(upgraded)
        self._check_resync_complete()
        self.instance.replication_acked()

    async def _receive_loop(
        self, stream: RoleStream, link: UpstreamLink, scope: trio.CancelScope
    ) -> None:
        while True:
            frames = await stream.receive_frames()
            if not frames:
                raise LinkError(reasons.CLOSED, "the peer closed the connection")
            for event in link.receive_frames(frames, trio.current_time()):
                if isinstance(event, Ack):
                    if event.upto > self.acked_txid:
                        # never beyond what was sent (a confused peer cannot release acks)
                        self.acked_txid = min(event.upto, max(self.sent_txid, self._sending_upto))
                        self._acknowledged()
                elif isinstance(event, Refused):
                    raise LinkError(event.reason, f"the peer closed the link: {event.detail}")

    async def _heartbeat_loop(self, stream: RoleStream, link: UpstreamLink) -> None:
        while True:
            await trio.sleep_until(link.next_deadline())
            data = link.handle_timer(trio.current_time())
            if data:
                await self._send(stream, data)

    # ---------------------------------------------------------------- info
    @property
    def sync(self) -> bool:
        """Whether persisted acks wait for this destination now (see :class:`AckMode`),
        for the records routed to it."""
        return self.ack_mode.sync

    @property
    def routing_key(self) -> object:
        """What :meth:`routed` depends on besides the config: the remote instance's
        name (loop prevention), learned at connect ("" before: nothing is excluded)."""
        return self.remote_name

    def routed(self, records: Sequence[Record]) -> list[int]:
        """The indexes, ascending, of the committed ``records`` this destination is
        sent (the persisted acks of exactly those wait for it while it is sync); the
        same decision as the send loop's (:meth:`Route.select`)."""
        return self.route.select(records, range(len(records)), self.remote_name, _record_payload)

    @property
    def acks_waiting(self) -> int:
        """How many committed records routed to this destination wait for its
        acknowledgement before their persisted acks (0 while it is async)."""
        return self.instance.acks_waiting_for(self.name) if self.sync else 0

    @property
    def upgrade_pending(self) -> bool:
        return self.ack_mode.upgrade_pending

    @property
    def downgrades(self) -> int:
        return self.ack_mode.downgrades

    @property
    def upgrades(self) -> int:
        return self.ack_mode.upgrades

    def oldest_unacked_at(self) -> float | None:
        """When (epoch seconds) the oldest local record the destination has not
        acknowledged was written; None when it has acknowledged every committed one."""
        instance = self.instance
        if self.acked_txid >= instance.committed_txid or instance.journal is None:
            return None
        journal = instance.journal
        try:
            rec = journal.get(self.acked_txid + 1)
        except CorruptRecord as exc:
            # damaged (a hole): the first readable record after it is as old as it gets
            after = exc.through if exc.through is not None else self.acked_txid + 1
            try:
                found = journal.read(after, 1, instance.committed_txid)
            except CorruptRecord:
                return None
            rec = found[0] if found else None
        if rec is None:
            return None
        return rec.local_ts / 1e6

    def seconds_behind(self) -> float:
        """Age of the oldest local record the destination has not acknowledged."""
        return seconds_behind(time.time(), self.oldest_unacked_at())

    def observe(self) -> Observed:
        """What the downgrade and upgrade rules look at (:mod:`.ackmode`)."""
        return Observed(
            name=self.name,
            configured_sync=self.config.sync,
            sync=self.sync,
            connected=self.connected,
            upgrade_pending=self.upgrade_pending,
            oldest_unacked_at=self.oldest_unacked_at(),
        )

    # ---------------------------------------------------------------- ack mode
    def downgrade(self, why: str) -> str:
        """Acknowledge async from now on: persisted acks stop waiting for this
        destination at once (those already waiting are released). Returns what
        happened, in words."""
        decision = self.ack_mode.downgrade(why)
        if isinstance(decision, Downgraded):
            self._mode_changed(decision)
        return decision.outcome

    def upgrade(self, why: str) -> str:
        """Back to sync once the destination has acknowledged everything committed now
        (so publishers never wait for a backlog). Returns what happened, in words."""
        decision = self.ack_mode.upgrade(
            why,
            committed=self.instance.committed_txid,
            acked=self.acked_txid,
            connected=self.connected,
        )
        if isinstance(decision, Upgraded):
            self._mode_changed(decision)
        return decision.outcome

    def _mode_changed(self, change: Downgraded | Upgraded) -> None:
        """Log a downgrade or upgrade, release or hold acks, fire the On actions."""
        upgraded = isinstance(change, Upgraded)
        log.warning(
            "destination %s %s (%s): persisted acks %s for it",
            self.name,
            change.outcome,
            change.why,
            "wait again" if upgraded else "no longer wait",
            extra=events.extra(
                events.REPLICATION_UPGRADED if upgraded else events.REPLICATION_DOWNGRADED
            ),
        )
        self.instance.replication_changed()
        self.instance.fire_action(
            "upgrade-replication" if upgraded else "downgrade-replication",
            self._action_variables(),
        )

    def _action_variables(self) -> dict[str, str]:
        """What the replication On actions get (AMPS's names, plus the destination)."""
        return {
            "AMPS_REPLICATION_PEER_NAME": self.remote_name,
            "AMPS_REPLICATION_GROUP_NAME": self.config.group or "",
            "AMPS_REPLICATION_REMOTE_ADDRESS": self.address.partition(" (")[0],
            "AMPS_REPLICATION_CLIENT_NAME": f"{self.instance.name}->{self.name}",
            "AMPS_REPLICATION_TRANSPORT_NAME": self.config.name,
            "AMPS_DESTINATION_NAME": self.name,
        }

    def _check_resync_complete(self) -> None:
        """Fire ``on-replication-resync-complete`` once per connection, when the peer
        has acknowledged everything this journal held when the connection started."""
        if self.ack_mode.resync_complete(self.acked_txid) is not None:
            self.instance.fire_action("replication-resync-complete", self._action_variables())

    def _session_ended(self) -> bool:
        """Bookkeeping when a connection (dialled or attached) ends; returns whether it
        had completed its handshake."""
        self.ack_mode.disconnected()
        was_up = self.connected
        if was_up:
            self._backoff.lost(trio.current_time())
            self.disconnect_count += 1
            self.disconnect_time = time.time()
            self._outage.lost(self.disconnect_time)
            self.connected = False
            self.instance.fire_action("disconnect-replication", self._action_variables())
        self.instance.replication_changed()
        return was_up

    def statistics(self) -> DestinationStatistics:
        messages_rate, bytes_rate = self._rates.update(
            time.monotonic(), self.messages_out, self.bytes_out
        )
        now, down_since = time.time(), self._outage.down_since
        return DestinationStatistics(
            name=self.name,
            remote_name=self.remote_name,
            group=self.config.group,
            replication_type="sync" if self.sync else "async",
            configured_sync_type=self.config.sync_type,
            is_connected=self.connected,
            address=self.address,
            messages_out=self.messages_out,
            bytes_out=self.bytes_out,
            raw_bytes_out=self.raw_bytes_out,
            sent_txid=self.sent_txid,
            acked_txid=self.acked_txid,
            acks_waiting=self.acks_waiting,
            seconds_behind=self.seconds_behind(),
            disconnect_count=self.disconnect_count,
            resyncs=self.resyncs,
            resync_records=self.resync_records,
            resync_skipped=self.resync_skipped,
            holes=self.holes,
            last_hole=self.last_hole,
            pass_through=self.config.passthrough,
            last_error=self.last_error,
            downgrades=self.downgrades,
            upgrades=self.upgrades,
            upgrade_pending=self.upgrade_pending,
            reconnect_wait=self.reconnect_wait,
            down_since=utc_iso(down_since) if down_since is not None else "",
            down_s=round(max(0.0, now - down_since), 3) if down_since is not None else 0.0,
            failed_attempts=self._outage.attempts,
            client_name=f"{self.instance.name}->{self.name}",
            authenticated_id=self.authenticated_id,
            destination_name=self.remote_name,
            destination_group_name=self.remote_group,
            connect_time=utc_iso(self.connect_time),
            disconnect_time=utc_iso(self.disconnect_time),
            messages_out_per_sec=messages_rate,
            bytes_out_per_sec=bytes_rate,
        )


def _record_payload(record: Record) -> bytes:
    """A just-committed record's payload, for a content filter (:meth:`Route.select`)."""
    return record.payload
