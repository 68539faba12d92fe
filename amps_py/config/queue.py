"""``SOW/Queue`` (or ``QueueDefinition``), ``SOW/GroupLocalQueue`` and ``SOW/LocalQueue``
-> :class:`QueueConfig`.

Beyond what the schema checks (the elements, and the values of ``Semantics``,
``Leasing``, ``FairnessModel`` and ``ExpirationModel``), a queue must:

* have a literal ``Name`` (or its synonym ``Topic``, not both), unique among the queues
  and not the name of a SOW topic;
* give ``UnderlyingTopic`` as a literal topic or a valid regular expression, and with a
  regular expression a literal ``DefaultPublishTarget`` that it covers;
* give ``LeasePeriod`` and ``Expiration`` as durations above 0, ``MaxBacklog`` and
  ``MaxPerSubscriptionBacklog`` as integers of at least 1, ``MaxDeliveries`` and
  ``MaxCancels`` as integers of at least 0;
* give ``Filter``, ``BarrierExpression`` and ``Priority`` as expressions that compile
  (:func:`amps_py.filters.compile_filter`), and not both of the last two;
* name its ``InitialOwner`` when it is a GroupLocalQueue, and only then;
* give ``RecoveryPoint`` as ``epoch`` only: amps-py rebuilds a queue from the whole
  journal;
* have its underlying topic (with a regular expression: its ``DefaultPublishTarget``)
  recorded by the ``TransactionLog`` with the queue's MessageType: amps-py derives every
  queue from the journal, locally published and replicated messages alike;
* as a LocalQueue, not have its name (the queue topic) replicated by a
  ``Replication/Destination/Topic``: its underlying topic, when it has another name,
  may be replicated ("without special restrictions", as AMPS says), e.g. to an archive.

An at-most-once queue is always round-robin, whatever ``FairnessModel`` says.
"""

from __future__ import annotations

import re

from lxml import etree

from amps_py.config.model import ReplicationTopic, TransactionLogConfig
from amps_py.config.problems import _Problems
from amps_py.config.queue_model import QUEUE_KINDS, QueueConfig
from amps_py.config.sow import _PATTERN_CHARACTERS, _synonym, _topic_name, journal_fix
from amps_py.config.values import _check_name, _text
from amps_py.config.xmltree import _child_elements, _children, _closest, _first, _line, _snippet
from amps_py.filters import FilterError, compile_filter
from amps_py.units import UnitError, parse_duration

_INTEGER = re.compile(r"\+?[0-9]+")
_LOCAL_REPLICATED_FIX = (
    "a LocalQueue must not be replicated; use Queue or GroupLocalQueue, or remove the "
    "topic from the destination (to replicate its messages alone, give the LocalQueue an "
    "UnderlyingTopic of another name and replicate only that topic)"
)


class _Reader:
    """Reads the settings of one queue element; :attr:`ok` turns False when one of
    them has a problem (each reported once, with its line and a fix)."""

    def __init__(self, queue_el: etree._Element, problems: _Problems) -> None:
        self.queue_el = queue_el
        self.problems = problems
        self.ok = True

    def fail(self, el: etree._Element, message: str, fix: str, line: int | None = None) -> None:
        self.problems.add(el, message, fix, line=line)
        self.ok = False

    def text(self, name: str) -> tuple[etree._Element | None, str | None]:
        """(the element, its text); the text is None when the element is absent or
        already reported."""
        el = _first(self.queue_el, name)
        text = _text(el, self.problems)
        if el is not None and not text:
            self.ok = False  # already reported (empty, a bad value, an undefined ${VAR})
            return el, None
        return el, text

    def choice(self, name: str, default: str) -> str:
        """An enumerated value (checked by the structural walk) or ``default``."""
        return self.text(name)[1] or default

    def duration(self, name: str, example: str) -> float | None:
        """Seconds above 0, or None when the element is absent (or wrong)."""
        el, text = self.text(name)
        if el is None or text is None:
            return None
        try:
            seconds = parse_duration(text)
        except UnitError as exc:
            self.fail(el, f"{text!r} is not a valid duration for {name}", exc.accepted)
            return None
        if seconds <= 0:
            self.fail(el, f"{name} {text} must be more than 0", f"use a duration, e.g. {example}")
            return None
        return seconds

    def integer(self, name: str, minimum: int, meaning: str) -> int | None:
        """An integer of at least ``minimum``, or None when absent (or wrong)."""
        el, text = self.text(name)
        if el is None or text is None:
            return None
        if not _INTEGER.fullmatch(text):
            self.fail(
                el,
                f"{text!r} is not a valid {name}: it must be a whole number",
                f"write a whole number, {minimum} or more; {meaning}",
            )
            return None
        value = int(text)
        if value < minimum:
            self.fail(el, f"{name} {text} is below {minimum}", f"use {minimum} or more; {meaning}")
            return None
        return value

    def expression(self, name: str, what: str, example: str) -> str | None:
        """The text of an expression that compiles, or None when absent (or wrong)."""
        el, text = self.text(name)
        if el is None or text is None:
            return None
        try:
            compile_filter(text)
        except FilterError as exc:
            raw = el.text or ""
            lead = len(raw) - len(raw.lstrip())
            line = (_line(el) or 1) + raw.count("\n", 0, lead + exc.position)
            self.fail(
                el,
                f"{name} {_snippet(text)!r} is not a valid {what}: {exc.problem} "
                f"(column {exc.column})",
                exc.hint or f"correct the expression, e.g. {example}",
                line=line,
            )
            return None
        return text


