"""Replication validation on connect (pure): is the downstream configured to be a full
partner for every topic the upstream sends it?

The upstream describes each replicated Topic in its hello (name, message type, filter,
excluded checks, the upstream's SOW topics that the entry covers, with their
MessageType and Key paths, and the upstream's replicated queues that the entry covers,
with the settings that must agree between hosts). The downstream evaluates the checks
against its own config and refuses the link on the first failures, logging the check,
the topic, both sides' settings and the change that fixes it; the upstream logs that
the peer refused validation.

Checks (AMPS Table 25.2), each skipped for a Topic entry whose ExcludeValidation names
it (``queue`` and ``queue_underlying`` cannot be excluded: the config loader refuses
them in ExcludeValidation, and an exclusion of them arriving in a hello is ignored):

- ``txlog``: the downstream's TransactionLog records the topic;
- ``replicate``: the downstream replicates the topic back to the upstream's group;
- ``replicate_filter``: ... with the same Filter the upstream uses;
- ``cascade``: the downstream's own destinations for the topic enforce every check the
  upstream enforces;
- ``sow``: a topic that is a SOW topic on the upstream is a SOW topic on the
  downstream, with the same MessageType (a downstream SOW topic the upstream does not
  have is fine);
- ``keys``: a SOW topic has the same Key paths, in the same order, on both sides
  (compared only when both sides have it: without a downstream SOW topic the ``sow``
  check reports, or was excluded);
- ``queue``: a queue of the upstream (``Queue`` or ``GroupLocalQueue``) is a queue on
  the downstream with the same definition: the queue element (kind), MessageType,
  Semantics, DefaultPublishTarget, InitialOwner, Priority, BarrierExpression and
  Expiration (:data:`QUEUE_FIELDS`). The settings that only shape this instance's own
  deliveries may differ (LeasePeriod, MaxBacklog, MaxPerSubscriptionBacklog,
  MaxDeliveries, MaxCancels, Leasing, FairnessModel);
- ``queue_underlying``: the queue has the same UnderlyingTopic and Filter on both sides
  (when the downstream has it), the upstream replicates the underlying topic to the
  downstream too (some Topic entry of the hello covers it with the queue's MessageType)
  and the downstream's TransactionLog records it. With a regular-expression
  UnderlyingTopic the topic checked is the DefaultPublishTarget, as the config loader
  does for the queue's own TransactionLog;
- ``queue_passthrough``: every destination of the downstream that replicates the queue
  (its Name, with its MessageType) passes through messages received from the
  upstream's group: AMPS requires passthrough for every group that replicates a queue,
  the instance's own group too, or a message whose owner is elsewhere could become
  undeliverable. A downstream without destinations passes.

These three checks apply to a queue the upstream *replicates*: an entry of its
Destination covers the queue's own name. A queue whose underlying topic has another
name and is the only one replicated is *archived* instead (``QueueFacts.archived``; AMPS
replicates such an underlying topic "without replicating the queue itself", e.g. to an
archive or audit instance): its messages go out as a plain topic, and its
acknowledgement and ownership records go with them (see ``routing``). The downstream
then needs no queue, and:

- with no queue and no SOW topic of that name, it is an archive: nothing to check (the
  ``txlog`` check still covers the underlying topic), it journals what it receives;
- with a queue of that name, that queue would apply the upstream's acknowledgements
  and transfers: it must be defined the same way (``queue``, ``queue_underlying``,
  ``queue_passthrough`` as for a replicated queue);
- with a SOW topic of that name, the queue's records would be journaled on a SOW topic
  where they are no SOW records: the ``sow`` check fails (excludable).

A ``LocalQueue`` is never replicated (the config loader refuses a destination that
covers its name) nor archived (its records are its instance's own), so it is never
described and never checked. A hello without SOW facts or queue facts (an older
amps-py) describes no SOW topic or queue, so ``sow``, ``keys`` and the queue checks
pass for it.

Topic names compare as written: a downstream entry covers an upstream entry when it is
the same literal or pattern, when it is ``.*`` or omitted (every topic), or when the
upstream's name is a literal the downstream's pattern matches. SOW topic and queue names
are literal and compare exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final
from xml.sax.saxutils import escape

from amps_py.config.model import (
    NON_EXCLUDABLE_VALIDATION_CHECKS,
    REPLICATION_VALIDATION_CHECKS,
    DestinationConfig,
    InstanceConfig,
    JournalTopic,
    QueueConfig,
    ReplicationTopic,
    SowTopicConfig,
)
from amps_py.config.sow_pattern import journal_covers_pattern

ALL_CHECKS = REPLICATION_VALIDATION_CHECKS

_REGEX_CHARS = frozenset(".*+?[](){}|^$\\")


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


def sow_facts(
    entry: ReplicationTopic, sow_topics: Iterable[SowTopicConfig]
) -> list[dict[str, Any]]:
    """The ``sow_topics`` of a Topic descriptor: the SOW topics ``entry`` (a
    Destination Topic of the upstream) covers, as sent in the hello."""
    return [
        SowFacts(t.name, t.message_type, t.keys, t.pattern).to_wire()
        for t in sow_topics
        if _reaches(entry, t)
    ]


def _reaches(entry: ReplicationTopic, sow: SowTopicConfig) -> bool:
    """Whether ``entry`` replicates records of SOW topic ``sow``: its topic, or for a
    Pattern topic a topic of it (a literal entry the Pattern matches, or an entry
    that provably covers the Pattern: every topic, or the same expression). An entry
    whose expression only overlaps the Pattern is not counted: which of its topics
    meet cannot be proved, and a check must not refuse a link on a guess."""
    if sow.pattern is None:
        return entry.matches(sow.name, sow.message_type)
    if entry.message_type != sow.message_type:
        return False
    if entry.name is None:
        return True
    if not any(ch in _REGEX_CHARS for ch in entry.name):
        return sow.holds(entry.name)
    journal = JournalTopic(entry.name, entry.message_type)
    return journal_covers_pattern((journal,), sow.pattern, sow.message_type)


def queue_facts(
    entry: ReplicationTopic,
    queues: Iterable[QueueConfig],
    destination_topics: Sequence[ReplicationTopic] | None = None,
) -> list[dict[str, Any]]:
    """The ``queues`` of a Topic descriptor: the queues ``entry`` (a Destination Topic
    of the upstream) covers by their name, underlying topic or DefaultPublishTarget,
    as sent in the hello. ``destination_topics`` (default: ``entry`` alone) are every
    Topic of the Destination: a queue whose name none of them covers is described as
    ``archived`` (:meth:`QueueConfig.carried_by`). A LocalQueue is never described."""
    every = (entry,) if destination_topics is None else destination_topics
    described = []
    for q in queues:
        if q.kind == "local" or q.carried_by((entry,)) is None:
            continue
        archived = q.carried_by(every) == "archive"
        described.append(QueueFacts.from_config(q, archived=archived).to_wire())
    return described


def _keys_text(keys: tuple[str, ...]) -> str:
    return ", ".join(keys) if keys else "no Key (explicit keys)"


def _keys_xml(keys: tuple[str, ...]) -> str:
    return "".join(f"<Key>{k}</Key>" for k in keys)


def _sow_failures(
    topic: TopicDescriptor, local: InstanceConfig, upstream_name: str
) -> list[ValidationFailure]:
    """The ``sow`` and ``keys`` failures of the SOW topics ``topic`` covers upstream."""
    failures: list[ValidationFailure] = []
    entry = f"{upstream_name}'s Destination Topic {topic.label}"
    for sow in topic.sow_topics:
        if sow.pattern is not None:
            failures.extend(_pattern_failures(topic, sow, local, upstream_name, entry))
            continue
        mine = local.sow_topic_holding(sow.name)
        if topic.enforces("sow") and mine is None:
            failures.append(
                ValidationFailure(
                    "sow",
                    sow.label,
                    f"{sow.name} is a SOW topic on {upstream_name} (MessageType "
                    f"{sow.message_type}, Key {_keys_text(sow.keys)}) but not on {local.name}",
                    f"add <SOW><Topic><Name>{sow.name}</Name><MessageType>{sow.message_type}"
                    f"</MessageType>{_keys_xml(sow.keys)}</Topic></SOW> to {local.name}'s "
                    f"config, or ExcludeValidation sow on {entry}",
                )
            )
        elif topic.enforces("sow") and mine is not None and mine.message_type != sow.message_type:
            failures.append(
                ValidationFailure(
                    "sow",
                    sow.label,
                    f"SOW topic {sow.name} has MessageType {sow.message_type} on "
                    f"{upstream_name} but {mine.message_type} on {local.name}",
                    f"use the same MessageType for SOW topic {sow.name} on both instances "
                    f"(<MessageType>{sow.message_type}</MessageType> in {local.name}'s SOW "
                    f"Topic), or ExcludeValidation sow on {entry}",
                )
            )
        if topic.enforces("keys") and mine is not None and mine.keys != sow.keys:
            failures.append(
                ValidationFailure(
                    "keys",
                    sow.label,
                    f"SOW topic {sow.name} is keyed by {_keys_text(sow.keys)} on "
                    f"{upstream_name} but by {_keys_text(mine.keys)} on {local.name}",
                    f"give SOW topic {sow.name} the same Key elements in the same order on "
                    f"both instances ({_keys_xml(sow.keys) or 'no <Key>'} in {local.name}'s "
                    f"SOW Topic), or ExcludeValidation keys on {entry}",
                )
            )
    return failures


def _pattern_failures(
    topic: TopicDescriptor,
    sow: SowFacts,
    local: InstanceConfig,
    upstream_name: str,
    entry: str,
) -> list[ValidationFailure]:
    """The ``sow`` and ``keys`` failures of an upstream Pattern SOW topic: the
    downstream must have a SOW topic with the same Pattern (whatever its Name), the
    same MessageType and the same Key paths."""
    assert sow.pattern is not None
    mine = local.sow_pattern(sow.pattern)
    xml = (
        f"<SOW><Topic><Name>{sow.name}</Name><Pattern>{sow.pattern}</Pattern><MessageType>"
        f"{sow.message_type}</MessageType>{_keys_xml(sow.keys)}</Topic></SOW>"
    )
    if mine is None or mine.message_type != sow.message_type:
        if not topic.enforces("sow"):
            return []
        have = (
            f"has it with MessageType {mine.message_type}"
            if mine is not None
            else "has no SOW topic with that Pattern"
        )
        return [
            ValidationFailure(
                "sow",
                sow.label,
                f"SOW topic {sow.name} on {upstream_name} keeps every topic matching "
                f"{sow.pattern} (MessageType {sow.message_type}, Key "
                f"{_keys_text(sow.keys)}), but {local.name} {have}",
                f"add {xml} to {local.name}'s config (a Pattern topic is matched by its "
                f"Pattern; the Name may differ), or ExcludeValidation sow on {entry}",
            )
        ]
    if topic.enforces("keys") and mine.keys != sow.keys:
        return [
            ValidationFailure(
                "keys",
                sow.label,
                f"the SOW topics with Pattern {sow.pattern} are keyed by "
                f"{_keys_text(sow.keys)} on {upstream_name} but by {_keys_text(mine.keys)} "
                f"on {local.name}",
                f"give both the same Key elements in the same order "
                f"({_keys_xml(sow.keys) or 'no <Key>'} in {local.name}'s SOW Topic "
                f"{mine.name}), or ExcludeValidation keys on {entry}",
            )
        ]
    return []


def _setting_text(attr: str, element: str, value: object) -> str:
    """One side's value of a queue setting as logged: ``Semantics at-most-once``,
    ``no Priority``."""
    if attr == "kind":
        return f"a <{QUEUE_ELEMENTS.get(str(value), value)}>"
    if value is None:
        return f"no {element}"
    if attr == "expiration" and isinstance(value, float):
        return f"{element} {value:g}s"
    return f"{element} {value}"


def _setting_xml(attr: str, element: str, value: object) -> str:
    """The XML that gives a queue setting ``value`` (``""``: absent)."""
    if value is None or attr == "kind":
        return ""
    shown = f"{value:g}s" if attr == "expiration" and isinstance(value, float) else str(value)
    return f"<{element}>{escape(shown)}</{element}>"


def _queue_xml(q: QueueFacts) -> str:
    """The ``SOW`` queue element that defines ``q`` on another instance."""
    settings = [("underlying_topic", "UnderlyingTopic", q.underlying_topic)]
    if q.underlying_topic == q.name:
        settings = []
    settings += [(a, e, getattr(q, a)) for a, e in QUEUE_FIELDS + UNDERLYING_FIELDS[1:]]
    body = "".join(_setting_xml(a, e, v) for a, e, v in settings)
    return f"<{q.element}><Name>{escape(q.name)}</Name>{body}</{q.element}>"


def _differences(
    up: QueueFacts,
    down: QueueFacts,
    compared: tuple[tuple[str, str], ...],
    upstream_name: str,
    local_name: str,
) -> tuple[list[str], list[str]]:
    """For each setting in ``compared`` that differs: how it reads on both sides, and
    the change on the downstream that makes it agree."""
    problems, changes = [], []
    for attr, element in compared:
        mine, theirs = getattr(down, attr), getattr(up, attr)
        if mine == theirs:
            continue
        problems.append(
            f"{_setting_text(attr, element, theirs)} on {upstream_name} but "
            f"{_setting_text(attr, element, mine)} on {local_name}"
        )
        if attr == "kind":
            changes.append(f"define it as a <{up.element}>")
        elif theirs is None:
            changes.append(f"remove <{element}>")
        else:
            changes.append(f"set {_setting_xml(attr, element, theirs)}")
    return problems, changes


def _queue_failures(
    topic: TopicDescriptor,
    local: InstanceConfig,
    upstream_name: str,
    upstream_group: str,
    topics: Sequence[TopicDescriptor],
) -> list[ValidationFailure]:
    """The ``queue``, ``queue_underlying`` and ``queue_passthrough`` failures of the
    queues ``topic`` covers upstream (``topics``: every entry of the hello)."""
    failures: list[ValidationFailure] = []
    entry = f"{upstream_name}'s Destination Topic {topic.label}"
    tl = local.transaction_log
    for q in topic.queues:
        if q.kind == "local":
            continue  # never replicated (the config loader refuses it)
        config = local.queue(q.name)
        mine = None if config is None else QueueFacts.from_config(config)
        if q.archived and mine is None:
            failures.extend(_archive_failures(topic, q, local, upstream_name))
            continue
        if mine is None:
            failures.append(
                ValidationFailure(
                    "queue",
                    q.label,
                    f"{q.name} is a queue on {upstream_name} (a <{q.element}>, MessageType "
                    f"{q.message_type}, UnderlyingTopic {q.underlying_topic}) but not on "
                    f"{local.name}",
                    f"add <SOW>{_queue_xml(q)}</SOW> to {local.name}'s config, or stop "
                    f"replicating {q.name} from {upstream_name} to {local.name} (the queue "
                    f"check cannot be excluded). {_archive_hint(q, upstream_name, local.name)}",
                )
            )
        else:
            problems, changes = _differences(q, mine, QUEUE_FIELDS, upstream_name, local.name)
            if problems:
                failures.append(
                    ValidationFailure(
                        "queue",
                        q.label,
                        f"queue {q.name} is defined differently: {'; '.join(problems)}",
                        f"define queue {q.name} the same way on both instances: in "
                        f"{local.name}'s SOW queue {q.name}, {'; '.join(changes)} (the queue "
                        "check cannot be excluded)",
                    )
                )
            problems, changes = _differences(
                q, mine, UNDERLYING_FIELDS, upstream_name, local.name
            )
            if problems:
                failures.append(
                    ValidationFailure(
                        "queue_underlying",
                        q.label,
                        f"queue {q.name} takes other messages: {'; '.join(problems)}",
                        f"give queue {q.name} the same UnderlyingTopic and Filter on both "
                        f"instances: in {local.name}'s SOW queue {q.name}, "
                        f"{'; '.join(changes)} (the queue_underlying check cannot be excluded)",
                    )
                )
        underlying = q.journaled_topic
        topic_xml = (
            f"<Topic><Name>{escape(underlying)}</Name><MessageType>{q.message_type}"
            "</MessageType></Topic>"
        )
        if not any(
            t.message_type == q.message_type and covers(t.name, underlying) for t in topics
        ):
            failures.append(
                ValidationFailure(
                    "queue_underlying",
                    q.label,
                    f"{upstream_name} replicates queue {q.name} to {local.name} but not its "
                    f"underlying topic {underlying} ({q.message_type})",
                    f"add {topic_xml} to {upstream_name}'s Destination to {local.name} (the "
                    "queue_underlying check cannot be excluded)",
                )
            )
        if not (
            tl is not None
            and any(
                t.message_type == q.message_type and covers(t.name, underlying) for t in tl.topics
            )
        ):
            failures.append(
                ValidationFailure(
                    "queue_underlying",
                    q.label,
                    f"{local.name} does not record {underlying} ({q.message_type}), the "
                    f"underlying topic of queue {q.name}, in its transaction log",
                    f"add {topic_xml} to {local.name}'s TransactionLog (the queue_underlying "
                    "check cannot be excluded)",
                )
            )
        if not topic.enforces("queue_passthrough"):
            continue
        for d in local.replication:
            if d.replicates(q.name, q.message_type) and not d.passes_through(upstream_group):
                passing = ", ".join(d.passthrough) if d.passthrough else "none"
                failures.append(
                    ValidationFailure(
                        "queue_passthrough",
                        q.label,
                        f"{local.name} replicates queue {q.name} to {d.name} but does not pass "
                        f"through messages from {upstream_name}'s group {upstream_group} "
                        f"(PassThrough {passing})",
                        f"add <PassThrough>^{upstream_group}$</PassThrough> to {local.name}'s "
                        f"Destination {d.name} (every group that replicates a queue needs "
                        "passthrough, the own group too), or ExcludeValidation "
                        f"queue_passthrough on {entry}",
                    )
                )
    return failures


def _archive_hint(q: QueueFacts, upstream_name: str, local_name: str) -> str:
    """How to send a queue's messages to an instance that should only record them."""
    if q.underlying_topic != q.name:
        how = (
            f"replicate only its underlying topic {q.journaled_topic} (a Destination "
            f"Topic that does not cover {q.name})"
        )
    else:
        how = (
            f"give queue {q.name} an UnderlyingTopic of another name on {upstream_name} "
            "(and every instance that hosts it), and replicate only that topic"
        )
    return (
        f"If {local_name} only archives the queue's messages (an audit instance), {how}: "
        f"{local_name} then journals them and the queue's acknowledgements as a plain "
        "topic, without a queue"
    )


