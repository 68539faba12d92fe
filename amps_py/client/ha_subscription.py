"""The subscription side of the HA client: :class:`HASubscription` (an iterator that
survives reconnects) and :class:`HAMessage` (a message with ``possible_duplicate`` and
``processed()``). The client (:mod:`amps_py.client.ha`) subscribes them on each
connection and hands them the raw messages; the bookmark store decides what is
dropped and what is flagged.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import trio

from .subscription import CommandError, Message

if TYPE_CHECKING:
    from .ha import HAClient

__all__ = ["HAMessage", "HASubscription"]


class HAMessage(Message):
    """A message of an HA subscription.

    Attributes:
        possible_duplicate: it may have been delivered before (redelivered after a
            reconnect, at or before the last message seen from its publisher).
    """

    __slots__ = ("_ha_sub", "possible_duplicate")

    def __init__(
        self, header: dict[str, Any], data: bytes, sub: HASubscription, possible_duplicate: bool
    ) -> None:
        super().__init__(header, data)
        self._ha_sub = sub
        self.possible_duplicate = possible_duplicate

    def processed(self) -> None:
        """The application is done with this message: a resubscribe (after a
        reconnect, or with a durable bookmark store after a restart) resumes after
        it, once every earlier message of its publisher is processed too. Nothing for
        a live subscription."""
        sub = self._ha_sub
        if sub.bookmark is not None and self.bookmark:
            sub._ha.bookmark_store.processed(sub.sub_id, self.bookmark)


class HASubscription:
    """A subscription that survives reconnects: iterate it for :class:`HAMessage`.

    Attributes:
        sub_id: its id (the bookmark store's key; stable across reconnects).
        failure: the server's refusal of a resubscribe (the iterator then ends).
        duplicates_dropped: redelivered messages dropped as already processed.
        subscribes: how many times it was (re)subscribed.
    """

    def __init__(
        self,
        ha: HAClient,
        sub_id: str,
        topic: str,
        filter: str | None,
        bookmark: str | None,
        options: str | None,
    ) -> None:
        self._ha = ha
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.bookmark = bookmark
        self.options = options
        self.failure: CommandError | None = None
        self.duplicates_dropped = 0
        self.subscribes = 0
        self._send, self._receive = trio.open_memory_channel[HAMessage](math.inf)
        self._scope: trio.CancelScope | None = None  # of the pump of the current connection

    def _subscribe_bookmark(self) -> str | None:
        """The ``bm`` of the next (re)subscribe: where the bookmark store says to
        resume, else the caller's bookmark; None for a live subscription."""
        if self.bookmark is None:
            return None
        store = self._ha.bookmark_store
        store.reconnected(self.sub_id)
        return store.resume_bookmark(self.sub_id) or self.bookmark

    def _deliver(self, message: Message) -> None:
        possible = False
        if self.bookmark is not None and message.bookmark:
            verdict = self._ha.bookmark_store.delivered(self.sub_id, message.bookmark)
            if verdict.duplicate:
                self.duplicates_dropped += 1
                return
            possible = verdict.possible_duplicate
        ha_message = HAMessage(message.header, message.data, self, possible)
        with contextlib.suppress(trio.ClosedResourceError):  # the application left it
            self._send.send_nowait(ha_message)

    def _end(self, failure: CommandError | None = None) -> None:
        if failure is not None:
            self.failure = failure
        self._send.close()
        if self._scope is not None:
            self._scope.cancel()

    def __aiter__(self) -> HASubscription:
        return self

    async def __anext__(self) -> HAMessage:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def get(self, timeout: float) -> HAMessage:
        """The next message.

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            StopAsyncIteration: the subscription ended (see :attr:`failure`).
        """
        with trio.move_on_after(timeout):
            return await self.__anext__()
        raise TimeoutError(f"no message on subscription {self.sub_id} within {timeout:g} s")
