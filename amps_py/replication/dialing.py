"""Opening a connection to a destination: TLS for a ``secure`` destination, and why a
connection could not be made, in words that say how to fix it.

A ``secure`` destination (Transport Type ``amps-replication-secure``) wraps each TCP
connection in TLS and completes the TLS handshake before the link's hello
(:class:`LinkTls`): the peer's certificate must chain to the destination's CA file
(``Certificate``), or to the system's CAs when none is given, and be issued for
``ServerName`` (default: the InetAddr host). A certificate that does not verify ends
the attempt with a :class:`~.link.LinkError` whose reason is ``tls``.
"""

from __future__ import annotations

import os
import ssl
from typing import Final

import trio

from amps_py import reasons
from amps_py.config import MIN_TLS_VERSION, DestinationConfig

from .link import LinkError

__all__ = [
    "CONNECT_TIMEOUT",
    "HANDSHAKE_TIMEOUT",
    "TLS_FAILURE_REASON",
    "LinkTls",
    "connect_failure",
    "tls_failure_detail",
]

CONNECT_TIMEOUT: Final = 5.0
HANDSHAKE_TIMEOUT: Final = 10.0
#: reason of the LinkError raised when the TLS handshake of a secure destination fails
TLS_FAILURE_REASON: Final = reasons.TLS


class LinkTls:
    """The client side of TLS for one destination's connections."""

    def __init__(self, config: DestinationConfig) -> None:
        self.config = config
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        """The client-side TLS context (built once): CA from ``ca_file`` or the system."""
        if self._context is None:
            ca_file = self.config.ca_file
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            context.minimum_version = MIN_TLS_VERSION
            self._context = context
        return self._context

    async def wrap(
        self, stream: trio.SocketStream, host: str, address: str
    ) -> trio.SSLStream[trio.SocketStream]:
        """Wrap ``stream`` (to ``host``, at ``address``) in TLS and complete the handshake.

        Raises:
            LinkError: reason ``tls``: the certificate does not verify, or the peer does
                not speak TLS; the detail names the cause and the fix.
        """
        cfg = self.config
        server_name = cfg.server_name or host
        try:
            context = self.context()
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
                TLS_FAILURE_REASON, tls_failure_detail(cfg, address, server_name, exc.__cause__)
            ) from exc
        except trio.TooSlowError as exc:
            raise LinkError(
                TLS_FAILURE_REASON,
                f"no TLS handshake with {address} within {HANDSHAKE_TIMEOUT:g} s; check that "
                "it is the remote instance's amps-replication-secure transport",
            ) from exc
        return secured


def connect_failure(exc: OSError | trio.TooSlowError) -> str:
    """Why a TCP connect failed, in the OS's words (``Connection refused``): trio's
    ``all attempts to connect ... failed`` carries the reasons as its cause."""
    if isinstance(exc, trio.TooSlowError):
        return f"no connection within {CONNECT_TIMEOUT:g} s"
    found: list[str] = []
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, OSError) and current.strerror:
            # the errno's own words; getaddrinfo's negative codes have only strerror
            code = current.errno
            reason = os.strerror(code) if code and code > 0 else current.strerror
            if reason not in found:
                found.append(reason)
        elif current.__cause__ is not None:
            pending.append(current.__cause__)
    return "; ".join(found) if found else str(exc)


def tls_failure_detail(
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
