"""Replication validation on connect: each check refuses a mismatched pair with the
check, the topic and the fix in the detecting instance's log (the other side logs that
the peer refused validation), and the same pair connects once the check is excluded."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until

from amps_py.config import parse_config
from amps_py.replication.validation import ALL_CHECKS, TopicDescriptor, covers, validate


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


CASES = [
    # B does not journal "orders" (only "audit.*"), so it cannot replicate it back either
    Case("txlog", ("orders",), None, False, None, ("audit.*",), (), ("replicate",)),
    # B has no destination back to A
    Case("replicate", ("orders",), None, False, None, (".*",), ()),
    # A filters, B replicates back unfiltered
    Case("replicate_filter", ("orders",), "/qty > 1", True, None, (".*",), ()),
    # B replicates onward to C without the txlog check that A enforces
    Case("cascade", ("orders",), None, True, None, (".*",), ("txlog",)),
]


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
        return replication_xml(_dest("B", "gb", view.addr("B"), topics))

    def b_body(view) -> str:  # type: ignore[no-untyped-def]
        dests = []
        if case.b_back:
            dests.append(_dest("A", "ga", view.addr("A"), _topic("orders", case.b_back_filter, ())))
        if case.b_onward_exclude:
            dests.append(
                destination_xml("C", "gc", False, view.addr("C"), exclude=case.b_onward_exclude)
            )
        return replication_xml(*dests) if dests else ""

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

    await wait_until(refused, 20)
    assert "Fix:" in cluster.log("B")
    assert not cluster.server("A").destination("B")["is_connected"]

    excluded.append(case.check)
    cluster.restart("A")

    def connected() -> str | None:
        d = cluster.server("A").destination("B")
        return None if d["is_connected"] else f"A->B not connected: {d['last_error']}"

    await wait_until(connected, 20)


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
