"""amps_py.config: ``SOW/Queue`` (``QueueDefinition``), ``SOW/GroupLocalQueue`` and
``SOW/LocalQueue`` -> :class:`QueueConfig`, and the configurations refused (each with
its line and a fix).

Configs are written one element per line, so the expected line of a problem can be read
off the list (line = index + 1): the queues start on line 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from amps_py.config import ConfigError, InstanceConfig, QueueConfig, load_config, parse_config

HEAD = [
    "<AMPSConfig>",  # 1
    "  <Name>amps-1</Name>",  # 2
    "  <TransactionLog>",  # 3
    "    <JournalDirectory>./data</JournalDirectory>",  # 4
    "    <Topic><Name>orders.*</Name><MessageType>json</MessageType></Topic>",  # 5
    "    <Topic><Name>blobs</Name><MessageType>binary</MessageType></Topic>",  # 6
    "    <Topic><Name>jobs</Name><MessageType>json</MessageType></Topic>",  # 7
    "  </TransactionLog>",  # 8
    "  <SOW>",  # 9
]
FIRST = len(HEAD) + 1  # the line of the first element inside <SOW>


def doc(*lines: str, replicated: tuple[str, ...] = ()) -> str:
    """A config journaling orders.* (json), blobs (binary) and jobs (json), with
    ``lines`` inside <SOW> from line 10 and, when ``replicated`` is given, a
    Replication Destination with those Topic elements after it."""
    tail = ["  </SOW>"]
    if replicated:
        tail += [
            "  <Replication>",
            "    <Destination>",
            "      <Name>amps-2</Name>",
            "      <SyncType>async</SyncType>",
            *(f"      <Topic>{t}</Topic>" for t in replicated),
            "      <Transport><Type>amps-replication</Type>"
            "<InetAddr>127.0.0.1:9204</InetAddr></Transport>",
            "    </Destination>",
            "  </Replication>",
        ]
    return "\n".join([*HEAD, *lines, *tail, "</AMPSConfig>"])


def queue(*children: str, tag: str = "Queue") -> list[str]:
    return [f"    <{tag}>", *(f"      {c}" for c in children), f"    </{tag}>"]


def named(name: str, message_type: str = "json", *children: str, tag: str = "Queue") -> list[str]:
    """A queue with Name ``name`` and ``message_type`` on its first two lines."""
    return queue(
        f"<Name>{name}</Name>", f"<MessageType>{message_type}</MessageType>", *children, tag=tag
    )


def load(text: str) -> InstanceConfig:
    return parse_config(text, source="queue.xml", environ={})


# ------------------------------------------------------------------------- accepted


def test_a_queue_with_every_element_is_read_into_its_option_object() -> None:
    config = load(
        doc(
            *named(
                "work",
                "json",
                "<UnderlyingTopic>orders/work</UnderlyingTopic>",
                "<DefaultPublishTarget>orders/work</DefaultPublishTarget>",
                "<LeasePeriod>30s</LeasePeriod>",
                "<Semantics>at-least-once</Semantics>",
                "<MaxBacklog>100</MaxBacklog>",
                "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>",
                "<Expiration>1h</Expiration>",
                "<ExpirationModel>default</ExpirationModel>",
                "<Filter>/status = 'new'</Filter>",
                "<RecoveryPoint>epoch</RecoveryPoint>",
                "<FairnessModel>fast</FairnessModel>",
                "<Leasing>strict</Leasing>",
                "<MaxDeliveries>5</MaxDeliveries>",
                "<MaxCancels>3</MaxCancels>",
                "<Priority>/priority * 2</Priority>",
            )
        )
    )
    work = QueueConfig(
        kind="distributed",
        name="work",
        message_type="json",
        underlying_topic="orders/work",
        underlying_is_regex=False,
        default_publish_target="orders/work",
        lease_period=30.0,
        semantics="at-least-once",
        max_backlog=100,
        max_per_subscription_backlog=10,
        expiration=3600.0,
        filter="/status = 'new'",
        max_deliveries=5,
        max_cancels=3,
        leasing="strict",
        fairness="fast",
        priority="/priority * 2",
        barrier_expression=None,
        initial_owner=None,
        recovery_point="epoch",
    )
    assert config.queues == (work,)
    assert config.queue("work") == work
    assert config.queue("orders/work") is None  # by the queue's name only
    assert config.sow_topics == ()  # a queue is not a SOW topic


def test_defaults_and_the_synonyms_queue_definition_and_topic() -> None:
    """QueueDefinition is a Queue; Topic is Name; an omitted setting takes AMPS's
    default and the underlying topic is the queue's name."""
    config = load(
        doc(*queue("<Topic>jobs</Topic>", "<MessageType>json</MessageType>", tag="QueueDefinition"))
    )
    (jobs,) = config.queues
    assert jobs == QueueConfig("distributed", "jobs", "json", "jobs", False)
    assert jobs.default_publish_target is None and jobs.publish_target == "jobs"
    assert jobs.lease_period is None and jobs.expiration is None
    assert jobs.semantics == "at-least-once" and not jobs.at_most_once
    assert jobs.max_backlog is None and jobs.max_per_subscription_backlog == 1
    assert jobs.max_deliveries == 0 and jobs.max_cancels == 0  # unlimited
    assert (jobs.leasing, jobs.fairness) == ("sublet", "proportional")
    assert jobs.filter is jobs.priority is jobs.barrier_expression is jobs.initial_owner is None
    assert jobs.recovery_point == "epoch"
    assert jobs.covers("jobs") and not jobs.covers("jobs/1")


