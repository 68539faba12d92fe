"""Replication validation on connect: each check refuses a mismatched pair with the
check, the topic and the fix in the detecting instance's log (the other side logs that
the peer refused validation), and the same pair connects once the check is excluded."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster import Cluster, destination_xml, replication_xml
from harness import REPO, wait_until

from amps_py.config import InstanceConfig, parse_config
from amps_py.config.model import ReplicationTopic
from amps_py.replication.fabric import load_fabric
from amps_py.replication.link import PROTOCOL_VERSION, RemoteProtocolError, parse_hello
from amps_py.replication.routing import Route
from amps_py.replication.validation import (
    ALL_CHECKS,
    QueueFacts,
    SowFacts,
    TopicDescriptor,
    ValidationFailure,
    covers,
    queue_facts,
    sow_facts,
    validate,
)


@dataclass
class Case:
    check: str
    #: xml_body_fn arguments for the upstream A and the downstream B
    a_topics: tuple[str, ...]
    a_filter: str | None
    b_back: bool
    b_back_filter: str | None
    b_journal: tuple[str, ...]
    b_onward_exclude: tuple[str, ...]
    a_pre_exclude: tuple[str, ...] = ()
    #: the Key paths of A's / B's SOW topic "orders" (json); None: not a SOW topic there
    a_sow_keys: tuple[str, ...] | None = None
    b_sow_keys: tuple[str, ...] | None = None
    #: what B's log must also say (both sides' settings)
    detail: str = ""


CASES = [
    # B does not journal "orders" (only "audit.*"), so it cannot replicate it back either
    Case("txlog", ("orders",), None, False, None, ("audit.*",), (), ("replicate",)),
    # B has no destination back to A
    Case("replicate", ("orders",), None, False, None, (".*",), ()),
    # A filters, B replicates back unfiltered
    Case("replicate_filter", ("orders",), "/qty > 1", True, None, (".*",), ()),
    # B replicates onward to C without the txlog check that A enforces
    Case("cascade", ("orders",), None, True, None, (".*",), ("txlog",)),
    # orders is a SOW topic on A but not on B
    Case(
        "sow",
        ("orders",),
        None,
        True,
        None,
        (".*",),
        (),
        a_sow_keys=("/id",),
        detail="orders is a SOW topic on A (MessageType json, Key /id) but not on B",
    ),
    # orders is a SOW topic on both, keyed differently
    Case(
        "keys",
        ("orders",),
        None,
        True,
        None,
        (".*",),
        (),
        a_sow_keys=("/id",),
        b_sow_keys=("/region", "/id"),
        detail="SOW topic orders is keyed by /id on A but by /region, /id on B",
    ),
]


def _sow(keys: tuple[str, ...] | None) -> str:
    """A SOW section making "orders" (json) a SOW topic keyed by ``keys``; "" for None."""
    if keys is None:
        return ""
    key_xml = "".join(f"<Key>{k}</Key>" for k in keys)
    return f"<SOW><Topic><Name>orders</Name><MessageType>json</MessageType>{key_xml}</Topic></SOW>"


def _topic(name: str, filt: str | None, exclude: tuple[str, ...]) -> str:
    f = f"<Filter>{filt}</Filter>" if filt else ""
    x = f"<ExcludeValidation>{','.join(exclude)}</ExcludeValidation>" if exclude else ""
    return f"<Topic><Name>{name}</Name><MessageType>json</MessageType>{f}{x}</Topic>"


def _dest(name: str, group: str, addr: str, topics: str) -> str:
    return (
        f"<Destination><Name>{name}</Name><Group>{group}</Group><SyncType>async</SyncType>"
        f"{topics}<Transport><Type>amps-replication</Type><InetAddr>{addr}</InetAddr>"
        "</Transport></Destination>"
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.check)
async def test_check_refuses_then_exclusion_connects(cluster: Cluster, case: Case) -> None:
    excluded: list[str] = list(case.a_pre_exclude)

    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        exclude = tuple(excluded)
        topics = "".join(_topic(t, case.a_filter, exclude) for t in case.a_topics)
        return replication_xml(_dest("B", "gb", view.addr("B"), topics)) + _sow(case.a_sow_keys)

    def b_body(view) -> str:  # type: ignore[no-untyped-def]
        dests = []
        if case.b_back:
            dests.append(_dest("A", "ga", view.addr("A"), _topic("orders", case.b_back_filter, ())))
        if case.b_onward_exclude:
            dests.append(
                destination_xml("C", "gc", False, view.addr("C"), exclude=case.b_onward_exclude)
            )
        return (replication_xml(*dests) if dests else "") + _sow(case.b_sow_keys)

    cluster.add_instance("A", "ga", a_body)
    cluster.add_instance("B", "gb", b_body, journal_topics=case.b_journal)
    cluster.add_instance("C", "gc", lambda view: "")
    cluster.start_all()

    def refused() -> str | None:
        b_log, a_log = cluster.log("B"), cluster.log("A")
        if f"check {case.check} failed for topic orders" in b_log and (
            "the peer refused validation" in a_log
        ):
            return None
        return f"no {case.check} refusal logged yet"

    await wait_until(refused, 60)
    assert "Fix:" in cluster.log("B")
    assert case.detail in cluster.log("B")
    assert not cluster.server("A").destination("B")["is_connected"]

    excluded.append(case.check)
    cluster.restart("A")

    def connected() -> str | None:
        d = cluster.server("A").destination("B")
        return None if d["is_connected"] else f"A->B not connected: {d['last_error']}"

    await wait_until(connected, 60)


def _config(body: str, journal: str = ".*") -> str:
    return f"""<AMPSConfig><Name>B</Name><Group>gb</Group>
