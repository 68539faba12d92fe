"""Fault test: a sync hot-hot pair under kill -9, restarts and link cuts, with four
publishers waiting for persisted acks. After the faults stop, every instance replays
from EPOCH and the checker classifies every published message: zero lost, duplicate,
reordered or phantom. Seeded and bounded in time; the seed and table are printed."""

from __future__ import annotations

import random
from pathlib import Path

import trio
from checker import Pub, classify, payload, replay_instance
from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until

from amps_py.client import AMPSError, open_client

SEED = 424242
PUBLISHERS = {"pub0": "A", "pub1": "A", "pub2": "B", "pub3": "B"}
#: every kind of fault three times, in a seeded random order
FAULT_KINDS = ("kill A", "kill B", "cut A->B", "cut B->A")
ROUNDS = 3
WINDOW = 100


def pair_body(peer: str):  # type: ignore[no-untyped-def]
    def make(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(destination_xml(peer, "hot", True, view.addr(peer)))

    return make


async def test_sync_pair_survives_kills_and_cuts(cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nseed {SEED}")
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    links = {
        "A->B": cluster.proxy("A", "B", seed=SEED),
        "B->A": cluster.proxy("B", "A", seed=SEED + 1),
    }
    cluster.start_all()

    acked = dict.fromkeys(PUBLISHERS, 0)
    sent = dict.fromkeys(PUBLISHERS, 0)
    stop = trio.Event()

    async def publisher(name: str) -> None:
        home = PUBLISHERS[name]
        while not stop.is_set():
            pub = None
            try:
                async with open_client(cluster.uri(home), name, timeout=5) as pub:
                    assert pub.seq >= acked[name], f"{home} forgot acknowledged messages of {name}"
                    while not stop.is_set():
                        if pub.seq - pub.persisted_seq < WINDOW:
                            seq = pub.seq + 1
                            await pub.publish("orders", payload(name, seq))
                            sent[name] = max(sent[name], seq)
                        else:
                            with trio.move_on_after(0.2):
                                await pub.wait_persisted(pub.seq - WINDOW // 2, timeout=1)
                        acked[name] = max(acked[name], pub.persisted_seq)
                        await trio.lowlevel.checkpoint()
            except (AMPSError, OSError, trio.BrokenResourceError, TimeoutError, trio.TooSlowError):
                pass
            finally:
                if pub is not None:
                    acked[name] = max(acked[name], pub.persisted_seq)
            if not stop.is_set():
                await trio.sleep(0.05)  # reconnect pause while the instance restarts

    schedule = list(FAULT_KINDS) * ROUNDS
    rng.shuffle(schedule)
    actions: list[str] = []
    async with trio.open_nursery() as nursery:
        for name in PUBLISHERS:
            nursery.start_soon(publisher, name)
        with trio.fail_after(180):
            for action in schedule:
                target = sum(acked.values()) + rng.randint(200, 800)

                def progressed(target: int = target) -> str | None:
                    total = sum(acked.values())
                    return (
                        None
                        if total >= target
                        else f"{total}/{target} acked (faults so far: {actions})"
                    )

                await wait_until(progressed, 60)
                actions.append(action)
                verb, what = action.split()
                if verb == "kill":
                    cluster.kill(what)
                    cluster.start(what)
                else:
                    links[what].cut()
            # let everyone catch up, then stop publishing
            target = sum(acked.values()) + 200
            await wait_until(lambda: None if sum(acked.values()) >= target else "final acks", 60)
            stop.set()
    print("faults:", ", ".join(actions))
    print("sent", sent, "acked", acked)

    def same_size() -> str | None:
        counts = {n: cluster.server(n).statistics()["journal"]["records"] for n in "AB"}
        return None if counts["A"] == counts["B"] else f"journal records {counts}"

    await wait_until(same_size, 60)
    published = {
        name: [Pub(seq, None, seq <= acked[name]) for seq in range(1, sent[name] + 1)]
        for name in PUBLISHERS
    }
    stored = {n: await replay_instance(cluster.uri(n), "orders", timeout=60) for n in "AB"}
    report = classify(published, stored)
    print(report.table())
    assert report.errors == 0, report.describe()
