"""The subscription side of the HA client: :class:`HASubscription` (an iterator that
survives reconnects) and :class:`HAMessage` (a message with ``possible_duplicate`` and
``processed()``). The client (:mod:`amps_py.client.ha`) subscribes them on each
connection and hands them the raw messages; the bookmark store decides what is
dropped and what is flagged.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .subscription import AMPSError, CommandError, Message, claim_for_ack

if TYPE_CHECKING:
    from .client import Client
    from .store_api import BookmarkStore

__all__ = ["HAMessage", "HAOwner", "HASubscription"]


class HAOwner(Protocol):
    """What an HA subscription needs of the HA client that owns it (the
    :class:`~amps_py.client.ha.HAClient` has it): its name (for logs), its bookmark
    store, and acknowledging a queue message on the connection it was leased on."""

    name: str
    bookmark_store: BookmarkStore

    async def _ack(
        self, topic: str, bookmark: str, cancel: bool, expire: bool, connection: int | None
    ) -> None: ...


class HAMessage(Message):
    """A message of an HA subscription.

    Attributes:
        possible_duplicate: it may have been delivered before (redelivered after a
            reconnect, at or before the last message seen from its publisher).
        connection: the HA client's connection it arrived on (its
            :attr:`~amps_py.client.ha.HAClient.connections` count then); a queue
            message is leased to that connection only.
    """

    __slots__ = ("_ha_sub", "connection", "possible_duplicate")

    def __init__(
        self,
        header: dict[str, Any],
        data: bytes,
        sub: HASubscription,
        possible_duplicate: bool,
        connection: int = 0,
    ) -> None:
        super().__init__(header, data)
        self._ha_sub = sub
        self.possible_duplicate = possible_duplicate
        self.connection = connection

    def processed(self) -> None:
        """The application is done with this message: a resubscribe (after a
        reconnect, or with a durable bookmark store after a restart) resumes after
        it, once every earlier message of its publisher is processed too. Nothing for
        a live subscription."""
        sub = self._ha_sub
        if sub.bookmark is not None and self.bookmark:
            sub._ha.bookmark_store.processed(sub.sub_id, self.bookmark)

    async def ack(self, *, cancel: bool = False, expire: bool = False) -> None:
        """Acknowledge this queue message (:meth:`HAClient.ack`).

        A plain acknowledgement is sent on the current connection, also when the
        message came on an earlier one (its lease ended with that connection, but the
        server removes a message it still holds and ignores one it does not: the
        acknowledgement is never harmful, and it saves a redelivery when it arrives
        first), and kept for the next connection while there is none.
        ``cancel=True`` and ``expire=True`` act on the lease: for a message of an
        earlier connection they are not sent (the server returned it to the queue
        when that connection dropped; it is delivered again) and
        ``HAClient.stale_acks_dropped`` counts them. On an ``auto_ack`` subscription a
        message acknowledged here is not acknowledged again.

        Raises:
            AMPSError: the message is not from a queue subscription (as
                :meth:`Message.ack`).
            CommandError: the server refused an earlier acknowledgement.
        """
        sub = self._ha_sub
        claim_for_ack(sub, self)
        await sub._ha._ack(self.topic, self.bookmark, cancel, expire, self.connection)


class HASubscription:
    """A subscription that survives reconnects: iterate it for :class:`HAMessage`.

    Attributes:
        sub_id: its id (the bookmark store's key; stable across reconnects).
        failure: the server's refusal of a resubscribe (the iterator then ends).
        duplicates_dropped: redelivered messages dropped as already processed.
        subscribes: how many times it was (re)subscribed.
        max_backlog: for a queue subscription, the backlog the server of the current
            (or last) connection put in force; None for other subscriptions (and
            before the first subscribe).
        auto_ack: acknowledge each queue message when the loop moves past it.
    """

    def __init__(
        self,
        ha: HAOwner,
        sub_id: str,
        topic: str,
        filter: str | None,
        bookmark: str | None,
        options: str | None,
        *,
        max_backlog: int | None = None,
        auto_ack: bool = False,
    ) -> None:
        self._ha = ha
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.bookmark = bookmark
        self.options = options
        self.requested_backlog = max_backlog
        self.auto_ack = auto_ack
        self.max_backlog: int | None = None
        self.failure: AMPSError | None = None
        self.duplicates_dropped = 0
        self.subscribes = 0
        self._send, self._receive = trio.open_memory_channel[HAMessage](math.inf)
        self._scope: trio.CancelScope | None = None  # of the pump of the current connection
        #: with auto_ack: the message the iterator yielded last, not acknowledged yet
        self._current: HAMessage | None = None

    def _subscribe_bookmark(self) -> str | None:
        """The ``bm`` of the next (re)subscribe: where the bookmark store says to
        resume, else the caller's bookmark; None for a live subscription."""
        if self.bookmark is None:
            return None
        store = self._ha.bookmark_store
        store.reconnected(self.sub_id)
        return store.resume_bookmark(self.sub_id) or self.bookmark

    async def _serve(
        self, client: Client, connection: int, task_status: trio.TaskStatus[None]
    ) -> AMPSError | None:
        """Subscribe on ``client`` (connection number ``connection``), report
        ``task_status.started()`` once the server accepted, then hand every message
        over until the subscription or the connection ends; returns the server's
        failure that ended it, if any.

        Raises:
            CommandError: the server refused the subscribe.
            AMPSError: ``auto_ack`` on a topic that is not a queue.
        """
        async with client.subscribe(
            self.topic,
            filter=self.filter,
            bookmark=self._subscribe_bookmark(),
            options=self.options,
            sub_id=self.sub_id,
            max_backlog=self.requested_backlog,
        ) as raw:
            self.subscribes += 1
            self.max_backlog = raw.max_backlog
            if self.auto_ack and raw.max_backlog is None:
                raise AMPSError(
                    f"auto_ack=True needs a queue: {self.topic!r} is not a queue on this "
                    "server (its subscribe ack reported no max_backlog); subscribe "
                    "without auto_ack, or to the queue's name"
                )
            task_status.started()
            async for message in raw:
                self._deliver(message, connection)
        return None if raw.failure is None else CommandError("subscribe", raw.failure)

    def _deliver(self, message: Message, connection: int = 0) -> None:
        possible = False
        if self.bookmark is not None and message.bookmark:
            verdict = self._ha.bookmark_store.delivered(self.sub_id, message.bookmark)
            if verdict.duplicate:
                self.duplicates_dropped += 1
                return
            possible = verdict.possible_duplicate
        self._hand_over(HAMessage(message.header, message.data, self, possible, connection))

    def _hand_over(self, message: HAMessage) -> None:
        """Queue ``message`` for the iterator (dropped when the application left it)."""
        with contextlib.suppress(trio.ClosedResourceError):
            self._send.send_nowait(message)

    def _end(self, failure: AMPSError | None = None) -> None:
        if failure is not None:
            self.failure = failure
        self._send.close()
        if self._scope is not None:
            self._scope.cancel()

    async def _ack_current(self) -> None:
        """With ``auto_ack``: acknowledge the message the iterator yielded last (the
        application moved past it, or left the block normally)."""
        current, self._current = self._current, None
        if current is not None:
            await self._ha._ack(current.topic, current.bookmark, False, False, current.connection)

    def __aiter__(self) -> HASubscription:
        return self

    async def __anext__(self) -> HAMessage:
        if self._current is not None:
            await self._ack_current()
        try:
            message = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if self.auto_ack:
            self._current = message
        return message

    async def get(self, timeout: float) -> HAMessage:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            StopAsyncIteration: the subscription ended (see :attr:`failure`).
        """
        with trio.move_on_after(timeout):
            return await self.__anext__()
        raise TimeoutError(f"no message on subscription {self.sub_id} within {timeout:g} s")
