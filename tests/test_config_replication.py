"""amps_py.config: replication (Replication/Destination and the amps-replication transport).

Good configurations and the option objects first, then the example topologies under
config/examples (hot-hot and geo-ha, whose routing is traced hop by hop), then a table
of bad configurations in the style of test_config_errors.py: (config, message fragment,
line), each config written one element per line so the line can be read off.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from amps_py.config import (
    DEFAULT_ACK_CONFLATION_INTERVAL,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_RECONNECT_TIMEOUTS,
    NON_EXCLUDABLE_VALIDATION_CHECKS,
    REPLICATION_VALIDATION_CHECKS,
    ConfigError,
    DestinationConfig,
    InstanceConfig,
    ReplicationTopic,
    TransportConfig,
    load_config,
    parse_config,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "config" / "examples"

# ---------------------------------------------------------------- document builders

#: A valid instance up to the first <Destination>; the destination body starts on line 14.
PRELUDE = [
    "<AMPSConfig>",  # 1
    "  <Name>amps-a</Name>",  # 2
    "  <Group>hot</Group>",  # 3
    "  <TransactionLog>",  # 4
    "    <JournalDirectory>./data</JournalDirectory>",  # 5
    "    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",  # 6
    "  </TransactionLog>",  # 7
    "  <Transports>",  # 8
    "    <Transport><Name>json-tcp</Name><Type>tcp</Type>"
    "<InetAddr>127.0.0.1:9107</InetAddr></Transport>",  # 9
    "    <Transport><Name>repl</Name><Type>amps-replication</Type>"
    "<InetAddr>127.0.0.1:9104</InetAddr></Transport>",  # 10
    "  </Transports>",  # 11
    "  <Replication>",  # 12
    "    <Destination>",  # 13
]
DEST_LINE = 13
#: The lines of a good destination body, in order (lines 14-17).
GOOD = {
    "Name": "      <Name>amps-b</Name>",
    "SyncType": "      <SyncType>sync</SyncType>",
    "Topic": "      <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",
    "Transport": "      <Transport><Type>amps-replication</Type>"
    "<InetAddr>127.0.0.1:9204</InetAddr></Transport>",
}
END = ["    </Destination>", "  </Replication>", "</AMPSConfig>"]


def body(*extra: str, **replace: str | None) -> list[str]:
    """The good destination body with ``replace``d lines (None drops one) and ``extra``."""
    lines = [replace.get(key, line) for key, line in GOOD.items()]
    return [line for line in lines if line is not None] + list(extra)


def dest_doc(*extra: str, **replace: str | None) -> str:
    """A config whose one destination is GOOD with changes (body from line 14)."""
    return "\n".join([*PRELUDE, *body(*extra, **replace), *END])


def topic(inner: str) -> str:
    return f"      <Topic>{inner}</Topic>"


def dest_transport(*inner: str) -> str:
    return "      <Transport>" + "".join(inner) + "</Transport>"


def inet(addr: str) -> str:
    return f"<InetAddr>{addr}</InetAddr>"


REPL_TYPE = "<Type>amps-replication</Type>"


def parse(text: str) -> InstanceConfig:
    return parse_config(text, source="repl.xml", environ={})


# ------------------------------------------------------------------ good configurations


def test_good_destination_and_defaults() -> None:
    cfg = parse(dest_doc())
    (dest,) = cfg.replication
    assert dest == DestinationConfig(
        name="amps-b",
        group=None,
        sync_type="sync",
        topics=(ReplicationTopic(".*", "json"),),
        inet_addrs=(("127.0.0.1", 9204),),
    )
    assert dest.sync
    assert dest.passthrough == ()
    assert dest.reconnect_timeouts == DEFAULT_RECONNECT_TIMEOUTS == (1.0, 2.0, 4.0, 8.0)
    assert dest.ack_conflation_interval == DEFAULT_ACK_CONFLATION_INTERVAL == 0.01
    assert dest.compression == "none"
    assert dest.heartbeat_interval == DEFAULT_HEARTBEAT_INTERVAL == 1.0
    assert dest.line == DEST_LINE


def test_all_destination_options_in_any_order() -> None:
    cfg = parse(
        dest_doc(
            "      <HeartbeatInterval>250ms</HeartbeatInterval>",
            "      <PassThrough>^NewYork$</PassThrough>",
            "      <Compression>zstd</Compression>",
            "      <Group>hot</Group>",
            "      <AckConflationInterval>0</AckConflationInterval>",
            "      <PassThrough>.*-DR</PassThrough>",
            topic(
                "<ExcludeValidation>replicate, cascade,replicate</ExcludeValidation>"
                "<Filter>/region = 'EU' AND /qty &gt; 10</Filter>"
                "<MessageType>binary</MessageType>"
            ),
            Transport=dest_transport(
                "<ReconnectTimeout>500ms, 2s</ReconnectTimeout>",
                inet("127.0.0.1:9204"),
                REPL_TYPE,
                inet("10.1.2.3:9304"),
                inet("[::1]:9404"),
                inet("9504"),
            ),
            SyncType="      <SyncType>async</SyncType>",
        ).replace(
            "    <JournalDirectory>./data</JournalDirectory>",
            "    <JournalDirectory>./data</JournalDirectory>"
            "<Topic><Name>.*</Name><MessageType>binary</MessageType></Topic>",
        )
    )
    (dest,) = cfg.replication
    assert not dest.sync and dest.sync_type == "async"
    assert dest.group == "hot"
    assert dest.passthrough == ("^NewYork$", ".*-DR")
    assert dest.compression == "zstd"
    assert dest.heartbeat_interval == 0.25
    assert dest.ack_conflation_interval == 0
    assert dest.reconnect_timeouts == (0.5, 2.0)
    assert dest.inet_addrs == (
        ("127.0.0.1", 9204),
        ("10.1.2.3", 9304),
        ("::1", 9404),
        ("127.0.0.1", 9504),  # a bare port is this host
    )
    assert dest.topics == (
        ReplicationTopic(".*", "json"),
        ReplicationTopic(None, "binary", "/region = 'EU' AND /qty > 10", ("replicate", "cascade")),
    )


def test_destination_without_transport_waits_for_the_peer() -> None:
    (dest,) = parse(dest_doc(Transport=None)).replication
    assert dest.inet_addrs == ()
    assert dest.reconnect_timeouts == DEFAULT_RECONNECT_TIMEOUTS


def test_amps_docs_transport_with_a_name_is_accepted() -> None:
    """AMPS's own examples put a Name inside Destination/Transport; it is ignored."""
    transport = dest_transport("<Name>amps-replication</Name>", REPL_TYPE, inet("h:9204"))
    (dest,) = parse(dest_doc(Transport=transport)).replication
    assert dest.inet_addrs == (("h", 9204),)


