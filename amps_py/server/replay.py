"""Bookmark replay: journal first, then live, with no gap and no duplicate at the seam.

The replay task reads the journal in batches, never past the txid already fanned out
to live subscriptions (``Instance.visible_txid``: committed, or for ``fully_durable``
also acknowledged by every sync destination). When its cursor
reaches that txid it flips the subscription to live in the same synchronous step, so
every later commit is fanned out to it and every earlier one was replayed: the seam
has no gap and no duplicate. ``Subscription.delivered_upto`` guards the same rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import events, reasons
from amps_py.protocol import messages
from txlog import CorruptRecord, Journal

from .bookmark_spec import BadBookmarkSpec, BookmarkSpec, Point, parse_bookmark_spec
from .commands import CommandFailed, bookmark_not_found

if TYPE_CHECKING:
    from .host import SessionHost
    from .session import Session
    from .subscriptions import Subscription

log = logging.getLogger("amps_py.server.replay")


class ActiveReplays:
    """The txid each running bookmark replay has read through: journal removal never
    deletes a record a replay still has to read."""

    def __init__(self) -> None:
        self._cursors: dict[int, int] = {}

    def reading(self, key: int, cursor: int) -> None:
        """Replay ``key`` has read through txid ``cursor`` (registers it when new)."""
        self._cursors[key] = cursor

    def ended(self, key: int) -> None:
        self._cursors.pop(key, None)

    def cursors(self) -> list[int]:
        """Where each running replay stands."""
        return list(self._cursors.values())

    def __len__(self) -> int:
        return len(self._cursors)


#: records per journal read; about a millisecond of event-loop time
REPLAY_BATCH: Final = 512
#: how often bookmark subscriptions that asked for persisted acks get one
PERSISTED_ACK_INTERVAL: Final = 1.0


class BookmarkNotFound(Exception):
    pass


@dataclass(frozen=True)
class ReplayPlan:
    """Where a bookmark replay starts and ends, and what to tell the client.

    Attributes:
        start: replay the records after this txid.
        end: the last txid to deliver (a range), or None (then go live).
        resumed_from: the bookmark the replay resumes after (the earliest of the
            requested ones that the journal holds), or "".
        not_found: when none of the requested bookmarks is in the journal and
            ``bookmark_not_found`` chose where to start, a sentence saying so; else "".
    """

    start: int
    end: int | None
    resumed_from: str = ""
    not_found: str = ""


def _resolve_point(
    journal: Journal, point: Point, last_txid: int, not_found: str
) -> tuple[int, str, str]:
    """The txid after which replay starts for ``point``, the bookmark it resumes
    after ("" if none), and the not-found sentence ("" if found)."""
    if point.kind == "epoch":
        return 0, "", ""
    if point.kind == "now":
        return last_txid, "", ""
    if point.kind == "time":
        return min(journal.txid_before_time(point.time_us), last_txid), "", ""
    found = [
        (txid, f"{h}|{s}|")
        for h, s in point.bookmarks
        if (txid := journal.lookup_bookmark(h, s)) is not None
    ]
    if found:
        txid, bookmark = min(found)
        return min(txid, last_txid), bookmark, ""
    if _removed(journal, point):
        # older than what the journal keeps: everything still held comes after it
        return journal.removed_through, "", ""
    asked = ",".join(f"{h}|{s}|" for h, s in point.bookmarks)
    if not_found == "fail":
        raise BookmarkNotFound()
    if not_found == "epoch":
        return (
            0,
            "",
            (
                f"bookmark {asked} is not in this instance's journal; replaying from the "
                "start (bookmark_not_found=epoch)"
            ),
        )
    return (
        last_txid,
        "",
        (
            f"bookmark {asked} is not in this instance's journal; starting with new messages "
            "(bookmark_not_found=now, the default; use epoch to replay everything held, or "
            "fail to refuse)"
        ),
    )


def _resolve_end(journal: Journal, point: Point, inclusive: bool, last_txid: int) -> int | None:
    """The last txid to deliver for a range end, or None for "never ends"."""
    if point.kind == "epoch":
        return 0
    if point.kind == "now":
        return last_txid
    if point.kind == "time":
        return journal.txid_before_time(point.time_us)
    found = [journal.lookup_bookmark(h, s) for h, s in point.bookmarks]
    txids = [t for t in found if t is not None]
    if not txids:
        # an end older than what the journal keeps: nothing held is before it
        return journal.removed_through if _removed(journal, point) else None
    end = max(txids)
    return end if inclusive else end - 1


def _removed(journal: Journal, point: Point) -> bool:
    """Whether a bookmark of ``point`` is one the journal had and removed (its seq is at
    or below what removal deleted of its publisher)."""
    return any(0 < s <= journal.publisher_floor(h) for h, s in point.bookmarks)


def plan_replay(
    journal: Journal, spec: BookmarkSpec, committed_txid: int, not_found: str
) -> ReplayPlan:
    """Where a replay starts (exclusive txid) and ends (inclusive txid or None).

    Runs in the session's handler, before the processed ack, so a bookmark that is not
    found with ``bookmark_not_found=fail`` fails the subscribe command itself. Cheap:
    index lookups plus at most one time-index step of records.

    Raises:
        BookmarkNotFound: none of the bookmarks is in the journal and not_found is fail.
    """
    start, resumed_from, missing = _resolve_point(journal, spec.start, committed_txid, not_found)
    if spec.start_inclusive and spec.start.kind in ("bookmarks", "now") and start > 0:
        start -= 1
        resumed_from = ""  # the replay includes it: it resumes before it
    end = None
    if spec.end is not None:
        end = _resolve_end(journal, spec.end, spec.end_inclusive, committed_txid)
    return ReplayPlan(start, end, resumed_from, missing)


def plan_subscription(
    instance: SessionHost, sub: Subscription, header: dict[str, Any]
) -> ReplayPlan:
    """Where the replay of bookmark subscription ``sub`` (its ``bm`` and
    ``bookmark_not_found`` in ``header``) starts and ends, checked before the
    subscription is registered.

    Raises:
        CommandFailed: no transaction log, a topic it does not record, a malformed
            bookmark or option, none of the bookmarks held with
            ``bookmark_not_found=fail``, or a corrupt journal record; the detail says
            how to fix it.
    """
    if instance.journal is None:
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            "bookmark subscriptions need a transaction log; add a TransactionLog "
            "with a Topic that covers this topic",
        )
    if sub.regex is None and not instance.journals_topic(sub.topic, sub.message_type):
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"topic {sub.topic!r} ({sub.message_type}) is not recorded in the transaction "
            "log, so it cannot be replayed; add a TransactionLog/Topic whose Name matches "
            "it, with that MessageType",
        )
    try:
        spec = parse_bookmark_spec(str(header["bm"]))
    except BadBookmarkSpec as exc:
        raise CommandFailed(exc.reason, str(exc)) from None
    not_found = bookmark_not_found(header)
    assert instance.writer is not None and instance.journal is not None
    try:
        return plan_replay(instance.journal, spec, instance.writer.committed_txid, not_found)
    except BookmarkNotFound:
        raise CommandFailed(
            reasons.BOOKMARK_NOT_FOUND,
            f"none of the bookmarks {str(header['bm'])[:200]!r} is in this instance's "
            "journal (bookmark_not_found=fail); resubscribe with a bookmark it holds, "
            "or with bookmark_not_found=epoch or now",
        ) from None
    except CorruptRecord as exc:
        raise CommandFailed(reasons.JOURNAL_CORRUPT, str(exc)) from None


async def persisted_acks(session: Session, sub: Subscription) -> None:
    """Every :data:`PERSISTED_ACK_INTERVAL` while ``sub`` lasts, once it is live: a
    persisted ack with the newest durable bookmark, when it moved."""
    last = ""
    while session.subscriptions.get(sub.sub_id) is sub:
        await trio.sleep(PERSISTED_ACK_INTERVAL)
        bm = session.instance.last_durable_bookmark
        if sub.live and bm and bm != last:
            last = bm
            session.send(messages.subscription_persisted(sub.sub_id, bm))


async def run_replay(
    session: Session,
    sub: Subscription,
    cursor: int,
    end: int | None,
    cid: Any,
    completed_fields: dict[str, Any] | None = None,
) -> None:
    """Replay ``sub`` after txid ``cursor``, then make it live (or end it at ``end``);
    ``completed_fields`` go into its ``completed`` ack."""
    instance = session.instance
    journal = instance.journal
    assert journal is not None
    completed_header: dict[str, Any] = {"cid": cid} if cid is not None else {}
    fields = completed_fields or {}
    replays = instance.active_replays
    key = id(sub)
    replays.reading(key, cursor)
    # while it runs, the session is never offlined (see flow.disconnect_slow_clients)
    session.replaying += 1
    try:
        while True:
            if session.subscriptions.get(sub.sub_id) is not sub:
                return  # unsubscribed meanwhile
            visible = instance.visible_txid(sub.fully_durable)
            limit = visible if end is None else min(end, visible)
            if cursor >= limit:
                if end is not None and cursor >= end:
                    _finish_range(session, sub, completed_header, fields)
                    return
                if end is None:
                    # seam: no await between the check above and going live
                    sub.delivered_upto = cursor
                    sub.live = True
                    instance.registry.changed()
                    if "completed" in sub.acks:
                        _completed_ack(session, sub, completed_header, fields)
                    if "stats" in sub.acks:
                        _stats_ack(session, sub, completed_header)
                    return
                # a range whose end lies in the future: wait for new commits
                await instance.wait_for_commit(cursor, durable=sub.fully_durable)
                continue
            # Read on this thread: py-lmdb releases the GIL per cursor step, so a worker
            # thread would crawl beside the busy event loop (see JournalWriter._append).
            batch, damage = journal.read_views(cursor, REPLAY_BATCH, limit)
            if damage is not None:
                instance.delivery.replay(sub, batch)
                raise damage
            if not batch:
                cursor = limit
                continue
            instance.delivery.replay(sub, batch)
            cursor = batch[-1].txid
            replays.reading(key, cursor)
            sub.delivered_upto = cursor
            await session.wait_outbox_below()
            await trio.lowlevel.checkpoint()
    except CorruptRecord as exc:
        # a record that fails its CRC, or a damaged LMDB page (UnreadableRecords, a
        # txid range): the records before it went out, nothing of it does
        log.error(
            "replay for client %r subscription %r stopped at damage in journal %s: %s",
            session.client_name,
            sub.sub_id,
            journal.path,
            exc,
            extra=events.extra(events.JOURNAL_CORRUPT_RECORD),
        )
        session.subscription_failed(sub, cid, reasons.JOURNAL_CORRUPT, str(exc))
    finally:
        session.replaying -= 1
        replays.ended(key)


def _completed_ack(
    session: Session, sub: Subscription, header: dict[str, Any], extra: dict[str, Any]
) -> None:
    """The ``completed`` ack at the seam: its ``bm`` is the last message this
    subscription replayed (or the bookmark it resumed after), never a record of another
    topic or publisher that happens to sit at the seam; clients store it as their
    resume point. No ``bm`` when nothing was replayed and nothing resumed from."""
    fields: dict[str, Any] = {"sub_id": sub.sub_id, **extra}
    if sub.resume_bookmark:
        fields["bm"] = sub.resume_bookmark
    session.ack(header, "completed", **fields)


def _finish_range(
    session: Session, sub: Subscription, header: dict[str, Any], extra: dict[str, Any]
) -> None:
    if "completed" in sub.acks:
        _completed_ack(session, sub, header, extra)
    if "stats" in sub.acks:
        _stats_ack(session, sub, header)
    session.end_subscription(sub)


def _stats_ack(session: Session, sub: Subscription, header: dict[str, Any]) -> None:
    """The ``stats`` ack of a bookmark subscription, once its replay reached the seam
    (or its range end): ``records_returned`` = the messages it replayed."""
    session.ack(header, "stats", sub_id=sub.sub_id, records_returned=sub.replayed)