def _build_queues(
    root: etree._Element,
    transaction_log: TransactionLogConfig | None,
    problems: _Problems,
) -> tuple[QueueConfig, ...]:
    """The queues of ``SOW`` that are right, in file order (the others are reported);
    ``transaction_log`` is the built TransactionLog, ``None`` when absent or faulty."""
    sow = _first(root, "SOW")
    if sow is None:
        return ()
    queue_els = [el for el in _child_elements(sow) if str(el.tag) in QUEUE_KINDS]
    if not queue_els:
        return ()
    log_el = _first(root, "TransactionLog")
    if log_el is None:
        problems.add(
            queue_els[0],
            "queues need a TransactionLog: amps-py derives each queue from the journal "
            "of its underlying topic",
            "add <TransactionLog><JournalDirectory>./amps-data</JournalDirectory><Topic>"
            "<Name>TOPIC</Name><MessageType>json</MessageType></Topic></TransactionLog> "
            "recording the underlying topic of every queue",
        )
    sow_names = {
        name: el for el in _children(sow, "Topic") if (name := _topic_name(el)) is not None
    }
    queue_names: dict[str, etree._Element] = {}
    replicated = _replicated_topics(root, problems)
    queues: list[QueueConfig] = []
    for queue_el in queue_els:
        built = _build_queue(queue_el, problems)
        if built is None:
            continue
        queue, name_el = built
        ok = _name_is_free(queue, name_el, sow_names, queue_names, problems)
        ok = _is_journaled(queue, queue_el, transaction_log, log_el, problems) and ok
        ok = _local_is_not_replicated(queue, queue_el, replicated, problems) and ok
        if ok:
            queues.append(queue)
    return tuple(queues)


def _build_queue(
    queue_el: etree._Element, problems: _Problems
) -> tuple[QueueConfig, etree._Element] | None:
    """One QueueConfig and the element naming it, or None (and problems)."""
    kind = QUEUE_KINDS[str(queue_el.tag)]
    read = _Reader(queue_el, problems)
    named = _queue_name(read)
    message_type = read.text("MessageType")[1]
    underlying = _underlying(read, named[1] if named else None)
    semantics = read.choice("Semantics", "at-least-once")
    fairness = read.choice("FairnessModel", "proportional")  # at-most-once: round-robin
    priority, barrier = _order(read)
    queue = QueueConfig(
        kind=kind,
        name=named[1] if named else "",
        message_type=message_type or "",
        underlying_topic=underlying[0] if underlying else "",
        underlying_is_regex=underlying[1] if underlying else False,
        default_publish_target=underlying[2] if underlying else None,
        lease_period=read.duration("LeasePeriod", "30s"),
        semantics=semantics,
        max_backlog=read.integer("MaxBacklog", 1, "omit MaxBacklog for no cap"),
        max_per_subscription_backlog=read.integer(
            "MaxPerSubscriptionBacklog", 1, "1 (the default) sends one message at a time"
        )
        or 1,
        expiration=read.duration("Expiration", "1h"),
        filter=read.expression("Filter", "content filter", "/status = 'new'"),
        max_deliveries=read.integer("MaxDeliveries", 0, "0 means unlimited") or 0,
        max_cancels=read.integer("MaxCancels", 0, "0 means unlimited") or 0,
        leasing=read.choice("Leasing", "sublet"),
        fairness="round-robin" if semantics == "at-most-once" else fairness,
        priority=priority,
        barrier_expression=barrier,
        initial_owner=_initial_owner(read, kind),
        recovery_point=_recovery_point(read),
    )
    if not read.ok or named is None or not message_type or underlying is None:
        return None
    return queue, named[0]


