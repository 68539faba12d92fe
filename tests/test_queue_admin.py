"""Operating queues: what an operator and a consumer rely on besides delivery.

- ``/amps/instance/queues`` (JSON and XML) shows each queue's configuration, depth,
  leases, backlog, counters and seconds behind, with the AMPS monitoring names;
- ``/metrics`` has the per-queue series;
- ``amps-py admin queues`` prints them as a table that fits 80 columns, ``--json``
  prints the tree, and ``amps-py admin status`` has one line on queues;
- a ``sow`` query on a queue returns the messages in it (filter, ``top_n``, batches,
  stats ack), each with the bookmark a consumer acknowledges, and removes nothing;
- a publish to a queue's name is journaled on its DefaultPublishTarget.

In process (tests/inprocess.py), through the wire protocol, HTTP and the real
``amps-py`` command.
"""

from __future__ import annotations

import io
import json
import re
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from admin_screens import admin_cli, table, words
from harness import wait_until
from inprocess import InProcessInstance, serve_instance
from lxml import etree
from rich.console import Console
from test_queue import QUEUE, WireConsumer, numbers, publish, queue_xml

from amps_py.admin.console import queues_table
from amps_py.protocol import Frame, encode_frame
from amps_py.protocol.sow import SowRecord, split_sow_batch
from amps_py.server.queues import QueueBook
from txlog import Kind

ADMIN_XML = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
BACKLOG_XML = "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog><MaxBacklog>5</MaxBacklog>"


@asynccontextmanager
async def admin_queue_instance(
    tmp_path: Path, queue_extra: str = BACKLOG_XML
) -> AsyncIterator[InProcessInstance]:
    extra = queue_xml(queue_extra) + ADMIN_XML
    async with serve_instance(tmp_path, "qa", extra=extra) as served:
        yield served


def admin_base(served: InProcessInstance) -> str:
    return f"http://127.0.0.1:{served.bound_port('admin')}"


async def http_get(url: str) -> bytes:
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
            return body

    return await trio.to_thread.run_sync(get)


def book_of(served: InProcessInstance) -> QueueBook:
    queues = served.instance.queues
    assert queues is not None
    return queues


async def leased_scene(served: InProcessInstance) -> WireConsumer:
    """4 messages published; a consumer with backlog 2 took 3 and acknowledged the
    first: 3 in the queue, 2 leased, 3 delivered, 1 acked."""
    consumer = await WireConsumer.connect(served.port, "worker")
    await consumer.subscribe(backlog=2)
    await publish(served.port, 4)
    first = await consumer.collect(2)
    assert first == [0, 1]
    # the frames were taken by collect: acknowledge the oldest by its bookmark
    state = book_of(served).get(QUEUE).state  # type: ignore[union-attr]
    oldest = next(state.messages()).bookmark
    stats = await consumer.ack([oldest])
    assert stats.header.get("records_deleted") == 1, stats.header
    assert await consumer.collect(1) == [2]  # its backlog freed: the next one comes
    return consumer


# ---------------------------------------------------------------------- admin tree