<Transports><Transport><Name>r</Name><Type>amps-replication</Type><InetAddr>127.0.0.1:19999</InetAddr></Transport></Transports>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory><Topic><Name>{journal}</Name><MessageType>json</MessageType></Topic></TransactionLog>
{body}</AMPSConfig>"""


def test_sow_keys_and_queue_checks_pass_while_neither_side_declares_them() -> None:
    back = (
        "<Replication><Destination><Name>A</Name><Group>ga</Group><SyncType>async</SyncType>"
        "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>"
        "<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:19998</InetAddr></Transport>"
        "</Destination></Replication>"
    )
    local = parse_config(_config(back))
    topic = TopicDescriptor("orders", "json", None, frozenset())
    assert validate([topic], local, "A", "ga") == []
    assert set(ALL_CHECKS) >= {"sow", "keys", "queue", "queue_passthrough", "queue_underlying"}


def test_topic_coverage_rules() -> None:
    assert covers(None, "orders") and covers(".*", None)
    assert covers("orders", "orders") and covers("ord.*", "orders")
    assert not covers("orders", "ord.*")  # a literal cannot cover a pattern
    assert not covers("audit.*", "orders")


# --------------------------------------------------------------- sow and keys (pure)

#: B's destination back to A (group ga) for orders, so that ``replicate`` passes
_BACK = (
    "<Replication><Destination><Name>A</Name><Group>ga</Group><SyncType>async</SyncType>"
    "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>"
    "<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:19998</InetAddr></Transport>"
    "</Destination></Replication>"
)


def _sow_config(sow: str, name: str = "B") -> InstanceConfig:
    """Instance ``name`` journaling every json and binary topic, replicating orders back
    to A, with the SOW topics ``sow`` (SOW/Topic elements)."""
    return parse_config(
        f"""<AMPSConfig><Name>{name}</Name><Group>g{name.lower()}</Group>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory>
