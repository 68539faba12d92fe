"""Commands a client library may send beside the everyday ones, answered as AMPS
answers them: ``stats`` acks on subscriptions, ``sow_and_subscribe`` refusing a topic
with no State of the World as ``sow`` does, and ``start_timer``/``stop_timer``.
Through a real instance served in the test's trio run (localhost sockets, the
amps_py client library's raw ``command``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from inprocess import InProcessInstance, serve_instance

from amps_py.client import CommandError, open_client

SOW_XML = """
<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
</SOW>
"""


@pytest.fixture
async def inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "surface", extra=SOW_XML) as served:
        yield served


async def test_a_subscribe_asking_for_stats_gets_a_stats_ack(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "stats") as c:
        acks = await c.command(
            {"c": "subscribe", "t": "plain", "sub_id": "live", "a": "processed,stats"},
            wait=("processed", "stats"),
            timeout=10,
        )
        stats = [a for a in acks if a.get("a") == "stats"]
        assert stats and stats[0]["status"] == "success", acks
        assert stats[0].get("sub_id") == "live", stats


async def test_a_bookmark_replay_counts_what_it_replayed_in_its_stats_ack(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "replayer") as c:
        for n in range(3):
            await c.publish("history", f'{{"n": {n}}}'.encode())
        await c.publish("other", b'{"n": 99}')
        await c.wait_persisted(c.seq, timeout=10)
        acks = await c.command(
            {"c": "subscribe", "t": "history", "sub_id": "r", "bm": "0", "a": "completed,stats"},
            wait=("completed", "stats"),
            timeout=10,
        )
        (stats,) = [a for a in acks if a.get("a") == "stats"]
        assert int(stats["records_returned"]) == 3, stats


async def test_sow_and_subscribe_on_a_topic_without_sow_is_refused_like_sow(
    inst: InProcessInstance,
) -> None:
    async with open_client(inst.uri, "asker") as c:
        with pytest.raises(CommandError) as sow_refusal:
            await c.command({"c": "sow", "t": "plain", "a": "processed"}, timeout=10)
        with pytest.raises(CommandError) as both_refusal:
            await c.command({"c": "sow_and_subscribe", "t": "plain", "a": "processed"}, timeout=10)
        assert sow_refusal.value.reason == both_refusal.value.reason == "invalid topic"
        assert "subscribe instead" in both_refusal.value.detail
        # the refused command left no subscription behind: the SOW topic still works
        async with c.sow_and_subscribe("orders") as sub:
            await c.publish("orders", b'{"id": 1}')
            message = await sub.get(10)
            assert message.json() == {"id": 1}


async def test_stop_timer_reports_the_time_since_start_timer(inst: InProcessInstance) -> None:
    async with open_client(inst.uri, "timer") as c:
        with pytest.raises(CommandError, match="start_timer first"):
            await c.command({"c": "stop_timer", "a": "completed"}, timeout=10)
        (started,) = await c.command({"c": "start_timer", "a": "processed"}, timeout=10)
        assert started["status"] == "success"
        (stopped,) = await c.command({"c": "stop_timer", "a": "completed"}, timeout=10)
        assert stopped["status"] == "success", stopped
        found = re.fullmatch(r"elapsed (\d+\.\d{6}) s", str(stopped.get("reason")))
        assert found is not None, stopped
        assert float(found.group(1)) >= 0
