"""Field paths over parsed JSON.

Semantics (the JSON reading of AMPS's XPath-like identifiers):

* ``/a/b`` looks up ``a`` then ``b`` in objects.
* When a step lands on an array, the path continues through every element, so
  ``/items/qty`` over ``{"items": [{"qty": 1}, {"qty": 5}]}`` is the multi-value [1, 5].
* ``[n]`` picks the n-th (0-based) of the values collected so far, so ``/arr[0]`` is the
  first element of ``arr``; an element that is itself an array is entered, so
  ``/m[0][1]`` indexes a matrix.
* At the end, arrays are flattened; objects, JSON null and empty strings are dropped
  (they have no scalar value), except an object that carries text (an XML element with
  attributes and text, :class:`~amps_py.filters.values.TextNode`), whose value is its
  text. No values is NULL, one value is a scalar, more is a list.

Walking never raises, whatever the document holds.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import EvalContext
from .lexer import PathStep
from .values import Scalar, Value, scalar_of

Getter = Callable[[object, EvalContext], Value]


_ABSENT = object()


def _flatten_into(array: list[object], out: list[object]) -> None:
    """Append the leaves of a nested array to ``out`` in order, without recursion."""
    stack = list(reversed(array))
    while stack:
        node = stack.pop()
        if type(node) is list:
            stack.extend(reversed(node))
        else:
            out.append(node)


def _finish(nodes: list[object]) -> Value:
    """Collect the scalars under ``nodes`` (flattening arrays) into a value."""
    out: list[Scalar] = []
    for node in nodes:
        if type(node) is list:
            leaves: list[object] = []
            _flatten_into(node, leaves)
            out.extend(s for s in map(scalar_of, leaves) if s is not None)
            continue
        scalar = scalar_of(node)
        if scalar is not None:
            out.append(scalar)
    if not out:
        return None
    if len(out) == 1:
        return out[0]
    return out


def normalise(node: object) -> Value:
    """The value of one looked-up JSON node."""
    if type(node) is list:
        return _finish(node)
    return scalar_of(node)


def _step_key(nodes: list[object], key: str) -> list[object]:
    out: list[object] = []
    for node in nodes:
        if isinstance(node, dict):
            child = node.get(key, _ABSENT)
            if child is _ABSENT:
                continue
            if type(child) is list:
                out.extend(child)
            else:
                out.append(child)
        elif type(node) is list:  # nested arrays: look inside every element, in order
            leaves: list[object] = []
            _flatten_into(node, leaves)
            out.extend(_step_key([leaf for leaf in leaves if isinstance(leaf, dict)], key))
    return out


def _step_index(nodes: list[object], index: int) -> list[object]:
    if index >= len(nodes):
        return []
    chosen = nodes[index]
    if type(chosen) is list:
        return list(chosen)
    return [chosen]


def walk(doc: object, steps: tuple[PathStep, ...]) -> Value:
    """Evaluate a path over ``doc`` in full generality."""
    return _walk_nodes([doc], steps)


def _walk_nodes(nodes: list[object], steps: tuple[PathStep, ...]) -> Value:
    for step in steps:
        key = step.key
        nodes = _step_index(nodes, step.index) if key is None else _step_key(nodes, key)
        if not nodes:
            return None
    return _finish(nodes)


def make_getter(steps: tuple[PathStep, ...]) -> Getter:
    """A closure that evaluates the path ``steps`` over a document.

    Paths made only of keys get a fast path for plain nested objects; anything else (an
    array on the way, a subscript, a non-object document) takes :func:`walk`.
    """
    if any(step.key is None for step in steps):

        def get_general(doc: object, ctx: EvalContext) -> Value:
            return walk(doc, steps)

        return get_general

    keys = tuple(step.key for step in steps if step.key is not None)
    if len(keys) == 1:
        (key,) = keys

        def get_one(doc: object, ctx: EvalContext) -> Value:
            if type(doc) is dict:
                value = doc.get(key)
                if type(value) is str:
                    return value or None
                if type(value) is int or type(value) is float or type(value) is bool:
                    return value
                if value is None:
                    return None
                return normalise(value)
            return walk(doc, steps)

        return get_one

    # The rest of the path from each step, for resuming the general walk mid-way.
    rests = tuple(steps[i:] for i in range(len(steps)))

    def get_many(doc: object, ctx: EvalContext) -> Value:
        node = doc
        for i, key in enumerate(keys):
            if type(node) is dict:
                node = node.get(key)
            elif node is None:
                return None
            elif type(node) is list:
                return _walk_nodes(node, rests[i])
            else:
                return walk(node, rests[i])
        if type(node) is str:
            return node or None
        if type(node) is int or type(node) is float or type(node) is bool:
            return node
        if node is None:
            return None
        return normalise(node)

    return get_many


def count_nodes(doc: object, steps: tuple[PathStep, ...]) -> int:
    """How many values a path finds, counting objects too (for ARRAY_COUNT).

    Arrays are expanded (nested ones too); JSON null and empty strings are not counted.
    """
    nodes: list[object] = [doc]
    for step in steps:
        key = step.key
        nodes = _step_index(nodes, step.index) if key is None else _step_key(nodes, key)
        if not nodes:
            return 0
    total = 0
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if type(node) is list:
            stack.extend(node)
        elif isinstance(node, dict) or scalar_of(node) is not None:
            total += 1
    return total
