"""Handing messages to subscriptions: live fan-out and replayed batches (no trio, no
I/O: it queues frames on sessions, which write them).

The frames are built from :mod:`amps_py.protocol.messages` pieces. The topic head is
cached per topic; a message matched by several subscriptions of one connection goes
out once with ``sids``; a replayed batch leaves in one buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from amps_py.message_types import MessageTypes, default_types
from amps_py.protocol.messages import (
    bookmark_part,
    bookmark_part_of,
    correlation_part,
    frame_head,
    sids_part,
    sow_key_part,
    timestamp_part,
    topic_head,
)
from txlog.record import Kind

from .counters import Counters

if TYPE_CHECKING:
    from txlog.record import DeliveryView

    from .recipient import Recipient
    from .subscriptions import Subscription

#: a SOW delete is a journal record, never a message
_SOW_DELETE: Final = int(Kind.SOW_DELETE)

#: the topic-head cache is emptied past this many topics
_MAX_CACHED_TOPICS: Final = 100_000


class _Unparsed:
    pass


_UNPARSED: Any = _Unparsed()


class Delivery:
    """Builds delivery frames and queues them on the subscribers' sessions."""

    def __init__(self, counters: Counters, types: MessageTypes | None = None) -> None:
        self._counters = counters
        #: how each message type's payload is read for filters
        self.types = types if types is not None else default_types()
        self._heads: dict[str, bytes] = {}

    def topic_head(self, topic: str) -> bytes:
        head = self._heads.get(topic)
        if head is None:
            head = topic_head(topic)
            if len(self._heads) > _MAX_CACHED_TOPICS:
                self._heads.clear()
            self._heads[topic] = head
        return head

    def fan_out(
        self,
        topic: str,
        payload: bytes,
        bookmark: str,
        txid: int,
        subs: Sequence[Subscription],
        correlation_id: Any,
        local_ts: int,
        sow_key: str = "",
        message_type: str = "json",
        pub_hash: int = 0,
        seq: int = 0,
    ) -> None:
        """Deliver one message to the matching live subscriptions (all of
        ``message_type``: :meth:`SubscriptionRegistry.match` chose them).

        ``txid`` (0 for a topic that is not journaled) guards against delivering a
        record twice across the replay/live seam; ``local_ts`` (µs) is the journal
        time, or 0 (then "now" is used for the ``timestamp`` option). ``pub_hash`` and
        ``seq`` (of a journaled record) leave out the subscriptions that resumed past
        that seq of that publisher (``Subscription.skip_seqs``).
        """
        chosen = _matching(
            subs, payload, txid, topic, self._counters, self.types, message_type, pub_hash, seq
        )
        if not chosen:
            return
        head = self.topic_head(topic)
        tail = correlation_part(correlation_id)
        if sow_key:
            tail += sow_key_part(sow_key)
        bm = bookmark_part(bookmark)
        size = len(payload)
        held = [sub for sub in chosen if sub.conflation is not None]
        if held:
            # conflated subscriptions: the frame is held by key and counted when sent
            for sub in held:
                header = head + sub.head_suffix
                if sub.want_bookmark:
                    header += bm
                if sub.want_timestamp:
                    header += timestamp_part(local_ts)
                frame = frame_head(header + tail, size) + payload
                sub.conflation.offer(sub.conflation.key_of(topic, payload, sow_key), frame)
            chosen = [sub for sub in chosen if sub.conflation is None]
            if not chosen:
                return
        groups = _by_session(chosen)
        if groups is None:
            for sub in chosen:
                header = head + sub.head_suffix
                if sub.want_bookmark:
                    header += bm
                if sub.want_timestamp:
                    header += timestamp_part(local_ts)
                _send(sub.session, frame_head(header + tail, size), payload)
        else:
            for session, group in groups.items():
                header = head + group[0].head_suffix
                if len(group) > 1:
                    header += sids_part(s.sub_id for s in group)
                if any(s.want_bookmark for s in group):
                    header += bm
                if any(s.want_timestamp for s in group):
                    header += timestamp_part(local_ts)
                _send(session, frame_head(header + tail, size), payload)
        self._counters.count_delivered(len(chosen))

    def _replay_doc(self, topic: str, txid: int, payload: bytes, message_type: str) -> Any:
        """A replayed payload as a document for a filter (None, counted, when it is
        not a well-formed message of its type)."""
        doc = self.types.document(message_type, payload)
        if doc is None:
            self._counters.count_unparsed(topic, txid)
        return doc

    def replay(self, sub: Subscription, views: list[DeliveryView]) -> None:
        """Send replayed records (already read from the journal) that ``sub`` wants,
        in one buffer; remember the last one as its resume point. A record of a
        publisher at or below the seq ``sub`` resumed from (``skip_seqs``) is not sent."""
        session = sub.session
        skip = sub.skip_seqs
        flt = sub.filter
        want_ts = sub.want_timestamp
        exact = sub.regex is None
        suffix = sub.head_suffix
        conflation = sub.conflation
        parts: list[bytes] = []
        append = parts.append
        last = None
        mtype = sub.message_type
        for view in views:
            topic = view.topic
            if (topic != sub.topic) if exact else not sub.topic_matches(topic):
                continue
            if view.kind >= _SOW_DELETE or view.message_type != mtype:
                # a SOW delete or queue ack is not a message (oof: live only); a
                # message of another type is on another topic
                continue
            if skip is not None and view.seq <= skip.get(view.pub_hash, -1):
                continue  # the subscriber has it (it resumed past it)
            payload = view.payload
            if flt is not None and not flt.matches(
                self._replay_doc(topic, view.txid, payload, mtype)
            ):
                continue
            last = view
            header = self.topic_head(topic) + suffix + bookmark_part_of(view.pub_hash, view.seq)
            header += correlation_part(view.correlation_id)
            if view.sow_key:
                header += sow_key_part(view.sow_key)
            if want_ts:
                header += timestamp_part(view.local_ts)
            if conflation is not None:
                # held by key like a live message (counted when sent)
                key = conflation.key_of(topic, payload, view.sow_key)
                conflation.offer(key, frame_head(header, len(payload)) + payload)
                continue
            append(frame_head(header, len(payload)))
            append(payload)
        n = len(parts) // 2
        if last is not None:
            if parts:
                session.send(b"".join(parts))
            sub.resume_bookmark = f"{last.pub_hash}|{last.seq}|"
        session.messages_out += n
        sub.replayed += n
        self._counters.count_delivered(n)


