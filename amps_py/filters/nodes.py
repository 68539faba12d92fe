"""The parsed filter: a small tree of frozen nodes.

Every node records ``pos`` (0-based offset of the text it came from, for error messages)
and ``depth`` (height of the subtree, so the parser can refuse trees too deep to evaluate
safely). The compiler turns this tree into closures once; it is never walked per message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from .lexer import PathStep

LiteralValue = bool | int | float | str | None


@dataclass(frozen=True, slots=True)
class Literal:
    """A literal: number, string, TRUE/FALSE, or NULL (None). '' is stored as None."""

    pos: int
    value: LiteralValue
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Path:
    """A field path such as ``/a/b[0]``."""

    pos: int
    text: str
    steps: tuple[PathStep, ...]
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Negate:
    """Unary minus (``-x``) or plus (``+x``)."""

    pos: int
    op: str
    operand: Node
    depth: int


@dataclass(frozen=True, slots=True)
class Arith:
    """Binary arithmetic: ``+ - * / %`` (MOD is stored as ``%``)."""

    pos: int
    op: str
    left: Node
    right: Node
    depth: int


@dataclass(frozen=True, slots=True)
class Compare:
    """Binary comparison: ``= != < <= > >=`` (``==`` and ``<>`` are normalised)."""

    pos: int
    op: str
    left: Node
    right: Node
    depth: int


@dataclass(frozen=True, slots=True)
class Between:
    """``operand [NOT] BETWEEN low AND high`` (inclusive)."""

    pos: int
    negated: bool
    operand: Node
    low: Node
    high: Node
    depth: int


@dataclass(frozen=True, slots=True)
class InList:
    """``operand [NOT] IN (items...)``."""

    pos: int
    negated: bool
    operand: Node
    items: tuple[Node, ...]
    depth: int


@dataclass(frozen=True, slots=True)
class Like:
    """``operand [NOT] LIKE 'pattern'``; ``pattern_pos`` points at the pattern literal."""

    pos: int
    negated: bool
    operand: Node
    pattern: str
    pattern_pos: int
    depth: int


@dataclass(frozen=True, slots=True)
class Affix:
    """``operand [NOT] BEGINS WITH (...)`` or ``ENDS WITH (...)``; ``which`` is BEGINS/ENDS."""

    pos: int
    which: str
    negated: bool
    operand: Node
    items: tuple[Node, ...]
    depth: int


@dataclass(frozen=True, slots=True)
class IsTest:
    """``operand IS [NOT] NULL`` or ``operand IS [NOT] NAN``; ``what`` is NULL/NAN."""

    pos: int
    what: str
    negated: bool
    operand: Node
    depth: int


@dataclass(frozen=True, slots=True)
class Not:
    """Logical ``NOT operand``."""

    pos: int
    operand: Node
    depth: int


@dataclass(frozen=True, slots=True)
class Logical:
    """``a AND b AND ...`` or ``a OR b OR ...``, flattened to one n-ary node."""

    pos: int
    op: str
    operands: tuple[Node, ...]
    depth: int


@dataclass(frozen=True, slots=True)
class Call:
    """A function call; ``name`` is upper-cased."""

    pos: int
    name: str
    args: tuple[Node, ...]
    depth: int


# Nodes that compute a datum, and nodes that compute a SQL truth value (TRUE/FALSE/NULL).
ValueNode: TypeAlias = Literal | Path | Negate | Arith | Call
ConditionNode: TypeAlias = Compare | Between | InList | Like | Affix | IsTest | Not | Logical
Node: TypeAlias = ValueNode | ConditionNode
