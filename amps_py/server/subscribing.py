"""A session's subscription commands: ``subscribe`` (live, or from a bookmark),
``sow_and_subscribe`` (on a SOW topic it is handed to :mod:`.sow_commands`) and
``unsubscribe``.

Each handler takes the session the command came on, as a
:class:`~amps_py.server.command_session.CommandSession`, and acts through its public
methods (``ack``, ``send``, ``require_entitled``, ``end_subscription``,
``start_soon``); like every handler it is synchronous and raises
:class:`~amps_py.protocol.server.commands.CommandFailed` for a command the server
refuses. A bookmark subscription is planned before it is registered
(:func:`~amps_py.server.replay.plan_subscription`), then its replay runs as a task of
the session (:func:`~amps_py.server.replay.run_replay`). None of this is on the
publish path.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from amps_py import events, reasons
from amps_py.protocol import Frame, messages
from amps_py.protocol.server.commands import CommandFailed, ack_types, options, unsubscribe_ids

from .conflating import ConflatedDelivery
from .conflation import conflation_spec
from .option_catalogue import check_options
from .queue_commands import subscribe_to_queue
from .replay import persisted_acks, plan_subscription, run_replay
from .sow_commands import start_sow_and_subscribe
from .subscriptions import Subscription

if TYPE_CHECKING:
    from .command_session import CommandSession

__all__ = [
    "build_subscription",
    "on_sow_and_subscribe",
    "on_subscribe",
    "on_unsubscribe",
    "start_conflation",
]

#: the session's logger: these lines are a session's, as before they moved here
log = logging.getLogger("amps_py.server.session")


def build_subscription(session: CommandSession, header: dict[str, Any]) -> Subscription:
    """The subscription a ``subscribe`` header asks for, checked in this order: a
    topic, options amps-py implements (:mod:`.option_catalogue`), a topic regex that
    compiles and read entitlement (per concrete topic for a regex:
    :meth:`Session.topics_to_read`), ack types, a ``sub_id`` not in use (unless
    ``replace``), a filter that compiles, a conflation key that can be determined. Not
    registered yet (then :func:`start_conflation`).

    Raises:
        CommandFailed: the first check that fails.
    """
    topic = header.get("t")
    if not topic or not isinstance(topic, str):
        raise CommandFailed(reasons.NO_TOPIC, "subscribe needs a topic (t)")
    opts = options(header)
    check_options(str(header.get("c") or "subscribe"), opts)
    conflation = conflation_spec(opts)
    regex = session.topics_to_read(topic, "non_regex_topic" in opts)
    acks = ack_types(header)
    sub_id = str(
        header.get("sub_id") or header.get("cid") or f"sub-{session.instance.next_connection_id()}"
    )
    if sub_id in session.subscriptions and "replace" not in opts:
        raise CommandFailed(
            reasons.SUBID_IN_USE,
            f"this connection already has subscription {sub_id!r}; use another sub_id "
            "or the replace option",
        )
    flt = None
    ftext = header.get("f")
    if ftext:
        flt = session.instance.compile_filter(str(ftext))
    bookmark = "bm" in header and str(header["bm"]).strip() != ""
    sub = Subscription(session, sub_id, topic, regex, flt, frozenset(opts), acks, bookmark)
    if conflation is not None:
        queues = session.instance.queues
        queue = queues.get(topic, session.message_type) if queues else None
        if not bookmark and regex is None and queue is not None:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                f"{topic!r} is a queue: its messages are leased one by one and cannot be "
                "conflated; subscribe without conflation",
            )
        if not conflation.paths:
            _check_sow_key(session, topic, regex)
        if conflation.paths and session.message_type != "json":
            # conflation_key paths read the payload as its type's document
            reader = session.instance.message_types[session.message_type]
            conflation = dataclasses.replace(conflation, document=reader.document)
        sub.conflation = ConflatedDelivery(session, conflation)
    return sub


def _check_sow_key(session: CommandSession, topic: str, regex: object) -> None:
    """Conflation without ``conflation_key`` keys on the SOW key: the topic must be
    one SOW topic.

    Raises:
        CommandFailed: ``invalid options``, saying to add ``conflation_key``.
    """
    sow = session.instance.sow
    if regex is None and sow is not None and sow.get(topic, session.message_type) is not None:
        return
    what = "a regex topic" if regex is not None else f"{topic!r}, not a SOW topic"
    raise CommandFailed(
        reasons.INVALID_OPTIONS,
        f"conflation needs a key: {what} has no SOW key to conflate by; add "
        "conflation_key=[/field] naming the field(s) that identify a message",
    )


def start_conflation(session: CommandSession, sub: Subscription) -> None:
    """Run ``sub``'s conflation (if it has one) once it is registered; it stops when
    the subscription ends (:meth:`Session.end_subscription`) or the session does."""
    if sub.conflation is not None:
        session.start_soon(sub.conflation.run)


def on_subscribe(session: CommandSession, frame: Frame) -> None:
    """``subscribe``: a live subscription at once, or a bookmark replay that goes live
    (a ``sub_id`` in use is replaced with option ``replace``)."""
    header = frame.header
    sub = build_subscription(session, header)
    old = session.subscriptions.get(sub.sub_id)
    if old is not None:
        session.end_subscription(old)
    queues = session.instance.queues
    if queues and not sub.bookmark and sub.regex is None:
        queue = queues.get(sub.topic, session.message_type)
        if queue is not None:
            # a bookmark subscription to a queue replays its topic, as in AMPS
            subscribe_to_queue(session, queue, sub, header)
            return
    if sub.bookmark:
        _start_bookmark_subscription(session, sub, header)
        return
    session.subscriptions[sub.sub_id] = sub
    session.instance.registry.add(sub)
    start_conflation(session, sub)
    if "processed" in sub.acks:
        session.ack(header, "processed", sub_id=sub.sub_id)
    if "stats" in sub.acks:
        # a live subscription has nothing to count yet: the ack says it is in place
        session.ack(header, "stats", sub_id=sub.sub_id, records_returned=0)


def on_sow_and_subscribe(session: CommandSession, frame: Frame) -> None:
    """``sow_and_subscribe``: the query of a SOW topic (or of the SOW topics a regex
    matches) then the subscription, with no update lost or repeated at the seam. On a
    queue, the query part is an empty group and the subscription consumes the queue.

    Raises:
        CommandFailed: ``invalid topic`` for a topic with no State of the World (as
            ``sow`` answers), or no topic.
    """
    header = frame.header
    topic = header.get("t")
    if topic and isinstance(topic, str) and _is_sow_query(session, topic, header):
        sub = build_subscription(session, header)
        old = session.subscriptions.get(sub.sub_id)
        if old is not None:
            session.end_subscription(old)
        start_sow_and_subscribe(session, header, sub)
        start_conflation(session, sub)
        return
    queues = session.instance.queues
    if not (queues and isinstance(topic, str) and queues.get(topic, session.message_type)):
        if not topic or not isinstance(topic, str):
            raise CommandFailed(reasons.NO_TOPIC, "sow_and_subscribe needs a topic (t)")
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"topic {topic!r} has no State of the World, so there is nothing to query: "
            "add a SOW/Topic for it to the config, or send subscribe instead",
        )
    query_id = str(header.get("query_id") or header.get("sub_id") or header.get("cid") or "")
    session.send(messages.group_begin(query_id))
    session.send(messages.group_end(query_id))
    on_subscribe(session, frame)


def _is_sow_query(session: CommandSession, topic: str, header: dict[str, Any]) -> bool:
    """Does ``topic`` name (or, as a regex, match) a SOW topic this user may read?

    Raises:
        CommandFailed: the user may not read ``topic`` (exact) or any topic (regex),
            or the regex does not compile.
    """
    pattern = session.topics_to_read(topic, "non_regex_topic" in options(header))
    sow = session.instance.sow
    if not sow:
        return False
    return bool(sow.matching(pattern, topic, session.message_type))


def _start_bookmark_subscription(
    session: CommandSession, sub: Subscription, header: dict[str, Any]
) -> None:
    plan = plan_subscription(session.instance, sub, header)
    sub.resume_bookmark = plan.resumed_from
    sub.skip_seqs = dict(plan.skip) or None
    session.subscriptions[sub.sub_id] = sub
    session.instance.registry.add(sub)
    start_conflation(session, sub)
    extra: dict[str, Any] = {}
    if plan.not_found:
        # not silent: the client learns where the replay starts instead
        extra["reason"] = plan.not_found
        log.info(
            "subscription %r of client %r: %s",
            sub.sub_id,
            session.client_name,
            plan.not_found,
            extra=events.extra(events.CLIENT_COMMAND_FAILED),
        )
    if "processed" in sub.acks:
        session.ack(header, "processed", sub_id=sub.sub_id, **extra)
    session.start_soon(
        run_replay, session, sub, plan.start, plan.end, header.get("cid"), extra, plan.searches
    )
    if "persisted" in sub.acks:
        session.start_soon(persisted_acks, session, sub)


def on_unsubscribe(session: CommandSession, frame: Frame) -> None:
    """``unsubscribe``: the named subscriptions (those this connection has), or ``all``."""
    header = frame.header
    acks = ack_types(header)
    ids, named = unsubscribe_ids(header)
    subscriptions = session.subscriptions
    if named is None:
        targets = list(subscriptions.values())
    else:
        targets = [subscriptions[i] for i in named if i in subscriptions]
    for sub in targets:
        session.end_subscription(sub)
    if "processed" in acks:
        session.ack(header, "processed", sub_id=ids)
