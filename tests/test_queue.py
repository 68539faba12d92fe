"""Message queues on one instance, in process, through the wire protocol alone.

What a user relies on: a consumer that subscribes to the queue and acknowledges each
message with ``sow_delete`` by bookmark gets each message once, shared with the other
consumers; a consumer that goes away with messages leased gives them back to the
others (at-least-once), or never sees them again (at-most-once); the subscribe ack says
the backlog in force; acknowledged messages stay gone across a restart, and those not
acknowledged are delivered again; a message delivered MaxDeliveries times is expired
to the dead-letter action.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import wait_until
from inprocess import InProcessInstance, serve_instance

from amps_py.protocol import Frame, FrameDecoder, encode_frame

QUEUE = "work"


def queue_xml(extra: str = "", kind: str = "Queue") -> str:
    return f"<SOW><{kind}><Name>{QUEUE}</Name><MessageType>json</MessageType>{extra}</{kind}></SOW>"


class WireConsumer:
    """A queue consumer written against the wire protocol alone: logon, subscribe to
    the queue, read messages, acknowledge with ``sow_delete`` by bookmark."""

    def __init__(self, stream: trio.SocketStream, name: str) -> None:
        self.stream = stream
        self.name = name
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        self.cids = 0
        self.eof = False

    @classmethod
    async def connect(cls, port: int, name: str) -> WireConsumer:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        consumer = cls(stream, name)
        await consumer.command({"c": "logon", "client_name": name})
        return consumer

    async def command(self, header: dict[str, Any], payload: bytes = b"") -> Frame:
        self.cids += 1
        cid = f"{self.name}-{self.cids}"
        header = {**header, "cid": cid, "a": header.get("a", "processed")}
        await self.stream.send_all(encode_frame(header, payload))
        with trio.fail_after(60):
            while True:
                for frame in self.frames:
                    if frame.header.get("c") == "ack" and frame.header.get("cid") == cid:
                        self.frames.remove(frame)
                        return frame
                await self.read_some()

    async def read_some(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            raise trio.EndOfChannel(f"{self.name}: the server closed the connection")
        self.decoder.receive_data(data)
        self.frames.extend(self.decoder.frames())

    async def subscribe(self, backlog: int | None = None) -> Frame:
        header: dict[str, Any] = {"c": "subscribe", "t": QUEUE, "sub_id": "q"}
        if backlog is not None:
            header["o"] = f"max_backlog={backlog}"
        ack = await self.command(header)
        assert ack.header.get("status") == "success", ack.header
        return ack

    async def collect(self, count: int, timeout: float = 10) -> list[int]:
        """Read until ``count`` messages have arrived (some may have come with an
        ack already); returns their numbers in order of arrival."""
        got: list[int] = []
        with trio.fail_after(timeout):
            while True:
                got.extend(numbers(self.take_messages()))
                if len(got) >= count:
                    return got
                await self.read_some()

    async def next_messages(self, timeout: float = 10) -> list[Frame]:
        """The messages that have arrived, reading until there is at least one."""
        with trio.fail_after(timeout):
            while not (frames := self.take_messages()):
                await self.read_some()
        return frames

    def take_messages(self) -> list[Frame]:
        got = [f for f in self.frames if f.header.get("c") in ("p", "publish")]
        self.frames = [f for f in self.frames if f not in got]
        return got

    async def ack(self, bookmarks: list[str], option: str = "") -> Frame:
        header: dict[str, Any] = {"c": "sow_delete", "t": QUEUE, "bm": ",".join(bookmarks)}
        header["a"] = "processed,stats"
        if option:
            header["o"] = option
        self.cids += 1
        cid = f"{self.name}-{self.cids}"
        header["cid"] = cid
        await self.stream.send_all(encode_frame(header))
        with trio.fail_after(60):
            while True:
                for frame in self.frames:
                    h = frame.header
                    if h.get("c") == "ack" and h.get("cid") == cid and h.get("a") == "stats":
                        self.frames.remove(frame)
                        return frame
                await self.read_some()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def publish(port: int, count: int, start: int = 0) -> None:
    """Publish ``count`` messages ``{"n": i}`` and wait until they are persisted."""
    from amps_py.client import open_client

    async with open_client(f"tcp://127.0.0.1:{port}/amps/json", "producer") as pub:
        seq = 0
        for i in range(start, start + count):
            seq = await pub.publish(QUEUE, orjson.dumps({"n": i}))
        await pub.wait_persisted(seq, timeout=20)


def numbers(frames: list[Frame]) -> list[int]:
    return [orjson.loads(f.payload)["n"] for f in frames]


@asynccontextmanager
async def queue_instance(
    tmp_path: Path, queue_extra: str = "", extra: str = ""
) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(tmp_path, "q", extra=queue_xml(queue_extra) + extra) as served:
        yield served


async def consume(consumer: WireConsumer, into: list[int], stop: trio.Event) -> None:
    """Acknowledge every message as it arrives, until ``stop``."""
    while not stop.is_set():
        got = consumer.take_messages()
        if got:
            into.extend(numbers(got))
            await consumer.ack([str(f.header["bm"]) for f in got])
            continue
        with trio.move_on_after(0.05):  # polling the socket, not synchronising
            await consumer.read_some()


async def test_two_wire_consumers_share_50_messages_each_delivered_once(tmp_path: Path) -> None:
    async with queue_instance(tmp_path) as served:
        a = await WireConsumer.connect(served.port, "a")
        b = await WireConsumer.connect(served.port, "b")
        ack = await a.subscribe()
        assert "max_backlog=1" in str(ack.header.get("o")), ack.header
        await b.subscribe()
        got_a: list[int] = []
        got_b: list[int] = []
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, a, got_a, stop)
            nursery.start_soon(consume, b, got_b, stop)
            await publish(served.port, 50)
            queues = served.instance.queues
            assert queues is not None
            state = queues.get(QUEUE).state  # type: ignore[union-attr]
            await wait_until(
                lambda: (
                    None
                    if len(got_a) + len(got_b) == 50 and len(state) == 0
                    else f"a {len(got_a)}, b {len(got_b)}, {len(state)} in the queue"
                ),
                timeout=60,
            )
            stop.set()
        print(f"a took {len(got_a)}, b took {len(got_b)}")
        assert sorted(got_a + got_b) == list(range(50))
        assert got_a and got_b, "both consumers should have had a share"
        stats = served.instance.queues.statistics()[QUEUE]  # type: ignore[union-attr]
        assert stats["depth"] == 0 and stats["acked"] == 50, stats
        await a.aclose()
        await b.aclose()


async def test_leased_messages_of_a_consumer_that_goes_come_back_to_another(
    tmp_path: Path,
) -> None:
    async with queue_instance(
        tmp_path, "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>"
    ) as served:
        a = await WireConsumer.connect(served.port, "a")
        ack = await a.subscribe(backlog=5)
        assert "max_backlog=5" in str(ack.header.get("o")), ack.header
        await publish(served.port, 8)
        with trio.fail_after(60):
            while len([f for f in a.frames if f.header.get("c") in ("p", "publish")]) < 5:
                await a.read_some()
        leased = numbers(a.take_messages())
        assert leased == [0, 1, 2, 3, 4]  # its backlog: 5 at a time, oldest first
        await a.aclose()  # gone without acknowledging
        b = await WireConsumer.connect(served.port, "b")
        await b.subscribe(backlog=10)
        got = await b.collect(8)
        assert sorted(got) == list(range(8))  # the 5 returned and the 3 never sent
        queues = served.instance.queues
        assert queues is not None
        counts = {
            orjson.loads(m.payload)["n"]: m.deliveries
            for m in queues.get(QUEUE).state.messages()  # type: ignore[union-attr]
        }
        # the ones a had leased were delivered twice, the others once
        assert counts == {n: 2 if n < 5 else 1 for n in range(8)}, counts
        await b.aclose()


async def test_acknowledged_messages_stay_gone_after_a_restart(tmp_path: Path) -> None:
    async with queue_instance(
        tmp_path, "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>"
    ) as served:
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe(backlog=10)
        await publish(served.port, 6)
        with trio.fail_after(60):
            while len([f for f in a.frames if f.header.get("c") in ("p", "publish")]) < 6:
                await a.read_some()
        frames = a.take_messages()
        stats = await a.ack([str(f.header["bm"]) for f in frames[:4]])
        assert stats.header.get("records_deleted") == 4, stats.header
        await a.aclose()
        await served.restart()
        b = await WireConsumer.connect(served.port, "b")
        await b.subscribe(backlog=10)
        got = await b.collect(2)
        assert got == [4, 5]
        await b.aclose()


async def test_at_most_once_messages_are_never_delivered_again(tmp_path: Path) -> None:
    extra = "<Semantics>at-most-once</Semantics>"
    async with queue_instance(tmp_path, extra) as served:
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe()
        await publish(served.port, 5)
        assert await a.collect(5) == [0, 1, 2, 3, 4]  # no backlog to wait on: sent at once
        await a.aclose()  # without acknowledging anything
        b = await WireConsumer.connect(served.port, "b")
        await b.subscribe()
        await publish(served.port, 1, start=5)
        assert await b.collect(1) == [5]  # only the new one
        with trio.move_on_after(0.3):  # nothing else may come
            await b.read_some()
        assert b.take_messages() == []
        queues = served.instance.queues
        assert queues is not None and queues.statistics()[QUEUE]["depth"] == 0
        await b.aclose()


async def test_a_lease_that_times_out_goes_to_another_consumer(tmp_path: Path) -> None:
    async with queue_instance(tmp_path, "<LeasePeriod>300ms</LeasePeriod>") as served:
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe()
        await publish(served.port, 1)
        assert await a.collect(1) == [0]
        b = await WireConsumer.connect(served.port, "b")
        await b.subscribe()
        # a holds it and never acknowledges: after its lease it goes to b
        started = trio.current_time()
        assert await b.collect(1, timeout=5) == [0]
        took = trio.current_time() - started
        print(f"redelivered {took:.2f} s after b subscribed (lease 0.3 s)")
        stats = served.instance.queues.statistics()[QUEUE]  # type: ignore[union-attr]
        assert stats["lease_timeouts"] >= 1 and stats["delivered"] == 2, stats
        await a.aclose()
        await b.aclose()


async def test_past_max_deliveries_a_message_is_expired_to_the_dead_letter_action(
    tmp_path: Path,
) -> None:
    action = (
        "<Actions><Action><On><Module>amps-action-on-sow-expire-message</Module>"
        f"<Options><Topic>{QUEUE}</Topic><MessageType>json</MessageType></Options></On>"
        "<Do><Module>amps-action-do-nothing</Module></Do></Action></Actions>"
    )
    async with queue_instance(tmp_path, "<MaxDeliveries>2</MaxDeliveries>", action) as served:
        for attempt in range(2):
            c = await WireConsumer.connect(served.port, f"c{attempt}")
            await c.subscribe()
            if attempt == 0:
                await publish(served.port, 1)
            assert await c.collect(1) == [0]
            # a consumer that fails on it: it gives it back without acknowledging
            await c.aclose()
        queues = served.instance.queues
        assert queues is not None
        await wait_until(
            lambda: (
                None
                if queues.statistics()[QUEUE]["expired"] == 1
                else f"not expired yet: {queues.statistics()[QUEUE]}"
            ),
            timeout=60,
        )
        assert queues.statistics()[QUEUE]["depth"] == 0
        actions = served.instance.actions
        assert actions is not None
        await wait_until(
            lambda: None if actions.stats[0].runs == 1 else "the expire action did not run",
            timeout=60,
        )


async def test_cancel_returns_a_message_and_a_filter_acknowledges(tmp_path: Path) -> None:
    extra = "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>"
    async with queue_instance(tmp_path, extra) as served:
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe(backlog=10)
        await publish(served.port, 4)
        got = []
        with trio.fail_after(60):
            while len(got) < 4:
                got.extend(a.take_messages())
                if len(got) < 4:
                    await a.read_some()
        first = str(got[0].header["bm"])
        stats = await a.ack([first], "cancel")
        assert stats.header.get("records_deleted") == 0, stats.header
        assert await a.collect(1) == [0]  # cancelled: back in the queue, delivered again
        # acknowledge by filter: the even ones
        done = await a.command({"c": "sow_delete", "t": QUEUE, "f": "/n % 2 = 0", "a": "stats"})
        assert done.header.get("records_deleted") == 2, done.header
        queues = served.instance.queues
        assert queues is not None
        state = queues.get(QUEUE).state  # type: ignore[union-attr]
        left = sorted(orjson.loads(m.payload)["n"] for m in state.messages())
        assert left == [1, 3]
        await a.aclose()


async def test_a_barrier_waits_for_everything_before_it_then_goes_to_every_consumer(
    tmp_path: Path,
) -> None:
    extra = "<BarrierExpression>/barrier = 1</BarrierExpression>"
    async with queue_instance(tmp_path, extra) as served:
        a = await WireConsumer.connect(served.port, "a")
        b = await WireConsumer.connect(served.port, "b")
        await a.subscribe()
        await b.subscribe()
        from amps_py.client import open_client

        async with open_client(served.uri, "producer") as pub:
            await pub.publish(QUEUE, orjson.dumps({"n": 0}))
            await pub.publish(QUEUE, orjson.dumps({"n": 1}))
            await pub.publish(QUEUE, orjson.dumps({"n": 2, "barrier": 1}))
            seq = await pub.publish(QUEUE, orjson.dumps({"n": 3}))
            await pub.wait_persisted(seq)
        # one each of 0 and 1 (backlog 1); the barrier and 3 wait for their acks
        firsts = {"a": await a.collect(1), "b": await b.collect(1)}
        assert sorted(firsts["a"] + firsts["b"]) == [0, 1], firsts
        with trio.move_on_after(0.3):
            await a.read_some()
        assert a.take_messages() == []  # nothing passes the barrier yet
        queues = served.instance.queues
        assert queues is not None
        state = queues.get(QUEUE).state  # type: ignore[union-attr]
        marks = [m.bookmark for m in state.messages() if m.lease is not None]
        assert len(marks) == 2
        await a.ack(marks)  # sublet: anyone may acknowledge
        # now the barrier goes to both, then 3 to one of them
        got_a = await a.collect(1)
        got_b = await b.collect(1)
        assert got_a[0] == 2 and got_b[0] == 2, (got_a, got_b)
        await a.aclose()
        await b.aclose()


async def test_journal_removal_keeps_what_a_queue_still_holds(tmp_path: Path) -> None:
    """A queue sends what it holds from the journal, and a start applies the records
    after its checkpoint, so journal maintenance must not remove a record the queue
    still holds, nor one its checkpoint does not cover yet; once a message is
    acknowledged and checkpointed, it may."""
    async with queue_instance(tmp_path) as served:
        await publish(served.port, 3)
        maintenance = served.instance.maintenance
        assert maintenance is not None
        queues = served.instance.queues
        assert queues is not None
        covered = queues.checkpoint_txids()[QUEUE]
        if covered < served.instance.committed_txid:
            limit, why = maintenance.removable_txid({})
            assert limit <= covered, (limit, covered, why)
        await queues.checkpoint()
        assert queues.checkpoint_txids()[QUEUE] == served.instance.committed_txid
        limit, why = maintenance.removable_txid({})
        oldest = queues.oldest_txids()[QUEUE]
        assert limit == oldest - 1, (limit, why)
        assert any(f"queue {QUEUE} still holds a message" in w for w in why), why
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe()
        for _ in range(3):
            frames = await a.next_messages()
            await a.ack([str(f.header["bm"]) for f in frames])
        await wait_until(
            lambda: None if not queues.oldest_txids() else f"still held: {queues.oldest_txids()}",
            timeout=60,
        )
        # the last acknowledgement's record commits, then a checkpoint covers it
        await wait_until(
            lambda: None
            if queues.applied_txid == served.instance.committed_txid
            else f"queues applied txid {queues.applied_txid} of {served.instance.committed_txid}",
            timeout=60,
        )
        await queues.checkpoint()
        limit, why = maintenance.removable_txid({})
        assert not any("queue" in w for w in why), why
        await a.aclose()


async def test_a_higher_priority_is_delivered_first(tmp_path: Path) -> None:
    async with queue_instance(tmp_path, "<Priority>/p</Priority>") as served:
        from amps_py.client import open_client

        async with open_client(served.uri, "producer") as pub:
            seq = 0
            for n, p in enumerate([1, 5, 3, None, 5]):
                doc = {"n": n} if p is None else {"n": n, "p": p}
                seq = await pub.publish(QUEUE, orjson.dumps(doc))
            await pub.wait_persisted(seq)
        a = await WireConsumer.connect(served.port, "a")
        await a.subscribe()  # backlog 1: one at a time, acknowledged before the next
        order: list[int] = []
        for _ in range(5):
            frames = await a.next_messages()
            order.extend(numbers(frames))
            await a.ack([str(f.header["bm"]) for f in frames])
        # priority 5 (oldest first among equals), then 3, then 1, then none (0)
        assert order == [1, 4, 2, 0, 3]
        await a.aclose()