def _archive_failures(
    topic: TopicDescriptor, q: QueueFacts, local: InstanceConfig, upstream_name: str
) -> list[ValidationFailure]:
    """What refuses an archive of queue ``q`` (the downstream has no queue of that
    name): only a SOW topic of that name, where the queue's records would land."""
    sow = local.sow_topic_holding(q.name)
    if sow is None or not topic.enforces("sow"):
        return []
    return [
        ValidationFailure(
            "sow",
            q.label,
            f"{q.name} is a queue on {upstream_name} whose acknowledgement and ownership "
            f"records reach {local.name} with its underlying topic {q.journaled_topic}, "
            f"but {q.name} is a SOW topic on {local.name}, where those records are no SOW "
            "records",
            f"give {local.name}'s SOW topic {q.name} another name, or stop replicating "
            f"{q.journaled_topic} from {upstream_name} to {local.name}, or ExcludeValidation "
            f"sow on {upstream_name}'s Destination Topic {topic.label} if the SOW topic is "
            "meant to ignore them",
        )
    ]


def covers(pattern: str | None, name: str | None) -> bool:
    """Whether a downstream Topic entry ``pattern`` covers an upstream entry ``name``."""
    if pattern is None or pattern in (".*", "^.*$"):
        return True
    if name is None:
        return False
    if pattern == name:
        return True
    if any(ch in _REGEX_CHARS for ch in name):
        return False  # two different patterns: cannot prove coverage
    if any(ch in _REGEX_CHARS for ch in pattern):
        try:
            return re.fullmatch(pattern, name) is not None
        except re.error:
            return False
    return False


