"""No acknowledged message is lost when a publisher fails over or reorders its seqs.

- A publish is a duplicate only if that exact (publisher, seq) is journaled or in
  flight: seqs sent out of order (1, 2, 5, 3, 4) are all stored, once, on a single
  instance and on a sync pair.
- The logon ack carries the highest seq the instance holds for that client name from
  any source, without waiting for the instance's own sync destinations; the server's
  own next seq (a publish without ``s``) goes above it.
- A storm: kill -9 at seeded random moments while HA-style publishers fail over,
  republish their unacknowledged tail in random order and interleave new messages;
  afterwards every acknowledged message is on both instances exactly once.
"""

from __future__ import annotations

import random

import pytest
import trio
from checker import Pub, classify, payload, replay_instance
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from ha_publisher import HAPublisher
from harness import wait_until
from inprocess import InProcessInstance

from amps_py.client import open_client

REORDERED = (1, 2, 5, 3, 4)


def pair_body(peer: str):  # type: ignore[no-untyped-def]
    def make(view: InstanceView) -> str:
        return replication_xml(destination_xml(peer, "hot", True, view.addr(peer)))

    return make


async def publish_reordered(uri: str, name: str) -> None:
    """1, 2 and 5 (each acknowledged), then 3 and 4, then a flush for persistence."""
    async with open_client(uri, name) as pub:
        for seq in REORDERED[:3]:
            await pub.publish("orders", payload(name, seq), seq=seq)
            await pub.wait_persisted(seq)
        for seq in REORDERED[3:]:
            await pub.publish("orders", payload(name, seq), seq=seq)
        await pub.flush()


def seqs_of(stored: list, name: str) -> list[int]:  # type: ignore[type-arg]
    return [m.seq for m in stored if m.publisher == name]


async def test_reordered_publishes_are_stored_once_each(inproc: InProcessInstance) -> None:
    instance = inproc  # one instance: served in the test's trio run (inprocess.py)
    await publish_reordered(instance.uri, "reorder")
    stored = await replay_instance(instance.uri, "orders")
    assert seqs_of(stored, "reorder") == list(REORDERED), (
        "seqs 3 and 4 arrived after 5: they are new messages, not duplicates"
    )
    # resending all five now stores nothing more
    async with open_client(instance.uri, "reorder") as pub:
        assert int(pub.logon_ack["s"]) == 5
        for seq in REORDERED:
            await pub.publish("orders", payload("reorder", seq), seq=seq)
        await pub.flush()
    stored = await replay_instance(instance.uri, "orders")
    assert seqs_of(stored, "reorder") == list(REORDERED)


