"""Outgoing replication: one task per Destination pushes this instance's journal.

Connects to the destination's ``InetAddr`` list in priority order, resyncs from the
cursor the downstream reports, then streams journal records as they commit and
processes acks. Between rounds of attempts it waits as :class:`.ReconnectBackoff`
decides (quick retries after losing a connection that was up, then the configured
``ReconnectTimeout`` back-off); a wait ends early when the peer connects to this
instance (:meth:`Destination.peer_connected`), since then it is up again.

A ``secure`` destination (Transport Type ``amps-replication-secure``) wraps each TCP
connection in TLS and completes the TLS handshake before the link's hello: the peer's
certificate must chain to the destination's CA file (``Certificate``), or to the
system's CAs when none is given, and be issued for ``ServerName`` (default: the
InetAddr host). A certificate that does not verify ends the attempt with a
:class:`LinkError` whose reason is ``tls``.

A destination with a Transport ``Authenticator`` sends its user and password in the
hello (read at each connect: PasswordFile and PasswordEnv may change between
attempts). They travel in the clear unless the destination is ``secure``; they are
never logged.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio

from amps_py import events, reasons
from amps_py.config import (
    MIN_TLS_VERSION,
    DestinationConfig,
    LinkCredentialsError,
)
from amps_py.trio_util import unwrapping_groups
from amps_py.units import utc_iso

from .ackmode import AckMode, Downgraded, Observed, Upgraded, seconds_behind
from .backoff import ReconnectBackoff
from .incoming import UpstreamConnection
from .link import Ack, LinkError, Refused, UpstreamLink, Welcome
from .mux import RoleStream, SharedConnection
from .outage import OutageLog, OutageReport
from .routing import Route

if TYPE_CHECKING:
    from txlog import Record

    from .host import ReplicationHost

log = logging.getLogger("amps_py.replication.outgoing")

#: records read from the journal per data frame
SEND_BATCH: Final = 8192
#: stop sending while this many records are sent but not acknowledged
MAX_UNACKED_RECORDS: Final = 200_000
CONNECT_TIMEOUT: Final = 5.0
HANDSHAKE_TIMEOUT: Final = 10.0
#: what a broken link raises, possibly in several of its tasks at once
CONNECTION_FAILURES: Final = (
    LinkError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
    trio.TooSlowError,
)
#: reason of the LinkError raised when the TLS handshake of a secure destination fails
TLS_FAILURE_REASON: Final = reasons.TLS
#: link errors in the handshake the peer is told about before the connection closes
_TOLD_REASONS: Final = frozenset(
    {reasons.MALFORMED_WELCOME, reasons.NOT_A_REPLICATION_PEER, reasons.PROTOCOL_VIOLATION}
)


class RefusedByPeer(LinkError):
    """The peer answered the handshake with a refusal (validation, credentials, ...);
    ``str()`` is ``<what>: <reason> (<the peer's detail>)``."""

    def __init__(self, reason: str, detail: str, what: str) -> None:
        super().__init__(reason, detail)
        self.args = (f"{what}: {reason} ({detail})",)


@dataclass(frozen=True)
class DestinationStatistics:
    name: str
    remote_name: str
    group: str | None
    replication_type: str
    configured_sync_type: str
    is_connected: bool
    address: str
    messages_out: int
    bytes_out: int
    raw_bytes_out: int
    sent_txid: int
    acked_txid: int
    seconds_behind: float
    disconnect_count: int
    resyncs: int
    resync_records: int
    holes: int
    pass_through: tuple[str, ...]
    last_error: str
    downgrades: int = 0
    upgrades: int = 0
    upgrade_pending: bool = False
    #: the reconnect back-off wait in progress (seconds); 0 while connected or dialling
    reconnect_wait: float = 0.0
    #: while the destination is down (its connection lost, or its attempts failing):
    #: since when (UTC, ISO 8601), for how long (seconds), and how many attempts to
    #: connect failed since; "", 0 and 0 while it is connected or has not tried yet
    down_since: str = ""
    down_s: float = 0.0
    failed_attempts: int = 0
    # AMPS's monitoring names (AMPS-NOTES 7.7)
    client_name: str = ""
    client_type: str = "destination"
    authenticated_id: str = ""
    destination_name: str = ""
    destination_group_name: str = ""
    connect_time: str = ""
    disconnect_time: str = ""
    messages_out_per_sec: float = 0.0
    bytes_out_per_sec: float = 0.0


class Destination:
    """Runtime state of one configured destination."""

    def __init__(self, instance: ReplicationHost, config: DestinationConfig) -> None:
        self.instance = instance
        self.config = config
        self.name = config.name
        self.route = Route(config)
        #: sync, downgraded or upgrade pending; the resync of the current connection
        self.ack_mode = AckMode(config.sync)
        self.remote_name = ""
        self.connected = False
        self.address = ""
        self.remote_group = ""
        self.authenticated_id = ""
        self.connect_time = 0.0
        self.disconnect_time = 0.0
        self._rates = _Rates()
        self.sent_txid = 0
        self.acked_txid = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.raw_bytes_out = 0
        self.disconnect_count = 0
        self.resyncs = 0
        self.resync_records = 0
        self.holes = 0
        self.last_error = ""
        self._ack_event = trio.Event()
        self._sending_upto = 0
        self._send_lock = trio.Lock()
        self._tls_context: ssl.SSLContext | None = None
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

    def _client_tls_context(self) -> ssl.SSLContext:
        """The client-side TLS context (built once): CA from ``ca_file`` or the system."""
        if self._tls_context is None:
            ca_file = self.config.ca_file
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            context.minimum_version = MIN_TLS_VERSION
            self._tls_context = context
        return self._tls_context

    async def _secure(
        self, stream: trio.SocketStream, host: str, address: str
    ) -> trio.SSLStream[trio.SocketStream]:
        """Wrap ``stream`` in TLS and complete the handshake.

        Raises:
            LinkError: reason ``tls``: the certificate does not verify, or the peer does
                not speak TLS; the detail names the cause and the fix.
        """
        cfg = self.config
        server_name = cfg.server_name or host
        try:
            context = self._client_tls_context()
        except OSError as exc:  # the CA file changed since the config was checked
            raise LinkError(
                TLS_FAILURE_REASON,
                f"cannot load the CA file {cfg.ca_file}: {exc}; correct the file or "
                f"Destination/Transport/Certificate of destination {cfg.name}",
            ) from exc
        secured = trio.SSLStream(stream, context, server_hostname=server_name)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                await secured.do_handshake()
        except trio.BrokenResourceError as exc:
            raise LinkError(
                TLS_FAILURE_REASON, _tls_failure_detail(cfg, address, server_name, exc.__cause__)
            ) from exc
        except trio.TooSlowError as exc:
            raise LinkError(
                TLS_FAILURE_REASON,
                f"no TLS handshake with {address} within {HANDSHAKE_TIMEOUT:g} s; check that "
                "it is the remote instance's amps-replication-secure transport",
            ) from exc
        return secured

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
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            why = _connect_failure(exc)
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
                link_stream = await self._secure(stream, host, address)
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
        log.log(
            level,
            "%s",
            self._outage_line(address, report),
            extra=events.extra(code if report.new_error else events.REPLICATION_UNREACHABLE),
        )

    def _outage_line(self, address: str, report: OutageReport) -> str:
        """The log line of one :class:`OutageReport`."""
        acks = "; persisted acks wait for it (sync destination)" if self.sync else ""
        if report.first:
            return (
                f"replication to {self.name} ({address}) failed: {report.error}{acks}; "
                "retrying on the ReconnectTimeout back-off, and logging again at growing "
                "intervals while it fails"
            )
        since = utc_iso(self._outage.down_since or 0.0)
        head = f"replication to {self.name} still down since {since} ({_duration(report.down_for)})"
        counts = (
            f"{report.attempts} failed attempt{'s' if report.attempts != 1 else ''} since the "
            f"last report, {report.total_attempts} in all"
        )
        if report.new_error:
            return f"{head}, {counts}; now failing with: {report.error}{acks}"
        return f"{head}, {counts}; last error: {report.error}{acks}"

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
                topics=self.route.describe_topics(),
                now=now(),
                expected_group=cfg.group or "",
                credentials=credentials,
                back=back,
            )
        )
        try:
            welcome = await self._await_welcome(stream, link)
        except LinkError as exc:
            if exc.reason in _TOLD_REASONS:  # tell the peer why (it may be misconfigured)
                with trio.move_on_after(1):
                    await stream.send_all(link.refuse(exc.reason, exc.detail, now()))
            raise
        if cfg.group is not None and welcome.group != cfg.group:
            detail = (
                f"destination {cfg.name} expects Group {cfg.group!r} but instance "
                f"{welcome.name!r} is in Group {welcome.group!r}; fix Destination/Group in "
                f"{instance.name}'s config or the peer's Group"
            )
            await stream.send_all(link.refuse(reasons.GROUP_MISMATCH, detail, now()))
            raise LinkError(reasons.GROUP_MISMATCH, detail)
        if welcome.name == instance.name:
            detail = "the destination is this instance itself; fix Destination/Transport/InetAddr"
            await stream.send_all(link.refuse(reasons.REPLICATES_TO_ITSELF, detail, now()))
            raise LinkError(reasons.REPLICATES_TO_ITSELF, detail)
        # the welcome passed every check: full-size frames (the peer's stream back) from now
        stream.handshake_done()
        self.remote_name = welcome.name
        self.remote_group = welcome.group
        self.authenticated_id = credentials[0] if credentials else ""
        start = await self._resync_point(welcome)
        self.sent_txid = self.acked_txid = self._sending_upto = start
        self.connected = True
        self.connect_time = time.time()
        self._backoff.connected(now())
        recovery = self._outage.recovered(self.connect_time)
        if recovery is not None:
            log.info(
                "replication to %s (%s) is up again after %s down (%d failed attempt%s)",
                cfg.name,
                self.address,
                _duration(recovery.down_for),
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

    async def _await_welcome(self, stream: RoleStream, link: UpstreamLink) -> Welcome:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            while True:
                frames = await stream.receive_frames()
                if not frames:
                    raise LinkError(
                        reasons.CLOSED, "the peer closed the connection during the handshake"
                    )
                for event in link.receive_frames(frames, trio.current_time()):
                    if isinstance(event, Welcome):
                        return event
                    if isinstance(event, Refused):
                        # logged by the caller, as a failed attempt (not every time)
                        what = (
                            "the peer refused validation (its log names each check)"
                            if event.reason == reasons.VALIDATION_FAILED
                            else "refused by the peer"
                        )
                        raise RefusedByPeer(event.reason, event.detail, what)

    async def _resync_point(self, welcome: Welcome) -> int:
        """The txid after which to resend: the downstream's cursor if this journal
        still has that record with that bookmark, else 0 (resend everything)."""
        if welcome.cursor_txid <= 0:
            return 0
        journal = self.instance.journal
        assert journal is not None
        if welcome.cursor_txid <= journal.removed_through:
            # its position lies in journals removed here (removal waited for its ack):
            # nothing to check it against, and nothing older to send anyway
            log.info(
                "replication to %s: the peer holds my stream up to txid %d, in journals "
                "removed here; sending from the oldest record kept (after txid %d)",
                self.name,
                welcome.cursor_txid,
                journal.removed_through,
                extra=events.extra(events.REPLICATION_CONNECTED),
            )
            return journal.removed_through
        rec = journal.get(welcome.cursor_txid) if welcome.cursor_txid <= journal.last_txid else None
        if rec is None or rec.bookmark != welcome.cursor_bm:
            log.warning(
                "replication to %s: the peer holds my stream up to txid %d (%s), which this "
                "journal does not have; resending from the start of the journal",
                self.name,
                welcome.cursor_txid,
                welcome.cursor_bm,
                extra=events.extra(events.REPLICATION_RESYNC_FULL),
            )
            return 0
        return welcome.cursor_txid

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
                await instance.wait_for_commit(self.sent_txid)
                continue
            while self.sent_txid - self.acked_txid > MAX_UNACKED_RECORDS:
                self._ack_event = trio.Event()
                await self._ack_event.wait()
            fresh = recent.after(self.sent_txid, SEND_BATCH, committed)
            if fresh is not None:
                # just committed: the records and their stored bytes are in memory
                records, values = fresh
                selected = select(records, values, remote, _record_payload)
                last = records[-1]
                upto, upto_bm = last.txid, last.bookmark
                frame = link.data(selected, upto, upto_bm, trio.current_time(), self.sent_txid)
                await self._sent(stream, frame, selected, upto, resync_end, link)
                continue
            # further behind: routing views decode only what routing needs; the stored
            # bytes go out as they are, and a payload is decoded only for a content filter
            batch, damage = journal.read_route_views(self.sent_txid, SEND_BATCH, committed)
            selected = select(batch, [view.raw for view in batch], remote, journal.route_payload)
            if damage is not None:
                # a damaged record cannot be sent; say so loudly, never skip quietly
                self.holes += 1
                log.error(
                    "replication hole: destination %s cannot receive txid %s: %s",
                    self.name,
                    damage.txid,
                    damage,
                    extra=events.extra(events.REPLICATION_HOLE),
                )
                upto = damage.txid if damage.txid is not None else self.sent_txid + 1
                upto_bm = batch[-1].bookmark if batch else ""
            elif batch:
                upto = batch[-1].txid
                upto_bm = batch[-1].bookmark
            else:
                await instance.wait_for_commit(self.sent_txid)
                continue
            frame = link.data(selected, upto, upto_bm, trio.current_time(), self.sent_txid)
            await self._sent(stream, frame, selected, upto, resync_end, link)

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
        self.sent_txid = upto
        self.messages_out += len(selected)
        self.bytes_out = link.bytes_out
        self.raw_bytes_out = link.raw_bytes_out

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
                        self._ack_event.set()
                        upgraded = self.ack_mode.acked(self.acked_txid)
                        if upgraded is not None:
                            self._mode_changed(upgraded)
                        self._check_resync_complete()
                        self.instance.replication_acked()
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
        """Whether persisted acks wait for this destination now (see :class:`AckMode`)."""
        return self.ack_mode.sync

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
        rec = instance.journal.get(self.acked_txid + 1)
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
            seconds_behind=self.seconds_behind(),
            disconnect_count=self.disconnect_count,
            resyncs=self.resyncs,
            resync_records=self.resync_records,
            holes=self.holes,
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


def _connect_failure(exc: OSError | trio.TooSlowError) -> str:
    """Why a TCP connect failed, in the OS's words (``Connection refused``): trio's
    ``all attempts to connect ... failed`` carries the reasons as its cause."""
    if isinstance(exc, trio.TooSlowError):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    reasons: list[str] = []
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, OSError) and current.strerror:
            # the errno's own words; getaddrinfo's negative codes have only strerror
            code = current.errno
            reason = os.strerror(code) if code and code > 0 else current.strerror
            if reason not in reasons:
                reasons.append(reason)
        elif current.__cause__ is not None:
            pending.append(current.__cause__)
    return "; ".join(reasons) if reasons else str(exc)