def test_replication_transport_and_client_transports() -> None:
    cfg = parse(
        dest_doc().replace(
            "<InetAddr>127.0.0.1:9104</InetAddr></Transport>",
            "<InetAddr>127.0.0.1:9104</InetAddr><Protocol>json</Protocol>"
            "<MessageType>binary</MessageType></Transport>",
        )
    )
    assert [t.name for t in cfg.transports] == ["json-tcp", "repl"]
    repl = cfg.replication_transport
    assert repl == TransportConfig(
        "repl", "amps-replication", "127.0.0.1", 9104, "amps-replication", None
    )
    assert [t.name for t in cfg.client_transports] == ["json-tcp"]
    assert cfg.client_transports[0].protocol == "amps"


def test_instance_without_replication() -> None:
    cfg = parse_config("<AMPSConfig><Name>x</Name></AMPSConfig>", environ={})
    assert cfg.replication == ()
    assert cfg.replication_transport is None
    assert cfg.client_transports == ()


def test_receive_only_instance_needs_no_replication_section() -> None:
    cfg = parse_config(
        "<AMPSConfig><Name>dr</Name><Transports><Transport><Name>r</Name>"
        "<Type>amps-replication</Type><InetAddr>10004</InetAddr></Transport></Transports>"
        "<TransactionLog><JournalDirectory>d</JournalDirectory></TransactionLog>"
        "</AMPSConfig>",
        environ={},
    )
    assert cfg.replication == ()
    assert cfg.replication_transport is not None
    assert (cfg.replication_transport.host, cfg.replication_transport.port) == ("0.0.0.0", 10004)


