"""The queue commands of a client: a ``subscribe`` to a queue, and a ``sow_delete``
that acknowledges queue messages.

The queues themselves (their state, delivery and journaling) are
:mod:`amps_py.server.queues`'s; these handlers take the narrow :class:`QueueClient` of
the session the command came on (its instance seen as :class:`QueueHost`), so the
queue module does not depend on the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from amps_py import reasons
from amps_py.protocol.server.commands import CommandFailed, ack_types, options
from amps_py.queue import QueueMessage, QueueSub
from txlog import CorruptRecord

from .queues import QueueSubscriber
from .recipient import Recipient

if TYPE_CHECKING:
    from .queues import QueueBook, ServedQueue
    from .subscriptions import Subscription

__all__ = ["QueueClient", "QueueHost", "acknowledge", "subscribe_to_queue"]


class QueueHost(Protocol):
    """What a queue command reads of the instance."""

    @property
    def queues(self) -> QueueBook | None: ...

    def compile_filter(self, text: str) -> Any: ...


class QueueClient(Recipient, Protocol):
    """What a queue command (a subscribe to a queue, a ``sow_delete`` that acks
    queue messages) uses of the session it came on."""

    @property
    def instance(self) -> QueueHost: ...
    @property
    def subscriptions(self) -> dict[str, Subscription]: ...

    def ack(
        self, header: dict[str, Any], ack_type: str, status: str = "success", **fields: Any
    ) -> None: ...

    def fail(self, header: dict[str, Any], exc: CommandFailed) -> None:
        """Answer a refused command with failure acks."""
        ...


def subscribe_to_queue(
    session: QueueClient, queue: ServedQueue, sub: Subscription, header: dict[str, Any]
) -> None:
    """A ``subscribe`` to ``queue`` (no bookmark): register it with the core, ack with
    the effective ``max_backlog``, and pump."""
    book = session.instance.queues
    assert book is not None
    opts = options(header)
    requested = 1
    raw = opts.get("max_backlog")
    if raw is not None:
        try:
            requested = int(raw)
        except (TypeError, ValueError):
            requested = 0
        if requested < 1:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                f"max_backlog must be a whole number of 1 or more, got {raw!r}",
            )
    subscriber = QueueSubscriber(session, sub, sub.filter, sub.head_suffix)
    qsub = QueueSub((session.conn_id, sub.sub_id), requested, subscriber)
    backlog = queue.state.subscribe(qsub)
    sub.queue = queue
    session.subscriptions[sub.sub_id] = sub
    if "processed" in sub.acks:
        session.ack(header, "processed", sub_id=sub.sub_id, opts=f"max_backlog={backlog}")
    if "stats" in sub.acks:
        session.ack(header, "stats", sub_id=sub.sub_id, records_returned=0)
    book.pump(queue)


def acknowledge(
    session: QueueClient, queue: ServedQueue, header: dict[str, Any], payload: bytes
) -> None:
    """``sow_delete`` on a queue: acknowledge the messages named by ``bm`` (option
    ``cancel`` returns them, ``expire`` expires them), or those a filter selects.

    The messages leave the queue here at once (nothing here delivers them again); the
    ``processed`` (and ``stats``) ack is sent once the ``QUEUE_ACK`` records this
    command journals are committed, so a confirmed acknowledgement survives a crash.
    A commit that fails answers with a failure ack instead."""
    book = session.instance.queues
    assert book is not None
    state = queue.state
    now = book.clock()
    opts = options(header)
    option = "cancel" if "cancel" in opts else "expire" if "expire" in opts else ""
    marks = [m.strip() for m in str(header.get("bm") or "").split(",") if m.strip()]
    held = len(state)
    if marks:
        result = state.ack(marks, session.conn_id, option, now)
    elif header.get("f"):
        flt = session.instance.compile_filter(str(header["f"]))

        def selected(message: QueueMessage) -> bool:
            try:
                return bool(flt.matches(queue.document(queue.payload_of(message))))
            except CorruptRecord as exc:  # before anything was removed: nothing changes
                raise CommandFailed(
                    reasons.JOURNAL_CORRUPT,
                    f"queue {queue.name!r}: {exc}; acknowledge by bookmark instead (bm)",
                ) from None

        result = state.ack_matching(selected, session.conn_id, now)
    else:
        raise CommandFailed(
            reasons.BAD_FILTER,
            f"sow_delete on queue {queue.name!r} needs the bookmarks to acknowledge (bm, "
            "comma-separated) or a filter (f)",
        )
    acks = ack_types(header)
    query_id = str(header.get("query_id") or header.get("cid") or "")

    def answer() -> None:
        if "processed" in acks:
            session.ack(header, "processed", query_id=query_id)
        if "stats" in acks:
            session.ack(
                header,
                "stats",
                query_id=query_id,
                records_deleted=len(result.acked) + len(result.expired),
                topic_matches=held,
                matches=len(marks) if marks else len(result.acked) + len(result.refused),
            )

    waiting = bool(result.acked) + bool(result.expired)
    failures: list[str] = []

    def committed(stored: bool, detail: str) -> None:
        nonlocal waiting
        waiting -= 1
        if not stored:
            failures.append(detail)
        if waiting:
            return
        if failures:
            session.fail(
                header,
                CommandFailed(
                    reasons.JOURNAL_WRITE_FAILED,
                    f"the acknowledgement of queue {queue.name!r} was not stored "
                    f"({failures[0]}); the messages are delivered again after a restart "
                    "unless acknowledged again",
                ),
            )
        else:
            answer()

    confirm = committed if ("processed" in acks or "stats" in acks) else None
    if result.acked:
        queue.note_acked(result.acked, now)
        book.journal_removal(queue, result.acked, "ack", confirm)
    book.expired(queue, result.expired, confirm)
    book.pump(queue)
    if confirm is not None and not waiting:
        answer()
