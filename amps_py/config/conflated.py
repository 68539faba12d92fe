"""``SOW/ConflatedTopic`` (or its synonym ``ReplicaDefinition``) ->
:class:`ConflatedTopicConfig`.

Beyond what the schema checks, a conflated topic must:

* have a literal ``Name`` (or its synonym ``Topic``, not both), unique among the
  conflated topics, and neither a SOW topic's (nor one a SOW ``Pattern`` matches) nor
  a queue's;
* name in ``UnderlyingTopic`` the ``Name`` of a SOW topic of this instance with the
  same ``MessageType``; a Pattern SOW topic is refused (AMPS names its conflated
  topics with ``TopicFormat``, which amps-py does not build), and so is another
  conflated topic;
* give ``Interval`` as a duration of at least 100ms (default 5s), as AMPS requires;
* give ``Filter`` as a content filter that compiles.

``HashIndex`` is accepted and not used: AMPS documents it as an index that makes
exact-match queries faster, nothing a query returns depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from lxml import etree

from amps_py.config.problems import _Problems
from amps_py.config.queue import _Reader
from amps_py.config.queue_model import QueueConfig
from amps_py.config.sow import _PATTERN_CHARACTERS, _synonym
from amps_py.config.sow_model import ConflatedTopicConfig, SowTopicConfig
from amps_py.config.xmltree import _children, _closest, _first, _line
from amps_py.units import UnitError, parse_duration

#: the elements of a conflated topic (AMPS's two names)
CONFLATED_ELEMENTS: Final = ("ConflatedTopic", "ReplicaDefinition")
#: AMPS's default and smallest Interval, in seconds
DEFAULT_INTERVAL: Final = 5.0
MIN_INTERVAL: Final = 0.1


def _build_conflated(
    root: etree._Element,
    sow_topics: Sequence[SowTopicConfig],
    queues: Sequence[QueueConfig],
    problems: _Problems,
) -> tuple[ConflatedTopicConfig, ...]:
    """The conflated topics that are right, in file order (the others are reported);
    ``sow_topics`` and ``queues`` are the built ones."""
    sow = _first(root, "SOW")
    els = [el for tag in CONFLATED_ELEMENTS for el in _children(sow, tag)]
    els.sort(key=lambda el: _line(el) or 0)
    if not els:
        return ()
    sow_names = {
        (_name_text(el) or ""): el for el in _children(sow, "Topic") if _name_text(el) is not None
    }
    by_name = {t.name: t for t in sow_topics}
    queue_names = {q.name for q in queues}
    conflated_names = {_name_text(el) for el in els}
    seen: dict[str, etree._Element] = {}
    built: list[ConflatedTopicConfig] = []
    for el in els:
        read = _Reader(el, problems)
        name_el = _synonym(el, "Name", "Topic", problems)
        if name_el is None and not _children(el, "Name") and not _children(el, "Topic"):
            read.fail(
                el,
                f"<{el.tag}> is missing the required element <Name>",
                "add <Name> inside it: the conflated topic subscribers use, e.g. "
                "<Name>orders-C</Name>",
            )
        name = read.text(str(name_el.tag))[1] if name_el is not None else None
        message_type = read.text("MessageType")[1]
        interval = _interval(read)
        flt = read.expression("Filter", "content filter", "/status = 'open'")
        underlying_el, underlying = read.text("UnderlyingTopic")
        if name is not None and name_el is not None:
            _name_is_free(read, name_el, name, sow_names, sow_topics, queue_names, seen)
        if underlying is not None and underlying_el is not None and message_type:
            _underlying_is_sow(
                read, underlying_el, underlying, message_type, by_name, conflated_names
            )
        if not read.ok or name is None or underlying is None or not message_type:
            continue
        built.append(
            ConflatedTopicConfig(
                name=name,
                underlying_topic=underlying,
                message_type=message_type,
                interval=interval,
                filter=flt,
                hash_indexes=tuple(_hash_index(h) for h in _children(el, "HashIndex")),
            )
        )
    return tuple(built)


def _name_text(el: etree._Element) -> str | None:
    for tag in ("Name", "Topic"):
        found = _first(el, tag)
        if found is not None and (found.text or "").strip():
            return (found.text or "").strip()
    return None


def _hash_index(el: etree._Element) -> str:
    """A HashIndex as written: its Key paths, comma-separated (kept for the record)."""
    keys = [" ".join((k.text or "").split()) for k in el if isinstance(k.tag, str)]
    return ",".join(k for k in keys if k) or " ".join((el.text or "").split())


def _interval(read: _Reader) -> float:
    el, text = read.text("Interval")
    if el is None or text is None:
        return DEFAULT_INTERVAL
    try:
        seconds = parse_duration(text)
    except UnitError as exc:
        read.fail(el, f"{text!r} is not a valid duration for Interval", exc.accepted)
        return DEFAULT_INTERVAL
    if seconds < MIN_INTERVAL:
        read.fail(
            el,
            f"Interval {text} is below 100ms, the shortest AMPS allows for a conflated topic",
            "use 100ms or more, e.g. 1s (the default is 5s)",
        )
    return seconds


def _name_is_free(
    read: _Reader,
    name_el: etree._Element,
    name: str,
    sow_names: dict[str, etree._Element],
    sow_topics: Sequence[SowTopicConfig],
    queue_names: set[str],
    seen: dict[str, etree._Element],
) -> None:
    """Whether a conflated topic's name is literal and no other topic's; problems
    otherwise. Remembers it in ``seen``."""
    regex = sorted(_PATTERN_CHARACTERS & set(name))
    if regex:
        read.fail(
            name_el,
            f"conflated topic name {name!r} contains {''.join(regex)!r}: it must be a "
            "literal topic",
            "give the conflated topic a literal Name, e.g. orders-C",
        )
        return
    first = seen.get(name)
    if first is not None:
        read.fail(
            name_el,
            f"conflated topic {name!r} is defined twice (first on line {_line(first)})",
            f"keep one conflated topic named {name}",
        )
        return
    seen[name] = name_el
    sow_el = sow_names.get(name)
    holder = next((t for t in sow_topics if t.pattern is not None and t.holds(name)), None)
    if sow_el is not None or holder is not None:
        where = (
            f"the SOW topic on line {_line(sow_el)}"
            if sow_el is not None
            else f"a topic of SOW topic {holder.name!r} (its Pattern {holder.pattern!r})"
            if holder is not None
            else ""
        )
        read.fail(
            name_el,
            f"conflated topic {name!r} has the name of {where}: a conflated topic is a SOW "
            "topic of its own",
            f"give the conflated topic another name, e.g. {name}-C",
        )
    elif name in queue_names:
        read.fail(
            name_el,
            f"conflated topic {name!r} has the name of a queue",
            f"give the conflated topic another name, e.g. {name}-C",
        )


def _underlying_is_sow(
    read: _Reader,
    el: etree._Element,
    underlying: str,
    message_type: str,
    by_name: dict[str, SowTopicConfig],
    conflated_names: set[str | None],
) -> None:
    """Whether ``UnderlyingTopic`` names a SOW topic without Pattern of
    ``message_type``; a problem otherwise."""
    topic = by_name.get(underlying)
    if topic is None:
        if underlying in conflated_names:
            read.fail(
                el,
                f"UnderlyingTopic {underlying!r} is a conflated topic; amps-py conflates "
                "SOW topics only, not yet another conflated topic",
                "name the SOW topic the other conflated topic copies, with this one's Interval",
            )
            return
        close = _closest(underlying, tuple(by_name))
        hint = f"; did you mean {close!r}?" if close else ""
        read.fail(
            el,
            f"UnderlyingTopic {underlying!r} is not a SOW topic of this instance{hint}",
            "name a SOW/Topic's Name exactly (a conflated topic copies a SOW topic), or "
            f"add <SOW><Topic><Name>{underlying}</Name>...</Topic></SOW>",
        )
        return
    if topic.pattern is not None:
        read.fail(
            el,
            f"UnderlyingTopic {underlying!r} is a Pattern SOW topic ({topic.pattern!r}): "
            "AMPS conflates each topic it holds under a name made by TopicFormat, which "
            "amps-py does not support yet",
            "conflate a SOW topic without Pattern: give the topic to conflate a SOW "
            "<Topic> of its own (outside the Pattern) and name it in UnderlyingTopic",
        )
        return
    if topic.message_type != message_type:
        read.fail(
            el,
            f"conflated topic's MessageType {message_type} is not that of its "
            f"UnderlyingTopic {underlying!r} ({topic.message_type})",
            f"write <MessageType>{topic.message_type}</MessageType>",
        )
