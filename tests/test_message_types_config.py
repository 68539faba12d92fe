"""``<MessageTypes>`` and every ``MessageType`` that names a type, in the configuration.

What an operator relies on: the AMPS default types (fix, nvfix, xml, json, msgpack,
bson, binary) work everywhere a MessageType appears with no declaration; a declared
type (a FIX variant with another separator) works the same; SOW Keys are read from
every type with fields; and each mistake is refused with its line and a fix: AMPS
types amps-py does not build, unknown names, bad modules, bad separators.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from amps_py.config import ConfigError, InstanceConfig, default_config, parse_config
from amps_py.config.message_types import separator_byte
from amps_py.message_types import AMPS_ONLY_MODULES, FIX, MessageTypes, default_types

FIELD_TYPES = ("fix", "nvfix", "xml", "json", "msgpack", "bson")


def config(
    type_name: str = "json",
    *,
    declarations: str = "",
    key: str = "<Key>/id</Key>",
    transport_type: str | None = None,
) -> str:
    """An instance using ``type_name`` on a Transport, the TransactionLog, a SOW topic
    (keyed by ``key``), a queue and a Replication Destination. The MessageType of the
    Transport is on line 5 (``declarations`` go on line 3)."""
    t = type_name
    return "\n".join(
        [
            "<AMPSConfig>",  # 1
            "  <Name>amps-a</Name>",  # 2
            f"  <MessageTypes>{declarations}</MessageTypes>" if declarations else "",  # 3
            "  <Transports>",  # 4
            "    <Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>"
            f"<MessageType>{transport_type or t}</MessageType></Transport>",  # 5
            "    <Transport><Name>repl</Name><Type>amps-replication</Type>"
            "<InetAddr>127.0.0.1:0</InetAddr></Transport>",  # 6
            "  </Transports>",  # 7
            "  <TransactionLog>",  # 8
            "    <JournalDirectory>./data</JournalDirectory>",  # 9
            f"    <Topic><Name>.*</Name><MessageType>{t}</MessageType></Topic>",  # 10
            "  </TransactionLog>",  # 11
            "  <SOW>",  # 12
            f"    <Topic><Name>orders</Name><MessageType>{t}</MessageType>{key}</Topic>",  # 13
            f"    <Queue><Name>work</Name><MessageType>{t}</MessageType></Queue>",  # 14
            "  </SOW>",  # 15
            "  <Replication><Destination><Name>amps-b</Name><SyncType>async</SyncType>",  # 16
            f"    <Topic><Name>.*</Name><MessageType>{t}</MessageType></Topic>",  # 17
            "    <Transport><Type>amps-replication</Type>"
            "<InetAddr>127.0.0.1:9204</InetAddr></Transport>",  # 18
            "  </Destination></Replication>",  # 19
            "</AMPSConfig>",  # 20
        ]
    )


def load(text: str) -> InstanceConfig:
    return parse_config(text, source="mt.xml", environ={})


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return [str(p) for p in info.value.problems]


def declared(name: str, module: str | None = "fix", *extra: str) -> str:
    module_el = f"<Module>{module}</Module>" if module is not None else ""
    return f"<MessageType><Name>{name}</Name>{module_el}{''.join(extra)}</MessageType>"


# ---------------------------------------------------------------- accepted


def test_an_instance_knows_the_amps_defaults_without_declaring_them() -> None:
    assert load(config()).message_types == default_types()
    assert default_config().message_types == default_types()


@pytest.mark.parametrize("type_name", [*FIELD_TYPES, "binary"])
def test_every_default_type_is_accepted_wherever_a_message_type_appears(type_name: str) -> None:
    key = "" if type_name == "binary" else "<Key>/id</Key>"
    cfg = load(config(type_name, key=key))
    assert cfg.transports[0].message_type == type_name
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.topics[0].message_type == type_name
    assert cfg.sow_topics[0].message_type == type_name
    assert cfg.sow_topics[0].keys == ((("/id",)) if key else ())
    assert cfg.queues[0].message_type == type_name
    assert cfg.replication[0].topics[0].message_type == type_name


@pytest.mark.parametrize(
    ("type_name", "key"), [("fix", "/55"), ("nvfix", "/Symbol"), ("xml", "/Order/@id")]
)
def test_sow_keys_in_each_types_own_paths(type_name: str, key: str) -> None:
    assert load(config(type_name, key=f"<Key>{key}</Key>")).sow_topics[0].keys == (key,)


def test_a_declared_type_is_usable_everywhere_with_its_separator() -> None:
    cfg = load(
        config(
            "fix-pipe",
            declarations=declared("fix-pipe", "fix", "<FieldSeparator>|</FieldSeparator>"),
            key="<Key>/55</Key>",
        )
    )
    piped = cfg.message_types["fix-pipe"]
    assert (piped.name, piped.module) == ("fix-pipe", "fix")
    assert piped.document(b"55=IBM|38=5|") == {"55": "IBM", "38": "5"}
    assert cfg.message_types["fix"] is FIX  # the default stays as it was
    assert set(cfg.message_types) == {*default_types(), "fix-pipe"}


def test_a_default_type_can_be_redeclared_with_other_separators() -> None:
    cfg = load(
        config(
            "fix",
            declarations=declared(
                "fix",
                None,  # Module may be left out when Name is a module
                "<FieldSeparator>124</FieldSeparator>",
                "<HeaderSeparator>0x1e</HeaderSeparator>",
                "<MessageSeparator>^</MessageSeparator>",
            ),
        )
    )
    fix = cfg.message_types["fix"]
    assert fix.document(b"55=IBM|") == {"55": "IBM"}
    assert (fix.field_separator, fix.header_separator, fix.message_separator) == (  # type: ignore[attr-defined]
        b"|",
        b"\x1e",
        b"^",
    )


def test_types_on_other_modules_can_be_declared_under_other_names() -> None:
    decls = "".join(declared(f"my-{m}", m) for m in (*FIELD_TYPES, "binary"))
    cfg = load(config("my-xml", declarations=decls, key="<Key>/Order/@id</Key>"))
    for module in (*FIELD_TYPES, "binary"):
        assert cfg.message_types[f"my-{module}"].module == module
    assert cfg.message_types["my-xml"].document(b'<Order id="1"/>') == {"Order": {"@id": "1"}}


@pytest.mark.parametrize(
    ("text", "byte"),
    [
        ("|", b"|"),
        ("^", b"^"),
        ("1", b"\x01"),
        ("124", b"|"),
        ("0x01", b"\x01"),
        ("0XA5", b"\xa5"),
        ("255", b"\xff"),
        ("0", b"\x00"),
    ],
)
def test_separator_spellings(text: str, byte: bytes) -> None:
    assert separator_byte(text) == byte


@pytest.mark.parametrize("text", ["||", "256", "0x", "0x100", "é", "SOH", "\\x01", "-1", "1.0"])
def test_separator_spellings_refused(text: str) -> None:
    assert separator_byte(text) is None


# ---------------------------------------------------------------- refused


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    fragment: str
    line: int
    fix: str = ""


def _amps_only_cases() -> list[Case]:
    cases = [
        Case(
            f"AMPS-only type {name} on a Transport",
            config("json", transport_type=name),
            f"MessageType {name!r} is recognised by AMPS but not supported by amps-py yet",
            5,
            "use one of: binary, bson, fix, json, msgpack, nvfix, xml",
        )
        for name in AMPS_ONLY_MODULES
    ]
    return cases


CASES = [
    *_amps_only_cases(),
    Case(
        "an unknown type name",
        config("json", transport_type="fixx"),
        "MessageType 'fixx' is not a message type of this instance; did you mean 'fix'?",
        5,
        "<MessageTypes><MessageType><Name>fixx</Name><Module>fix</Module>",
    ),
    Case(
        "a declared type's name is case-sensitive",
        config("json", transport_type="FIX-pipe", declarations=declared("fix-pipe")),
        "MessageType 'FIX-pipe' is not a message type of this instance; did you mean 'fix-pipe'?",
        5,
    ),
    Case(
        "a module AMPS has and amps-py does not build",
        config(declarations=declared("pb", "protobuf")),
        "Module 'protobuf' is recognised by AMPS but not supported by amps-py yet",
        3,
        "use one of: fix, nvfix, xml, json, msgpack, bson, binary",
    ),
    Case(
        "a misspelt module",
        config(declarations=declared("x", "xmll")),
        "'xmll' is not a message type module; did you mean 'xml'?",
        3,
    ),
    Case(
        "no Module for a new name",
        config(declarations=declared("orders-fix", None)),
        "message type 'orders-fix' has no <Module>",
        3,
        "add <Module> with one of: fix, nvfix, xml, json, msgpack, bson, binary",
    ),
    Case(
        "a default name on another module",
        config(declarations=declared("json", "fix")),
        "'json' is the name of AMPS's default json type; it cannot be built on the fix module",
        3,
        "give the type another name (e.g. my-fix)",
    ),
    Case(
        "an AMPS type's name for another type",
        config(declarations=declared("bflat", "json")),
        "'bflat' is AMPS's name for its bflat message type, which amps-py does not build",
        3,
    ),
    Case(
        "a name with a space",
        config(declarations=declared("fix pipe")),
        "message type name 'fix pipe' holds characters a message type name cannot",
        3,
        "e.g. fix-pipe",
    ),
    Case(
        "a name declared twice",
        config(declarations=declared("f1") + declared("f1", "nvfix")),
        "message type 'f1' is declared twice (first on line 3)",
        3,
    ),
    Case(
        "a separator for xml",
        config(declarations=declared("x", "xml", "<FieldSeparator>|</FieldSeparator>")),
        "FieldSeparator applies to the fix and nvfix modules only, not to this xml type",
        3,
        "remove <FieldSeparator>",
    ),
    Case(
        "a separator of two characters",
        config(declarations=declared("f", "fix", "<MessageSeparator>||</MessageSeparator>")),
        "'||' is not a valid MessageSeparator",
        3,
        "or the byte's value in decimal (1 for SOH, 124 for |) or hex (0x01)",
    ),
    Case(
        "'=' as the field separator",
        config(declarations=declared("f", "nvfix", "<FieldSeparator>61</FieldSeparator>")),
        "FieldSeparator cannot be '='",
        3,
    ),
    Case(
        "Options (protobuf and composite types)",
        config(declarations=declared("f", "fix", "<Options/>")),
        "<Options> is a recognised AMPS element, not supported by amps-py yet",
        3,
    ),
    Case(
        "Key on a binary SOW topic",
        config("binary"),
        "this SOW topic has MessageType binary and Key elements, but binary messages have "
        "no fields to read a key from",
        13,
        "publishers then send each record's key in the k header",
    ),
    Case(
        "Key on a type declared on the binary module",
        config("blob", declarations=declared("blob", "binary")),
        "this SOW topic has MessageType blob and Key elements, but binary messages have no fields",
        13,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case: Case) -> None:
    problems = problems_of(case.text)
    matching = [p for p in problems if case.fragment in p]
    assert matching, f"no problem contains {case.fragment!r}:\n" + "\n".join(problems)
    assert matching[0].startswith(f"mt.xml:{case.line}: "), matching[0]
    assert case.fix in matching[0].split(" Fix: ", 1)[1], matching[0]


def test_every_reference_to_an_unknown_type_is_reported_once() -> None:
    problems = problems_of(config("fixx", key=""))
    unknown = [p for p in problems if "'fixx' is not a message type" in p]
    assert [int(p.split(":")[1]) for p in unknown] == [5, 10, 13, 14, 17]


@pytest.mark.parametrize("name", AMPS_ONLY_MODULES)
def test_amps_only_types_are_refused_in_every_position(name: str) -> None:
    problems = problems_of(config(name, key=""))
    refused = [p for p in problems if f"MessageType {name!r} is recognised by AMPS" in p]
    assert [int(p.split(":")[1]) for p in refused] == [5, 10, 13, 14, 17]


def test_a_faulty_declaration_is_not_reported_again_where_it_is_used() -> None:
    problems = problems_of(config("pb", declarations=declared("pb", "protobuf"), key=""))
    assert [p for p in problems if "'pb'" in p] == []
    assert any("Module 'protobuf' is recognised by AMPS" in p for p in problems)


def test_message_types_is_hashable_in_a_frozen_config() -> None:
    cfg = load(config("fix-pipe", declarations=declared("fix-pipe"), key=""))
    assert isinstance(cfg.message_types, MessageTypes)
    assert hash(cfg.message_types) == hash(
        load(config("fix-pipe", declarations=declared("fix-pipe"), key="")).message_types
    )
