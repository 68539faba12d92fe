"""A queue consumer on the HA client: it reconnects, or fails over to the other
instance of a replicated-queue pair, and goes on consuming.

What a user relies on:

- when the consumer's connection drops, the server returns what it had leased to it
  and not acknowledged to the queue (``leased`` falls to 0, ``returned`` counts them),
  and those messages are delivered again once the consumer is back;
- acknowledgements the server had not confirmed when the connection dropped (still
  batched), and those made while there was no connection, are sent on the next
  connection before the subscription is renewed: the server removes those messages
  (also ones leased on the dead connection: that is harmless, the application
  processed them) and never delivers them again; ``cancel``/``expire`` of a message
  leased on the dead connection are not sent (its lease is gone) and are counted;
- ``amps-py subscribe URI1,URI2 QUEUE --ack`` consumes on the HA client (a dead
  first server does not stop it) and acknowledges what it printed;
- killed -9 mid-stream, an owner's messages wait on its peer until proxied transfer
  is enabled there (the server's rule); the consumer, failed over to the peer, then
  gets them, those it held unacknowledged on the dead owner included, and every
  message is processed once; one it finished after the failover is acknowledged on
  the peer, which removes it (it is not delivered again).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio
from clirun import run
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from faultproxy import open_fault_proxy
from harness import start_instance, wait_until, wait_until_sync
from inprocess import InProcessInstance
from test_queue import QUEUE, queue_instance, queue_xml

from amps_py.client import (
    CONNECTED,
    DISCONNECTED,
    FAILED_OVER,
    HAMessage,
    open_client,
    open_ha_client,
)

BACKLOG_10 = "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>"


def number(message: HAMessage) -> int:
    return int(orjson.loads(message.data)["n"])


def stats(served: InProcessInstance) -> dict[str, Any]:
    queues = served.instance.queues
    assert queues is not None
    return dict(queues.statistics()[QUEUE])


async def publish_numbers(uri: str, name: str, numbers: range) -> None:
    async with open_client(uri, name) as pub:
        seq = 0
        for n in numbers:
            seq = await pub.publish(QUEUE, orjson.dumps({"n": n}))
        await pub.wait_persisted(seq, timeout=30)


async def test_leases_return_when_the_connection_drops_and_unconfirmed_acks_are_resent(
    tmp_path: Path,
) -> None:
    async with (
        queue_instance(tmp_path, BACKLOG_10) as served,
        open_fault_proxy("127.0.0.1", served.port, seed=7) as proxy,
    ):
        await publish_numbers(served.uri, "producer", range(10))
        states: list[str] = []
        async with open_ha_client(
            "worker",
            [f"tcp://127.0.0.1:{proxy.listen_port}/amps/json"],
            ack_batch_size=3,
            ack_timeout=60,  # a partial batch stays unsent until something sends it
            on_state=lambda state, _: states.append(state),
        ) as ha:
            await ha.wait_connected(10)
            async with ha.subscribe(QUEUE, max_backlog=4) as sub:
                held = [await sub.get(timeout=10) for _ in range(4)]
                assert [number(m) for m in held] == [0, 1, 2, 3]
                assert sub.max_backlog == 4 and {m.connection for m in held} == {1}
                await held[0].ack()
                await held[1].ack()  # both batched: not sent when the connection goes
                assert stats(served)["leased"] == 4

                proxy.refuse(True)  # the consumer cannot come back at once
                proxy.cut()
                await wait_until(
                    lambda: (
                        None
                        if (s := stats(served))["leased"] == 0 and s["subscriptions"] == 0
                        else f"the server still holds the leases: {s}"
                    ),
                    timeout=10,
                )
                returned = stats(served)
                print("after the drop:", returned)
                assert returned["returned"] == 4 and returned["depth"] == 10
                assert returned["acked"] == 0  # the batch never left the client

                # while disconnected: a plain ack is kept, a cancel is dropped
                await held[2].ack()
                await held[3].ack(cancel=True)
                assert ha.stale_acks_dropped == 1

                proxy.refuse(False)
                rest = []
                while len(rest) < 7:
                    message = await sub.get(timeout=10)
                    assert message.connection == 2
                    rest.append(number(message))
                    await message.ack()
                await ha.flush_acks(timeout=10)
            # 0, 1 (the batch) and 2 (made offline) were acknowledged before the
            # resubscribe: never delivered again; 3 (cancel dropped) came again
            assert sorted(rest) == list(range(3, 10))
            assert ha.acks_resent == 3
        assert states == [CONNECTED, DISCONNECTED, CONNECTED, "resubscribed"]
        final = stats(served)
        print("at the end:", final)
        assert final["depth"] == 0 and final["acked"] == 10


async def test_auto_ack_acknowledges_what_the_loop_moved_past_across_a_reconnect(
    tmp_path: Path,
) -> None:
    """auto_ack: the message the loop moved past is acknowledged, on the current
    connection even when it came on the one that dropped; the one in hand when the
    block raised is not acknowledged and comes again."""
    async with (
        queue_instance(tmp_path, BACKLOG_10) as served,
        open_fault_proxy("127.0.0.1", served.port, seed=8) as proxy,
    ):
        await publish_numbers(served.uri, "producer", range(6))
        uri = f"tcp://127.0.0.1:{proxy.listen_port}/amps/json"
        seen: list[int] = []
        async with open_ha_client("auto-worker", [uri]) as ha:
            try:
                async with ha.subscribe(QUEUE, max_backlog=2, auto_ack=True) as sub:
                    async for message in sub:
                        seen.append(number(message))
                        if len(seen) == 2:
                            proxy.cut()  # the next turn acks 1 on the new connection
                            await ha.wait_connected(10)
                            await wait_until(
                                lambda: None if ha.connections == 2 else "reconnecting", 10
                            )
                        if len(seen) == 4:
                            raise LookupError("the handler failed")  # not acked
            except LookupError:
                pass
            async with ha.subscribe(QUEUE, max_backlog=2, auto_ack=True) as again:
                async for message in again:
                    seen.append(number(message))
                    if set(seen) == set(range(6)):
                        break  # the block exits normally: this last one is acked
            await ha.flush_acks(timeout=10)
        print("seen:", seen)
        # every message was handled; the one whose handler raised came again, and so
        # may the one whose lease the drop ended before its ack reached the server
        assert sorted(set(seen)) == list(range(6))
        assert seen[3] in seen[4:]
        assert len(seen) - len(set(seen)) <= 2
        assert stats(served)["depth"] == 0


def test_the_cli_consumes_a_queue_through_a_uri_list(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "q", extra=queue_xml(BACKLOG_10))
    try:
        trio.run(publish_numbers, server.uri, "producer", range(10))
        uris = f"tcp://127.0.0.1:1/amps/json,{server.uri}"  # the first one is dead
        res = run(
            "subscribe", uris, QUEUE, "--ack", "--count", "6", "--max-backlog", "4",
            "--raw", cwd=tmp_path,
        )  # fmt: skip
        print(res.stderr)
        assert res.returncode == 0, res.stderr
        assert [orjson.loads(line)["n"] for line in res.stdout.splitlines()] == list(range(6))
        assert f"acknowledged 6 message(s) on {QUEUE}" in res.stderr

        def acked() -> str | None:  # the statistics file is written now and then
            queues = server.statistics()["queues"][QUEUE]
            return None if (queues["depth"], queues["acked"]) == (4, 6) else str(queues)

        wait_until_sync(acked, timeout=30)
        refused = run("subscribe", uris, QUEUE, "--ack", "--store", "st", cwd=tmp_path)
        assert refused.returncode != 0 and "drop --store" in refused.stderr
    finally:
        server.stop()


# ---------------------------------------------------------------------- a pair

PROXIED_ON_SIGNAL = (
    "<Actions><Action>"
    "<On><Module>amps-action-on-signal</Module><Options><Signal>SIGUSR1</Signal></Options></On>"
    "<Do><Module>amps-action-do-enable-proxied-transfer</Module>"
    f"<Options><Topic>{QUEUE}</Topic><MessageType>json</MessageType></Options></Do>"
    "</Action></Actions>"
)


def pair_body(peer: str, extra: str = "") -> Callable[[InstanceView], str]:
    def make(view: InstanceView) -> str:
        # PassThrough for the pair's own group: AMPS's queue_passthrough rule
        dest = destination_xml(peer, "hot", True, view.addr(peer), passthrough=("^hot$",))
        return queue_xml(BACKLOG_10) + replication_xml(dest) + extra

    return make


def queue_stats(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.server(name).statistics().get("queues", {}).get(QUEUE) or {})


async def test_a_consumer_fails_over_to_the_peer_when_the_owner_is_killed(
    cluster: Cluster,
) -> None:
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A", PROXIED_ON_SIGNAL))
    cluster.start_all()
    a, b = cluster.uri("A"), cluster.uri("B")
    await publish_numbers(a, "pub-a", range(20))  # owned by A
    await wait_until(
        lambda: None if queue_stats(cluster, "B").get("depth") == 20 else "not replicated yet",
        timeout=30,
    )
    processed: list[int] = []
    held: list[int] = []
    states: list[tuple[str, str]] = []
    with trio.fail_after(90):
        async with open_ha_client(
            "pair-worker", [a, b], on_state=lambda s, d: states.append((s, d.get("uri", "")))
        ) as ha:
            async with ha.subscribe(QUEUE, max_backlog=4) as sub:
                while len(processed) < 8:
                    message = await sub.get(timeout=10)
                    processed.append(number(message))
                    await message.ack()
                await ha.flush_acks(timeout=10)
                # A confirms an acknowledgement once it is in A's journal, before its
                # sync peer has it: wait until B removed them too, or a kill now would
                # leave B delivering them again (at-least-once, not a loss)
                await wait_until(
                    lambda: (
                        None
                        if queue_stats(cluster, "B").get("depth") == 12
                        else f"acks not on B yet: {queue_stats(cluster, 'B')}"
                    ),
                    timeout=30,
                )
                # four more leased to the consumer, not acknowledged
                late = [await sub.get(timeout=10) for _ in range(4)]
                held = [number(m) for m in late]
                await trio.to_thread.run_sync(cluster.kill, "A")
                print(f"A killed: processed {processed}, holding {held}")
                await wait_until(lambda: None if ha.uri == b and ha.connected else "failing", 30)
                # the application finishes one it held: acknowledged on B, where the
                # message waits for its dead owner; B removes it
                await late[0].ack()
                await ha.flush_acks(timeout=10)
                # the owner is gone: the operator lets B take its messages over
                cluster.server("B").signal(signal.SIGUSR1)
                while len(processed) < 20 - 1:
                    message = await sub.get(timeout=30)
                    assert message.connection == 2
                    processed.append(number(message))
                    await message.ack()
                await ha.flush_acks(timeout=10)
    print("processed:", processed, "states:", states)
    assert [s for s, _ in states][:4] == [CONNECTED, DISCONNECTED, CONNECTED, FAILED_OVER]
    # each exactly once: late[0] was acknowledged on B (never delivered again), the
    # other held ones were delivered again by B (leased on A, never processed)
    assert sorted(processed + held[:1]) == list(range(20))
    await wait_until(
        lambda: (
            None
            if queue_stats(cluster, "B").get("depth") == 0
            else f"B's queue: {queue_stats(cluster, 'B')}"
        ),
        timeout=30,
    )
