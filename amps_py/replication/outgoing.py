"""Outgoing replication: one task per Destination pushes this instance's journal.

Connects to the destination's ``InetAddr`` list in priority order, resyncs from the
cursor the downstream reports, then streams journal records as they commit and
processes acks. Between rounds of attempts it waits as :class:`.ReconnectBackoff`
decides (quick retries after losing a connection that was up, then the configured
``ReconnectTimeout`` back-off); a wait ends early when the peer connects to this
instance (:meth:`Destination.peer_connected`), since then it is up again.

A ``secure`` destination (Transport Type ``amps-replication-secure``) completes a TLS
handshake before the link's hello (:mod:`.dialing`). The hello's answer is checked and
the resync point found in :mod:`.handshake`; the sync/async decisions are
:mod:`.ackmode`'s, the outage log lines :mod:`.outage`'s, the statistics'
shape :mod:`.destination_stats`'.

Without a usable cursor (the peer never received this instance's stream directly, or
lost its position), the hello's holdings and the welcome's answer decide where the
resync starts and which records the peer is proven to hold (:mod:`.exchange`): those
are not sent (``resync_skipped`` in the statistics). A peer that does not answer (an
older amps-py, a journal without holdings) is resent everything, as before.

A destination with a Transport ``Authenticator`` sends its user and password in the
hello (read at each connect: PasswordFile and PasswordEnv may change between
attempts). They travel in the clear unless the destination is ``secure``; they are
never logged.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import trio

from amps_py import events, net, offload, reasons
from amps_py.config import DestinationConfig, LinkCredentialsError
from amps_py.trio_util import unwrapping_groups
from amps_py.units import utc_iso
from txlog import CorruptRecord, UnreadableRecords
from txlog.holdings import Fingerprint, Holdings

from .ackmode import AckMode, Downgraded, Observed, Upgraded, seconds_behind
from .backoff import ReconnectBackoff
from .destination_stats import DestinationStatistics, Rates
from .dialing import CONNECT_TIMEOUT, LinkTls, connect_failure
from .exchange import (
    MAX_BUCKETS,
    ResyncPlan,
    Scan,
    floors,
    hello_holdings,
    partial_fingerprints,
    plan,
    scans,
)
from .handshake import RefusedByPeer, await_welcome, resync_point
from .incoming import UpstreamConnection
from .link import Ack, LinkError, Refused, UpstreamLink, Welcome
from .mux import RoleStream, SharedConnection
from .outage import OutageLog, duration, outage_line
from .routing import Route

if TYPE_CHECKING:
    from txlog import Journal, Record
    from txlog.record import RouteView

    from .host import ReplicationHost

log = logging.getLogger("amps_py.replication.outgoing")
_BOOKMARK_KEY = struct.Struct(">QQ")

#: records read from the journal per data frame
SEND_BATCH: Final = 8192
#: seconds a destination that has not connected since the instance started may fail
#: to connect before it is logged as a warning (at info before: instances started
#: together dial each other before every one listens, and a loaded machine starts six
#: instances in more than the outage log's first repeat, 10 s)
START_GRACE: Final = 30.0
#: stop sending while this many records are sent but not acknowledged
MAX_UNACKED_RECORDS: Final = 200_000
#: longest a destination goes without learning the stream's position while commits
#: hold nothing for it (their positions are passed over, see Destination._pass_over)
POSITION_INTERVAL: Final = 1.0
#: what a broken link raises, possibly in several of its tasks at once
CONNECTION_FAILURES: Final = (
    LinkError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
    trio.TooSlowError,
)


class Destination:
    """Runtime state of one configured destination."""

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
        self._tls = LinkTls(config)
        # back replication: the peer's connection this destination streams over
        self._attached: SharedConnection | None = None
        self._attached_scope: trio.CancelScope | None = None
        self._dial_scope: trio.CancelScope | None = None
        self._attach_wanted = trio.Event()
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

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        """Connect, stream, reconnect: forever (until cancelled).

        While the peer's own connection carries this destination's stream back (see
        :meth:`attach`), this destination does not dial; when that connection ends it
        dials again (or, without ``InetAddr``, waits for the peer's next connection).
        """
        if not self.config.inet_addrs:
            log.info(
                "destination %s has no InetAddr: waiting for the peer to connect; this "
                "instance replicates back over that connection",
                self.name,
                extra=events.extra(events.REPLICATION_WAITING),
            )
        while True:
            shared = self._attached
            if shared is not None:
                await self._run_attached(shared)
                continue
            self._attach_wanted = trio.Event()
            if not self.config.inet_addrs:
                await self._attach_wanted.wait()
                continue
            with trio.CancelScope() as scope:
                self._dial_scope = scope
                await self._dial()
            self._dial_scope = None

    def attach(self, shared: SharedConnection, peer_name: str) -> bool:
        """Replicate over ``shared``, a connection ``peer_name`` opened to this
        instance offering to take this destination's stream back. Returns whether it
        was taken.

        Taken when this destination has no ``InetAddr`` (it cannot dial: the DMZ case)
        or when the peer's name sorts before this instance's: of the two connections a
        mutually replicating pair may open, the one opened by the lower name is kept,
        so both ends agree without a negotiation. Taking it ends this destination's
        own connection, if it had one.
        """
        if self.config.inet_addrs and not peer_name < self.instance.name:
            return False
        previous = self._attached
        self._attached = shared
        if previous is not None and previous is not shared:
            previous_scope = self._attached_scope
            if previous_scope is not None:
                previous_scope.cancel()
        if self._dial_scope is not None:
            self._dial_scope.cancel()
        self._attach_wanted.set()
        log.info(
            "destination %s replicates back over the connection from %s (%s)",
            self.name,
            peer_name,
            shared.peer,
            extra=events.extra(events.REPLICATION_CONNECTED),
        )
        return True

    async def _run_attached(self, shared: SharedConnection) -> None:
        self.address = f"{shared.peer} (back over the peer's connection)"
        try:
            with trio.CancelScope() as scope:
                self._attached_scope = scope
                await self._stream_session(shared.up, back=False)
        except LinkError as exc:
            self.last_error = str(exc)
            log.warning(
                "replication to %s over %s's connection ended: %s",
                self.name,
                shared.peer,
                exc,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.last_error = f"connection lost: {exc}"
        finally:
            self._attached_scope = None
            if self._attached is shared:
                self._attached = None
            self._session_ended()
            with trio.CancelScope(shield=True):
                await shared.up.aclose()

    def peer_connected(self, peer_name: str) -> None:
        """Instance ``peer_name``, this destination's peer, connected to this instance:
        it is up, so a back-off wait in progress ends now and the next round of
        attempts starts (nothing changes while this destination is connected)."""
        if self.connected or self._peer_up.is_set():
            return
        self._peer_up.set()
        if self.reconnect_wait:
            log.info(
                "destination %s: its peer %s connected to this instance; dialling it now "
                "instead of after the %g s back-off",
                self.name,
                peer_name,
                self.reconnect_wait,
                extra=events.extra(events.REPLICATION_WAITING),
            )

    async def _wait_to_dial(self) -> None:
        """Wait until the back-off policy says the next round is due, or until the peer
        connects to this instance (:meth:`peer_connected`)."""
        delay = self._backoff.delay(trio.current_time())
        if delay <= 0:
            return
        self.reconnect_wait = self._backoff.wait
        try:
            with trio.move_on_after(delay):
                await self._peer_up.wait()
        finally:
            self.reconnect_wait = 0.0

    async def _dial(self) -> None:
        """Try the ``InetAddr`` list in rounds until cancelled, waiting between rounds as
        :meth:`_wait_to_dial` says. A connection that was up ends its round: the next
        starts again from the first (preferred) address."""
        while True:
            await self._wait_to_dial()
            # the peer connecting from now on (e.g. while this round fails) ends the
            # next wait
            self._peer_up = trio.Event()
            for host, port in self.config.inet_addrs:
                if await self._attempt(host, port):
                    break
            else:
                self._backoff.failed(trio.current_time())

    async def _attempt(self, host: str, port: int) -> bool:
        """One connection to ``host:port``, streamed until it ends. Returns whether it
        completed its handshake (then the back-off policy has been told it was lost)."""
        address = f"{host}:{port}"
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await net.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            why = connect_failure(exc)
            self._attempt_failed(
                address, f"connect to {address}: {why}", events.REPLICATION_UNREACHABLE
            )
            return False
        self.address = address
        link_stream: trio.abc.Stream = stream
        ended: BaseException | None = None
        ended_by: str | None = None
        try:
            if self.config.secure:
                link_stream = await self._tls.wrap(stream, host, address)
            await self._session(link_stream, address)
        except LinkError as exc:
            ended, ended_by = exc, str(exc)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
            trio.TooSlowError,
        ) as exc:
            ended, ended_by = exc, f"connection lost: {exc}"
        finally:
            was_up = self._session_ended()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await link_stream.aclose()
            if link_stream is not stream:  # TLS: make sure the socket is closed
                await trio.aclose_forcefully(stream)
        if ended_by is None:
            return was_up
        if not was_up:  # the attempt failed before the link was up
            if isinstance(ended, RefusedByPeer):
                code = events.REPLICATION_REFUSED
            elif isinstance(ended, LinkError):
                code = events.REPLICATION_LINK_ERROR
            else:
                code = events.REPLICATION_UNREACHABLE
            self._attempt_failed(address, ended_by, code)
            return was_up
        self.last_error = ended_by
        if isinstance(ended, LinkError):
            log.warning(
                "replication to %s (%s) ended: %s",
                self.name,
                address,
                ended,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )
        else:
            log.info(
                "replication to %s (%s): connection lost (%s)",
                self.name,
                address,
                ended,
                extra=events.extra(events.REPLICATION_DISCONNECTED),
            )
        return was_up

    def _attempt_failed(self, address: str, error: str, code: str) -> None:
        """An attempt to connect to ``address`` failed with ``error`` (before the link
        was up): remember it, and log it when :class:`OutageLog` says so (the first
        failure, a new error, then at growing intervals with the count since)."""
        self.last_error = error
        report = self._outage.failed(time.time(), error)
        if report is None:
            return
        refused = code == events.REPLICATION_REFUSED and report.new_error
        level = logging.ERROR if refused else logging.WARNING
        # never connected since this instance started, and not for long: peers started
        # together dial each other before every one listens
        starting = (
            code == events.REPLICATION_UNREACHABLE
            and self.resyncs == 0
            and report.down_for < START_GRACE
        )
        if starting:
            level = logging.INFO
        log.log(
            level,
            "%s",
            outage_line(
                self.name,
                address,
                report,
                self._outage.down_since,
                sync=self.sync,
                waiting=self.acks_waiting,
                grace=START_GRACE if starting else None,
            ),
            extra=events.extra(code if report.new_error else events.REPLICATION_UNREACHABLE),
        )

    async def _session(self, stream: trio.abc.Stream, peer: str) -> bool:
        """One connection this instance opened: handshake, resync, stream. Returns True
        once handshook.

        The hello offers to take the peer's stream back over the same connection; if the
        peer sends one, it is received here like any upstream's
        (:class:`UpstreamConnection`).
        """
        shared = SharedConnection(stream, peer)
        async with unwrapping_groups(CONNECTION_FAILURES), trio.open_nursery() as nursery:
            nursery.start_soon(shared.run)
            nursery.start_soon(self._serve_back, shared)
            try:
                return await self._stream_session(shared.up, back=True)
            finally:
                nursery.cancel_scope.cancel()

    async def _serve_back(self, shared: SharedConnection) -> None:
        """Receive the peer's stream on this connection, once the peer starts one."""
        await shared.down.started.wait()
        if shared.ended.is_set():
            return
        try:
            await UpstreamConnection(self.instance, shared.down, shared.peer).run()
        except Exception:
            # the stream coming back must never end this instance's own stream
            log.exception(
                "replication back from %s failed",
                shared.peer,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )

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
                holdings=self._offered_holdings(),
            )
        )
        welcome = await await_welcome(stream, link, cfg, instance.name)
        # the welcome passed every check: full-size frames (the peer's stream back) from now
        stream.handshake_done()
        self.remote_name = welcome.name
        self.remote_group = welcome.group
        self.authenticated_id = credentials[0] if credentials else ""
        exchange = welcome.holdings is not None
        start = resync_point(self.name, welcome, instance.journal, exchange=exchange)
        self._plan = None
        if start == 0 and exchange:
            self._plan = await self._exchanged(welcome)
            if self._plan is not None:
                start = self._plan.after
                self.resync_skipped += self._plan.held
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

    def _offered_holdings(self) -> dict[str, int] | None:
        """What the hello says this journal holds (the resync exchange), or None when
        the journal keeps no holdings (or they cannot be read)."""
        journal = self.instance.journal
        if journal is None or not journal.holdings_valid:
            return None
        try:
            mine = journal.holdings()
        except CorruptRecord as exc:
            log.warning(
                "replication to %s: this journal's holdings cannot be read (%s); a peer "
                "without a cursor is resent everything",
                self.name,
                exc,
                extra=events.extra(events.REPLICATION_HOLE),
            )
            return None
        return None if mine is None else hello_holdings(mine)

    async def _exchanged(self, welcome: Welcome) -> ResyncPlan | None:
        """The resync of a peer without a usable cursor that answered the exchange:
        its holdings compared with this journal's (read on a worker thread). None when
        this journal's cannot be read: everything is resent."""
        journal = self.instance.journal
        reported = welcome.holdings
        if journal is None or reported is None:
            return None

        def read() -> ResyncPlan | None:
            compared = journal.holdings(list(reported), MAX_BUCKETS, floors(reported))
            every = journal.holdings()
            if compared is None or every is None:
                return None
            mine = Holdings(compared.through, {**every.origins, **compared.origins})
            partial = scanned(journal, scans(reported, mine), mine.through)
            return plan(reported, mine, welcome.name, partial)

        try:
            found = await offload.run_sync(read)
        except CorruptRecord as exc:
            log.warning(
                "replication to %s: this journal's holdings cannot be read (%s); "
                "resending everything it replicates to %s",
                self.name,
                exc,
                welcome.name,
                extra=events.extra(events.REPLICATION_HOLE),
            )
            return None
        if found is not None and found.held:
            proven = ", ".join(f"{o} below {t}" for o, t in sorted(found.proven.items()))
            log.info(
                "replication to %s: no usable cursor, but %s is proven to hold %d of the "
                "records journaled here (of origin txids %s): resuming after txid %d, "
                "without those",
                self.name,
                welcome.name,
                found.held,
                proven,
                found.after,
                extra=events.extra(events.REPLICATION_CONNECTED),
            )
        return found

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


