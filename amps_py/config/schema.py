"""config/amps.xsd: the element model the structural walk checks against, where the
schema file is found, and the XSD itself as a backstop (step 5)."""

from __future__ import annotations

import importlib.resources
import importlib.resources.abc
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Final

from lxml import etree

from amps_py.config.problems import _Problems
from amps_py.config.xmltree import _log_entries

_XS = "{http://www.w3.org/2001/XMLSchema}"
_AMPSPY_NS = "{urn:amps-py:config}"
_ROOT = "AMPSConfig"


@dataclass(frozen=True)
class _Decl:
    """What config/amps.xsd says about one element position (read once, cached)."""

    name: str
    path: str
    min_occurs: int
    max_occurs: int | None  # None: unbounded
    doc: str
    children: Mapping[str, _Decl] | None  # None: the element holds a value
    enumeration: tuple[str, ...] = ()
    min_length: int = 0
    #: the type ends in xs:any: children are free-form (module Options), checked later
    open_content: bool = False


def _packaged_schema() -> importlib.resources.abc.Traversable:
    return importlib.resources.files("amps_py").joinpath("_data").joinpath("amps.xsd")


def schema_path() -> Path:
    """Where amps.xsd is read from: the installed wheel's copy, else the source tree's.

    Wheels carry the schema as ``amps_py/_data/amps.xsd``; a source checkout uses
    ``config/amps.xsd``.
    """
    packaged = _packaged_schema()
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "config" / "amps.xsd"


@dataclass(frozen=True)
class _Schema:
    xsd: etree.XMLSchema
    model: _Decl
    index: Mapping[str, list[_Decl]]


@lru_cache(maxsize=1)
def _schema() -> _Schema:
    packaged = _packaged_schema()
    data = packaged.read_bytes() if packaged.is_file() else schema_path().read_bytes()
    root = etree.fromstring(data)
    model = _read_model(root)
    return _Schema(etree.XMLSchema(root), model, _index_model(model))


