"""Turning a freshly decoded BSON or MessagePack tree into a document, in place."""

from __future__ import annotations

from collections.abc import Callable

#: a converted leaf may itself be a container (e.g. a BSON Timestamp becomes an object)
Leaf = Callable[[object], object]
Key = Callable[[object], str | None]

_PLAIN = (str, int, float, bool, type(None))


def clean_tree(root: object, leaf: Leaf, key: Key) -> object:
    """The document of a decoded tree: every value that is not a ``dict``, ``list``,
    ``str``, ``int``, ``float``, ``bool`` or ``None`` is replaced by ``leaf(value)``,
    every dict key that is not a ``str`` by ``key(k)`` (``None`` drops the entry).

    Changes the tree's own dicts and lists (the caller just decoded them) and returns
    the root (converted when it is itself a leaf). Iterative: any depth converts.
    ``leaf`` and ``key`` must not raise.
    """
    if type(root) is not dict and type(root) is not list:
        if type(root) in _PLAIN:
            return root
        root = leaf(root)
    stack: list[object] = [root] if type(root) is dict or type(root) is list else []
    while stack:
        node = stack.pop()
        if type(node) is list:
            for index, value in enumerate(node):
                kind = type(value)
                if kind is dict or kind is list:
                    stack.append(value)
                elif kind not in _PLAIN:
                    node[index] = converted = leaf(value)
                    if type(converted) is dict or type(converted) is list:
                        stack.append(converted)
            continue
        assert type(node) is dict
        if not all(type(k) is str for k in node):
            pairs = [(key(k) if type(k) is not str else k, v) for k, v in node.items()]
            node.clear()
            node.update((k, v) for k, v in pairs if k is not None)
        for name, value in node.items():
            kind = type(value)
            if kind is dict or kind is list:
                stack.append(value)
            elif kind not in _PLAIN:
                node[name] = converted = leaf(value)
                if type(converted) is dict or type(converted) is list:
                    stack.append(converted)
    return root


def text_of(data: bytes) -> str:
    """Bytes as text for a filter: UTF-8, with U+FFFD for what is not."""
    return data.decode("utf-8", "replace")
