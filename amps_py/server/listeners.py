"""The instance's listeners: open each Transport, complete the TLS handshake of its
connections, hand them on, and stop or start a client transport on request.

Client connections go to ``serve_client(stream, transport, peer)``; connections to
the replication transport go to the replication manager. A listener that cannot open
stops the instance with a message naming the transport, the address and the fix.

Each listener runs its own accept loop (:func:`serve_accepting`, not
``trio.serve_listeners``, which logs a traceback for every accept that fails): when
the process runs out of file descriptors, accepts fail with EMFILE until connections
close; the loop keeps trying every :data:`ACCEPT_RETRY` seconds and says so in one
line at once, then at most every :data:`ACCEPT_REPORT_INTERVAL` seconds with the count
of failed accepts and the fix (:class:`AcceptFailures` decides when), and once more
when it accepts again. Clients that connect meanwhile wait in the listen queue.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from amps_py import events, net
from amps_py.config import ServerTls, TransportConfig

from .connection_cap import ConnectionCap
from .startup import ConfigurationError, listen_failure, os_error_in

if TYPE_CHECKING:
    from amps_py.admin.host import AdminHost
    from amps_py.replication import ReplicationManager

log = logging.getLogger("amps_py.server")

#: How long a client of a tcps / amps-replication-secure transport has to complete the
#: TLS handshake; a connection that stalls longer is closed (it holds a socket).
TLS_HANDSHAKE_TIMEOUT: Final = 10.0

#: OpenSSL reasons of a failed server-side handshake, in words an operator can act on.
_TLS_FAILURES: Final[dict[str, str]] = {
    "WRONG_VERSION_NUMBER": "the client does not speak TLS (a plain TCP client?)",
    "HTTP_REQUEST": "the client sent a plain HTTP request",
    "UNEXPECTED_EOF_WHILE_READING": "the client closed the connection during the handshake "
    "(it may not trust this transport's certificate, or it only checked the port)",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the CA that issued this certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client rejected this transport's certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the client rejected this transport's certificate",
    "NO_SHARED_CIPHER": "the client offers none of the ciphers this transport allows",
    "UNSUPPORTED_PROTOCOL": "the client offers only TLS versions older than 1.2",
}

ServeClient = Callable[[trio.abc.Stream, str, str], Awaitable[None]]

#: accept errors that mean "no resources now, try again later": no file descriptor left
#: in the process (EMFILE) or the system (ENFILE), no kernel memory for a socket
ACCEPT_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: seconds between attempts while accepts fail for lack of resources
ACCEPT_RETRY: Final = 0.1
#: at most one log line per listener this often while its accepts keep failing
ACCEPT_REPORT_INTERVAL: Final = 10.0


class AcceptFailures:
    """When a listener whose accepts fail for lack of resources says so (pure; the time
    is passed in): the first failure at once, then at most one line per ``interval``
    seconds carrying the failures since the line before; and once when an accept
    succeeds again, with the whole episode's failures and length.
    """

    def __init__(self, interval: float = ACCEPT_REPORT_INTERVAL) -> None:
        self.interval = interval
        #: failures not yet reported
        self.unreported = 0
        #: failures since the episode began (0: accepts are working)
        self.in_episode = 0
        self._episode_start = 0.0
        self._last_report = 0.0

    def failed(self, now: float) -> int | None:
        """An accept failed at ``now``; returns the count to report now (the failures
        since the last report, this one included), or None to stay quiet."""
        if not self.in_episode:
            self._episode_start = now
        self.in_episode += 1
        self.unreported += 1
        if self.in_episode > 1 and now - self._last_report < self.interval:
            return None
        count, self.unreported, self._last_report = self.unreported, 0, now
        return count

    def accepted(self, now: float) -> tuple[int, float] | None:
        """An accept succeeded at ``now``: (failures, seconds) of the episode that it
        ends, or None when accepts were working."""
        if not self.in_episode:
            return None
        ended = (self.in_episode, now - self._episode_start)
        self.in_episode = self.unreported = 0
        return ended


def accept_failure(what: str, code: int, count: int, interval: float) -> str:
    """One line: ``what`` (``transport json-tcp``) cannot accept connections because
    of ``code`` (an errno of :data:`ACCEPT_RESOURCE_ERRNOS`), ``count`` accepts failed
    since the last such line, and the fix."""
    name = errno.errorcode.get(code, str(code))
    head = (
        f"{what} cannot accept connections: accept failed with {name} "
        f"({os.strerror(code).lower()}); {count} failed accept(s) "
        f"{'so far' if count == 1 else 'since the last report'} (retried every "
        f"{ACCEPT_RETRY:g} s, reported at most every {interval:g} s; new clients wait in "
        "the listen queue)"
    )
    if code == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"{head}. This process has open as many files and sockets as its limit allows "
            f"(RLIMIT_NOFILE soft {soft}, hard {hard}). Fix: raise the limit for amps-py: "
            "`ulimit -n 65536` in the shell that starts it, or LimitNOFILE=65536 in its "
            "systemd unit"
        )
    if code == errno.ENFILE:
        return (
            f"{head}. The system's limit of open files (fs.file-max) is reached. Fix: raise "
            "it (`sysctl -w fs.file-max=...`), or stop what holds so many files"
        )
    return f"{head}. The kernel is short of memory for sockets. Fix: free memory on this host"


async def serve_accepting(
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    listeners: list[trio.SocketListener],
    handler_nursery: trio.Nursery,
    what: str,
    cap: ConnectionCap | None = None,
) -> None:
    """Accept connections on every listener and run ``handler`` on each in
    ``handler_nursery`` (the stream is closed when the handler returns), until
    cancelled. Accepts that fail for lack of resources are retried every
    :data:`ACCEPT_RETRY` seconds and reported as :class:`AcceptFailures` decides,
    without a traceback; any other accept error ends the listener. With a ``cap``, a
    connection accepted while the transport has its MaxConnections open is closed at
    once (reported as the cap decides), and each handled one counts until it closes.
    """
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, handler, listener, handler_nursery, what, cap)


async def _accept_loop(
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    listener: trio.SocketListener,
    handler_nursery: trio.Nursery,
    what: str,
    cap: ConnectionCap | None = None,
) -> None:
    failures = AcceptFailures()
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_RESOURCE_ERRNOS:
                    raise
                count = failures.failed(trio.current_time())
                if count is not None:
                    log.error(
                        accept_failure(what, exc.errno, count, failures.interval),
                        extra=events.extra(events.TRANSPORT_ACCEPT_FAILED),
                    )
                await trio.sleep(ACCEPT_RETRY)
                continue
            ended = failures.accepted(trio.current_time())
            if ended is not None:
                log.warning(
                    "%s accepts connections again, after %d failed accept(s) over %.1f s",
                    what,
                    ended[0],
                    ended[1],
                    extra=events.extra(events.TRANSPORT_ACCEPTING_AGAIN),
                )
            if cap is not None and not cap.admit():
                line = cap.report(trio.current_time(), peer_of(stream))
                if line is not None:
                    log.warning(line, extra=events.extra(events.TRANSPORT_CONNECTION_LIMIT))
                await trio.aclose_forcefully(stream)
                continue
            handler_nursery.start_soon(_run_handler, handler, stream, cap)


async def _run_handler(
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    stream: trio.SocketStream,
    cap: ConnectionCap | None = None,
) -> None:
    try:
        await handler(stream)
    finally:
        try:
            await trio.aclose_forcefully(stream)
        finally:
            if cap is not None:
                cap.release()


class ListenError(ConfigurationError):
    """A listener cannot open; the message names the transport, address and fix."""


class Listeners:
    """Opens and runs the transports.

    Args:
        transports: the instance's Transport configs.
        serve_client: runs one client connection (stream, transport name, peer).
        setting: how a startup error names a setting (the embedded default has flags,
            not a config file): ``setting(name, flag) -> text``.
        close_clients: closes the connections of a transport; returns how many.
    """

    def __init__(
        self,
        transports: tuple[TransportConfig, ...],
        serve_client: ServeClient,
        setting: Callable[[str, str], str],
        close_clients: Callable[[str, str], int],
    ) -> None:
        self._transports = transports
        self._serve_client = serve_client
        self._setting = setting
        self._close_clients = close_clients
        self.replication: ReplicationManager | None = None
        #: name -> the bound (host, port) of every open listener (the admin's too)
        self.bound: dict[str, tuple[str, int]] = {}
        #: name -> the open connections of each transport against its MaxConnections
        self.caps: dict[str, ConnectionCap] = {t.name: ConnectionCap(t) for t in transports}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        """Open every enabled transport in ``nursery`` (started once listening)."""
        self._nursery = nursery
        for transport in self._transports:
            if transport.enabled:
                await nursery.start(self._serve_transport, transport, nursery)

    def disable(self, name: str) -> str:
        """Stop listening on client transport ``name`` and disconnect its clients."""
        transport = self._client_transport(name)
        scope = self._scopes.pop(transport.name, None)
        if scope is None:
            return "already disabled"
        scope.cancel()
        self.bound.pop(transport.name, None)
        closed = self._close_clients(
            transport.name, f"transport {transport.name} disabled by the administrator"
        )
        log.warning(
            "transport %s disabled: no longer listening, %d client(s) disconnected",
            transport.name,
            closed,
            extra=events.extra(events.TRANSPORT_STOPPED),
        )
        return f"disabled; {closed} client(s) disconnected"

    async def enable(self, name: str) -> str:
        """Listen on client transport ``name`` again (or for the first time, when its
        InitialState was disabled)."""
        transport = self._client_transport(name)
        if transport.name in self._scopes:
            return "already enabled"
        if self._nursery is None:
            raise ListenError("the instance is not running")
        await self._nursery.start(self._serve_transport, transport, self._nursery)
        return "enabled"

    async def start_admin(
        self,
        nursery: trio.Nursery,
        instance: AdminHost,
        host: str,
        port: int,
        tls: ServerTls | None = None,
    ) -> None:
        """Serve the admin interface on ``host:port`` (HTTPS with ``tls``, the Admin
        element's Certificate and PrivateKey; else HTTP); it shows as ``admin`` in
        :attr:`bound`. A port that cannot be bound, or TLS files that no longer load,
        stop the instance, saying why."""
        from amps_py.admin.http import serve_admin

        try:
            context = tls.ssl_context() if tls is not None else None
        except (OSError, ValueError) as exc:
            assert tls is not None
            raise cannot_listen(
                f"the admin interface: cannot load Admin Certificate {tls.certificate} with "
                f"PrivateKey {tls.private_key}: {exc}; `amps-py config check` names the "
                "file at fault"
            ) from exc
        try:
            bound = await nursery.start(serve_admin, instance, host, port, context)
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
        self.bound["admin"] = (host, bound)

    def connection_statistics(self) -> dict[str, dict[str, int]]:
        """Per transport: connections open, its MaxConnections, the most open at once,
        and how many were closed at once for the limit (``limits.connections``)."""
        return {name: cap.statistics() for name, cap in self.caps.items()}

    def _client_transport(self, name: str) -> TransportConfig:
        for transport in self._transports:
            if transport.name == name and not transport.is_replication:
                return transport
        known = ", ".join(t.name for t in self._transports if not t.is_replication)
        raise KeyError(f"no client transport {name!r}; client transports: {known or 'none'}")

    async def _serve_transport(
        self,
        transport: TransportConfig,
        nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # Built once per transport: every accepted connection shares it. The loader has
        # already checked that the files load, so this fails only if they changed since.
        try:
            tls_context = transport.ssl_context()
        except (OSError, ValueError) as exc:
            raise ListenError(
                f"transport {transport.name}: cannot load Certificate {transport.certificate} "
                f"with PrivateKey {transport.private_key}: {exc}; `amps-py config check` "
                "names the file at fault"
            ) from exc
        host = None if transport.host in ("", "0.0.0.0") else transport.host
        try:
            listeners = await net.open_tcp_listeners(transport.port, host=host)
        except OSError as exc:
            raise cannot_listen(
                listen_failure(
                    f"transport {transport.name} ({transport.type})",
                    transport.host,
                    transport.port,
                    exc,
                    self._setting(f"the InetAddr of Transport {transport.name}", "--port"),
                )
            ) from exc
        with trio.CancelScope() as scope:
            self._scopes[transport.name] = scope
            try:
                await self._listen(transport, listeners, tls_context, nursery, task_status)
            finally:
                for listener in listeners:
                    await trio.aclose_forcefully(listener)

    async def _listen(
        self,
        transport: TransportConfig,
        listeners: list[trio.SocketListener],
        tls_context: ssl.SSLContext | None,
        nursery: trio.Nursery,
        task_status: trio.TaskStatus[None],
    ) -> None:
        sockname = listeners[0].socket.getsockname()
        self.bound[transport.name] = (sockname[0], sockname[1])
        log.info(
            "transport %s (%s/%s) listening on %s:%d%s",
            transport.name,
            transport.type,
            transport.protocol,
            sockname[0],
            sockname[1],
            f" (TLS, certificate {transport.certificate})" if tls_context is not None else "",
            extra=events.extra(events.TRANSPORT_LISTENING),
        )
        task_status.started()

        what = f"transport {transport.name}"
        cap = self.caps[transport.name]
        if transport.is_replication:
            replication = self.replication
            assert replication is not None
            if tls_context is None:
                await serve_accepting(replication.serve_incoming, listeners, nursery, what, cap)
                return

            async def handle_upstream(stream: trio.SocketStream) -> None:
                peer = peer_of(stream)
                secured = await tls_handshake(stream, tls_context, transport, peer)
                if secured is not None:
                    await replication.serve_connection(secured, peer)

            await serve_accepting(handle_upstream, listeners, nursery, what, cap)
            return

        async def handle(stream: trio.SocketStream) -> None:
            peer = peer_of(stream)
            client: trio.abc.Stream = stream
            if tls_context is not None:
                secured = await tls_handshake(stream, tls_context, transport, peer)
                if secured is None:
                    return
                client = secured
            await self._serve_client(client, transport.name, peer)

        await serve_accepting(handle, listeners, nursery, what, cap)


def cannot_listen(why: str) -> ListenError:
    """Log that a listener could not open (the instance stops); the error to raise."""
    log.critical("instance not started: %s", why, extra=events.extra(events.INSTANCE_FAILED))
    return ListenError(why)


def peer_of(stream: trio.SocketStream) -> str:
    """``host:port`` of the remote end, or ``?`` when the socket is already gone."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


async def tls_handshake(
    stream: trio.SocketStream,
    context: ssl.SSLContext,
    transport: TransportConfig,
    peer: str,
) -> trio.SSLStream[trio.SocketStream] | None:
    """Wrap an accepted connection in TLS and complete the handshake.

    Error handling: a failed or stalled handshake (a plain-TCP client, a client that
    rejects the certificate, a scanner) is logged with the client's address and closes
    only this connection; returns ``None`` then.
    """
    secured = trio.SSLStream(stream, context, server_side=True)
    try:
        with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
            await secured.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
        log.warning(
            "TLS handshake with %s on transport %s (%s) failed: %s; closing the connection "
            "(%s this transport's certificate %s)",
            peer,
            transport.name,
            transport.type,
            _handshake_failure(exc),
            _handshake_hint(transport),
            transport.certificate,
            extra=events.extra(events.TRANSPORT_TLS_HANDSHAKE_FAILED),
        )
        await trio.aclose_forcefully(stream)
        return None
    return secured


def _handshake_failure(exc: BaseException) -> str:
    cause = exc.__cause__
    if isinstance(exc, trio.TooSlowError):
        return f"no handshake within {TLS_HANDSHAKE_TIMEOUT:g} s"
    if isinstance(cause, ssl.SSLError) and cause.reason:
        return f"{_TLS_FAILURES.get(cause.reason, 'refused')} ({cause.reason})"
    return str(cause or exc) or "the client closed the connection"


def _handshake_hint(transport: TransportConfig) -> str:
    if transport.is_replication:
        return (
            "upstream instances must connect with a Destination Transport of Type "
            "amps-replication-secure whose Certificate holds the CA of"
        )
    return "clients must connect with TLS (a tcps:// URI) and trust the CA of"
