"""Consuming message queues with the trio client: :meth:`Client.ack` (batched),
:meth:`Client.flush_acks`, ``message.ack()`` and subscriptions that acknowledge
automatically (:class:`QueueSubscription`).

A queue consumer subscribes to the queue's name; the server leases it up to
``max_backlog`` messages at a time, each with a bookmark. Acknowledging a message
removes it from the queue (``cancel`` returns it for redelivery, ``expire`` expires it);
an unacknowledged message returns to the queue when its lease expires or the
subscription ends, and is delivered again.

On the wire an acknowledgement is a ``sow_delete`` on the queue's topic with ``bm`` =
a comma-separated list of bookmarks (and option ``o`` = ``cancel`` or ``expire``). The
client batches plain acknowledgements per topic: up to ``client.ack_batch_size``
bookmarks in one command (default 1: each is sent at once), and a partial batch is sent
``client.ack_timeout`` seconds after its first bookmark (default 1.0), whichever comes
first. Every acknowledgement command asks for the ``processed`` ack, so a refusal
(``not entitled``, ``invalid topic``) comes back and is raised as :class:`CommandError`
by the next :meth:`Client.ack` or :meth:`Client.flush_acks`.

The API functions take a :class:`QueueClient` first (the narrow interface they need;
the :class:`~amps_py.client.client.Client` is one); ``Client`` calls them from its
methods of the same names (``client.ack(...)``), as it does the SOW functions. An
acknowledgement command's answer is routed back by the client's
:class:`~amps_py.protocol.client_connection.ClientConnection` (``track``) to
:meth:`AckState.answered`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from .subscription import (
    AMPSError,
    CommandError,
    ConnectionLost,
    Message,
    Subscription,
    SubscriptionClient,
)

if TYPE_CHECKING:
    from amps_py.protocol.client_connection import ClientConnection

#: bookmarks per acknowledgement command unless ``ack_batch_size`` says otherwise
DEFAULT_ACK_BATCH_SIZE: Final = 1
#: seconds a partial batch of acknowledgements waits before it is sent
DEFAULT_ACK_TIMEOUT: Final = 1.0
#: seconds the close of a client or subscription gives pending acknowledgements
CLOSE_FLUSH_TIMEOUT: Final = 5.0

_SEND_ERRORS: Final = (AMPSError, trio.BrokenResourceError, trio.ClosedResourceError)


class _Batch:
    """Plain acknowledgements of one topic not sent yet, and the timer that sends them."""

    __slots__ = ("bookmarks", "timer")

    def __init__(self) -> None:
        self.bookmarks: list[str] = []
        self.timer: trio.CancelScope | None = None


class AckState:
    """A client's acknowledgements: the batches not sent yet, the commands sent but not
    answered, the first refusal not raised yet, and counts (``sent``: bookmarks sent;
    ``processed``: bookmarks in commands the server answered with success)."""

    def __init__(self) -> None:
        self.batches: dict[str, _Batch] = {}
        #: cid of an acknowledgement command sent -> how many bookmarks it carried
        self.outstanding: dict[str, int] = {}
        #: cid of a plain acknowledgement command sent and not answered -> (topic, its
        #: bookmarks): what a lost connection may not have applied (see
        #: :meth:`unconfirmed`)
        self.unanswered: dict[str, tuple[str, list[str]]] = {}
        self.failure: CommandError | None = None
        self.changed = trio.Event()
        self.sent = 0
        self.processed = 0

    def wake(self) -> None:
        """Wake every :func:`flush_acks` waiting (an answer came, or the connection
        closed)."""
        event = self.changed
        self.changed = trio.Event()
        event.set()

    def answered(self, header: dict[str, Any]) -> None:
        """The server's ack for an acknowledgement command (from the reader task)."""
        count = self.outstanding.pop(str(header["cid"]), 0)
        self.unanswered.pop(str(header["cid"]), None)
        if header.get("status") == "failure":
            if self.failure is None:
                self.failure = CommandError("sow_delete", header)
        else:
            self.processed += count
        self.wake()

    def raise_failure(self) -> None:
        """Raise (once) the refusal of an earlier acknowledgement, if there was one."""
        failure = self.failure
        if failure is not None:
            self.failure = None
            raise failure

    def unconfirmed(self) -> dict[str, list[str]]:
        """Topic -> the bookmarks of plain acknowledgements not confirmed by the server:
        batched and not sent, or sent and not answered. Once the connection is lost,
        those are what it may not have applied (the HA client sends them again on its
        next connection); cancel and expire are not included."""
        found: dict[str, list[str]] = {}
        for topic, batch in self.batches.items():
            found.setdefault(topic, []).extend(batch.bookmarks)
        for topic, bookmarks in self.unanswered.values():
            found.setdefault(topic, []).extend(bookmarks)
        return found

    def keep(self, topic: str, bookmarks: list[str]) -> None:
        """Put plain acknowledgements back among the batched ones (not sent: sent by
        the next send of ``topic``'s batch, or taken over with :meth:`unconfirmed`)."""
        self.batches.setdefault(topic, _Batch()).bookmarks.extend(bookmarks)

    def forget(self) -> None:
        """Drop every batch and every record of unanswered commands (the connection is
        gone and someone else took them over: :meth:`unconfirmed`)."""
        for batch in self.batches.values():
            if batch.timer is not None:
                batch.timer.cancel()
        self.batches.clear()
        self.unanswered.clear()

    @property
    def pending(self) -> int:
        """Bookmarks batched and not sent yet."""
        return sum(len(batch.bookmarks) for batch in self.batches.values())