def _occurs(value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    return None if value == "unbounded" else int(value)


def _read_model(schema: etree._Element) -> _Decl:
    """Build the element tree that the structural walk checks against.

    Understands the subset of XSD that amps.xsd uses: global named complex and simple
    types, inline types, xs:all / xs:sequence / xs:choice (nested too), min/maxOccurs
    (or ampspy:min/maxOccurs inside an unbounded choice), and the enumeration and
    minLength facets. Other facets are left to the XSD backstop.
    """
    root = schema.find(f"{_XS}element[@name='{_ROOT}']")
    if root is None:  # pragma: no cover - the schema ships with the package
        raise RuntimeError(f"{schema_path()} does not declare <{_ROOT}>")
    return _ModelReader(schema).element(root, "")


class _ModelReader:
    """Reads element declarations of one schema into :class:`_Decl` trees."""

    _GROUPS: Final = frozenset({f"{_XS}all", f"{_XS}sequence", f"{_XS}choice"})

    def __init__(self, schema: etree._Element) -> None:
        self.complex_types = {t.get("name"): t for t in schema.iterchildren(f"{_XS}complexType")}
        self.simple_types = {t.get("name"): t for t in schema.iterchildren(f"{_XS}simpleType")}

    def facets(self, simple: etree._Element | None) -> tuple[tuple[str, ...], int]:
        """(enumeration, minLength) of a simple type, following its restriction bases."""
        enumeration: tuple[str, ...] = ()
        min_length = 0
        while simple is not None:
            restriction = simple.find(f"{_XS}restriction")
            if restriction is None:
                break
            values = tuple(
                str(e.get("value")) for e in restriction.iterchildren(f"{_XS}enumeration")
            )
            enumeration = enumeration or values
            length = restriction.find(f"{_XS}minLength")
            if length is not None:
                min_length = max(min_length, int(str(length.get("value"))))
            simple = self.simple_types.get(restriction.get("base"))
        return enumeration, min_length

    @staticmethod
    def documentation(decl: etree._Element) -> str:
        text = decl.findtext(f"{_XS}annotation/{_XS}documentation") or ""
        return " ".join(text.split())

    def particles(self, group: etree._Element) -> Iterable[etree._Element]:
        """The element declarations of a model group, nested groups flattened."""
        for node in group:
            if node.tag == f"{_XS}element":
                yield node
            elif node.tag in self._GROUPS:
                yield from self.particles(node)

    def element(self, decl: etree._Element, parent_path: str) -> _Decl:
        """The :class:`_Decl` of an element declaration and, recursively, its children."""
        name = str(decl.get("name"))
        path = f"{parent_path}/{name}" if parent_path else name
        # Children of an unbounded choice carry their real limits as ampspy:* attributes.
        min_occurs = _occurs(decl.get(f"{_AMPSPY_NS}minOccurs") or decl.get("minOccurs"), 1)
        max_occurs = _occurs(decl.get(f"{_AMPSPY_NS}maxOccurs") or decl.get("maxOccurs"), 1)
        type_name = decl.get("type")
        complex_type = (
            self.complex_types.get(type_name) if type_name else decl.find(f"{_XS}complexType")
        )
        doc = self.documentation(decl)
        if complex_type is None:
            simple = (
                self.simple_types.get(type_name) if type_name else decl.find(f"{_XS}simpleType")
            )
            enumeration, min_length = self.facets(simple)
            return _Decl(
                name, path, min_occurs or 0, max_occurs, doc, None, enumeration, min_length
            )
        children = {
            str(child.get("name")): self.element(child, path)
            for child in self.particles(complex_type)
        }
        open_content = complex_type.find(f".//{_XS}any") is not None
        return _Decl(
            name, path, min_occurs or 0, max_occurs, doc, children, open_content=open_content
        )


def _index_model(root: _Decl) -> dict[str, list[_Decl]]:
    """Where each element name is allowed, for "belongs inside X" hints."""
    index: dict[str, list[_Decl]] = {}

    def visit(decl: _Decl) -> None:
        index.setdefault(decl.name, []).append(decl)
        for child in (decl.children or {}).values():
            visit(child)

    visit(root)
    return index


# ------------------------------------------------------------------ 5. XSD backstop

_SCHEMA_MESSAGES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"This element is not expected\. Expected is one of \( (.*) \)"),
        "<{element}> is not allowed here",
        "use one of the elements allowed at this position: {0}",
    ),
    (
        re.compile(r"This element is not expected\. Expected is \( (.*) \)"),
        "<{element}> is not allowed here",
        "the element expected at this position is {0}",
    ),
    (
        re.compile(r"This element is not expected"),
        "<{element}> is not allowed here",
        "remove it; see config/amps.xsd for the elements allowed here",
    ),
    (
        re.compile(r"Missing child element\(s\)\. Expected is(?: one of)? \( (.*) \)"),
        "<{element}> is missing a required element",
        "add one of: {0}",
    ),
    (
        re.compile(
            r"\[facet 'enumeration'\] The value '(.*)' is not an element of the set \{(.*)\}"
        ),
        "{0!r} is not a valid {element}",
        "use one of: {1}",
    ),
    (
        re.compile(r"\[facet '(?:minLength|length)'\]"),
        "<{element}> is empty or too short",
        "give <{element}> a value",
    ),
    (
        re.compile(r"\[facet 'pattern'\] The value '(.*)' is not accepted"),
        "{0!r} is not in the form <{element}> requires",
        "see the documentation of <{element}> in config/amps.xsd",
    ),
    (
        re.compile(
            r"'(.*)' is not a valid value of the (?:atomic|local atomic) type '(?:xs:)?(\w+)'"
        ),
        "{0!r} is not a valid {element} (it must be a {1})",
        "write a {1} value",
    ),
    (
        re.compile(r"attribute '(.*)': The attribute '.*' is not allowed"),
        "attribute {0}= is not supported on <{element}>",
        "remove the attribute",
    ),
    (
        re.compile(r"No matching global declaration available for the validation root"),
        "the root element must be <AMPSConfig>, not <{element}>",
        "wrap the configuration in <AMPSConfig>...</AMPSConfig>",
    ),
    (
        re.compile(r"Character content other than whitespace is not allowed"),
        "<{element}> contains text, but it only holds elements",
        "remove the text, or put it inside the child element it belongs to",
    ),
    (
        re.compile(r"Element content is not allowed, because the content type is a simple"),
        "<{element}> holds a value and cannot contain elements",
        "remove the child elements of <{element}>",
    ),
)


def _translate_schema_error(message: str) -> tuple[str, str]:
    """Turn one libxml2 schema message into (plain message, fix)."""
    match = re.match(r"Element '([^']*)'(?:, (attribute '[^']*'))?: ", message)
    element = match.group(1) if match else "element"
    if element.startswith("{"):
        element = element.partition("}")[2]
    detail = message[match.end() :] if match else message
    if match and match.group(2):
        detail = f"{match.group(2)}: {detail}"
    for pattern, text, fix in _SCHEMA_MESSAGES:
        found = pattern.search(detail)
        if found:
            groups = [g.replace("'", "") if i else g for i, g in enumerate(found.groups())]
            return (
                text.format(*groups, element=element),
                fix.format(*groups, element=element),
            )
    return (
        f"<{element}> does not match the amps-py schema ({detail.rstrip('.')})",
        "compare with config/amps.xsd or the output of `amps-py config show-default`",
    )


def _schema_path_to_element(path: str | None) -> str:
    if not path:
        return ""
    parts = [re.sub(r"\[\d+\]$", "", p) for p in path.strip("/").split("/")]
    return "/".join(p.partition("}")[2] if p.startswith("{") else p for p in parts)


def _check_schema(root: etree._Element, schema: etree.XMLSchema, problems: _Problems) -> None:
    try:
        if schema.validate(root):
            return
    except etree.XMLSchemaValidateError as exc:  # pragma: no cover - libxml2 internal error
        problems.add(
            None,
            f"the document could not be checked against config/amps.xsd ({exc})",
            "simplify the document (no DTD, no entities) and try again",
            line=None,
            element="",
        )
        return
    covered = problems.covered_lines()
    for entry in _log_entries(schema.error_log):
        if entry.line in covered:
            continue
        message, fix = _translate_schema_error(entry.message)
        problems.add(
            None,
            message,
            fix,
            line=entry.line or None,
            element=_schema_path_to_element(entry.path),
        )
