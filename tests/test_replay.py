"""Bookmark replay against an instance served in the test's trio run (inprocess.py):
EPOCH, NOW, bookmark, list, timestamp, range, bookmark_not_found, and the replay/live
seam under concurrent publishing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from harness import wait_until
from inprocess import InProcessInstance, serve_instance

from amps_py.client import Client, CommandError, open_client


async def publish_n(pub: Client, n: int, topic: str = "orders") -> list[int]:
    seqs = [await pub.publish(topic, b'{"n":%d}' % (pub.seq + 1)) for _ in range(n)]
    await pub.wait_persisted(seqs[-1])
    return seqs


async def collect(sub, n: int, timeout: float = 10) -> list[int]:  # type: ignore[no-untyped-def]
    return [(await sub.get(timeout)).json()["n"] for _ in range(n)]


async def assert_quiet(sub, what: str) -> None:  # type: ignore[no-untyped-def]
    with trio.move_on_after(0.3):
        extra = await sub.get(5)
        pytest.fail(f"{what}: unexpected extra message {extra}")


async def test_epoch_now_bookmark_and_list(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        await publish_n(pub, 10)
        marks = {}
        async with sub.subscribe("orders", bookmark="0") as s:
            for _ in range(10):
                m = await s.get(10)
                marks[m.json()["n"]] = m.bookmark
            with trio.fail_after(60):
                await s.completed.wait()
            assert s.completed_bookmark == marks[10]
        assert list(marks) == list(range(1, 11))
        assert len(set(marks.values())) == 10

        async with sub.subscribe("orders", bookmark=marks[4]) as s:
            assert await collect(s, 6) == [5, 6, 7, 8, 9, 10]
            await assert_quiet(s, "bookmark replay")

        async with sub.subscribe("orders", bookmark=f"{marks[7]},{marks[3]}") as s:
            assert await collect(s, 7) == [4, 5, 6, 7, 8, 9, 10]
            await assert_quiet(s, "list replay")

        async with sub.subscribe("orders", bookmark="0|1|") as s:
            with trio.fail_after(60):
                await s.completed.wait()
            await publish_n(pub, 2)
            assert await collect(s, 2) == [11, 12]
            await assert_quiet(s, "NOW")


async def test_timestamp_bookmark(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        await publish_n(pub, 5)
        cut = time.time()
        await publish_n(pub, 5)
        secs = int(cut)
        stamp = (
            time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs)) + f".{int((cut - secs) * 1e6):06d}Z"
        )
        async with sub.subscribe("orders", bookmark=stamp) as s:
            assert await collect(s, 5) == [6, 7, 8, 9, 10]
            await assert_quiet(s, "timestamp replay")
        # a time before the journal starts behaves as EPOCH
        async with sub.subscribe("orders", bookmark="20000101T000000Z") as s:
            assert await collect(s, 10) == list(range(1, 11))
        # a time in the future replays nothing, then goes live
        async with sub.subscribe("orders", bookmark="29990101T000000") as s:
            with trio.fail_after(60):
                await s.completed.wait()
            await publish_n(pub, 1)
            assert await collect(s, 1) == [11]


async def test_range_and_bookmark_not_found(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        await publish_n(pub, 8)
        marks = {}
        async with sub.subscribe("orders", bookmark="0") as s:
            for _ in range(8):
                m = await s.get(10)
                marks[m.json()["n"]] = m.bookmark
        async with sub.subscribe("orders", bookmark=f"[{marks[3]}:{marks[6]}]") as s:
            assert await collect(s, 4) == [3, 4, 5, 6]
            with trio.fail_after(60):
                await s.completed.wait()
            await publish_n(pub, 1)
            await assert_quiet(s, "range end")
        async with sub.subscribe("orders", bookmark=f"({marks[3]}:{marks[6]})") as s:
            assert await collect(s, 2) == [4, 5]
            with trio.fail_after(60):
                await s.completed.wait()

        unknown = "12345|99|"
        async with sub.subscribe("orders", bookmark=unknown) as s:  # default: NOW
            with trio.fail_after(60):
                await s.completed.wait()
            await publish_n(pub, 1)
            assert await collect(s, 1) == [10]
        async with sub.subscribe(
            "orders", bookmark=unknown, options="bookmark_not_found=epoch"
        ) as s:
            assert (await collect(s, 10)) == list(range(1, 11))
        with pytest.raises(CommandError) as info:
            async with sub.subscribe("orders", bookmark=unknown, options="bookmark_not_found=fail"):
                pass
        assert info.value.reason == "bookmark not found"


async def test_bad_bookmark_and_unjournaled_topic_are_refused(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "partial", topics=(("orders.*", "json"),)) as server:
        async with open_client(server.uri, "sub") as sub:
            with pytest.raises(CommandError) as info:
                async with sub.subscribe("orders", bookmark="not-a-bookmark"):
                    pass
            assert info.value.reason == "invalid bookmark"
            with pytest.raises(CommandError) as info:
                async with sub.subscribe("quotes", bookmark="0"):
                    pass
            assert info.value.reason == "invalid topic"
            # live subscriptions on a topic that is not journaled still work
            async with open_client(server.uri, "pub") as pub, sub.subscribe("quotes") as s:
                await pub.publish_persisted("quotes", b'{"n":1}')
                assert (await s.get(10)).json() == {"n": 1}


@pytest.mark.parametrize("start", ["epoch", "bookmark"])
async def test_no_gap_no_duplicate_at_the_seam_while_publishing(
    inproc: InProcessInstance, start: str
) -> None:
    total = 6000
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        await publish_n(pub, 500)
        first_bm = ""
        if start == "bookmark":
            async with sub.subscribe("orders", bookmark="0") as s:
                for _ in range(100):
                    first_bm = (await s.get(10)).bookmark
        expected_first = 1 if start == "epoch" else 101

        async def publisher() -> None:
            while pub.seq < total:
                for _ in range(50):
                    await pub.publish("orders", b'{"n":%d}' % (pub.seq + 1))
                await trio.lowlevel.checkpoint()
            await pub.wait_persisted(total)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher)
            # subscribe while the publisher is running: the seam falls mid-stream
            async with sub.subscribe("orders", bookmark="0" if start == "epoch" else first_bm) as s:
                got = []
                with trio.fail_after(60):
                    while len(got) < total - expected_first + 1:
                        got.append((await s.get(30)).json()["n"])
                assert s.completed.is_set()
                await assert_quiet(s, "after the last message")
        expected = list(range(expected_first, total + 1))
        if got != expected:
            dups = len(got) - len(set(got))
            missing = sorted(set(expected) - set(got))[:10]
            pytest.fail(f"seam broken: {dups} duplicates, first missing {missing}")


async def test_persisted_acks_and_timestamps_on_bookmark_subscriptions(
    inproc: InProcessInstance,
) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        await publish_n(pub, 3)
        async with sub.subscribe(
            "orders", bookmark="0", options="timestamp", acks="processed,completed,persisted"
        ) as s:
            msgs = [await s.get(10) for _ in range(3)]
            assert all(len(m.header["ts"]) == len("20260101T000000.000000Z") for m in msgs)
            await publish_n(pub, 1)
            live = await s.get(10)
            assert live.header["ts"].endswith("Z") and live.bookmark

            def acked() -> str | None:
                if s.persisted_bookmark == live.bookmark:
                    return None
                return f"persisted bookmark is {s.persisted_bookmark!r}, want {live.bookmark!r}"

            await wait_until(acked, 60)
