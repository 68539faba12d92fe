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
        # passthrough for the own group: the queue_passthrough check requires it
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
    for side in "AB":
        await wait_until(
            lambda side=side: (
                None if depth(cluster, side) == 0 else f"{side}: {depth(cluster, side)}"
            ),
            timeout=30,
        )


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
    await wait_until(lambda: None if depth(cluster, "A") == 0 else f"A: {depth(cluster, 'A')}", 30)


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
        timeout=10,
    )
    # the owner comes back: the claims and acks replicate to it, its queue empties
    cluster.restart("A")
    await wait_until(lambda: None if depth(cluster, "A") == 0 else f"A: {depth(cluster, 'A')}", 60)