def test_a_group_local_queue_over_a_regular_expression() -> None:
    config = load(
        doc(
            *named(
                "eu-work",
                "json",
                "<UnderlyingTopic>^orders/eu/</UnderlyingTopic>",
                "<DefaultPublishTarget>orders/eu/new</DefaultPublishTarget>",
                "<InitialOwner>amps-2</InitialOwner>",
                "<BarrierExpression>/type = 'end-of-day'</BarrierExpression>",
                tag="GroupLocalQueue",
            )
        )
    )
    (eu,) = config.queues
    assert eu.kind == "group-local" and eu.initial_owner == "amps-2"
    assert eu.underlying_topic == "^orders/eu/" and eu.underlying_is_regex
    assert eu.publish_target == "orders/eu/new"
    assert eu.barrier_expression == "/type = 'end-of-day'" and eu.priority is None
    # AMPS topic regexes are unanchored: written anchors are what anchor them
    assert eu.covers("orders/eu/new") and eu.covers("orders/eu/7")
    assert not eu.covers("orders/us/1") and not eu.covers("x/orders/eu/1")


def test_an_at_most_once_local_queue_is_always_round_robin() -> None:
    config = load(
        doc(
            *named(
                "blobs",
                "binary",
                "<Semantics>at-most-once</Semantics>",
                "<FairnessModel>proportional</FairnessModel>",
                tag="LocalQueue",
            )
        )
    )
    (blobs,) = config.queues
    assert blobs.kind == "local" and blobs.message_type == "binary"
    assert blobs.at_most_once and blobs.fairness == "round-robin"


def test_queues_of_every_kind_beside_a_sow_topic_in_any_order() -> None:
    """A queue may take a SOW topic's messages through UnderlyingTopic; queues and SOW
    topics mix in any order, and each kind is found by its name."""
    config = load(
        doc(
            *named("orders-q", "json", "<UnderlyingTopic>orders</UnderlyingTopic>"),
            "    <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>",
            *named("jobs", "json", tag="LocalQueue"),
            *named("blobs", "binary", "<InitialOwner>amps-1</InitialOwner>", tag="GroupLocalQueue"),
        )
    )
    assert [(q.kind, q.name) for q in config.queues] == [
        ("distributed", "orders-q"),
        ("local", "jobs"),
        ("group-local", "blobs"),
    ]
    assert [t.name for t in config.sow_topics] == ["orders"]
    assert config.queue("orders") is None and config.sow_topic("orders-q") is None
    assert config.queue("blobs") is config.queues[2]


