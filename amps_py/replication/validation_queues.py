"""Replication validation of queues (pure): the ``queue``, ``queue_underlying`` and
``queue_passthrough`` checks of the queues an upstream replicates, and the ``sow``
check of a queue it archives (:func:`queue_failures`). :mod:`.validation` documents
every check and runs them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from amps_py.config.model import InstanceConfig

from .validation_facts import (
    QUEUE_ELEMENTS,
    QUEUE_FIELDS,
    UNDERLYING_FIELDS,
    QueueFacts,
    TopicDescriptor,
    ValidationFailure,
    covers,
)

__all__ = ["queue_failures"]


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


def queue_failures(
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
    for q in topic.queues:
        if q.kind == "local":
            continue  # never replicated (the config loader refuses it)
        config = local.queue(q.name)
        mine = None if config is None else QueueFacts.from_config(config)
        if q.archived and mine is None:
            failures.extend(_archive_failures(topic, q, local, upstream_name))
            continue
        failures.extend(_definition_failures(q, mine, local, upstream_name))
        failures.extend(_underlying_failures(q, local, upstream_name, topics))
        if not topic.enforces("queue_passthrough"):
            continue
        failures.extend(_passthrough_failures(q, local, upstream_name, upstream_group, entry))
    return failures


def _definition_failures(
    q: QueueFacts, mine: QueueFacts | None, local: InstanceConfig, upstream_name: str
) -> list[ValidationFailure]:
    """The ``queue`` and ``queue_underlying`` failures of how the downstream defines
    queue ``q`` (``mine``: its facts there, ``None`` without such a queue)."""
    failures: list[ValidationFailure] = []
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
        problems, changes = _differences(q, mine, UNDERLYING_FIELDS, upstream_name, local.name)
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
    return failures


def _underlying_failures(
    q: QueueFacts, local: InstanceConfig, upstream_name: str, topics: Sequence[TopicDescriptor]
) -> list[ValidationFailure]:
    """The ``queue_underlying`` failures of queue ``q``'s underlying topic: the upstream
    replicates it too (some entry of ``topics`` covers it), the downstream journals it."""
    failures: list[ValidationFailure] = []
    tl = local.transaction_log
    underlying = q.journaled_topic
    topic_xml = (
        f"<Topic><Name>{escape(underlying)}</Name><MessageType>{q.message_type}"
        "</MessageType></Topic>"
    )
    if not any(t.message_type == q.message_type and covers(t.name, underlying) for t in topics):
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
        and any(t.message_type == q.message_type and covers(t.name, underlying) for t in tl.topics)
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
    return failures


def _passthrough_failures(
    q: QueueFacts, local: InstanceConfig, upstream_name: str, upstream_group: str, entry: str
) -> list[ValidationFailure]:
    """The ``queue_passthrough`` failures of queue ``q``: each downstream destination
    that replicates it must pass through the upstream's group (``entry`` names the
    upstream's Topic entry, where the check can be excluded)."""
    failures: list[ValidationFailure] = []
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
