"""XML messages (of any schema), read with a hardened lxml parser.

The document keeps the root element's name as its one top-level key, so paths read
like XPath from the root:

=============================================  =========================================
XML                                            document
=============================================  =========================================
``<Order><Qty>10</Qty></Order>``               ``{"Order": {"Qty": "10"}}``
``<Order id="5">...</Order>``                  ``{"Order": {"@id": "5", ...}}``
``<Order><Leg>a</Leg><Leg>b</Leg></Order>``    ``{"Order": {"Leg": ["a", "b"]}}``
``<Price ccy="USD">10.5</Price>``              an object with ``"@ccy"`` whose own value
                                               is its text ``"10.5"``
=============================================  =========================================

So ``/Order/Qty > 5``, ``/Order/@id = '5'``, ``/Order/Leg = 'b'``, ``/Order/Leg[1]``,
``/Order/Price > 10`` and ``/Order/Price/@ccy = 'USD'`` all work. Rules:

* an element with neither attributes nor child elements is its text (``''``, so NULL,
  when empty); values are strings (compared with a number, a numeric string converts);
* an element with attributes or children is an object: ``@name`` for each attribute,
  its child elements by name (repeated names become a list in document order); its
  own text, unless only whitespace, is its value (a
  :class:`~amps_py.filters.values.TextNode`), else it has none (NULL), like a JSON
  object. Beside child elements (mixed content) the own text is the pieces between
  them joined, without the indentation around it;
* namespaces are dropped: elements and attributes are addressed by their local name
  (``<o:Order xmlns:o="urn:x">`` is ``/Order``); two names that differ only by
  namespace are one repeated name;
* comments and processing instructions are ignored; CDATA is text;
* a payload that is not well-formed XML, or has a ``<!DOCTYPE>``, has no document.

``delta_publish`` (AMPS supports it for XML) merges element by element: the delta's
root element must be the stored one's; its attributes replace or add attributes; a
child that occurs once on both sides is merged the same way, deeper; a leaf element
(no child elements) replaces the element's text and children; an element that is
repeated on either side is replaced as a whole (an array), at the place of its first
occurrence; elements new to the message are appended. Nothing can be removed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import ClassVar, Final

from amps_py.filters.values import TextNode
from amps_py.message_types._base import MessageType


@cache
def _tree() -> ModuleType:
    """The lxml half of this type, loaded on first use (see ``_xml_tree``)."""
    return importlib.import_module("amps_py.message_types._xml_tree")


@dataclass(frozen=True, slots=True)
class XmlType:
    """The ``xml`` module (see the module docstring). Immutable; thread-safe."""

    name: str = "xml"
    module: ClassVar[str] = "xml"
    supports_delta: ClassVar[bool] = True

    def document(self, payload: bytes) -> object | None:
        """``{root name: value}``, or None when the payload is not well-formed XML (or
        has a DOCTYPE). Never raises."""
        tree = _tree()
        root = tree.parse(payload)
        if root is None:
            return None
        doc: dict[str, object] = tree.to_document(root)
        return doc

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        """The stored message with the delta merged in, element by element (see the
        module docstring), as UTF-8 (with an XML declaration when the stored message
        had one).

        Raises:
            MergeError: a message is not well-formed XML, or the root elements differ.
        """
        merged: bytes = _tree().merge(stored, delta)
        return merged

    def to_jsonable(self, payload: bytes) -> object | None:
        """The document with each element that has text and attributes or children as
        an object whose ``#text`` key holds the text; None when malformed."""
        doc = self.document(payload)
        return None if doc is None else jsonable(doc)


def jsonable(doc: object) -> object:
    """A copy of a document that JSON tools can print: a
    :class:`~amps_py.filters.values.TextNode` becomes a plain object with its text under
    ``#text`` (first). Iterative, so any depth converts."""
    out: list[object] = []
    stack: list[tuple[object, list[object] | dict[str, object], object]] = [(doc, out, None)]
    while stack:
        node, parent, key = stack.pop()
        copied: object
        if isinstance(node, dict):
            copied = {"#text": node.text} if type(node) is TextNode else {}
            assert isinstance(copied, dict)
            stack.extend((value, copied, name) for name, value in reversed(node.items()))
        elif type(node) is list:
            copied = []
            stack.extend((value, copied, None) for value in reversed(node))
        else:
            copied = node
        if isinstance(parent, dict):
            parent[str(key)] = copied
        else:
            parent.append(copied)
    return out[0]


#: the default ``xml`` type
XML: Final[MessageType] = XmlType()
