"""A distributed queue on a hot-hot pair of real instances.

What a user relies on: with consumers on both sides and publishers on both sides,
every message is processed and acknowledged exactly once overall, and both queues end
empty (acks replicate); when one side has no consumers, its messages are transferred
to the side that has them (the owner grants the other's requests) and are still
processed exactly once.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import orjson
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from harness import wait_until
from test_queue import QUEUE, WireConsumer, consume, queue_xml

from amps_py.client import open_client

PEER = {"A": "B", "B": "A"}


def pair_body(peer: str) -> Callable[[InstanceView], str]:
    def make(view: InstanceView) -> str:
        # AMPS requires PassThrough for every group that replicates a queue, the
        # destination's own included (the queue_passthrough check)
        dest = destination_xml(peer, "hot", True, view.addr(peer), passthrough=("^hot$",))
        extra = "<MaxPerSubscriptionBacklog>4</MaxPerSubscriptionBacklog>"
        return queue_xml(extra) + replication_xml(dest)

    return make


def start_pair(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.start_all()


async def publish_from(uri: str, name: str, first: int, count: int) -> None:
    async with open_client(uri, name) as pub:
        seq = 0
        for i in range(first, first + count):
            seq = await pub.publish(QUEUE, orjson.dumps({"n": i}))
        await pub.wait_persisted(seq, timeout=30)


async def wait_emptied(cluster: Cluster, names: str, timeout: float = 60) -> None:
    """Wait until the queue is empty on each of ``names`` (acks have replicated)."""
    for name in names:
        await wait_until(
            lambda name=name: (
                None if depth(cluster, name) == 0 else f"{name}: {depth(cluster, name)}"
            ),
            timeout=timeout,
        )


def depth(cluster: Cluster, name: str) -> int | None:
    """The queue's depth from the instance's statistics file (None before it has
    written one with queues)."""
    queues = cluster.server(name).statistics().get("queues") or {}
    entry = queues.get(QUEUE)
    return None if entry is None else int(entry["depth"])


async def test_consumers_on_both_sides_process_every_message_once(cluster: Cluster) -> None:
    start_pair(cluster)
    got: dict[str, list[int]] = {"A": [], "B": []}
    stop = trio.Event()
    consumers = []
    async with trio.open_nursery() as nursery:
        for side in "AB":
            for k in range(2):
                c = await WireConsumer.connect(cluster.server(side).port, f"{side}{k}")
                await c.subscribe(backlog=4)
                consumers.append(c)
                nursery.start_soon(consume, c, got[side], stop)
        async with trio.open_nursery() as pubs:
            pubs.start_soon(publish_from, cluster.uri("A"), "pub-A", 0, 100)
            pubs.start_soon(publish_from, cluster.uri("B"), "pub-B", 100, 100)

        def all_done() -> str | None:
            total = len(got["A"]) + len(got["B"])
            if total < 200:
                return f"{total} of 200 processed (A {len(got['A'])}, B {len(got['B'])})"
            return None

        await wait_until(all_done, timeout=60)
        stop.set()
    everything = got["A"] + got["B"]
    print(f"A processed {len(got['A'])}, B processed {len(got['B'])}")
    assert sorted(everything) == list(range(200)), "a message was lost or processed twice"
    for c in consumers:
        await c.aclose()
    await wait_emptied(cluster, "AB", timeout=30)


async def test_messages_published_where_nobody_consumes_are_transferred(
    cluster: Cluster,
) -> None:
    start_pair(cluster)
    got: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        consumer = await WireConsumer.connect(cluster.server("B").port, "only-B")
        await consumer.subscribe(backlog=4)
        nursery.start_soon(consume, consumer, got, stop)
        await publish_from(cluster.uri("A"), "pub-A", 0, 40)  # owned by A, no consumer there
        await wait_until(
            lambda: None if len(got) >= 40 else f"B processed {len(got)} of 40", timeout=60
        )
        stop.set()
    assert sorted(got) == list(range(40))
    await consumer.aclose()

    def transferred() -> str | None:
        stats_b = cluster.server("B").statistics()["queues"][QUEUE]
        stats_a = cluster.server("A").statistics()["queues"][QUEUE]
        if stats_b["transferred_in"] == 40 and stats_a["transferred_out"] == 40:
            return None
        return f"B {stats_b}, A {stats_a}"

    await wait_until(transferred, timeout=30)
    await wait_emptied(cluster, "A", timeout=30)


PROXIED_ON_SIGNAL = (
    "<Actions><Action>"
    "<On><Module>amps-action-on-signal</Module><Options><Signal>SIGUSR1</Signal></Options></On>"
    "<Do><Module>amps-action-do-enable-proxied-transfer</Module>"
    f"<Options><Topic>{QUEUE}</Topic><MessageType>json</MessageType></Options></Do>"
    "</Action></Actions>"
)


async def test_a_dead_owners_messages_wait_until_proxied_transfer_is_enabled(
    cluster: Cluster,
) -> None:
    cluster.add_instance("A", "hot", pair_body("B"))
    with_action = pair_body("A")
    cluster.add_instance("B", "hot", lambda view: with_action(view) + PROXIED_ON_SIGNAL)
    cluster.start_all()
    await publish_from(cluster.uri("A"), "pub-A", 0, 20)  # owned by A; nobody consumes
    await wait_until(lambda: None if depth(cluster, "B") == 20 else f"B: {depth(cluster, 'B')}", 30)
    cluster.kill("A")
    got: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        consumer = await WireConsumer.connect(cluster.server("B").port, "only-B")
        await consumer.subscribe(backlog=4)
        nursery.start_soon(consume, consumer, got, stop)
        # the owner is gone and cannot grant: nothing is delivered (observed for 1.5 s,
        # three times the wait after which B asks an owner)
        await trio.sleep(1.5)
        assert got == [], "messages of an unreachable owner were delivered without proxied transfer"
        cluster.server("B").signal(signal.SIGUSR1)  # the action enables proxied transfer
        await wait_until(lambda: None if len(got) >= 20 else f"B processed {len(got)} of 20", 30)
        stop.set()
    assert sorted(got) == list(range(20))
    await consumer.aclose()
    stats = cluster.server("B").statistics()["queues"][QUEUE]
    assert stats["proxied_transfer"] is True
    await wait_until(
        lambda: (
            None
            if cluster.server("B").statistics()["queues"][QUEUE]["proxied_claims"] == 20
            else "claims not counted yet"
        ),
        timeout=60,
    )
    # the owner comes back: the claims and acks replicate to it, its queue empties
    cluster.restart("A")
    await wait_emptied(cluster, "A", timeout=60)


def mesh_body(me: str) -> Callable[[InstanceView], str]:
    """Three instances, each replicating to the other two; a GroupLocalQueue whose
    InitialOwner is A on all three."""

    def make(view: InstanceView) -> str:
        dests = [
            destination_xml(peer, "mesh", False, view.addr(peer), passthrough=(".*",))
            for peer in "ABC"
            if peer != me
        ]
        extra = (
            "<InitialOwner>A</InitialOwner><MaxPerSubscriptionBacklog>4</MaxPerSubscriptionBacklog>"
        )
        return queue_xml(extra, kind="GroupLocalQueue") + replication_xml(*dests)

    return make


def queue_stats(cluster: Cluster, name: str) -> dict[str, int]:
    return dict(cluster.server(name).statistics().get("queues", {}).get(QUEUE) or {})


async def test_a_group_local_queue_is_delivered_by_its_initial_owner_until_it_grants(
    cluster: Cluster,
) -> None:
    for name in "ABC":
        cluster.add_instance(name, "mesh", mesh_body(name))
    cluster.start_all()
    got_a: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        at_a = await WireConsumer.connect(cluster.server("A").port, "at-A")
        await at_a.subscribe(backlog=4)
        nursery.start_soon(consume, at_a, got_a, stop)
        # published at C, owned by A: only A delivers (B and C have the messages too)
        await publish_from(cluster.uri("C"), "pub-C", 0, 20)
        await wait_until(lambda: None if len(got_a) >= 20 else f"A processed {len(got_a)}", 30)
        stop.set()
    await at_a.aclose()
    for name in "BC":
        assert queue_stats(cluster, name).get("delivered", 0) == 0, queue_stats(cluster, name)
    # A's consumer is gone: B's idle consumer asks for what waits, and A grants it
    got_b: list[int] = []
    stop2 = trio.Event()
    async with trio.open_nursery() as nursery:
        at_b = await WireConsumer.connect(cluster.server("B").port, "at-B")
        await at_b.subscribe(backlog=4)
        nursery.start_soon(consume, at_b, got_b, stop2)
        await publish_from(cluster.uri("C"), "pub-C2", 20, 20)
        await wait_until(lambda: None if len(got_b) >= 20 else f"B processed {len(got_b)}", 30)
        stop2.set()
    await at_b.aclose()
    assert sorted(got_a) == list(range(20)) and sorted(got_b) == list(range(20, 40))

    def settled() -> str | None:
        a, b, c = (queue_stats(cluster, n) for n in "ABC")
        if b.get("delivered") == 20 and b.get("transferred_in") == 20 and c.get("delivered") == 0:
            return None
        return f"A {a}, B {b}, C {c}"

    await wait_until(settled, timeout=30)
    await wait_emptied(cluster, "ABC", timeout=30)


async def test_proxied_transfer_during_a_partition_counts_and_flags_its_duplicates(
    cluster: Cluster,
) -> None:
    """The documented risk of proxied transfer: while A is alive but cut off, its
    consumer holds messages it was delivered; B, with proxied transfer enabled, takes
    over every message of A it has and processes them too. When the link is back, A
    learns of the claims: each message its consumer still held is counted in
    ``proxied_conflicts`` and logged, and the duplicates are exactly those."""
    cluster.add_instance("A", "hot", pair_body("B"))
    with_action = pair_body("A")
    cluster.add_instance("B", "hot", lambda view: with_action(view) + PROXIED_ON_SIGNAL)
    links = [cluster.proxy("A", "B"), cluster.proxy("B", "A")]
    cluster.start_all()
    at_a = await WireConsumer.connect(cluster.server("A").port, "holder-A")
    await at_a.subscribe(backlog=4)
    await publish_from(cluster.uri("A"), "pub-A", 0, 10)  # owned by A
    held = await at_a.collect(4)  # A's consumer holds 4 and does not acknowledge yet
    await wait_until(lambda: None if depth(cluster, "B") == 10 else f"B: {depth(cluster, 'B')}", 30)
    for link in links:  # the partition: connections dropped, new ones refused
        link.refuse(True)
        link.cut()
    await wait_until(
        lambda: (
            None
            if not cluster.server("B").statistics()["replication"]["upstreams"]
            else "B still sees A"
        ),
        timeout=30,
    )
    got_b: list[int] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        at_b = await WireConsumer.connect(cluster.server("B").port, "taker-B")
        await at_b.subscribe(backlog=4)
        nursery.start_soon(consume, at_b, got_b, stop)
        cluster.server("B").signal(signal.SIGUSR1)  # proxied transfer on B
        await wait_until(lambda: None if len(got_b) >= 10 else f"B processed {len(got_b)}", 30)
        stop.set()
    await at_b.aclose()
    assert sorted(got_b) == list(range(10))  # every message, A's held ones included
    duplicates = sorted(set(held) & set(got_b))
    assert duplicates == sorted(held)
    for link in links:  # the partition ends
        link.heal()

    def flagged() -> str | None:
        stats = cluster.server("A").statistics()["queues"][QUEUE]
        if stats["proxied_conflicts"] == len(held):
            return None
        return f"A: {stats}"

    await wait_until(flagged, timeout=60)
    log = cluster.server("A").log_file.read_text()
    assert "may be processed twice" in log and "18-0003" in log
    print(f"duplicates processed on both sides: {duplicates} (counted and logged on A)")
    await at_a.aclose()
    await wait_emptied(cluster, "AB", timeout=60)