<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
<Topic><Name>.*</Name><MessageType>binary</MessageType></Topic></TransactionLog>
{_BACK}<SOW>{sow}</SOW></AMPSConfig>"""
    )


def _sow_topic(name: str, keys: tuple[str, ...] = ("/id",), message_type: str = "json") -> str:
    key_xml = "".join(f"<Key>{k}</Key>" for k in keys)
    return f"<Topic><Name>{name}</Name><MessageType>{message_type}</MessageType>{key_xml}</Topic>"


def _hello_topic(
    name: str | None = "orders",
    sow: tuple[SowFacts, ...] = (),
    excluded: frozenset[str] = frozenset(),
) -> TopicDescriptor:
    """An upstream entry for ``name`` (json) as it arrives in a hello."""
    raw = TopicDescriptor(name, "json", None, excluded, sow)
    wire = {
        "name": raw.name,
        "message_type": raw.message_type,
        "filter": None,
        "exclude_validation": sorted(excluded),
        "sow_topics": [s.to_wire() for s in sow],
    }
    assert TopicDescriptor.from_wire(wire) == raw
    return raw


ORDERS_BY_ID = SowFacts("orders", "json", ("/id",))


def _checks(failures: list[ValidationFailure]) -> list[tuple[str, str]]:
    return [(f.check, f.topic) for f in failures]


def test_a_matching_sow_topic_passes() -> None:
    local = _sow_config(_sow_topic("orders", ("/id",)) + _sow_topic("extra"))
    # a SOW topic only the downstream has (extra) is fine
    assert validate([_hello_topic(sow=(ORDERS_BY_ID,))], local, "A", "ga") == []


def test_sow_check_refuses_a_downstream_without_the_sow_topic() -> None:
    local = _sow_config("")
    (failure,) = validate([_hello_topic(sow=(ORDERS_BY_ID,))], local, "A", "ga")
    assert (failure.check, failure.topic) == ("sow", "orders (json)")
    assert failure.problem == "orders is a SOW topic on A (MessageType json, Key /id) but not on B"
    assert failure.fix.startswith(
        "add <SOW><Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key>"
        "</Topic></SOW> to B's config, or ExcludeValidation sow on A's Destination Topic "
        "orders (json)"
    )
    assert str(failure).startswith("check sow failed for topic orders (json): ")


def test_sow_check_refuses_another_message_type() -> None:
    local = _sow_config(_sow_topic("orders", (), "binary"))
    upstream = SowFacts("orders", "json", ())
    (failure,) = validate([_hello_topic(sow=(upstream,))], local, "A", "ga")
    assert failure.check == "sow"
    assert failure.problem == "SOW topic orders has MessageType json on A but binary on B"
    assert "<MessageType>json</MessageType> in B's SOW Topic" in failure.fix


@pytest.mark.parametrize(
    ("upstream", "downstream", "shown"),
    [
        (("/id",), ("/order_id",), "keyed by /id on A but by /order_id on B"),
        (("/a", "/b"), ("/b", "/a"), "keyed by /a, /b on A but by /b, /a on B"),  # order counts
        (("/id",), (), "keyed by /id on A but by no Key (explicit keys) on B"),
        ((), ("/id",), "keyed by no Key (explicit keys) on A but by /id on B"),
    ],
)
def test_keys_check_refuses_other_key_paths(
    upstream: tuple[str, ...], downstream: tuple[str, ...], shown: str
) -> None:
    local = _sow_config(_sow_topic("orders", downstream))
    sow = SowFacts("orders", "json", upstream)
    (failure,) = validate([_hello_topic(sow=(sow,))], local, "A", "ga")
    assert (failure.check, failure.topic) == ("keys", "orders (json)")
    assert failure.problem == f"SOW topic orders is {shown}"
    assert "the same Key elements in the same order on both instances" in failure.fix
    assert "ExcludeValidation keys on A's Destination Topic orders (json)" in failure.fix


def test_keys_are_compared_only_when_both_sides_have_the_sow_topic() -> None:
    """Without a downstream SOW topic the ``sow`` check reports it; ``keys`` has
    nothing to compare (also when ``sow`` is excluded)."""
    local = _sow_config("")
    topic = _hello_topic(sow=(ORDERS_BY_ID,))
    assert _checks(validate([topic], local, "A", "ga")) == [("sow", "orders (json)")]
    relaxed = _hello_topic(sow=(ORDERS_BY_ID,), excluded=frozenset({"sow"}))
    assert validate([relaxed], local, "A", "ga") == []


@pytest.mark.parametrize("check", ["sow", "keys"])
def test_exclude_validation_skips_the_sow_checks(check: str) -> None:
    mismatched = {"sow": _sow_config(""), "keys": _sow_config(_sow_topic("orders", ("/x",)))}
    local = mismatched[check]
    topic = _hello_topic(sow=(ORDERS_BY_ID,))
    assert _checks(validate([topic], local, "A", "ga")) == [(check, "orders (json)")]
    excluded = _hello_topic(sow=(ORDERS_BY_ID,), excluded=frozenset({check}))
    assert validate([excluded], local, "A", "ga") == []


def test_every_sow_topic_a_pattern_entry_covers_is_checked() -> None:
    local = _sow_config(_sow_topic("orders") + _sow_topic("quotes", ("/sym",)))
    upstream = (
        ORDERS_BY_ID,
        SowFacts("quotes", "json", ("/symbol",)),
        SowFacts("trades", "json", ("/id",)),
    )
    entry = _hello_topic(".*", sow=upstream, excluded=frozenset({"replicate"}))
    failures = validate([entry], local, "A", "ga")
    assert _checks(failures) == [("keys", "quotes (json)"), ("sow", "trades (json)")]


def test_a_hello_without_sow_facts_describes_no_sow_topic() -> None:
    """An older amps-py sends no ``sow_topics``: sow and keys have nothing to check."""
    local = _sow_config(_sow_topic("orders"))
    old = {"name": "orders", "message_type": "json", "filter": None, "exclude_validation": []}
    topic = TopicDescriptor.from_wire(old)
    assert topic.sow_topics == ()
    assert validate([topic], local, "A", "ga") == []


def test_the_hello_describes_the_sow_topics_each_entry_covers() -> None:
    upstream = parse_config(
        """<AMPSConfig><Name>A</Name><Group>ga</Group>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory>
