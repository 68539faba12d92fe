"""Replication validation on connect (pure): is the downstream configured to be a full
partner for every topic the upstream sends it?

The upstream describes each replicated Topic in its hello (name, message type, filter,
excluded checks). The downstream evaluates the checks against its own config and
refuses the link on the first failures, logging the check, the topic and the change
that fixes it; the upstream logs that the peer refused validation.

Checks (AMPS Table 25.2): ``txlog``, ``replicate``, ``sow``, ``cascade``, ``queue``,
``keys``, ``replicate_filter``, ``queue_passthrough``, ``queue_underlying``. amps-py has
no SOW topics or queues yet, so ``sow``, ``keys`` and the three queue checks compare
declared configuration that is empty on both sides and always pass; they are listed so
that a later SOW/queue release only has to fill them in.

Topic names compare as written: a downstream entry covers an upstream entry when it is
the same literal or pattern, when it is ``.*`` or omitted (every topic), or when the
upstream's name is a literal the downstream's pattern matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from amps_py.config.model import REPLICATION_VALIDATION_CHECKS, DestinationConfig, InstanceConfig

ALL_CHECKS = REPLICATION_VALIDATION_CHECKS

_REGEX_CHARS = frozenset(".*+?[](){}|^$\\")


@dataclass(frozen=True)
class TopicDescriptor:
    """A replicated Topic as the upstream describes it in the hello."""

    name: str | None
    message_type: str
    filter: str | None
    excluded: frozenset[str]

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> TopicDescriptor:
        excluded = raw.get("exclude_validation") or ()
        return cls(
            name=raw.get("name"),
            message_type=str(raw.get("message_type", "json")),
            filter=raw.get("filter") or None,
            excluded=frozenset(str(x) for x in excluded),
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
        # sow, keys, queue, queue_passthrough, queue_underlying: no SOW topics or queues
        # exist in amps-py yet, so the declared configurations agree by construction.
    return failures


def describe(failures: Iterable[ValidationFailure]) -> str:
    return "; ".join(str(f) for f in failures)
