"""``SOW``: the State of the World topics (``SOW/Topic``) -> :class:`SowTopicConfig`.

Beyond what the schema checks, a SOW topic must:

* have a literal ``Name`` (or its pre-5.0 synonym ``Topic``, not both), unique among
  the SOW topics; with ``Pattern`` (a regular expression that compiles) the Name names
  the one store that holds every topic the Pattern matches, as AMPS's "multiple
  logical topics in one physical topic";
* not be held twice: a SOW topic without Pattern whose Name another topic's Pattern
  matches is refused (its records would have two stores);
* give its ``Key`` paths as identifier paths (``/id``, ``/order/id``, ``/55``,
  ``/Order/@id``), each once, and only for a message type amps-py reads fields from
  (every type but one built on the binary module);
* give ``Durability`` or its synonym ``Duration``, not both;
* give ``Expiration`` as ``disabled``, ``enabled`` or a duration above 0;
* give ``RecoveryPoint`` as ``epoch`` only: amps-py rebuilds a missing store from the
  whole journal;
* be recorded by the ``TransactionLog``: amps-py derives every SOW topic from the
  journal, locally published and replicated messages alike (for a Pattern, a
  TransactionLog Topic that provably records every topic it matches:
  :mod:`amps_py.config.sow_pattern`);
* have a store directory (``FileName``, ``%n`` expanded) of its own.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

from lxml import etree

from amps_py.config.model import TransactionLogConfig
from amps_py.config.problems import _Problems
from amps_py.config.sow_model import SowTopicConfig
from amps_py.config.sow_pattern import journal_covers_pattern, whole_topic_form
from amps_py.config.values import _text
from amps_py.config.xmltree import _children, _closest, _first, _line
from amps_py.message_types import MessageType, MessageTypes, default_types
from amps_py.units import UnitError, parse_duration

#: the modules whose messages have no fields, so no Key can be read from them
UNKEYED_MODULES = frozenset({"binary"})
#: characters that would make a SOW topic Name look like a pattern; SOW names are literal
_PATTERN_CHARACTERS = frozenset("*+?[](){}|^$\\")
_EXPIRATION_FORMS = (
    "use disabled (the default: records never expire), enabled (only messages "
    "published with an expiration, e, expire) or a duration such as 30s or 1h"
)
_KEY_FORMS = "write Key as an identifier path, e.g. /id or /order/id"


def expand_file_name(file_name: str, topic: str, message_type: str) -> str:
    """``FileName`` with each ``%n`` replaced by ``<topic>.<message type>``.

    The topic is percent-encoded (``orders/eu`` -> ``orders%2Feu``) so that it names
    one path component and two topics never expand to the same name.
    """
    token = f"{urllib.parse.quote(topic, safe='')}.{message_type}"
    return file_name.replace("%n", token)


def key_path_problem(path: str) -> tuple[str, str] | None:
    """What is wrong with a ``Key`` identifier path (message, fix), or ``None``.

    A path is one or more ``/name`` steps; a name starts with a letter, a digit, ``_``
    or ``@`` and goes on with those, ``-``, ``.`` or ``:`` (the field names of content
    filters). Array subscripts are not supported in keys.
    """
    if not path.startswith("/"):
        return (f"Key {path!r} is not an identifier path: it must start with '/'", _KEY_FORMS)
    for position, step in enumerate(path[1:].split("/"), start=1):
        if not step:
            return (
                f"Key {path!r} has an empty step ('//' or a trailing '/')",
                "write every step of the path once, e.g. /order/id",
            )
        if "[" in step or "]" in step:
            return (
                f"Key {path!r} indexes an array, which a SOW key cannot do in amps-py",
                "key on a field of the message, e.g. /id or /order/id",
            )
        if not (step[0].isalnum() or step[0] in "_@"):
            return (
                f"Key {path!r}: step {position} ({step!r}) must start with a letter, a "
                "digit, '_' or '@'",
                _KEY_FORMS,
            )
        bad = next((ch for ch in step if not (ch.isalnum() or ch in "_@-.:")), None)
        if bad is not None:
            return (
                f"Key {path!r} contains {bad!r}, which a field name cannot hold",
                "field names hold letters, digits and _ @ - . : only; " + _KEY_FORMS,
            )
    return None


def _build_sow(
    root: etree._Element,
    transaction_log: TransactionLogConfig | None,
    problems: _Problems,
    message_types: MessageTypes | None = None,
) -> tuple[SowTopicConfig, ...]:
    """The ``SOW/Topic`` entries that are right, in file order (the others are
    reported); ``transaction_log`` is the built TransactionLog, ``None`` when absent
    or itself faulty; ``message_types`` the instance's (None: the defaults)."""
    types = default_types() if message_types is None else message_types
    sow = _first(root, "SOW")
    topic_els = _children(sow, "Topic")
    if sow is None or not topic_els:
        return ()
    log_el = _first(root, "TransactionLog")
    if log_el is None:
        first = topic_els[0]
        name = _topic_name(first) or "orders"
        problems.add(
            sow,
            "SOW topics need a TransactionLog: amps-py builds each SOW topic from the journal",
            "add <TransactionLog><JournalDirectory>./amps-data</JournalDirectory><Topic>"
            f"<Name>{name}</Name><MessageType>{_message_type(first)}</MessageType></Topic>"
            "</TransactionLog> recording every SOW topic",
        )
    topics: list[SowTopicConfig] = []
    names: dict[str, etree._Element] = {}
    stores: dict[str, tuple[str, etree._Element]] = {}
    for topic_el in topic_els:
        built = _build_topic(topic_el, types, problems)
        if built is None:
            continue
        topic, name_el = built
        first_el = names.get(topic.name)
        if first_el is not None:
            problems.add(
                name_el,
                f"SOW topic {topic.name!r} is defined twice (first on line {_line(first_el)})",
                f"keep one <Topic> for {topic.name} in <SOW> and merge their settings",
            )
            continue
        names[topic.name] = name_el
        if not _store_is_own(topic, topic_el, stores, transaction_log, problems):
            continue
        if not _journaled(topic, topic_el, name_el, transaction_log, log_el, problems):
            continue
        topics.append(topic)
    return tuple(_held_once(topics, names, problems))


