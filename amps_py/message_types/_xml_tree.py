"""XML with lxml: the hardened parser, element tree -> document, and the delta merge.

Imported on first use by :mod:`amps_py.message_types.xml` (so that importing the
message types, and the configuration model that holds them, loads no lxml).

The parser reads untrusted bytes: no network, no DTD loading, no entity substitution,
libxml2's default limits (``huge_tree`` off: depth 256, 10 MB text nodes), comments
and processing instructions dropped. A document with a ``<!DOCTYPE>`` is refused
outright: an AMPS XML message has no use for one, and refusing it closes the door on
entity tricks (the "billion laughs") whatever the parser version does with them.
"""

from __future__ import annotations

import copy
import threading
from typing import Final

from lxml import etree

from amps_py.filters.values import TextNode
from amps_py.message_types._base import MergeError

_local = threading.local()

#: a path's result for an attribute ``name`` is the key ``"@name"``
ATTRIBUTE_PREFIX: Final = "@"


def _parser() -> etree.XMLParser:
    """This thread's parser (an lxml parser may not be used by two threads at once)."""
    parser: etree.XMLParser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
            collect_ids=False,
        )
        _local.parser = parser
    return parser


def parse(payload: bytes) -> etree._Element | None:
    """The root element, or None when ``payload`` is not a well-formed XML document
    (or has a DOCTYPE). Never raises."""
    try:
        root = etree.fromstring(payload, _parser())
    except (etree.LxmlError, ValueError):
        return None
    if getattr(root.getroottree().docinfo, "doctype", ""):  # (lxml-stubs lack doctype)
        return None
    return root


def local_name(tag: str) -> str:
    """``Order`` for ``Order`` and for ``{urn:x}Order`` (namespaces are dropped)."""
    return tag.rpartition("}")[2] if tag[:1] == "{" else tag


def _own_text(el: etree._Element, children: list[etree._Element]) -> str:
    """The element's own text: as written when it has no child elements; else the text
    before, between and after them (``children``), joined, without the indentation
    around it ('' when that is only whitespace)."""
    if not children:
        text = el.text or ""
        return text if text.strip() else ""
    parts = [el.text or ""]
    parts.extend(child.tail or "" for child in children)
    return "".join(parts).strip()


def _elements(el: etree._Element) -> list[etree._Element]:
    """The child elements (the parser drops comments and processing instructions, and
    a document with entity declarations is refused, so this is every child)."""
    return [child for child in el if type(child.tag) is str]


def _attach(parent: dict[str, object], key: str, value: object) -> None:
    """Add a child value; a name seen before becomes a list in document order."""
    previous = parent.get(key, _ABSENT)
    if previous is _ABSENT:
        parent[key] = value
    elif type(previous) is list:
        previous.append(value)
    else:
        parent[key] = [previous, value]


_ABSENT: Final = object()


def to_document(root: etree._Element) -> dict[str, object]:
    """``{root name: value}``: see :mod:`amps_py.message_types.xml` for the mapping.

    An element with neither attributes nor child elements is its text; any other is
    an object of ``@attribute`` values and child values (a TextNode when it has text
    of its own). Iterative, so any depth the parser accepted converts.
    """
    doc: dict[str, object] = {}
    stack: list[tuple[etree._Element, dict[str, object]]] = [(root, doc)]
    while stack:
        el, parent = stack.pop()
        tag = str(el.tag)
        name = tag.rpartition("}")[2] if tag[0] == "{" else tag
        attributes = el.items()
        children = _elements(el) if len(el) else []
        if not children and not attributes:
            _attach(parent, name, el.text or "")
            continue
        text = _own_text(el, children)
        node: dict[str, object] = TextNode(text) if text else {}
        for attribute, value in attributes:
            key = str(attribute)
            key = key.rpartition("}")[2] if key[0] == "{" else key
            _attach(node, ATTRIBUTE_PREFIX + key, str(value))
        _attach(parent, name, node)
        stack.extend((child, node) for child in reversed(children))
    return doc


def merge(stored: bytes, delta: bytes) -> bytes:
    """The stored XML message with the delta merged in (see
    :meth:`amps_py.message_types.xml.XmlType.merge`)."""
    old = parse(stored)
    new = parse(delta)
    if old is None or new is None:
        which = "stored" if old is None else "delta"
        raise MergeError(
            f"the {which} message is not well-formed XML (or has a DOCTYPE, which amps-py "
            "refuses); publish a well-formed XML document"
        )
    if old.tag != new.tag:
        raise MergeError(
            f"the delta's root element <{local_name(str(new.tag))}> is not the stored "
            f"message's <{local_name(str(old.tag))}>: a delta must have the same root "
            "element as the message it updates"
        )
    stack = [(old, new)]
    while stack:
        target, changes = stack.pop()
        stack.extend(_merge_element(target, changes))
    declaration = stored.lstrip()[:5] == b"<?xml"
    return bytes(etree.tostring(old, encoding="UTF-8", xml_declaration=declaration))


def _merge_element(
    target: etree._Element, changes: etree._Element
) -> list[tuple[etree._Element, etree._Element]]:
    """Merge ``changes`` into ``target`` one level deep; return the child pairs that
    still need merging."""
    for name, value in changes.attrib.items():
        target.set(name, value)
    change_children = _elements(changes)
    if not change_children:  # a leaf in the delta replaces the element's content
        for child in list(target):
            target.remove(child)
        target.text = changes.text
        return []
    own = _own_text(changes, change_children)
    if own:
        target.text = own
    pending: list[tuple[etree._Element, etree._Element]] = []
    by_tag: dict[str, list[etree._Element]] = {}
    for child in change_children:
        by_tag.setdefault(str(child.tag), []).append(child)
    for tag, new_children in by_tag.items():
        old_children = [c for c in target if c.tag == tag]
        if len(old_children) == 1 and len(new_children) == 1:
            pending.append((old_children[0], new_children[0]))
            continue
        _replace_children(target, old_children, new_children)
    return pending


def _replace_children(
    target: etree._Element,
    old_children: list[etree._Element],
    new_children: list[etree._Element],
) -> None:
    """Replace a repeated element (an array) wholesale, where its first occurrence
    was; an element new to the message goes after the others. (Text that followed a
    replaced element in mixed content goes with it.)"""
    position = target.index(old_children[0]) if old_children else len(target)
    for child in old_children:
        target.remove(child)
    for offset, child in enumerate(new_children):
        fresh = copy.deepcopy(child)
        fresh.tail = None
        target.insert(position + offset, fresh)
