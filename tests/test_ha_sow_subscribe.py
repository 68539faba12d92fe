"""``sow_and_subscribe`` on the HA client, resumed after a reconnect by a bookmark
replay instead of a second snapshot.

What a user relies on:

- the snapshot is handed over once; after a reconnect (the same server, or the other
  one of a pair after a kill -9) the application gets every update it missed, in
  order, and no message it was already given;
- a replayed message older than the version of its record the application holds (it
  was overwritten by another publisher before the snapshot) is never handed over;
- a delete made while the client was away comes as an ``oof`` (reason ``deleted``),
  and a record updated out of the filter as one with reason ``match``, found by the
  check that follows the replay; in the end the application's view equals the
  server's State of the World.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from faultproxy import open_fault_proxy
from harness import wait_until
from inprocess import serve_instance
from test_ha_client import DOWNGRADE_XML

from amps_py.client import (
    FAILED_OVER,
    HAMessage,
    HASowSubscription,
    open_client,
    open_ha_client,
)
from amps_py.client.sow_view import version_of

TOPIC = "orders"
SOW_XML = (
    f"<SOW><Topic><Name>{TOPIC}</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)


def doc(i: int, v: int) -> bytes:
    return orjson.dumps({"id": i, "v": v})


#: SOW key -> id, as the messages handed over showed them (an oof has no data)
IDS: dict[str, int] = {}


def summary(message: HAMessage) -> tuple[str, int, Any]:
    """(command, id, v or the oof reason) of a message handed over."""
    if message.command == "oof":
        return ("oof", IDS.get(message.key, -1), message.reason)
    body = orjson.loads(message.data)
    IDS[message.key] = body["id"]
    return (message.command, body["id"], body["v"])


class View:
    """The application: applies what it is handed to its own copy of the SOW and
    keeps every message."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}  # SOW key -> document
        self.handed: list[HAMessage] = []

    def apply(self, message: HAMessage) -> None:
        summary(message)  # learns the id of each key
        self.handed.append(message)
        if message.command == "oof":
            self.records.pop(message.key, None)
        else:
            self.records[message.key] = orjson.loads(message.data)

    def by_id(self) -> dict[int, int]:
        return {d["id"]: d["v"] for d in self.records.values()}


async def sow_by_id(uri: str) -> dict[int, int]:
    async with open_client(uri, "checker") as client:
        docs = [orjson.loads(r.data) for r in await client.sow(TOPIC)]
    return {d["id"]: d["v"] for d in docs}


async def consume(sub: HASowSubscription, view: View) -> None:
    async for message in sub:
        view.apply(message)


