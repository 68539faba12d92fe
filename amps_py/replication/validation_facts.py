"""The facts replication validation compares (pure): what an upstream's hello says of
each replicated Topic (:class:`TopicDescriptor`, with its :class:`SowFacts` and
:class:`QueueFacts`), a failed check (:class:`ValidationFailure`) and when a downstream
Topic entry covers an upstream one (:func:`covers`). The checks are
:mod:`.validation`'s, which re-exports these names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Final

from amps_py.config.model import NON_EXCLUDABLE_VALIDATION_CHECKS, QueueConfig

__all__ = [
    "QUEUE_ELEMENTS",
    "QUEUE_FIELDS",
    "REGEX_CHARS",
    "UNDERLYING_FIELDS",
    "QueueFacts",
    "SowFacts",
    "TopicDescriptor",
    "ValidationFailure",
    "covers",
]

#: characters that make a topic name a regular expression
REGEX_CHARS: Final = frozenset(".*+?[](){}|^$\\")


@dataclass(frozen=True)
class SowFacts:
    """What the upstream says of one of its SOW topics: its literal name, message type,
    Key paths in order (``()``: publishers send explicit keys) and its ``Pattern``
    (``None``: none; on the wire only when set, so an older peer reads the rest). A
    Pattern topic is compared by its Pattern, not by its Name (the Name only names
    the store, and may differ between instances)."""

    name: str
    message_type: str
    keys: tuple[str, ...]
    pattern: str | None = None

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> SowFacts:
        pattern = raw.get("pattern")
        return cls(
            name=str(raw["name"]),
            message_type=str(raw.get("message_type", "json")),
            keys=tuple(str(k) for k in raw.get("keys") or ()),
            pattern=str(pattern) if pattern is not None else None,
        )

    def to_wire(self) -> dict[str, Any]:
        wire = {"name": self.name, "message_type": self.message_type, "keys": list(self.keys)}
        if self.pattern is not None:
            wire["pattern"] = self.pattern
        return wire

    @property
    def label(self) -> str:
        if self.pattern is not None:
            return f"Pattern {self.pattern} ({self.message_type})"
        return f"{self.name} ({self.message_type})"


#: The queue element of each :attr:`QueueFacts.kind`.
QUEUE_ELEMENTS: Final = {
    "distributed": "Queue",
    "group-local": "GroupLocalQueue",
    "local": "LocalQueue",
}
#: The settings the ``queue`` check compares: (QueueFacts attribute, XML element);
#: ``kind`` is the queue element itself.
QUEUE_FIELDS: Final = (
    ("kind", ""),
    ("message_type", "MessageType"),
    ("semantics", "Semantics"),
    ("default_publish_target", "DefaultPublishTarget"),
    ("initial_owner", "InitialOwner"),
    ("priority", "Priority"),
    ("barrier_expression", "BarrierExpression"),
    ("expiration", "Expiration"),
)
#: The settings the ``queue_underlying`` check compares.
UNDERLYING_FIELDS: Final = (("underlying_topic", "UnderlyingTopic"), ("filter", "Filter"))


@dataclass(frozen=True)
class QueueFacts:
    """What the upstream says of one of its replicated queues: the settings that must
    agree between the hosts of a queue (see :data:`QUEUE_FIELDS` and
    :data:`UNDERLYING_FIELDS`). ``expiration`` is in seconds; ``None`` is an absent
    optional setting."""

    name: str
    kind: str = "distributed"
    message_type: str = "json"
    underlying_topic: str = ""
    underlying_is_regex: bool = False
    semantics: str = "at-least-once"
    default_publish_target: str | None = None
    initial_owner: str | None = None
    priority: str | None = None
    barrier_expression: str | None = None
    expiration: float | None = None
    filter: str | None = None
    #: the upstream archives the queue to this downstream instead of replicating it:
    #: no entry covers the queue's name, one covers its underlying topic
    archived: bool = False

    @classmethod
    def from_config(cls, q: QueueConfig, *, archived: bool = False) -> QueueFacts:
        return cls(
            name=q.name,
            kind=q.kind,
            message_type=q.message_type,
            underlying_topic=q.underlying_topic,
            underlying_is_regex=q.underlying_is_regex,
            semantics=q.semantics,
            default_publish_target=q.default_publish_target,
            initial_owner=q.initial_owner,
            priority=q.priority,
            barrier_expression=q.barrier_expression,
            expiration=q.expiration,
            filter=q.filter,
            archived=archived,
        )

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> QueueFacts:
        """The facts of a ``queues`` item (type-checked by :mod:`.hello`); a missing
        key takes the queue default (the underlying topic defaults to the name)."""
        name = str(raw["name"])
        expiration = raw.get("expiration")
        return cls(
            name=name,
            kind=str(raw.get("kind", "distributed")),
            message_type=str(raw.get("message_type", "json")),
            underlying_topic=str(raw.get("underlying_topic") or name),
            underlying_is_regex=bool(raw.get("underlying_is_regex", False)),
            semantics=str(raw.get("semantics", "at-least-once")),
            default_publish_target=raw.get("default_publish_target"),
            initial_owner=raw.get("initial_owner"),
            priority=raw.get("priority"),
            barrier_expression=raw.get("barrier_expression"),
            expiration=None if expiration is None else float(expiration),
            filter=raw.get("filter"),
            archived=bool(raw.get("archived", False)),
        )

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def label(self) -> str:
        return f"{self.name} ({self.message_type})"

    @property
    def element(self) -> str:
        """The queue's XML element (``Queue``, ``GroupLocalQueue``, ``LocalQueue``)."""
        return QUEUE_ELEMENTS.get(self.kind, self.kind)

    @property
    def journaled_topic(self) -> str:
        """The topic that must be replicated and journaled for the queue: the
        underlying topic, or with a regular expression the DefaultPublishTarget (as
        the config loader checks the queue's own TransactionLog)."""
        if self.underlying_is_regex and self.default_publish_target:
            return self.default_publish_target
        return self.underlying_topic


