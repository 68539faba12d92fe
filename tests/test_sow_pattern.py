"""SOW topics with ``Pattern``: one store (named by ``Name``) holds every topic the
pattern matches, a record per (topic, key), through an instance served in the test's
trio run over real sockets: queries on one topic and on a regex, ``sow_delete`` on one
topic, ``sow_and_subscribe``, ``oof``, delta merges, a restart and a rebuild from the
journal; and the slot keys (:mod:`amps_py.sow.slots`) on their own."""

from __future__ import annotations

import io
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import trio
from clirun import run
from inprocess import InProcessInstance, serve_instance
from rich.console import Console

from amps_py.admin.console import status_screen
from amps_py.client import CommandError, open_client
from amps_py.sow.slots import slot_of, slot_prefix, split_slot

SOW_XML = """
<SOW>
  <Topic><Name>all-orders</Name><Pattern>^orders/</Pattern><MessageType>json</MessageType>
    <Key>/id</Key></Topic>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key></Topic>
</SOW>
"""


@pytest.fixture
async def inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "pat", extra=SOW_XML) as served:
        yield served


async def publish_all(uri: str, messages: list[tuple[str, dict]]) -> None:
    async with open_client(uri, "pub") as pub:
        for topic, doc in messages:
            await pub.publish(topic, orjson.dumps(doc))
        await pub.wait_persisted(pub.seq, timeout=10)


def by_topic(records: list) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in records:
        out.setdefault(r.topic, {})[r.json()["id"]] = r.json()
    return out


TWO_TOPICS = [
    ("orders/eu", {"id": 1, "qty": 1}),
    ("orders/us", {"id": 1, "qty": 100}),
    ("orders/eu", {"id": 2, "qty": 2}),
    ("orders/eu", {"id": 1, "qty": 3}),
]


def test_a_slot_names_its_topic_and_key_whatever_they_hold() -> None:
    for topic, key in [("orders/eu", "42"), ("7:x", "3:abc"), ("", "k"), ("t", "")]:
        slot = slot_of(topic, key)
        assert split_slot(slot) == (topic, key)
        assert slot.startswith(slot_prefix(topic))
    # no topic's prefix is another topic's
    assert not slot_of("ab", "c").startswith(slot_prefix("a"))
    with pytest.raises(ValueError):
        split_slot("not-a-slot")


async def test_the_same_key_under_two_topics_is_two_records(inst: InProcessInstance) -> None:
    await publish_all(inst.uri, TWO_TOPICS)
    async with open_client(inst.uri, "q") as q:
        eu = await q.sow("orders/eu")
        assert {r.topic for r in eu} == {"orders/eu"}
        assert {r.json()["id"]: r.json()["qty"] for r in eu} == {1: 3, 2: 2}
        assert eu.stats["topic_matches"] == 2
        us = await q.sow("orders/us")
        assert [(r.topic, r.json()) for r in us] == [("orders/us", {"id": 1, "qty": 100})]
        # a regex query: every matching topic, each record on its own topic
        every = await q.sow("^orders/", batch_size=10)
        assert by_topic(every) == {
            "orders/eu": {1: {"id": 1, "qty": 3}, 2: {"id": 2, "qty": 2}},
            "orders/us": {1: {"id": 1, "qty": 100}},
        }
        assert every.stats["records_returned"] == 3
        # a regex that matches one of them, and a filter over both
        assert by_topic(await q.sow("/us$")) == {"orders/us": {1: {"id": 1, "qty": 100}}}
        big = await q.sow("orders/.*", filter="/qty > 2")
        assert sorted((r.topic, r.json()["qty"]) for r in big) == [
            ("orders/eu", 3),
            ("orders/us", 100),
        ]
        # a SOW topic without Pattern is there too, and no record of the others
        await q.publish_persisted("quotes", b'{"sym":"A","px":1}', timeout=10)
        assert {r.topic for r in await q.sow(".*")} == {"orders/eu", "orders/us", "quotes"}
        # the same key values give the same k in every topic of the Pattern
        keys = {r.topic: r.key for r in every if r.json()["id"] == 1}
        assert keys["orders/eu"] == keys["orders/us"]


async def test_the_name_is_not_a_topic_and_other_topics_keep_no_sow(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "q") as q:
        with pytest.raises(CommandError) as info:
            await q.sow("all-orders")
        assert info.value.reason == "invalid topic"
        assert "^orders/" in str(info.value) and "regex topic" in str(info.value)
        with pytest.raises(CommandError) as info:
            await q.sow("trades/orders/x")  # searched, but the pattern is anchored
        assert info.value.reason == "invalid topic"


async def test_sow_delete_on_one_topic_leaves_the_others(inst: InProcessInstance) -> None:
    await publish_all(inst.uri, TWO_TOPICS)
    async with open_client(inst.uri, "d") as d, open_client(inst.uri, "s") as s:
        async with s.subscribe("^orders/", options="oof") as live:
            stats = await d.sow_delete("orders/eu", filter="1=1")
            assert stats["records_deleted"] == 2 and stats["topic_matches"] == 2
            oofs = [await live.get(10) for _ in range(2)]
            assert {(m.command, m.topic, m.reason) for m in oofs} == {
                ("oof", "orders/eu", "deleted")
            }
        assert list(await d.sow("orders/eu")) == []
        assert [r.json()["qty"] for r in await d.sow("orders/us")] == [100]
        # by key and by data, on one topic only
        await publish_all(inst.uri, [("orders/eu", {"id": 1, "qty": 5})])
        key = (await d.sow("orders/us"))[0].key
        assert (await d.sow_delete("orders/eu", keys=[key]))["records_deleted"] == 1
        assert [r.json()["qty"] for r in await d.sow("orders/us")] == [100]
        assert (await d.sow_delete("orders/us", data=b'{"id":1}'))["records_deleted"] == 1
        assert list(await d.sow("^orders/")) == []