@pytest.mark.parametrize(
    ("name", "topic_name", "message_type", "expected"),
    [
        (None, "anything/at/all", "json", True),
        (None, "anything", "binary", False),
        ("orders", "orders", "json", True),
        ("orders", "orders2", "json", False),
        ("orders.*", "orders/new", "json", True),
        ("orders.*", "old/orders", "json", False),  # anchored at the start
        ("a|b", "ab", "json", False),  # and at the end
        ("a-b_c", "a-b_c", "json", True),  # no metacharacters: literal
    ],
)
def test_replication_topic_matches(
    name: str | None, topic_name: str, message_type: str, expected: bool
) -> None:
    assert ReplicationTopic(name, "json").matches(topic_name, message_type) is expected


def test_destination_helpers() -> None:
    dest = DestinationConfig(
        "d",
        None,
        "async",
        (ReplicationTopic("orders", "json"), ReplicationTopic("px/.*", "binary")),
        passthrough=("^NYC", "^LDN-[0-9]$"),
        reconnect_timeouts=(0.5, 3.0),
    )
    assert not dest.sync
    assert dest.replicates("orders", "json") and dest.replicates("px/IBM", "binary")
    assert not dest.replicates("px/IBM", "json")
    assert dest.passes_through("NYC-2")  # searched, as AMPS's ^NYC example implies
    assert dest.passes_through("LDN-1")
    assert not dest.passes_through("HKG") and not dest.passes_through("LDN-12")
    assert [dest.reconnect_delay(n) for n in range(4)] == [0.5, 3.0, 3.0, 3.0]
    assert not DestinationConfig("e", None, "sync", ()).passes_through("anything")