def _back_destinations(
    local: InstanceConfig, upstream_name: str, upstream_group: str
) -> list[DestinationConfig]:
    """The downstream's destinations that lead back to the upstream."""
    out = []
    for d in local.replication:
        if d.group is not None:
            if d.group == upstream_group:
                out.append(d)
        elif d.name == upstream_name:
            out.append(d)
    return out


def validate(
    topics: Sequence[TopicDescriptor],
    local: InstanceConfig,
    upstream_name: str,
    upstream_group: str,
) -> list[ValidationFailure]:
    """Every check that fails for the upstream's ``topics`` against ``local`` (the
    downstream's config). Empty when the link may proceed."""
    failures: list[ValidationFailure] = []
    seen: set[str] = set()  # a queue covered by several entries is reported once
    back = _back_destinations(local, upstream_name, upstream_group)
    tl = local.transaction_log
    for topic in topics:
        label = topic.label
        if topic.enforces("txlog"):
            journaled = tl is not None and any(
                t.message_type == topic.message_type and covers(t.name, topic.name)
                for t in tl.topics
            )
            if not journaled:
                failures.append(
                    ValidationFailure(
                        "txlog",
                        label,
                        f"instance {local.name} does not record this topic in its transaction log",
                        f"add <Topic><Name>{topic.name or '.*'}</Name><MessageType>"
                        f"{topic.message_type}</MessageType></Topic> to {local.name}'s "
                        "TransactionLog, or ExcludeValidation txlog on the upstream's Topic",
                    )
                )
        back_topics = [
            (d, t)
            for d in back
            for t in d.topics
            if t.message_type == topic.message_type and covers(t.name, topic.name)
        ]
        if topic.enforces("replicate") and not back_topics:
            failures.append(
                ValidationFailure(
                    "replicate",
                    label,
                    f"instance {local.name} does not replicate this topic back to "
                    f"{upstream_name} (group {upstream_group})",
                    f"add a Destination to {upstream_name} (Group {upstream_group}) covering "
                    f"the topic on {local.name}, or ExcludeValidation replicate on the "
                    "upstream's Topic",
                )
            )
        if (
            topic.enforces("replicate_filter")
            and topic.filter
            and back_topics
            and not any(t.filter == topic.filter for _, t in back_topics)
        ):
            failures.append(
                ValidationFailure(
                    "replicate_filter",
                    label,
                    f"{upstream_name} replicates it with Filter {topic.filter!r} but "
                    f"{local.name} replicates it back with "
                    f"{sorted({t.filter or 'no filter' for _, t in back_topics})}",
                    f"use the same Filter on {local.name}'s Destination back to "
                    f"{upstream_name}, or ExcludeValidation replicate_filter",
                )
            )
        if topic.enforces("cascade"):
            enforced = frozenset(c for c in ALL_CHECKS if topic.enforces(c))
            for d in local.replication:
                for t in d.topics:
                    if t.message_type != topic.message_type or not covers(t.name, topic.name):
                        continue
                    relaxed = enforced & frozenset(t.exclude_validation)
                    if relaxed:
                        failures.append(
                            ValidationFailure(
                                "cascade",
                                label,
                                f"{local.name} replicates it to {d.name} without the check(s) "
                                f"{', '.join(sorted(relaxed))} that {upstream_name} enforces",
                                f"remove ExcludeValidation {','.join(sorted(relaxed))} from "
                                f"{local.name}'s Destination {d.name}, or ExcludeValidation "
                                "cascade on the upstream's Topic",
                            )
                        )
        failures.extend(_sow_failures(topic, local, upstream_name))
        for failure in _queue_failures(topic, local, upstream_name, upstream_group, topics):
            if str(failure) not in seen:
                seen.add(str(failure))
                failures.append(failure)
    return failures


def describe(failures: Iterable[ValidationFailure]) -> str:
    return "; ".join(str(f) for f in failures)
