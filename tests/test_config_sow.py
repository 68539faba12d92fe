"""amps_py.config: ``SOW/Topic`` -> :class:`SowTopicConfig`, and the configurations it
refuses (each with its line and a fix).

Configs are written one element per line, so the expected line of a problem can be read
off the list (line = index + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from amps_py.config import ConfigError, InstanceConfig, SowTopicConfig, parse_config
from amps_py.config.sow import expand_file_name, key_path_problem

HEAD = [
    "<AMPSConfig>",  # 1
    "  <Name>amps-1</Name>",  # 2
    "  <TransactionLog>",  # 3
    "    <JournalDirectory>./data</JournalDirectory>",  # 4
    "    <Topic><Name>orders.*</Name><MessageType>json</MessageType></Topic>",  # 5
    "    <Topic><Name>blobs</Name><MessageType>binary</MessageType></Topic>",  # 6
    "  </TransactionLog>",  # 7
    "  <SOW>",  # 8
]
TAIL = ["  </SOW>", "</AMPSConfig>"]


def doc(*lines: str) -> str:
    """A config with a TransactionLog recording orders.* (json) and blobs (binary),
    and ``lines`` inside <SOW> from line 9."""
    return "\n".join([*HEAD, *lines, *TAIL])


def topic(*children: str) -> list[str]:
    return ["    <Topic>", *(f"      {c}" for c in children), "    </Topic>"]


def load(text: str) -> InstanceConfig:
    return parse_config(text, source="sow.xml", environ={})


# ------------------------------------------------------------------------- accepted


def test_a_full_sow_topic_is_read_into_its_option_object() -> None:
    config = load(
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Key>/region</Key>",
                "<Key>/order/id</Key>",
                "<KeyDomain>orders-v2</KeyDomain>",
                "<Durability>transient</Durability>",
                "<Expiration>1h</Expiration>",
                "<FileName>./sow/%n.sow</FileName>",
                "<RecoveryPoint>epoch</RecoveryPoint>",
            )
        )
    )
    assert config.sow_topics == (
        SowTopicConfig(
            name="orders",
            message_type="json",
            keys=("/region", "/order/id"),  # in the order written
            durability="transient",
            expiration=3600.0,
            expiration_enabled=False,
            file_name=Path("sow/orders.json.sow"),
            key_domain="orders-v2",
        ),
    )
    sow = config.sow_topic("orders")
    assert sow is not None and sow.transient and sow.expires


def test_defaults_and_the_legacy_synonyms() -> None:
    """Topic for Name and Duration for Durability (AMPS before 5.0) are accepted; an
    omitted setting takes AMPS's default."""
    config = load(
        doc(
            *topic("<Topic>orders</Topic>", "<MessageType>json</MessageType>"),
            *topic(
                "<Name>orders-eu</Name>",
                "<MessageType>json</MessageType>",
                "<Duration>persistent</Duration>",
                "<Expiration>enabled</Expiration>",
            ),
            *topic("<Name>blobs</Name>", "<MessageType>binary</MessageType>"),
        )
    )
    orders, eu, blobs = config.sow_topics
    assert orders == SowTopicConfig("orders", "json", ())
    assert orders.durability == "persistent" and not orders.transient
    assert orders.expiration is None and not orders.expiration_enabled and not orders.expires
    assert orders.file_name is None and orders.key_domain == ""
    assert eu.expiration is None and eu.expiration_enabled and eu.expires
    assert blobs.keys == () and blobs.message_type == "binary"  # explicit keys (k)
    assert config.sow_topic("orders-eu") is eu
    assert config.sow_topic("orders.*") is None  # names are literal
    assert config.sow_topic("nothing") is None


def test_disabled_expiration_is_the_default() -> None:
    config = load(
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>",
                   "<Expiration>disabled</Expiration>"))
    )  # fmt: skip
    assert not config.sow_topics[0].expires


def test_no_sow_topics_without_a_sow_section() -> None:
    config = parse_config("<AMPSConfig><Name>a</Name></AMPSConfig>")
    assert config.sow_topics == ()
    assert config.sow_topic("orders") is None