async def test_reordered_publishes_on_a_sync_pair(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.start_all()
    await publish_reordered(cluster.uri("A"), "reorder-a")
    await publish_reordered(cluster.uri("B"), "reorder-b")
    for name in "AB":
        stored = await replay_instance(cluster.uri(name), "orders")
        for publisher in ("reorder-a", "reorder-b"):
            assert sorted(seqs_of(stored, publisher)) == [1, 2, 3, 4, 5], (
                f"{name} holds {seqs_of(stored, publisher)} of {publisher}"
            )


async def test_logon_after_failover_reports_the_highest_seq_held(cluster: Cluster) -> None:
    """A replicates to B, B to C (both sync). Once C is down nothing new is durable on
    B by B's own rule; B's logon ack must still report every seq B holds, and B's next
    seq (a publish without ``s``) go above it."""

    def one_way(to: str, group: str):  # type: ignore[no-untyped-def]
        def make(view: InstanceView) -> str:
            return replication_xml(
                destination_xml(to, group, True, view.addr(to), exclude=("replicate",))
            )

        return make

    cluster.add_instance("A", "east", one_way("B", "east"), replication_transport=False)
    cluster.add_instance("B", "east", one_way("C", "west"), replication_transport=True)
    cluster.add_instance("C", "west", None, replication_transport=True)
    cluster.start("C")
    cluster.start("B")
    cluster.start("A")
    async with open_client(cluster.uri("A"), "mover") as pub:
        for seq in range(1, 101):
            await pub.publish("orders", payload("mover", seq), seq=seq)
        await pub.wait_persisted(100)

        def durable_on_b() -> str | None:
            durable = cluster.server("B").statistics()["durable_txid"]
            return None if durable >= 100 else f"B durable through txid {durable}"

        await wait_until(durable_on_b, 30)
        cluster.kill("C")
        for seq in range(101, 301):
            await pub.publish("orders", payload("mover", seq), seq=seq)
        await pub.wait_persisted(300)  # B acknowledged them to A (after its own commit)
    cluster.kill("A")
    async with open_client(cluster.uri("B"), "mover") as pub:
        assert int(pub.logon_ack["s"]) == 300, (
            f"B holds seqs 1..300 of mover but its logon ack says {pub.logon_ack['s']}"
        )
        assert pub.logon_ack["bm"].endswith("|300|")
        # a publish without s gets the server's next seq: above everything held
        (ack,) = await pub.command({"c": "p", "t": "orders", "a": "processed"}, payload("mover", 0))
        assert ack["status"] == "success" and int(ack["s"]) == 301, ack
    stored = await replay_instance(cluster.uri("B"), "orders")
    assert seqs_of(stored, "mover") == [*range(1, 301), 0], (
        "the server-assigned publish must be stored as a new message (seq 301)"
    )


@pytest.mark.slow
async def test_failover_storm_with_reordering_ha_publishers(cluster: Cluster) -> None:
    seed = 1010
    kills = 20
    rng = random.Random(seed)
    print(f"\nseed {seed}, {kills} kills")
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.start_all()
    uris = [cluster.uri("A"), cluster.uri("B")]
    publishers = [
        HAPublisher("ha-a", uris, "orders", random.Random(seed + 1)),
        HAPublisher("ha-b", uris[::-1], "orders", random.Random(seed + 2)),
    ]

    def acked() -> int:
        return sum(len(p.acked) for p in publishers)

    stop = trio.Event()
    schedule: list[str] = []
    async with trio.open_nursery() as nursery:
        for pub in publishers:
            nursery.start_soon(pub.run, stop)
        with trio.fail_after(300):
            for _ in range(kills):
                target = acked() + rng.randint(100, 600)

                def progressed(target: int = target) -> str | None:
                    got = acked()
                    return None if got >= target else f"{got}/{target} acked after {schedule}"

                await wait_until(progressed, 60)
                victim = rng.choice("AB")
                await trio.sleep(rng.random() * 0.2)  # the seeded random kill point
                schedule.append(victim)
                cluster.kill(victim)
                cluster.start(victim)
            target = acked() + 200
            await wait_until(lambda: None if acked() >= target else "final progress", 60)
        stop.set()
    for pub in publishers:
        await pub.settle(60)
    print("kills:", " ".join(schedule))
    for pub in publishers:
        print(f"{pub.name}: {len(pub.acked)} acked, {pub.connections} connections")
        for uri, held, acked_before in pub.logon_seqs:
            assert held >= acked_before, (
                f"{pub.name} logged on to {uri} after seq {acked_before} was acknowledged, "
                f"but the logon ack said s={held}"
            )

    def same_size() -> str | None:
        counts = {n: cluster.server(n).statistics()["journal"]["records"] for n in "AB"}
        return None if counts["A"] == counts["B"] else f"journal records {counts}"

    await wait_until(same_size, 60)
    published = {
        pub.name: [Pub(seq, None, seq in pub.acked) for seq in range(1, pub.next_seq)]
        for pub in publishers
    }
    stored = {n: await replay_instance(cluster.uri(n), "orders", timeout=60) for n in "AB"}
    report = classify(published, stored)
    print(report.table())
    total = report.total
    # reordering is on purpose here: only loss, duplicates and phantoms are errors
    assert total.lost == total.duplicate == total.phantom == 0, report.describe()
    every_acked = sum(len(p.acked) for p in publishers)
    for name in "AB":
        assert report.instances[name].ok >= every_acked, report.describe()
