"""A trio client for amps-py (and the AMPS wire protocol).

Use it through :func:`open_client`, which connects, logs on and owns the reader task::

    async with open_client("tcp://127.0.0.1:9007/amps/json", "my-app") as client:
        seq = await client.publish("orders", b'{"id": 1}')
        await client.wait_persisted(seq)
        async with client.subscribe("orders", filter="/id > 0") as sub:
            async for message in sub:
                ...

State of the World: :meth:`Client.sow` returns a topic's current records,
:meth:`Client.sow_and_subscribe` yields them (``message.snapshot`` is true) and then the
live stream (publishes, and ``oof`` messages when a record leaves the subscription),
:meth:`Client.sow_delete` deletes records and returns the server's counts, and
:meth:`Client.delta_publish` publishes a delta the server merges into the record::

        records = await client.sow("orders", "/qty > 10", orderby="/qty DESC", top_n=5)
        async with client.sow_and_subscribe("orders", options="oof") as sub:
            async for message in sub:
                if message.snapshot: ...      # the records at subscribe time
                elif message.command == "oof": ...  # message.key left (message.reason)
                else: ...                     # a live publish

Queues: a subscription to a queue's name leases messages (``max_backlog`` at a time);
acknowledge each, by hand (``await message.ack()``, batched by ``ack_batch_size``) or
with ``auto_ack=True`` (each message when the loop moves past it; not the one whose
handling raised, which is delivered again)::

    async with open_client(uri, "worker", ack_batch_size=10) as client:
        async with client.subscribe("work", max_backlog=10, auto_ack=True) as sub:
            async for message in sub:
                handle(message.json())

A ``tcps://`` URI connects with TLS (1.2 or later), verifying the server's certificate
against the system's CAs, or against ``ca_file`` (a PEM file; for a self-signed server,
its certificate), for the URI's host or ``server_hostname``::

    async with open_client("tcps://amps.example.com:9443/amps/json", "my-app",
                           ca_file="ca.pem") as client:
        ...

Resource handling: leaving the ``async with`` block closes the connection and ends every
subscription iterator. Error handling: a failure ack raises :class:`CommandError` with
the server's ``reason``; a lost connection raises :class:`ConnectionLost` in every
waiter.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import ssl
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

import trio

from amps_py import net
from amps_py.protocol import Frame, FrameDecoder, FrameTooLarge, ProtocolError, encode_frame
from amps_py.protocol import SowRecord as SowRecord
from amps_py.protocol.compression import CompressionError, Deflater, Inflater
from amps_py.protocol.messages import NOT_JOURNALED
from amps_py.redact import redact_uris
from amps_py.trio_util import unwrapping_groups

from . import queue as _queue
from . import sow as _sow
from .queue import DEFAULT_ACK_BATCH_SIZE, DEFAULT_ACK_TIMEOUT, QueueSubscription
from .sow import MAX_BATCH_SIZE as MAX_BATCH_SIZE
from .sow import STATS_FIELDS as STATS_FIELDS
from .sow import SowResult as SowResult
from .sow import SowSubscription as SowSubscription
from .sow import _SowQuery, _stats_of
from .subscription import AMPSError as AMPSError
from .subscription import CommandError as CommandError
from .subscription import ConnectionLost as ConnectionLost
from .subscription import Message as Message
from .subscription import Subscription as Subscription
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


#: the length prefix an HTTP response's first bytes (``HTTP/``) make
_HTTP_LENGTH = int.from_bytes(b"HTTP", "big")
#: the ``reason`` of the ProtocolError for an HTTP answer
NOT_AN_AMPS_PORT = "not an AMPS port"


def _http_answer(exc: FrameTooLarge) -> ProtocolError | None:
    """What to say when a "frame length" is the start of an HTTP response: the URI
    names an HTTP port (the admin API, most likely), not a client transport."""
    if exc.size != _HTTP_LENGTH:
        return None
    return ProtocolError(
        "the server answered in HTTP, not the AMPS protocol: this is an HTTP port (the "
        "admin API?); use the instance's client transport port (its Transport InetAddr; "
        "`amps-py serve` listens on 127.0.0.1:9007 by default)",
        reason=NOT_AN_AMPS_PORT,
    )


class Client:
    """A logged-on connection. Create it with :func:`open_client`."""

    def __init__(self, name: str, stream: trio.abc.Stream) -> None:
        self.name = name
        self._stream = stream
        self._decoder = FrameDecoder(max_frame_size=256 * 1024 * 1024)
        self._cids = itertools.count(1)
        # cid -> (event, acks so far, how many acks / which ack types end the wait)
        self._waiting: dict[str, tuple[trio.Event, list[dict[str, Any]], int | frozenset[str]]] = {}
        self._subs: dict[str, Subscription] = {}
        self._queries: dict[str, _SowQuery] = {}
        self._send_lock = trio.Lock()
        self._persisted_changed = trio.Event()
        self.seq = 0
        self.persisted_seq = 0
        #: publishes the server reported as not stored: seq -> the failure ack
        self.failed_publishes: dict[int, dict[str, Any]] = {}
        #: the newest seq whose persisted ack said ``reason: not journaled``: a publish
        #: to a topic the instance does not journal (acknowledged, not stored)
        self.not_journaled_seq = 0
        self.logon_ack: dict[str, Any] = {}
        self.closed: BaseException | None = None
        #: a failure ack the server sent about the connection itself (no cid, sub_id
        #: or s), e.g. reason ``slow client`` just before it closed the connection
        self.server_notice: dict[str, Any] | None = None
        self.heartbeats = 0
        #: trio.current_time() when bytes last arrived from the server (or the client
        #: was made): a server-silence watchdog re-arms from it
        self.received_at = trio.current_time()
        self._nursery: trio.Nursery | None = None
        #: queue acknowledgements: bookmarks per ``sow_delete`` (1: each sent at once)
        self.ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE
        #: seconds a partial batch of acknowledgements waits before it is sent
        self.ack_timeout: float = DEFAULT_ACK_TIMEOUT
        self._acks = _queue.AckState()

    # ---------------------------------------------------------------- plumbing
    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self.closed is not None:
            raise ConnectionLost(f"connection is closed: {self.closed}")
        async with self._send_lock:
            await self._stream.send_all(encode_frame(header, payload))

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (tests use this to send malformed frames)."""
        async with self._send_lock:
            await self._stream.send_all(data)

    def _next_cid(self) -> str:
        return str(next(self._cids))

    async def command(
        self,
        header: dict[str, Any],
        payload: bytes = b"",
        *,
        wait: int | Collection[str] = 1,
        timeout: float = 30,
    ) -> list[dict[str, Any]]:
        """Send a command with a fresh ``cid`` and wait for ``wait`` acks for it (a
        number of acks, or the ack types that must all have come). A failure ack ends
        the wait at once.

        Raises:
            CommandError: an ack has status failure.
            TimeoutError: the acks did not arrive within ``timeout`` seconds.
        """
        cid = header.setdefault("cid", self._next_cid())
        event = trio.Event()
        acks: list[dict[str, Any]] = []
        want: int | frozenset[str] = wait if isinstance(wait, int) else frozenset(wait)
        self._waiting[cid] = (event, acks, want)
        try:
            await self._send(header, payload)
            with trio.move_on_after(timeout) as scope:
                await event.wait()
            if scope.cancelled_caught:
                raise TimeoutError(f"no ack for {header['c']} within {timeout:g} s")
        finally:
            self._waiting.pop(cid, None)
        for ack in acks:
            if ack.get("status") == "failure":
                raise CommandError(header["c"], ack)
        if self.closed is not None and not _acks_complete(acks, want):
            raise ConnectionLost(
                f"connection closed while waiting for {header['c']}: {self.closed}"
            )
        return acks

    async def _reader(self) -> None:
        stream = self._stream
        decoder = self._decoder
        try:
            while True:
                data = await stream.receive_some(256 * 1024)
                self.received_at = trio.current_time()
                if not data:
                    notice = self.server_notice
                    why = f": {notice.get('reason')} ({notice.get('detail')})" if notice else ""
                    raise ConnectionLost(f"server closed the connection{why}")
                decoder.receive_data(data)
                for frame in decoder.frames():
                    self._dispatch(frame)
        except FrameTooLarge as exc:
            self._shutdown(_http_answer(exc) or exc)
        except (
            ConnectionLost,
            ProtocolError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
        ) as exc:
            self._shutdown(exc)

    def _shutdown(self, exc: BaseException) -> None:
        if self.closed is None:
            self.closed = exc
        for event, _, _ in self._waiting.values():
            event.set()
        for sub in self._subs.values():
            sub._send.close()
        self._persisted_changed.set()
        self._acks.wake()

    def _dispatch(self, frame: Frame) -> None:
        header = frame.header
        command = header["c"]
        if command == "publish" or command == "oof":
            sid = header.get("sub_id", "")
            sids = header.get("sids")
            targets = sids.split(",") if sids else [sid]
            for target in targets:
                sub = self._subs.get(target)
                if sub is not None:
                    sub._put(Message(header, frame.payload, sub))
            return
        if command == "sow":
            self._on_sow_batch(frame)
        elif command == "group_begin" or command == "group_end":
            self._on_group(header)
        elif command == "ack":
            self._on_ack(header)
        elif command == "heartbeat":
            self.heartbeats += 1
            if self._nursery is not None and self.closed is None:
                self._nursery.start_soon(self._beat)

    def _sow_target(self, header: dict[str, Any]) -> _SowQuery | SowSubscription | None:
        """Who gets a query's frames: a running :meth:`sow` (by ``query_id``) or a
        ``sow_and_subscribe`` (by ``sub_id``, else ``query_id``)."""
        query_id = str(header.get("query_id", ""))
        query = self._queries.get(query_id)
        if query is not None:
            return query
        sub = self._subs.get(str(header.get("sub_id") or query_id))
        return sub if isinstance(sub, SowSubscription) else None

    def _on_sow_batch(self, frame: Frame) -> None:
        target = self._sow_target(frame.header)
        if target is not None:  # None: a query given up on (timeout); late results drop
            _sow.deliver_batch(target, frame)

    def _on_group(self, header: dict[str, Any]) -> None:
        target = self._sow_target(header)
        if target is not None and header["c"] == "group_end":
            _sow.end_snapshot(target)

    async def _beat(self) -> None:
        with contextlib.suppress(AMPSError, trio.BrokenResourceError, trio.ClosedResourceError):
            await self._send({"c": "heartbeat", "o": "beat"})

    def _on_ack(self, header: dict[str, Any]) -> None:
        cid = header.get("cid")
        ack_type = header.get("a")
        sub_id = header.get("sub_id")
        if sub_id is None and header.get("query_id") in self._subs:
            sub_id = header["query_id"]  # a sow_and_subscribe ack naming the query only
        if sub_id is not None and sub_id in self._subs:
            sub = self._subs[sub_id]
            if ack_type == "stats" and isinstance(sub, SowSubscription):
                sub.stats = _stats_of(header)
            elif ack_type == "processed" and sub.max_backlog is None:
                sub.max_backlog = _queue.backlog_of(header)
            if ack_type == "completed":
                sub.completed_bookmark = header.get("bm", "")
                if sub.replayed is None:
                    sub.replayed = sub.delivered
                sub.completed.set()
                sub._mark({"c": "ack", "a": "completed", "bm": sub.completed_bookmark})
            elif ack_type == "persisted" and cid is None:
                sub.persisted_bookmark = header.get("bm", "")
            if header.get("status") == "failure":
                sub.failure = header
                sub._send.close()
        if cid is not None:
            if str(cid) in self._acks.outstanding:
                self._acks.answered(header)
                return
            waiting = self._waiting.get(str(cid))
            if waiting is not None:
                event, acks, want = waiting
                acks.append(header)
                if _acks_complete(acks, want) or header.get("status") == "failure":
                    event.set()
            return
        if sub_id is None and "s" not in header and header.get("status") == "failure":
            self.server_notice = header  # about the connection, not one command
            return
        if ack_type == "persisted" and "s" in header and sub_id is None:
            seq = int(header["s"])
            if header.get("status") != "success":
                self.failed_publishes[seq] = header
            elif seq > self.persisted_seq:
                self.persisted_seq = seq
                if header.get("reason") == NOT_JOURNALED:
                    self.not_journaled_seq = seq
            else:
                return
            event = self._persisted_changed
            self._persisted_changed = trio.Event()
            event.set()

    # ---------------------------------------------------------------- API
    async def logon(self, *, timeout: float = 10, **fields: Any) -> dict[str, Any]:
        """Log on as ``self.name``; returns the logon ack (``s`` = last persisted seq)."""
        header = {"c": "logon", "client_name": self.name, "a": "processed", "v": "amps-py-client"}
        header.update(fields)
        try:
            (ack,) = await self.command(header, timeout=timeout)
        except ConnectionLost as exc:
            closed = self.closed
            if isinstance(closed, ProtocolError) and closed.reason == NOT_AN_AMPS_PORT:
                raise  # it says what the port is; a TLS hint would mislead
            raise ConnectionLost(
                f"{exc}; the server closed the connection without answering the logon: "
                "if its transport is tcps, connect with a tcps:// URI (and its CA file)"
            ) from None
        self.logon_ack = ack
        self.seq = max(self.seq, int(ack.get("s", 0) or 0))
        self.persisted_seq = max(self.persisted_seq, self.seq)
        return ack

    async def publish(
        self,
        topic: str,
        data: bytes | str,
        *,
        seq: int | None = None,
        ack: bool = True,
        sow_key: str | None = None,
    ) -> int:
        """Publish one message; returns its seq. With ``ack`` the server sends
        conflated persisted acks; use :meth:`wait_persisted` to wait for durability.
        ``sow_key`` is the explicit SOW key (``k``) for a SOW topic configured without
        ``Key`` paths."""
        return await self._publish("p", topic, data, seq, ack, sow_key)

    async def delta_publish(
        self,
        topic: str,
        data: bytes | str,
        *,
        seq: int | None = None,
        ack: bool = True,
        sow_key: str | None = None,
    ) -> int:
        """Publish a delta: on a SOW topic the server merges the fields of ``data``
        into the stored record with the same key (fields given replace, others stay;
        no record: stored as it is) and delivers the merged message; elsewhere it is a
        plain publish. Sequence numbers and persisted acks as for :meth:`publish`
        (:meth:`wait_persisted` waits for it)."""
        return await self._publish("delta_publish", topic, data, seq, ack, sow_key)

    async def _publish(
        self,
        command: str,
        topic: str,
        data: bytes | str,
        seq: int | None,
        ack: bool,
        sow_key: str | None,
    ) -> int:
        payload = data.encode() if isinstance(data, str) else data
        if seq is None:
            self.seq += 1
            seq = self.seq
        else:
            self.seq = max(self.seq, seq)
        self.failed_publishes.pop(seq, None)  # sent again: its new fate counts
        header: dict[str, Any] = {"c": command, "t": topic, "s": seq}
        if ack:
            header["a"] = "persisted"
        if sow_key is not None:
            header["k"] = sow_key
        await self._send(header, payload)
        return seq

    async def publish_persisted(self, topic: str, data: bytes | str, *, timeout: float = 30) -> int:
        """Publish and wait until the server reports the message durable."""
        seq = await self.publish(topic, data)
        await self.wait_persisted(seq, timeout=timeout)
        return seq

    async def wait_persisted(self, seq: int, *, timeout: float = 30) -> None:
        """Wait for a persisted ack covering ``seq``.

        Raises:
            CommandError: the server reported that ``seq`` was not stored (a failure
                ack, e.g. reason ``journal write failed`` when its disk is full).
            TimeoutError: with the last persisted seq, when it does not come in time.
            ConnectionLost: the connection closed first.
        """
        if self.persisted_seq >= seq:
            return  # covered already: no cancel scope (a pipelining publisher's common case)
        with trio.move_on_after(timeout):
            while self.persisted_seq < seq:
                if seq in self.failed_publishes:
                    raise CommandError("publish", self.failed_publishes[seq])
                if self.closed is not None:
                    raise ConnectionLost(f"connection closed before seq {seq} was persisted")
                await self._persisted_changed.wait()
            return
        raise TimeoutError(
            f"no persisted ack for seq {seq} within {timeout:g} s "
            f"(last persisted {self.persisted_seq})"
        )

    @asynccontextmanager
    async def subscribe(
        self,
        topic: str,
        *,
        filter: str | None = None,
        bookmark: str | None = None,
        options: str | None = None,
        sub_id: str | None = None,
        acks: str = "processed,completed",
        buffer: float = math.inf,
        timeout: float = 30,
        max_backlog: int | None = None,
        auto_ack: bool = False,
        markers: bool = False,
    ) -> AsyncIterator[Subscription]:
        """Subscribe (a bookmark subscription when ``bookmark`` is given).

        The context manager waits for the server's processed ack, so a bad filter or
        topic raises :class:`CommandError` here; leaving it sends the acknowledgements
        still batched (:meth:`ack`), then unsubscribes.

        Queues: a subscription to a queue's name (without ``bookmark``) is a queue
        subscription. The server leases it up to ``max_backlog`` unacknowledged
        messages at a time (sent as option ``max_backlog=N``; the server's default is
        1 and the queue's MaxPerSubscriptionBacklog caps it); ``sub.max_backlog`` is
        the backlog in force, as the server's subscribe ack reported it. Acknowledge
        each message with ``await message.ack()`` (or :meth:`ack`), or pass
        ``auto_ack=True``: then the message the iterator yielded last is acknowledged
        when the loop asks for the next one (the next turn of ``async for``, or
        ``sub.get()``), or when this ``async with`` block exits without an
        exception (e.g. after a ``break``). If the block exits with an exception
        (including a cancellation), that message is NOT acknowledged: it returns to
        the queue when its lease expires or the subscription ends (this unsubscribe,
        or a disconnect) and is delivered again, to this or another consumer. A
        message acknowledged by hand (``message.ack()``) is not acknowledged again.

        ``markers``: the iterator also yields the ``completed`` ack in its place among
        the messages (see :class:`Subscription`).

        Raises:
            CommandError: the server refused the subscription.
            AMPSError: ``auto_ack=True`` on a topic that is not a queue (the subscribe
                ack reported no ``max_backlog``).
            ValueError: ``max_backlog`` is less than 1.
        """
        sid = sub_id or f"s{next(self._cids)}"
        sub = (
            QueueSubscription(self, sid, buffer, markers)
            if auto_ack
            else Subscription(self, sid, buffer, markers)
        )
        header: dict[str, Any] = {"c": "subscribe", "t": topic, "sub_id": sid, "a": acks}
        if filter:
            header["f"] = filter
        if bookmark is not None:
            header["bm"] = bookmark
        if max_backlog is not None:
            if max_backlog < 1:
                raise ValueError(f"max_backlog must be 1 or more, got {max_backlog}")
            backlog = f"max_backlog={max_backlog}"
            options = f"{options},{backlog}" if options else backlog
        if options:
            header["o"] = options
        async with self._subscribed(sub, header, timeout):
            if auto_ack and sub.max_backlog is None:
                raise AMPSError(
                    f"auto_ack=True needs a queue: {topic!r} is not a queue on this server "
                    "(its subscribe ack reported no max_backlog); subscribe without "
                    "auto_ack, or to the queue's name"
                )
            async with _queue.consuming(self, sub):
                yield sub

    @asynccontextmanager
    async def _subscribed(
        self, sub: Subscription, header: dict[str, Any], timeout: float
    ) -> AsyncIterator[None]:
        """Register ``sub``, send ``header`` and wait for its first ack; on exit
        unsubscribe."""
        sid = sub.sub_id
        self._subs[sid] = sub
        try:
            await self.command(header, wait=1, timeout=timeout)
        except BaseException:
            self._subs.pop(sid, None)
            raise
        try:
            yield
        finally:
            self._subs.pop(sid, None)
            if self.closed is None:
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(5),
                    contextlib.suppress(
                        AMPSError, trio.BrokenResourceError, trio.ClosedResourceError
                    ),
                ):
                    await self._send({"c": "unsubscribe", "sub_id": sid})

    def bookmark_subscribe(self, topic: str, bookmark: str = "0", **kwargs: Any) -> Any:
        """Shorthand for ``subscribe(topic, bookmark=...)`` (EPOCH by default)."""
        return self.subscribe(topic, bookmark=bookmark, **kwargs)

    # ---------------------------------------------------------------- SOW
    # The SOW API lives in amps_py.client.sow as functions taking the client first;
    # bound here as methods, so ``client.sow(...)`` has their signatures and docs.
    sow = _sow.sow
    sow_and_subscribe = _sow.sow_and_subscribe
    sow_delete = _sow.sow_delete
    _stop_query = _sow.stop_query
    _query_header = staticmethod(_sow.query_header)

    # ---------------------------------------------------------------- queues
    # Acknowledging queue messages lives in amps_py.client.queue, bound the same way.
    ack = _queue.ack
    flush_acks = _queue.flush_acks

    async def unsubscribe(self, sub_id: str) -> None:
        await self.command({"c": "unsubscribe", "sub_id": sub_id, "a": "processed"})
        sub = self._subs.pop(sub_id, None)
        if sub is not None:
            sub._send.close()

    async def flush(self, *, timeout: float = 30) -> None:
        """Wait until the server has persisted every publish sent so far."""
        await self.command({"c": "flush", "a": "persisted"}, timeout=timeout)

    async def heartbeat(self, interval: float) -> None:
        """Ask the server to heartbeat every ``interval`` seconds (and expect ours)."""
        await self.command({"c": "heartbeat", "o": f"start,{interval:g}", "a": "processed"})

    async def aclose(self) -> None:
        """Close the connection. Acknowledgements still batched are sent first and
        their answers awaited briefly (best effort: a refusal or a timeout is not
        raised; call :meth:`flush_acks` before to know)."""
        await _queue.flush_on_close(self)
        self._shutdown(ConnectionLost("client closed"))
        await self._stream.aclose()


def _acks_complete(acks: list[dict[str, Any]], want: int | frozenset[str]) -> bool:
    """Whether ``acks`` end a wait for ``want`` (a count, or ack types that must all
    have come)."""
    if isinstance(want, int):
        return len(acks) >= want
    return want <= {str(ack.get("a")) for ack in acks}


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
    try:
        with trio.fail_after(timeout):
            stream = await net.open_tcp_stream(target.host, target.port)
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
                fields = dict(logon_fields)
                # the message type of the connection, from the URI's /amps/<type>
                fields.setdefault("mt", target.message_type)
                if target.user:
                    fields.setdefault("user_id", target.user)
                if target.password:
                    fields.setdefault("pw", target.password)
                await client.logon(timeout=timeout, **fields)
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