def _matching(
    subs: Sequence[Subscription],
    payload: bytes,
    txid: int,
    topic: str,
    counters: Counters,
    types: MessageTypes,
    message_type: str,
    pub_hash: int,
    seq: int,
) -> list[Subscription]:
    """The subscriptions that take this message: not delivered to yet (``txid``), not
    resumed past its seq (``skip_seqs``), and their content filter matches (the
    payload is parsed once, only if needed; when it is not JSON, that is counted for
    ``topic`` once and every filter sees None)."""
    doc: Any = _UNPARSED
    chosen: list[Subscription] = []
    for sub in subs:
        if txid and txid <= sub.delivered_upto:
            continue
        skip = sub.skip_seqs
        if skip is not None and txid and seq <= skip.get(pub_hash, -1):
            continue  # the subscriber has it (it resumed past it)
        if sub.filter is not None:
            if doc is _UNPARSED:
                doc = types.document(message_type, payload)
                if doc is None:
                    counters.count_unparsed(topic, txid)
            if not sub.filter.matches(doc):
                continue
        if txid:
            sub.delivered_upto = txid
        chosen.append(sub)
    return chosen


def _by_session(chosen: list[Subscription]) -> dict[Recipient, list[Subscription]] | None:
    """The subscriptions grouped by connection, or None when each has its own (the
    usual case: one frame each)."""
    if len(chosen) < 2:
        return None
    groups: dict[Recipient, list[Subscription]] = {}
    for sub in chosen:
        groups.setdefault(sub.session, []).append(sub)
    return None if len(groups) == len(chosen) else groups


def _send(session: Recipient, head: bytes, payload: bytes) -> None:
    session.send(head)
    session.send(payload)
    session.messages_out += 1