<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
<Topic><Name>.*</Name><MessageType>binary</MessageType></Topic></TransactionLog>
<Replication><Destination><Name>B</Name><SyncType>async</SyncType>
<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>
<Topic><Name>q.*</Name><MessageType>json</MessageType></Topic>
<Topic><Name>audit</Name><MessageType>json</MessageType></Topic>
<Topic><MessageType>binary</MessageType></Topic>
<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:19997</InetAddr></Transport>
</Destination></Replication>
<SOW><Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key><Key>/venue</Key>
</Topic></SOW></AMPSConfig>"""
    )
    described = Route(upstream.replication[0]).describe_topics(upstream.sow_topics)
    assert [d.get("sow_topics") for d in described] == [
        [{"name": "orders", "message_type": "json", "keys": ["/id"]}],
        [{"name": "quotes", "message_type": "json", "keys": ["/sym", "/venue"]}],
        None,  # covers no SOW topic: the key is left out, as an older amps-py sends it
        None,  # binary: the json SOW topics are not covered
    ]
    # what the downstream reads back from the hello
    hello = parse_hello({"version": PROTOCOL_VERSION, "name": "A", "topics": described})
    descriptors = [TopicDescriptor.from_wire(t) for t in hello.topics]
    assert descriptors[1].sow_topics == (SowFacts("quotes", "json", ("/sym", "/venue")),)


@pytest.mark.parametrize(
    ("sow_topics", "field"),
    [
        ("orders", "topics[0].sow_topics"),
        (["orders"], "topics[0].sow_topics[0]"),
        ([{"message_type": "json"}], "topics[0].sow_topics[0].name"),
        ([{"name": "orders", "message_type": 5}], "topics[0].sow_topics[0].message_type"),
        ([{"name": "orders", "keys": "/id"}], "topics[0].sow_topics[0].keys"),
        ([{"name": "orders", "keys": [1]}], "topics[0].sow_topics[0].keys"),
    ],
)
def test_a_malformed_sow_description_is_refused(sow_topics: object, field: str) -> None:
    topic = {"name": "orders", "message_type": "json", "sow_topics": sow_topics}
    with pytest.raises(RemoteProtocolError) as info:
        parse_hello({"version": PROTOCOL_VERSION, "name": "A", "topics": [topic]})
    assert info.value.reason == "malformed hello" and field in info.value.detail


def test_config_check_of_a_pair_reports_a_sow_mismatch(tmp_path: Path) -> None:
    """``amps-py config check`` over both configs of a pair (the fabric check) reports
    what the downstream would refuse at connect: here amps-b has no SOW topic orders."""
    example = REPO / "config" / "examples" / "hot-hot"
    for path in example.iterdir():
        shutil.copy(path, tmp_path / path.name)
    a = tmp_path / "amps-a.xml"
    sow = _sow(("/id",))
    a.write_text(a.read_text().replace("</AMPSConfig>", f"  {sow}\n</AMPSConfig>"))
    findings = load_fabric([tmp_path]).findings()
    (finding,) = [f for f in findings if "check sow fails" in f.message]
    assert finding.level == "error"
    assert "amps-b would refuse the link: check sow fails: orders is a SOW topic on amps-a" in (
        finding.message
    )
    assert "<SOW><Topic><Name>orders</Name>" in finding.fix


# ------------------------------------------------- queue, queue_underlying, queue_passthrough


def _queue_el(
    extra: str = "", name: str = "work", kind: str = "Queue", message_type: str = "json"
) -> str:
    return f"<{kind}><Name>{name}</Name><MessageType>{message_type}</MessageType>{extra}</{kind}>"


def _queue_config(
    queues: str,
    *,
    name: str = "B",
    group: str = "gb",
    journal: str = ".*",
    topics: str = "<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",
    passthrough: str | None = "^ga$",
    destinations: bool = True,
    back_group: str = "ga",
) -> InstanceConfig:
    """Instance ``name`` journaling ``journal`` (json), with the queues ``queues`` (SOW
    queue elements) and, with ``destinations``, a Destination back to A (group
    ``back_group``) replicating ``topics`` with PassThrough ``passthrough``."""
    pt = "" if passthrough is None else f"<PassThrough>{passthrough}</PassThrough>"
    replication = (
        f"<Replication><Destination><Name>A</Name><Group>{back_group}</Group>"
        f"<SyncType>async</SyncType>{topics}{pt}<Transport><Type>amps-replication</Type>"
        "<InetAddr>127.0.0.1:19998</InetAddr></Transport></Destination></Replication>"
        if destinations
        else ""
    )
    sow = f"<SOW>{queues}</SOW>" if queues else ""
    return parse_config(
        f"""<AMPSConfig><Name>{name}</Name><Group>{group}</Group>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory>
