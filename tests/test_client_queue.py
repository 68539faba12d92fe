"""Consuming a queue with the client library and ``amps-py subscribe``.

What a user relies on: ``message.ack()`` removes the message from the queue; acks are
batched (``ack_batch_size`` bookmarks in one ``sow_delete``, a partial batch sent after
``ack_timeout``, and everything at the close of the client); ``auto_ack=True``
acknowledges each message when the loop moves past it, and never the one whose
handling raised (another consumer gets it); ``cancel`` returns a message; a refused
acknowledgement is raised by the next call; ``amps-py subscribe --ack`` empties a queue.

The queue is configured as in tests/test_queue.py (its ``queue_xml``, ``publish``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from clirun import run
from harness import security_xml, start_instance, wait_until
from inprocess import InProcessInstance, serve_instance
from test_queue import QUEUE, publish, queue_instance, queue_xml

from amps_py.cli.client import Credentials, explain_refusal
from amps_py.client import AMPSError, Client, CommandError, Message, open_client
from amps_py.protocol import FrameDecoder

BACKLOG_10 = "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>"


class RecordingStream(trio.abc.Stream):
    """Wraps a client's stream and keeps the header of every frame it sends: what the
    client really put on the wire."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.decoder = FrameDecoder()
        self.sent: list[dict[str, Any]] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.decoder.receive_data(bytes(data))
        self.sent.extend(frame.header for frame in self.decoder.frames())
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def acks(self) -> list[dict[str, Any]]:
        return [h for h in self.sent if h.get("c") == "sow_delete"]


def record(client: Client) -> RecordingStream:
    recorder = RecordingStream(client._stream)
    client._stream = recorder  # the reader keeps the inner stream; sends go through
    return recorder


def stats(served: InProcessInstance) -> dict[str, Any]:
    queues = served.instance.queues
    assert queues is not None
    return queues.statistics()[QUEUE]


async def wait_acked(served: InProcessInstance, count: int, timeout: float = 10) -> None:
    await wait_until(
        lambda: None if stats(served)["acked"] == count else f"queue: {stats(served)}",
        timeout=timeout,
    )


def n_of(message: Message) -> int:
    return int(orjson.loads(message.data)["n"])