async def test_sow_delete_with_a_regex_under_a_pattern_is_refused_not_a_no_op(
    inst: InProcessInstance,
) -> None:
    """``orders/.*`` matches the Pattern as a name too; taken literally, the delete
    removed nothing and was journaled and replicated as an empty delete."""
    await publish_all(inst.uri, TWO_TOPICS)
    async with open_client(inst.uri, "d") as d:
        with pytest.raises(CommandError) as info:
            await d.sow_delete("orders/.*", filter="1=1")
        assert info.value.reason == "invalid topic"
        assert "one sow_delete per topic name" in str(info.value), info.value
        assert len(list(await d.sow("^orders/"))) == 3  # (eu, 1), (eu, 2), (us, 1)


async def test_delta_merges_within_its_topic(inst: InProcessInstance) -> None:
    await publish_all(inst.uri, TWO_TOPICS)
    async with open_client(inst.uri, "p") as p:
        await p.delta_publish("orders/us", b'{"id":1,"note":"x"}')
        await p.wait_persisted(p.seq, timeout=10)
        assert [r.json() for r in await p.sow("orders/us")] == [{"id": 1, "qty": 100, "note": "x"}]
        assert {r.json()["id"]: r.json() for r in await p.sow("orders/eu")}[1] == {
            "id": 1,
            "qty": 3,
        }


async def test_sow_and_subscribe_on_one_topic(inst: InProcessInstance) -> None:
    await publish_all(inst.uri, TWO_TOPICS)
    async with open_client(inst.uri, "s") as s, open_client(inst.uri, "p") as p:
        async with s.sow_and_subscribe("orders/us") as sub:
            first = await sub.get(10)
            assert (first.topic, first.json()) == ("orders/us", {"id": 1, "qty": 100})
            await p.publish("orders/eu", b'{"id":9,"qty":9}')
            await p.publish("orders/us", b'{"id":2,"qty":200}')
            live = await sub.get(10)
            assert (live.topic, live.json()) == ("orders/us", {"id": 2, "qty": 200})


async def test_a_restart_keeps_and_a_rebuild_restores_every_topic(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "pat", extra=SOW_XML) as inst:
        await publish_all(inst.uri, TWO_TOPICS + [(f"orders/x{i}", {"id": i}) for i in range(20)])
        async with open_client(inst.uri, "d") as d:
            await d.sow_delete("orders/x3", filter="1=1")
            before = sorted((r.topic, r.key, r.data) for r in await d.sow("^orders/"))
        assert len(before) == 3 + 19
        await inst.restart()
        async with open_client(inst.uri, "q") as q:
            assert sorted((r.topic, r.key, r.data) for r in await q.sow("^orders/")) == before
        await inst.stop()
        store = inst.journal_dir / "sow" / "all-orders"
        assert store.is_dir(), "one store, named by the Pattern topic's Name"
        assert not (inst.journal_dir / "sow" / "orders_eu").exists()
        shutil.rmtree(store)
        await inst.start()
        async with open_client(inst.uri, "q") as q:
            assert sorted((r.topic, r.key, r.data) for r in await q.sow("^orders/")) == before
            assert [r.json()["qty"] for r in await q.sow("orders/us")] == [100]
        assert "17-0001" in inst.log_text()
        stats = inst.statistics()["sow"]
        assert stats["all-orders"]["records"] == len(before)


BOTH_XML = """
<SOW>
  <Topic><Name>all-orders</Name><Pattern>^orders/</Pattern><MessageType>json</MessageType>
    <Key>/id</Key></Topic>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key></Topic>
  <ConflatedTopic><Name>quotes-C</Name><UnderlyingTopic>quotes</UnderlyingTopic>
    <MessageType>json</MessageType><Interval>1s</Interval></ConflatedTopic>
</SOW>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


async def test_admin_status_and_config_check_name_each_kind(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "pat", extra=BOTH_XML) as inst:
        await publish_all(inst.uri, TWO_TOPICS)
        port = inst.bound_port("admin")

        def get(path: str) -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return bytes(r.read())

        tree = orjson.loads(await trio.to_thread.run_sync(get, "/amps/instance"))
        sow = tree["sow"]
        assert sow["all-orders"]["pattern"] == "^orders/"
        assert sow["all-orders"]["records"] == 3
        assert sow["quotes-C"]["conflated_from"] == "quotes"
        assert "pattern" not in sow["quotes"] and "conflated_from" not in sow["quotes"]
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(status_screen(tree, 200))
        text = console.export_text()
        assert "all-orders [Pattern ^orders/] 3 records" in text
        assert "quotes-C [conflated quotes] " in text
    checked = await trio.to_thread.run_sync(
        lambda: run("config", "check", str(tmp_path / "pat.xml"), cwd=tmp_path)
    )
    assert checked.returncode == 0, checked.stderr
    assert (
        "  sow: all-orders (json, Pattern ^orders/), quotes (json), "
        "quotes-C (json, conflated quotes every 1s)"
    ) in checked.stdout