<Topic><Name>{journal}</Name><MessageType>json</MessageType></Topic></TransactionLog>
{replication}{sow}</AMPSConfig>"""
    )


def _facts(queue_el: str) -> QueueFacts:
    """The facts an upstream sends of the queue ``queue_el`` (through the wire form)."""
    (queue,) = _queue_config(queue_el).queues
    facts = QueueFacts.from_config(queue)
    assert QueueFacts.from_wire(facts.to_wire()) == facts
    return facts


def _queue_entry(
    facts: QueueFacts, name: str | None = ".*", excluded: frozenset[str] = frozenset()
) -> TopicDescriptor:
    """An upstream entry for ``name`` (json) covering the queue ``facts``."""
    return TopicDescriptor(name, "json", None, excluded, queues=(facts,))


WORK = _facts(_queue_el())


def test_an_identically_defined_queue_passes() -> None:
    settings = (
        "<UnderlyingTopic>jobs</UnderlyingTopic><Semantics>at-most-once</Semantics>"
        "<Filter>/prio &gt; 1</Filter><Priority>/prio</Priority><Expiration>30s</Expiration>"
        # settings that only shape each instance's own deliveries may differ
    )
    upstream = _facts(_queue_el(settings + "<LeasePeriod>10s</LeasePeriod>"))
    local = _queue_config(
        _queue_el(settings + "<MaxPerSubscriptionBacklog>8</MaxPerSubscriptionBacklog>")
    )
    assert validate([_queue_entry(upstream)], local, "A", "ga") == []


def test_queue_check_refuses_a_downstream_without_the_queue() -> None:
    local = _queue_config("")
    (failure,) = validate([_queue_entry(WORK)], local, "A", "ga")
    assert (failure.check, failure.topic) == ("queue", "work (json)")
    assert failure.problem == (
        "work is a queue on A (a <Queue>, MessageType json, UnderlyingTopic work) but not on B"
    )
    assert failure.fix.startswith(
        "add <SOW><Queue><Name>work</Name><MessageType>json</MessageType>"
        "<Semantics>at-least-once</Semantics></Queue></SOW> to B's config"
    )
    assert "the queue check cannot be excluded" in failure.fix
    assert str(failure).startswith("check queue failed for topic work (json): ")


@pytest.mark.parametrize(
    ("upstream", "downstream", "shown", "change"),
    [
        (
            "<Semantics>at-least-once</Semantics>",
            "<Semantics>at-most-once</Semantics>",
            "Semantics at-least-once on A but Semantics at-most-once on B",
            "set <Semantics>at-least-once</Semantics>",
        ),
        (
            "<Priority>/prio</Priority>",
            "",
            "Priority /prio on A but no Priority on B",
            "set <Priority>/prio</Priority>",
        ),
        (
            "",
            "<BarrierExpression>/barrier = 1</BarrierExpression>",
            "no BarrierExpression on A but BarrierExpression /barrier = 1 on B",
            "remove <BarrierExpression>",
        ),
        (
            "<Expiration>30s</Expiration>",
            "<Expiration>1m</Expiration>",
            "Expiration 30s on A but Expiration 60s on B",
            "set <Expiration>30s</Expiration>",
        ),
        (
            "<UnderlyingTopic>jobs.*</UnderlyingTopic>"
            "<DefaultPublishTarget>jobs.a</DefaultPublishTarget>",
            "<UnderlyingTopic>jobs.*</UnderlyingTopic>"
            "<DefaultPublishTarget>jobs.b</DefaultPublishTarget>",
            "DefaultPublishTarget jobs.a on A but DefaultPublishTarget jobs.b on B",
            "set <DefaultPublishTarget>jobs.a</DefaultPublishTarget>",
        ),
    ],
)
def test_queue_check_names_each_setting_that_differs(
    upstream: str, downstream: str, shown: str, change: str
) -> None:
    local = _queue_config(_queue_el(downstream))
    (failure,) = validate([_queue_entry(_facts(_queue_el(upstream)))], local, "A", "ga")
    assert (failure.check, failure.topic) == ("queue", "work (json)")
    assert failure.problem == f"queue work is defined differently: {shown}"
    assert failure.fix == (
        f"define queue work the same way on both instances: in B's SOW queue work, {change} "
        "(the queue check cannot be excluded)"
    )


def test_queue_check_names_every_difference_of_the_queue_kind() -> None:
    upstream = _facts(_queue_el("<InitialOwner>A</InitialOwner>", kind="GroupLocalQueue"))
    (failure,) = validate([_queue_entry(upstream)], _queue_config(_queue_el()), "A", "ga")
    assert failure.problem == (
        "queue work is defined differently: a <GroupLocalQueue> on A but a <Queue> on B; "
        "InitialOwner A on A but no InitialOwner on B"
    )
    assert "define it as a <GroupLocalQueue>; set <InitialOwner>A</InitialOwner>" in failure.fix


@pytest.mark.parametrize(
    ("upstream", "downstream", "shown"),
    [
        (
            "<UnderlyingTopic>jobs</UnderlyingTopic>",
            "",
            "UnderlyingTopic jobs on A but UnderlyingTopic work on B",
        ),
        ("<Filter>/n &gt; 1</Filter>", "", "Filter /n > 1 on A but no Filter on B"),
    ],
)
def test_queue_underlying_check_refuses_another_underlying_topic_or_filter(
    upstream: str, downstream: str, shown: str
) -> None:
    local = _queue_config(_queue_el(downstream))
    (failure,) = validate([_queue_entry(_facts(_queue_el(upstream)))], local, "A", "ga")
    assert (failure.check, failure.topic) == ("queue_underlying", "work (json)")
    assert failure.problem == f"queue work takes other messages: {shown}"
    assert "the same UnderlyingTopic and Filter on both instances" in failure.fix
    assert "the queue_underlying check cannot be excluded" in failure.fix


def test_queue_underlying_check_refuses_when_the_underlying_topic_is_not_replicated() -> None:
    """The upstream's entries cover the queue's name but not its underlying topic."""
    queue = _queue_el("<UnderlyingTopic>jobs</UnderlyingTopic>")
    upstream = _facts(queue)
    (failure,) = validate([_queue_entry(upstream, "work")], _queue_config(queue), "A", "ga")
    assert (failure.check, failure.topic) == ("queue_underlying", "work (json)")
    assert failure.problem == (
        "A replicates queue work to B but not its underlying topic jobs (json)"
    )
    assert failure.fix.startswith(
        "add <Topic><Name>jobs</Name><MessageType>json</MessageType></Topic> to A's "
        "Destination to B"
    )
    # a second entry of the hello covering the underlying topic is enough
    jobs = TopicDescriptor("jobs", "json", None, frozenset())
    assert validate([_queue_entry(upstream, "work"), jobs], _queue_config(queue), "A", "ga") == []


def test_queue_underlying_check_refuses_a_downstream_that_does_not_journal_it() -> None:
    local = _queue_config("", journal="audit.*")
    entry = _queue_entry(WORK, excluded=frozenset({"txlog"}))  # only the queue's checks
    failures = validate([entry], local, "A", "ga")
    assert _checks(failures)[:1] == [("queue", "work (json)")]
    journal = [f for f in failures if f.check == "queue_underlying"]
    assert [f.problem for f in journal] == [
        "B does not record work (json), the underlying topic of queue work, in its transaction log"
    ]
    assert journal[0].fix.startswith(
        "add <Topic><Name>work</Name><MessageType>json</MessageType></Topic> to B's TransactionLog"
    )


def test_queue_passthrough_check_refuses_a_destination_without_passthrough() -> None:
    local = _queue_config(_queue_el(), passthrough=None)
    (failure,) = validate([_queue_entry(WORK)], local, "A", "ga")
    assert (failure.check, failure.topic) == ("queue_passthrough", "work (json)")
    assert failure.problem == (
        "B replicates queue work to A but does not pass through messages from A's group ga "
        "(PassThrough none)"
    )
    assert failure.fix.startswith("add <PassThrough>^ga$</PassThrough> to B's Destination A")
    assert "ExcludeValidation queue_passthrough on A's Destination Topic .* (json)" in (failure.fix)
    other = _queue_config(_queue_el(), passthrough="^gc$")
    (failure,) = validate([_queue_entry(WORK)], other, "A", "ga")
    assert "(PassThrough ^gc$)" in failure.problem


def test_queue_passthrough_check_passes_without_a_destination_of_the_queue() -> None:
    """No destinations, or destinations that do not replicate the queue's name, pass;
    an excluded queue_passthrough check passes too."""
    one_way = _queue_entry(WORK, excluded=frozenset({"replicate"}))  # no way back to A
    alone = _queue_config(_queue_el(), destinations=False)
    assert validate([one_way], alone, "A", "ga") == []
    orders = "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>"
    unrelated = _queue_config(_queue_el(), topics=orders, passthrough=None)
    assert validate([one_way], unrelated, "A", "ga") == []
    local = _queue_config(_queue_el(), passthrough=None)
    relaxed = _queue_entry(WORK, excluded=frozenset({"queue_passthrough"}))
    assert validate([relaxed], local, "A", "ga") == []


def test_passthrough_for_the_own_group_is_required() -> None:
    """A hot-hot pair in one group: B's destination back to A must pass through group
    hot (AMPS requires passthrough for every group that replicates a queue)."""
    entry = _queue_entry(WORK)
    without = _queue_config(_queue_el(), group="hot", passthrough=None, back_group="hot")
    assert _checks(validate([entry], without, "A", "hot")) == [("queue_passthrough", "work (json)")]
    with_own = _queue_config(_queue_el(), group="hot", passthrough="^hot$", back_group="hot")
    assert validate([entry], with_own, "A", "hot") == []


@pytest.mark.parametrize("check", ["queue", "queue_underlying"])
def test_an_exclusion_of_a_mandatory_queue_check_in_a_hello_is_ignored(check: str) -> None:
    """The config loader refuses ExcludeValidation queue / queue_underlying; a hello
    that carries one anyway still gets the check."""
    local = _queue_config(
        _queue_el("<UnderlyingTopic>jobs</UnderlyingTopic><Semantics>at-most-once</Semantics>")
    )
    failures = validate([_queue_entry(WORK, excluded=frozenset({check}))], local, "A", "ga")
    assert _checks(failures) == [("queue", "work (json)"), ("queue_underlying", "work (json)")]


def test_a_queue_covered_by_several_entries_is_reported_once() -> None:
    local = _queue_config("")
    entries = [_queue_entry(WORK, "work"), _queue_entry(WORK, ".*")]
    assert _checks(validate(entries, local, "A", "ga")) == [("queue", "work (json)")]


def test_a_local_queue_is_never_described_or_checked() -> None:
    local_queue = _queue_config(_queue_el(name="mine", kind="LocalQueue"), destinations=False)
    every = ReplicationTopic(".*", "json")
    assert queue_facts(every, local_queue.queues) == []
    facts = QueueFacts.from_config(local_queue.queues[0])
    assert validate([_queue_entry(facts)], _queue_config(""), "A", "ga") == []


def test_a_hello_without_queue_facts_describes_no_queue() -> None:
    """An older amps-py sends no ``queues``: the queue checks have nothing to check."""
    old = {"name": ".*", "message_type": "json", "filter": None, "exclude_validation": []}
    topic = TopicDescriptor.from_wire(old)
    assert topic.queues == ()
    assert validate([topic], _queue_config(_queue_el(), passthrough=None), "A", "ga") == []


def test_the_hello_describes_the_queues_each_entry_covers() -> None:
    upstream = parse_config(
        """<AMPSConfig><Name>A</Name><Group>ga</Group>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory>
<Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
<Replication><Destination><Name>B</Name><SyncType>async</SyncType>
<Topic><Name>work</Name><MessageType>json</MessageType></Topic>
<Topic><Name>jobs</Name><MessageType>json</MessageType></Topic>
<Topic><Name>orders</Name><MessageType>json</MessageType></Topic>
<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:19997</InetAddr></Transport>
</Destination></Replication>
<SOW><Queue><Name>work</Name><MessageType>json</MessageType><Semantics>at-most-once</Semantics>
<Expiration>30s</Expiration></Queue>
<GroupLocalQueue><Name>batch</Name><MessageType>json</MessageType><UnderlyingTopic>jobs</UnderlyingTopic>
<InitialOwner>A</InitialOwner></GroupLocalQueue>
<LocalQueue><Name>scratch</Name><MessageType>json</MessageType></LocalQueue></SOW></AMPSConfig>"""
    )
    work, batch, _ = upstream.queues
    described = Route(upstream.replication[0]).describe_topics(upstream.sow_topics, upstream.queues)
    assert [[q["name"] for q in d.get("queues", ())] for d in described] == [
        ["work"],  # by its name
        ["batch"],  # by its underlying topic only: archived, not replicated
        [],  # covers no queue: the key is left out
    ]
    assert [q["archived"] for d in described[:2] for q in d["queues"]] == [False, True]
    # batch's acknowledgement and ownership records go with its underlying topic
    assert upstream.replication[0].archived_queues == (("batch", "json"),)
    assert "queues" not in described[2]
    assert described[0]["queues"][0]["semantics"] == "at-most-once"
    assert described[0]["queues"][0]["expiration"] == 30.0
    # what the downstream reads back from the hello
    hello = parse_hello({"version": PROTOCOL_VERSION, "name": "A", "topics": described})
    descriptors = [TopicDescriptor.from_wire(t) for t in hello.topics]
    assert descriptors[0].queues == (QueueFacts.from_config(work),)
    assert descriptors[1].queues == (QueueFacts.from_config(batch, archived=True),)
    assert descriptors[1].queues[0].initial_owner == "A"


@pytest.mark.parametrize(
    ("queues", "field"),
    [
        ("work", "topics[0].queues"),
        (["work"], "topics[0].queues[0]"),
        ([{"kind": "distributed"}], "topics[0].queues[0].name"),
        ([{"name": "work", "kind": 1}], "topics[0].queues[0].kind"),
        ([{"name": "work", "message_type": ""}], "topics[0].queues[0].message_type"),
        ([{"name": "work", "semantics": None}], "topics[0].queues[0].semantics"),
        ([{"name": "work", "underlying_topic": 5}], "topics[0].queues[0].underlying_topic"),
        (
            [{"name": "work", "underlying_is_regex": "yes"}],
            "topics[0].queues[0].underlying_is_regex",
        ),
        ([{"name": "work", "filter": 3}], "topics[0].queues[0].filter"),
        ([{"name": "work", "priority": ["/p"]}], "topics[0].queues[0].priority"),
        ([{"name": "work", "initial_owner": {}}], "topics[0].queues[0].initial_owner"),
        ([{"name": "work", "expiration": "30s"}], "topics[0].queues[0].expiration"),
        ([{"name": "work", "expiration": 0}], "topics[0].queues[0].expiration"),
        ([{"name": "work", "expiration": True}], "topics[0].queues[0].expiration"),
    ],
)
def test_a_malformed_queue_description_is_refused(queues: object, field: str) -> None:
    topic = {"name": ".*", "message_type": "json", "queues": queues}
    with pytest.raises(RemoteProtocolError) as info:
        parse_hello({"version": PROTOCOL_VERSION, "name": "A", "topics": [topic]})
    assert info.value.reason == "malformed hello" and field in info.value.detail


def test_a_minimal_queue_description_takes_the_queue_defaults() -> None:
    topic = {"name": ".*", "message_type": "json", "queues": [{"name": "work"}]}
    hello = parse_hello({"version": PROTOCOL_VERSION, "name": "A", "topics": [topic]})
    (facts,) = TopicDescriptor.from_wire(hello.topics[0]).queues
    assert facts == WORK


async def test_a_pair_with_other_queue_semantics_is_refused_until_they_agree(
    cluster: Cluster,
) -> None:
    """Two instances replicating a queue to each other: with Semantics at-least-once on
    A and at-most-once on B each refuses the other's link, naming the setting on both
    sides; once B's queue is defined as A's, both links connect."""
    semantics = {"A": "at-least-once", "B": "at-most-once"}

    def body(me: str, peer: str):  # type: ignore[no-untyped-def]
        def make(view) -> str:  # type: ignore[no-untyped-def]
            dest = destination_xml(
                peer, f"g{peer.lower()}", False, view.addr(peer), passthrough=("^g[ab]$",)
            )
            queue = _queue_el(f"<Semantics>{semantics[me]}</Semantics>")
            return replication_xml(dest) + f"<SOW>{queue}</SOW>"

        return make

    cluster.add_instance("A", "ga", body("A", "B"))
    cluster.add_instance("B", "gb", body("B", "A"))
    cluster.start_all()

    def refused() -> str | None:
        b_log, a_log = cluster.log("B"), cluster.log("A")
        wanted = {
            "B": "Semantics at-least-once on A but Semantics at-most-once on B",
            "A": "Semantics at-most-once on B but Semantics at-least-once on A",
        }
        for side, log in (("B", b_log), ("A", a_log)):
            if "check queue failed for topic work (json)" not in log or wanted[side] not in log:
                return f"{side} has not logged the queue refusal yet"
        if "the peer refused validation" not in a_log + b_log:
            return "the refused side has not logged the refusal"
        return None

    await wait_until(refused, 60)
    assert "define queue work the same way on both instances" in cluster.log("B")
    assert not cluster.server("A").destination("B")["is_connected"]
    assert not cluster.server("B").destination("A")["is_connected"]

    semantics["B"] = "at-least-once"
    cluster.restart("B")

    def connected() -> str | None:
        for side, peer in (("A", "B"), ("B", "A")):
            d = cluster.server(side).destination(peer)
            if not d["is_connected"]:
                return f"{side}->{peer} not connected: {d['last_error']}"
        return None

    await wait_until(connected, 30)


def test_config_check_of_a_pair_reports_a_queue_mismatch(tmp_path: Path) -> None:
    """``amps-py config check`` over both configs of a pair reports what the downstream
    would refuse at connect: amps-a has queue work at-most-once, amps-b at-least-once,
    and amps-a's destination to amps-b has no PassThrough for group hot."""
    example = REPO / "config" / "examples" / "hot-hot"
    for path in example.iterdir():
        shutil.copy(path, tmp_path / path.name)
    for name, semantics in (("amps-a", "at-most-once"), ("amps-b", "at-least-once")):
        conf = tmp_path / f"{name}.xml"
        queue = _queue_el(f"<Semantics>{semantics}</Semantics>")
        conf.write_text(
            conf.read_text().replace("</AMPSConfig>", f"<SOW>{queue}</SOW></AMPSConfig>")
        )
    findings = [f for f in load_fabric([tmp_path]).findings() if f.level == "error"]
    messages = [f.message for f in findings]
    assert any(
        "amps-b would refuse the link: check queue fails: queue work is defined differently: "
        "Semantics at-most-once on amps-a but Semantics at-least-once on amps-b" in m
        for m in messages
    ), messages
    assert any(
        "amps-b would refuse the link: check queue_passthrough fails: amps-b replicates queue "
        "work to amps-a but does not pass through messages from amps-a's group hot" in m
        for m in messages
    ), messages