async def test_the_admin_tree_shows_each_queue_in_json_and_xml(tmp_path: Path) -> None:
    async with admin_queue_instance(tmp_path) as served:
        consumer = await leased_scene(served)
        base = admin_base(served)
        tree = json.loads(await http_get(f"{base}/amps/instance/queues.json"))
        assert list(tree) == [QUEUE]
        q = tree[QUEUE]
        print(json.dumps(q, indent=1))
        expected = {
            "kind": "distributed",
            "underlying_topic": QUEUE,
            "publish_target": QUEUE,
            "semantics": "at-least-once",
            "depth": 3,
            "leased": 2,
            "owned": 3,
            "subscriptions": 1,
            "backlog_capacity": 2,
            "max_backlog": 5,
            "delivered": 3,
            "acked": 1,
            "returned": 0,
            "cancelled": 0,
            "lease_timeouts": 0,
            "expired": 0,
            "removed_by_peer": 0,
            "transferred_in": 0,
            "transferred_out": 0,
            "proxied_transfer": False,
            # AMPS's names
            "queue_depth": 3,
            "backlog": 2,
            "expired_leases": 0,
        }
        assert {k: q.get(k) for k in expected} == expected
        assert 0 <= q["seconds_behind"] < 60, q
        # the whole tree has it too, and each figure is a path of its own
        whole = json.loads(await http_get(f"{base}/amps/instance.json"))
        assert whole["queues"][QUEUE]["depth"] == 3
        leaf = json.loads(await http_get(f"{base}/amps/instance/queues/{QUEUE}/depth.json"))
        assert leaf == 3
        # XML, like the rest of the tree
        root = etree.fromstring(await http_get(f"{base}/amps/instance/queues.xml"))
        assert root.tag == "queues"
        assert root.findtext(f"{QUEUE}/depth") == "3"
        assert root.findtext(f"{QUEUE}/leased") == "2"
        assert root.findtext(f"{QUEUE}/proxied_transfer") == "false"
        assert root.findtext(f"{QUEUE}/max_backlog") == "5"
        # proxied transfer, once enabled, shows
        book_of(served).set_proxied_transfer(QUEUE, True)
        tree = json.loads(await http_get(f"{base}/amps/instance/queues.json"))
        assert tree[QUEUE]["proxied_transfer"] is True
        await consumer.aclose()


async def test_seconds_behind_is_the_age_of_the_oldest_message_and_0_when_empty(
    tmp_path: Path,
) -> None:
    async with admin_queue_instance(tmp_path) as served:
        book = book_of(served)
        queue = book.get(QUEUE)
        assert queue is not None
        assert queue.seconds_behind(time.time()) == 0.0  # empty
        await publish(served.port, 2)
        arrived = next(queue.state.messages()).arrived_at
        assert queue.seconds_behind(arrived + 42.5) == pytest.approx(42.5)
        # the admin tree reads it with the book's clock: two minutes later
        real = book.clock
        book.clock = lambda: real() + 120
        try:
            tree = json.loads(await http_get(f"{admin_base(served)}/amps/instance/queues.json"))
        finally:
            book.clock = real
        assert 120 <= tree[QUEUE]["seconds_behind"] < 180, tree[QUEUE]
        # once everything is acknowledged, 0 again
        consumer = await WireConsumer.connect(served.port, "worker")
        await consumer.subscribe(backlog=2)
        await consumer.collect(2)
        await consumer.ack([m.bookmark for m in list(queue.state.messages())])
        assert len(queue.state) == 0
        tree = json.loads(await http_get(f"{admin_base(served)}/amps/instance/queues.json"))
        assert tree[QUEUE]["seconds_behind"] == 0.0
        await consumer.aclose()


# ---------------------------------------------------------------------- metrics


def metric(text: str, name: str) -> float:
    """The value of series ``name{instance="qa",queue="work"}`` in a scrape."""
    prefix = f'{name}{{instance="qa",queue="{QUEUE}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"no single {prefix!r} in:\n{text}"
    return float(lines[0][len(prefix) :])


async def test_metrics_have_the_per_queue_series(tmp_path: Path) -> None:
    async with admin_queue_instance(tmp_path) as served:
        consumer = await leased_scene(served)
        text = (await http_get(f"{admin_base(served)}/metrics")).decode()
        figures = {
            "amps_queue_depth": 3,
            "amps_queue_leased": 2,
            "amps_queue_owned": 3,
            "amps_queue_delivered_total": 3,
            "amps_queue_acked_total": 1,
            "amps_queue_returned_total": 0,
            "amps_queue_expired_total": 0,
            "amps_queue_transferred_in_total": 0,
            "amps_queue_transferred_out_total": 0,
        }
        assert {n: metric(text, n) for n in figures} == figures
        assert 0 <= metric(text, "amps_queue_seconds_behind") < 60
        assert "# TYPE amps_queue_delivered_total counter" in text
        assert "# TYPE amps_queue_depth gauge" in text
        # a consumer that goes returns its leases: counted as returned
        await consumer.aclose()
        await wait_until(
            lambda: None if book_of(served).statistics()[QUEUE]["leased"] == 0 else "leased",
            timeout=60,
        )
        text = (await http_get(f"{admin_base(served)}/metrics")).decode()
        assert metric(text, "amps_queue_returned_total") == 2
        assert metric(text, "amps_queue_leased") == 0


