"""Whether a TransactionLog records every topic a SOW ``Pattern`` matches.

A SOW ``Pattern`` is searched (not anchored, as AMPS topic expressions are), while a
``TransactionLog/Topic`` Name must match a whole topic (``JournalTopic.matches``).
Whether one regular expression covers another cannot be decided by trying topics, so
the loader accepts what it can prove:

* a TransactionLog Topic of the same MessageType that matches every topic (``.*``);
* or one whose Name, read as a whole-topic expression, is the same expression as the
  Pattern read as a search: ``^orders/`` and ``orders/.*`` both mean "every topic that
  starts with ``orders/``", ``.*(?:P).*`` is the whole-topic form of any search ``P``.

Anything else is refused with the TransactionLog Topic that would do
(:func:`whole_topic_form`). Pure: no lxml, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from amps_py.config.model import JournalTopic

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


def journal_covers_pattern(topics: Iterable[JournalTopic], pattern: str, message_type: str) -> bool:
    """Whether one of ``topics`` (the TransactionLog's) provably records every topic
    ``pattern`` matches, with ``message_type`` (see the module docstring)."""
    wanted = {whole_topic_form(pattern), f".*(?:{pattern}).*"}
    for topic in topics:
        if topic.message_type != message_type:
            continue
        if topic.name in _EVERY_TOPIC or _journal_form(topic.name) in wanted:
            return True
        if topic.name in wanted:
            return True
    return False
