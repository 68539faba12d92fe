"""``MessageTypes`` -> :class:`~amps_py.message_types.MessageTypes`, and every
``MessageType`` that names a type checked against the result.

An instance knows AMPS's default types (fix, nvfix, xml, json, msgpack, bson, binary:
:func:`~amps_py.message_types.default_types`) plus what ``<MessageTypes>`` declares,
one ``<MessageType>`` each:

* ``Name`` (required): letters, digits, ``-``, ``_`` and ``.``, unique in the section.
  A default name changes that type's settings (``<Name>fix</Name>`` with another
  ``FieldSeparator``) and must keep its module; AMPS's names for the types amps-py does
  not build (bflat, protobuf, ...) cannot name another type;
* ``Module``: one of the modules amps-py builds; may be left out when ``Name`` is one
  of them. AMPS's other modules are "recognised by AMPS but not supported by amps-py
  yet";
* ``FieldSeparator``, ``HeaderSeparator``, ``MessageSeparator``: for the fix and nvfix
  modules only, each one byte written as one character (``|``), or its value in
  decimal (``1``) or hex (``0x01``); a digit or a space is written as its value.
  ``FieldSeparator`` cannot be ``=``.

Then every other ``MessageType`` element (on a Transport, a TransactionLog, SOW,
queue or Replication topic, an Action's Options) must name a type the instance knows:
a name AMPS has but amps-py does not build is "recognised by AMPS but not supported
yet", any other unknown name is an error whose fix declares it in ``<MessageTypes>``.
"""

from __future__ import annotations

import re
from typing import Final

from lxml import etree

