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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import events, reasons
from amps_py.protocol import messages
from amps_py.protocol.server.commands import CommandFailed, bookmark_not_found
from txlog import CorruptRecord, EarliestAbove

from .bookmark_spec import BadBookmarkSpec, parse_bookmark_spec
from .replay_plan import BookmarkNotFound, ReplayPlan, plan_replay

if TYPE_CHECKING:
    from .command_session import CommandSession
    from .host import SessionHost
    from .subscriptions import Subscription

log = logging.getLogger("amps_py.server.replay")


#: records per journal read; about a millisecond of event-loop time
REPLAY_BATCH: Final = 512
#: bookmark-index entries a replay's search for its start reads between checkpoints
SEARCH_STEP: Final = 2048
#: how often bookmark subscriptions that asked for persisted acks get one
PERSISTED_ACK_INTERVAL: Final = 1.0


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


async def persisted_acks(session: CommandSession, sub: Subscription) -> None:
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
    session: CommandSession,
    sub: Subscription,
    cursor: int,
    end: int | None,
    cid: Any,
    completed_fields: dict[str, Any] | None = None,
    searches: Sequence[EarliestAbove] = (),
) -> None:
    """Replay ``sub`` after txid ``cursor``, then make it live (or end it at ``end``);
    ``completed_fields`` go into its ``completed`` ack. ``searches`` (a plan's
    unfinished :attr:`ReplayPlan.searches`) are finished first, in steps between which
    other tasks run, and the replay starts no later than just before each one's
    earliest record."""
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
        if searches:
            # nothing may be removed while the start is not known yet
            replays.reading(key, min(cursor, journal.removed_through))
            cursor = await _finish_searches(searches, cursor)
            if session.subscriptions.get(sub.sub_id) is not sub:
                return
            replays.reading(key, cursor)
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


async def _finish_searches(searches: Sequence[EarliestAbove], cursor: int) -> int:
    """Finish each search, :data:`SEARCH_STEP` index entries at a time; the replay
    start: ``cursor``, or just before the earliest record a search found if lower.

    Raises:
        CorruptRecord: a damaged page of the bookmark index.
    """
    for search in searches:
        while not search.step(SEARCH_STEP):
            await trio.lowlevel.checkpoint()
        if search.earliest is not None:
            cursor = min(cursor, search.earliest - 1)
    return cursor


def _completed_ack(
    session: CommandSession, sub: Subscription, header: dict[str, Any], extra: dict[str, Any]
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
    session: CommandSession, sub: Subscription, header: dict[str, Any], extra: dict[str, Any]
) -> None:
    if "completed" in sub.acks:
        _completed_ack(session, sub, header, extra)
    if "stats" in sub.acks:
        _stats_ack(session, sub, header)
    session.end_subscription(sub)


def _stats_ack(session: CommandSession, sub: Subscription, header: dict[str, Any]) -> None:
    """The ``stats`` ack of a bookmark subscription, once its replay reached the seam
    (or its range end): ``records_returned`` = the messages it replayed."""
    session.ack(header, "stats", sub_id=sub.sub_id, records_returned=sub.replayed)
