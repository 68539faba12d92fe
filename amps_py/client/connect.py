"""Opening a trio client connection: :func:`open_client` connects (TCP, TLS for a
``tcps://`` URI, zlib for ``compression=zlib``), logs on and runs the reader task of
a :class:`~amps_py.client.client.Client` for as long as its block runs.

Connecting: a refused or unanswered connect raises :class:`OSError` naming the address
and the likely fix; a TLS handshake that fails says why (certificate, protocol).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from amps_py import net
from amps_py.protocol.compression import CompressionError, Deflater, Inflater
from amps_py.redact import redact_uris
from amps_py.trio_util import unwrapping_groups

from . import queue as _queue
from .client import Client
from .queue import DEFAULT_ACK_BATCH_SIZE, DEFAULT_ACK_TIMEOUT
from .subscription import ConnectionLost
from .uri import BadURI, ServerURI, parse_uri

#: Oldest TLS version a ``tcps://`` connection accepts (TLS 1.0/1.1 are deprecated).
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


def _refused(exc: BaseException) -> bool:
    """Whether the connect failed because nothing listens there (trio's "all attempts
    failed" holds the attempts' errors in its cause)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    attempts = getattr(exc.__cause__, "exceptions", ())
    return bool(attempts) and all(isinstance(a, ConnectionRefusedError) for a in attempts)


def _client_tls_context(ca_file: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """A TLS client context trusting ``ca_file`` (PEM), or the system's CAs."""
    try:
        context = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file else None)
    except FileNotFoundError as exc:
        raise OSError(
            f"CA file {os.fspath(ca_file or '')!r} does not exist; give the PEM file of the "
            "CA that issued the server's certificate (or the server's certificate itself "
            "if it is self-signed)"
        ) from exc
    except ssl.SSLError as exc:
        raise OSError(
            f"CA file {os.fspath(ca_file or '')!r} holds no PEM certificate "
            f"({exc.reason or exc}); give a PEM file starting with -----BEGIN CERTIFICATE-----"
        ) from exc
    except OSError as exc:
        raise OSError(
            f"cannot read CA file {os.fspath(ca_file or '')!r}: {exc.strerror or exc}"
        ) from exc
    context.minimum_version = MIN_TLS_VERSION
    return context


async def _start_tls(
    stream: trio.SocketStream,
    target: ServerURI,
    ca_file: str | os.PathLike[str] | None,
    server_hostname: str | None,
    timeout: float,
) -> trio.SSLStream[trio.SocketStream]:
    """Wrap ``stream`` in TLS and complete the handshake (raises OSError with a fix)."""
    address = f"{target.host}:{target.port}"
    hostname = server_hostname or target.host
    secured = trio.SSLStream(stream, _client_tls_context(ca_file), server_hostname=hostname)
    try:
        with trio.fail_after(timeout):
            await secured.do_handshake()
    except trio.TooSlowError as exc:
        raise OSError(
            f"no TLS handshake with {address} within {timeout:g} s; is it a tcps transport?"
        ) from exc
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            trusted = f"CA file {os.fspath(ca_file)!r}" if ca_file else "the system's CAs"
            raise OSError(
                f"TLS handshake with {address} failed: the server's certificate does not "
                f"verify against {trusted} for {hostname!r} "
                f"({cause.verify_message or cause.reason}); pass the CA that issued it "
                "(--ca-file / ca_file=, or the certificate itself if self-signed), or "
                "server_hostname= with a name the certificate holds"
            ) from exc
        why = cause.reason if isinstance(cause, ssl.SSLError) else "connection closed"
        raise OSError(
            f"TLS handshake with {address} failed ({why}); is it a tcps transport? "
            "Use tcp:// for a plain tcp transport"
        ) from exc
    return secured


class ZlibStream(trio.abc.Stream):
    """A stream whose bytes travel zlib-compressed both ways (the URI option
    ``compression=zlib``); see :mod:`amps_py.protocol.compression`."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self._inner = inner
        self._deflater = Deflater()
        self._inflater = Inflater()
        self._ready: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(self._deflater.compress(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._ready:
            data = await self._inner.receive_some(max_bytes)
            if not data:
                return b""
            try:
                self._ready.extend(self._inflater.feed(data))
            except CompressionError as exc:
                raise trio.BrokenResourceError(str(exc)) from None
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _checked_target(
    uri: str,
    ca_file: str | os.PathLike[str] | None,
    server_hostname: str | None,
    ack_batch_size: int,
    ack_timeout: float,
) -> ServerURI:
    """The server ``uri`` names, once the arguments of :func:`open_client` are checked
    (raises BadURI or ValueError)."""
    if ack_batch_size < 1:
        raise ValueError(f"ack_batch_size must be 1 or more, got {ack_batch_size}")
    if ack_timeout <= 0:
        raise ValueError(f"ack_timeout must be more than 0 seconds, got {ack_timeout:g}")
    target = parse_uri(uri)
    if not target.secure and (ca_file is not None or server_hostname is not None):
        raise BadURI(
            f"{redact_uris(uri)!r}: ca_file and server_hostname apply to TLS connections only; "
            f"use a tcps:// URI, e.g. tcps://{target.host}:{target.port}/amps/json"
        )
    return target


async def _open_tcp(target: ServerURI, timeout: float) -> trio.SocketStream:
    """Connect to ``target`` (raises OSError naming the address, the cause and the
    fix)."""
    try:
        with trio.fail_after(timeout):
            return await net.open_tcp_stream(target.host, target.port)
    except OSError as exc:
        why = f"{exc.strerror or exc}"
        if _refused(exc):
            why = (
                f"connection refused: nothing listens on port {target.port}. Is the "
                "instance running, and does a client Transport of its config name that "
                "port in InetAddr? (`amps-py serve` listens on 127.0.0.1:9007 by default)"
            )
        raise OSError(f"cannot connect to {target.host}:{target.port}: {why}") from exc
    except trio.TooSlowError:
        raise OSError(
            f"cannot connect to {target.host}:{target.port}: no answer within {timeout:g} s"
        ) from None


def _logon_fields(target: ServerURI, given: dict[str, Any]) -> dict[str, Any]:
    """The logon fields: ``given``, then the message type of the connection (from the
    URI's /amps/<type>) and the URI's credentials unless given."""
    fields = dict(given)
    fields.setdefault("mt", target.message_type)
    if target.user:
        fields.setdefault("user_id", target.user)
    if target.password:
        fields.setdefault("pw", target.password)
    return fields


@asynccontextmanager
async def open_client(
    uri: str,
    name: str,
    *,
    logon: bool = True,
    timeout: float = 10,
    ca_file: str | os.PathLike[str] | None = None,
    server_hostname: str | None = None,
    ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE,
    ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    **logon_fields: Any,
) -> AsyncIterator[Client]:
    """Connect to ``uri`` (and log on as ``name``); close on exit.

    Args:
        uri: ``tcp://host:port/amps/json``, or ``tcps://...`` for TLS.
        name: the client name.
        logon: send a logon command first (the default).
        timeout: seconds allowed for connecting, the TLS handshake and the logon.
        ca_file: ``tcps`` only: PEM file of the CAs the server's certificate must chain
            to (the server's own certificate if it is self-signed); default: the
            system's CAs.
        server_hostname: ``tcps`` only: the name the server's certificate must be
            issued for; default: the URI's host.
        ack_batch_size: queue acknowledgements sent in one ``sow_delete`` (default 1:
            each at once); see :meth:`Client.ack`.
        ack_timeout: seconds a partial batch of acknowledgements waits before it is
            sent (default 1.0).
        logon_fields: further logon header fields.

    Resource handling: leaving the block sends the acknowledgements still batched and
    waits briefly for their answers (best effort: call :meth:`Client.flush_acks` first
    to learn of a refusal), then closes the connection.

    Raises:
        BadURI: the URI is malformed, or ``ca_file``/``server_hostname`` are given for a
            ``tcp://`` URI.
        OSError: the server cannot be reached, or the TLS handshake fails (the message
            names the address, the cause and the fix).
    """
    target = _checked_target(uri, ca_file, server_hostname, ack_batch_size, ack_timeout)
    stream = await _open_tcp(target, timeout)
    connection: trio.abc.Stream = stream
    if target.secure:
        try:
            connection = await _start_tls(stream, target, ca_file, server_hostname, timeout)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    if target.compression == "zlib":
        connection = ZlibStream(connection)
    client = Client(name, connection)
    client.ack_batch_size = ack_batch_size
    client.ack_timeout = ack_timeout
    try:
        async with unwrapping_groups(), trio.open_nursery() as nursery:
            client._nursery = nursery
            nursery.start_soon(client._reader)
            if logon:
                await client.logon(timeout=timeout, **_logon_fields(target, logon_fields))
            try:
                yield client
            except BaseException:
                await _queue.send_pending(client)  # processed ones: no answer awaited
                raise
            await _queue.flush_on_close(client)
            nursery.cancel_scope.cancel()
    finally:
        client._shutdown(ConnectionLost("client closed"))
        with trio.CancelScope(shield=True):
            if connection is not stream:
                with trio.move_on_after(1):  # close_notify must not hang the close
                    await connection.aclose()
            await stream.aclose()
