"""Steps 1-3 before the walk: parsing the XML, ``${VAR}`` substitution, entity
references and namespaces."""

from __future__ import annotations

import re
from collections.abc import Mapping

from lxml import etree

from amps_py.config.problems import _Problems
from amps_py.config.xmltree import _LIBXML_ERROR, _line, _log_entries

# -------------------------------------------------------------------- 1. parsing XML

_SYNTAX_FIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Opening and ending tag mismatch: (\S+) line (\d+) and (\S+)"),
        "close <{0}> (opened on line {1}) with </{0}> before </{2}>, "
        "or correct the misspelt closing tag",
    ),
    (
        re.compile(r"Premature end of data|EndTag: '</' not found|end of data"),
        "the document ends before every element is closed; add the missing closing tags",
    ),
    (
        re.compile(r"EntityRef|xmlParseEntityRef|entity"),
        "write & as &amp; and < as &lt; inside values",
    ),
    (
        re.compile(r"[Dd]ouble hyphen within comment|Comment not terminated"),
        "XML comments cannot contain -- and must end with -->; reword the comment",
    ),
    (
        re.compile(r"Extra content at the end of the document"),
        "a config has exactly one root element, <AMPSConfig>; put everything inside it",
    ),
    (
        re.compile(r"AttValue|attributes construct error|Couldn't find end of Start Tag"),
        "check the start tag on this line: quote attribute values and close it with >",
    ),
)


def _parse_xml(data: bytes, problems: _Problems) -> etree._Element | None:
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        remove_comments=True,
        remove_pis=True,
        huge_tree=False,
    )
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        entries = [e for e in _log_entries(parser.error_log) if e.level >= _LIBXML_ERROR]
        line: int | None = exc.lineno
        text = str(exc.msg)
        if entries:
            line, text = entries[0].line, entries[0].message.strip()
        fix = "correct the XML syntax on this line"
        for pattern, template in _SYNTAX_FIXES:
            match = pattern.search(text)
            if match:
                fix = template.format(*match.groups())
                break
        problems.add(None, f"not well-formed XML: {text}", fix, line=line or None, element="")
        return None


# ---------------------------------------------------------- 2. environment variables

_VAR_REF = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _substitute_all(root: etree._Element, values: Mapping[str, str], problems: _Problems) -> None:
    for el in root.iter():
        if not isinstance(el.tag, str) or not el.text or "${" not in el.text:
            continue
        el.text = _substitute(el, el.text, values, problems)


def _substitute(
    el: etree._Element, text: str, values: Mapping[str, str], problems: _Problems
) -> str:
    base_line = _line(el) or 1
    out: list[str] = []
    pos = 0

    def report(offset: int, message: str, fix: str) -> None:
        problems.add(el, message, fix, line=base_line + text.count("\n", 0, offset))

    for match in _VAR_REF.finditer(text):
        out.append(text[pos : match.start()])
        pos = match.end()
        name = match.group(1)
        if not _VAR_NAME.fullmatch(name):
            report(
                match.start(),
                f"'{match.group(0)}' is not a valid variable reference",
                "write ${NAME} where NAME uses letters, digits and _ (e.g. ${HOME})",
            )
            out.append(match.group(0))
        elif name not in values:
            report(
                match.start(),
                f"environment variable {name} is not defined (used as ${{{name}}})",
                f"set {name} in the environment before starting amps-py, "
                f"or replace ${{{name}}} with a value",
            )
            out.append(match.group(0))
        else:
            out.append(values[name])
    rest = text[pos:]
    unterminated = rest.find("${")
    if unterminated >= 0:
        report(
            pos + unterminated,
            "'${' starts a variable reference that is never closed",
            "close the reference with } (e.g. ${HOME})",
        )
    out.append(rest)
    return "".join(out)


# ------------------------------------------------ 3. entities and namespaces


def _drop_entity_references(root: etree._Element, problems: _Problems) -> None:
    """Report and remove references to DTD entities (``&name;``).

    Entities are never expanded: an external one could read any file on the host.
    The five predefined ones (``&amp;``, ``&lt;``...) and character references are
    ordinary text and unaffected.
    """
    for entity in list(root.iter(etree.Entity)):
        parent = entity.getparent()
        if parent is None:  # pragma: no cover - an entity is never the root
            continue
        problems.add(
            parent,
            f"the entity reference {entity.text} is not supported",
            f"replace {entity.text} with the value itself, or with ${{VAR}} to take it "
            "from the environment",
        )
        tail = entity.tail or ""
        previous = entity.getprevious()
        if previous is None:
            parent.text = (parent.text or "") + tail
        else:
            previous.tail = (previous.tail or "") + tail
        parent.remove(entity)


def _strip_namespaces(root: etree._Element, problems: _Problems) -> None:
    """Report elements in an XML namespace once, then carry on without namespaces.

    AMPS config elements have no namespace; a stray ``xmlns="..."`` would otherwise
    make every element unknown.
    """
    reported = False
    for el in root.iter():
        if not isinstance(el.tag, str) or not el.tag.startswith("{"):
            continue
        namespace, _, local = el.tag[1:].partition("}")
        if not reported:
            problems.add(
                el,
                f"<{local}> is in the XML namespace {namespace!r}, "
                "but amps-py config elements have no namespace",
                f"remove the xmlns declaration that puts elements in {namespace!r}",
                element=local,
            )
            reported = True
        el.tag = local