from amps_py.config.problems import _Problems
from amps_py.config.values import _text
from amps_py.config.xmltree import _children, _closest, _first, _line, _one_of
from amps_py.message_types import (
    AMPS_ONLY_MODULES,
    BUILT_MODULES,
    SEPARATED_MODULES,
    MessageType,
    MessageTypes,
    default_types,
    make_type,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_SEPARATORS: Final = ("FieldSeparator", "HeaderSeparator", "MessageSeparator")
_SEPARATOR_FORMS: Final = (
    "write one character (e.g. |), or the byte's value in decimal (1 for SOH, 124 for |) "
    "or hex (0x01); write a digit or a space as its value"
)


def _build_message_types(root: etree._Element, problems: _Problems) -> MessageTypes:
    """The defaults plus the ``<MessageTypes>`` declarations that are right (the
    others are reported)."""
    declared: list[MessageType] = []
    seen: dict[str, etree._Element] = {}
    for type_el in _children(_first(root, "MessageTypes"), "MessageType"):
        if problems.faulty(type_el):
            continue
        built = _build_one(type_el, seen, problems)
        if built is not None:
            declared.append(built)
    return MessageTypes((*default_types().values(), *declared))


def _build_one(
    type_el: etree._Element, seen: dict[str, etree._Element], problems: _Problems
) -> MessageType | None:
    name_el = _first(type_el, "Name")
    name = _checked_name(name_el, seen, problems)
    if name is None:
        return None
    module = _checked_module(type_el, name, problems)
    if module is None:
        return None
    separators = _separators(type_el, module, problems)
    if separators is None:
        return None
    return make_type(name, module, **separators)


def _checked_name(
    name_el: etree._Element | None, seen: dict[str, etree._Element], problems: _Problems
) -> str | None:
    name = _text(name_el, problems)
    if name_el is None or not name:
        return None  # the structural walk reports a missing or empty Name
    if not _NAME.fullmatch(name):
        problems.add(
            name_el,
            f"message type name {name!r} holds characters a message type name cannot",
            "use letters, digits, '-', '_' and '.' only (it appears in transport URIs "
            "such as tcp://host:9007/amps/NAME), e.g. "
            + (re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "my-type"),
        )
        return None
    if name in AMPS_ONLY_MODULES:
        problems.add(
            name_el,
            f"{name!r} is AMPS's name for its {name} message type, which amps-py does not "
            "build; it cannot name another type",
            f"give the type another name, e.g. my-{name}",
        )
        return None
    first = seen.get(name)
    if first is not None:
        problems.add(
            name_el,
            f"message type {name!r} is declared twice (first on line {_line(first)})",
            "keep one <MessageType> with this Name and merge their settings",
        )
        return None
    seen[name] = name_el
    return name


def _checked_module(type_el: etree._Element, name: str, problems: _Problems) -> str | None:
    module_el = _first(type_el, "Module")
    if module_el is None:
        if name in BUILT_MODULES:
            return name
        problems.add(
            type_el,
            f"message type {name!r} has no <Module>, so amps-py cannot tell what it is",
            f"add <Module> with one of: {_one_of(BUILT_MODULES)}, e.g. <Module>fix</Module>",
        )
        return None
    module = _text(module_el, problems)
    if not module:
        return None
    if module in AMPS_ONLY_MODULES:
        problems.add(
            module_el,
            f"Module {module!r} is recognised by AMPS but not supported by amps-py yet",
            f"use one of: {_one_of(BUILT_MODULES)}",
        )
        return None
    if module not in BUILT_MODULES:
        close = _closest(module, BUILT_MODULES)
        problems.add(
            module_el,
            f"{module!r} is not a message type module"
            + (f"; did you mean {close!r}?" if close else ""),
            f"use one of: {_one_of(BUILT_MODULES)}",
        )
        return None
    if name in BUILT_MODULES and module != name:
        problems.add(
            module_el,
            f"{name!r} is the name of AMPS's default {name} type; it cannot be built on "
            f"the {module} module",
            f"give the type another name (e.g. my-{module}), or use <Module>{name}</Module>",
        )
        return None
    return module


def _separators(
    type_el: etree._Element, module: str, problems: _Problems
) -> dict[str, bytes | None] | None:
    """``make_type``'s separator arguments; None (and problems) when one is wrong."""
    found: dict[str, bytes | None] = {}
    ok = True
    for tag in _SEPARATORS:
        el = _first(type_el, tag)
        keyword = re.sub(r"(?<!^)(?=[A-Z])", "_", tag).lower()
        if el is None:
            found[keyword] = None
            continue
        if module not in SEPARATED_MODULES:
            problems.add(
                el,
                f"{tag} applies to the {' and '.join(SEPARATED_MODULES)} modules only, not "
                f"to this {module} type",
                f"remove <{tag}>",
            )
            ok = False
            continue
        value = _separator(el, problems)
        ok = ok and value is not None
        found[keyword] = value
    return found if ok else None


def _separator(el: etree._Element, problems: _Problems) -> bytes | None:
    text = _text(el, problems)
    if not text:
        return None
    value = separator_byte(text)
    if value is None:
        problems.add(el, f"{text!r} is not a valid {el.tag}", _SEPARATOR_FORMS)
        return None
    if el.tag == "FieldSeparator" and value == b"=":
        problems.add(
            el,
            "FieldSeparator cannot be '=': '=' separates each tag from its value",
            "use another byte, e.g. 1 (SOH, the default) or |",
        )
        return None
    return value


def separator_byte(text: str) -> bytes | None:
    """The byte a separator element names: one printable ASCII character other than a
    digit (``|``), a decimal value 0-255 (``1``), or a hex value (``0x01``); None
    otherwise."""
    if text.isascii() and text.isdigit():
        number = int(text)
    elif (
        text[:2] in ("0x", "0X")
        and len(text) > 2
        and all(c in "0123456789abcdefABCDEF" for c in text[2:])
    ):
        number = int(text[2:], 16)
    elif len(text) == 1 and text.isascii() and text.isprintable() and not text.isspace():
        return text.encode("ascii")
    else:
        return None
    return bytes([number]) if number <= 255 else None


def _check_references(root: etree._Element, types: MessageTypes, problems: _Problems) -> None:
    """Report every ``MessageType`` that names no type of the instance (a name declared
    in ``<MessageTypes>`` whose declaration is wrong was reported there already)."""
    known = sorted(types)
    declared = {
        (name_el.text or "").strip()
        for type_el in _children(_first(root, "MessageTypes"), "MessageType")
        for name_el in _children(type_el, "Name")
    }
    for el in root.iter("MessageType"):
        parent = el.getparent()
        if parent is None or parent.tag == "MessageTypes":
            continue  # a declaration, not a reference
        if problems.faulty(el) or any(problems.faulty(a) for a in el.iterancestors()):
            continue
        name = (el.text or "").strip()
        if not name or name in types or name in declared:
            continue
        if name in AMPS_ONLY_MODULES:
            problems.add(
                el,
                f"MessageType {name!r} is recognised by AMPS but not supported by amps-py yet",
                f"use one of: {_one_of(known)}",
            )
            continue
        close = _closest(name, known)
        problems.add(
            el,
            f"MessageType {name!r} is not a message type of this instance"
            + (f"; did you mean {close!r}?" if close else ""),
            f"use one of: {_one_of(known)}; or declare it: <MessageTypes><MessageType>"
            f"<Name>{name}</Name><Module>fix</Module></MessageType></MessageTypes> (with "
            "the module it is built on)",
        )
