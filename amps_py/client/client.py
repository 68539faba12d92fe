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
import math
from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio

from amps_py.protocol import Frame, FrameTooLarge, ProtocolError, encode_frame
from amps_py.protocol import SowRecord as SowRecord
from amps_py.protocol import client_connection as proto
from amps_py.protocol.client_connection import ClientConnection

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

#: the length prefix an HTTP response's first bytes (``HTTP/``) make
_HTTP_LENGTH = int.from_bytes(b"HTTP", "big")
#: the ``reason`` of the ProtocolError for an HTTP answer
NOT_AN_AMPS_PORT = "not an AMPS port"
#: errors of a best-effort send (a beat, an unsubscribe) that are not raised
_SEND_ERRORS = (AMPSError, trio.BrokenResourceError, trio.ClosedResourceError)


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
    """A logged-on connection. Create it with :func:`~amps_py.client.open_client`.

    The protocol rules (command ids and their acks, logon, publish sequence numbers,
    persisted acks, heartbeat answers, routing) are the :class:`ClientConnection`'s
    (:attr:`connection`); this class owns the stream, the reader task and the waiting.
    """

    def __init__(self, name: str, stream: trio.abc.Stream) -> None:
        self.name = name
        self._stream = stream
        #: the protocol state of this connection (sans-IO)
        self.connection = ClientConnection(name, now=trio.current_time())
        # cid -> (event set when its wait ends, the CommandDone once it came)
        self._waiting: dict[str, tuple[trio.Event, list[proto.CommandDone]]] = {}
        self._subs: dict[str, Subscription] = {}
        self._queries: dict[str, _SowQuery] = {}
        self._send_lock = trio.Lock()
        self._persisted_changed = trio.Event()
        self.closed: BaseException | None = None
        self._nursery: trio.Nursery | None = None
        #: queue acknowledgements: bookmarks per ``sow_delete`` (1: each sent at once)
        self.ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE
        #: seconds a partial batch of acknowledgements waits before it is sent
        self.ack_timeout: float = DEFAULT_ACK_TIMEOUT
        self._acks = _queue.AckState()

    # ---------------------------------------------------------------- protocol state
    @property
    def seq(self) -> int:
        """The highest publish seq sent (or the server's logon ``s``); a caller that
        writes a publish frame by hand (:meth:`send_raw`) may move it on."""
        return self.connection.seq

    @seq.setter
    def seq(self, seq: int) -> None:
        self.connection.seq = seq

    @property
    def persisted_seq(self) -> int:
        """Every publish up to this seq is persisted."""
        return self.connection.persisted_seq

    @property
    def failed_publishes(self) -> dict[int, dict[str, Any]]:
        """Publishes the server reported as not stored: seq -> the failure ack."""
        return self.connection.failed_publishes

    @property
    def not_journaled_seq(self) -> int:
        """The newest seq whose persisted ack said ``reason: not journaled``: a publish
        to a topic the instance does not journal (acknowledged, not stored)."""
        return self.connection.not_journaled_seq

    @property
    def logon_ack(self) -> dict[str, Any]:
        return self.connection.logon_ack

    @property
    def server_notice(self) -> dict[str, Any] | None:
        """A failure ack the server sent about the connection itself (no cid, sub_id
        or s), e.g. reason ``slow client`` just before it closed the connection."""
        return self.connection.server_notice

    @property
    def heartbeats(self) -> int:
        return self.connection.heartbeats

    @property
    def received_at(self) -> float:
        """trio.current_time() when bytes last arrived from the server (or the client
        was made)."""
        return self.connection.received_at

    def next_id(self) -> int:
        """A number not used before on this connection (for sub and query ids)."""
        return self.connection.next_id()

    # ---------------------------------------------------------------- plumbing
    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        await self._send_bytes(encode_frame(header, payload))

    async def _send_bytes(self, data: bytes) -> None:
        if self.closed is not None:
            raise ConnectionLost(f"connection is closed: {self.closed}")
        async with self._send_lock:
            await self._stream.send_all(data)

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (tests use this to send malformed frames)."""
        async with self._send_lock:
            await self._stream.send_all(data)

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
        cid, data = self.connection.command(header, payload, want=wait)
        return await self._await_command(header["c"], cid, data, timeout)

    async def _await_command(
        self, command: str, cid: str, data: bytes, timeout: float
    ) -> list[dict[str, Any]]:
        """Send ``data`` (the command ``cid``) and wait for the end of its wait."""
        event = trio.Event()
        done: list[proto.CommandDone] = []
        self._waiting[cid] = (event, done)
        try:
            await self._send_bytes(data)
            with trio.move_on_after(timeout) as scope:
                await event.wait()
            if scope.cancelled_caught:
                raise TimeoutError(f"no ack for {command} within {timeout:g} s")
        finally:
            self._waiting.pop(cid, None)
            self.connection.abandon(cid)
        (result,) = done
        failure = result.failure
        if failure is not None:
            raise CommandError(command, failure)
        if not result.complete:
            raise ConnectionLost(f"connection closed while waiting for {command}: {self.closed}")
        return result.acks

    async def _reader(self) -> None:
        stream = self._stream
        try:
            while True:
                data = await stream.receive_some(256 * 1024)
                self._handle(self.connection.receive_data(data, trio.current_time()))
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
        self._handle(self.connection.close())
        for sub in self._subs.values():
            sub._send.close()
        self._persisted_changed.set()
        self._acks.wake()

    def _handle(self, events: Iterable[proto.Event]) -> None:
        """Act on what the connection reported (from the reader task)."""
        for event in events:
            if isinstance(event, proto.Delivery):
                self._deliver(event)
            elif isinstance(event, proto.QueryFrame):
                self._on_query_frame(event.frame)
            elif isinstance(event, proto.SubscriptionAck):
                sub = self._subs.get(event.sub_id)
                if sub is not None:
                    self._on_subscription_ack(sub, event.ack)
            elif isinstance(event, proto.CommandDone):
                self._command_done(event)
            elif isinstance(event, proto.TrackedAck):
                self._acks.answered(event.ack)
            elif isinstance(event, (proto.Persisted, proto.PublishFailed)):
                changed, self._persisted_changed = self._persisted_changed, trio.Event()
                changed.set()
            elif isinstance(event, proto.HeartbeatReceived):
                if self._nursery is not None and self.closed is None:
                    self._nursery.start_soon(self._beat, event.reply)
            elif isinstance(event, proto.ServerClosed):
                raise ConnectionLost(event.message)

    def _command_done(self, event: proto.CommandDone) -> None:
        waiting = self._waiting.get(event.cid)
        if waiting is not None:
            waiting[1].append(event)
            waiting[0].set()

    def _deliver(self, event: proto.Delivery) -> None:
        frame = event.frame
        for target in event.sub_ids:
            sub = self._subs.get(target)
            if sub is not None:
                sub._put(Message(frame.header, frame.payload, sub))

    def _sow_target(self, header: dict[str, Any]) -> _SowQuery | SowSubscription | None:
        """Who gets a query's frames: a running :meth:`sow` (by ``query_id``) or a
        ``sow_and_subscribe`` (by ``sub_id``, else ``query_id``)."""
        query_id = str(header.get("query_id", ""))
        query = self._queries.get(query_id)
        if query is not None:
            return query
        sub = self._subs.get(str(header.get("sub_id") or query_id))
        return sub if isinstance(sub, SowSubscription) else None

    def _on_query_frame(self, frame: Frame) -> None:
        target = self._sow_target(frame.header)
        if target is None:  # a query given up on (timeout); late results drop
            return
        if frame.command == "sow":
            _sow.deliver_batch(target, frame)
        elif frame.command == "group_end":
            _sow.end_snapshot(target)

    async def _beat(self, reply: bytes) -> None:
        with contextlib.suppress(*_SEND_ERRORS):
            await self._send_bytes(reply)

    @staticmethod
    def _on_subscription_ack(sub: Subscription, header: dict[str, Any]) -> None:
        """What an ack about ``sub`` tells it (stats, backlog, completion, failure)."""
        ack_type = header.get("a")
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
        elif ack_type == "persisted" and header.get("cid") is None:
            sub.persisted_bookmark = header.get("bm", "")
        if header.get("status") == "failure":
            sub.failure = header
            sub._send.close()

    # ---------------------------------------------------------------- API
    async def logon(self, *, timeout: float = 10, **fields: Any) -> dict[str, Any]:
        """Log on as ``self.name``; returns the logon ack (``s`` = last persisted seq)."""
        cid, data = self.connection.logon(fields)
        try:
            (ack,) = await self._await_command("logon", cid, data, timeout)
        except ConnectionLost as exc:
            closed = self.closed
            if isinstance(closed, ProtocolError) and closed.reason == NOT_AN_AMPS_PORT:
                raise  # it says what the port is; a TLS hint would mislead
            raise ConnectionLost(
                f"{exc}; the server closed the connection without answering the logon: "
                "if its transport is tcps, connect with a tcps:// URI (and its CA file)"
            ) from None
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
        seq, frame = self.connection.publish(
            command, topic, payload, seq=seq, ack=ack, sow_key=sow_key
        )
        await self._send_bytes(frame)
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
        sid = sub_id or f"s{self.next_id()}"
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
        self.connection.add_route(sid)
        try:
            await self.command(header, wait=1, timeout=timeout)
        except BaseException:
            self._forget_sub(sid)
            raise
        try:
            yield
        finally:
            self._forget_sub(sid)
            if self.closed is None:
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(5),
                    contextlib.suppress(*_SEND_ERRORS),
                ):
                    await self._send({"c": "unsubscribe", "sub_id": sid})

    def bookmark_subscribe(self, topic: str, bookmark: str = "0", **kwargs: Any) -> Any:
        """Shorthand for ``subscribe(topic, bookmark=...)`` (EPOCH by default)."""
        return self.subscribe(topic, bookmark=bookmark, **kwargs)

    def _forget_sub(self, sub_id: str) -> Subscription | None:
        """Stop routing to the subscription ``sub_id``; returns it (None: unknown)."""
        self.connection.drop_route(sub_id)
        return self._subs.pop(sub_id, None)

    # ---------------------------------------------------------------- SOW
    # The query rules live in amps_py.client.sow (functions taking a SowClient).
    async def sow(
        self,
        topic: str,
        filter: str | None = None,
        *,
        top_n: int | None = None,
        orderby: str | None = None,
        skip_n: int | None = None,
        batch_size: int = 10,
        sow_keys: str | Iterable[str] | None = None,
        options: str | None = None,
        timeout: float = 60,
    ) -> SowResult:
        """Query the State of the World of ``topic``: see :func:`amps_py.client.sow.sow`."""
        return await _sow.sow(
            self,
            topic,
            filter,
            top_n=top_n,
            orderby=orderby,
            skip_n=skip_n,
            batch_size=batch_size,
            sow_keys=sow_keys,
            options=options,
            timeout=timeout,
        )

    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        options: str | None = None,
        top_n: int | None = None,
        orderby: str | None = None,
        batch_size: int = 10,
        sow_keys: str | Iterable[str] | None = None,
        sub_id: str | None = None,
        buffer: float = math.inf,
        timeout: float = 30,
        markers: bool = False,
    ) -> AbstractAsyncContextManager[SowSubscription]:
        """Query ``topic`` and subscribe to it in one atomic step: see
        :func:`amps_py.client.sow.sow_and_subscribe`."""
        return _sow.sow_and_subscribe(
            self,
            topic,
            filter,
            options=options,
            top_n=top_n,
            orderby=orderby,
            batch_size=batch_size,
            sow_keys=sow_keys,
            sub_id=sub_id,
            buffer=buffer,
            timeout=timeout,
            markers=markers,
        )

    async def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        keys: str | Iterable[str] | None = None,
        data: bytes | str | None = None,
        timeout: float = 30,
    ) -> dict[str, int]:
        """Delete records of ``topic``; returns the server's counts: see
        :func:`amps_py.client.sow.sow_delete`."""
        return await _sow.sow_delete(
            self, topic, filter=filter, keys=keys, data=data, timeout=timeout
        )

    async def _stop_query(self, query_id: str) -> None:
        await _sow.stop_query(self, query_id)

    # ---------------------------------------------------------------- queues
    # Acknowledging queue messages lives in amps_py.client.queue (functions taking a
    # QueueClient).
    async def ack(
        self, topic: str, bookmark: str, *, cancel: bool = False, expire: bool = False
    ) -> None:
        """Acknowledge the queue message ``bookmark`` of ``topic`` (batched by
        :attr:`ack_batch_size`): see :func:`amps_py.client.queue.ack`."""
        await _queue.ack(self, topic, bookmark, cancel=cancel, expire=expire)

    async def flush_acks(self, *, timeout: float = 30) -> None:
        """Send every batched acknowledgement and wait for every answer: see
        :func:`amps_py.client.queue.flush_acks`."""
        await _queue.flush_acks(self, timeout=timeout)

    async def unsubscribe(self, sub_id: str) -> None:
        await self.command({"c": "unsubscribe", "sub_id": sub_id, "a": "processed"})
        sub = self._forget_sub(sub_id)
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