def _queue_name(read: _Reader) -> tuple[etree._Element, str] | None:
    """(the Name or Topic element, the queue name), or None (and a problem)."""
    tag = str(read.queue_el.tag)
    name_el = _synonym(read.queue_el, "Name", "Topic", read.problems)
    if name_el is None:
        if not _children(read.queue_el, "Name") and not _children(read.queue_el, "Topic"):
            read.fail(
                read.queue_el,
                f"<{tag}> is missing the required element <Name>",
                f"add <Name> inside <{tag}>: the queue topic subscribers use, e.g. "
                "<Name>work</Name>",
            )
        read.ok = False
        return None
    name = _text(name_el, read.problems)
    if not name:
        read.ok = False
        return None
    pattern = sorted(_PATTERN_CHARACTERS & set(name))
    if pattern:
        read.fail(
            name_el,
            f"queue name {name!r} contains {''.join(pattern)!r}: a queue is one literal "
            "topic, not a regular expression",
            "give the queue a literal Name and put the pattern in <UnderlyingTopic> (with "
            "a <DefaultPublishTarget>)",
        )
        return None
    return name_el, name


def _underlying(read: _Reader, name: str | None) -> tuple[str, bool, str | None] | None:
    """(underlying topic, whether it is a regex, DefaultPublishTarget), or None (and a
    problem)."""
    el, given = read.text("UnderlyingTopic")
    target_el, target = read.text("DefaultPublishTarget")
    topic = given or name
    if topic is None or (el is not None and given is None):
        return None
    regex = bool(_PATTERN_CHARACTERS & set(topic))
    pattern = _compile(read, el, topic) if regex and el is not None else None
    if regex and pattern is None:
        return None
    if target_el is not None and target is None:
        return None
    if target is None:
        if pattern is not None and el is not None:
            read.fail(
                el,
                f"UnderlyingTopic {topic!r} is a regular expression, so a publish to the "
                f"queue {name or ''!r} has no topic to go to",
                "add <DefaultPublishTarget> naming the literal topic such publishes are "
                "written to, one that UnderlyingTopic covers",
            )
            return None
        return topic, regex, None
    if not _target_is_covered(read, target_el, target, topic, pattern):
        return None
    return topic, regex, target


def _compile(read: _Reader, el: etree._Element, topic: str) -> re.Pattern[str] | None:
    try:
        return re.compile(topic)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        read.fail(
            el,
            f"UnderlyingTopic {topic!r} is not a valid regular expression: {exc.msg}{where}",
            "correct the expression, or escape regex characters with a backslash to "
            "match them literally",
        )
        return None


def _target_is_covered(
    read: _Reader,
    target_el: etree._Element | None,
    target: str,
    topic: str,
    pattern: re.Pattern[str] | None,
) -> bool:
    """Whether DefaultPublishTarget is a literal topic that the underlying topic
    covers; a problem otherwise."""
    assert target_el is not None
    if _PATTERN_CHARACTERS & set(target):
        read.fail(
            target_el,
            f"DefaultPublishTarget {target!r} is a regular expression; it must name one topic",
            "write the literal topic that publishes to the queue's Name are written to",
        )
        return False
    covered = pattern.search(target) is not None if pattern else target == topic
    if not covered:
        read.fail(
            target_el,
            f"DefaultPublishTarget {target!r} is not covered by UnderlyingTopic {topic!r}: "
            "messages published to the queue's Name would not enter the queue",
            "name a topic that UnderlyingTopic covers, or remove <DefaultPublishTarget>"
            if pattern
            else "remove <DefaultPublishTarget> (publishes go to the UnderlyingTopic)",
        )
        return False
    return True


def _order(read: _Reader) -> tuple[str | None, str | None]:
    """(Priority, BarrierExpression); giving both is a problem."""
    priority = read.expression("Priority", "expression", "/priority")
    barrier = read.expression("BarrierExpression", "content filter", "/type = 'end-of-day'")
    priority_el = _first(read.queue_el, "Priority")
    barrier_el = _first(read.queue_el, "BarrierExpression")
    if priority_el is not None and barrier_el is not None:
        later = max((priority_el, barrier_el), key=lambda e: _line(e) or 0)
        read.fail(
            later,
            "Priority and BarrierExpression are both given; a queue is ordered by "
            "priority or held at barriers, not both",
            "remove one of <Priority> and <BarrierExpression>",
        )
    return priority, barrier


def _initial_owner(read: _Reader, kind: str) -> str | None:
    """InitialOwner: required for a group-local queue, refused on the others."""
    tag = str(read.queue_el.tag)
    el = _first(read.queue_el, "InitialOwner")
    if kind != "group-local":
        if el is not None:
            why = (
                "a LocalQueue belongs to this instance alone"
                if kind == "local"
                else "each message of a Queue is owned by the instance it was published to"
            )
            read.fail(
                el,
                f"InitialOwner is given in a <{tag}>; only a GroupLocalQueue has one ({why})",
                "remove <InitialOwner>, or make this queue a <GroupLocalQueue>",
            )
        return None
    if el is None:
        read.fail(
            read.queue_el,
            "<GroupLocalQueue> is missing the required element <InitialOwner>",
            "add <InitialOwner> inside <GroupLocalQueue>: the Name of the instance that "
            "owns every message, the same on every instance hosting the queue",
        )
        return None
    owner = _check_name(el, read.problems)
    if owner is None:
        read.ok = False
    return owner