def _journaled(
    topic: SowTopicConfig,
    topic_el: etree._Element,
    name_el: etree._Element,
    transaction_log: TransactionLogConfig | None,
    log_el: etree._Element | None,
    problems: _Problems,
) -> bool:
    """Whether the TransactionLog records every topic of ``topic`` (its name, or every
    topic its Pattern matches, provably); reports it when not. True without a built
    TransactionLog (its absence or its own faults are reported elsewhere)."""
    if transaction_log is None:
        return True
    if topic.pattern is not None:
        if journal_covers_pattern(transaction_log.topics, topic.pattern, topic.message_type):
            return True
        problems.add(
            _first(topic_el, "Pattern"),
            f"SOW topic {topic.name!r}: the TransactionLog does not record every "
            f"topic its Pattern {topic.pattern!r} ({topic.message_type}) matches, or "
            "amps-py cannot prove it does; amps-py builds each SOW topic from the "
            "journal",
            journal_fix(whole_topic_form(topic.pattern), topic.message_type, log_el),
        )
        return False
    if transaction_log.journals(topic.name, topic.message_type):
        return True
    problems.add(
        name_el,
        f"SOW topic {topic.name!r} ({topic.message_type}) is not recorded by the "
        "TransactionLog; amps-py builds each SOW topic from the journal",
        journal_fix(topic.name, topic.message_type, log_el),
    )
    return False


def _held_once(
    topics: list[SowTopicConfig], names: dict[str, etree._Element], problems: _Problems
) -> list[SowTopicConfig]:
    """``topics`` less each SOW topic without Pattern whose Name a Pattern topic
    matches (a problem each): a topic's records live in one store."""
    patterns = [t for t in topics if t.pattern is not None]
    kept: list[SowTopicConfig] = []
    for topic in topics:
        holder = next((p for p in patterns if topic.pattern is None and p.holds(topic.name)), None)
        if holder is None:
            kept.append(topic)
            continue
        problems.add(
            names[topic.name],
            f"SOW topic {topic.name!r} is also held by SOW topic {holder.name!r}, whose "
            f"Pattern {holder.pattern!r} matches it (line {_line(names[holder.name])}): "
            "its records would be kept in two stores",
            f"remove this <Topic> (the Pattern topic keeps {topic.name}), or narrow the "
            f"Pattern so that it does not match {topic.name}",
        )
    return kept


def journal_fix(topic: str, message_type: str, log_el: etree._Element | None) -> str:
    """The fix for a literal ``topic`` that the TransactionLog (``log_el``) should
    record and does not."""
    if log_el is None:
        return "record it in the TransactionLog"
    return (
        f"add <Topic><Name>{topic}</Name><MessageType>{message_type}</MessageType></Topic> "
        f"to the TransactionLog (line {_line(log_el)})"
    )


