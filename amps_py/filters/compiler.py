"""Node tree to Python closures.

Each node becomes one closure ``fn(doc, ctx) -> value``, built once per filter. The
closures capture their children directly, so evaluating a message runs no parser and no
dispatch on node types. Along the way the compiler:

* folds constant sub-expressions (``-5``, ``UPPER('x')``, ``2 * 3``) into literals;
* specialises comparisons against a literal with fast paths for the common types;
* precompiles LIKE and REGEXP_MATCH patterns and turns literal IN lists into sets;
* checks function names and argument counts, raising :class:`FilterError`.

Evaluation never raises: every operation has a defined result for every input (NULL,
NaN, or FALSE), including documents that are not JSON at all.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .context import DEFAULT_CONTEXT, EvalContext
from .errors import FilterError
from .functions import (
    ARITY,
    CONTEXT_FUNCTIONS,
    KNOWN_FUNCTIONS,
    SCALAR_FUNCTIONS,
    closest_function,
    describe_arity,
    quiet_compile,
    runtime_regex,
)
from .nodes import (
    Affix,
    Arith,
    Between,
    Call,
    Compare,
    InList,
    IsTest,
    Like,
    Literal,
    Logical,
    Negate,
    Node,
    Not,
    Path,
)
from .paths import count_nodes, make_getter
from .values import (
    NAN,
    UNORDERED,
    Scalar,
    Truth,
    Value,
    as_number,
    compare_sign,
    elements,
    first,
    is_nan,
    to_number,
    to_text,
    truth,
)

Evaluator = Callable[[object, EvalContext], Value]
TruthEvaluator = Callable[[object, EvalContext], Truth]

# compare_sign results that make each comparison TRUE. NaN is unordered: only != holds.
_SIGNS: dict[str, frozenset[int]] = {
    "=": frozenset({0}),
    "!=": frozenset({-1, 1, UNORDERED}),
    "<": frozenset({-1}),
    "<=": frozenset({-1, 0}),
    ">": frozenset({1}),
    ">=": frozenset({0, 1}),
}
_PY_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
# The signs that hold when the operands are swapped (a < b  <=>  b > a).
_MIRRORED = {_SIGNS[op]: _SIGNS[_FLIPPED[op]] for op in _SIGNS}
_GE = _SIGNS[">="]
_LE = _SIGNS["<="]


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled sub-expression.

    ``fn`` evaluates it; ``is_truth`` means ``fn`` only returns True/False/None;
    ``is_const`` means the result never changes, and ``value`` holds it.
    """

    fn: Evaluator
    is_truth: bool = False
    is_const: bool = False
    value: Value = None


def _constant(value: Value, is_truth: bool = False) -> Compiled:
    def const(doc: object, ctx: EvalContext) -> Value:
        return value

    return Compiled(const, is_truth, True, value)


def _fold(fn: Evaluator, children: Sequence[Compiled], is_truth: bool) -> Compiled:
    """Wrap ``fn``; if every child is constant, evaluate it now and keep the result."""
    if all(child.is_const for child in children):
        return _constant(fn(None, DEFAULT_CONTEXT), is_truth)
    return Compiled(fn, is_truth)


def as_truth(compiled: Compiled) -> TruthEvaluator:
    """An evaluator giving the SQL truth value of ``compiled`` (see ``values.truth``)."""
    if compiled.is_truth:
        return compiled.fn  # type: ignore[return-value]
    fn = compiled.fn

    def to_truth(doc: object, ctx: EvalContext) -> Truth:
        return truth(fn(doc, ctx))

    return to_truth


def _negated(fn: TruthEvaluator) -> TruthEvaluator:
    def negate(doc: object, ctx: EvalContext) -> Truth:
        result = fn(doc, ctx)
        return result if result is None else not result

    return negate


# -- comparisons ------------------------------------------------------------------------


def compare_values(signs: frozenset[int], a: Value, b: Value) -> Truth:
    """Compare two values with any-element semantics; NULL on either side is NULL."""
    if a is None or b is None:
        return None
    if type(a) is not list:
        if type(b) is not list:
            return compare_sign(a, b) in signs  # type: ignore[arg-type]
        a, b = b, a
        signs = _MIRRORED[signs]
    # a is a list; b is a scalar or a list
    for x in a:
        if type(b) is list:
            for y in b:
                if compare_sign(x, y) in signs:
                    return True
        elif compare_sign(x, b) in signs:  # type: ignore[arg-type]
            return True
    return False