@asynccontextmanager
async def consumer(served: InProcessInstance, name: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with open_client(served.uri, name, **kwargs) as client:
        yield client


async def test_message_ack_removes_it_and_the_backlog_in_force_is_reported(
    tmp_path: Path,
) -> None:
    async with queue_instance(tmp_path, BACKLOG_10) as served, consumer(served, "c") as client:
        async with client.subscribe(QUEUE, max_backlog=5) as sub:
            assert sub.max_backlog == 5
            await publish(served.port, 5)
            got = []
            for _ in range(5):
                message = await sub.get(10)
                got.append(n_of(message))
                await message.ack()
            await client.flush_acks()
        assert got == [0, 1, 2, 3, 4]
        assert stats(served)["acked"] == 5 and stats(served)["depth"] == 0, stats(served)
        # the queue caps what is asked for; a plain topic is not a queue
        async with client.subscribe(QUEUE, max_backlog=50) as sub:
            assert sub.max_backlog == 10
        async with client.subscribe("plain") as sub:
            assert sub.max_backlog is None
            await client.publish("plain", b'{"n": 1}')
            message = await sub.get(10)
            with pytest.raises(AMPSError, match="not a queue subscription"):
                await message.ack()


async def test_ten_acks_go_in_one_sow_delete_with_batch_size_10(tmp_path: Path) -> None:
    async with (
        queue_instance(tmp_path, BACKLOG_10) as served,
        consumer(served, "c", ack_batch_size=10, ack_timeout=60) as client,
    ):
        wire = record(client)
        async with client.subscribe(QUEUE, max_backlog=10) as sub:
            await publish(served.port, 10)
            messages = [await sub.get(10) for _ in range(10)]
            for message in messages[:9]:
                await message.ack()
            assert wire.acks() == []  # nine batched, nothing sent yet
            await messages[9].ack()
            assert len(wire.acks()) == 1  # the tenth fills the batch: sent at once
            await client.flush_acks()
        (sent,) = wire.acks()
        assert sent["t"] == QUEUE and "o" not in sent
        assert sent["bm"].split(",") == [m.bookmark for m in messages]
        assert stats(served)["acked"] == 10 and stats(served)["depth"] == 0


async def test_ack_timeout_sends_a_partial_batch(tmp_path: Path) -> None:
    async with (
        queue_instance(tmp_path, BACKLOG_10) as served,
        consumer(served, "c", ack_batch_size=10, ack_timeout=0.2) as client,
    ):
        wire = record(client)
        async with client.subscribe(QUEUE, max_backlog=10) as sub:
            await publish(served.port, 3)
            messages = [await sub.get(10) for _ in range(3)]
            started = trio.current_time()
            for message in messages:
                await message.ack()
            assert wire.acks() == []
            await wait_acked(served, 3)  # no flush: the timer sent them
            took = trio.current_time() - started
            print(f"partial batch acknowledged {took:.2f} s after the first ack (timeout 0.2)")
            assert took >= 0.2
            (sent,) = wire.acks()
            assert sent["bm"].split(",") == [m.bookmark for m in messages]


async def test_acks_still_batched_are_sent_when_the_client_closes(tmp_path: Path) -> None:
    async with queue_instance(tmp_path, BACKLOG_10) as served:
        async with consumer(served, "c", ack_batch_size=100, ack_timeout=60) as client:
            async with client.subscribe(QUEUE, max_backlog=10) as sub:
                await publish(served.port, 3)
                for _ in range(3):
                    await (await sub.get(10)).ack()
            # the subscription's end sends the batch before its unsubscribe
            await wait_acked(served, 3)
            await publish(served.port, 1, start=3)
            await client.ack(QUEUE, stats_bookmark_of(served, 3))
        # leaving open_client sent it and waited for the answer
        assert stats(served)["acked"] == 4 and stats(served)["depth"] == 0, stats(served)


def stats_bookmark_of(served: InProcessInstance, n: int) -> str:
    """The bookmark of message ``{"n": n}`` still in the queue (sublet leasing: anyone
    may acknowledge it, leased or not)."""
    queues = served.instance.queues
    assert queues is not None
    state = queues.get(QUEUE).state  # type: ignore[union-attr]
    (mark,) = [m.bookmark for m in state.messages() if orjson.loads(m.payload)["n"] == n]
    return str(mark)


async def test_auto_ack_consumes_20_messages_and_leaves_none(tmp_path: Path) -> None:
    async with queue_instance(tmp_path) as served, consumer(served, "c") as client:
        await publish(served.port, 20)
        got = []
        # backlog 1: the next message comes only once the previous is acknowledged
        async with client.subscribe(QUEUE, auto_ack=True) as sub:
            assert sub.max_backlog == 1
            async for message in sub:
                got.append(n_of(message))
                if len(got) == 20:
                    break  # leaving the loop normally acknowledges the last one too
        assert got == list(range(20))
        await wait_acked(served, 20)
        assert stats(served)["depth"] == 0 and stats(served)["delivered"] == 20


async def test_auto_ack_leaves_the_message_whose_handling_raised_for_another_consumer(
    tmp_path: Path,
) -> None:
    async with queue_instance(tmp_path) as served:
        await publish(served.port, 5)
        handled = []
        with pytest.raises(ValueError, match="cannot handle 2"):
            async with consumer(served, "a") as a, a.subscribe(QUEUE, auto_ack=True) as sub:
                async for message in sub:
                    if n_of(message) == 2:
                        raise ValueError("cannot handle 2")
                    handled.append(n_of(message))
        assert handled == [0, 1]
        assert stats(served)["acked"] == 2  # 0 and 1; not 2, whose handling raised
        got = []
        async with consumer(served, "b") as b, b.subscribe(QUEUE, auto_ack=True) as sub:
            async for message in sub:
                got.append(n_of(message))
                if len(got) == 3:
                    break
        assert got == [2, 3, 4]  # 2 delivered again, to b
        await wait_acked(served, 5)
        assert stats(served)["depth"] == 0 and stats(served)["delivered"] == 6


async def test_a_message_acked_by_hand_is_not_acked_again_automatically(
    tmp_path: Path,
) -> None:
    async with queue_instance(tmp_path) as served, consumer(served, "c") as client:
        wire = record(client)
        await publish(served.port, 2)
        async with client.subscribe(QUEUE, auto_ack=True) as sub:
            first = await sub.get(10)
            await first.ack()
            second = await sub.get(10)
        marks = [h["bm"] for h in wire.acks()]
        assert marks == [first.bookmark, second.bookmark]
        await wait_acked(served, 2)


async def test_auto_ack_on_a_plain_topic_is_refused(tmp_path: Path) -> None:
    async with queue_instance(tmp_path) as served, consumer(served, "c") as client:
        with pytest.raises(AMPSError, match="auto_ack=True needs a queue"):
            async with client.subscribe("plain", auto_ack=True):
                pass


async def test_cancel_returns_the_message_to_the_queue(tmp_path: Path) -> None:
    async with (
        queue_instance(tmp_path) as served,
        consumer(served, "c", ack_batch_size=10, ack_timeout=60) as client,
    ):
        wire = record(client)
        await publish(served.port, 1)
        async with client.subscribe(QUEUE) as sub:
            message = await sub.get(10)
            await message.ack(cancel=True)  # not batched: sent at once, on its own
            assert [(h["bm"], h.get("o")) for h in wire.acks()] == [(message.bookmark, "cancel")]
            again = await sub.get(10)  # back in the queue: delivered again
            assert n_of(again) == 0 and again.bookmark == message.bookmark
            await again.ack()
            await client.flush_acks()
        assert stats(served)["acked"] == 1 and stats(served)["depth"] == 0, stats(served)
        assert stats(served)["cancelled"] == 1, stats(served)


async def test_a_refused_ack_is_raised_by_the_next_call(tmp_path: Path) -> None:
    async with queue_instance(tmp_path) as served, consumer(served, "c") as client:
        await client.ack("plain", "123|1|")  # plain has no SOW and is no queue
        with pytest.raises(CommandError) as refused:
            await client.flush_acks()
        assert refused.value.command == "sow_delete"
        assert refused.value.reason == "invalid topic", refused.value.ack
        await client.flush_acks()  # raised once: nothing more to report
        with pytest.raises(ValueError, match="not both"):
            await client.ack(QUEUE, "1|1|", cancel=True, expire=True)


async def test_an_ack_the_user_may_not_send_is_refused_as_not_entitled(tmp_path: Path) -> None:
    security = security_xml(
        tmp_path,
        {"alice": "alice-Secret-42", "bob": "bob-Secret-42"},
        {"alice": {"read": ".*", "write": ".*"}, "bob": {"read": ".*"}},
    )
    extra = queue_xml() + security
    async with serve_instance(tmp_path, "q", extra=extra) as served:
        uri = served.uri.replace("tcp://", "tcp://alice:alice-Secret-42@")
        async with open_client(uri, "producer") as pub:
            await pub.wait_persisted(await pub.publish(QUEUE, b'{"n": 0}'))
        bob_uri = served.uri.replace("tcp://", "tcp://bob:bob-Secret-42@")
        async with open_client(bob_uri, "bob") as bob, bob.subscribe(QUEUE) as sub:
            message = await sub.get(10)  # bob may read the queue, not acknowledge
            await message.ack()
            with pytest.raises(CommandError) as refused:
                await bob.flush_acks()
        assert refused.value.reason == "not entitled", refused.value.ack
        line = explain_refusal(refused.value, Credentials("bob", "x"), "bob", "PW", QUEUE)
        assert f"user 'bob' may not acknowledge on topic {QUEUE!r}" in line, line
        assert stats(served)["acked"] == 0 and stats(served)["depth"] == 1


def test_cli_subscribe_with_ack_empties_the_queue(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "q", extra=queue_xml(BACKLOG_10))
    try:
        uri = server.uri
        lines = "".join(json.dumps({"n": i}) + "\n" for i in range(20))
        (tmp_path / "work.jsonl").write_text(lines)
        res = run("publish", uri, QUEUE, "--file", str(tmp_path / "work.jsonl"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        # printing only (the default): the message is delivered again afterwards
        res = run("subscribe", uri, QUEUE, "--count", "1", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["data"] == {"n": 0}
        args = ["--ack", "--ack-batch", "3", "--max-backlog", "5", "--count", "20"]
        res = run("subscribe", uri, QUEUE, *args, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        got = [json.loads(line)["data"]["n"] for line in res.stdout.splitlines()]
        assert sorted(got) == list(range(20)), got
        assert f"acknowledged 20 message(s) on {QUEUE}" in res.stderr
        res = run("subscribe", uri, QUEUE, "--timeout", "1", cwd=tmp_path)
        assert res.returncode == 0 and res.stdout == "", (res.stdout, res.stderr)
        assert "stopping after 0 message(s)" in res.stderr
        # --ack on a topic that is not a queue says so
        res = run("subscribe", uri, "plain", "--ack", "--count", "1", cwd=tmp_path)
        assert res.returncode == 1
        assert "'plain' is not a queue" in res.stderr, res.stderr
    finally:
        server.stop()
