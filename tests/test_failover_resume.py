"""A durable subscriber fails over on a hot-hot sync pair (two real processes) to an
instance that does not hold its bookmark yet (issue 28 item 8).

The sequence an independent client found: a publisher's seqs 1..996 reached both A and
B; 997..1004 reached A only (the link is cut); the publisher fails over to B (logon
ack ``s=996``) and sends new seqs 1005, 1006 before it resends 997..1004. A subscriber
that had read up to 999 on A resumes on B after ``<pub>|999|``, which B does not hold
yet. It must receive every message above 999 exactly once: 1005 and 1006 (committed on
B *before* the point where "now" would start), then 1000..1004 as the resend arrives,
and none of 997..999. A second subscriber resumes on B before 1005 arrives (B holds
nothing above 999 yet): the same messages, all live.
"""

from __future__ import annotations

import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from harness import wait_until

from amps_py.client import Client, open_client
from txlog import publisher_hash

PUB = "failover-pub"
P = publisher_hash(PUB)


def pair_body(peer: str):  # type: ignore[no-untyped-def]
    def make(view: InstanceView) -> str:
        return replication_xml(destination_xml(peer, "hot", True, view.addr(peer)))

    return make


def payload(seq: int) -> bytes:
    return b'{"s":%d}' % seq


async def publish(pub: Client, seqs: range | tuple[int, ...]) -> None:
    for seq in seqs:
        await pub.publish("orders", payload(seq), seq=seq)


async def seen_live(watch, last: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until live subscription ``watch`` received seq ``last`` (it is committed)."""
    with trio.fail_after(60):
        while (await watch.get(60)).json()["s"] != last:
            pass


async def collect(sub, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The seqs ``sub`` received: ``count`` of them within 30 s (fewer if they do not
    come), then whatever more arrives within half a second (nothing, if all is well)."""
    got: list[int] = []
    with trio.move_on_after(30):
        while len(got) < count:
            got.append((await sub.get(30)).json()["s"])
    with trio.move_on_after(0.5):
        while True:
            got.append((await sub.get(5)).json()["s"])
    return got


async def test_subscriber_resumes_on_b_from_a_seq_b_does_not_hold_yet(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.proxy("A", "B")
    cluster.proxy("B", "A")
    cluster.start_all()
    uri_a, uri_b = cluster.uri("A"), cluster.uri("B")

    # 1..996 on both (persisted: B, A's sync destination, acknowledged them)
    async with open_client(uri_a, PUB) as pub:
        await publish(pub, range(1, 997))
        await pub.wait_persisted(996, timeout=60)
        cluster.partition("A", "B")
        await publish(pub, range(997, 1005))  # A only
        async with open_client(uri_a, "sub-on-a") as sub_a:
            async with sub_a.subscribe("orders", bookmark=f"{P}|990|") as s:
                got = [(await s.get(60)) for _ in range(9)]
            assert [m.json()["s"] for m in got] == list(range(991, 1000))
            resume = got[-1].bookmark
            assert resume == f"{P}|999|"

    async with (
        open_client(uri_b, "early") as early,
        open_client(uri_b, "late") as late,
        open_client(uri_b, "watch") as watcher,
        watcher.subscribe("orders") as watch,
    ):
        # the early subscriber resumes before anything of PUB above 996 is on B
        async with early.subscribe("orders", bookmark=resume) as early_sub:
            with trio.fail_after(60):
                await early_sub.completed.wait()
            async with open_client(uri_b, PUB) as pub:
                assert int(pub.logon_ack["s"]) == 996, pub.logon_ack
                await publish(pub, (1005, 1006))  # new seqs first
                await seen_live(watch, 1006)
                # the late subscriber resumes now: B holds 1005, 1006, not 999
                async with late.subscribe("orders", bookmark=resume) as late_sub:
                    with trio.fail_after(60):
                        await late_sub.completed.wait()
                    await publish(pub, range(997, 1005))  # the resend of the older tail
                    await seen_live(watch, 1004)
                    cluster.heal()
                    for link in cluster.proxies().values():
                        link.cut()  # reconnect: resync both ways

                    def converged() -> str | None:
                        counts = {
                            n: cluster.server(n).statistics()["journal"]["records"] for n in "AB"
                        }
                        return None if counts["A"] == counts["B"] == 1006 else f"{counts}"

                    await wait_until(converged, 60, interval=0.1)
                    want = [1005, 1006, 1000, 1001, 1002, 1003, 1004]
                    for name, sub in (("late", late_sub), ("early", early_sub)):
                        received = await collect(sub, len(want))
                        assert received == want, f"{name} subscriber received {received}"
