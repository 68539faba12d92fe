"""``sow_delete`` through the HA client's publish store.

What a user relies on:

- ``ha.sow_delete`` by filter, by keys and by data takes the publisher's next sequence
  number and is kept in the publish store until a persisted ack covers it, in order
  with the publishes around it (a publish made after a delete is never applied before
  it); a delete the server refuses is reported as a refused publish is;
- a delete the server received but had not acknowledged as persisted when it was
  killed (kill -9) is sent again to the other instance after the failover and applied
  there: never lost, and the publish store ends empty.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from inprocess import serve_instance

from amps_py.client import (
    CommandError,
    FilePublishStore,
    MemoryPublishStore,
    open_client,
    open_ha_client,
)

TOPIC = "orders"
SOW_XML = (
    f"<SOW><Topic><Name>{TOPIC}</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)


def doc(i: int, v: int | None = None) -> bytes:
    return orjson.dumps({"id": i, "v": i if v is None else v})


async def sow_ids(uri: str, name: str = "reader") -> dict[int, int]:
    """id -> v of the records in ``uri``'s SOW."""
    async with open_client(uri, name) as client:
        return {
            orjson.loads(r.data)["id"]: orjson.loads(r.data)["v"] for r in await client.sow(TOPIC)
        }


async def sow_keys(uri: str) -> dict[int, str]:
    """id -> SOW key of the records in ``uri``'s SOW."""
    async with open_client(uri, "key-reader") as client:
        return {orjson.loads(r.data)["id"]: r.key for r in await client.sow(TOPIC)}


async def test_sow_deletes_go_through_the_store_in_order_with_publishes(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "sow", extra=SOW_XML) as inst:
        store = MemoryPublishStore()
        async with open_ha_client("deleter", [inst.uri], publish_store=store) as ha:
            await ha.wait_connected(10)
            for i in range(1, 9):
                assert await ha.publish(TOPIC, doc(i)) == i
            await ha.flush(timeout=10)
            keys = await sow_keys(inst.uri)
            assert await ha.sow_delete(TOPIC, filter="/v > 6") == 9  # 7, 8
            assert await ha.sow_delete(TOPIC, keys=[keys[1], keys[2]]) == 10
            assert await ha.sow_delete(TOPIC, data=b'{"id": 3}') == 11
            # a publish after the deletes re-creates 8: it must be applied after them
            assert await ha.publish(TOPIC, doc(8, 80)) == 12
            await ha.flush(timeout=10)
            assert len(store) == 0
            assert await sow_ids(inst.uri) == {4: 4, 5: 5, 6: 6, 8: 80}

            # refused by the server: reported like a refused publish, by its seq
            refused = await ha.sow_delete("no-sow-here", filter="1=1")
            with pytest.raises(CommandError, match="invalid topic"):
                await ha.wait_persisted(refused, timeout=10)
            for bad in ({}, {"filter": "1=1", "keys": "k"}, {"keys": []}):
                with pytest.raises(ValueError, match="sow_delete"):
                    await ha.sow_delete(TOPIC, **bad)


# ---------------------------------------------------------------------- a pair


def pair_body(peer: str, sync: bool) -> Callable[[InstanceView], str]:
    def make(view: InstanceView) -> str:
        return SOW_XML + replication_xml(destination_xml(peer, "hot", sync, view.addr(peer)))

    return make


async def test_a_delete_unacknowledged_when_the_server_is_killed_is_applied_after_failover(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A replicates to B synchronously through a fault proxy, B to A asynchronously.
    Once the records are on both, the A->B link is blackholed: A still takes and
    applies the deletes (its own SOW loses the records) but cannot acknowledge them as
    persisted (its sync peer never confirms). A is killed (-9) right then; the client
    fails over to B, sends the deletes again from its store, B applies them and
    acknowledges them (B's peer is async): nothing lost, the store ends empty."""
    cluster.add_instance("A", "hot", pair_body("B", True))
    cluster.add_instance("B", "hot", pair_body("A", False))
    link = cluster.proxy("A", "B")
    cluster.start_all()
    a, b = cluster.uri("A"), cluster.uri("B")
    store = FilePublishStore(tmp_path / "deleter.store")
    try:
        with trio.fail_after(90):
            async with open_ha_client("deleter", [a, b], publish_store=store) as ha:
                assert await ha.wait_connected(10) == a
                for i in range(1, 11):
                    await ha.publish(TOPIC, doc(i))
                await ha.flush(timeout=30)  # persisted: on A and on B
                keys = await sow_keys(b)
                assert sorted(keys) == list(range(1, 11))
                link.blackhole(True)
                sent = [
                    await ha.sow_delete(TOPIC, filter="/v >= 9"),  # 9, 10
                    await ha.sow_delete(TOPIC, keys=f"{keys[1]},{keys[2]}"),
                    await ha.sow_delete(TOPIC, data=doc(3)),
                    await ha.publish(TOPIC, doc(10, 100)),  # after the deletes
                ]
                assert sent == [11, 12, 13, 14]

                async def a_applied() -> str | None:
                    held = await sow_ids(a, "a-reader")
                    return None if held == {**{i: i for i in range(4, 9)}, 10: 100} else str(held)

                deadline = trio.current_time() + 30
                while (why := await a_applied()) is not None:
                    assert trio.current_time() < deadline, f"A never applied them: {why}"
                    await trio.sleep(0.05)
                # applied on A, not acknowledged: the store still holds all four
                assert [p.seq for p in store.unacked()] == sent
                assert store.discarded_through == 10
                await trio.to_thread.run_sync(cluster.kill, "A")
                print("A killed with 4 commands applied there and not acknowledged")
                await ha.flush(timeout=30)
                assert ha.uri == b
        assert len(store) == 0
    finally:
        store.close()
    held = await sow_ids(b)
    print("B's SOW after the failover:", held)
    assert held == {**{i: i for i in range(4, 9)}, 10: 100}