async def test_a_resumed_sow_subscription_drops_what_it_had_and_what_was_superseded(
    tmp_path: Path,
) -> None:
    """Two publishers write record 1 (P, then Q overwrites it) before the snapshot.
    While the client is cut off, P adds 3 and updates 1, and 2 is deleted. The
    resumption replays from P's and Q's last bookmarks: P's overwritten message of 1
    comes by first and is dropped, Q's (which the application has) is dropped, P's
    new ones are handed over, and the check reports 2 as deleted."""
    async with (
        serve_instance(tmp_path, "sow", extra=SOW_XML) as inst,
        open_fault_proxy("127.0.0.1", inst.port, seed=3) as proxy,
        open_client(inst.uri, "pub-p") as p,
        open_client(inst.uri, "pub-q") as q,
    ):
        await p.publish(TOPIC, doc(2, 20))  # P1
        await p.publish(TOPIC, doc(1, 10))  # P2: overwritten by Q1
        await p.flush()
        await q.publish(TOPIC, doc(1, 11))  # Q1
        await q.flush()
        view = View()
        uri = f"tcp://127.0.0.1:{proxy.listen_port}/amps/json"
        async with (
            open_ha_client("viewer", [uri]) as ha,
            ha.sow_and_subscribe(TOPIC, options="oof") as sub,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(consume, sub, view)
            await wait_until(lambda: None if sub.snapshot_done.is_set() else "snapshot", 10)
            await wait_until(lambda: None if len(view.handed) == 2 else "records", 10)
            assert sorted(summary(m) for m in view.handed) == [("sow", 1, 11), ("sow", 2, 20)]
            proxy.refuse(True)
            proxy.cut()
            await wait_until(lambda: None if not ha.connected else "still connected", 10)
            await p.publish(TOPIC, doc(3, 30))  # P3
            await q.sow_delete(TOPIC, data=doc(2, 0))
            await p.publish(TOPIC, doc(1, 12))  # P4
            await p.flush()
            proxy.refuse(False)
            await wait_until(lambda: None if view.by_id() == {1: 12, 3: 30} else view.by_id(), 10)
            nursery.cancel_scope.cancel()
        after = [summary(m) for m in view.handed[2:]]
        print("handed over after the reconnect:", after)
        assert after == [("publish", 3, 30), ("publish", 1, 12), ("oof", 2, "deleted")]
        assert (sub.resumes, sub.superseded_dropped, sub.duplicates_dropped) == (1, 1, 1)
        assert sub.resynced == 1
        assert view.by_id() == await sow_by_id(inst.uri)


async def test_a_record_that_left_the_filter_while_away_comes_as_an_oof_match(
    tmp_path: Path,
) -> None:
    """The replay carries only matching messages, so a record updated out of the
    filter while the client was away is found by the check: an ``oof`` with reason
    ``match`` (it still exists), next to one deleted (``deleted``)."""
    async with (
        serve_instance(tmp_path, "sow", extra=SOW_XML) as inst,
        open_fault_proxy("127.0.0.1", inst.port, seed=4) as proxy,
        open_client(inst.uri, "pub") as pub,
    ):
        for i in (1, 2, 3):
            await pub.publish(TOPIC, doc(i, i))
        await pub.flush()
        view = View()
        uri = f"tcp://127.0.0.1:{proxy.listen_port}/amps/json"
        async with (
            open_ha_client("filtered", [uri]) as ha,
            ha.sow_and_subscribe(TOPIC, "/v < 100", options="oof") as sub,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(consume, sub, view)
            await wait_until(lambda: None if len(view.handed) == 3 else "snapshot", 10)
            proxy.refuse(True)
            proxy.cut()
            await wait_until(lambda: None if not ha.connected else "still connected", 10)
            await pub.publish(TOPIC, doc(1, 150))  # out of the filter
            await pub.sow_delete(TOPIC, data=doc(2, 0))
            await pub.publish(TOPIC, doc(3, 30))  # still in it
            await pub.flush()
            proxy.refuse(False)
            await wait_until(lambda: None if view.by_id() == {3: 30} else view.by_id(), 10)
            nursery.cancel_scope.cancel()
        after = sorted(summary(m) for m in view.handed[3:])
        print("handed over after the reconnect:", after)
        assert after == [("oof", 1, "match"), ("oof", 2, "deleted"), ("publish", 3, 30)]
        assert sub.resynced == 2


# ---------------------------------------------------------------------- a pair

SEED = 2811_2026
KEYS = 12


def pair_body(peer: str) -> Callable[[InstanceView], str]:
    def make(view: InstanceView) -> str:
        dest = destination_xml(peer, "hot", True, view.addr(peer))
        return SOW_XML + replication_xml(dest) + DOWNGRADE_XML

    return make


async def test_a_sow_subscription_fails_over_without_a_second_snapshot(
    cluster: Cluster,
) -> None:
    """A feed updates (and now and then deletes) records through the HA client while
    a viewer holds a sow_and_subscribe; A is killed -9 mid-stream and both fail over
    to B. The viewer is handed the snapshot once, then each of the feed's updates
    once (none missed, none twice), and ends with B's State of the World."""
    rng = random.Random(SEED)
    print("seed", SEED)
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.start_all()
    servers = [cluster.uri("A"), cluster.uri("B")]
    view = View()
    deleted: list[int] = []
    published: list[int] = []  # seqs of the feed's publishes (not its deletes)
    states: list[str] = []
    with trio.fail_after(120):
        async with (
            open_ha_client("feed", servers) as feed,
            open_ha_client("viewer", servers, on_state=lambda s, _: states.append(s)) as ha,
        ):
            for i in range(KEYS):
                published.append(await feed.publish(TOPIC, doc(i, 0)))
            await feed.flush(timeout=30)
            snapshot_seq = published[-1]
            async with (
                ha.sow_and_subscribe(TOPIC, options="oof", batch_size=5) as sub,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(consume, sub, view)
                await wait_until(lambda: None if sub.snapshot_done.is_set() else "snapshot", 30)

                async def update(n: int) -> None:
                    key = rng.randrange(KEYS)
                    if n % 25 == 24 and key not in deleted:
                        deleted.append(key)
                        await feed.sow_delete(TOPIC, data=doc(key, 0))
                    else:
                        published.append(await feed.publish(TOPIC, doc(key, n)))
                    await trio.sleep(0.005)  # a steady stream that A's death interrupts

                n = 1
                while len(view.handed) < KEYS + 40:
                    await update(n)
                    n += 1
                await trio.to_thread.run_sync(cluster.kill, "A")
                print(f"A killed after {n - 1} updates, {len(view.handed)} handed over")
                for _ in range(120):
                    await update(n)
                    n += 1
                await feed.flush(timeout=60)
                expected = await sow_by_id(servers[1])
                await wait_until(
                    lambda: (
                        None
                        if view.by_id() == expected
                        else f"viewer {view.by_id()} vs B {expected}"
                    ),
                    timeout=30,
                )
                nursery.cancel_scope.cancel()
    print(
        f"viewer: {len(view.handed)} handed over, resumes {sub.resumes}, duplicates "
        f"dropped {sub.duplicates_dropped}, superseded {sub.superseded_dropped}, resynced "
        f"{sub.resynced}; deleted ids {deleted}"
    )
    assert FAILED_OVER in states and sub.resumes == 1
    snapshot = [m for m in view.handed if m.snapshot]
    assert len(snapshot) == KEYS  # the snapshot once, never again
    # every update the feed published after the snapshot was handed over, once
    marks = [version_of(m.bookmark) for m in view.handed if m.command == "publish"]
    seqs = [v[1] for v in marks if v is not None]
    again = [s for s in seqs if seqs.count(s) > 1]
    flagged = [m for m in view.handed if m.possible_duplicate]
    assert again == [] and flagged == [], (again, flagged)
    assert sorted(seqs) == [s for s in published if s > snapshot_seq]
    # in order per record (one publisher: seqs grow)
    per_key: dict[str, list[int]] = {}
    for m in view.handed:
        v = version_of(m.bookmark)
        if m.command == "publish" and v is not None:
            per_key.setdefault(m.key, []).append(v[1])
    assert all(s == sorted(s) for s in per_key.values())
    assert view.by_id() == await sow_by_id(servers[1])