def test_file_name_expansion_keeps_topics_apart() -> None:
    assert expand_file_name("./sow/%n.sow", "orders", "json") == "./sow/orders.json.sow"
    assert expand_file_name("/x/%n", "orders/eu", "json") == "/x/orders%2Feu.json"
    assert expand_file_name("/x/%n", "orders%2Feu", "json") != expand_file_name(
        "/x/%n", "orders/eu", "json"
    )
    assert expand_file_name("/x/fixed", "orders", "json") == "/x/fixed"


@pytest.mark.parametrize("path", ["/id", "/order/id", "/a_b/c-d/e.f/g:h/@attr", "/1st"])
def test_key_paths_accepted(path: str) -> None:
    assert key_path_problem(path) is None


# ------------------------------------------------------------------------- refused


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    fragment: str  # in str(problem)
    line: int
    fix: str = ""  # in the problem's fix
    count: int = 1


CASES = [
    Case(
        "duplicate SOW topic name",
        doc(
            *topic("<Name>orders</Name>", "<MessageType>json</MessageType>"),  # 9-12
            *topic("<Name>orders</Name>", "<MessageType>json</MessageType>"),  # 13-16
        ),
        "SOW topic 'orders' is defined twice (first on line 10)",
        14,
        "keep one <Topic> for orders",
    ),
    Case(
        "Key on a message type amps-py cannot read fields from",
        doc(*topic("<Name>blobs</Name>", "<MessageType>binary</MessageType>", "<Key>/id</Key>")),
        "MessageType binary and Key elements",
        12,
        "remove the Key elements (publishers then send each record's key in the k header)",
    ),
    Case(
        "SOW topic the TransactionLog does not record",
        doc(*topic("<Name>quotes</Name>", "<MessageType>json</MessageType>")),
        "SOW topic 'quotes' (json) is not recorded by the TransactionLog",
        10,
        "add <Topic><Name>quotes</Name><MessageType>json</MessageType></Topic> to the "
        "TransactionLog (line 3)",
    ),
    Case(
        "recorded, but for another message type",
        doc(*topic("<Name>blobs</Name>", "<MessageType>json</MessageType>")),
        "SOW topic 'blobs' (json) is not recorded by the TransactionLog",
        10,
    ),
    Case(
        "SOW without a TransactionLog",
        "\n".join(
            [
                "<AMPSConfig>",
                "  <Name>amps-1</Name>",
                "  <SOW>",
                *topic("<Name>orders</Name>", "<MessageType>json</MessageType>"),
                "  </SOW>",
                "</AMPSConfig>",
            ]
        ),
        "SOW topics need a TransactionLog: amps-py builds each SOW topic from the journal",
        3,
        "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>",
    ),
    Case(
        "key path without a leading slash",
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>id</Key>")),
        "Key 'id' is not an identifier path: it must start with '/'",
        12,
        "e.g. /id or /order/id",
    ),
    Case(
        "key path with an empty step",
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>/a//b</Key>")),
        "Key '/a//b' has an empty step",
        12,
    ),
    Case(
        "key path with a trailing slash",
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>/a/</Key>")),
        "Key '/a/' has an empty step",
        12,
    ),
    Case(
        "key path with a space",
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>/a b</Key>")),
        "Key '/a b' contains ' '",
        12,
    ),
    Case(
        "key path indexing an array",
        doc(*topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>/l[0]</Key>")),
        "Key '/l[0]' indexes an array",
        12,
    ),
    Case(
        "the same Key twice",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Key>/id</Key>",
                "<Key>/id</Key>",
            )
        ),
        "Key /id is given twice in this SOW topic (first on line 12)",
        13,
    ),
    Case(
        "Expiration that is not a duration",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Expiration>30 minutes</Expiration>",
            )
        ),
        "'30 minutes' is not a valid Expiration",
        12,
        "use disabled (the default: records never expire), enabled",
    ),
    Case(
        "Expiration misspelt",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Expiration>enable</Expiration>",
            )
        ),
        "did you mean 'enabled'?",
        12,
    ),
    Case(
        "Expiration of zero",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Expiration>0s</Expiration>",
            )
        ),
        "Expiration 0s would expire every record at once",
        12,
    ),
    Case(
        "RecoveryPoint now",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<RecoveryPoint>now</RecoveryPoint>",
            )
        ),
        "RecoveryPoint 'now' is recognised by AMPS but not supported by amps-py",
        12,
        "write <RecoveryPoint>epoch</RecoveryPoint>",
    ),
    Case(
        "RecoveryPoint misspelt",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<RecoveryPoint>epoc</RecoveryPoint>",
            )
        ),
        "'epoc' is not a valid RecoveryPoint; did you mean 'epoch'?",
        12,
    ),
    Case(
        "no Name",
        doc(*topic("<MessageType>json</MessageType>")),
        "<Topic> is missing the required element <Name>",
        9,
        "<Name>orders</Name>",
    ),
    Case(
        "no MessageType",
        doc(*topic("<Name>orders</Name>")),
        "<Topic> is missing the required element <MessageType>",
        9,
    ),
    Case(
        "Name and its synonym Topic",
        doc(
            *topic(
                "<Name>orders</Name>", "<Topic>orders</Topic>", "<MessageType>json</MessageType>"
            )
        ),
        "Name and Topic are the same setting and both are given",
        11,
    ),
    Case(
        "Durability and its synonym Duration",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Durability>transient</Durability>",
                "<Duration>transient</Duration>",
            )
        ),
        "Durability and Duration are the same setting and both are given",
        13,
    ),
    Case(
        "Durability value",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<Durability>forever</Durability>",
            )
        ),
        "'forever' is not a valid Durability",
        12,
        "persistent, transient",
    ),
    Case(
        "a regular expression as the name",
        doc(*topic("<Name>orders.*</Name>", "<MessageType>json</MessageType>")),
        "SOW topic name 'orders.*' contains '*'",
        10,
        "write <Pattern>orders.*</Pattern> beside a literal <Name>",
    ),
    Case(
        "an AMPS-only message type",
        doc(*topic("<Name>orders</Name>", "<MessageType>bflat</MessageType>")),
        "MessageType 'bflat' is recognised by AMPS but not supported by amps-py yet",
        11,
    ),
    Case(
        "two topics in one store directory",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<FileName>./sow/all</FileName>",
            ),
            *topic(
                "<Name>orders-eu</Name>",
                "<MessageType>json</MessageType>",
                "<FileName>sow/all/</FileName>",
            ),
        ),
        "SOW topics 'orders' and 'orders-eu' would share the store directory sow/all "
        "(the other FileName is on line 12)",
        17,
        "e.g. ./sow/%n.sow",
    ),
    Case(
        "store in the journal directory",
        doc(
            *topic(
                "<Name>orders</Name>",
                "<MessageType>json</MessageType>",
                "<FileName>./data</FileName>",
            )
        ),
        "would keep its store in the JournalDirectory itself",
        12,
    ),
    *(
        Case(
            f"AMPS-only SOW/Topic child {name}",
            doc(
                *topic(
                    "<Name>orders</Name>",
                    "<MessageType>json</MessageType>",
                    f"<{name}>x</{name}>",
                )
            ),
            f"<{name}> is a recognised AMPS element, not supported by amps-py yet; remove it",
            12,
            f"delete <{name}>",
        )
        for name in (
            "SlabSize",
            "InitialSlabCount",
            "HashIndex",
            "Index",
            "ExpectedKeyCountHint",
            "History",
            "KeyGenerator",
        )
    ),
    *(
        Case(
            f"SOW/{name} is not supported yet",
            doc(f"    <{name}><Name>q</Name></{name}>"),
            f"<{name}> is a recognised AMPS element, not supported by amps-py yet ({note}",
            9,
        )
        for name, note in (("View", "views come in a later amps-py release"),)
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case: Case) -> None:
    with pytest.raises(ConfigError) as info:
        load(case.text)
    problems = info.value.problems
    matching = [p for p in problems if case.fragment in str(p)]
    assert matching, f"no problem contains {case.fragment!r}:\n{info.value}"
    assert matching[0].line == case.line, str(info.value)
    assert case.fix in matching[0].fix, str(info.value)
    assert len(problems) == case.count, str(info.value)
    for problem in problems:
        text = str(problem)
        assert text.startswith(f"sow.xml:{problem.line}: ") and " Fix: " in text
        for jargon in ("facet", "xs:", "atomic type", "{urn"):
            assert jargon not in text, text


