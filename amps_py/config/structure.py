"""Step 3, the structural walk: unknown, misspelt, misplaced, repeated and missing
elements, and values outside an enumeration, checked against the model of amps.xsd."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from lxml import etree

from amps_py.config.problems import _Problems
from amps_py.config.schema import _Decl
from amps_py.config.xmltree import _child_elements, _closest, _line, _one_of, _snippet

#: The queue elements of SOW (``QueueDefinition`` is AMPS's other name for ``Queue``)
_QUEUE_ELEMENTS: Final = ("Queue", "QueueDefinition", "GroupLocalQueue", "LocalQueue")

#: Elements AMPS defines that amps-py does not support yet, by the path of the parent
#: they appear in. A config that uses one gets a clear "not supported yet" problem
#: instead of "unknown element". Shrink this as features arrive (and add the element to
#: config/amps.xsd at the same time).
UNSUPPORTED_AMPS_ELEMENTS: Final[Mapping[str, frozenset[str]]] = {
    "AMPSConfig": frozenset(
        {
            "ConfigCycleDetectionThreshold",
            "ConfigIncludeCommentDefault",
            "Environment",
            "Include",
            "MiniDumpDirectory",
            "Modules",
            "Protocols",
            "RequiredMinimumVersion",
            "SuggestedMinimumVersion",
            "Tuning",
            "UserDefinedFunctions",
        }
    ),
    "AMPSConfig/MessageTypes/MessageType": frozenset(
        {
            "AMPSVersionCompliance",
            "Options",
        }
    ),
    "AMPSConfig/Transports/Transport": frozenset(
        {
            "FileName",
            "TransportFilter",
        }
    ),
    "AMPSConfig/Replication/Destination/Transport": frozenset(
        {
            "Ciphers",
            "IpProtocolPrefer",
            "PrivateKey",
        }
    ),
    "AMPSConfig/SOW": frozenset({"View"}),
    **{
        f"AMPSConfig/SOW/{conflated}": frozenset({"TopicFormat"})
        for conflated in ("ConflatedTopic", "ReplicaDefinition")
    },
    **{
        f"AMPSConfig/SOW/{queue}": frozenset(
            {
                "DeferredAckExpiration",
                "FileBackedMetadata",
                "GroupLocalQueueDomain",
                "TargetQueueDepth",
            }
        )
        for queue in _QUEUE_ELEMENTS
    },
    "AMPSConfig/SOW/Topic": frozenset(
        {
            "ExpectedKeyCountHint",
            "HashIndex",
            "History",
            "Index",
            "InitialSlabCount",
            "KeyGenerator",
            "SlabSize",
        }
    ),
    "AMPSConfig/TransactionLog": frozenset(
        {
            "BlockSize",
            "CompressedJournalCacheMemoryLimit",
            "InactiveClientAckExpiration",
            "O_DIRECT",
        }
    ),
}

#: What to add to the "not supported yet" message of some unsupported elements, by the
#: element's path.
UNSUPPORTED_AMPS_NOTES: Final[Mapping[str, str]] = {
    **{
        f"AMPSConfig/SOW/{queue}/{name}": note
        for queue in _QUEUE_ELEMENTS
        for name, note in (
            (
                "FileBackedMetadata",
                "amps-py rebuilds a queue's state from the journal at start",
            ),
            ("GroupLocalQueueDomain", "InitialOwner alone names a group-local queue's owner"),
        )
    },
    "AMPSConfig/MessageTypes/MessageType/Options": (
        "Options configure protobuf and composite types, which amps-py does not build"
    ),
    "AMPSConfig/MessageTypes/MessageType/AMPSVersionCompliance": (
        "it shapes the FIX messages of /AMPS/SOWStats, which amps-py does not publish"
    ),
    "AMPSConfig/SOW/View": "views come in a later amps-py release",
    **{
        f"AMPSConfig/SOW/{conflated}/TopicFormat": (
            "it names the conflated topics of a Pattern SOW topic, and amps-py conflates "
            "only SOW topics without Pattern"
        )
        for conflated in ("ConflatedTopic", "ReplicaDefinition")
    },
}

_AMPS_ONLY_AUTHENTICATION_MODULES = frozenset(
    {
        "amps-implicit-authentication-module",
        "amps-default-no-authentication-module",
        "libamps_multi_authentication",
        "libamps_oauth_authentication",
    }
)
_AMPS_ONLY_ENTITLEMENT_MODULES = frozenset(
    {
        "amps-default-no-entitlement-module",
        "libamps_http_entitlement",
        "libamps_simple_access_entitlement",
    }
)

#: Values AMPS accepts for an element that amps-py does not support yet, by element path.
UNSUPPORTED_AMPS_VALUES: Final[Mapping[str, frozenset[str]]] = {
    "AMPSConfig/Transports/Transport/Type": frozenset({"amps-unix"}),
    "AMPSConfig/Transports/Transport/Protocol": frozenset(
        {"websocket", "fix", "nvfix", "xml", "soap", "fix-session"}
    ),
    # (MessageType values are names, checked against the instance's message types by
    # amps_py/config/message_types.py, which names AMPS's types amps-py does not build.)
    **{
        f"AMPSConfig/SOW/{queue}/ExpirationModel": frozenset({"queue", "latest", "earliest"})
        for queue in _QUEUE_ELEMENTS
    },
    "AMPSConfig/Logging/Target/Protocol": frozenset({"gzip", "syslog"}),
    # the instance's modules, and a Transport's own (which override them)
    **{
        f"{parent}Authentication/Module": _AMPS_ONLY_AUTHENTICATION_MODULES
        for parent in ("AMPSConfig/", "AMPSConfig/Transports/Transport/")
    },
    **{
        f"{parent}Entitlement/Module": _AMPS_ONLY_ENTITLEMENT_MODULES
        for parent in ("AMPSConfig/", "AMPSConfig/Transports/Transport/")
    },
}


def _check_structure(
    el: etree._Element, decl: _Decl, problems: _Problems, index: Mapping[str, list[_Decl]]
) -> None:
    tag = str(el.tag)
    for raw_attribute in el.attrib:
        attribute = str(raw_attribute)
        problems.add(
            el,
            f"attribute {attribute}= is not supported on <{tag}>",
            f"remove the attribute; settings are written as child elements, e.g. "
            f"<{tag}><Name>...</Name></{tag}>"
            if decl.children is not None
            else "remove the attribute",
        )
    kids = _child_elements(el)
    if decl.children is None:
        _check_value(el, decl, kids, problems)
        return
    if decl.open_content:
        return  # free-form (module Options): the section's builder checks the names

    stray = " ".join(t.strip() for t in [el.text or "", *(k.tail or "" for k in kids)] if t.strip())
    if stray:
        problems.add(
            el,
            f"<{tag}> contains the text {_snippet(stray)!r}, but it only holds elements",
            "remove the text, or put it inside the child element it belongs to",
        )

    seen: dict[str, list[etree._Element]] = {}
    suggested: set[str] = set()
    for kid in kids:
        child_decl = decl.children.get(str(kid.tag))
        if child_decl is None:
            suggestion = _unknown_element(kid, decl, problems, index)
            if suggestion:
                suggested.add(suggestion)
            continue
        seen.setdefault(child_decl.name, []).append(kid)
        _check_structure(kid, child_decl, problems, index)

    for name, found in seen.items():
        limit = decl.children[name].max_occurs
        if limit is not None and len(found) > limit:
            for extra in found[limit:]:
                problems.add(
                    extra,
                    f"<{name}> is given more than once in <{tag}>",
                    f"keep one <{name}> (the first is on line {_line(found[0])}) "
                    "and remove the others",
                )
    for name, child_decl in decl.children.items():
        if len(seen.get(name, ())) < child_decl.min_occurs and name not in suggested:
            hint = f": {child_decl.doc}" if child_decl.doc else ""
            problems.add(
                el,
                f"<{tag}> is missing the required element <{name}>",
                f"add <{name}> inside <{tag}>{hint}",
            )


def _check_value(
    el: etree._Element, decl: _Decl, kids: list[etree._Element], problems: _Problems
) -> None:
    tag = str(el.tag)
    if kids:
        problems.add(
            kids[0],
            f"<{tag}> holds a value and cannot contain <{kids[0].tag}>",
            f"remove <{kids[0].tag}> from <{tag}>, or move it to where it belongs",
        )
        return
    if problems.faulty(el):  # e.g. an undefined ${VAR}: already reported
        return
    value = (el.text or "").strip()
    hint = f": {decl.doc}" if decl.doc else ""
    if decl.min_length and len(value) < decl.min_length:
        problems.add(el, f"<{tag}> is empty", f"give <{tag}> a value{hint}")
    elif decl.enumeration and value not in decl.enumeration:
        accepted = f"use one of: {_one_of(decl.enumeration)}"
        if value in UNSUPPORTED_AMPS_VALUES.get(decl.path, frozenset()):
            problems.add(
                el,
                f"{tag} {value!r} is recognised by AMPS but not supported by amps-py yet",
                accepted,
            )
            return
        close = _closest(value, decl.enumeration)
        suggestion = f"; did you mean {close!r}?" if close else ""
        problems.add(el, f"{value!r} is not a valid {tag}{suggestion}", accepted)


def _unknown_element(
    kid: etree._Element,
    parent: _Decl,
    problems: _Problems,
    index: Mapping[str, list[_Decl]],
) -> str | None:
    """Report a child that the schema does not allow here; return the name suggested."""
    name = str(kid.tag)
    assert parent.children is not None
    allowed = list(parent.children)
    unsupported = UNSUPPORTED_AMPS_ELEMENTS.get(parent.path, frozenset())
    allowed_text = f"elements allowed in <{parent.name}> are: {_one_of(allowed)}"

    if name in unsupported:
        note = UNSUPPORTED_AMPS_NOTES.get(f"{parent.path}/{name}")
        problems.add(
            kid,
            f"<{name}> is a recognised AMPS element, not supported by amps-py yet"
            + (f" ({note})" if note else "")
            + "; remove it",
            f"delete <{name}> and its contents; {allowed_text}",
        )
        return None
    same_but_case = {a.lower(): a for a in allowed}.get(name.lower())
    if same_but_case:
        problems.add(
            kid,
            f"unknown element <{name}>: element names are case-sensitive; "
            f"did you mean {same_but_case}?",
            f"rename <{name}> to <{same_but_case}>",
        )
        return same_but_case
    homes = [d for d in index.get(name, []) if d.path != f"{parent.path}/{name}"]
    if homes:
        places = " or ".join(f"<{d.path.rpartition('/')[0]}>" for d in homes)
        problems.add(
            kid,
            f"<{name}> is not allowed inside <{parent.name}>; it belongs inside {places}",
            f"move <{name}> into {places}",
        )
        return None
    return _misspelt_element(kid, parent.name, allowed, unsupported, allowed_text, problems)


def _misspelt_element(
    kid: etree._Element,
    parent_tag: str,
    allowed: list[str],
    unsupported: frozenset[str],
    allowed_text: str,
    problems: _Problems,
) -> str | None:
    """Report an element known nowhere in the schema, with the closest name allowed
    here (or not supported yet) if one is close; return the name suggested."""
    name = str(kid.tag)
    close = _closest(name, allowed)
    if close:
        problems.add(
            kid,
            f"unknown element <{name}>; did you mean {close}?",
            f"rename <{name}> to <{close}>",
        )
        return close
    close_unsupported = _closest(name, unsupported)
    if close_unsupported:
        problems.add(
            kid,
            f"unknown element <{name}>; did you mean {close_unsupported}? That is a "
            "recognised AMPS element, not supported by amps-py yet",
            f"remove <{name}>; {allowed_text}",
        )
        return None
    problems.add(
        kid,
        f"unknown element <{name}> inside <{parent_tag}>",
        f"remove it; {allowed_text}",
    )
    return None
