"""What the trio client hands to its callers: :class:`Message`, :class:`Subscription`
(an iterator of messages) and the errors (:class:`AMPSError` and its subclasses).

They live apart from :class:`~amps_py.client.client.Client` so that
:mod:`amps_py.client.sow` and :mod:`amps_py.client.queue` can build on them without
importing the client itself: a subscription knows its client through the narrow
:class:`SubscriptionClient` interface.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import trio


class SubscriptionClient(Protocol):
    """What a :class:`Subscription` needs of the client that made it (the
    :class:`~amps_py.client.client.Client` has it): acknowledging and unsubscribing."""

    async def ack(
        self, topic: str, bookmark: str, *, cancel: bool = False, expire: bool = False
    ) -> None: ...

    async def unsubscribe(self, sub_id: str) -> None: ...


class AMPSError(Exception):
    """Base class of client errors."""


class CommandError(AMPSError):
    """The server answered a command with a failure ack."""

    def __init__(self, command: str, ack: dict[str, Any]) -> None:
        self.command = command
        self.reason = str(ack.get("reason", "unknown"))
        self.detail = str(ack.get("detail", ""))
        self.ack = ack
        text = f"{command} failed: {self.reason}"
        if self.detail and self.detail != self.reason:
            text += f" ({self.detail})"
        super().__init__(text)


class ConnectionLost(AMPSError):
    """The connection closed while a command or iterator was waiting."""


def claim_for_ack(sub: Any, message: object) -> None:
    """Before ``message`` of subscription ``sub`` (a client's or the HA client's) is
    acknowledged by hand: it must be a queue subscription's, and it is no longer
    acknowledged automatically (``auto_ack``).

    Raises:
        AMPSError: ``sub`` is not a queue subscription.
    """
    if sub.max_backlog is None:
        raise AMPSError(
            f"{message!r} came from subscription {sub.sub_id!r}, which is not a queue "
            "subscription (its subscribe ack reported no max_backlog); only queue "
            "messages are acknowledged"
        )
    if sub._current is message:
        sub._current = None  # acknowledged here, not again automatically


class Message:
    """A message delivered to a subscription.

    ``command`` says what it is: ``publish`` (a live message), ``sow`` (a record of a
    ``sow_and_subscribe`` snapshot: ``snapshot`` is true) or ``oof`` (the record
    ``key`` left the subscription for ``reason``: ``deleted``, ``expired``, ``match``,
    ``entitlement``; ``data`` is its last message, or the new one for ``match``).
    """

    __slots__ = ("_sub", "bookmark", "data", "header", "sub_id", "topic")

    def __init__(
        self, header: dict[str, Any], data: bytes, sub: Subscription | None = None
    ) -> None:
        self.header = header
        self.data = data
        self.topic: str = header.get("t", "")
        self.bookmark: str = header.get("bm", "")
        self.sub_id: str = header.get("sub_id", "")
        self._sub = sub  # the subscription that received it (for ack)

    async def ack(self, *, cancel: bool = False, expire: bool = False) -> None:
        """Acknowledge this queue message: ``client.ack(message.topic,
        message.bookmark, cancel=..., expire=...)`` through the client that received it
        (batched as :meth:`Client.ack` says; ``cancel=True`` returns it to the queue,
        ``expire=True`` expires it). On an ``auto_ack`` subscription, a message
        acknowledged here is not acknowledged again automatically.

        Raises:
            AMPSError: the message did not come from a queue subscription of a client
                (a hand-made message, a ``sow_and_subscribe`` record, a plain topic's
                message); or, as :meth:`Client.ack`, ``CommandError`` for the refusal
                of an earlier acknowledgement and ``ConnectionLost``.
        """
        sub = self._sub
        if sub is None:
            raise AMPSError(
                f"{self!r} did not come from a subscription; acknowledge it with "
                "client.ack(topic, bookmark)"
            )
        claim_for_ack(sub, self)
        await sub.client.ack(self.topic, self.bookmark, cancel=cancel, expire=expire)

    @property
    def command(self) -> str:
        """``publish``, ``sow`` or ``oof``."""
        return str(self.header.get("c", "publish"))

    @property
    def snapshot(self) -> bool:
        """True for a record of a ``sow_and_subscribe`` snapshot, False for what
        came live."""
        return self.header.get("c") == "sow"

    @property
    def key(self) -> str:
        """The SOW key (``k``), or "" when the server sent none."""
        return str(self.header.get("k", ""))

    @property
    def correlation_id(self) -> str:
        return str(self.header.get("x", ""))

    @property
    def reason(self) -> str:
        """Why an ``oof`` message left the subscription ("" for other messages)."""
        return str(self.header.get("reason", ""))

    def json(self) -> Any:
        return orjson.loads(self.data)

    def __repr__(self) -> str:
        kind = "" if self.command == "publish" else f"{self.command}, "
        return f"Message({kind}topic={self.topic!r}, bm={self.bookmark!r}, data={self.data[:60]!r})"


class Subscription:
    """An active subscription: iterate it for messages.

    ``completed`` is set when a bookmark replay reached the live stream (or a range
    ended); ``completed_bookmark`` is the bookmark the server sent with it, and
    ``replayed`` how many messages the subscription had delivered before it (the
    replayed ones: the first ``replayed`` messages the iterator yields; ``None`` until
    the ``completed`` ack arrives). ``delivered`` counts the messages received so far.
    ``persisted_bookmark`` tracks the periodic persisted acks of bookmark subscriptions.
    ``max_backlog`` is, for a queue subscription, the backlog in force (how many
    unacknowledged messages the server leases to it at a time) that the server
    reported in its subscribe ack; ``None`` for a subscription that is not to a queue.

    ``markers`` (off by default; the HA client sets it): the iterator also yields the
    points where a snapshot ended and where a replay reached the live stream, in
    their place among the messages: a message whose ``command`` is ``group_end`` (a
    ``sow_and_subscribe``'s snapshot is complete) or ``ack`` (the ``completed`` ack;
    its ``bookmark`` is the ack's ``bm``). They do not count in ``delivered``.
    """

    #: the message an ``auto_ack`` subscription yielded last and has not acknowledged
    #: yet (see :class:`amps_py.client.queue.QueueSubscription`); always None here
    _current: Message | None = None

    def __init__(
        self, client: SubscriptionClient, sub_id: str, buffer: float, markers: bool = False
    ) -> None:
        self.client = client
        self.sub_id = sub_id
        self.markers = markers
        self._send, self._receive = trio.open_memory_channel[Message | None](buffer)
        self.completed = trio.Event()
        self.completed_bookmark = ""
        self.replayed: int | None = None
        self.delivered = 0
        self.persisted_bookmark = ""
        self.failure: dict[str, Any] | None = None
        self.max_backlog: int | None = None

    def _put(self, message: Message) -> None:
        """Hand a received message to the iterator (from the reader task)."""
        try:
            self._send.send_nowait(message)
            self.delivered += 1
        except trio.WouldBlock:
            # The application is not keeping up; drop the oldest behaviour would
            # hide loss, so fail loudly instead.
            self.failure = {"reason": "client buffer full"}
            self._send.close()
        except trio.ClosedResourceError:
            pass

    def _mark(self, header: dict[str, Any]) -> None:
        """With ``markers``: put a marker (``header``) among the messages, uncounted
        (from the reader task)."""
        if self.markers:
            try:
                self._send.send_nowait(Message({**header, "sub_id": self.sub_id}, b"", self))
            except trio.WouldBlock:
                self.failure = {"reason": "client buffer full"}
                self._send.close()
            except trio.ClosedResourceError:
                pass

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            msg = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def get(self, timeout: float) -> Message:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            StopAsyncIteration: the subscription ended (see :attr:`failure`).
        """
        with trio.move_on_after(timeout):
            return await self.__anext__()
        raise TimeoutError(f"no message on subscription {self.sub_id} within {timeout:g} s")

    async def unsubscribe(self) -> None:
        await self.client.unsubscribe(self.sub_id)
