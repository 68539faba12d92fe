"""amps_py.config: bad configurations and the problems they produce.

Like nats-server's config_check_test.go: a table of (config text, expected message
fragment, expected line). Each config is written one element per line so the expected
line number can be read off the list index (line = index + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from amps_py.config import ConfigError, ConfigProblem, load_config
from amps_py.config import parse_config as _parse_config
from amps_py.config.schema import _translate_schema_error

HEAD = ["<AMPSConfig>", "  <Name>amps-1</Name>"]  # lines 1-2
TAIL = ["</AMPSConfig>"]


def doc(*lines: str) -> str:
    """A config made of HEAD (lines 1-2), ``lines`` (from line 3) and TAIL."""
    return "\n".join([*HEAD, *lines, *TAIL])


def transport(inet: str = "9007", name: str = "json-tcp", **extra: str) -> list[str]:
    children = "".join(f"<{k}>{v}</{k}>" for k, v in extra.items())
    return [
        "    <Transport>",
        f"      <Name>{name}</Name><Type>tcp</Type><InetAddr>{inet}</InetAddr>{children}",
        "    </Transport>",
    ]


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    fragment: str  # must appear in str(problem)
    line: int | None
    count: int = 1  # problems expected in total (guards against duplicate reports)
    environ: dict[str, str] | None = None


CASES = [
    Case(
        "misspelt element suggests the closest name",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectroy>./data</JournalDirectroy>",
            "  </TransactionLog>",
        ),
        "did you mean JournalDirectory?",
        4,
    ),
    Case(
        "unknown root child",
        doc("  <Frobnicate>1</Frobnicate>"),
        "unknown element <Frobnicate> inside <AMPSConfig>",
        3,
    ),
    Case(
        "missing Name",
        "<AMPSConfig>\n  <Description>x</Description>\n</AMPSConfig>",
        "<AMPSConfig> is missing the required element <Name>",
        1,
    ),
    Case(
        "bad InetAddr",
        doc("  <Transports>", *transport("localhost:http"), "  </Transports>"),
        "InetAddr 'localhost:http' has no valid port number",
        5,
    ),
    Case(
        "bad Admin InetAddr",
        doc("  <Admin>", "    <InetAddr>localhost:admin</InetAddr>", "  </Admin>"),
        "InetAddr 'localhost:admin' has no valid port number",
        4,
    ),
    Case(
        "Admin without InetAddr",
        doc("  <Admin>", "    <Interval>10s</Interval>", "  </Admin>"),
        "<Admin> is missing the required element <InetAddr>",
        3,
    ),
    Case(
        "bad port 70000",
        doc("  <Transports>", *transport("70000"), "  </Transports>"),
        "port 70000 is out of range; ports are 0 to 65535",
        5,
    ),
    Case(
        "IPv6 without brackets",
        doc("  <Transports>", *transport("::1:9007"), "  </Transports>"),
        "IPv6 address without brackets",
        5,
    ),
    Case(
        "bad host",
        doc("  <Transports>", *transport("300.1.1.1:9007"), "  </Transports>"),
        "'300.1.1.1' is not a valid IPv4 address",
        5,
    ),
    Case(
        "duplicate transport name",
        doc(
            "  <Transports>",
            *transport("9007", name="a"),
            *transport("9008", name="a"),
            "  </Transports>",
        ),
        "transport name 'a' is already used by the transport on line 5",
        8,
    ),
    Case(
        "duplicate port",
        doc(
            "  <Transports>",
            *transport("9007", name="a"),
            *transport("127.0.0.1:9007", name="b"),
            "  </Transports>",
        ),
        "clashes with transport 'a' on line 5",
        8,
    ),
    Case(
        "bad unit",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>./data</JournalDirectory>",
            "    <FlushInterval>10 parsecs</FlushInterval>",
            "  </TransactionLog>",
        ),
        "'10 parsecs' is not a valid duration for FlushInterval. Fix: use a number with "
        "an optional unit: ns, us, ms",
        5,
    ),
    Case(
        "bad byte unit",
        doc("  <Transports>", *transport("9007", MaxMessageSize="16 furlongs"), "  </Transports>"),
        "'16 furlongs' is not a valid byte size for MaxMessageSize",
        5,
    ),
    Case(
        "FlushInterval out of range",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>./data</JournalDirectory>",
            "    <FlushInterval>2s</FlushInterval>",
            "  </TransactionLog>",
        ),
        "FlushInterval 2s is out of range. Fix: use a value from 1us to 1s",
        5,
    ),
    Case(
        "FlushInterval zero",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>./data</JournalDirectory>",
            "    <FlushInterval>0</FlushInterval>",
            "  </TransactionLog>",
        ),
        "FlushInterval 0 is out of range",
        5,
    ),
    Case(
        "undefined variable",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>${DATA_DIR}/journal</JournalDirectory>",
            "  </TransactionLog>",
        ),
        "environment variable DATA_DIR is not defined (used as ${DATA_DIR})",
        4,
        environ={},
    ),
    Case(
        "undefined variable on a later line of a multi-line value",
        doc("  <Description>", "    runs in ${REGION}", "  </Description>"),
        "REGION is not defined",
        4,
        environ={},
    ),
    Case(
        "invalid variable reference",
        doc("  <Description>${not valid}</Description>"),
        "'${not valid}' is not a valid variable reference",
        3,
    ),
    Case(
        "unterminated variable reference",
        doc("  <Description>${HOME</Description>"),
        "'${' starts a variable reference that is never closed",
        3,
    ),
    Case(
        "bad regex in Topic/Name",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>./data</JournalDirectory>",
            "    <Topic>",
            "      <Name>orders(</Name>",
            "      <MessageType>json</MessageType>",
            "    </Topic>",
            "  </TransactionLog>",
        ),
        "Topic Name 'orders(' is not a valid regular expression: missing ), "
        "unterminated subpattern at position 6",
        6,
    ),
    Case(
        "wrong case element",
        doc(
            "  <transactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "  </transactionLog>",
        ),
        "element names are case-sensitive; did you mean TransactionLog?",
        3,
    ),
    Case(
        "wrong case root",
        "<AmpsConfig>\n  <Name>amps-1</Name>\n</AmpsConfig>",
        "the root element must be <AMPSConfig>, not <AmpsConfig> "
        "(element names are case-sensitive)",
        1,
    ),
    Case(
        "wrong root",
        "<Config>\n  <Name>amps-1</Name>\n</Config>",
        "the root element must be <AMPSConfig>, not <Config>",
        1,
    ),
    Case(
        "malformed XML",
        doc("  <Transports>", "    <Transport>", "  </Transports>"),
        "not well-formed XML: Opening and ending tag mismatch: Transport line 4 and Transports",
        5,
    ),
    Case(
        "unescaped ampersand",
        doc("  <Description>R&D</Description>"),
        "Fix: write & as &amp;",
        3,
    ),
    Case(
        "unsupported element Modules",
        doc("  <Modules>", "    <Module/>", "  </Modules>"),
        "<Modules> is a recognised AMPS element, not supported by amps-py yet; remove it",
        3,
    ),
    Case(
        "unsupported element inside Transport",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>t</Name><Type>tcp</Type><InetAddr>9007</InetAddr>",
            "      <TransportFilter><Module>x</Module></TransportFilter>",
            "    </Transport>",
            "  </Transports>",
        ),
        "<TransportFilter> is a recognised AMPS element, not supported by amps-py yet",
        6,
    ),
    Case(
        "SequenceGapThreshold on a client transport",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>t</Name><Type>tcp</Type><InetAddr>9007</InetAddr>",
            "      <SequenceGapThreshold>10</SequenceGapThreshold>",
            "    </Transport>",
            "  </Transports>",
        ),
        "<SequenceGapThreshold> is read on the amps-replication transport only, and this "
        "transport's Type is tcp. Fix: remove it",
        6,
    ),
    Case(
        "unknown Entitlement module on a client transport",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>t</Name><Type>tcp</Type><InetAddr>9007</InetAddr>",
            "      <Entitlement><Module>amps-default-no-entitlement-module</Module></Entitlement>",
            "    </Transport>",
            "  </Transports>",
        ),
        "Module 'amps-default-no-entitlement-module' is recognised by AMPS but not "
        "supported by amps-py yet. Fix: use one of: amps-default-entitlement-module, "
        "amps-rule-entitlement",
        6,
    ),
    Case(
        "AllowSpoofing false on a transport's default Authentication",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>t</Name><Type>tcp</Type><InetAddr>9007</InetAddr>",
            "      <Authentication><Module>amps-default-authentication-module</Module>",
            "        <Options><AllowSpoofing>false</AllowSpoofing></Options></Authentication>",
            "    </Transport>",
            "  </Transports>",
        ),
        "AllowSpoofing false is recognised by AMPS but not supported by amps-py yet: with "
        "amps-default-authentication-module, the user name a client logs on with is always "
        "taken as its identity",
        7,
    ),
    Case(
        "SequenceGapThreshold that is not a count",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>r</Name><Type>amps-replication</Type><InetAddr>9004</InetAddr>",
            "      <SequenceGapThreshold>lots</SequenceGapThreshold>",
            "    </Transport>",
            "  </Transports>",
        ),
        "'lots' is not a valid count for SequenceGapThreshold",
        6,
        count=2,  # and: no TransactionLog for the replication transport
    ),
    Case(
        "unsupported transport type",
        doc(
            "  <Transports>",
            "    <Transport>",
            "      <Name>unix</Name>",
            "      <Type>amps-unix</Type>",
            "      <InetAddr>10004</InetAddr>",
            "    </Transport>",
            "  </Transports>",
        ),
        "Type 'amps-unix' is recognised by AMPS but not supported by amps-py yet",
        6,
    ),
    Case(
        "missing JournalDirectory",
        doc(
            "  <TransactionLog>",
            "    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",
            "  </TransactionLog>",
        ),
        "<TransactionLog> is missing the required element <JournalDirectory>",
        3,
    ),
    Case(
        "empty JournalDirectory",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>  </JournalDirectory>",
            "  </TransactionLog>",
        ),
        "<JournalDirectory> is empty",
        4,
    ),
    Case(
        "Topic without MessageType",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <Topic><Name>.*</Name></Topic>",
            "  </TransactionLog>",
        ),
        "<Topic> is missing the required element <MessageType>",
        5,
    ),
    Case(
        "bad Level with suggestion",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>stdout</Protocol>",
            "      <Level>warn</Level>",
            "    </Target>",
            "  </Logging>",
        ),
        "'warn' is not a valid Level; did you mean 'warning'?",
        6,
    ),
    Case(
        "bad Levels entry",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>stdout</Protocol>",
            "      <Levels>trace,statz</Levels>",
            "    </Target>",
            "  </Logging>",
        ),
        "'statz' in Levels is not a log level; did you mean 'stats'?",
        6,
    ),
    Case(
        "file target without FileName",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>file</Protocol>",
            "    </Target>",
            "  </Logging>",
        ),
        "a log target with Protocol file needs a <FileName>",
        4,
    ),
    Case(
        "FileName on a stdout target",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>stdout</Protocol>",
            "      <FileName>x.log</FileName>",
            "    </Target>",
            "  </Logging>",
        ),
        "<FileName> only applies to targets with Protocol file",
        6,
    ),
    Case(
        "RotationThreshold without %n",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>file</Protocol>",
            "      <FileName>amps.log</FileName>",
            "      <RotationThreshold>10MB</RotationThreshold>",
            "    </Target>",
            "  </Logging>",
        ),
        "FileName has no %n rotation counter",
        7,
    ),
    Case(
        "bad ExcludeErrors regex",
        doc(
            "  <Logging>",
            "    <Target>",
            "      <Protocol>stdout</Protocol>",
            "      <ExcludeErrors>00-0001,12-(</ExcludeErrors>",
            "    </Target>",
            "  </Logging>",
        ),
        "ExcludeErrors entry '12-(' is not a valid regular expression",
        6,
    ),
    Case(
        "bad transport Protocol value",
        doc("  <Transports>", *transport("9007", Protocol="ampz"), "  </Transports>"),
        "'ampz' is not a valid Protocol; did you mean 'amps'?",
        5,
    ),
    Case(
        "unsupported log Protocol value",
        doc("  <Logging>", "    <Target><Protocol>syslog</Protocol></Target>", "  </Logging>"),
        "Protocol 'syslog' is recognised by AMPS but not supported by amps-py yet",
        4,
    ),
    Case(
        "bad Durability value",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <Durability>fsync-always</Durability>",
            "  </TransactionLog>",
        ),
        "'fsync-always' is not a valid Durability; did you mean 'fsync'? Fix: use one of: "
        "fsync, page-cache",
        5,
    ),
    Case(
        "bad Compression value",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <Compression>gzip</Compression>",
            "  </TransactionLog>",
        ),
        "'gzip' is not a valid Compression",
        5,
    ),
    Case(
        "JournalSize and MinJournalSize",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <JournalSize>10MB</JournalSize>",
            "    <MinJournalSize>20MB</MinJournalSize>",
            "  </TransactionLog>",
        ),
        "JournalSize and MinJournalSize are the same setting and both are given",
        6,
    ),
    Case(
        "MapSize too small",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <MapSize>64KB</MapSize>",
            "  </TransactionLog>",
        ),
        "MapSize 64KB is too small",
        5,
    ),
    Case(
        "PreallocatedJournalFiles not a number",
        doc(
            "  <TransactionLog>",
            "    <JournalDirectory>d</JournalDirectory>",
            "    <PreallocatedJournalFiles>0</PreallocatedJournalFiles>",
            "  </TransactionLog>",
        ),
        "PreallocatedJournalFiles '0' is not a whole number of at least 1",
        5,
    ),
    Case(
        "external entity is refused, never read",
        "<?xml version='1.0'?>\n"
        "<!DOCTYPE AMPSConfig [<!ENTITY secret SYSTEM 'file:///etc/passwd'>]>\n"
        "<AMPSConfig>\n"
        "  <Name>amps-1</Name>\n"
        "  <Description>&secret;</Description>\n"
        "</AMPSConfig>",
        "the entity reference &secret; is not supported",
        5,
    ),
    Case("empty document", "", "the configuration is empty", 1),
    Case("blank document", "  \n\n  ", "the configuration is empty", 1),
    Case(
        "Name with a path separator",
        "<AMPSConfig>\n  <Name>nyc/amps-1</Name>\n</AMPSConfig>",
        "Name 'nyc/amps-1' contains a path separator",
        2,
    ),
    Case(
        "Name too long",
        f"<AMPSConfig>\n  <Name>{'a' * 65}</Name>\n</AMPSConfig>",
        "Name is 65 characters long; the limit is 64",
        2,
    ),
    Case(
        "Name given twice",
        doc("  <Name>amps-2</Name>"),
        "<Name> is given more than once in <AMPSConfig>. Fix: keep one <Name> (the first is "
        "on line 2)",
        3,
    ),
    Case(
        "element in the wrong place",
        doc("  <JournalDirectory>./data</JournalDirectory>"),
        "<JournalDirectory> is not allowed inside <AMPSConfig>; it belongs inside "
        "<AMPSConfig/TransactionLog>",
        3,
    ),
    Case(
        "attribute",
        doc('  <Transports enabled="true">', *transport(), "  </Transports>"),
        "attribute enabled= is not supported on <Transports>",
        3,
    ),
    Case(
        "text in a container",
        doc("  <Transports>", "    oops", *transport(), "  </Transports>"),
        "<Transports> contains the text 'oops', but it only holds elements",
        3,
    ),
    Case(
        "element inside a value",
        doc("  <Description><b>bold</b></Description>"),
        "<Description> holds a value and cannot contain <b>",
        3,
    ),
    Case(
        "empty Transports",
        doc("  <Transports>", "  </Transports>"),
        "<Transports> is missing the required element <Transport>",
        3,
    ),
    Case(
        "namespaced document",
        '<AMPSConfig xmlns="urn:x">\n  <Name>a</Name>\n</AMPSConfig>',
        "<AMPSConfig> is in the XML namespace 'urn:x', but amps-py config elements have "
        "no namespace. Fix: remove the xmlns declaration",
        1,  # reported once, not for every element in the namespace
    ),
]


def parse_config(text: str, environ: dict[str, str] | None = None) -> None:
    _parse_config(text, source="bad.xml", environ={} if environ is None else environ)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_config(case: Case) -> None:
    check_refused(case)


def check_refused(case: Case) -> None:
    """The config is refused: a problem holding ``case.fragment`` on ``case.line``,
    ``case.count`` problems in all, each in plain words."""
    with pytest.raises(ConfigError) as info:
        parse_config(case.text, case.environ)
    problems = info.value.problems
    matching = [p for p in problems if case.fragment in str(p)]
    assert matching, f"no problem contains {case.fragment!r}:\n{info.value}"
    assert matching[0].line == case.line, str(info.value)
    assert len(problems) == case.count, str(info.value)
    for problem in problems:
        assert_plain(problem)


def assert_plain(problem: ConfigProblem) -> None:
    """Every problem is located, says how to fix it and shows no raw schema jargon."""
    text = str(problem)
    assert problem.file == "bad.xml"
    assert problem.line is not None and text.startswith(f"bad.xml:{problem.line}: ")
    assert problem.fix and " Fix: " in text
    for jargon in ("facet", "xs:", "atomic type", "validation root", "SCHEMAV", "{urn"):
        assert jargon not in text, text


def test_case_table_is_big_enough() -> None:
    assert len(CASES) >= 20


def test_all_problems_are_collected_in_line_order() -> None:
    text = doc(
        "  <Replication/>",  # 3
        "  <Transports>",
        *transport("70000", name="a"),  # 5-7: bad port on 6
        *transport("9007", name="a", Protocol="http"),  # 8-10: two problems on 9
        "  </Transports>",
        "  <TransactionLog>",  # 12: missing JournalDirectory
        "    <FlushInterval>5 fortnights</FlushInterval>",  # 13
        "  </TransactionLog>",
        "  <Logging><Target><Protocol>file</Protocol><Level>inf</Level></Target></Logging>",  # 15
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    problems = info.value.problems
    assert [p.line for p in problems] == [3, 6, 9, 9, 12, 13, 15, 15], str(info.value)
    assert str(info.value).startswith("8 configuration problems in bad.xml:\n")
    for problem in problems:
        assert_plain(problem)


def test_misspelt_required_element_is_not_also_reported_missing() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("<AMPSConfig>\n  <Nmae>x</Nmae>\n</AMPSConfig>")
    (problem,) = info.value.problems
    assert "did you mean Name?" in problem.message
    assert problem.element == "AMPSConfig/Nmae"
    assert problem.fix == "rename <Nmae> to <Name>"


def test_undefined_variable_is_not_also_reported_as_a_bad_value() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc("  <Transports>", *transport("${PORT}"), "  </Transports>"))
    (problem,) = info.value.problems
    assert problem.element == "AMPSConfig/Transports/Transport/InetAddr"
    assert "PORT is not defined" in problem.message
    assert "set PORT in the environment" in problem.fix


def test_load_config_reports_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "amps.xml"
    path.write_text(doc("  <TransactionLog>", "  </TransactionLog>"))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    (problem,) = info.value.problems
    assert str(problem).startswith(f"{path}:3: AMPSConfig/TransactionLog: ")


SCHEMA_MESSAGES = [
    (
        "Element 'Foo': This element is not expected. Expected is one of ( Name, Group ).",
        "<Foo> is not allowed here",
        "Name, Group",
    ),
    (
        "Element 'Transports': Missing child element(s). Expected is ( Transport ).",
        "<Transports> is missing a required element",
        "Transport",
    ),
    (
        "Element 'Type': [facet 'enumeration'] The value 'udp' is not an element of the set "
        "{'tcp'}.",
        "'udp' is not a valid Type",
        "tcp",
    ),
    (
        "Element 'PreallocatedJournalFiles': '-1' is not a valid value of the atomic type "
        "'xs:positiveInteger'.",
        "'-1' is not a valid PreallocatedJournalFiles (it must be a positiveInteger)",
        "positiveInteger",
    ),
    (
        "Element 'Name': [facet 'minLength'] The value has a length of '0'; this underruns "
        "the allowed minimum length of '1'.",
        "<Name> is empty or too short",
        "<Name>",
    ),
    (
        "Element 'AMPSConfig', attribute 'x': The attribute 'x' is not allowed.",
        "attribute x= is not supported on <AMPSConfig>",
        "remove",
    ),
    (
        "Element 'Foo': No matching global declaration available for the validation root.",
        "the root element must be <AMPSConfig>, not <Foo>",
        "AMPSConfig",
    ),
    (
        "Element 'AMPSConfig': Character content other than whitespace is not allowed "
        "because the content type is 'element-only'.",
        "<AMPSConfig> contains text, but it only holds elements",
        "remove the text",
    ),
    (
        "Element 'Name': Something libxml2 may say one day.",
        "<Name> does not match the amps-py schema (Something libxml2 may say one day)",
        "config/amps.xsd",
    ),
]


@pytest.mark.parametrize(("raw", "message", "fix"), SCHEMA_MESSAGES)
def test_schema_messages_are_translated(raw: str, message: str, fix: str) -> None:
    translated, how = _translate_schema_error(raw)
    assert translated == message
    assert fix in how
    for jargon in ("facet", "xs:", "atomic type", "validation root"):
        assert jargon not in translated + how


def test_schema_backstop_reports_what_the_walk_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the structural walk and amps.xsd ever disagree, the XSD still catches it."""
    from amps_py.config import loader

    monkeypatch.setattr(loader, "_check_structure", lambda *args: None)
    with pytest.raises(ConfigError) as info:
        parse_config(doc("  <Transports>", *transport(Protocol="udp"), "  </Transports>"))
    (problem,) = info.value.problems
    assert problem.line == 5
    assert problem.element == "AMPSConfig/Transports/Transport/Protocol"
    assert problem.message == "'udp' is not a valid Protocol"
    assert problem.fix == "use one of: amps, json"
    assert_plain(problem)