def test_every_problem_of_several_topics_is_reported_at_once() -> None:
    text = doc(
        *topic("<Name>quotes</Name>", "<MessageType>json</MessageType>"),  # 9-12
        *topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>id</Key>"),
    )
    with pytest.raises(ConfigError) as info:
        load(text)
    assert [p.line for p in info.value.problems] == [10, 16]


def test_the_standalone_example_keeps_orders_by_id() -> None:
    from amps_py.config import load_config

    example = Path(__file__).resolve().parents[1] / "config" / "examples" / "standalone.xml"
    config = load_config(example, environ={})
    assert config.sow_topic("orders") == SowTopicConfig("orders", "json", ("/id",))


# ------------------------------------------------ Pattern topics and ConflatedTopic


def conflated(*children: str, tag: str = "ConflatedTopic") -> list[str]:
    return [f"    <{tag}>", *(f"      {c}" for c in children), f"    </{tag}>"]


ORDERS = topic("<Name>orders</Name>", "<MessageType>json</MessageType>", "<Key>/id</Key>")  # 9-13
ALL_ORDERS = topic(  # 9-14
    "<Name>all</Name>",
    "<Pattern>^orders/</Pattern>",
    "<MessageType>json</MessageType>",
    "<Key>/id</Key>",
)


def test_pattern_and_conflated_topics_are_read() -> None:
    config = load(
        doc(
            *ALL_ORDERS,
            *topic("<Name>blobs</Name>", "<MessageType>binary</MessageType>"),
            *topic("<Name>ordersX</Name>", "<MessageType>json</MessageType>"),
            *conflated(
                "<Topic>orders-C</Topic>",
                "<UnderlyingTopic>ordersX</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
                "<Filter>/qty &gt; 1</Filter>",
                "<HashIndex><Key>/id</Key><Key>/region</Key></HashIndex>",
                tag="ReplicaDefinition",
            ),
            *conflated(
                "<Name>orders-C5</Name>",
                "<UnderlyingTopic>ordersX</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
            ),
        )
    )
    pattern = config.sow_topic("all")
    assert pattern is not None and pattern.pattern == "^orders/"
    assert (
        pattern.holds("orders/eu") and not pattern.holds("all") and not pattern.holds("x/orders/")
    )
    assert config.sow_topic_holding("orders/eu") == pattern
    assert config.sow_topic_holding("ordersX") == config.sow_topic("ordersX")
    assert config.sow_topic_holding("all") is None  # the Name only names the store
    assert config.sow_pattern("^orders/") == pattern
    first, second = config.conflated_topics
    assert (first.name, first.underlying_topic, first.interval, first.filter) == (
        "orders-C",
        "ordersX",
        5.0,
        "/qty > 1",
    )
    assert first.hash_indexes == ("/id,/region",)
    assert second.name == "orders-C5" and second.filter is None