def test_a_local_queues_underlying_topic_of_another_name_may_be_replicated() -> None:
    """AMPS: "The data from the underlying topics for the queue can be replicated without
    special restrictions. The queue topic itself, however, cannot be replicated." A
    destination covering the underlying topic or the DefaultPublishTarget of a
    LocalQueue, but not its name, is accepted; it carries no queue records (they are
    the instance's own)."""
    regex_queue = named(
        "q", "json", "<UnderlyingTopic>^orders/</UnderlyingTopic>",
        "<DefaultPublishTarget>orders/new</DefaultPublishTarget>", tag="LocalQueue",
    )  # fmt: skip
    literal_queue = named(
        "jobs", "json", "<UnderlyingTopic>orders/jobs</UnderlyingTopic>", tag="LocalQueue"
    )
    for queue, topic in (
        (regex_queue, "orders/eu"),
        (regex_queue, ".*new"),
        (literal_queue, "orders/jobs"),
    ):
        config = load(
            doc(*queue, replicated=(f"<Name>{topic}</Name><MessageType>json</MessageType>",))
        )
        (destination,) = config.replication
        assert destination.archived_queues == (), topic


def test_a_local_queue_whose_topic_no_destination_replicates() -> None:
    """Destinations replicating other topics (or other message types) leave a
    LocalQueue alone; a distributed queue's topic may be replicated."""
    config = load(
        doc(
            *named("jobs", "json", tag="LocalQueue"),
            *named("orders/new", "json"),
            replicated=(
                "<Name>orders.*</Name><MessageType>json</MessageType>",
                "<MessageType>binary</MessageType>",
            ),
        )
    )
    assert [q.name for q in config.queues] == ["jobs", "orders/new"]
    assert len(config.replication) == 1


def test_no_queues_without_any() -> None:
    config = parse_config("<AMPSConfig><Name>a</Name><SOW/></AMPSConfig>")
    assert config.queues == ()
    assert config.queue("orders") is None


def test_the_standalone_example_declares_the_readme_queue() -> None:
    """The README publishes to and consumes the example's queue ``work``."""
    example = Path(__file__).resolve().parents[1] / "config" / "examples" / "standalone.xml"
    config = load_config(example, environ={})
    (work,) = config.queues
    assert (work.name, work.kind, work.semantics) == ("work", "distributed", "at-least-once")
    assert work.lease_period == 60 and work.max_per_subscription_backlog == 10
    assert config.sow_topics  # still loads, SOW topics and all


# ------------------------------------------------------------------------- refused


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    fragment: str  # in str(problem)
    line: int
    fix: str = ""  # in the problem's fix
    count: int = 1


def _value_cases() -> list[Case]:
    """One setting of a queue with a wrong value (on line 12, after Name and
    MessageType)."""
    wrong = [
        ("LeasePeriod", "soon", "'soon' is not a valid duration for LeasePeriod", "ms"),
        ("LeasePeriod", "0s", "LeasePeriod 0s must be more than 0", "e.g. 30s"),
        ("Expiration", "0", "Expiration 0 must be more than 0", "e.g. 1h"),
        ("Expiration", "1 hour", "'1 hour' is not a valid duration for Expiration", ""),
        ("Semantics", "at-mst-once", "did you mean 'at-most-once'?", "at-least-once"),
        ("Leasing", "loose", "'loose' is not a valid Leasing", "sublet, strict"),
        ("FairnessModel", "round_robin", "did you mean 'round-robin'?", "proportional"),
        ("ExpirationModel", "whenever", "'whenever' is not a valid ExpirationModel", "default"),
        ("MaxBacklog", "0", "MaxBacklog 0 is below 1", "omit MaxBacklog for no cap"),
        ("MaxBacklog", "ten", "'ten' is not a valid MaxBacklog: it must be a whole number", "1"),
        ("MaxPerSubscriptionBacklog", "0", "MaxPerSubscriptionBacklog 0 is below 1", "1 or"),
        ("MaxDeliveries", "-1", "'-1' is not a valid MaxDeliveries", "0 means unlimited"),
        ("MaxCancels", "1.5", "'1.5' is not a valid MaxCancels", "0 or more"),
        ("RecoveryPoint", "now", "RecoveryPoint 'now' is not supported by amps-py", "epoch"),
        ("RecoveryPoint", "epoc", "RecoveryPoint 'epoc' is not supported by amps-py; did "
         "you mean 'epoch'?", "epoch"),
    ]  # fmt: skip
    cases = [
        Case(f"{name} {value}", doc(*named("jobs", "json", f"<{name}>{value}</{name}>")),
             fragment, FIRST + 3, fix)
        for name, value, fragment, fix in wrong
    ]  # fmt: skip
    cases += [
        Case(f"ExpirationModel {model}",
             doc(*named("jobs", "json", f"<ExpirationModel>{model}</ExpirationModel>")),
             f"ExpirationModel {model!r} is recognised by AMPS but not supported by amps-py "
             "yet", FIRST + 3, "use one of: default")
        for model in ("queue", "latest", "earliest")
    ]  # fmt: skip
    return cases