def _compare_with_constant(fn: Evaluator, op: str, c: Value) -> TruthEvaluator:
    signs = _SIGNS[op]
    pyop = _PY_OPS[op]
    if type(c) is int or type(c) is float:

        def compare_number(doc: object, ctx: EvalContext) -> Truth:
            v = fn(doc, ctx)
            if type(v) is int or type(v) is float:
                return pyop(v, c)
            if v is None:
                return None
            return compare_values(signs, v, c)

        return compare_number

    if type(c) is str:

        def compare_string(doc: object, ctx: EvalContext) -> Truth:
            v = fn(doc, ctx)
            if type(v) is str:
                return pyop(v, c)
            if v is None:
                return None
            return compare_values(signs, v, c)

        return compare_string

    def compare_other(doc: object, ctx: EvalContext) -> Truth:
        return compare_values(signs, fn(doc, ctx), c)

    return compare_other


# -- arithmetic -------------------------------------------------------------------------


def _add(x: int | float, y: int | float) -> int | float:
    try:
        return x + y
    except OverflowError:  # an int too big to turn into a float
        return NAN


def _sub(x: int | float, y: int | float) -> int | float:
    try:
        return x - y
    except OverflowError:
        return NAN


def _mul(x: int | float, y: int | float) -> int | float:
    try:
        return x * y
    except OverflowError:
        return NAN


def _div(x: int | float, y: int | float) -> int | float:
    """Division; int / int truncates toward zero; dividing by zero gives NaN."""
    if y == 0:
        return NAN
    if type(x) is int and type(y) is int:
        quotient = abs(x) // abs(y)
        return quotient if (x < 0) == (y < 0) else -quotient
    try:
        return x / y
    except OverflowError:
        return NAN


def _mod(x: int | float, y: int | float) -> int | float:
    """Remainder with the sign of the left operand; modulo zero gives NaN."""
    if y == 0:
        return NAN
    if type(x) is int and type(y) is int:
        remainder = abs(x) % abs(y)
        return -remainder if x < 0 else remainder
    try:
        return math.fmod(x, y)
    except (ValueError, OverflowError):  # fmod(inf, y); huge ints
        return NAN


_ARITH: dict[str, Callable[[int | float, int | float], int | float]] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": _div,
    "%": _mod,
}


