"""Whether a TransactionLog records every topic a SOW ``Pattern`` matches.

A SOW ``Pattern`` is searched (not anchored, as AMPS topic expressions are), while a
``TransactionLog/Topic`` Name must match a whole topic (``JournalTopic.matches``).
Whether one regular expression covers another cannot be decided by trying topics, so
the loader accepts what it can prove:

* a TransactionLog Topic of the same MessageType that matches every topic (``.*``);
* or one whose Name, read as a whole-topic expression, is the same expression as the
  Pattern read as a search: ``^orders/`` and ``orders/.*`` both mean "every topic that
  starts with ``orders/``", ``.*(?:P).*`` is the whole-topic form of any search ``P``;
* or one of the form ``PREFIX.*`` (a literal prefix) when every topic of the Pattern
  starts with a literal that starts with ``PREFIX``: ``orders.*`` records ``^orders/``.

Anything else is refused with the TransactionLog Topic that would do
(:func:`whole_topic_form`). Pure: no lxml, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from amps_py.config.model import JournalTopic

#: characters that make a topic Name a regular expression
_REGEX_CHARACTERS: Final = frozenset(".*+?[](){}|^$\\")
#: TransactionLog Names that match every topic
_EVERY_TOPIC: Final = frozenset({".*", "^.*", ".*$", "^.*$", "(.*)", "(?:.*)"})


def _collapse(expression: str) -> str:
    while ".*.*" in expression:
        expression = expression.replace(".*.*", ".*")
    return expression


def _strip_anchors(expression: str) -> tuple[str, bool, bool] | None:
    """(the expression without a leading ``^`` and a trailing unescaped ``$``, whether
    it had each); None when it has both anchors and an alternation, where removing
    them would change what the expression means (``^a|b$``)."""
    start = expression.startswith("^")
    core = expression[1:] if start else expression
    end = core.endswith("$") and not core.endswith("\\$")
    if end:
        core = core[:-1]
    if "|" in core and (start or end):
        return None
    return core, start, end


def whole_topic_form(pattern: str) -> str:
    """``pattern`` (searched) as an expression that matches whole topics, the form a
    TransactionLog Topic Name takes: ``^orders/`` -> ``orders/.*``, ``eu`` ->
    ``.*eu.*``; with an alternation, ``.*(?:a|b).*``."""
    parts = _strip_anchors(pattern)
    if parts is None:
        return f".*(?:{pattern}).*"
    core, start, end = parts
    if "|" in core:
        core = f"(?:{core})"
    return _collapse(("" if start else ".*") + core + ("" if end else ".*"))


def _journal_form(name: str) -> str:
    parts = _strip_anchors(name)
    if parts is None:
        return name
    core = parts[0]
    return _collapse(f"(?:{core})" if "|" in core else core)


def _prefix(form: str) -> str | None:
    """The literal start every topic of a whole-topic ``form`` has when the form is a
    literal, or a literal then ``.*``; None otherwise."""
    stem = form[:-2] if form.endswith(".*") else form
    return None if _REGEX_CHARACTERS & set(stem) else stem


def journal_covers_pattern(topics: Iterable[JournalTopic], pattern: str, message_type: str) -> bool:
    """Whether one of ``topics`` (the TransactionLog's) provably records every topic
    ``pattern`` matches, with ``message_type`` (see the module docstring)."""
    form = whole_topic_form(pattern)
    wanted = {form, f".*(?:{pattern}).*"}
    start = _prefix(form)
    for topic in topics:
        if topic.message_type != message_type:
            continue
        journal = _journal_form(topic.name)
        if topic.name in _EVERY_TOPIC or topic.name in wanted or journal in wanted:
            return True
        # orders.* records every topic of ^orders/ (orders/.*) and of ^orders/eu$
        covering = _prefix(journal) if journal.endswith(".*") else None
        if covering is not None and start is not None and start.startswith(covering):
            return True
    return False