def _topic_name(topic_el: etree._Element) -> str | None:
    for tag in ("Name", "Topic"):
        el = _first(topic_el, tag)
        if el is not None and (el.text or "").strip():
            return (el.text or "").strip()
    return None


def _message_type(topic_el: etree._Element) -> str:
    el = _first(topic_el, "MessageType")
    text = (el.text or "").strip() if el is not None else ""
    return text or "json"


def _build_topic(
    topic_el: etree._Element, types: MessageTypes, problems: _Problems
) -> tuple[SowTopicConfig, etree._Element] | None:
    """One SowTopicConfig and the element naming it, or None (and problems)."""
    name_el = _synonym(topic_el, "Name", "Topic", problems)
    if name_el is None:
        if not _children(topic_el, "Name") and not _children(topic_el, "Topic"):
            problems.add(
                topic_el,
                "<Topic> is missing the required element <Name>",
                "add <Name> inside <Topic>: the topic to keep, e.g. <Name>orders</Name>",
            )
        return None
    name = _text(name_el, problems)
    message_type = _text(_first(topic_el, "MessageType"), problems)
    if not name or not message_type:
        return None
    ok = _literal_name(name_el, name, problems)
    pattern_el = _first(topic_el, "Pattern")
    pattern = _text(pattern_el, problems) if pattern_el is not None else None
    if pattern_el is not None:
        ok = pattern is not None and _pattern_compiles(pattern_el, pattern, problems) and ok
    keys = _keys(topic_el, types.get(message_type), problems)
    durability_el = _synonym(topic_el, "Durability", "Duration", problems)
    durability = "persistent" if durability_el is None else _text(durability_el, problems)
    expiration = _expiration(_first(topic_el, "Expiration"), problems)
    ok = _recovery_point(_first(topic_el, "RecoveryPoint"), problems) and ok
    file_el = _first(topic_el, "FileName")
    file_text = _text(file_el, problems) if file_el is not None else None
    key_domain_el = _first(topic_el, "KeyDomain")
    key_domain = _text(key_domain_el, problems) if key_domain_el is not None else ""
    if (
        not ok
        or keys is None
        or expiration is None
        or durability is None
        or key_domain is None
        or (file_el is not None and not file_text)
    ):
        return None
    seconds, enabled = expiration
    file_name = Path(expand_file_name(file_text, name, message_type)) if file_text else None
    return (
        SowTopicConfig(
            name=name,
            message_type=message_type,
            keys=keys,
            durability=durability,
            expiration=seconds,
            expiration_enabled=enabled,
            file_name=file_name,
            key_domain=key_domain,
            pattern=pattern,
        ),
        name_el,
    )


def _pattern_compiles(el: etree._Element, pattern: str, problems: _Problems) -> bool:
    """Whether a SOW ``Pattern`` is a regular expression that compiles; a problem
    naming the element, the position and the fix otherwise."""
    try:
        re.compile(pattern)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        problems.add(
            el,
            f"Pattern {pattern!r} of this SOW topic is not a valid regular expression: "
            f"{exc.msg}{where}",
            "correct the expression (e.g. ^orders/ for every topic that starts with "
            "orders/), or escape regex characters with a backslash to match them literally",
        )
        return False
    return True


def _synonym(
    parent: etree._Element, name: str, other: str, problems: _Problems
) -> etree._Element | None:
    """The element ``name`` or its synonym ``other``; None (and a problem) when both
    are given, None when neither is."""
    found = _children(parent, name) + _children(parent, other)
    if len({str(e.tag) for e in found}) > 1:
        later = max(found, key=lambda e: _line(e) or 0)
        problems.add(
            later,
            f"{name} and {other} are the same setting and both are given",
            f"keep only one of <{name}> and <{other}> (<{name}> is the current name)",
        )
        return None
    return found[0] if found else None


def _literal_name(name_el: etree._Element, name: str, problems: _Problems) -> bool:
    pattern = sorted(_PATTERN_CHARACTERS & set(name))
    if not pattern:
        return True
    problems.add(
        name_el,
        f"SOW topic name {name!r} contains {''.join(pattern)!r}: a SOW topic's Name is "
        "literal, not a regular expression",
        "give the Name a literal topic; to keep every topic an expression matches in one "
        f"store, write <Pattern>{name}</Pattern> beside a literal <Name>",
    )
    return False