def scanned(journal: Journal, wanted: list[Scan], through: int) -> dict[str, Fingerprint]:
    """The fingerprints of the records :func:`.exchange.scans` asks for, read from
    ``journal`` up to ``through`` (blocking: call it on a worker thread). A damaged
    record on the way leaves them all out: those origins are then compared at their
    cuts only."""
    if not wanted:
        return {}
    origins = {s.origin for s in wanted}
    found: list[tuple[str, int, bytes]] = []
    after = min(s.after for s in wanted)
    while after < through:
        batch, damage = journal.read_route_views(after, SEND_BATCH, through)
        if damage is not None:
            return {}
        if not batch:
            break
        for view in batch:
            if view.origin in origins:
                found.append((view.origin, view.origin_txid, _bookmark_key(view.bookmark)))
        after = batch[-1].txid
    return partial_fingerprints(wanted, found)


def _bookmark_key(bookmark: str) -> bytes:
    """The journal's bookmark index key (publisher hash, seq) of ``pub|seq|``."""
    pub, seq, _ = bookmark.split("|", 2)
    return _BOOKMARK_KEY.pack(int(pub), int(seq))


def _record_payload(record: Record) -> bytes:
    """A just-committed record's payload, for a content filter (:meth:`Route.select`)."""
    return record.payload
