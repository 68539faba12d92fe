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

from collections.abc import Iterable, Sequence
from typing import Any

from amps_py.config.model import (
    REPLICATION_VALIDATION_CHECKS,
    DestinationConfig,
    InstanceConfig,
    JournalTopic,
    QueueConfig,
    ReplicationTopic,
    SowTopicConfig,
)
from amps_py.config.sow_pattern import journal_covers_pattern

from .validation_facts import (
    QUEUE_ELEMENTS,
    QUEUE_FIELDS,
    REGEX_CHARS,
    UNDERLYING_FIELDS,
    QueueFacts,
    SowFacts,
    TopicDescriptor,
    ValidationFailure,
    covers,
)
from .validation_queues import queue_failures

__all__ = [
    "ALL_CHECKS",
    "QUEUE_ELEMENTS",
    "QUEUE_FIELDS",
    "UNDERLYING_FIELDS",
    "QueueFacts",
    "SowFacts",
    "TopicDescriptor",
    "ValidationFailure",
    "covers",
    "describe",
    "queue_facts",
    "sow_facts",
    "validate",
]

ALL_CHECKS = REPLICATION_VALIDATION_CHECKS


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
    if not any(ch in REGEX_CHARS for ch in entry.name):
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
            failures.extend(_cascade_failures(topic, local, upstream_name))
        failures.extend(_sow_failures(topic, local, upstream_name))
        for failure in queue_failures(topic, local, upstream_name, upstream_group, topics):
            if str(failure) not in seen:
                seen.add(str(failure))
                failures.append(failure)
    return failures


def _cascade_failures(
    topic: TopicDescriptor, local: InstanceConfig, upstream_name: str
) -> list[ValidationFailure]:
    """The ``cascade`` failures of ``topic``: the downstream's own destinations for it
    must enforce every check the upstream enforces."""
    failures: list[ValidationFailure] = []
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
                        topic.label,
                        f"{local.name} replicates it to {d.name} without the check(s) "
                        f"{', '.join(sorted(relaxed))} that {upstream_name} enforces",
                        f"remove ExcludeValidation {','.join(sorted(relaxed))} from "
                        f"{local.name}'s Destination {d.name}, or ExcludeValidation "
                        "cascade on the upstream's Topic",
                    )
                )
    return failures


def describe(failures: Iterable[ValidationFailure]) -> str:
    return "; ".join(str(f) for f in failures)