def _expression_cases() -> list[Case]:
    return [
        Case(
            "Filter that does not parse",
            doc(*named("jobs", "json", "<Filter>/status = </Filter>")),
            "Filter '/status =' is not a valid content filter: the filter ends where a value "
            "was expected (column 10)",
            FIRST + 3,
            "a value is a field",
        ),
        Case(
            "BarrierExpression that does not parse",
            doc(*named("jobs", "json", "<BarrierExpression>/type = 'eod</BarrierExpression>")),
            'BarrierExpression "/type = \'eod" is not a valid content filter: unterminated '
            "string (column 9)",
            FIRST + 3,
        ),
        Case(
            "Priority that does not parse",
            doc(*named("jobs", "json", "<Priority>/priority +</Priority>")),
            "Priority '/priority +' is not a valid expression",
            FIRST + 3,
        ),
        Case(
            "a filter error on the second line of a Filter",
            doc(*named("jobs", "json", "<Filter>/status = 'new'", "AND AND /qty > 1</Filter>")),
            "is not a valid content filter: expected a value, found keyword AND (column 11)",
            FIRST + 4,
        ),
        Case(
            "Priority and BarrierExpression both",
            doc(
                *named(
                    "jobs",
                    "json",
                    "<BarrierExpression>/eod = 1</BarrierExpression>",
                    "<Priority>/priority</Priority>",
                )
            ),
            "Priority and BarrierExpression are both given",
            FIRST + 4,
            "remove one of <Priority> and <BarrierExpression>",
        ),
    ]


def _name_and_topic_cases() -> list[Case]:
    return [
        Case("no Name", doc(*queue("<MessageType>json</MessageType>")),
             "<Queue> is missing the required element <Name>", FIRST, "<Name>work</Name>"),
        Case("no MessageType", doc(*queue("<Name>jobs</Name>", tag="LocalQueue")),
             "<LocalQueue> is missing the required element <MessageType>", FIRST),
        Case("Name and its synonym Topic",
             doc(*queue("<Name>jobs</Name>", "<Topic>jobs</Topic>",
                        "<MessageType>json</MessageType>")),
             "Name and Topic are the same setting and both are given", FIRST + 2),
        Case("a regular expression as the queue name", doc(*named("orders.*")),
             "queue name 'orders.*' contains '*'", FIRST + 1, "put the pattern in "
             "<UnderlyingTopic>"),
        Case("an AMPS-only message type", doc(*named("jobs", "protobuf")),
             "MessageType 'protobuf' is recognised by AMPS but not supported by amps-py yet",
             FIRST + 2),
        Case("UnderlyingTopic that is not a regular expression",
             doc(*named("q", "json", "<UnderlyingTopic>orders/(</UnderlyingTopic>")),
             "UnderlyingTopic 'orders/(' is not a valid regular expression", FIRST + 3),
        Case("regular UnderlyingTopic without DefaultPublishTarget",
             doc(*named("q", "json", "<UnderlyingTopic>^orders/</UnderlyingTopic>")),
             "UnderlyingTopic '^orders/' is a regular expression, so a publish to the queue "
             "'q' has no topic to go to", FIRST + 3, "add <DefaultPublishTarget>"),
        Case("DefaultPublishTarget that is a regular expression",
             doc(*named("q", "json", "<UnderlyingTopic>^orders/</UnderlyingTopic>",
                        "<DefaultPublishTarget>orders/.*</DefaultPublishTarget>")),
             "DefaultPublishTarget 'orders/.*' is a regular expression", FIRST + 4),
        Case("DefaultPublishTarget the regular expression does not cover",
             doc(*named("q", "json", "<UnderlyingTopic>^orders/</UnderlyingTopic>",
                        "<DefaultPublishTarget>jobs</DefaultPublishTarget>")),
             "DefaultPublishTarget 'jobs' is not covered by UnderlyingTopic '^orders/'",
             FIRST + 4, "name a topic that UnderlyingTopic covers"),
        Case("DefaultPublishTarget other than a literal UnderlyingTopic",
             doc(*named("q", "json", "<UnderlyingTopic>jobs</UnderlyingTopic>",
                        "<DefaultPublishTarget>orders</DefaultPublishTarget>")),
             "DefaultPublishTarget 'orders' is not covered by UnderlyingTopic 'jobs'",
             FIRST + 4, "remove <DefaultPublishTarget>"),
    ]  # fmt: skip


