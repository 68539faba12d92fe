"""Replication validation on connect (pure): is the downstream configured to be a full
partner for every topic the upstream sends it?

The upstream describes each replicated Topic in its hello (name, message type, filter,
excluded checks, and the upstream's SOW topics that the entry covers, with their
MessageType and Key paths). The downstream evaluates the checks against its own config
and refuses the link on the first failures, logging the check, the topic, both sides'
settings and the change that fixes it; the upstream logs that the peer refused
validation.

Checks (AMPS Table 25.2), each skipped for a Topic entry whose ExcludeValidation names
it (``queue`` and ``queue_underlying`` cannot be excluded):

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
- ``queue``, ``queue_passthrough``, ``queue_underlying``: amps-py has no queues yet, so
  they compare declared configuration that is empty on both sides and always pass.

A hello without SOW facts (an older amps-py) describes no SOW topic, so ``sow`` and
``keys`` pass for it.

Topic names compare as written: a downstream entry covers an upstream entry when it is
the same literal or pattern, when it is ``.*`` or omitted (every topic), or when the
upstream's name is a literal the downstream's pattern matches. SOW topic names are
literal and compare exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from amps_py.config.model import (
    REPLICATION_VALIDATION_CHECKS,
    DestinationConfig,
    InstanceConfig,
    ReplicationTopic,
    SowTopicConfig,
)

ALL_CHECKS = REPLICATION_VALIDATION_CHECKS

_REGEX_CHARS = frozenset(".*+?[](){}|^$\\")


@dataclass(frozen=True)
class SowFacts:
    """What the upstream says of one of its SOW topics: its literal name, message type
    and Key paths in order (``()``: publishers send explicit keys)."""

    name: str
    message_type: str
    keys: tuple[str, ...]

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> SowFacts:
        return cls(
            name=str(raw["name"]),
            message_type=str(raw.get("message_type", "json")),
            keys=tuple(str(k) for k in raw.get("keys") or ()),
        )

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "message_type": self.message_type, "keys": list(self.keys)}

    @property
    def label(self) -> str:
        return f"{self.name} ({self.message_type})"


@dataclass(frozen=True)
class TopicDescriptor:
    """A replicated Topic as the upstream describes it in the hello.

    ``sow_topics``: the upstream's SOW topics this entry covers; empty when there are
    none, and when the hello carries no ``sow_topics`` (an older amps-py).
    """

    name: str | None
    message_type: str
    filter: str | None
    excluded: frozenset[str]
    sow_topics: tuple[SowFacts, ...] = ()

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> TopicDescriptor:
        excluded = raw.get("exclude_validation") or ()
        return cls(
            name=raw.get("name"),
            message_type=str(raw.get("message_type", "json")),
            filter=raw.get("filter") or None,
            excluded=frozenset(str(x) for x in excluded),
            sow_topics=tuple(SowFacts.from_wire(t) for t in raw.get("sow_topics") or ()),
        )

    def enforces(self, check: str) -> bool:
        return check not in self.excluded

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
        SowFacts(t.name, t.message_type, t.keys).to_wire()
        for t in sow_topics
        if entry.matches(t.name, t.message_type)
    ]


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
        mine = local.sow_topic(sow.name)
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
            enforced = frozenset(ALL_CHECKS) - topic.excluded
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
        # queue, queue_passthrough, queue_underlying: no queues exist in amps-py yet, so
        # the declared configurations agree by construction.
    return failures


def describe(failures: Iterable[ValidationFailure]) -> str:
    return "; ".join(str(f) for f in failures)