class _Compiler:
    def __init__(self, text: str) -> None:
        self.text = text
        self.uses_message_size = False

    def error(self, problem: str, pos: int, hint: str = "") -> FilterError:
        return FilterError(problem, text=self.text, position=pos, hint=hint)

    def compile(self, node: Node) -> Compiled:
        match node:
            case Literal():
                return _constant(node.value)
            case Path():
                return Compiled(make_getter(node.steps))
            case Logical():
                return self.logical(node)
            case Not():
                operand = self.compile(node.operand)
                return _fold(_negated(as_truth(operand)), [operand], True)
            case Compare():
                return self.comparison(node)
            case Between():
                return self.between(node)
            case InList():
                return self.in_list(node)
            case Like():
                return self.like(node)
            case Affix():
                return self.affix(node)
            case IsTest():
                return self.is_test(node)
            case Negate():
                return self.negate(node)
            case Arith():
                return self.arith(node)
            case Call():
                return self.call(node)
        raise AssertionError(f"unknown node {node!r}")  # pragma: no cover

    def _maybe_negated(self, fn: TruthEvaluator, negated: bool) -> TruthEvaluator:
        return _negated(fn) if negated else fn

    # -- logic ---------------------------------------------------------------------------

    def logical(self, node: Logical) -> Compiled:
        children = [self.compile(operand) for operand in node.operands]
        fns = [as_truth(child) for child in children]
        fn = _and(fns) if node.op == "AND" else _or(fns)
        return _fold(fn, children, True)

    # -- comparisons ---------------------------------------------------------------------

    def comparison(self, node: Compare) -> Compiled:
        left = self.compile(node.left)
        right = self.compile(node.right)
        op = node.op
        fn: TruthEvaluator
        if right.is_const and not left.is_const:
            fn = _compare_with_constant(left.fn, op, right.value)
        elif left.is_const and not right.is_const:
            fn = _compare_with_constant(right.fn, _FLIPPED[op], left.value)
        else:
            signs = _SIGNS[op]
            fa, fb = left.fn, right.fn

            def compare(doc: object, ctx: EvalContext) -> Truth:
                return compare_values(signs, fa(doc, ctx), fb(doc, ctx))

            fn = compare
        return _fold(fn, [left, right], True)

    def between(self, node: Between) -> Compiled:
        operand = self.compile(node.operand)
        low = self.compile(node.low)
        high = self.compile(node.high)
        fo, flow, fhigh = operand.fn, low.fn, high.fn

        def between(doc: object, ctx: EvalContext) -> Truth:
            v = fo(doc, ctx)
            lo = first(flow(doc, ctx))
            hi = first(fhigh(doc, ctx))
            if v is None or lo is None or hi is None:
                return None
            if type(v) is list:
                return any(compare_sign(x, lo) in _GE and compare_sign(x, hi) in _LE for x in v)
            return compare_sign(v, lo) in _GE and compare_sign(v, hi) in _LE  # type: ignore[arg-type]

        fn = self._maybe_negated(between, node.negated)
        return _fold(fn, [operand, low, high], True)

    def in_list(self, node: InList) -> Compiled:
        operand = self.compile(node.operand)
        items = [self.compile(item) for item in node.items]
        fo = operand.fn
        fn: TruthEvaluator
        if all(item.is_const for item in items):
            fn = _in_constant_set(fo, [first(item.value) for item in items])
        else:
            item_fns = [item.fn for item in items]
            equal = _SIGNS["="]

            def in_any(doc: object, ctx: EvalContext) -> Truth:
                v = fo(doc, ctx)
                if v is None:
                    return None
                unknown = False
                for item_fn in item_fns:
                    result = compare_values(equal, v, item_fn(doc, ctx))
                    if result:
                        return True
                    if result is None:
                        unknown = True
                return None if unknown else False

            fn = in_any
        fn = self._maybe_negated(fn, node.negated)
        return _fold(fn, [operand, *items], True)

    def compile_pattern(self, pattern: str, pos: int, where: str) -> re.Pattern[str]:
        try:
            return quiet_compile(pattern)
        except re.error as exc:
            problem = f"bad regular expression in {where}: {exc.msg}"
            # Point at the offending character when the literal has no escapes to undo.
            body = pos + (2 if self.text[pos : pos + 1] in ("r", "R") else 1)
            if exc.pos is not None:
                if self.text[body : body + len(pattern)] == pattern:
                    pos = body + exc.pos
                else:
                    problem += f" (at character {exc.pos + 1} of the pattern)"
            raise self.error(
                problem,
                pos,
                "escape regex special characters with a backslash; in '...' strings a "
                "backslash must be doubled (\\\\d), or use a raw string r'\\d'",
            ) from None
        except (ValueError, OverflowError, RecursionError) as exc:
            raise self.error(
                f"bad regular expression in {where}: {exc}",
                pos,
                "simplify the pattern",
            ) from None

    def like(self, node: Like) -> Compiled:
        operand = self.compile(node.operand)
        search = self.compile_pattern(node.pattern, node.pattern_pos, "LIKE").search
        fo = operand.fn

        def like(doc: object, ctx: EvalContext) -> Truth:
            v = fo(doc, ctx)
            if type(v) is str:
                return search(v) is not None
            if v is None:
                return None
            for x in elements(v):
                text = to_text(x)
                if text is not None and search(text) is not None:
                    return True
            return False

        fn = self._maybe_negated(like, node.negated)
        return _fold(fn, [operand], True)

    def affix(self, node: Affix) -> Compiled:
        operand = self.compile(node.operand)
        affixes: list[str] = []
        for item_node in node.items:
            item = self.compile(item_node)
            text = to_text(first(item.value)) if item.is_const else None
            if text is None:
                raise self.error(
                    f"{node.which} WITH needs literal strings in its list",
                    item_node.pos,
                    f"write /a {node.which} WITH ('x', 'y'); to test a field against "
                    "another field use INSTR or LIKE",
                )
            affixes.append(text)
        wanted = tuple(affixes)
        fo = operand.fn
        method = str.startswith if node.which == "BEGINS" else str.endswith

        def affix(doc: object, ctx: EvalContext) -> Truth:
            v = fo(doc, ctx)
            if type(v) is str:
                return method(v, wanted)
            if v is None:
                return None
            for x in elements(v):
                text = to_text(x)
                if text is not None and method(text, wanted):
                    return True
            return False

        fn = self._maybe_negated(affix, node.negated)
        return _fold(fn, [operand], True)

    def is_test(self, node: IsTest) -> Compiled:
        operand = self.compile(node.operand)
        fo = operand.fn
        fn: TruthEvaluator
        if node.what == "NULL":
            if node.negated:

                def is_not_null(doc: object, ctx: EvalContext) -> Truth:
                    return fo(doc, ctx) is not None

                fn = is_not_null
            else:

                def is_null(doc: object, ctx: EvalContext) -> Truth:
                    return fo(doc, ctx) is None

                fn = is_null
        else:

            def is_nan_test(doc: object, ctx: EvalContext) -> Truth:
                v = fo(doc, ctx)
                if v is None:
                    return False
                return any(is_nan(x) for x in elements(v))

            fn = _negated(is_nan_test) if node.negated else is_nan_test
        return _fold(fn, [operand], True)

    # -- arithmetic ----------------------------------------------------------------------

    def negate(self, node: Negate) -> Compiled:
        operand = self.compile(node.operand)
        fo = operand.fn
        if node.op == "+":

            def plus(doc: object, ctx: EvalContext) -> Value:
                return as_number(first(fo(doc, ctx)))

            return _fold(plus, [operand], False)

        def minus(doc: object, ctx: EvalContext) -> Value:
            x = as_number(first(fo(doc, ctx)))
            return None if x is None else -x

        return _fold(minus, [operand], False)

    def arith(self, node: Arith) -> Compiled:
        left = self.compile(node.left)
        right = self.compile(node.right)
        fa, fb = left.fn, right.fn
        impl = _ARITH[node.op]

        def arith(doc: object, ctx: EvalContext) -> Value:
            x = as_number(first(fa(doc, ctx)))
            if x is None:
                return None
            y = as_number(first(fb(doc, ctx)))
            if y is None:
                return None
            return impl(x, y)

        return _fold(arith, [left, right], False)

    # -- functions -----------------------------------------------------------------------

    def call(self, node: Call) -> Compiled:
        name = node.name
        if name not in ARITY:
            guess, likely = closest_function(name)
            hint = (
                f"did you mean {guess}()?"
                if likely
                else f"the closest known function is {guess}(); all known functions: "
                + ", ".join(KNOWN_FUNCTIONS)
            )
            raise self.error(f"unknown function {name}()", node.pos, hint)
        low, high = ARITY[name]
        count = len(node.args)
        if count < low or (high is not None and count > high):
            raise self.error(
                f"{name}() {describe_arity(name)}, but was given {count}",
                node.pos,
                f"check the commas in the call to {name}()",
            )
        args = [self.compile(arg) for arg in node.args]
        fns = [arg.fn for arg in args]

        if name in CONTEXT_FUNCTIONS:
            if name == "MESSAGE_SIZE":
                self.uses_message_size = True
            context_fn = CONTEXT_FUNCTIONS[name]

            def from_context(doc: object, ctx: EvalContext) -> Value:
                return context_fn(ctx)

            return Compiled(from_context)

        if name == "IF":
            condition = as_truth(args[0])
            then_fn, else_fn = fns[1], fns[2]

            def if_(doc: object, ctx: EvalContext) -> Value:
                if condition(doc, ctx) is True:
                    return first(then_fn(doc, ctx))
                return first(else_fn(doc, ctx))

            return _fold(if_, args, False)

        if name == "COALESCE":

            def coalesce(doc: object, ctx: EvalContext) -> Value:
                for fn in fns:
                    v = fn(doc, ctx)
                    if v is not None:
                        return first(v)
                return None

            return _fold(coalesce, args, False)

        if name == "ARRAY_COUNT":
            (target,) = node.args
            if isinstance(target, Path):
                steps = target.steps

                def count_path(doc: object, ctx: EvalContext) -> Value:
                    return count_nodes(doc, steps)

                return Compiled(count_path)
            (counted,) = fns

            def array_count(doc: object, ctx: EvalContext) -> Value:
                v = counted(doc, ctx)
                if v is None:
                    return 0
                return len(v) if type(v) is list else 1

            return _fold(array_count, args, False)

        if name == "REGEXP_MATCH":
            return self.regexp_match(node, args)

        impl = SCALAR_FUNCTIONS[name]
        call_fn: Evaluator
        if count == 0:
            return _constant(impl())
        if count == 1:
            (f0,) = fns

            def call1(doc: object, ctx: EvalContext) -> Value:
                return impl(first(f0(doc, ctx)))

            call_fn = call1
        elif count == 2:
            f0, f1 = fns

            def call2(doc: object, ctx: EvalContext) -> Value:
                return impl(first(f0(doc, ctx)), first(f1(doc, ctx)))

            call_fn = call2
        else:

            def call_n(doc: object, ctx: EvalContext) -> Value:
                return impl(*[first(fn(doc, ctx)) for fn in fns])

            call_fn = call_n
        return _fold(call_fn, args, False)

    def regexp_match(self, node: Call, args: list[Compiled]) -> Compiled:
        subject, pattern = args
        fs = subject.fn
        if pattern.is_const:
            text = to_text(first(pattern.value))
            if text is None:
                return _constant(None)
            search = self.compile_pattern(text, node.args[1].pos, "REGEXP_MATCH").search

            def match_fixed(doc: object, ctx: EvalContext) -> Value:
                s = to_text(first(fs(doc, ctx)))
                return None if s is None else search(s) is not None

            return _fold(match_fixed, [subject], True)

        fp = pattern.fn

        def match_dynamic(doc: object, ctx: EvalContext) -> Value:
            s = to_text(first(fs(doc, ctx)))
            p = to_text(first(fp(doc, ctx)))
            if s is None or p is None:
                return None
            regex = runtime_regex(p)
            return None if regex is None else regex.search(s) is not None

        return Compiled(match_dynamic, True)