# ------------------------------------------------------- Pattern SOW topics (pure)


def _pattern_topic(name: str, pattern: str, keys: tuple[str, ...] = ("/id",)) -> str:
    key_xml = "".join(f"<Key>{k}</Key>" for k in keys)
    return (
        f"<Topic><Name>{name}</Name><Pattern>{pattern}</Pattern>"
        f"<MessageType>json</MessageType>{key_xml}</Topic>"
    )


ORDERS_PATTERN = SowFacts("all-orders", "json", ("/id",), "^orders/")


def test_a_pattern_sow_topic_is_compared_by_its_pattern_not_its_name() -> None:
    entry = _hello_topic(".*", sow=(ORDERS_PATTERN,), excluded=frozenset({"replicate"}))
    same = _sow_config(_pattern_topic("orders-here", "^orders/"))
    assert validate([entry], same, "A", "ga") == []
    named_alike = _sow_config(_pattern_topic("all-orders", "^fx/"))
    (failure,) = validate([entry], named_alike, "A", "ga")
    assert (failure.check, failure.topic) == ("sow", "Pattern ^orders/ (json)")
    assert "keeps every topic matching ^orders/" in failure.problem
    assert "B has no SOW topic with that Pattern" in failure.problem
    assert "<Pattern>^orders/</Pattern>" in failure.fix and "the Name may differ" in failure.fix
    rekeyed = _sow_config(_pattern_topic("all-orders", "^orders/", ("/region", "/id")))
    (failure,) = validate([entry], rekeyed, "A", "ga")
    assert failure.check == "keys" and "keyed by /id on A but by /region, /id on B" in (
        failure.problem
    )
    relaxed = _hello_topic(".*", sow=(ORDERS_PATTERN,), excluded=frozenset({"replicate", "sow"}))
    assert validate([relaxed], named_alike, "A", "ga") == []