async def test_an_instance_without_queues_shows_none(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "plain", extra=ADMIN_XML) as served:
        base = admin_base(served)
        assert json.loads(await http_get(f"{base}/amps/instance/queues.json")) == {}
        assert "amps_queue_" not in (await http_get(f"{base}/metrics")).decode()
        result = await trio.to_thread.run_sync(lambda: admin_cli(base, "queues"))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "no queues are configured"
        status = await trio.to_thread.run_sync(lambda: admin_cli(base, "status"))
        assert "queues:" not in status.stdout


# ---------------------------------------------------------------------- the CLI


async def test_admin_queues_prints_a_table_that_fits_80_columns_and_json(tmp_path: Path) -> None:
    async with admin_queue_instance(tmp_path) as served:
        consumer = await leased_scene(served)
        base = admin_base(served)
        result = await trio.to_thread.run_sync(lambda: admin_cli(base, "queues"))
        assert result.returncode == 0, result.stderr
        print(result.stdout)
        assert max(len(line) for line in result.stdout.splitlines()) <= 80
        rows = table(result.stdout, "queue")
        assert len(rows) == 1
        row = rows[0]
        assert row["queue"] == QUEUE
        # the key columns are always there
        assert (row["depth"], row["leased"], row["acked"]) == ("3", "2", "1"), row
        assert float(row["behind (s)"]) >= 0
        wide = await trio.to_thread.run_sync(lambda: admin_cli(base, "queues", columns=200))
        row = table(wide.stdout, "queue")[0]
        assert row["backlog"] == "2/2 (max 5)" and row["delivered"] == "3", row
        assert row["kind"] == "distributed" and row["underlying topic"] == QUEUE, row
        # --json: the tree, after the subcommand too
        doc = json.loads(
            (await trio.to_thread.run_sync(lambda: admin_cli(base, "queues", "--json"))).stdout
        )
        assert doc[QUEUE]["depth"] == 3 and doc[QUEUE]["expired_leases"] == 0
        # the status screen has one line on queues
        status = await trio.to_thread.run_sync(lambda: admin_cli(base, "status"))
        assert status.returncode == 0, status.stderr
        # (", oldest Ns" joins it once the oldest message waited a second: a slow machine)
        line = re.search(rf"queues: {QUEUE} 3 in queue \(2 leased(, oldest \d+s)?\)", status.stdout)
        assert line is not None, status.stdout
        await consumer.aclose()


@pytest.mark.parametrize("width", [40, 50, 80, 120, 200])
def test_the_queues_table_keeps_its_key_cells_whole_at_any_width(width: int) -> None:
    figures = {
        "kind": "group-local",
        "semantics": "at-most-once",
        "underlying_topic": "orders\\..*",
        "depth": 123456789,
        "leased": 12,
        "owned": 99,
        "backlog_capacity": 40,
        "max_backlog": 100,
        "delivered": 10**9,
        "acked": 999999999,
        "expired": 3,
        "seconds_behind": 3601.25,
        "transferred_in": 1,
        "transferred_out": 2,
        "lease_timeouts": 4,
    }
    name = "orders-for-the-east-coast-desk"
    queues = {name: figures, "q": {**figures, "depth": 0}}
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(queues_table(queues, width))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    print(out)
    assert max(len(line) for line in out.splitlines()) <= width
    flat = words(out)
    # the key columns (queue, depth, leased, acked, behind) are never cut
    for cell in (name, "123456789", "999999999", "3601.2"):
        assert cell in flat.split() or f"{cell}:" in flat.split() or f"{cell}," in flat, cell
    assert "8 lease(s) timed out" in flat  # 4 in each queue
    queues["q"]["proxied_transfer"] = True
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(queues_table(queues, width))
    assert "proxied transfer enabled on q:" in words(console.file.getvalue())  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- sow on a queue


