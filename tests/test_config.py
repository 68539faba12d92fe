"""amps_py.config: good configurations, defaults, substitution and the option objects."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from lxml import etree

from amps_py import logs
from amps_py.config import (
    DEFAULT_JOURNAL_SIZE,
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    LOG_LEVELS,
    UNSUPPORTED_AMPS_ELEMENTS,
    UNSUPPORTED_AMPS_VALUES,
    ConfigError,
    ConfigProblem,
    InstanceConfig,
    JournalTopic,
    LogTarget,
    TransactionLogConfig,
    TransportConfig,
    default_config,
    default_config_xml,
    load_config,
    parse_config,
    schema_path,
)
from amps_py.config import model as config_model
from amps_py.config import schema as config_schema

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "examples" / "standalone.xml"
GIB = 1024**3


def minimal(body: str = "") -> str:
    return f"<AMPSConfig><Name>amps-1</Name>{body}</AMPSConfig>"


def transport(inet: str, extra: str = "", name: str = "t") -> str:
    return (
        f"<Transports><Transport><Name>{name}</Name><Type>tcp</Type>"
        f"<InetAddr>{inet}</InetAddr>{extra}</Transport></Transports>"
    )


def txlog(extra: str = "") -> str:
    return f"<TransactionLog><JournalDirectory>./data</JournalDirectory>{extra}</TransactionLog>"


def target(body: str) -> str:
    return f"<Logging><Target>{body}</Target></Logging>"


# ------------------------------------------------------------------- whole documents


def test_example_standalone_config_loads() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert cfg.name == "amps-standalone"
    assert cfg.group == "local"
    assert cfg.source == str(EXAMPLE)
    (json_tcp,) = cfg.transports
    assert (json_tcp.name, json_tcp.host, json_tcp.port) == ("json-tcp", "127.0.0.1", 9007)
    assert json_tcp.protocol == "amps"
    assert json_tcp.message_type == "json"
    log = cfg.transaction_log
    assert log is not None
    assert log.journal_directory == Path("amps-standalone-data")
    assert log.topics == (JournalTopic(".*", "json"),)
    assert log.durability == "fsync"
    assert [t.protocol for t in cfg.logging] == ["stdout", "file"]
    file_target = cfg.logging[1]
    assert file_target.file_name is not None and "%n" in file_target.file_name
    assert file_target.rotation_threshold == 100 * 1024**2
    assert file_target.exclude_errors == "12-.*"


def test_default_config_round_trips_through_its_xml(tmp_path: Path) -> None:
    parsed = parse_config(
        default_config_xml(str(tmp_path)), source="<embedded default>", environ={}
    )
    assert parsed == default_config(tmp_path)


def test_default_config_xml_default_argument_matches_default_config() -> None:
    parsed = parse_config(default_config_xml(), source="<embedded default>", environ={})
    assert parsed == default_config()


def test_default_config_contents() -> None:
    cfg = default_config(Path("/srv/amps"))
    assert cfg.name == cfg.group == "amps-py"
    assert cfg.source == "<embedded default>"
    (only,) = cfg.transports
    # no MessageType: every type, each client's from its URI (json when it names none)
    assert only == TransportConfig("json-tcp", "tcp", "127.0.0.1", 9007, "amps", None)
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == Path("/srv/amps")
    for message_type in ("json", "fix", "nvfix", "xml", "bson", "msgpack"):
        assert cfg.transaction_log.journals("any/topic", message_type), message_type
    assert not cfg.transaction_log.journals("any/topic", "binary")
    assert cfg.logging == (LogTarget("stdout", "info"),)


def test_default_config_xml_escapes_the_directory() -> None:
    odd = "./data & <logs>"
    cfg = parse_config(default_config_xml(odd), environ={})
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == Path(odd)


def test_minimal_config_defaults() -> None:
    cfg = parse_config(minimal(), environ={})
    assert cfg == InstanceConfig(
        name="amps-1",
        group="amps-1",
        description="",
        transports=(),
        transaction_log=None,
        logging=(),
        source="<string>",
    )


def test_values_are_stripped_and_comments_ignored() -> None:
    cfg = parse_config(
        """<?xml version="1.0"?>
        <!-- leading comment -->
        <AMPSConfig>
          <Name>
             amps-1 <!-- trailing comment -->
          </Name>
          <Description>  Hello there  </Description>
          <ProcessName>amps-main</ProcessName>
        </AMPSConfig>""",
        environ={},
    )
    assert cfg.name == "amps-1"
    assert cfg.description == "Hello there"
    assert cfg.process_name == "amps-main"


def test_str_with_an_encoding_declaration_is_accepted() -> None:
    xml = '<?xml version="1.0" encoding="ISO-8859-1"?>' + minimal("<Description>café</Description>")
    assert parse_config(xml, environ={}).description == "café"
    assert parse_config(xml.encode("latin-1"), environ={}).description == "café"


def test_elements_in_any_order() -> None:
    cfg = parse_config(
        "<AMPSConfig>"
        + target("<Level>error</Level><Protocol>stderr</Protocol>")
        + "<TransactionLog><Topic><MessageType>json</MessageType><Name>a</Name></Topic>"
        "<FlushInterval>1ms</FlushInterval><JournalDirectory>d</JournalDirectory>"
        "</TransactionLog><Name>x</Name></AMPSConfig>",
        environ={},
    )
    assert cfg.name == "x"
    assert cfg.logging == (LogTarget("stderr", "error"),)
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.flush_interval == pytest.approx(0.001)


# ----------------------------------------------------------------------- transports


@pytest.mark.parametrize(
    ("inet", "host", "port", "address"),
    [
        ("9007", "0.0.0.0", 9007, "0.0.0.0:9007"),
        ("127.0.0.1:9007", "127.0.0.1", 9007, "127.0.0.1:9007"),
        ("[::1]:9007", "::1", 9007, "[::1]:9007"),
        ("[::]:10000", "::", 10000, "[::]:10000"),
        ("localhost:0", "localhost", 0, "localhost:0"),
        ("amps-1.example.com:65535", "amps-1.example.com", 65535, "amps-1.example.com:65535"),
        ("0", "0.0.0.0", 0, "0.0.0.0:0"),
    ],
)
def test_inet_addr_forms(inet: str, host: str, port: int, address: str) -> None:
    (t,) = parse_config(minimal(transport(inet)), environ={}).transports
    assert (t.host, t.port, t.address) == (host, port, address)


def test_transport_defaults_and_options() -> None:
    (plain,) = parse_config(minimal(transport("9007")), environ={}).transports
    assert plain.protocol == "amps"
    assert plain.message_type is None
    assert plain.max_message_size == DEFAULT_MAX_MESSAGE_SIZE == 16 * 1024**2
    assert plain.enabled is True
    extra = (
        "<Protocol>json</Protocol><MessageType>binary</MessageType>"
        "<MaxMessageSize>1MB</MaxMessageSize><InitialState>disabled</InitialState>"
    )
    (tuned,) = parse_config(minimal(transport("9007", extra)), environ={}).transports
    assert tuned.protocol == "amps"  # json is another name for the amps protocol
    assert tuned.message_type == "binary"
    assert tuned.max_message_size == 1024**2
    assert tuned.enabled is False


def test_port_zero_transports_never_clash() -> None:
    xml = minimal(
        "<Transports>"
        "<Transport><Name>a</Name><Type>tcp</Type><InetAddr>0</InetAddr></Transport>"
        "<Transport><Name>b</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>"
        "<Transport><Name>c</Name><Type>tcp</Type><InetAddr>127.0.0.1:9007</InetAddr></Transport>"
        "<Transport><Name>d</Name><Type>tcp</Type><InetAddr>127.0.0.2:9007</InetAddr></Transport>"
        "<Transport><Name>e</Name><Type>tcp</Type><InetAddr>[::1]:9007</InetAddr></Transport>"
        "</Transports>"
    )
    names = [t.name for t in parse_config(xml, environ={}).transports]
    assert names == ["a", "b", "c", "d", "e"]


# ------------------------------------------------------------------ transaction log


def test_transaction_log_defaults() -> None:
    log = parse_config(minimal(txlog()), environ={}).transaction_log
    assert log == TransactionLogConfig(journal_directory=Path("./data"))
    assert log.topics == ()
    assert log.flush_interval == 0.1
    assert log.journal_size == DEFAULT_JOURNAL_SIZE == GIB
    assert log.map_size == DEFAULT_MAP_SIZE == 64 * GIB
    assert log.durability == "fsync"
    assert log.compression == "none"
    assert log.preallocated_journal_files == 2
    assert not log.journals("orders", "json")  # no Topic: nothing is journaled


def test_transaction_log_options() -> None:
    log = parse_config(
        minimal(
            txlog(
                "<FlushInterval>1us</FlushInterval><MinJournalSize>10MB</MinJournalSize>"
                "<PreallocatedJournalFiles>4</PreallocatedJournalFiles>"
                "<Durability>page-cache</Durability><Compression>zstd</Compression>"
                "<MapSize>2GB</MapSize>"
            )
        ),
        environ={},
    ).transaction_log
    assert log is not None
    assert log.flush_interval == 1e-6
    assert log.journal_size == 10 * 1024**2
    assert log.preallocated_journal_files == 4
    assert (log.durability, log.compression) == ("page-cache", "zstd")
    assert log.map_size == 2 * GIB


@pytest.mark.parametrize("interval", ["1us", "1000ns", "1s", "1000ms", "0.5"])
def test_flush_interval_range_is_inclusive(interval: str) -> None:
    log = parse_config(
        minimal(txlog(f"<FlushInterval>{interval}</FlushInterval>")), environ={}
    ).transaction_log
    assert log is not None


@pytest.mark.parametrize(
    ("name", "topic", "message_type", "expected"),
    [
        ("orders", "orders", "json", True),
        ("orders", "orders2", "json", False),
        ("orders", "my-orders", "json", False),
        ("orders", "orders", "binary", False),
        ("orders.*", "orders", "json", True),
        ("orders.*", "orders/new", "json", True),
        ("orders.*", "old/orders", "json", False),  # anchored at the start
        ("a|b", "a", "json", True),
        ("a|b", "ab", "json", False),  # anchored at the end too
        (".*", "anything at all", "json", True),
        ("prices/[A-Z]+", "prices/IBM", "json", True),
        ("prices/[A-Z]+", "prices/ibm", "json", False),
        ("a-b_c", "a-b_c", "json", True),  # no metacharacters: literal
    ],
)
def test_journal_topic_matches(name: str, topic: str, message_type: str, expected: bool) -> None:
    assert JournalTopic(name, "json").matches(topic, message_type) is expected


def test_journals_is_cached_and_does_not_affect_equality() -> None:
    log = TransactionLogConfig(
        Path("d"), topics=(JournalTopic("orders", "json"), JournalTopic("px/.*", "binary"))
    )
    assert log.journals("orders", "json")
    assert log.journals("px/IBM", "binary")
    assert not log.journals("px/IBM", "json")
    assert log.journals("orders", "json")  # answered from the cache
    assert log._journal_cache == {
        ("orders", "json"): True,
        ("px/IBM", "binary"): True,
        ("px/IBM", "json"): False,
    }
    twin = TransactionLogConfig(log.journal_directory, topics=log.topics)
    assert twin == log
    assert hash(twin) == hash(log)


def test_journals_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_model, "_JOURNAL_CACHE_LIMIT", 10)
    log = TransactionLogConfig(Path("d"), topics=(JournalTopic(".*", "json"),))
    for i in range(25):
        assert log.journals(f"t{i}", "json")
    assert len(log._journal_cache) <= 10


def test_option_objects_are_frozen() -> None:
    cfg = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.transports[0].port = 1  # type: ignore[misc]
    assert hash(cfg) == hash(default_config())


# ---------------------------------------------------------------------------- logging


def test_log_target_levels_default() -> None:
    cfg = parse_config(
        minimal(
            "<Logging>"
            "<Target><Protocol>stdout</Protocol></Target>"
            "<Target><Protocol>stderr</Protocol><Levels>trace, stats</Levels></Target>"
            "<Target><Protocol>stderr</Protocol><Level>error</Level><Levels>stats</Levels></Target>"
            "</Logging>"
        ),
        environ={},
    )
    assert cfg.logging == (
        LogTarget("stdout", "info"),
        LogTarget("stderr", "none", ("trace", "stats")),
        LogTarget("stderr", "error", ("stats",)),
    )


def test_file_target() -> None:
    (t,) = parse_config(
        minimal(
            target(
                "<Protocol>file</Protocol><FileName>logs/%Y%m%d-%n.log</FileName>"
                "<Level>trace</Level><RotationThreshold>2G</RotationThreshold>"
                "<IncludeErrors>00-0002</IncludeErrors><ExcludeErrors>00-0001,12-1.*</ExcludeErrors>"
            )
        ),
        environ={},
    ).logging
    assert t == LogTarget(
        protocol="file",
        level="trace",
        file_name="logs/%Y%m%d-%n.log",
        rotation_threshold=2 * GIB,
        include_errors="00-0002",
        exclude_errors="00-0001,12-1.*",
    )


def test_log_levels_agree_with_schema_and_logs_module() -> None:
    schema = etree.parse(str(schema_path()))
    ns = {"xs": "http://www.w3.org/2001/XMLSchema"}
    values = schema.xpath("//xs:simpleType[@name='LogLevel']//xs:enumeration/@value", namespaces=ns)
    assert tuple(values) == LOG_LEVELS  # type: ignore[arg-type]
    assert (*logs.LEVELS, "none") == LOG_LEVELS


# ------------------------------------------------------------------------ substitution


def test_environment_substitution_from_mapping() -> None:
    cfg = parse_config(
        "<AMPSConfig><Name>${NAME}-${SITE}</Name>"
        + transport("${HOST}:${PORT}")
        + "<TransactionLog><JournalDirectory>${DATA}/journal</JournalDirectory></TransactionLog>"
        "</AMPSConfig>",
        environ={"NAME": "amps", "SITE": "nyc", "HOST": "127.0.0.1", "PORT": "9100", "DATA": "/d"},
    )
    assert cfg.name == "amps-nyc"
    assert (cfg.transports[0].host, cfg.transports[0].port) == ("127.0.0.1", 9100)
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == Path("/d/journal")


def test_environment_substitution_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPS_PY_TEST_NAME", "from-env")
    assert parse_config(minimal().replace("amps-1", "${AMPS_PY_TEST_NAME}")).name == "from-env"


def test_explicit_mapping_replaces_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPS_PY_TEST_NAME", "from-env")
    with pytest.raises(ConfigError, match="AMPS_PY_TEST_NAME is not defined"):
        parse_config(minimal().replace("amps-1", "${AMPS_PY_TEST_NAME}"), environ={})


def test_substituted_value_is_not_substituted_again() -> None:
    cfg = parse_config(minimal("<Description>${A}</Description>"), environ={"A": "${B}"})
    assert cfg.description == "${B}"


def test_builtin_variables_with_load_config(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "amps.xml"
    path.parent.mkdir()
    path.write_text(
        minimal(
            "<Description>${AMPS_CONFIG_PATH} v${AMPS_VERSION}</Description>"
            "<TransactionLog><JournalDirectory>${AMPS_CONFIG_DIRECTORY}/data</JournalDirectory>"
            "</TransactionLog>"
        )
    )
    cfg = load_config(path, environ={"AMPS_CONFIG_DIRECTORY": "/ignored"})
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == path.parent.resolve() / "data"
    assert cfg.description.startswith(f"{path.resolve()} v")


def test_builtin_directory_with_parse_config_is_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(minimal("<Description>${AMPS_CONFIG_DIRECTORY}</Description>"), environ={})
    assert cfg.description == str(tmp_path)


# --------------------------------------------------------------------- error objects


def test_config_problem_str() -> None:
    problem = ConfigProblem("a.xml", 7, "AMPSConfig/Name", "bad name", "rename it")
    assert str(problem) == "a.xml:7: AMPSConfig/Name: bad name. Fix: rename it"
    question = ConfigProblem("a.xml", None, "", "did you mean X?", "do Y")
    assert str(question) == "a.xml: did you mean X? Fix: do Y"


def test_config_error_lists_every_problem_with_a_count() -> None:
    problems = [
        ConfigProblem("a.xml", 1, "AMPSConfig", "one", "fix one"),
        ConfigProblem("a.xml", 2, "AMPSConfig/Name", "two", "fix two"),
    ]
    error = ConfigError(problems)
    lines = str(error).splitlines()
    assert lines[0] == "2 configuration problems in a.xml:"
    assert lines[1:] == [f"  {p}" for p in problems]
    assert error.problems == tuple(problems)
    assert "1 configuration problem in a.xml:" in str(ConfigError(problems[:1]))


def test_config_error_pickles() -> None:
    error = ConfigError([ConfigProblem("a.xml", 1, "AMPSConfig", "one", "fix one")])
    clone = pickle.loads(pickle.dumps(error))
    assert clone.problems == error.problems
    assert str(clone) == str(error)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.xml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    (problem,) = info.value.problems
    assert problem.file == str(missing)
    assert problem.line is None
    assert "cannot read the configuration file" in problem.message


# ------------------------------------------------------------------ schema bookkeeping


def test_schema_is_found_and_valid() -> None:
    path = schema_path()
    assert path.is_file()
    etree.XMLSchema(etree.parse(str(path)))


def test_unsupported_elements_are_not_in_the_schema() -> None:
    """The not-yet-supported list and the schema must never overlap (or drift apart)."""
    index = config_schema._schema().index
    paths = {decl.path: decl for decls in index.values() for decl in decls}
    for parent, names in UNSUPPORTED_AMPS_ELEMENTS.items():
        assert parent in paths, f"{parent} is not an element path in amps.xsd"
        children = paths[parent].children
        assert children is not None
        assert not names & set(children), f"{names & set(children)} are supported now"
    for element_path, values in UNSUPPORTED_AMPS_VALUES.items():
        decl = paths[element_path]
        assert decl.enumeration, element_path
        assert not values & set(decl.enumeration)


def test_schema_path_prefers_the_packaged_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert schema_path() == REPO / "config" / "amps.xsd"  # source checkout
    packaged = tmp_path / "amps.xsd"
    packaged.write_bytes((REPO / "config" / "amps.xsd").read_bytes())
    monkeypatch.setattr(config_schema, "_packaged_schema", lambda: packaged)
    assert schema_path() == packaged


def test_model_reader_handles_nested_groups_and_inline_types() -> None:
    """A future section (e.g. Replication) can use inline types and nested groups."""
    xsd = etree.fromstring(
        b"""<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
          <xs:element name="AMPSConfig">
            <xs:complexType><xs:sequence>
              <xs:element name="Name" type="xs:string"/>
              <xs:element name="Replication" minOccurs="0">
                <xs:complexType><xs:sequence>
                  <xs:element name="Destination" maxOccurs="unbounded">
                    <xs:complexType><xs:all>
                      <xs:element name="SyncType">
                        <xs:simpleType><xs:restriction base="xs:token">
                          <xs:enumeration value="sync"/><xs:enumeration value="async"/>
                        </xs:restriction></xs:simpleType>
                      </xs:element>
                    </xs:all></xs:complexType>
                  </xs:element>
                </xs:sequence></xs:complexType>
              </xs:element>
            </xs:sequence></xs:complexType>
          </xs:element>
        </xs:schema>"""
    )
    model = config_schema._read_model(xsd)
    assert model.children is not None
    replication = model.children["Replication"]
    assert (replication.min_occurs, replication.max_occurs) == (0, 1)
    assert replication.children is not None
    destination = replication.children["Destination"]
    assert destination.max_occurs is None
    assert destination.children is not None
    sync_type = destination.children["SyncType"]
    assert sync_type.path == "AMPSConfig/Replication/Destination/SyncType"
    assert sync_type.enumeration == ("sync", "async")