def test_a_literal_upstream_topic_may_be_held_by_a_downstream_pattern() -> None:
    local = _sow_config(_pattern_topic("all-orders", "^orders"))
    assert validate([_hello_topic(sow=(ORDERS_BY_ID,))], local, "A", "ga") == []


def test_the_hello_describes_a_pattern_topic_to_entries_that_reach_it() -> None:
    sow = parse_config(
        """<AMPSConfig><Name>A</Name><Group>ga</Group>
<TransactionLog><JournalDirectory>/tmp/x</JournalDirectory>
<Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW><Topic><Name>all-orders</Name><Pattern>^orders/</Pattern><MessageType>json</MessageType>
<Key>/id</Key></Topic></SOW></AMPSConfig>"""
    ).sow_topics
    described = {
        name: sow_facts(ReplicationTopic(name, "json"), sow)
        for name in (".*", "orders/.*", "ord.*", "orders/eu", "quotes", "quotes.*", "orders/e.*")
    }
    wire = {"name": "all-orders", "message_type": "json", "keys": ["/id"], "pattern": "^orders/"}
    assert described[".*"] == [wire]
    assert described["orders/.*"] == [wire]  # the same expression, whole-topic form
    assert described["ord.*"] == [wire]  # a literal prefix of every topic it holds
    assert described["orders/eu"] == [wire]  # a topic the Pattern holds
    # no topic of it, or an overlap that cannot be proved: not described, never refused
    assert described["quotes"] == described["quotes.*"] == described["orders/e.*"] == []
    assert SowFacts.from_wire(wire) == ORDERS_PATTERN