def test_journal_coverage_of_a_pattern_is_proved_or_refused() -> None:
    from amps_py.config.model import JournalTopic
    from amps_py.config.sow_pattern import journal_covers_pattern, whole_topic_form

    assert whole_topic_form("^orders/") == "orders/.*"
    assert whole_topic_form("^orders/.*$") == "orders/.*"
    assert whole_topic_form("eu") == ".*eu.*"
    assert whole_topic_form("a|b") == ".*(?:a|b).*"
    assert whole_topic_form("^a|b$") == ".*(?:^a|b$).*"
    for journal, pattern in [
        (".*", "anything"),
        ("orders/.*", "^orders/"),
        ("^orders/.*$", "^orders/.*"),
        ("orders.*", "^orders/"),  # a literal prefix of every topic it matches
        ("orders", "^orders$"),
        (".*eu.*", "eu"),
        (".*(?:a|b).*", "a|b"),
    ]:
        assert journal_covers_pattern([JournalTopic(journal, "json")], pattern, "json"), journal
    for journal, pattern, mtype in [
        ("orders/.*", "orders/", "json"),  # searched: also x/orders/
        ("orders/eu.*", "^orders/", "json"),  # a narrower prefix
        ("ord[a-z]+.*", "^orders/", "json"),  # not proved
        ("orders/.*", "^orders/", "xml"),  # another message type
    ]:
        assert not journal_covers_pattern([JournalTopic(journal, "json")], pattern, mtype)