def _ownership_cases() -> list[Case]:
    return [
        Case("GroupLocalQueue without InitialOwner",
             doc(*named("jobs", tag="GroupLocalQueue")),
             "<GroupLocalQueue> is missing the required element <InitialOwner>", FIRST,
             "the Name of the instance that owns every message"),
        Case("InitialOwner on a Queue",
             doc(*named("jobs", "json", "<InitialOwner>amps-1</InitialOwner>")),
             "InitialOwner is given in a <Queue>; only a GroupLocalQueue has one", FIRST + 3,
             "make this queue a <GroupLocalQueue>"),
        Case("InitialOwner on a QueueDefinition",
             doc(*named("jobs", "json", "<InitialOwner>amps-1</InitialOwner>",
                        tag="QueueDefinition")),
             "InitialOwner is given in a <QueueDefinition>", FIRST + 3),
        Case("InitialOwner on a LocalQueue",
             doc(*named("jobs", "json", "<InitialOwner>amps-1</InitialOwner>",
                        tag="LocalQueue")),
             "a LocalQueue belongs to this instance alone", FIRST + 3),
        Case("InitialOwner that cannot be an instance name",
             doc(*named("jobs", "json", "<InitialOwner>a/b</InitialOwner>",
                        tag="GroupLocalQueue")),
             "InitialOwner 'a/b' contains a path separator", FIRST + 3),
    ]  # fmt: skip


def _journal_cases() -> list[Case]:
    no_log = "\n".join(
        ["<AMPSConfig>", "  <Name>amps-1</Name>", "  <SOW>", *named("jobs"), "  </SOW>",
         "</AMPSConfig>"]
    )  # fmt: skip
    return [
        Case("underlying topic the TransactionLog does not record",
             doc(*named("q", "json", "<UnderlyingTopic>quotes</UnderlyingTopic>")),
             "the topic 'quotes' (json) of queue 'q' is not recorded by the TransactionLog",
             FIRST + 3, "add <Topic><Name>quotes</Name><MessageType>json</MessageType></Topic>"
             " to the TransactionLog (line 3)"),
        Case("queue name the TransactionLog does not record", doc(*named("quotes")),
             "the topic 'quotes' (json) of queue 'quotes' is not recorded", FIRST + 1),
        Case("DefaultPublishTarget the TransactionLog does not record",
             doc(*named("q", "json", "<UnderlyingTopic>^work/</UnderlyingTopic>",
                        "<DefaultPublishTarget>work/new</DefaultPublishTarget>")),
             "the topic 'work/new' (json) of queue 'q' is not recorded", FIRST + 4),
        Case("MessageType other than the underlying topic's", doc(*named("blobs", "json")),
             "queue 'blobs' has MessageType json, but its topic 'blobs' is recorded by the "
             "TransactionLog as binary", FIRST + 1, "give the queue the message type of its "
             "underlying topic (binary)"),
        Case("a queue without a TransactionLog", no_log,
             "queues need a TransactionLog: amps-py derives each queue from the journal",
             4, "<TransactionLog>"),
        Case("queue name of a SOW topic",
             doc("    <Topic><Name>jobs</Name><MessageType>json</MessageType></Topic>",
                 *named("jobs", tag="LocalQueue")),
             "queue 'jobs' has the name of the SOW topic on line 10", FIRST + 2,
             "with <UnderlyingTopic>jobs</UnderlyingTopic>"),
        Case("two queues of one name",
             doc(*named("jobs"), *named("jobs", tag="LocalQueue")),
             "queue 'jobs' is defined twice (first on line 11)", FIRST + 5,
             "keep one queue named jobs"),
    ]  # fmt: skip