def test_option_objects_are_frozen_and_hashable() -> None:
    cfg = parse(dest_doc())
    dest = cfg.replication[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        dest.name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        dest.topics[0].name = "x"  # type: ignore[misc]
    assert hash(cfg) == hash(parse(dest_doc()))
    moved = dataclasses.replace(dest, line=99)
    assert moved == dest  # line is for messages only


def test_validation_check_names() -> None:
    assert len(REPLICATION_VALIDATION_CHECKS) == 9
    assert {"queue", "queue_underlying"} == NON_EXCLUDABLE_VALIDATION_CHECKS
    assert set(REPLICATION_VALIDATION_CHECKS) >= NON_EXCLUDABLE_VALIDATION_CHECKS


def test_multiline_filter_error_points_at_the_bad_line() -> None:
    text = dest_doc(
        Topic="      <Topic><MessageType>json</MessageType><Filter>\n"
        "        /a = 1 AND\n"
        "        /b = </Filter></Topic>",
    )
    with pytest.raises(ConfigError) as info:
        parse(text)
    (problem,) = info.value.problems
    assert problem.line == 18, str(info.value)
    assert "is not a valid content filter" in problem.message


# ------------------------------------------------------------------------ hot-hot


@pytest.mark.parametrize(
    ("me", "other", "client", "listen", "target"),
    [("amps-a", "amps-b", 9107, 9104, 9204), ("amps-b", "amps-a", 9207, 9204, 9104)],
)
def test_hot_hot_example(me: str, other: str, client: int, listen: int, target: int) -> None:
    cfg = load_config(EXAMPLES / "hot-hot" / f"{me}.xml", environ={})
    assert (cfg.name, cfg.group) == (me, "hot")
    (clients,) = cfg.client_transports
    assert (clients.host, clients.port, clients.type) == ("127.0.0.1", client, "tcp")
    repl = cfg.replication_transport
    assert repl is not None and (repl.host, repl.port) == ("127.0.0.1", listen)
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == Path("amps-data") / me
    (dest,) = cfg.replication
    assert (dest.name, dest.group, dest.sync) == (other, "hot", True)
    assert dest.topics == (ReplicationTopic(".*", "json"),)
    assert dest.passthrough == ()
    assert dest.inet_addrs == (("127.0.0.1", target),)
    assert dest.replicates("any/topic", "json")


def test_hot_hot_readme_exists() -> None:
    readme = (EXAMPLES / "hot-hot" / "README.md").read_text()
    assert "amps-py serve --config config/examples/hot-hot/amps-a.xml" in readme
    assert "amps-py serve --config config/examples/hot-hot/amps-b.xml" in readme


# ------------------------------------------------------------------------- geo-ha

SITES = {"Chicago": "chi", "NewYork": "ny", "London": "ldn"}
GEO_NAMES = [f"{short}-{n}" for short in SITES.values() for n in (1, 2)]
#: Instance x (1..6, in GEO_NAMES order) serves clients on 93x7, replication on 93x4.
GEO_NUMBER = {name: i + 1 for i, name in enumerate(GEO_NAMES)}


def geo(name: str) -> InstanceConfig:
    return load_config(EXAMPLES / "geo-ha" / f"{name}.xml", environ={})


def repl_addr(name: str) -> tuple[str, int]:
    return ("127.0.0.1", 9304 + 10 * GEO_NUMBER[name])


@pytest.mark.parametrize("name", GEO_NAMES)
def test_geo_ha_example(name: str) -> None:
    cfg = geo(name)
    short, number = name.split("-")
    group = next(g for g, s in SITES.items() if s == short)
    partner = f"{short}-{3 - int(number)}"
    assert (cfg.name, cfg.group) == (name, group)
    (clients,) = cfg.client_transports
    assert (clients.host, clients.port) == ("127.0.0.1", 9307 + 10 * GEO_NUMBER[name])
    repl = cfg.replication_transport
    assert repl is not None and (repl.host, repl.port) == repl_addr(name)
    assert cfg.transaction_log is not None
    assert cfg.transaction_log.journal_directory == Path("amps-data") / name

    remote_groups = [g for g in SITES if g != group]
    by_name = {d.name: d for d in cfg.replication}
    assert list(by_name) == [partner, *remote_groups]

    local = by_name[partner]
    assert (local.group, local.sync_type) == (group, "sync")
    assert local.inet_addrs == (repl_addr(partner),)
    assert local.passthrough == tuple(f"^{g}$" for g in remote_groups)
    assert not local.passes_through(group)

    for remote_group in remote_groups:
        remote = by_name[remote_group]
        remote_short = SITES[remote_group]
        assert (remote.group, remote.sync_type) == (remote_group, "async")
        # Table 25.1: the remote site's servers are failover equivalents, 1 before 2.
        assert remote.inet_addrs == (
            repl_addr(f"{remote_short}-1"),
            repl_addr(f"{remote_short}-2"),
        )
        assert remote.passthrough == ()
        assert remote.compression == "zstd"
    for dest in cfg.replication:
        assert dest.topics == (ReplicationTopic(".*", "json"),)


def route(origin: str, down: frozenset[str] = frozenset()) -> Counter[str]:
    """Trace one message published to ``origin`` through the geo-ha configs.

    Applies the routing rules (a directly published message goes to every Destination;
    a replicated one only where PassThrough matches the sender's Group; never to an
    instance already on its path) and connects each Destination to the first of its
    addresses that is up. Returns how many times each instance stores the message.
    """
    configs = {name: geo(name) for name in GEO_NAMES}
    at_address = {repl_addr(name): name for name in GEO_NAMES}
    stored: Counter[str] = Counter()
    pending: list[tuple[str, str | None, tuple[str, ...]]] = [(origin, None, ())]
    while pending:
        here, sender_group, path = pending.pop()
        stored[here] += 1
        for dest in configs[here].replication:
            if sender_group is not None and not dest.passes_through(sender_group):
                continue
            target = next(
                (at_address[a] for a in dest.inet_addrs if at_address[a] not in down), None
            )
            if target is None or target in path or target == here:
                continue
            pending.append((target, configs[here].group, (*path, here)))
    return stored


@pytest.mark.parametrize("origin", GEO_NAMES)
def test_geo_ha_every_instance_stores_each_message_once(origin: str) -> None:
    assert route(origin) == Counter(dict.fromkeys(GEO_NAMES, 1))


@pytest.mark.parametrize("failed", ["ny-1", "ldn-1", "chi-1"])
def test_geo_ha_failover_still_reaches_every_live_instance_once(failed: str) -> None:
    for origin in GEO_NAMES:
        if origin == failed:
            continue
        stored = route(origin, down=frozenset({failed}))
        assert stored == Counter({n: 1 for n in GEO_NAMES if n != failed}), origin


def test_geo_ha_readme_explains_the_routing() -> None:
    readme = (EXAMPLES / "geo-ha" / "README.md").read_text()
    for needle in ("PassThrough", "exactly once", "93x7", "93x4", "Table 25.1"):
        assert needle in readme


def test_every_example_loads() -> None:
    files = sorted(EXAMPLES.rglob("*.xml"))
    assert len(files) >= 1 + 2 + 6
    for path in files:
        load_config(path, environ={})


# ------------------------------------------------------------ bad configurations


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    fragment: str  # must appear in str(problem)
    line: int | None
    count: int = 1  # problems expected in total (guards against duplicate reports)


def whole(*lines: str) -> str:
    return "\n".join(lines)


SECOND_DEST = [
    "    </Destination>",
    "    <Destination>",  # +1
    "      <Name>amps-b</Name>",  # +2
    "      <SyncType>async</SyncType>",
    "      <Topic><MessageType>json</MessageType></Topic>",
]

CASES = [
    Case(
        "missing SyncType",
        dest_doc(SyncType=None),
        "<Destination> is missing the required element <SyncType>",
        DEST_LINE,
    ),
    Case(
        "bad SyncType value",
        dest_doc(SyncType="      <SyncType>synchronous</SyncType>"),
        "'synchronous' is not a valid SyncType; did you mean 'sync'? Fix: use one of: sync, async",
        15,
    ),
    Case(
        "unknown ExcludeValidation name",
        dest_doc(
            Topic=topic(
                "<MessageType>json</MessageType><ExcludeValidation>txlog,replicat"
                "</ExcludeValidation>"
            )
        ),
        "'replicat' in ExcludeValidation is not a validation check; did you mean 'replicate'?",
        16,
    ),
    Case(
        "excluding queue",
        dest_doc(
            Topic=topic(
                "<MessageType>json</MessageType><ExcludeValidation>sow, queue</ExcludeValidation>"
            )
        ),
        "the queue validation check cannot be excluded",
        16,
    ),
    Case(
        "excluding queue_underlying",
        dest_doc(
            Topic=topic(
                "<MessageType>json</MessageType>"
                "<ExcludeValidation>queue_underlying</ExcludeValidation>"
            )
        ),
        "the queue_underlying validation check cannot be excluded",
        16,
    ),
    Case(
        "bad PassThrough regex",
        dest_doc("      <PassThrough>^(NYC|LDN</PassThrough>"),
        "PassThrough '^(NYC|LDN' is not a valid regular expression: missing ), unterminated "
        "subpattern",
        18,
    ),
    Case(
        "bad Filter",
        dest_doc(Topic=topic("<MessageType>json</MessageType><Filter>/region = </Filter>")),
        "Filter '/region =' is not a valid content filter",
        16,
    ),
    Case(
        "two amps-replication transports",
        dest_doc().replace(
            "  </Transports>",
            "    <Transport><Name>repl-2</Name>\n"
            "      <Type>amps-replication</Type><InetAddr>9105</InetAddr></Transport>\n"
            "  </Transports>",
        ),
        "an instance has at most one amps-replication transport, and transport 'repl' on "
        "line 10 already is one",
        12,
    ),
    Case(
        "duplicate Destination Name",
        dest_doc(*SECOND_DEST),
        "destination name 'amps-b' is already used by the destination on line 13",
        20,
    ),
    Case(
        "bad InetAddr in Destination/Transport",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("localhost:http"))),
        "InetAddr 'localhost:http' has no valid port number",
        17,
    ),
    Case(
        "bad second failover InetAddr",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("h:9204"), inet("300.1.1.1:9204"))),
        "'300.1.1.1' is not a valid IPv4 address",
        17,
    ),
    Case(
        "InetAddr port 0",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("h:0"))),
        "InetAddr h:0 has port 0, which cannot be connected to",
        17,
    ),
    Case(
        "bad ReconnectTimeout unit",
        dest_doc(
            Transport=dest_transport(
                REPL_TYPE, inet("h:9204"), "<ReconnectTimeout>1s,5 parsecs</ReconnectTimeout>"
            )
        ),
        "'5 parsecs' is not a valid duration for ReconnectTimeout",
        17,
    ),
    Case(
        "ReconnectTimeout of zero",
        dest_doc(
            Transport=dest_transport(
                REPL_TYPE, inet("h:9204"), "<ReconnectTimeout>0s</ReconnectTimeout>"
            )
        ),
        "ReconnectTimeout '0s' is not more than 0",
        17,
    ),
    Case(
        "bad Compression value",
        dest_doc("      <Compression>zlib</Compression>"),
        "'zlib' is not a valid Compression. Fix: use one of: none, zstd",
        18,
    ),
    Case(
        "destination pointing at its own replication address",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("127.0.0.1:9104"))),
        "Destination 'amps-b' replicates to itself: InetAddr 127.0.0.1:9104 is this "
        "instance's own amps-replication transport 'repl'",
        17,
    ),
    Case(
        "own replication address reached by another loopback name",
        dest_doc(
            Transport=dest_transport(REPL_TYPE, inet("h:9204"), inet("localhost:9104"))
        ).replace("<InetAddr>127.0.0.1:9104</InetAddr>", "<InetAddr>9104</InetAddr>"),
        "replicates to itself: InetAddr localhost:9104",
        17,
    ),
    Case(
        "destination pointing at a client transport of this instance",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("127.0.0.1:9107"))),
        "InetAddr 127.0.0.1:9107 is this instance's client transport 'json-tcp'",
        17,
    ),
    Case(
        "destination with this instance's Name and Group",
        dest_doc("      <Group>hot</Group>", Name="      <Name>amps-a</Name>"),
        "Destination 'amps-a' in Group 'hot' is this instance itself",
        14,
    ),
    Case(
        "same address in two destinations",
        dest_doc(
            *SECOND_DEST[:2], "      <Name>amps-c</Name>", *SECOND_DEST[3:], GOOD["Transport"]
        ),
        "InetAddr 127.0.0.1:9204 is already used by destination 'amps-b' on line 17",
        23,
    ),
    Case(
        "failover address listed twice",
        dest_doc(Transport=dest_transport(REPL_TYPE, inet("h:9204"), inet("h:9204"))),
        "InetAddr h:9204 is listed twice in this Destination",
        17,
    ),
    Case(
        "missing Topic",
        dest_doc(Topic=None),
        "<Destination> is missing the required element <Topic>",
        DEST_LINE,
    ),
    Case(
        "Topic without MessageType",
        dest_doc(Topic=topic("<Name>orders</Name>")),
        "<Topic> is missing the required element <MessageType>",
        16,
    ),
    Case(
        "bad Topic Name regex",
        dest_doc(Topic=topic("<Name>orders[</Name><MessageType>json</MessageType>")),
        "Topic Name 'orders[' is not a valid regular expression",
        16,
    ),
    Case(
        "replicated message type not journaled",
        dest_doc(Topic=topic("<MessageType>binary</MessageType>")),
        "no binary topic is recorded in the transaction log",
        16,
    ),
    Case(
        "replicated literal topic not journaled",
        whole(
            *PRELUDE[:5],
            "    <Topic><Name>orders</Name><MessageType>json</MessageType></Topic>",
            *PRELUDE[6:],
            *body(Topic=topic("<Name>trades</Name><MessageType>json</MessageType>")),
            *END,
        ),
        "topic 'trades' (json) is not recorded in the transaction log",
        16,
    ),
    Case(
        "Transport Type tcp inside a Destination",
        dest_doc(Transport=dest_transport("<Type>tcp</Type>", inet("h:9204"))),
        "'tcp' is not a valid Type. Fix: use one of: amps-replication",
        17,
    ),
    Case(
        "CA Certificate on a plain amps-replication destination",
        dest_doc(
            Transport=dest_transport(REPL_TYPE, inet("h:1"), "<Certificate>ca.pem</Certificate>")
        ),
        "<Certificate> only applies to TLS links (Type amps-replication-secure)",
        17,
    ),
    Case(
        "amps-replication-secure listener without Certificate and PrivateKey",
        dest_doc().replace(
            "<Type>amps-replication</Type><InetAddr>127.0.0.1:9104",
            "<Type>amps-replication-secure</Type><InetAddr>127.0.0.1:9104",
        ),
        "Type amps-replication-secure needs a <Certificate>",
        10,
        count=2,
    ),
    Case(
        "Transport without InetAddr",
        dest_doc(Transport=dest_transport(REPL_TYPE)),
        "<Transport> is missing the required element <InetAddr>",
        17,
    ),
    Case(
        "Authenticator with an unknown Module",
        dest_doc(
            Transport=dest_transport(
                REPL_TYPE, inet("h:9204"), "<Authenticator><Module>m</Module></Authenticator>"
            )
        ),
        "'m' is not a valid Module. Fix: use one of: amps-default-authenticator-module, "
        "amps-default-authenticator, amps-password-authenticator",
        17,
    ),
    Case(
        "HeartbeatInterval of zero",
        dest_doc("      <HeartbeatInterval>0</HeartbeatInterval>"),
        "HeartbeatInterval 0 must be more than 0",
        18,
    ),
    Case(
        "bad AckConflationInterval unit",
        dest_doc("      <AckConflationInterval>10 jiffies</AckConflationInterval>"),
        "'10 jiffies' is not a valid duration for AckConflationInterval",
        18,
    ),
    Case(
        "Destination Name with the client-name separator",
        dest_doc(Name="      <Name>amps!b</Name>"),
        "Destination Name 'amps!b' contains '!'",
        14,
    ),
    Case(
        "ExcludeValidation directly in Destination",
        dest_doc("      <ExcludeValidation>sow</ExcludeValidation>"),
        "<ExcludeValidation> is not allowed inside <Destination>; it belongs inside "
        "<AMPSConfig/Replication/Destination/Topic>",
        18,
    ),
    Case(
        "waiting for a peer without a replication listener",
        dest_doc(Transport=None).replace(PRELUDE[9] + "\n", ""),
        "has no Transport, so it waits for the remote instance to connect, but this "
        "instance has no amps-replication transport",
        DEST_LINE - 1,
    ),
    Case(
        "replication without a transaction log",
        "\n".join([*PRELUDE[:3], *PRELUDE[7:], *body(), *END]),
        "replication sends messages from the transaction log, but this instance has no "
        "<TransactionLog>",
        8,
        count=2,
    ),
    Case(
        "replication listener without a transaction log",
        "\n".join([*PRELUDE[:3], *PRELUDE[7:11], "</AMPSConfig>"]),
        "the amps-replication transport stores what upstream instances send in the "
        "transaction log, but this instance has no <TransactionLog>",
        6,
    ),
    Case(
        "empty Replication",
        whole(*PRELUDE[:11], "  <Replication/>", "</AMPSConfig>"),
        "<Replication> is missing the required element <Destination>",
        12,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_replication_config(case: Case) -> None:
    with pytest.raises(ConfigError) as info:
        parse(case.text)
    problems = info.value.problems
    assert len(problems) == case.count, str(info.value)
    problem = next((p for p in problems if case.fragment in str(p)), None)
    assert problem is not None, f"{case.fragment!r} not in:\n{info.value}"
    assert problem.line == case.line, str(problem)
    text = str(problem)
    assert text.startswith(f"repl.xml:{problem.line}: ")
    assert problem.element and problem.fix and " Fix: " in text


def test_case_table_is_big_enough() -> None:
    assert len(CASES) >= 12


def test_problems_in_several_destinations_are_collected_together() -> None:
    text = dest_doc(  # without SyncType: the body is Name 14, Topic 15, Transport 16
        "      <PassThrough>(</PassThrough>",  # 17
        "    </Destination>",
        "    <Destination>",
        "      <Name>amps-c</Name>",
        "      <SyncType>eventually</SyncType>",  # 21
        "      <Topic><MessageType>json</MessageType></Topic>",
        "      <Transport><Type>amps-replication</Type><InetAddr>h:x</InetAddr></Transport>",  # 23
        SyncType=None,  # missing: reported on <Destination>, line 13
    )
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert [p.line for p in info.value.problems] == [13, 17, 21, 23], str(info.value)