async def sow_query(consumer: WireConsumer, **fields: Any) -> tuple[list[Frame], Frame]:
    """Send a ``sow`` on the queue; returns the frames up to ``group_end`` and the
    ``stats`` ack (waits for ``completed``)."""
    consumer.cids += 1
    cid = f"{consumer.name}-{consumer.cids}"
    header = {"c": "sow", "t": QUEUE, "cid": cid, "query_id": cid, "a": "completed,stats"}
    header.update(fields)
    await consumer.stream.send_all(encode_frame(header))
    with trio.fail_after(60):
        while True:
            acks = [
                f
                for f in consumer.frames
                if f.header.get("c") == "ack" and f.header.get("cid") == cid
            ]
            if any(f.header.get("a") == "completed" for f in acks):
                break
            await consumer.read_some()
    results = [
        f
        for f in consumer.frames
        if f.header.get("query_id") == cid
        and f.header.get("c") in ("group_begin", "sow", "group_end")
    ]
    consumer.frames = [f for f in consumer.frames if f not in results and f not in acks]
    stats = next(f for f in acks if f.header.get("a") == "stats")
    return results, stats


def records(frames: list[Frame]) -> list[SowRecord]:
    return [r for f in frames if f.header.get("c") == "sow" for r in split_sow_batch(f)]


async def test_sow_on_a_queue_returns_its_messages_with_their_bookmarks_and_removes_nothing(
    tmp_path: Path,
) -> None:
    async with admin_queue_instance(tmp_path) as served:
        worker = await WireConsumer.connect(served.port, "worker")
        await worker.subscribe(backlog=1)
        await publish(served.port, 6)
        leased = worker.take_messages() or []
        while not leased:
            await worker.read_some()
            leased = worker.take_messages()
        assert numbers(leased) == [0]
        leased_bm = str(leased[0].header["bm"])
        state = book_of(served).get(QUEUE).state  # type: ignore[union-attr]
        in_queue = [m.bookmark for m in state.messages()]

        viewer = await WireConsumer.connect(served.port, "viewer")
        frames, stats = await sow_query(viewer, bs=4)
        kinds = [f.header["c"] for f in frames]
        assert kinds == ["group_begin", "sow", "sow", "group_end"], kinds  # 4 + 2
        got = records(frames)
        assert [orjson.loads(r.data)["n"] for r in got] == [0, 1, 2, 3, 4, 5]  # txid order
        assert [r.bookmark for r in got] == in_queue
        assert all(r.key == r.bookmark and r.topic == QUEUE for r in got)
        assert got[0].bookmark == leased_bm  # the leased one is there, same bookmark
        h = stats.header
        assert (h["records_returned"], h["topic_matches"], h["matches"]) == (6, 6, 6), h

        # filter and top_n
        frames, stats = await sow_query(viewer, f="/n % 2 = 1", top_n=2, bs=10)
        assert [orjson.loads(r.data)["n"] for r in records(frames)] == [1, 3]
        h = stats.header
        assert (h["records_returned"], h["matches"]) == (2, 3), h

        # nothing was removed or leased by the queries
        assert [m.bookmark for m in state.messages()] == in_queue
        figures = book_of(served).statistics()[QUEUE]
        assert (figures["depth"], figures["leased"], figures["delivered"]) == (6, 1, 1)

        # a bookmark from the query is what acknowledges the message
        three = next(r for r in records(frames) if orjson.loads(r.data)["n"] == 3)
        done = await viewer.ack([three.bookmark])
        assert done.header.get("records_deleted") == 1, done.header
        frames, _ = await sow_query(viewer, bs=10)
        assert [orjson.loads(r.data)["n"] for r in records(frames)] == [0, 1, 2, 4, 5]
        await worker.aclose()
        await viewer.aclose()