def _duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``3h10m``: how long an outage lasted, for a log line."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Rates:
    """Per-second rates of two counters, over at least the last second between reads
    (statistics are read by the admin API, the stats file and metrics scrapes)."""

    def __init__(self) -> None:
        self._at = 0.0
        self._counts = (0, 0)
        self._rates = (0.0, 0.0)

    def update(self, now: float, messages: int, nbytes: int) -> tuple[float, float]:
        elapsed = now - self._at
        if self._at and elapsed >= 1.0:
            self._rates = (
                round((messages - self._counts[0]) / elapsed, 1),
                round((nbytes - self._counts[1]) / elapsed, 1),
            )
        if not self._at or elapsed >= 1.0:
            self._at, self._counts = now, (messages, nbytes)
        return self._rates


def _tls_failure_detail(
    cfg: DestinationConfig, address: str, server_name: str, cause: BaseException | None
) -> str:
    """Why the TLS handshake with a destination failed, and how to fix it."""
    where = f"the TLS handshake with {address} (destination {cfg.name}) failed"
    trusted = (
        f"the CA certificates in {cfg.ca_file}"
        if cfg.ca_file is not None
        else "the system's default CAs"
    )
    if isinstance(cause, ssl.SSLCertVerificationError):
        message = cause.verify_message or cause.reason or str(cause)
        if "hostname" in message.lower() or "ip address mismatch" in message.lower():
            return (
                f"{where}: the peer's certificate is not issued for {server_name!r} "
                f"({message}); set Destination/Transport/ServerName to a name the certificate "
                "holds, or reissue the certificate for this name"
            )
        if cfg.ca_file is None:
            fix = (
                "set Destination/Transport/Certificate to the PEM file of the CA that "
                "issued the peer's certificate (or to the peer's certificate itself if it "
                "is self-signed)"
            )
        else:
            fix = (
                f"put the CA that issued the peer's certificate into {cfg.ca_file} (or the "
                "peer's certificate itself if it is self-signed), or correct the peer's "
                "Certificate"
            )
        return (
            f"{where}: the peer's certificate does not verify against {trusted} ({message}); {fix}"
        )
    if isinstance(cause, ssl.SSLError):
        return (
            f"{where}: {cause.reason or cause}; check that {address} is the remote "
            "instance's amps-replication-secure transport (a plain amps-replication "
            "transport does not speak TLS)"
        )
    return (
        f"{where}: the peer closed the connection during the handshake; check that "
        f"{address} is an amps-replication-secure transport and the peer's log for why "
        "it refused"
    )
