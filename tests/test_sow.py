"""State of the World through an instance served in the test's trio run: records by
key, queries (filter, top_n, orderby), delta_publish, sow_delete with oof messages,
sow_and_subscribe with no update lost or duplicated at the seam, and a store rebuilt
from the journal."""

from __future__ import annotations

import io
import random
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import trio
from inprocess import InProcessInstance, serve_instance

from amps_py.client import CommandError, open_client

SOW_XML = """
<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key><Key>/venue</Key></Topic>
</SOW>
"""


@pytest.fixture
async def sow_inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "sow", extra=SOW_XML) as served:
        yield served


async def publish_all(uri: str, docs: list[dict], topic: str = "orders") -> None:
    async with open_client(uri, "pub") as pub:
        for d in docs:
            await pub.publish(topic, orjson.dumps(d))
        await pub.wait_persisted(pub.seq, timeout=10)


async def test_publish_inserts_and_replaces_by_key(sow_inst: InProcessInstance) -> None:
    await publish_all(
        sow_inst.uri,
        [{"id": 1, "qty": 5}, {"id": 2, "qty": 7}, {"id": 1, "qty": 9}, {"id": 3, "qty": 1}],
    )
    async with open_client(sow_inst.uri, "q") as q:
        result = await q.sow("orders", batch_size=2)
        by_id = {r.json()["id"]: r.json() for r in result}
        assert by_id == {1: {"id": 1, "qty": 9}, 2: {"id": 2, "qty": 7}, 3: {"id": 3, "qty": 1}}
        assert len({r.key for r in result}) == 3
        assert result.stats["records_returned"] == 3
        # a composite key: both fields make the record
        await q.publish("quotes", b'{"sym":"A","venue":"X","px":1}')
        await q.publish("quotes", b'{"sym":"A","venue":"Y","px":2}')
        await q.publish("quotes", b'{"sym":"A","venue":"X","px":3}')
        await q.wait_persisted(q.seq, timeout=10)
        quotes = sorted(r.json()["px"] for r in await q.sow("quotes"))
        assert quotes == [2, 3]


async def test_query_with_filter_top_n_and_orderby(sow_inst: InProcessInstance) -> None:
    docs = [{"id": i, "qty": (i * 7) % 10, "side": "buy" if i % 2 else "sell"} for i in range(20)]
    await publish_all(sow_inst.uri, docs)
    async with open_client(sow_inst.uri, "q") as q:
        buys = await q.sow("orders", filter="/side = 'buy'")
        assert sorted(r.json()["id"] for r in buys) == [i for i in range(20) if i % 2]
        top = await q.sow("orders", orderby="/qty DESC, /id ASC", top_n=3)
        expected = sorted(docs, key=lambda d: (-d["qty"], d["id"]))[:3]
        assert [r.json() for r in top] == expected
        assert top.stats["matches"] == 20 and top.stats["records_returned"] == 3
        none = await q.sow("orders", filter="/qty > 100")
        assert list(none) == []


async def test_sow_on_a_topic_without_sow_is_refused(sow_inst: InProcessInstance) -> None:
    async with open_client(sow_inst.uri, "q") as q:
        with pytest.raises(CommandError) as info:
            await q.sow("trades")
        assert info.value.reason == "invalid topic"


async def test_a_message_without_its_key_is_refused(sow_inst: InProcessInstance) -> None:
    async with open_client(sow_inst.uri, "p") as p:
        with pytest.raises(CommandError) as info:
            await p.publish_persisted("orders", b'{"qty": 1}', timeout=10)
        assert info.value.reason == "parse error"
        assert "/id" in str(info.value)


async def test_delta_publish_merges_into_the_stored_record(sow_inst: InProcessInstance) -> None:
    async with open_client(sow_inst.uri, "p") as p, open_client(sow_inst.uri, "s") as s:
        async with s.subscribe("orders") as live:
            await p.publish("orders", b'{"id":1,"qty":5,"px":{"bid":1,"ask":2},"tags":[1,2]}')
            await p.delta_publish("orders", b'{"id":1,"qty":6,"px":{"ask":3},"tags":[9]}')
            await p.delta_publish("orders", b'{"id":1,"note":"new"}')
            await p.delta_publish("orders", b'{"id":2,"qty":1}')  # no record: an insert
            await p.wait_persisted(p.seq, timeout=10)
            merged = {"id": 1, "qty": 6, "px": {"bid": 1, "ask": 3}, "tags": [9], "note": "new"}
            got = [(await live.get(10)).json() for _ in range(4)]
            # the merged message is what subscribers get
            assert got[2] == merged
            assert got[3] == {"id": 2, "qty": 1}
        stored = {r.json()["id"]: r.json() for r in await s.sow("orders")}
        assert stored == {1: merged, 2: {"id": 2, "qty": 1}}