def _replicated_local_cases() -> list[Case]:
    fix = (
        "a LocalQueue must not be replicated; use Queue or GroupLocalQueue, or remove the "
        "topic from the destination (to replicate its messages alone, give the LocalQueue an "
        "UnderlyingTopic of another name and replicate only that topic)"
    )
    regex_queue = named(
        "q", "json", "<UnderlyingTopic>^orders/</UnderlyingTopic>",
        "<DefaultPublishTarget>orders/new</DefaultPublishTarget>", tag="LocalQueue",
    )  # fmt: skip
    # a four-line queue, </SOW>, <Replication>, <Destination>, Name, SyncType, then Topic
    first_topic = FIRST + 9
    return [
        Case("LocalQueue replicated by a literal destination topic",
             doc(*named("jobs", tag="LocalQueue"),
                 replicated=("<Name>jobs</Name><MessageType>json</MessageType>",)),
             "LocalQueue 'jobs' is replicated: Destination 'amps-2' replicates its topic "
             f"'jobs' by the Topic on line {first_topic}", FIRST, fix),
        Case("LocalQueue replicated by a regular destination topic",
             doc(*named("orders/new", tag="LocalQueue"),
                 replicated=("<Name>orders.*</Name><MessageType>json</MessageType>",)),
             "LocalQueue 'orders/new' is replicated", FIRST, fix),
        Case("LocalQueue replicated by a destination topic without a Name",
             doc(*named("jobs", tag="LocalQueue"),
                 replicated=("<MessageType>binary</MessageType>",
                             "<MessageType>json</MessageType>")),
             f"by the Topic on line {first_topic + 1}", FIRST, fix),
        Case("regular LocalQueue whose name a regular destination topic covers",
             doc(*regex_queue,
                 replicated=("<Name>q|orders/eu</Name><MessageType>json</MessageType>",)),
             "LocalQueue 'q' is replicated: Destination 'amps-2' replicates its topic 'q'",
             FIRST, fix),
    ]  # fmt: skip


def _unsupported_cases() -> list[Case]:
    return [
        Case(f"{name} in a {tag}",
             doc(*named("jobs", "json", f"<{name}>x</{name}>", tag=tag)),
             f"<{name}> is a recognised AMPS element, not supported by amps-py yet",
             FIRST + 3, f"delete <{name}>", count=2 if tag == "GroupLocalQueue" else 1)
        for name in ("FileBackedMetadata", "TargetQueueDepth", "DeferredAckExpiration",
                     "GroupLocalQueueDomain")
        for tag in ("Queue", "LocalQueue", "GroupLocalQueue")
    ]  # fmt: skip


CASES = [
    *_value_cases(),
    *_expression_cases(),
    *_name_and_topic_cases(),
    *_ownership_cases(),
    *_journal_cases(),
    *_replicated_local_cases(),
    *_unsupported_cases(),
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
        assert text.startswith(f"queue.xml:{problem.line}: ") and " Fix: " in text
        for jargon in ("facet", "xs:", "atomic type", "{urn"):
            assert jargon not in text, text


def test_every_problem_of_several_queues_is_reported_at_once() -> None:
    text = doc(
        *named("quotes"),  # 10-13: not journaled (11)
        *named("jobs", "json", "<MaxBacklog>0</MaxBacklog>"),  # 14-18: MaxBacklog (17)
        *named("blobs", "binary", tag="GroupLocalQueue"),  # 19-22: no InitialOwner (19)
    )
    with pytest.raises(ConfigError) as info:
        load(text)
    assert [p.line for p in info.value.problems] == [11, 17, 19]
