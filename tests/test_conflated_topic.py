"""``SOW/ConflatedTopic``: a SOW topic of its own holding the latest record of each key
of an underlying SOW topic, updated once per interval, through an instance served in
the test's trio run over real sockets: a burst of updates to one key, queries, the
filter, deletes, ``sow_and_subscribe``, a restart, and what is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
import trio
from inprocess import InProcessInstance, serve_instance

from amps_py.client import CommandError, open_client

INTERVAL = 0.5
SOW_XML = f"""
<SOW>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key></Topic>
  <ConflatedTopic><Name>quotes-C</Name><UnderlyingTopic>quotes</UnderlyingTopic>
    <MessageType>json</MessageType><Interval>{int(INTERVAL * 1000)}ms</Interval>
    <HashIndex><Key>/sym</Key></HashIndex></ConflatedTopic>
  <ReplicaDefinition><Topic>big-quotes</Topic><UnderlyingTopic>quotes</UnderlyingTopic>
    <MessageType>json</MessageType><Interval>{int(INTERVAL * 1000)}ms</Interval>
    <Filter>/px &gt;= 100</Filter></ReplicaDefinition>
</SOW>
"""


@pytest.fixture
async def inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "cf", extra=SOW_XML) as served:
        yield served


async def poll(check: Callable[[], Awaitable[str | None]], timeout: float = 10) -> None:
    """Await ``check`` (what is still wrong, or None) until None or the deadline."""
    deadline = trio.current_time() + timeout
    while (problem := await check()) is not None:
        if trio.current_time() > deadline:
            raise AssertionError(f"after {timeout} s still: {problem}")
        await trio.sleep(0.05)  # polling interval of a condition


async def records(client: object, topic: str) -> dict[str, dict]:
    return {r.json()["sym"]: r.json() for r in await client.sow(topic)}  # type: ignore[attr-defined]


async def test_a_burst_to_one_key_gives_one_update_per_interval(inst: InProcessInstance) -> None:
    burst = 300
    async with open_client(inst.uri, "s") as s, open_client(inst.uri, "p") as p:
        conflated = inst.instance.sow.conflated["quotes-C"]
        async with s.subscribe("quotes-C") as live:
            started = trio.current_time()
            ticks = conflated.ticks  # type: ignore[attr-defined]
            for n in range(burst):
                await p.publish("quotes", orjson.dumps({"sym": "A", "px": n}))
            await p.wait_persisted(p.seq, timeout=10)
            got: list[tuple[float, dict]] = []
            while not got or got[-1][1]["px"] != burst - 1:
                m = await live.get(10)
                assert m.topic == "quotes-C" and m.key
                got.append((trio.current_time(), m.json()))
            elapsed = trio.current_time() - started
            ticked = conflated.ticks - ticks  # type: ignore[attr-defined]
        values = [doc["px"] for _, doc in got]
        assert values == sorted(values) and values[-1] == burst - 1
        # at most one update per key per interval: one per tick, ticks an interval apart
        assert len(got) <= ticked, (len(got), ticked)
        assert ticked <= elapsed / INTERVAL + 1, (ticked, elapsed)
        assert len(got) < burst


async def test_sow_on_the_conflated_topic_and_its_filter(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "p") as p:
        for sym, px in [("A", 5), ("B", 150), ("C", 99), ("A", 7), ("C", 100)]:
            await p.publish("quotes", orjson.dumps({"sym": sym, "px": px}))
        await p.wait_persisted(p.seq, timeout=10)

        async def caught_up() -> str | None:
            have = await records(p, "quotes-C")
            want = {"A": {"sym": "A", "px": 7}, "B": {"sym": "B", "px": 150}}
            want["C"] = {"sym": "C", "px": 100}
            return None if have == want else f"quotes-C holds {have}"

        await poll(caught_up)
        big = await p.sow("big-quotes")
        assert sorted(r.json()["sym"] for r in big) == ["B", "C"]
        assert {r.topic for r in big} == {"big-quotes"}
        # a record that leaves the filter leaves the filtered topic at the next interval
        await p.publish_persisted("quotes", b'{"sym":"B","px":1}', timeout=10)

        async def dropped() -> str | None:
            have = sorted((await records(p, "big-quotes")).keys())
            return None if have == ["C"] else f"big-quotes holds {have}"

        await poll(dropped)
        # a regex query covers conflated topics as SOW topics
        topics = {r.topic for r in await p.sow("^quotes")}
        assert topics == {"quotes", "quotes-C"}


async def test_a_delete_below_reaches_the_conflated_topic(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "p") as p, open_client(inst.uri, "s") as s:
        await p.publish("quotes", b'{"sym":"A","px":1}')
        await p.publish("quotes", b'{"sym":"B","px":2}')
        await p.wait_persisted(p.seq, timeout=10)

        async def both() -> str | None:
            have = sorted(await records(p, "quotes-C"))
            return None if have == ["A", "B"] else f"quotes-C holds {have}"

        await poll(both)
        async with s.subscribe("quotes-C", options="oof") as live:
            await p.sow_delete("quotes", filter="/sym = 'A'")
            oof = await live.get(10)
            assert (oof.command, oof.topic, oof.reason) == ("oof", "quotes-C", "deleted")
            assert oof.json() == {"sym": "A", "px": 1}
        assert sorted(await records(p, "quotes-C")) == ["B"]


async def test_sow_and_subscribe_gets_the_snapshot_then_interval_updates(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "p") as p, open_client(inst.uri, "s") as s:
        await p.publish_persisted("quotes", b'{"sym":"A","px":1}', timeout=10)

        async def there() -> str | None:
            return None if await records(p, "quotes-C") else "quotes-C is empty"

        await poll(there)
        async with s.sow_and_subscribe("quotes-C") as sub:
            first = await sub.get(10)
            assert (first.topic, first.json()) == ("quotes-C", {"sym": "A", "px": 1})
            for n in range(2, 20):
                await p.publish("quotes", orjson.dumps({"sym": "A", "px": n}))
            await p.wait_persisted(p.seq, timeout=10)
            last = first.json()
            while last["px"] != 19:
                m = await sub.get(10)
                assert m.json()["px"] > last["px"]
                last = m.json()


async def test_a_restart_fills_it_from_the_underlying_topic(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "cf", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "p") as p:
            for n in range(30):
                await p.publish("quotes", orjson.dumps({"sym": f"S{n % 10}", "px": 90 + n}))
            await p.wait_persisted(p.seq, timeout=10)
            expected = await records(p, "quotes")
        await inst.restart()
        async with open_client(inst.uri, "q") as q:
            # filled at start, before any interval passed
            assert await records(q, "quotes-C") == expected
            big = {k: v for k, v in expected.items() if v["px"] >= 100}
            assert await records(q, "big-quotes") == big
        assert "17-0005" in inst.log_text()
        stats = inst.statistics()["sow"]
        assert stats["quotes-C"]["records"] == 10


async def test_publish_and_sow_delete_on_it_are_refused(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "p") as p:
        with pytest.raises(CommandError) as info:
            await p.publish_persisted("quotes-C", b'{"sym":"A","px":1}', timeout=10)
        assert info.value.reason == "invalid topic" and "publish to quotes" in str(info.value)
        with pytest.raises(CommandError) as info:
            await p.sow_delete("quotes-C", filter="1=1")
        assert info.value.reason == "invalid topic" and "to quotes" in str(info.value)