async def test_sow_delete_by_filter_keys_and_data_with_oof(sow_inst: InProcessInstance) -> None:
    await publish_all(sow_inst.uri, [{"id": i, "qty": i} for i in range(10)])
    async with open_client(sow_inst.uri, "d") as d, open_client(sow_inst.uri, "s") as s:
        async with s.subscribe("orders", options="oof") as live:
            stats = await d.sow_delete("orders", filter="/qty >= 7")
            assert stats["records_deleted"] == 3
            oofs = [await live.get(10) for _ in range(3)]
            assert {m.command for m in oofs} == {"oof"}
            assert {m.reason for m in oofs} == {"deleted"}
            assert sorted(m.json()["id"] for m in oofs) == [7, 8, 9]
            keys = {r.json()["id"]: r.key for r in await d.sow("orders")}
            stats = await d.sow_delete("orders", keys=[keys[1], keys[2]])
            assert stats["records_deleted"] == 2
            stats = await d.sow_delete("orders", data=b'{"id":3,"qty":0}')
            assert stats["records_deleted"] == 1
            rest = sorted(r.json()["id"] for r in await d.sow("orders"))
            assert rest == [0, 4, 5, 6]
            got = sorted([(await live.get(10)).json()["id"] for _ in range(3)])
            assert got == [1, 2, 3]


async def test_sow_and_subscribe_loses_and_repeats_nothing_at_the_seam(
    sow_inst: InProcessInstance,
) -> None:
    seed = 1414
    print(f"seed {seed}")
    rng = random.Random(seed)
    keys = 50
    total = 3000
    sent: list[dict] = []

    async def publisher() -> None:
        async with open_client(sow_inst.uri, "pub") as pub:
            for n in range(total):
                doc = {"id": rng.randrange(keys), "n": n}
                sent.append(doc)
                await pub.publish("orders", orjson.dumps(doc))
                if n % 100 == 0:
                    await trio.lowlevel.checkpoint()
            await pub.wait_persisted(pub.seq, timeout=30)

    async with open_client(sow_inst.uri, "s") as s, trio.open_nursery() as nursery:
        nursery.start_soon(publisher)
        while len(sent) < total // 3:
            await trio.sleep(0.01)  # pacing: start the query mid-stream
        state: dict[int, int] = {}
        async with s.sow_and_subscribe("orders", batch_size=10) as sub:
            while True:
                m = await sub.get(30)
                doc = m.json()
                # per key, updates arrive in publish order: never older than what is held
                assert doc["n"] > state.get(doc["id"], -1), (doc, state.get(doc["id"]))
                state[doc["id"]] = doc["n"]
                if len(sent) == total and all(
                    state.get(k) == last for k, last in _last_per_key(sent).items()
                ):
                    break
    assert state == _last_per_key(sent)


def _last_per_key(sent: list[dict]) -> dict[int, int]:
    last: dict[int, int] = {}
    for doc in sent:
        last[doc["id"]] = doc["n"]
    return last


async def test_deliveries_of_a_sow_topic_carry_the_key(sow_inst: InProcessInstance) -> None:
    async with open_client(sow_inst.uri, "p") as p, open_client(sow_inst.uri, "s") as s:
        async with s.subscribe("orders") as live:
            await p.publish("orders", b'{"id":42}')
            m = await live.get(10)
        keys = [r.key for r in await s.sow("orders")]
        assert m.key and keys == [m.key]


