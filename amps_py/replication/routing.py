"""Replication routing: does a journaled message go to a destination? (pure)

The four rules of AMPS "Understanding Replication Message Routing", in the order
they are cheapest to check:

1. the message is journaled here (the caller only asks about journal records);
2. it has not already passed through the destination's instance (loop prevention:
   the remote instance is not the origin and not on the message's path);
3. it was published directly to this instance, or it was received by replication
   from an instance whose Group matches one of the destination's ``PassThrough``
   regexes;
4. its topic and message type match one of the destination's ``Topic`` entries, and
   that entry's ``Filter`` (if any) matches the payload; or it is a record of a queue
   the destination carries as an archive (its entries cover the queue's underlying
   topic but not its name: ``DestinationConfig.archived_queues``): the queue's
   acknowledgements and ownership transfers, journaled on the queue's name, follow its
   messages, whatever the entry's Filter.

The server's links, the fabric topology check and the Spark audit all call
:meth:`Route.accepts`, so they can never disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from amps_py.config.model import (
    DestinationConfig,
    QueueConfig,
    ReplicationTopic,
    SowTopicConfig,
)
from amps_py.filters import Filter, compile_filter
from amps_py.message_types import MessageTypes, default_types

from .validation import queue_facts, sow_facts


class Routed(Protocol):
    """What routing reads of a message: a journal :class:`~txlog.Record` or a
    :class:`~txlog.RouteView` (decoded without the payload)."""

    @property
    def topic(self) -> str: ...

    @property
    def message_type(self) -> str: ...

    @property
    def origin(self) -> str: ...

    @property
    def path(self) -> tuple[tuple[str, str], ...]: ...


M = TypeVar("M", bound=Routed)
V = TypeVar("V")


@dataclass(frozen=True)
class _TopicRule:
    topic: ReplicationTopic
    filter: Filter | None


class Route:
    """A destination's routing rules, compiled once from its config."""

    def __init__(self, destination: DestinationConfig, types: MessageTypes | None = None) -> None:
        """``types``: how content filters read payloads of each message type (None:
        the default types)."""
        self.destination = destination
        self._types = types if types is not None else default_types()
        self._topics = tuple(
            _TopicRule(t, compile_filter(t.filter) if t.filter else None)
            for t in destination.topics
        )
        #: the queues whose records go with their underlying topic (rule 4)
        self._archived = frozenset(destination.archived_queues)
        self._passes_group: dict[str, bool] = {}
        self._topic_cache: dict[tuple[str, str], tuple[_TopicRule, ...]] = {}
        self._verdicts: dict[tuple[str, str, str, tuple[tuple[str, str], ...], str], Any] = {}

    def passes_through(self, group: str) -> bool:
        """Rule 3 for a message received from an instance of ``group``."""
        known = self._passes_group.get(group)
        if known is None:
            known = self.destination.passes_through(group)
            self._passes_group[group] = known
        return known

    def _rules_for(self, topic: str, message_type: str) -> tuple[_TopicRule, ...]:
        key = (topic, message_type)
        rules = self._topic_cache.get(key)
        if rules is None:
            rules = tuple(r for r in self._topics if r.topic.matches(topic, message_type))
            if not rules and key in self._archived:
                rules = (_TopicRule(ReplicationTopic(None, message_type), None),)
            if len(self._topic_cache) > 100_000:
                self._topic_cache.clear()
            self._topic_cache[key] = rules
        return rules

    def verdict(
        self,
        topic: str,
        message_type: str,
        origin: str,
        path: tuple[tuple[str, str], ...],
        remote_name: str,
    ) -> bool | None:
        """:meth:`accepts` decided without the payload, or ``None`` when a content
        filter must see it. Cached: a fabric has few distinct (topic, type, origin,
        path) combinations, so the send loop pays one dict lookup per record."""
        key = (topic, message_type, origin, path, remote_name)
        known = self._verdicts.get(key, _UNKNOWN)
        if known is _UNKNOWN:
            passes = self.accepts(
                topic=topic,
                message_type=message_type,
                origin=origin,
                path=path,
                payload=_no_payload,
                remote_name=remote_name,
                filters=False,
            )
            unfiltered = any(r.filter is None for r in self._rules_for(topic, message_type))
            known = None if passes and not unfiltered else passes
            if len(self._verdicts) > 100_000:
                self._verdicts.clear()
            self._verdicts[key] = known
        return known  # type: ignore[no-any-return]

    def accepts(
        self,
        *,
        topic: str,
        message_type: str,
        origin: str,
        path: Sequence[tuple[str, str]],
        payload: bytes | Callable[[], bytes],
        remote_name: str,
        filters: bool = True,
    ) -> bool:
        """True when the message goes to this destination, whose instance is
        ``remote_name``. ``path`` lists (instance, group) hops before this instance,
        origin first; it is empty for a message published here. ``payload`` may be a
        function returning it, called only when a content filter needs it.
        ``filters=False`` treats every content filter as matching."""
        # rule 2: never back to an instance the message already went through
        if remote_name == origin:
            return False
        for hop_name, _ in path:
            if hop_name == remote_name:
                return False
        # rule 3: published here, or received from a group we pass through
        if path and not self.passes_through(path[-1][1]):
            return False
        # rule 4: topic, message type, filter
        rules = self._rules_for(topic, message_type)
        if not rules:
            return False
        doc: Any = _UNPARSED
        for rule in rules:
            if rule.filter is None or not filters:
                return True
            if doc is _UNPARSED:
                raw = payload if isinstance(payload, bytes) else payload()
                doc = self._types.document(message_type, raw)
            if rule.filter.matches(doc):
                return True
        return False

    def select(
        self,
        messages: Iterable[M],
        values: Iterable[V],
        remote_name: str,
        payload: Callable[[M], bytes],
    ) -> list[V]:
        """The ``values`` (one per message, in step) of the ``messages`` that go to this
        destination, whose instance is ``remote_name``, in order.

        Each message is decided by its cached :meth:`verdict`; only when a content
        filter must see it is ``payload(message)`` called (it may decode or decompress
        the stored record).

        Raises:
            ValueError: ``messages`` and ``values`` differ in length.
        """
        verdict = self.verdict
        accepts = self.accepts
        selected: list[V] = []
        for message, value in zip(messages, values, strict=True):
            ok = verdict(
                message.topic, message.message_type, message.origin, message.path, remote_name
            )
            if ok is None:  # a content filter decides
                ok = accepts(
                    topic=message.topic,
                    message_type=message.message_type,
                    origin=message.origin,
                    path=message.path,
                    payload=functools.partial(payload, message),
                    remote_name=remote_name,
                )
            if ok:
                selected.append(value)
        return selected

    def describe_topics(
        self, sow_topics: Sequence[SowTopicConfig] = (), queues: Sequence[QueueConfig] = ()
    ) -> list[dict[str, Any]]:
        """The topic descriptors sent in the handshake (for validation on connect; see
        :mod:`.validation`); ``sow_topics`` and ``queues``: this instance's SOW topics
        and queues, each described in the entries that cover it (the key is left out
        when an entry covers none)."""
        described = []
        for t in self.destination.topics:
            entry: dict[str, Any] = {
                "name": t.name,
                "message_type": t.message_type,
                "filter": t.filter,
                "exclude_validation": list(t.exclude_validation),
            }
            covered = sow_facts(t, sow_topics)
            if covered:
                entry["sow_topics"] = covered
            replicated = queue_facts(t, queues, self.destination.topics)
            if replicated:
                entry["queues"] = replicated
            described.append(entry)
        return described


class _Unparsed:
    pass


_UNPARSED: Any = _Unparsed()


_UNKNOWN: Any = object()


def _no_payload() -> bytes:
    raise AssertionError("a routing verdict never reads the payload")