def _recovery_point(read: _Reader) -> str:
    el, text = read.text("RecoveryPoint")
    if el is None or text is None or text == "epoch":
        return "epoch"
    hint = "; did you mean 'epoch'?" if _closest(text, ("epoch",)) else ""
    read.fail(
        el,
        f"RecoveryPoint {text!r} is not supported by amps-py{hint}: a queue is always "
        "rebuilt from the whole journal (epoch)",
        "remove <RecoveryPoint>, or write <RecoveryPoint>epoch</RecoveryPoint>",
    )
    return "epoch"


def _name_is_free(
    queue: QueueConfig,
    name_el: etree._Element,
    sow_names: dict[str, etree._Element],
    queue_names: dict[str, etree._Element],
    problems: _Problems,
) -> bool:
    """Whether no SOW topic and no earlier queue has the queue's name; remembers it."""
    sow_el = sow_names.get(queue.name)
    if sow_el is not None:
        problems.add(
            name_el,
            f"queue {queue.name!r} has the name of the SOW topic on line {_line(sow_el)}",
            f"give the queue a name of its own, with <UnderlyingTopic>{queue.name}"
            "</UnderlyingTopic> to queue that topic's messages",
        )
        return False
    first_el = queue_names.get(queue.name)
    if first_el is not None:
        problems.add(
            name_el,
            f"queue {queue.name!r} is defined twice (first on line {_line(first_el)})",
            f"keep one queue named {queue.name} and merge their settings",
        )
        return False
    queue_names[queue.name] = name_el
    return True


def _is_journaled(
    queue: QueueConfig,
    queue_el: etree._Element,
    log: TransactionLogConfig | None,
    log_el: etree._Element | None,
    problems: _Problems,
) -> bool:
    """Whether the TransactionLog records the topic publishes to the queue go to (the
    underlying topic, or DefaultPublishTarget) with the queue's MessageType."""
    if log is None:
        return log_el is None  # no TransactionLog (reported), or a faulty one
    topic = queue.publish_target
    if log.journals(topic, queue.message_type):
        return True
    what = "UnderlyingTopic" if queue.default_publish_target is None else "DefaultPublishTarget"
    el = next(
        (e for tag in (what, "Name", "Topic") if (e := _first(queue_el, tag)) is not None),
        queue_el,
    )
    others = sorted({t.message_type for t in log.topics if t.matches(topic, t.message_type)})
    if others:
        problems.add(
            el,
            f"queue {queue.name!r} has MessageType {queue.message_type}, but its topic "
            f"{topic!r} is recorded by the TransactionLog as {', '.join(others)}",
            f"give the queue the message type of its underlying topic ({others[0]}), or "
            f"record {topic} as {queue.message_type} in the TransactionLog",
        )
        return False
    problems.add(
        el,
        f"the topic {topic!r} ({queue.message_type}) of queue {queue.name!r} is not "
        "recorded by the TransactionLog; amps-py derives each queue from the journal",
        journal_fix(topic, queue.message_type, log_el),
    )
    return False


def _replicated_topics(
    root: etree._Element, problems: _Problems
) -> list[tuple[etree._Element, ReplicationTopic]]:
    """Every ``Replication/Destination/Topic`` that is right, with its element."""
    found: list[tuple[etree._Element, ReplicationTopic]] = []
    for dest in _children(_first(root, "Replication"), "Destination"):
        for topic_el in _children(dest, "Topic"):
            name_el = _first(topic_el, "Name")
            name = _text(name_el, problems)
            message_type = _text(_first(topic_el, "MessageType"), problems)
            if problems.faulty(topic_el) or not message_type or (name_el is not None and not name):
                continue
            try:
                found.append((topic_el, ReplicationTopic(name, message_type)))
            except re.error:
                continue  # reported by the replication section
    return found


def _local_is_not_replicated(
    queue: QueueConfig,
    queue_el: etree._Element,
    replicated: list[tuple[etree._Element, ReplicationTopic]],
    problems: _Problems,
) -> bool:
    """Whether no destination replicates a LocalQueue's name (its underlying topic may
    be replicated when it has another name)."""
    if queue.kind != "local":
        return True
    for topic_el, topic in replicated:
        if topic.matches(queue.name, queue.message_type):
            dest = topic_el.getparent()
            label = _text(_first(dest, "Name"), problems) if dest is not None else None
            problems.add(
                queue_el,
                f"LocalQueue {queue.name!r} is replicated: Destination {label or '?'!r} "
                f"replicates its topic {queue.name!r} by the Topic on line {_line(topic_el)}",
                _LOCAL_REPLICATED_FIX,
            )
            return False
    return True
