"""Persisted acks come back fast after a sync peer restarts.

A hot-hot pair (A and B replicate to each other, both ``sync``, the default
ReconnectTimeout of 1s, 2s, 4s, 8s) loses one member to SIGKILL while a publisher on
the survivor waits for the persisted ack of a message published after the kill. The
victim stays down until the survivor's reconnect back-off has grown past 4 s, then
restarts. The time from the victim's ready file to that persisted ack is printed and
must stay under 1 s, whichever member was killed: the survivor's stream must start as
soon as the peer is back (over the connection the peer opens, or by dialling at once
when the peer connects), not when its back-off ends.

Both sides are killed in turn because back replication treats them differently: of the
two connections a pair may open, the one opened by the lower name (A) is kept.
"""

from __future__ import annotations

import time

import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until

from amps_py.client import open_client

#: the victim stays down at least this long (seconds): with ReconnectTimeout 1s,2s,4s,8s
#: the survivor is then in its 8 s wait
DOWN_FOR = 8.0
#: the survivor's back-off wait must exceed this before the victim restarts
GROWN_BACKOFF = 4.0
#: ready file -> first persisted ack, at most (seconds)
MAX_STALL = 1.0


def to_peer(peer: str):  # type: ignore[no-untyped-def]
    def make(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(destination_xml(peer, "hot", True, view.addr(peer)))

    return make


async def wait_connected(cluster: Cluster) -> None:
    def check() -> str | None:
        down = [
            f"{src}->{dst}"
            for src, dst in (("A", "B"), ("B", "A"))
            if not cluster.server(src).destination(dst)["is_connected"]
        ]
        return None if not down else f"not connected: {down}"

    await wait_until(check, 30)


@pytest.mark.parametrize("victim", ["A", "B"])
async def test_persisted_acks_resume_within_a_second_of_the_peer_restarting(
    cluster: Cluster, victim: str
) -> None:
    survivor = "B" if victim == "A" else "A"
    cluster.add_instance("A", "hot", to_peer("B"))
    cluster.add_instance("B", "hot", to_peer("A"))
    cluster.start_all()
    await wait_connected(cluster)
    server = cluster.server(victim)

    async with open_client(cluster.uri(survivor), "pub", timeout=10) as pub:
        seq = await pub.publish("orders", '{"n":0}')
        await pub.wait_persisted(seq, timeout=30)

        cluster.kill(victim)
        killed_at = time.time()
        seq = await pub.publish("orders", '{"n":1}')

        seen_wait = 0.0

        def backoff_grown() -> str | None:
            nonlocal seen_wait
            d = cluster.server(survivor).destination(victim)
            seen_wait = max(seen_wait, d.get("reconnect_wait", 0.0))
            down = time.time() - killed_at
            if d["is_connected"]:
                return f"{survivor} still reports {victim} connected, {down:.1f} s after the kill"
            if down < DOWN_FOR:
                return f"{victim} down for {down:.1f} s of {DOWN_FOR:g} s"
            if "reconnect_wait" in d and seen_wait <= GROWN_BACKOFF:
                # a slow machine: the dial rounds took longer than their schedule
                return f"{survivor}->{victim}: back-off wait {seen_wait} s so far"
            return None

        await wait_until(backoff_grown, 60)
        assert pub.persisted_seq < seq, (
            f"{survivor} acknowledged seq {seq} while its sync peer {victim} was down"
        )

        acked_at = 0.0
        async with trio.open_nursery() as nursery:
            # start blocks until the ready file exists: run it beside the waiting publisher
            nursery.start_soon(trio.to_thread.run_sync, cluster.start, victim)
            await pub.wait_persisted(seq, timeout=60)
            acked_at = time.time()
    ready_at = server.ready_file.stat().st_mtime
    stall = acked_at - ready_at
    print(
        f"\n{victim} killed, down {ready_at - killed_at:.1f} s; "
        f"{survivor}'s reconnect back-off wait reached {seen_wait:g} s; "
        f"{victim}'s ready file -> first persisted ack on {survivor}: {stall:.3f} s"
    )
    assert stall < MAX_STALL, (
        f"persisted acks on {survivor} resumed {stall:.3f} s after {victim} was ready "
        f"(want < {MAX_STALL:g} s)"
    )
    assert seen_wait > GROWN_BACKOFF, (
        f"{survivor}'s reconnect back-off reached only {seen_wait:g} s before {victim} "
        f"restarted (statistic reconnect_wait); the scenario needs more than {GROWN_BACKOFF:g} s"
    )
