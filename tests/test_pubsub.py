"""Publish -> subscribe through an instance served in the test's trio run (real
localhost sockets, the amps_py client library): exact, regex and filtered
subscriptions, duplicates, persisted acks, logon ack after restart."""

from __future__ import annotations

import orjson
import pytest
import trio
import trio.testing
from harness import wait_until
from inprocess import InProcessInstance

from amps_py.client import CommandError, open_client


async def drain(sub, n: int, timeout: float = 10) -> list:  # type: ignore[no-untyped-def]
    return [await sub.get(timeout) for _ in range(n)]


async def test_exact_regex_and_filtered_subscriptions(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        async with (
            sub.subscribe("orders") as exact,
            sub.subscribe("^ord.*") as regex,
            sub.subscribe("orders", filter="/qty > 10 AND /side = 'buy'") as filtered,
            sub.subscribe("trades") as other,
        ):
            docs = [
                {"qty": 5, "side": "buy"},
                {"qty": 50, "side": "buy"},
                {"qty": 50, "side": "sell"},
                {"qty": 11, "side": "buy"},
            ]
            for d in docs:
                await pub.publish("orders", orjson.dumps(d))
            await pub.publish("orderbook", b'{"depth":1}')
            await pub.wait_persisted(pub.seq, timeout=10)

            got_exact = [m.json() for m in await drain(exact, 4)]
            assert got_exact == docs
            got_regex = [(m.topic, m.json()) for m in await drain(regex, 5)]
            assert got_regex == [("orders", d) for d in docs] + [("orderbook", {"depth": 1})]
            got_filtered = [m.json() for m in await drain(filtered, 2)]
            assert got_filtered == [docs[1], docs[3]]
            # nothing else arrives for the filter or for an unrelated topic
            await pub.publish("orders", b'{"qty": 1, "side": "buy"}')
            await pub.publish("orders", b'{"qty": 99, "side": "buy"}')
            assert (await filtered.get(10)).json() == {"qty": 99, "side": "buy"}
            with trio.move_on_after(0.2):
                await other.get(5)
                pytest.fail("a message on 'orders' reached the 'trades' subscription")


async def test_bad_filter_and_bad_regex_are_refused(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "sub") as sub:
        with pytest.raises(CommandError) as info:
            async with sub.subscribe("orders", filter="/qty >> 3"):
                pass
        assert info.value.reason == "bad filter"
        with pytest.raises(CommandError) as info:
            async with sub.subscribe("orders(", filter=None):
                pass
        assert info.value.reason == "bad regex topic"
        # the connection is still usable
        async with sub.subscribe("orders"):
            pass


async def test_duplicates_are_acked_and_discarded(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "pub") as pub, open_client(inproc.uri, "sub") as sub:
        async with sub.subscribe("orders") as live:
            for seq in (1, 2, 3):
                await pub.publish("orders", b'{"n":%d}' % seq, seq=seq)
            await pub.wait_persisted(3)
            # resend 2 and 3 (a publisher retrying after a lost ack), then a new one
            await pub.publish("orders", b'{"n":2}', seq=2)
            await pub.publish("orders", b'{"n":3}', seq=3)
            await pub.publish("orders", b'{"n":4}', seq=4)
            await pub.wait_persisted(4)
            got = [m.json()["n"] for m in await drain(live, 4)]
            assert got == [1, 2, 3, 4]
        async with sub.subscribe("orders", bookmark="0") as replay:
            got = [m.json()["n"] for m in await drain(replay, 4)]
            with trio.fail_after(60):
                await replay.completed.wait()
            assert got == [1, 2, 3, 4]
            with trio.move_on_after(0.2):
                extra = await replay.get(5)
                pytest.fail(f"duplicate stored and replayed: {extra}")


async def test_logon_ack_returns_last_persisted_seq_after_restart(
    inproc: InProcessInstance,
) -> None:
    async with open_client(inproc.uri, "pub-a") as pub:
        assert int(pub.logon_ack["s"]) == 0
        for _ in range(7):
            await pub.publish("orders", b"{}")
        await pub.wait_persisted(7)
    await inproc.restart()
    async with open_client(inproc.uri, "pub-a") as pub:
        ack = pub.logon_ack
        assert int(ack["s"]) == 7
        assert ack["bm"].endswith("|7|")
        assert ack["status"] == "success"
        # the next publish continues after the stored sequence
        seq = await pub.publish("orders", b"{}")
        assert seq == 8
        await pub.wait_persisted(8)
    async with open_client(inproc.uri, "other") as other:
        assert int(other.logon_ack["s"]) == 0


async def test_first_command_must_be_logon(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "x", logon=False) as client:
        with pytest.raises(CommandError) as info:
            await client.command({"c": "publish", "t": "orders", "a": "processed"}, b"{}")
        assert info.value.reason == "logon required"


async def test_second_logon_with_same_name_takes_over(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "same") as first:
        async with open_client(inproc.uri, "same") as second:
            await second.publish_persisted("orders", b"{}")

            def first_closed() -> str | None:
                return None if first.closed is not None else "first connection still open"

            await wait_until(first_closed, 60)


async def test_flush_waits_for_persistence(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "flusher") as pub:
        for _ in range(100):
            await pub.publish("orders", b'{"x":1}', ack=False)
        await pub.flush()
    async with (
        open_client(inproc.uri, "reader") as reader,
        reader.subscribe("orders", bookmark="0") as sub,
    ):
        msgs = [await sub.get(10) for _ in range(100)]
        assert len({m.bookmark for m in msgs}) == 100


async def test_same_name_different_user_is_refused(inproc: InProcessInstance) -> None:
    async with open_client(inproc.uri, "shared-name", user_id="alice") as first:
        with pytest.raises(CommandError) as info:
            async with open_client(inproc.uri, "shared-name", user_id="bob"):
                pass
        assert info.value.reason == "name in use"
        # the first connection is untouched
        await first.publish_persisted("orders", b"{}")


async def test_silent_client_is_disconnected_after_three_heartbeat_intervals(
    inproc: InProcessInstance, virtual_clock: trio.testing.MockClock
) -> None:
    from amps_py.protocol import FrameDecoder, encode_frame

    stream = await trio.open_tcp_stream("127.0.0.1", inproc.port)
    decoder = FrameDecoder()
    await stream.send_all(encode_frame({"c": "logon", "client_name": "sleepy", "a": "processed"}))
    await stream.send_all(encode_frame({"c": "heartbeat", "o": "start,1", "a": "processed"}))
    started = trio.current_time()
    beats = 0
    with trio.fail_after(60):
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            decoder.receive_data(data)
            beats += sum(1 for f in decoder.frames() if f.command == "heartbeat")
    silent_for = trio.current_time() - started
    assert beats >= 1, "the server never sent a heartbeat"
    # grace: two intervals plus one more (1 s each here), then at the next beat
    assert 3 <= silent_for < 10, f"disconnected after {silent_for:.1f} s"
    await stream.aclose()
    assert "07-0042" in inproc.log_text()


async def test_heartbeating_client_stays_connected(
    inproc: InProcessInstance, virtual_clock: trio.testing.MockClock
) -> None:
    async with open_client(inproc.uri, "awake") as client:
        await client.heartbeat(0.5)

        def beats() -> str | None:
            return None if client.heartbeats >= 5 else f"{client.heartbeats} heartbeats so far"

        await wait_until(beats, 60, interval=0.25)  # virtual time: few wake-ups
        assert client.closed is None
        await client.publish_persisted("orders", b"{}")
