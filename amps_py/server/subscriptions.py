"""Subscriptions and the registry that finds which ones a message goes to.

Pure bookkeeping: no trio, no I/O. A :class:`Subscription` belongs to one session;
the :class:`SubscriptionRegistry` answers "which live subscriptions match this topic"
with a per-topic cache that is rebuilt when subscriptions change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from amps_py import reasons
from amps_py.protocol.messages import sub_id_part

if TYPE_CHECKING:
    from amps_py.filters import Filter

    from .recipient import Recipient

#: characters that make a subscription topic a regular expression (AMPS rule)
REGEX_CHARS: Final = frozenset(".*+?[](){}|^$\\")


def is_regex_topic(topic: str) -> bool:
    return any(ch in REGEX_CHARS for ch in topic)


class BadTopic(ValueError):
    reason = reasons.BAD_REGEX_TOPIC


def compile_topic(topic: str, non_regex: bool = False) -> re.Pattern[str] | None:
    """The compiled (unanchored) regex for a topic, or None for an exact topic.

    Raises:
        BadTopic: the topic looks like a regex but does not compile.
    """
    if non_regex or not is_regex_topic(topic):
        return None
    try:
        return re.compile(topic)
    except re.error as exc:
        raise BadTopic(
            f"topic {topic!r} is not a valid regular expression ({exc}); escape regex "
            "characters or subscribe with option non_regex_topic"
        ) from None


class EntitledTopics:
    """A topic regex that matches only the topics its user may read.

    What a regex subscription, a SOW query or a replay with a topic expression runs
    when the user's entitlement is not "everything": ``search`` answers a match only
    for a concrete topic that both the regex and ``may_read`` accept, so entitlement is
    decided per topic, never by the pattern's text (docs/GUARANTEES.md, "Security").
    ``may_read`` is the session's cached check.
    """

    __slots__ = ("_may_read", "_regex", "pattern")

    def __init__(self, regex: re.Pattern[str], may_read: Callable[[str], bool]) -> None:
        self._regex = regex
        self._may_read = may_read
        self.pattern = regex.pattern

    def search(self, topic: str) -> re.Match[str] | None:
        found = self._regex.search(topic)
        if found is None or not self._may_read(topic):
            return None
        return found

    def __repr__(self) -> str:
        return f"EntitledTopics({self.pattern!r})"


#: what a subscription or query runs over topic names: None for an exact topic
TopicPattern: TypeAlias = "re.Pattern[str] | EntitledTopics"


class Subscription:
    """One subscription of one session.

    ``live`` is False while a bookmark replay runs; the registry then skips it and
    the replay task delivers. ``delivered_upto`` is the highest journal txid handed to
    this subscription, so a record can never be delivered twice across the seam.
    """

    __slots__ = (
        "acks",
        "bookmark",
        "conflation",
        "delivered_upto",
        "filter",
        "fully_durable",
        "head_suffix",
        "live",
        "message_type",
        "oof_filtered",
        "options",
        "queue",
        "regex",
        "replayed",
        "resume_bookmark",
        "session",
        "skip_seqs",
        "sub_id",
        "topic",
        "want_bookmark",
        "want_timestamp",
    )

    def __init__(
        self,
        session: Recipient,
        sub_id: str,
        topic: str,
        regex: TopicPattern | None,
        filter: Filter | None,
        options: frozenset[str],
        acks: frozenset[str],
        bookmark: bool,
    ) -> None:
        self.session = session
        self.sub_id = sub_id
        self.topic = topic
        self.regex = regex
        self.filter = filter
        self.options = options
        self.acks = acks
        self.bookmark = bookmark
        self.live = not bookmark
        self.delivered_upto = 0
        #: the bookmark of the last message replayed to it, or the one its replay
        #: resumed after: what its ``completed`` ack carries
        self.resume_bookmark = ""
        #: per publisher hash, the highest seq its subscriber already has (from the
        #: bookmarks it resumed from): records at or below it are never delivered,
        #: replayed or live (None: no such skip, the usual case)
        self.skip_seqs: dict[int, int] | None = None
        #: messages its bookmark replay sent (its ``stats`` ack)
        self.replayed = 0
        self.want_bookmark = bookmark or "bookmark" in options
        self.want_timestamp = "timestamp" in options
        self.fully_durable = "fully_durable" in options
        #: told when a SOW record leaves its filter (oof ``match``)
        self.oof_filtered = "oof" in options and filter is not None
        self.head_suffix = sub_id_part(sub_id)
        #: the message type of its session: it receives messages of that type only
        #: (in AMPS each message type has its own topics)
        self.message_type: str = session.message_type
        #: the queue (a ServedQueue) when this is a queue subscription: it is not in
        #: the registry, the queue sends to it
        self.queue: Any = None
        #: a ConflatedDelivery (amps_py.server.conflating) with option ``conflation``:
        #: its messages are held and sent at most once per key per interval
        self.conflation: Any = None

    def topic_matches(self, topic: str) -> bool:
        if self.regex is None:
            return topic == self.topic
        return self.regex.search(topic) is not None

    def __repr__(self) -> str:
        return f"Subscription({self.sub_id!r}, {self.topic!r}, live={self.live})"


class SubscriptionRegistry:
    """All subscriptions of an instance, indexed for matching by topic."""

    def __init__(self) -> None:
        self._exact: dict[str, list[Subscription]] = {}
        self._regex: list[Subscription] = []
        self._cache: dict[str | tuple[str, str], tuple[Subscription, ...]] = {}
        self.count = 0
        #: live subscriptions with option fully_durable (they wait for sync destinations)
        self.fully_durable = 0
        #: subscriptions with option oof and a filter (a SOW update can take a record
        #: out of their focus: oof reason ``match``)
        self.oof_filtered = 0

    def add(self, sub: Subscription) -> None:
        if sub.regex is None:
            self._exact.setdefault(sub.topic, []).append(sub)
        else:
            self._regex.append(sub)
        self.count += 1
        self.fully_durable += sub.fully_durable
        self.oof_filtered += sub.oof_filtered
        self._cache.clear()

    def remove(self, sub: Subscription) -> None:
        try:
            if sub.regex is None:
                subs = self._exact[sub.topic]
                subs.remove(sub)
                if not subs:
                    del self._exact[sub.topic]
            else:
                self._regex.remove(sub)
        except (KeyError, ValueError):
            return
        self.count -= 1
        self.fully_durable -= sub.fully_durable
        self.oof_filtered -= sub.oof_filtered
        self._cache.clear()

    def changed(self) -> None:
        """Call after a subscription's ``live`` flag flips."""
        self._cache.clear()

    def match(self, topic: str, message_type: str = "json") -> tuple[Subscription, ...]:
        """Live subscriptions of ``message_type`` whose topic matches ``topic`` (cached
        per topic and type)."""
        key = topic if message_type == "json" else (message_type, topic)
        found = self._cache.get(key)
        if found is None:
            subs = [
                s for s in self._exact.get(topic, ()) if s.live and s.message_type == message_type
            ]
            subs.extend(
                s
                for s in self._regex
                if s.live and s.message_type == message_type and s.regex.search(topic)  # type: ignore[union-attr]
            )
            found = tuple(subs)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = found
        return found

    def all(self) -> list[Subscription]:
        out = [s for subs in self._exact.values() for s in subs]
        out.extend(self._regex)
        return out