async def test_a_deleted_store_is_rebuilt_from_the_journal(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "sow", extra=SOW_XML) as inst:
        await publish_all(inst.uri, [{"id": i, "qty": i} for i in range(100)])
        async with open_client(inst.uri, "d") as d:
            await d.sow_delete("orders", filter="/qty < 10")
            await d.delta_publish("orders", b'{"id":50,"qty":-1}')
            await d.wait_persisted(d.seq, timeout=10)
            before = sorted((r.key, r.data) for r in await d.sow("orders"))
        assert len(before) == 90
        await inst.stop()
        store_dir = inst.journal_dir / "sow"
        assert store_dir.is_dir(), "the SOW stores live under the journal directory"
        shutil.rmtree(store_dir)
        await inst.start()
        async with open_client(inst.uri, "q") as q:
            after = sorted((r.key, r.data) for r in await q.sow("orders"))
        assert after == before
        assert "17-0001" in inst.log_text()


async def test_admin_and_metrics_show_each_sow_topic(tmp_path: Path) -> None:
    admin = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
    async with serve_instance(tmp_path, "sow", extra=SOW_XML + admin) as inst:
        await publish_all(inst.uri, [{"id": i, "pad": "x" * 10} for i in range(25)])
        port = inst.bound_port("admin")

        def get(path: str) -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return bytes(r.read())

        tree = orjson.loads(await trio.to_thread.run_sync(get, "/amps/instance"))
        orders = tree["sow"]["orders"]
        assert orders["records"] == 25
        sizes = [len(orjson.dumps({"id": i, "pad": "x" * 10})) for i in range(25)]
        assert orders["bytes"] == sum(sizes)
        assert tree["sow"]["quotes"]["records"] == 0
        metrics = (await trio.to_thread.run_sync(get, "/metrics")).decode()
        assert 'amps_sow_records{instance="sow",topic="orders"} 25.0' in metrics
        # the console's status screen names each SOW topic with its records
        from rich.console import Console

        from amps_py.admin.console import status_screen

        console = Console(width=100, record=True, file=io.StringIO())
        console.print(status_screen(tree, 100))
        assert "sow: orders 25 records" in console.export_text()


async def test_an_update_that_leaves_a_filter_sends_oof_match(sow_inst: InProcessInstance) -> None:
    async with open_client(sow_inst.uri, "p") as p, open_client(sow_inst.uri, "s") as s:
        async with (
            s.subscribe("orders", filter="/qty > 10", options="oof") as focused,
            s.subscribe("orders", filter="/qty > 10") as plain,
        ):
            await p.publish("orders", b'{"id":1,"qty":50}')
            await p.publish("orders", b'{"id":1,"qty":60}')  # still in focus
            await p.publish("orders", b'{"id":1,"qty":5}')  # leaves the filter
            await p.publish("orders", b'{"id":2,"qty":1}')  # never was in focus
            await p.publish("orders", b'{"id":1,"qty":70}')  # back in focus
            await p.wait_persisted(p.seq, timeout=10)
            got = [await focused.get(10) for _ in range(4)]
            assert [(m.command, m.json()["qty"]) for m in got] == [
                ("publish", 50),
                ("publish", 60),
                ("oof", 5),
                ("publish", 70),
            ]
            assert got[2].reason == "match"
            # without the option: only the matching publishes
            assert [(await plain.get(10)).json()["qty"] for _ in range(3)] == [50, 60, 70]


def test_forged_sow_records_from_a_peer_are_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A replicated record is stored as it came; applying a damaged or forged one to the
    SOW must neither raise (it would stop the instance) nor touch other records."""
    from amps_py.config.model import SowTopicConfig
    from amps_py.server.sowing import SowState
    from txlog import Record
    from txlog.record import Kind

    state = SowState([SowTopicConfig("orders", "json", ("/id",))], tmp_path)
    state.open()
    try:

        def rec(txid: int, payload: bytes, kind: int = 1, key: str = "") -> Record:
            return Record(
                topic="orders", payload=payload, pub_hash=9, seq=txid, txid=txid,
                kind=kind, sow_key=key,
            )  # fmt: skip

        state.apply([rec(1, b'{"id":1}', key="k1")])
        delete = int(Kind.SOW_DELETE)
        state.apply(
            [
                rec(2, b'{"keys": 5}', delete),
                rec(3, b"not json", delete),
                rec(4, b'{"keys": ["' + b"x" * 600 + b'"]}', delete),
                rec(5, b'{"id":2}', key="y" * 600),
            ]
        )
        store = state.topics["orders"].store
        assert store.count == 1 and store.get("k1") is not None
        assert store.applied_txid == 5
        assert caplog.text.count("cannot be applied") == 4
    finally:
        state.close()
