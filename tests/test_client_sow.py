"""The client side of SOW (Client.sow, sow_and_subscribe, sow_delete, delta_publish)
against a tiny fake server speaking real frames over real sockets (fake_amps.py):
what a client application relies on before any server supports SOW."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
import trio
from fake_amps import FakeServer, SowFake, fake_server

from amps_py.client import (
    AMPSError,
    CommandError,
    Message,
    SowRecord,
    open_client,
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    sow = SowFake(topics={"orders", "quotes"})
    for i in range(1, 8):
        sow.put("orders", str(i), b'{"id":%d,"qty":%d}' % (i, i * 10), f"c{i}" if i == 3 else "")
    async with fake_server(sow) as server:
        yield server


def sent(server: FakeServer, command: str) -> list[dict[str, object]]:
    return [f.header for f in server.sow.received if f.header["c"] == command]


async def test_sow_returns_every_record_across_batches_in_order(fake: FakeServer) -> None:
    async with open_client(fake.uri, "querier") as client:
        records = await client.sow("orders", batch_size=3)
    assert [r.key for r in records] == ["1", "2", "3", "4", "5", "6", "7"]
    assert records[0] == SowRecord("orders", "1", b'{"id":1,"qty":10}', "", "77|1|")
    assert records[2].correlation_id == "c3"
    assert records[6].json() == {"id": 7, "qty": 70}
    assert records.stats == {"records_returned": 7, "topic_matches": 7, "matches": 7}
    (header,) = sent(fake, "sow")
    assert header["bs"] == 3 and header["t"] == "orders"
    assert header["a"] == "processed,completed,stats"


async def test_sow_sends_the_query_options(fake: FakeServer) -> None:
    async with open_client(fake.uri, "querier") as client:
        records = await client.sow(
            "orders", "/qty > 10", top_n=2, orderby="/qty DESC", skip_n=1, options="timestamp"
        )
        assert [r.key for r in records] == ["1", "2"]
        assert records.stats["matches"] == 7
        by_key = await client.sow("orders", sow_keys=["2", "5", "99"])
        assert [r.key for r in by_key] == ["2", "5"]
        assert await client.sow("quotes") == []
    first, second, third = sent(fake, "sow")
    assert (first["f"], first["top_n"], first["orderby"]) == ("/qty > 10", 2, "/qty DESC")
    assert first["o"] == "skip_n=1,timestamp" and first["bs"] == 10
    assert second["sow_keys"] == "2,5,99"
    assert len({first["query_id"], second["query_id"], third["query_id"]}) == 3


async def test_a_refused_query_raises_with_the_servers_reason(fake: FakeServer) -> None:
    async with open_client(fake.uri, "querier") as client:
        with pytest.raises(CommandError, match="sow failed: invalid topic") as caught:
            await client.sow("not-a-sow-topic")
        assert caught.value.reason == "invalid topic"
        with pytest.raises(CommandError, match="bad filter"):
            await client.sow("orders", "bad")
        with pytest.raises(ValueError, match="batch_size must be between 1 and 10000"):
            await client.sow("orders", batch_size=0)
        # the connection is still good
        assert len(await client.sow("orders")) == 7


async def test_a_damaged_batch_fails_the_query_not_the_connection(fake: FakeServer) -> None:
    async with open_client(fake.uri, "querier") as client:
        fake.sow.damage = True
        with pytest.raises(
            AMPSError, match=r"damaged result batch.*record 1 \(key '1'\) has a wrong l"
        ):
            await client.sow("orders", batch_size=100)
        fake.sow.damage = False
        assert len(await client.sow("orders")) == 7


async def test_a_query_that_times_out_is_stopped_and_its_late_results_dropped(
    fake: FakeServer,
) -> None:
    async with open_client(fake.uri, "querier") as client:
        fake.sow.hold = True
        with pytest.raises(TimeoutError, match=r"no ack for sow within 0\.3 s"):
            await client.sow("orders", timeout=0.3)
        fake.sow.hold = False
        (query,) = sent(fake, "sow")
        with trio.fail_after(60):
            while not sent(fake, "unsubscribe"):
                await trio.sleep(0.01)
        assert sent(fake, "unsubscribe") == [{"c": "unsubscribe", "query_id": query["query_id"]}]
        assert len(await client.sow("orders")) == 7


async def test_sow_and_subscribe_yields_the_snapshot_then_live_messages_and_oofs(
    fake: FakeServer,
) -> None:
    async with (
        open_client(fake.uri, "watcher") as watcher,
        open_client(fake.uri, "writer") as writer,
        watcher.sow_and_subscribe("orders", "/qty > 0", options="oof", batch_size=4) as sub,
    ):
        snapshot = [await sub.get(10) for _ in range(7)]
        assert all(m.snapshot and m.command == "sow" for m in snapshot)
        assert [m.key for m in snapshot] == [str(i) for i in range(1, 8)]
        assert snapshot[2].correlation_id == "c3" and snapshot[0].bookmark == "77|1|"
        assert snapshot[0].sub_id == sub.sub_id and snapshot[0].topic == "orders"
        with trio.fail_after(60):
            await sub.snapshot_done.wait()
            await sub.completed.wait()
        assert (sub.snapshot_size, sub.replayed) == (7, 7)
        with trio.fail_after(60):
            while not sub.stats:
                await trio.sleep(0.01)
        assert sub.stats == {"records_returned": 7, "topic_matches": 7, "matches": 7}

        await writer.publish_persisted("orders", b'{"id":8,"qty":80}')
        live = await sub.get(10)
        assert (live.snapshot, live.command, live.key, live.json()) == (
            False,
            "publish",
            "8",
            {"id": 8, "qty": 80},
        )
        stats = await writer.sow_delete("orders", keys=["3"])
        assert stats == {"records_deleted": 1, "topic_matches": 8, "matches": 1}
        gone = await sub.get(10)
        assert (gone.command, gone.reason, gone.key, gone.snapshot) == (
            "oof",
            "deleted",
            "3",
            False,
        )
        assert gone.correlation_id == "c3" and gone.json() == {"id": 3, "qty": 30}
    (header,) = sent(fake, "sow_and_subscribe")
    assert header["sub_id"] == header["query_id"] == sub.sub_id
    assert (header["f"], header["o"], header["bs"]) == ("/qty > 0", "oof", 4)
    assert {"c": "unsubscribe", "sub_id": sub.sub_id} in sent(fake, "unsubscribe")


async def test_sow_and_subscribe_refused_raises_on_entry(fake: FakeServer) -> None:
    async with open_client(fake.uri, "watcher") as client:
        with pytest.raises(CommandError, match="sow_and_subscribe failed: invalid topic"):
            async with client.sow_and_subscribe("nope"):
                pytest.fail("a refused sow_and_subscribe must not enter its block")
        async with client.sow_and_subscribe("quotes") as sub:  # an empty snapshot
            with trio.fail_after(60):
                await sub.snapshot_done.wait()
            assert sub.snapshot_size == 0


async def test_sow_delete_by_filter_keys_and_data(fake: FakeServer) -> None:
    async with open_client(fake.uri, "deleter") as client:
        by_keys = await client.sow_delete("orders", keys="1,2,99")
        assert by_keys == {"records_deleted": 2, "topic_matches": 7, "matches": 2}
        by_data = await client.sow_delete("orders", data='{"id":4,"qty":0}')
        assert by_data["records_deleted"] == 1
        everything = await client.sow_delete("orders", filter="1=1")
        assert everything == {"records_deleted": 4, "topic_matches": 4, "matches": 4}
        assert await client.sow("orders") == []
        with pytest.raises(CommandError, match="sow_delete failed: invalid topic"):
            await client.sow_delete("nope", filter="1=1")
        with pytest.raises(ValueError, match="exactly one of filter=, keys= or data= \\(got none"):
            await client.sow_delete("orders")
        with pytest.raises(ValueError, match="got filter=, keys="):
            await client.sow_delete("orders", filter="1=1", keys=["1"])
    first, second, third, _ = sent(fake, "sow_delete")
    assert first["sow_keys"] == "1,2,99" and "f" not in first
    assert second["a"] == "processed,stats"
    assert third["f"] == "1=1" and "sow_keys" not in third


async def test_delta_publish_is_sent_as_delta_and_persisted_like_publish(
    fake: FakeServer,
) -> None:
    async with open_client(fake.uri, "delta") as client:
        seq = await client.delta_publish("orders", b'{"id":2,"qty":99}')
        await client.wait_persisted(seq, timeout=10)
        plain = await client.publish("orders", '{"qty":5}', sow_key="explicit-1")
        await client.wait_persisted(plain, timeout=10)
        assert plain == seq + 1
        (record,) = await client.sow("orders", sow_keys="2")
        assert record.json() == {"id": 2, "qty": 99}
        await client.delta_publish("orders", b'{"id":2,"note":"x"}')
        (record,) = await client.sow("orders", sow_keys="2")
        assert record.json() == {"id": 2, "qty": 99, "note": "x"}
    (delta, _) = sent(fake, "delta_publish")
    assert (delta["t"], delta["s"], delta["a"]) == ("orders", seq, "persisted")
    (publish,) = sent(fake, "publish")
    assert publish["k"] == "explicit-1"


def test_message_kind_properties() -> None:
    live = Message({"c": "publish", "t": "t", "sub_id": "s"}, b"{}")
    assert (live.command, live.snapshot, live.key, live.reason) == ("publish", False, "", "")
    oof = Message({"c": "oof", "t": "t", "k": "9", "reason": "expired"}, orjson.dumps({}))
    assert (oof.command, oof.key, oof.reason) == ("oof", "9", "expired")
    assert "oof" in repr(oof)