def _and(fns: list[TruthEvaluator]) -> TruthEvaluator:
    if len(fns) == 2:
        f1, f2 = fns

        def and2(doc: object, ctx: EvalContext) -> Truth:
            a = f1(doc, ctx)
            if a is False:
                return False
            b = f2(doc, ctx)
            if b is False:
                return False
            return a if b is True else None

        return and2

    def and_n(doc: object, ctx: EvalContext) -> Truth:
        result: Truth = True
        for fn in fns:
            r = fn(doc, ctx)
            if r is False:
                return False
            if r is None:
                result = None
        return result

    return and_n


def _or(fns: list[TruthEvaluator]) -> TruthEvaluator:
    if len(fns) == 2:
        f1, f2 = fns

        def or2(doc: object, ctx: EvalContext) -> Truth:
            a = f1(doc, ctx)
            if a is True:
                return True
            b = f2(doc, ctx)
            if b is True:
                return True
            return a if b is False else None

        return or2

    def or_n(doc: object, ctx: EvalContext) -> Truth:
        result: Truth = False
        for fn in fns:
            r = fn(doc, ctx)
            if r is True:
                return True
            if r is None:
                result = None
        return result

    return or_n


def _in_constant_set(fo: Evaluator, constants: list[Scalar | None]) -> TruthEvaluator:
    """IN against literals, as set lookups that follow the '=' conversion rules."""
    strings = {c for c in constants if type(c) is str}
    literal_numbers: set[object] = {
        c for c in constants if c is not None and type(c) is not str and c == c
    }
    all_numbers = set(literal_numbers)
    for s in strings:
        number = to_number(s)
        if number is not None and number == number:
            all_numbers.add(number)
    has_null = any(c is None for c in constants)
    miss: Truth = None if has_null else False

    def member(x: Scalar) -> bool:
        if type(x) is str:
            if x in strings:
                return True
            number = to_number(x)
            return number is not None and number in literal_numbers
        return x in all_numbers

    def in_set(doc: object, ctx: EvalContext) -> Truth:
        v = fo(doc, ctx)
        if type(v) is str:
            if v in strings:
                return True
        elif type(v) is int or type(v) is float:
            if v in all_numbers:
                return True
            return miss
        if v is None:
            return None
        for x in elements(v):
            if member(x):
                return True
        return miss

    return in_set


def compile_value_tree(node: Node, text: str) -> Evaluator:
    """Compile a parsed expression to an evaluator of its value (a number, string,
    boolean or NULL), for expressions that are not conditions (a queue's Priority).

    Raises:
        FilterError: as :func:`compile_tree`.
    """
    return _Compiler(text).compile(node).fn


def compile_tree(node: Node, text: str) -> tuple[TruthEvaluator, bool]:
    """Compile a parsed filter to a truth evaluator.

    Returns:
        The evaluator, and whether it calls MESSAGE_SIZE().

    Raises:
        FilterError: unknown functions, wrong argument counts, bad regular expressions,
            non-literal BEGINS/ENDS WITH lists.
    """
    compiler = _Compiler(text)
    root = compiler.compile(node)
    return as_truth(root), compiler.uses_message_size