class QueueClient(SubscriptionClient, Protocol):
    """What the functions here need of a client (:class:`~amps_py.client.Client` has
    it): its acknowledgement state and settings, the protocol connection (command
    ids; answers routed back), a nursery for batch timers, and sending."""

    closed: BaseException | None
    ack_batch_size: int
    ack_timeout: float
    connection: ClientConnection
    _acks: AckState
    _nursery: trio.Nursery | None

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None: ...


def backlog_of(header: dict[str, Any]) -> int | None:
    """The effective ``max_backlog`` a subscribe ack reports (in ``opts``, or ``o``),
    or None (not a queue subscription)."""
    for field in ("opts", "o"):
        for option in str(header.get(field) or "").split(","):
            name, _, value = option.strip().partition("=")
            if name == "max_backlog":
                with contextlib.suppress(ValueError):
                    return int(value)
    return None


async def ack(
    client: QueueClient, topic: str, bookmark: str, *, cancel: bool = False, expire: bool = False
) -> None:
    """Acknowledge the queue message ``bookmark`` of the queue ``topic``.

    A plain acknowledgement (the message was processed: it leaves the queue) is batched
    with the others of ``topic``: the batch is sent as one ``sow_delete`` when it holds
    ``client.ack_batch_size`` bookmarks (default 1: at once), or ``client.ack_timeout``
    seconds after its first bookmark (default 1.0), or by :meth:`flush_acks`, the end of
    a subscription or the close of the client, whichever comes first. ``cancel=True``
    returns the message to the queue (it is delivered again; the queue's MaxCancels
    counts it) and ``expire=True`` expires it (the expire action runs): those are sent
    at once, each on its own, never batched with plain acknowledgements.

    This call does not wait for the server's answer; :meth:`flush_acks` does.

    Raises:
        CommandError: the server refused an EARLIER acknowledgement (e.g. ``not
            entitled``: the user may not write to the queue; ``invalid topic``: not a
            queue). The refusal is raised once, by the next ``ack`` or ``flush_acks``;
            the acknowledgement of the call that raises it is not queued (call again).
        ConnectionLost: the connection is closed: the server has already returned the
            leased messages to the queue.
        ValueError: no bookmark, or both ``cancel`` and ``expire``.
    """
    state = client._acks
    state.raise_failure()
    if client.closed is not None:
        raise ConnectionLost(
            f"cannot acknowledge {bookmark!r} on {topic!r}: the connection is closed "
            f"({client.closed}); the server returned its leased messages to the queue"
        )
    if not bookmark:
        raise ValueError(
            f"acknowledging a message of {topic!r} needs its bookmark (message.bookmark); "
            "queue deliveries carry one"
        )
    if cancel and expire:
        raise ValueError("give cancel=True or expire=True, not both")
    if cancel or expire:
        await _send_acks(client, topic, [bookmark], "cancel" if cancel else "expire")
        return
    batch = state.batches.get(topic)
    if batch is None:
        batch = state.batches[topic] = _Batch()
    batch.bookmarks.append(bookmark)
    if len(batch.bookmarks) >= client.ack_batch_size:
        await _send_batch(client, topic)
    elif batch.timer is None and client._nursery is not None:
        batch.timer = trio.CancelScope()
        client._nursery.start_soon(_send_after_timeout, client, topic, batch, batch.timer)


async def flush_acks(client: QueueClient, *, timeout: float = 30) -> None:
    """Send every batched acknowledgement now and wait until the server has answered
    every acknowledgement sent so far.

    Raises:
        CommandError: the server refused an acknowledgement (the first refusal not
            raised yet).
        ConnectionLost: the connection closed before every answer came.
        TimeoutError: the answers did not all come within ``timeout`` seconds.
    """
    state = client._acks
    for topic in list(state.batches):
        await _send_batch(client, topic)
    with trio.move_on_after(timeout):
        while state.outstanding:
            if client.closed is not None:
                state.raise_failure()
                raise ConnectionLost(
                    f"connection closed before {len(state.outstanding)} acknowledgement "
                    f"command(s) were answered: {client.closed}"
                )
            await state.changed.wait()
    if state.outstanding:
        raise TimeoutError(
            f"{len(state.outstanding)} acknowledgement command(s) not answered within {timeout:g} s"
        )
    state.raise_failure()


