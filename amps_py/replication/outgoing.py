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
shape :mod:`.destination_stats`'. The stream over a connection, once there is one, and
the destination's state are :class:`.destination_stream.DestinationStream`'s; this
module adds how a destination gets its connections.

Without a usable cursor (the peer never received this instance's stream directly, or
lost its position), the hello's holdings and the welcome's answer decide where the
resync starts and which records the peer is proven to hold (:mod:`.exchange`,
:mod:`.resync_reading`): those are not sent (``resync_skipped`` in the statistics). A
peer that does not answer (an older amps-py, a journal without holdings) is resent
everything, as before.

A destination with a Transport ``Authenticator`` sends its user and password in the
hello (read at each connect: PasswordFile and PasswordEnv may change between
attempts). They travel in the clear unless the destination is ``secure``; they are
never logged.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import trio

from amps_py import events, net
from amps_py.config import DestinationConfig
from amps_py.trio_util import unwrapping_groups

from .destination_stream import CONNECTION_FAILURES, DestinationStream
from .dialing import CONNECT_TIMEOUT, LinkTls, connect_failure
from .handshake import RefusedByPeer
from .incoming import UpstreamConnection, UpstreamHost
from .link import LinkError
from .mux import SharedConnection
from .outage import outage_line

log = logging.getLogger("amps_py.replication.outgoing")

#: seconds a destination that has not connected since the instance started may fail
#: to connect before it is logged as a warning (at info before: instances started
#: together dial each other before every one listens, and a loaded machine starts six
#: instances in more than the outage log's first repeat, 10 s)
START_GRACE: Final = 30.0


class Destination(DestinationStream):
    """One configured destination: its stream (:class:`DestinationStream`) over the
    connections it dials, or over the peer's connection (back replication)."""

    instance: UpstreamHost

    def __init__(self, instance: UpstreamHost, config: DestinationConfig) -> None:
        super().__init__(instance, config)
        self._tls = LinkTls(config)
        # back replication: the peer's connection this destination streams over
        self._attached: SharedConnection | None = None
        self._attached_scope: trio.CancelScope | None = None
        self._dial_scope: trio.CancelScope | None = None
        self._attach_wanted = trio.Event()

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