PATTERN_CASES = [
    Case(
        "a Pattern that does not compile",
        doc(
            *topic(
                "<Name>all</Name>", "<Pattern>orders(</Pattern>", "<MessageType>json</MessageType>"
            )
        ),
        "Pattern 'orders(' of this SOW topic is not a valid regular expression: missing ), "
        "unterminated subpattern at position 6",
        11,
        "correct the expression (e.g. ^orders/",
    ),
    Case(
        "a Pattern the TransactionLog does not record",
        doc(
            *topic("<Name>all</Name>", "<Pattern>^fx/</Pattern>", "<MessageType>json</MessageType>")
        ),
        "SOW topic 'all': the TransactionLog does not record every topic its Pattern '^fx/'",
        11,
        "add <Topic><Name>fx/.*</Name><MessageType>json</MessageType></Topic> to the "
        "TransactionLog (line 3)",
    ),
    Case(
        "a topic held by a Pattern and by its own Topic",
        doc(*ALL_ORDERS, *topic("<Name>orders/eu</Name>", "<MessageType>json</MessageType>")),
        "SOW topic 'orders/eu' is also held by SOW topic 'all', whose Pattern '^orders/' "
        "matches it (line 10)",
        16,
        "narrow the Pattern so that it does not match orders/eu",
    ),
    Case(
        "a conflated topic over an unknown topic, and too often",
        doc(
            *ORDERS,
            *conflated(
                "<Name>orders-C</Name>",
                "<UnderlyingTopic>order</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
                "<Interval>50ms</Interval>",
            ),
        ),
        "UnderlyingTopic 'order' is not a SOW topic of this instance; did you mean 'orders'?",
        16,
        "name a SOW/Topic's Name exactly",
        count=2,
    ),
    Case(
        "a conflated topic more often than 100ms",
        doc(
            *ORDERS,
            *conflated(
                "<Name>orders-C</Name>",
                "<UnderlyingTopic>orders</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
                "<Interval>50ms</Interval>",
            ),
        ),
        "Interval 50ms is below 100ms, the shortest AMPS allows for a conflated topic",
        18,
        "use 100ms or more",
    ),
    Case(
        "a conflated topic of another message type",
        doc(
            *ORDERS,
            *conflated(
                "<Name>orders-C</Name>",
                "<UnderlyingTopic>orders</UnderlyingTopic>",
                "<MessageType>xml</MessageType>",
            ),
        ),
        "conflated topic's MessageType xml is not that of its UnderlyingTopic 'orders' (json)",
        16,
        "write <MessageType>json</MessageType>",
    ),
    Case(
        "a conflated topic named like a SOW topic",
        doc(
            *ORDERS,
            *conflated(
                "<Name>orders</Name>",
                "<UnderlyingTopic>orders</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
            ),
        ),
        "conflated topic 'orders' has the name of the SOW topic on line 9",
        15,
        "give the conflated topic another name, e.g. orders-C",
    ),
    Case(
        "a conflated topic over a Pattern topic",
        doc(
            *ALL_ORDERS,
            *conflated(
                "<Name>all-C</Name>",
                "<UnderlyingTopic>all</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
            ),
        ),
        "UnderlyingTopic 'all' is a Pattern SOW topic ('^orders/'): AMPS conflates each topic "
        "it holds under a name made by TopicFormat, which amps-py does not support yet",
        17,
        "give the topic to conflate a SOW <Topic> of its own",
    ),
    Case(
        "TopicFormat",
        doc(
            *ALL_ORDERS,
            *conflated(
                "<Name>all-C</Name>",
                "<UnderlyingTopic>all</UnderlyingTopic>",
                "<MessageType>json</MessageType>",
                "<TopicFormat>%n-C</TopicFormat>",
                tag="ReplicaDefinition",
            ),
        ),
        "<TopicFormat> is a recognised AMPS element, not supported by amps-py yet (it names "
        "the conflated topics of a Pattern SOW topic",
        19,
        "delete <TopicFormat>",
        count=2,
    ),
    Case(
        "a conflated topic without a name",
        doc(
            *ORDERS,
            *conflated(
                "<UnderlyingTopic>orders</UnderlyingTopic>", "<MessageType>json</MessageType>"
            ),
        ),
        "<ConflatedTopic> is missing the required element <Name>",
        14,
        "<Name>orders-C</Name>",
    ),
]


@pytest.mark.parametrize("case", PATTERN_CASES, ids=[c.id for c in PATTERN_CASES])
def test_pattern_and_conflated_refused(case: Case) -> None:
    test_refused(case)
