"""Persisted acks and fully_durable subscriptions with a sync or async replication
destination, two instances served in the test's trio run (inprocess.py) and a fault
proxy between them (tests/faultproxy.py, in the same run): a sync destination that is
unreachable holds persisted acks and fully_durable deliveries back until it has
acknowledged; an async one delays nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from cluster import destination_xml, replication_xml
from faultproxy import FaultProxy, open_fault_proxy
from harness import wait_until
from inprocess import REPLICATION_TRANSPORT, InProcessInstance, replicated_by, serve_instance

from amps_py.client import Client, open_client


@dataclass
class Pair:
    """A replicates to B through ``link``."""

    a: InProcessInstance
    b: InProcessInstance
    link: FaultProxy


@asynccontextmanager
async def pair(tmp_path: Path, *, sync: bool) -> AsyncIterator[Pair]:
    """B first (its replication port is the OS's pick), then the proxy in front of
    it, then A replicating to the proxy; one-way, as an operator would configure it."""
    async with serve_instance(tmp_path / "B", "B", **replicated_by("g")) as b:
        async with open_fault_proxy("127.0.0.1", b.bound_port(REPLICATION_TRANSPORT)) as link:
            to_b = destination_xml(
                "B", "g", sync, f"127.0.0.1:{link.listen_port}", exclude=("replicate",)
            )
            async with serve_instance(
                tmp_path / "A", "A", **replicated_by("g", replication_xml(to_b))
            ) as a:
                yield Pair(a, b, link)


def stored(instance: InProcessInstance) -> int:
    return int(instance.statistics()["journal"]["records"])


async def wait_stored(counts: dict[str, tuple[InProcessInstance, int]]) -> None:
    def check() -> str | None:
        wrong = {n: stored(i) for n, (i, want) in counts.items() if stored(i) != want}
        return (
            None
            if not wrong
            else f"stored {wrong}, want { {n: w for n, (_, w) in counts.items()} }"
        )

    await wait_until(check, 30)


async def publish_unacked(pub: Client, n: int) -> int:
    for _ in range(n):
        await pub.publish("orders", b'{"p":"x","i":%d}' % pub.seq)
    return pub.seq


async def replayed(uri: str) -> list[int]:
    """``i`` of every message replayed from EPOCH."""
    out = []
    async with (
        open_client(uri, "replayer") as client,
        client.subscribe("orders", bookmark="0") as sub,
    ):
        with trio.fail_after(30):
            await sub.completed.wait()
        while True:
            with trio.move_on_after(0.3) as quiet:
                msg = await sub.get(30)
            if quiet.cancelled_caught:
                return out
            out.append(msg.json()["i"])


async def test_sync_peer_blackholed_blocks_persisted_acks_until_healed(tmp_path: Path) -> None:
    async with pair(tmp_path, sync=True) as p, open_client(p.a.uri, "pub") as pub:
        await pub.publish_persisted("orders", b'{"p":"x","i":0}')
        p.link.blackhole(True)
        last = await publish_unacked(pub, 20)
        with trio.move_on_after(1.5):
            await pub.wait_persisted(last, timeout=1.5)
            pytest.fail("persisted ack arrived while the sync destination was unreachable")
        assert pub.persisted_seq == 1
        p.link.heal()
        p.link.cut()  # the blackholed connection is dead; make the link reconnect now
        await pub.wait_persisted(last, timeout=30)
        await wait_stored({"A": (p.a, 21), "B": (p.b, 21)})
        assert sorted(await replayed(p.b.uri)) == list(range(21))


async def test_async_peer_blackholed_does_not_delay_acks(tmp_path: Path) -> None:
    async with pair(tmp_path, sync=False) as p:
        p.link.blackhole(True)
        async with open_client(p.a.uri, "pub") as pub:
            last = await publish_unacked(pub, 50)
            await pub.wait_persisted(last, timeout=5)
        p.link.heal()
        p.link.cut()
        await wait_stored({"A": (p.a, 50), "B": (p.b, 50)})


async def test_fully_durable_subscribers_wait_for_the_sync_destination(tmp_path: Path) -> None:
    async with pair(tmp_path, sync=True) as p:
        async with open_client(p.a.uri, "pa") as pub:
            for i in range(3):
                await pub.publish("orders", b'{"p":"pa","i":%d}' % i)
            await pub.wait_persisted(pub.seq, timeout=30)
        async with (
            open_client(p.a.uri, "subs") as subs,
            subs.subscribe("orders", bookmark="0", options="fully_durable") as durable,
            subs.subscribe("orders") as live,
        ):
            assert [(await durable.get(10)).json()["i"] for _ in range(3)] == [0, 1, 2]
            with trio.fail_after(60):
                await durable.completed.wait()
            p.link.blackhole(True)
            async with open_client(p.a.uri, "pa") as pub:
                for i in range(3, 6):
                    await pub.publish("orders", b'{"p":"pa","i":%d}' % i)
                # the plain subscription sees them once the local journal has them ...
                assert [(await live.get(10)).json()["i"] for _ in range(3)] == [3, 4, 5]
                # ... the fully_durable one only after B acknowledged them
                with trio.move_on_after(1):
                    early = await durable.get(5)
                    pytest.fail(f"fully_durable delivered {early} before the sync ack")
                p.link.heal()
                p.link.cut()
                assert [(await durable.get(30)).json()["i"] for _ in range(3)] == [3, 4, 5]