def _keys(
    topic_el: etree._Element, message_type: MessageType | None, problems: _Problems
) -> tuple[str, ...] | None:
    """The Key paths in order; None (and problems) when one is wrong, or when the
    message type is unknown (reported where it is named)."""
    key_els = _children(topic_el, "Key")
    if message_type is None:
        return None
    if key_els and message_type.module in UNKEYED_MODULES:
        problems.add(
            key_els[0],
            f"this SOW topic has MessageType {message_type.name} and Key elements, but "
            f"{message_type.module} messages have no fields to read a key from",
            "remove the Key elements (publishers then send each record's key in the k "
            "header), or use a message type with fields (json, fix, nvfix, xml, bson, "
            "msgpack)",
        )
        return None
    keys: list[str] = []
    first_line: dict[str, int | None] = {}
    ok = True
    for key_el in key_els:
        path = _text(key_el, problems)
        if not path:
            ok = False
            continue
        wrong = key_path_problem(path)
        if wrong is not None:
            problems.add(key_el, *wrong)
            ok = False
            continue
        if path in first_line:
            problems.add(
                key_el,
                f"Key {path} is given twice in this SOW topic (first on line {first_line[path]})",
                "remove the second <Key>",
            )
            ok = False
            continue
        first_line[path] = _line(key_el)
        keys.append(path)
    return tuple(keys) if ok else None


def _expiration(el: etree._Element | None, problems: _Problems) -> tuple[float | None, bool] | None:
    """(default lifetime in seconds or None, whether ``enabled``); None (and a problem)
    when wrong."""
    if el is None:
        return (None, False)
    text = _text(el, problems)
    if text is None:
        return None
    if text == "disabled":
        return (None, False)
    if text == "enabled":
        return (None, True)
    try:
        seconds = parse_duration(text)
    except UnitError:
        close = _closest(text, ("disabled", "enabled"))
        hint = f"; did you mean {close!r}?" if close else ""
        problems.add(el, f"{text!r} is not a valid Expiration{hint}", _EXPIRATION_FORMS)
        return None
    if seconds <= 0:
        problems.add(
            el,
            f"Expiration {text} would expire every record at once",
            "use a duration above 0, e.g. 30s, or disabled to keep records until replaced "
            "or deleted",
        )
        return None
    return (seconds, False)


def _recovery_point(el: etree._Element | None, problems: _Problems) -> bool:
    if el is None:
        return True
    text = _text(el, problems)
    if text is None:
        return False
    if text == "epoch":
        return True
    if text == "now":
        problems.add(
            el,
            "RecoveryPoint 'now' is recognised by AMPS but not supported by amps-py: a "
            "SOW topic whose store is missing is always rebuilt from the whole journal "
            "(epoch)",
            "remove <RecoveryPoint>, or write <RecoveryPoint>epoch</RecoveryPoint>",
        )
        return False
    close = _closest(text, ("epoch",))
    hint = "; did you mean 'epoch'?" if close else ""
    problems.add(
        el,
        f"{text!r} is not a valid RecoveryPoint{hint}",
        "use epoch (the default), or remove <RecoveryPoint>",
    )
    return False


def _store_is_own(
    topic: SowTopicConfig,
    topic_el: etree._Element,
    stores: dict[str, tuple[str, etree._Element]],
    transaction_log: TransactionLogConfig | None,
    problems: _Problems,
) -> bool:
    """Whether ``topic``'s FileName names a directory no other SOW topic (and not the
    journal) uses; a problem otherwise. Remembers it in ``stores``."""
    if topic.file_name is None:
        return True
    file_el = _first(topic_el, "FileName")
    where = os.path.normpath(topic.file_name)
    if transaction_log is not None and where == os.path.normpath(transaction_log.journal_directory):
        problems.add(
            file_el,
            f"SOW topic {topic.name!r} would keep its store in the JournalDirectory itself "
            f"({where})",
            "give FileName a directory of its own, e.g. ./sow/%n.sow",
        )
        return False
    other = stores.get(where)
    if other is not None:
        problems.add(
            file_el,
            f"SOW topics {other[0]!r} and {topic.name!r} would share the store directory "
            f"{where} (the other FileName is on line {_line(other[1])})",
            "give each SOW topic its own FileName; %n (the topic name and message type) "
            "keeps them apart, e.g. ./sow/%n.sow",
        )
        return False
    if file_el is not None:
        stores[where] = (topic.name, file_el)
    return True
