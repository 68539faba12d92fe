"""The public face of the package: :func:`compile_filter` and :class:`Filter`."""

from __future__ import annotations

import dataclasses
from typing import final

import orjson

from .compiler import Evaluator, TruthEvaluator, compile_tree, compile_value_tree
from .context import DEFAULT_CONTEXT, EvalContext
from .errors import FilterError
from .parser import parse


@final
class Filter:
    """A compiled content filter. Build one with :func:`compile_filter`.

    A Filter is immutable and holds no per-message state, so one instance can be shared by
    every subscription (and thread) that uses the same filter text.

    Attributes:
        source: the filter text it was compiled from.
    """

    __slots__ = ("_evaluate", "_uses_message_size", "source")

    def __init__(self, source: str, evaluate: TruthEvaluator, uses_message_size: bool) -> None:
        self.source = source
        self._evaluate = evaluate
        self._uses_message_size = uses_message_size

    def __repr__(self) -> str:
        return f"Filter({self.source!r})"

    def matches(self, doc: object, context: EvalContext | None = None) -> bool:
        """Whether the filter is TRUE for a parsed JSON document.

        Args:
            doc: the document as parsed JSON (dict, list, str, int, float, bool or None).
            context: values for CLIENT_NAME(), MESSAGE_SIZE() and friends; None means
                ``EvalContext()``.

        Returns:
            True only when the expression is TRUE; FALSE and NULL (unknown) both give
            False, as in SQL.

        Error handling:
            Never raises, whatever ``doc`` holds.
        """
        return self._evaluate(doc, context or DEFAULT_CONTEXT) is True

    def matches_json(self, payload: bytes, context: EvalContext | None = None) -> bool:
        """Whether the filter is TRUE for a JSON message body.

        ``payload`` is parsed with orjson. A payload that is not valid JSON is not an
        error: every field in it is NULL. If the filter calls MESSAGE_SIZE() and
        ``context.message_size`` is 0, the payload's length is used.

        Error handling:
            Never raises for any ``bytes`` payload.
        """
        try:
            doc: object = orjson.loads(payload)
        except orjson.JSONDecodeError:
            doc = None
        ctx = context or DEFAULT_CONTEXT
        if self._uses_message_size and ctx.message_size == 0:
            ctx = dataclasses.replace(ctx, message_size=len(payload))
        return self._evaluate(doc, ctx) is True


def compile_filter(text: str) -> Filter:
    """Parse and compile AMPS content-filter text.

    Compile once and keep the :class:`Filter`; evaluating it does no parsing.

    Args:
        text: the filter, e.g. ``"/status = 'open' AND /qty > 100"``.

    Returns:
        The compiled filter.

    Raises:
        FilterError: the text is not a valid filter. ``str(error)`` names the problem, the
            column, shows the text with a caret under it and suggests a fix;
            ``error.position`` is the 0-based offset and ``error.reason`` the ack reason.
    """
    if not text.strip():
        raise FilterError(
            "the filter is empty",
            text=text,
            position=0,
            hint="write a condition such as /status = 'open', or send no filter at all "
            "to receive every message",
        )
    try:
        node = parse(text)
        evaluate, uses_message_size = compile_tree(node, text)
    except RecursionError:  # the nesting limits should make this unreachable
        raise FilterError(
            "the filter is too deeply nested to compile",
            text=text,
            position=0,
            hint="remove redundant parentheses or split the filter into simpler parts",
        ) from None
    return Filter(text, evaluate, uses_message_size)


@final
class Expression:
    """A compiled value expression (e.g. a queue's ``Priority``, ``/priority * 2``).
    Build one with :func:`compile_expression`; like :class:`Filter` it is immutable."""

    __slots__ = ("_evaluate", "source")

    def __init__(self, source: str, evaluate: Evaluator) -> None:
        self.source = source
        self._evaluate = evaluate

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"

    def value(self, doc: object, context: EvalContext | None = None) -> object:
        """The expression's value for a parsed JSON document (None for NULL).

        Error handling: never raises for any document; a field that is missing or of
        the wrong type gives NULL, as in filters."""
        return self._evaluate(doc, context or DEFAULT_CONTEXT)


def compile_expression(text: str) -> Expression:
    """Parse and compile an AMPS value expression (the filter language's operands and
    functions, e.g. ``/priority`` or ``IF(/vip, 10, 1)``).

    Raises:
        FilterError: the text is not a valid expression (the message says where and
            suggests a fix, as for filters).
    """
    if not text.strip():
        raise FilterError(
            "the expression is empty",
            text=text,
            position=0,
            hint="write an expression such as /priority",
        )
    try:
        return Expression(text, compile_value_tree(parse(text), text))
    except RecursionError:
        raise FilterError(
            "the expression is too deeply nested to compile",
            text=text,
            position=0,
            hint="remove redundant parentheses",
        ) from None