async def send_pending(client: QueueClient) -> None:
    """Best effort, shielded from cancellation: send every batched acknowledgement now
    (without waiting for answers). Used before an unsubscribe, so that the server
    removes the acknowledged messages before it returns the subscription's leases."""
    if not client._acks.batches or client.closed is not None:
        return
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(CLOSE_FLUSH_TIMEOUT),
        contextlib.suppress(*_SEND_ERRORS),
    ):
        for topic in list(client._acks.batches):
            await _send_batch(client, topic)


async def flush_on_close(client: QueueClient) -> None:
    """Best effort, shielded: :func:`flush_acks` with a short timeout before a client
    closes; a refusal or a timeout is not raised (call :meth:`flush_acks` first to
    know)."""
    state = client._acks
    if client.closed is not None or not (state.batches or state.outstanding):
        return
    with (
        trio.CancelScope(shield=True),
        contextlib.suppress(*_SEND_ERRORS, TimeoutError),
    ):
        await flush_acks(client, timeout=CLOSE_FLUSH_TIMEOUT)


async def _send_after_timeout(
    client: QueueClient, topic: str, batch: _Batch, scope: trio.CancelScope
) -> None:
    with scope:
        await trio.sleep(client.ack_timeout)
        batch.timer = None  # sending must not cancel this very task
        if client._acks.batches.get(topic) is batch:
            with contextlib.suppress(*_SEND_ERRORS):
                await _send_batch(client, topic)


async def _send_batch(client: QueueClient, topic: str) -> None:
    batch = client._acks.batches.pop(topic, None)
    if batch is None or not batch.bookmarks:
        return
    if batch.timer is not None:
        batch.timer.cancel()
    await _send_acks(client, topic, batch.bookmarks, "")


async def _send_acks(client: QueueClient, topic: str, bookmarks: list[str], option: str) -> None:
    state = client._acks
    cid = client.connection.next_cid()
    header: dict[str, Any] = {
        "c": "sow_delete",
        "cid": cid,
        "t": topic,
        "bm": ",".join(bookmarks),
        "a": "processed",
    }
    if option:
        header["o"] = option
    state.outstanding[cid] = len(bookmarks)
    client.connection.track(cid)
    if not option:
        state.unanswered[cid] = (topic, bookmarks)
    try:
        await client._send(header)
    except BaseException:
        client.connection.untrack(cid)
        state.outstanding.pop(cid, None)
        state.unanswered.pop(cid, None)
        if not option:
            # not sent (or not wholly): keep them batched, for a later send or for
            # whoever takes over from a lost connection (sending one twice is harmless)
            state.keep(topic, bookmarks)
        raise
    state.sent += len(bookmarks)


class QueueSubscription(Subscription):
    """A queue subscription that acknowledges automatically (``auto_ack=True``).

    The message the iterator yielded last is acknowledged when the application asks
    for the next one (the next ``__anext__``: the next turn of ``async for``, or
    :meth:`get`), or when the ``async with`` block of the subscription exits without
    an exception (e.g. after a ``break``). When the block exits with an exception
    (including a cancellation), that last message is NOT acknowledged: it stays leased
    and returns to the queue when its lease expires or the subscription ends, to be
    delivered again. A message the application acknowledged itself
    (``message.ack()``) is not acknowledged again. The automatic acknowledgement is
    :meth:`Client.ack`'s (batched by ``ack_batch_size``), so its errors come from
    ``__anext__``: ``CommandError`` for a refused earlier acknowledgement, and
    ``ConnectionLost`` once the connection is closed (the server has then returned the
    unacknowledged message to the queue).
    """

    async def __anext__(self) -> Message:
        current = self._current
        if current is not None:
            self._current = None
            await self.client.ack(current.topic, current.bookmark)
        message = await super().__anext__()
        self._current = message
        return message


@asynccontextmanager
async def consuming(client: QueueClient, sub: Subscription) -> AsyncIterator[None]:
    """The body of a subscription's ``async with``: on a normal exit acknowledge the
    auto-acknowledged subscription's last message; on any exit send the batched
    acknowledgements before the subscription is dropped (its unsubscribe follows)."""
    try:
        yield
    except BaseException:
        sub._current = None  # not processed: left to be delivered again
        raise
    else:
        current = sub._current
        if current is not None:
            sub._current = None
            await client.ack(current.topic, current.bookmark)
    finally:
        await send_pending(client)
