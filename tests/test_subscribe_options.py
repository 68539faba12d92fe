"""Subscription options through a real instance served in the test's trio run (real
localhost sockets, the amps_py client library): conflated subscriptions deliver at
most one message per key per interval, the latest; options amps-py does not
implement are refused naming them; a subscription without options is unaffected."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from inprocess import InProcessInstance, serve_instance

from amps_py.client import CommandError, open_client

SOW_XML = """
<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
</SOW>
"""

#: the conflation interval of these tests (seconds)
INTERVAL = 0.4


@pytest.fixture
async def inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "opts", extra=SOW_XML) as served:
        yield served


async def _collect(sub: Any, quiet: float) -> list[tuple[float, dict[str, Any]]]:
    """(arrival time, message) until nothing came for ``quiet`` seconds."""
    got: list[tuple[float, dict[str, Any]]] = []
    while True:
        with trio.move_on_after(quiet) as scope:
            message = await sub.get(quiet + 5)
        if scope.cancelled_caught:
            return got
        got.append((trio.current_time(), message.json()))


def _check_conflated(
    got: list[tuple[float, dict[str, Any]]], published: list[dict[str, Any]], field: str
) -> None:
    """Per key: deliveries about an interval apart (half of it, for scheduling jitter),
    each newer than the one before, and the last is the newest published."""
    last: dict[Any, tuple[float, int]] = {}
    for when, doc in got:
        key = doc[field]
        if key in last:
            assert when - last[key][0] >= INTERVAL * 0.5, (key, when - last[key][0])
            assert doc["n"] > last[key][1]
        last[key] = (when, doc["n"])
    newest = {doc[field]: doc["n"] for doc in published}
    assert {key: n for key, (_, n) in last.items()} == newest


async def _burst(pub: Any, topic: str, docs: list[dict[str, Any]]) -> float:
    """Publish ``docs`` back to back; how long it took until all were persisted."""
    start = trio.current_time()
    for doc in docs:
        await pub.publish(topic, orjson.dumps(doc))
    await pub.wait_persisted(pub.seq, timeout=10)
    return trio.current_time() - start


async def test_conflation_by_sow_key_delivers_the_latest_per_key_per_interval(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "pub") as pub, open_client(inst.uri, "sub") as s:
        async with (
            s.subscribe("orders", options=f"conflation={int(INTERVAL * 1000)}ms") as conflated,
            s.subscribe("orders") as plain,
        ):
            docs = [{"id": i % 2, "n": i} for i in range(20)]
            took = await _burst(pub, "orders", docs)
            got = await _collect(conflated, quiet=INTERVAL * 3)
            _check_conflated(got, docs, "id")
            # per key at most one per interval the burst (and the last hold) lasted
            assert len(got) <= 2 * (int(took / INTERVAL) + 2)
            if took < INTERVAL / 2:
                assert sorted(doc["n"] for _, doc in got) == [18, 19]
            # the subscription without options got every message, in order
            everything = [doc for _, doc in await _collect(plain, quiet=0.2)]
            assert everything == docs


async def test_conflation_key_names_the_fields_on_a_topic_without_sow(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "pub") as pub, open_client(inst.uri, "sub") as s:
        opts = f"conflation={INTERVAL}s, conflation_key = [/sym,/venue]"
        async with s.subscribe("prices", options=opts) as conflated:
            docs = [{"sym": "AB"[i % 2], "venue": "X", "n": i} for i in range(12)]
            docs += [{"sym": "A", "venue": "Y", "n": 12}]
            await _burst(pub, "prices", docs)
            got = await _collect(conflated, quiet=INTERVAL * 3)
            last: dict[tuple[str, str], int] = {}
            for _, doc in got:
                last[(doc["sym"], doc["venue"])] = doc["n"]
            assert last == {("A", "X"): 10, ("B", "X"): 11, ("A", "Y"): 12}
            # a later message starts a new interval and comes through
            await _burst(pub, "prices", [{"sym": "A", "venue": "X", "n": 13}])
            later = await _collect(conflated, quiet=INTERVAL * 3)
            assert [doc["n"] for _, doc in later] == [13]


async def test_a_bookmark_replay_is_conflated_too(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "pub") as pub, open_client(inst.uri, "sub") as s:
        docs = [{"sym": "AB"[i % 2], "n": i} for i in range(10)]
        await _burst(pub, "prices", docs)
        opts = "conflation=1s,conflation_key=[/sym]"
        async with s.subscribe("prices", bookmark="0", options=opts) as replayed:
            got = await _collect(replayed, quiet=2.5)
        # the replay reads the ten at once: one interval, the latest of each key
        assert sorted(doc["n"] for _, doc in got) == [8, 9]


async def test_conflation_needs_a_key_it_can_determine(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "sub") as s:
        for topic in ("prices", "ord.*"):
            with pytest.raises(CommandError) as info:
                async with s.subscribe(topic, options="conflation=1s"):
                    pass
            assert info.value.reason == "invalid options"
            assert "conflation_key" in info.value.detail
        with pytest.raises(CommandError) as info:
            async with s.subscribe("orders", options="conflation=soon"):
                pass
        assert info.value.reason == "invalid options" and "interval" in info.value.detail


async def test_unsubscribe_drops_what_conflation_holds(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "pub") as pub, open_client(inst.uri, "sub") as s:
        async with s.subscribe("orders", options="conflation=1s") as conflated:
            await _burst(pub, "orders", [{"id": 1, "n": 1}])
        # unsubscribed while it was held: nothing arrives, the connection still works
        async with s.subscribe("orders") as plain:
            await _burst(pub, "orders", [{"id": 1, "n": 2}])
            assert (await plain.get(10)).json() == {"id": 1, "n": 2}
        with trio.move_on_after(1.3):
            message = await conflated.get(5)
            pytest.fail(f"a held message came after unsubscribe: {message!r}")


@pytest.mark.parametrize(
    "command",
    ["subscribe", "delta_subscribe", "sow", "sow_and_subscribe", "sow_and_delta_subscribe"],
)
async def test_an_unknown_option_gets_a_failure_ack_naming_it(
    inst: InProcessInstance, command: str
) -> None:
    async with open_client(inst.uri, "sub") as s:
        header = {"c": command, "t": "orders", "sub_id": "x", "o": "oof,frobnicate=2"}
        if command == "sow":
            header = {"c": command, "t": "orders", "o": "frobnicate"}
        with pytest.raises(CommandError) as info:
            await s.command({**header, "a": "processed"})
        assert info.value.reason == "invalid options"
        assert "'frobnicate'" in info.value.detail and command in info.value.detail
        # nothing was registered: the sub_id is free, the connection works
        async with s.subscribe("orders", sub_id="x"):
            pass


@pytest.mark.parametrize(
    ("options", "feature"),
    [
        ("projection=[/id],grouping=[/id]", "aggregated subscriptions"),
        ("rate=2x", "rate-limited"),
        ("pause", "paused subscriptions"),
        ("select=[-/,+/id]", "select lists"),
    ],
)
async def test_amps_options_not_implemented_are_refused(
    inst: InProcessInstance, options: str, feature: str
) -> None:
    async with open_client(inst.uri, "sub") as s:
        with pytest.raises(CommandError) as info:
            async with s.subscribe("orders", options=options):
                pass
        assert info.value.reason == "invalid options"
        assert feature in info.value.detail
        assert repr(options.split("=")[0]) in info.value.detail


async def test_sow_and_subscribe_with_conflation(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "pub") as pub, open_client(inst.uri, "sub") as s:
        await _burst(pub, "orders", [{"id": 1, "n": 0}, {"id": 2, "n": 1}])
        async with s.sow_and_subscribe("orders", options=f"conflation={INTERVAL}s") as sub:
            snapshot = []
            while len(snapshot) < 2:
                message = await sub.get(10)
                snapshot.append(message.json())
            assert sorted(d["n"] for d in snapshot) == [0, 1]
            docs = [{"id": 1, "n": i} for i in range(2, 12)]
            await _burst(pub, "orders", docs)
            got = await _collect(sub, quiet=INTERVAL * 3)
            _check_conflated(got, docs, "id")