# ---------------------------------------------------------------------- DefaultPublishTarget


async def test_a_publish_to_the_queue_name_is_journaled_on_the_default_publish_target(
    tmp_path: Path,
) -> None:
    routed = (
        r"<UnderlyingTopic>orders\..*</UnderlyingTopic>"
        "<DefaultPublishTarget>orders.new</DefaultPublishTarget>"
    )
    async with serve_instance(tmp_path, "qr", extra=queue_xml(routed)) as served:
        watcher = await WireConsumer.connect(served.port, "watcher")
        ack = await watcher.command({"c": "subscribe", "t": "orders.new", "sub_id": "w"})
        assert ack.header.get("status") == "success", ack.header
        worker = await WireConsumer.connect(served.port, "worker")
        await worker.subscribe()

        await publish(served.port, 1)  # to the queue's name
        got = []
        with trio.fail_after(60):
            while not got:
                got = worker.take_messages()
                if not got:
                    await worker.read_some()
        assert numbers(got) == [0] and got[0].header["t"] == QUEUE
        seen = []
        with trio.fail_after(60):
            while not seen:
                seen = watcher.take_messages()
                if not seen:
                    await watcher.read_some()
        assert numbers(seen) == [0] and seen[0].header["t"] == "orders.new"

        journal = served.instance.journal
        assert journal is not None
        published = [r.topic for r in journal.read(0, 100) if r.kind == Kind.PUBLISH]
        assert published == ["orders.new"], published  # never on the queue's name

        # another topic the regex covers feeds the queue too
        from amps_py.client import open_client

        async with open_client(served.uri, "other") as pub:
            seq = await pub.publish("orders.old", orjson.dumps({"n": 1}))
            await pub.wait_persisted(seq)
        await worker.ack([str(got[0].header["bm"])])
        assert await worker.collect(1) == [1]
        await worker.aclose()
        await watcher.aclose()


async def test_without_a_default_publish_target_a_publish_keeps_its_topic(
    tmp_path: Path,
) -> None:
    async with serve_instance(tmp_path, "qp", extra=queue_xml()) as served:
        queues = served.instance.queues
        assert queues is not None and queues.publish_routes() is None
        await publish(served.port, 1)
        journal = served.instance.journal
        assert journal is not None
        assert [r.topic for r in journal.read(0, 100) if r.kind == Kind.PUBLISH] == [QUEUE]


async def test_proxied_transfer_is_switched_by_the_cli_and_the_admin_api(tmp_path: Path) -> None:
    async with admin_queue_instance(tmp_path) as served:
        base = admin_base(served)
        queue = book_of(served).get(QUEUE)
        assert queue is not None and queue.proxied_transfer is False
        done = await trio.to_thread.run_sync(
            lambda: admin_cli(base, "queue", QUEUE, "enable-proxied-transfer")
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"proxied transfer enabled on queue {QUEUE}" in done.stdout, done.stdout
        assert queue.proxied_transfer is True
        tree = orjson.loads(await http_get(f"{base}/amps/instance/queues.json"))
        assert tree[QUEUE]["proxied_transfer"] is True
        done = await trio.to_thread.run_sync(
            lambda: admin_cli(base, "queue", QUEUE, "disable-proxied-transfer")
        )
        assert done.returncode == 0 and queue.proxied_transfer is False, done.stdout
        missing = await trio.to_thread.run_sync(
            lambda: admin_cli(base, "queue", "nope", "enable-proxied-transfer")
        )
        assert missing.returncode != 0
        assert "there is no queue 'nope'; queues: work" in missing.stdout + missing.stderr
        assert "18-0003" in served.log_text()