@dataclass(frozen=True)
class TopicDescriptor:
    """A replicated Topic as the upstream describes it in the hello.

    ``sow_topics``: the upstream's SOW topics this entry covers; empty when there are
    none, and when the hello carries no ``sow_topics`` (an older amps-py). ``queues``:
    likewise the upstream's replicated queues this entry covers.
    """

    name: str | None
    message_type: str
    filter: str | None
    excluded: frozenset[str]
    sow_topics: tuple[SowFacts, ...] = ()
    queues: tuple[QueueFacts, ...] = ()

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> TopicDescriptor:
        excluded = raw.get("exclude_validation") or ()
        return cls(
            name=raw.get("name"),
            message_type=str(raw.get("message_type", "json")),
            filter=raw.get("filter") or None,
            excluded=frozenset(str(x) for x in excluded),
            sow_topics=tuple(SowFacts.from_wire(t) for t in raw.get("sow_topics") or ()),
            queues=tuple(QueueFacts.from_wire(q) for q in raw.get("queues") or ()),
        )

    def enforces(self, check: str) -> bool:
        """Whether ``check`` runs for this entry: unless excluded, and always for the
        checks that cannot be excluded (an exclusion of them in a hello is ignored)."""
        return check in NON_EXCLUDABLE_VALIDATION_CHECKS or check not in self.excluded

    @property
    def label(self) -> str:
        return f"{self.name or '(every topic)'} ({self.message_type})"


@dataclass(frozen=True)
class ValidationFailure:
    check: str
    topic: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"check {self.check} failed for topic {self.topic}: {self.problem}. Fix: {self.fix}"


def covers(pattern: str | None, name: str | None) -> bool:
    """Whether a downstream Topic entry ``pattern`` covers an upstream entry ``name``."""
    if pattern is None or pattern in (".*", "^.*$"):
        return True
    if name is None:
        return False
    if pattern == name:
        return True
    if any(ch in REGEX_CHARS for ch in name):
        return False  # two different patterns: cannot prove coverage
    if any(ch in REGEX_CHARS for ch in pattern):
        try:
            return re.fullmatch(pattern, name) is not None
        except re.error:
            return False
    return False
