"""What independent AMPS client libraries rely on, checked with raw frames on a socket
to an instance served in the test's trio run (inprocess.py).

Each test speaks the wire protocol directly (no amps_py client code between the test
and the server) the way an AMPS client library does: heartbeats answered late, failure
acks in the ack type asked for, the completed ack's bookmark, the logon version, every
bookmark form, AMPS's reason strings, zlib transport compression and persisted acks for
publish stores that never ask for them.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from inprocess import InProcessInstance, serve_instance

from amps_py.client import open_client
from amps_py.protocol import FrameDecoder, encode_frame
from amps_py.protocol.compression import Deflater, Inflater
from txlog import publisher_hash


class Wire:
    """A raw connection: send header dicts, read frames (optionally zlib-compressed)."""

    def __init__(self, stream: trio.SocketStream, compressed: bool = False) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.frames: list[Any] = []
        self.deflater = Deflater() if compressed else None
        self.inflater = Inflater() if compressed else None
        #: the processed ack of the last :func:`replay`
        self.processed: dict[str, Any] = {}

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        data = encode_frame(header, payload)
        if self.deflater is not None:
            data = self.deflater.compress(data)
        await self.stream.send_all(data)

    async def next(self, timeout: float = 10) -> Any:
        """The next frame, or None at EOF."""
        with trio.fail_after(timeout):
            while not self.frames:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                pieces = list(self.inflater.feed(data)) if self.inflater else [data]
                for piece in pieces:
                    self.decoder.receive_data(piece)
                    self.frames.extend(self.decoder.frames())
            return self.frames.pop(0)

    async def until(self, pred: Any, timeout: float = 10) -> Any:
        """Skip frames until one satisfies ``pred``; return it."""
        with trio.fail_after(timeout):
            while True:
                frame = await self.next(timeout)
                assert frame is not None, "the server closed the connection"
                if pred(frame.header):
                    return frame

    async def logon(self, name: str, **fields: Any) -> dict[str, Any]:
        await self.send({"c": "logon", "cid": "L", "client_name": name, "a": "processed", **fields})
        frame = await self.until(lambda h: h.get("cid") == "L")
        return dict(frame.header)


@asynccontextmanager
async def wire(
    server: InProcessInstance, name: str = "", compressed: bool = False
) -> AsyncIterator[Wire]:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        w = Wire(stream, compressed)
        if name:
            ack = await w.logon(name)
            assert ack["status"] == "success", ack
        yield w


# ---------------------------------------------------------------------- heartbeats


async def test_a_client_that_answers_each_beat_late_stays_connected(
    inproc: InProcessInstance, virtual_clock: trio.testing.MockClock
) -> None:
    """Beats every 0.5 s; the client answers each one 0.75 s after it arrives (its
    only traffic), as a client on a busy thread does. It must stay connected."""
    async with wire(inproc, "late-beats") as w:
        await w.send({"c": "heartbeat", "o": "start,0.5", "a": "processed", "cid": "h"})
        await w.until(lambda h: h.get("cid") == "h")
        beats = 0
        async with trio.open_nursery() as nursery:

            async def answer_late() -> None:
                await trio.sleep(0.75)
                await w.send({"c": "heartbeat", "o": "beat"})

            while beats < 8:
                frame = await w.next(5)
                assert frame is not None, f"disconnected after {beats} beats"
                if frame.header["c"] == "heartbeat":
                    beats += 1
                    nursery.start_soon(answer_late)
        await w.send({"c": "flush", "a": "processed", "cid": "f"})
        assert (await w.until(lambda h: h.get("cid") == "f")).header["status"] == "success"


# ---------------------------------------------------------------------- failure acks


async def test_refusals_answer_in_every_requested_ack_type(inproc: InProcessInstance) -> None:
    async with wire(inproc, "refused") as w:
        await w.send({"c": "sow_delete", "t": "orders", "f": "/a=1", "a": "stats", "cid": "1"})
        ack = (await w.until(lambda h: h.get("cid") == "1")).header
        assert (ack["a"], ack["status"], ack["reason"]) == ("stats", "failure", "invalid topic")
        await w.send({"c": "sow", "t": "orders", "a": "processed,completed,stats", "cid": "2"})
        kinds = []
        for _ in range(3):
            ack = (await w.until(lambda h: h.get("cid") == "2")).header
            assert ack["status"] == "failure" and ack["reason"] == "invalid topic"
            kinds.append(ack["a"])
        assert kinds == ["processed", "completed", "stats"]
        # no ack type asked for: still answered at once, as processed
        await w.send({"c": "frobnicate", "cid": "3"})
        ack = (await w.until(lambda h: h.get("cid") == "3")).header
        assert (ack["a"], ack["reason"]) == ("processed", "unknown command")
        await w.send({"c": "frobnicate"})
        ack = (await w.until(lambda h: h.get("c") == "ack")).header
        assert ack["reason"] == "unknown command"


REASONS = [
    ({"c": "subscribe", "t": "orders", "f": "/a ==== 1"}, "bad filter"),
    ({"c": "subscribe", "t": "ord(ers"}, "bad regex topic"),
    ({"c": "subscribe", "t": "orders", "bm": "not-a-bookmark"}, "invalid bookmark"),
    (
        {"c": "subscribe", "t": "orders", "bm": "1|2|", "o": "bookmark_not_found=fail"},
        "bookmark not found",
    ),
    ({"c": "sow", "t": "orders"}, "invalid topic"),
    ({"c": "subscribe"}, "no topic"),
    ({"c": "frobnicate"}, "unknown command"),
]


async def test_reason_strings_are_amps_spellings(inproc: InProcessInstance) -> None:
    async with wire(inproc, "reasons") as w:
        await w.send({"c": "subscribe", "t": "orders", "sub_id": "s", "a": "processed", "cid": "0"})
        await w.until(lambda h: h.get("cid") == "0")
        cases = [*REASONS, ({"c": "subscribe", "t": "orders", "sub_id": "s"}, "subid in use")]
        for i, (header, reason) in enumerate(cases, 1):
            await w.send({**header, "a": "processed", "cid": str(i)})
            ack = (await w.until(lambda h, i=i: h.get("cid") == str(i))).header
            assert (ack["status"], ack["reason"]) == ("failure", reason), header
    async with wire(inproc) as w:
        await w.send({"c": "publish", "t": "orders", "a": "processed", "cid": "x"}, b"{}")
        ack = (await w.until(lambda h: h.get("c") == "ack")).header
        assert ack["reason"] == "logon required"


# ---------------------------------------------------------------------- logon


async def test_logon_reads_version_and_answers_a_numeric_server_version(
    inproc: InProcessInstance,
) -> None:
    async with wire(inproc) as w:
        ack = await w.logon("versioned", version="5.3.4.0.deadbeef:python")
    parts = ack["version"].split(".")
    assert [int(p) for p in parts[:4]] >= [5, 3, 0, 0], ack["version"]
    assert "amps-py" in ack["version"]
    assert "5.3.4.0.deadbeef:python" in inproc.log_text()


# ---------------------------------------------------------------------- bookmarks


async def publish(w: Wire, topic: str, seqs: range) -> None:
    for seq in seqs:
        await w.send({"c": "p", "t": topic, "s": seq, "a": "persisted"}, b'{"n":%d}' % seq)
    await w.until(lambda h: h.get("a") == "persisted" and h.get("s") == seqs[-1])


async def replay(w: Wire, topic: str, bm: str, opts: str = "", sub: str = "r") -> tuple[list, dict]:  # type: ignore[type-arg]
    """Messages replayed until the completed ack, and that ack (processed ack kept in
    ``w.processed``)."""
    header = {"c": "subscribe", "t": topic, "bm": bm, "sub_id": sub, "cid": sub}
    header["a"] = "processed,completed"
    if opts:
        header["o"] = opts
    await w.send(header)
    frame = await w.until(lambda h: h.get("cid") == sub and h.get("a") == "processed")
    w.processed = dict(frame.header)
    assert w.processed["status"] == "success", w.processed
    got = []
    while True:
        frame = await w.next()
        assert frame is not None
        h = frame.header
        if h.get("c") == "ack" and h.get("a") == "completed" and h.get("cid") == sub:
            return got, dict(h)
        if h.get("c") == "publish" and h.get("sub_id") == sub:
            got.append(h["bm"])


async def test_completed_ack_carries_the_last_replayed_bookmark(inproc: InProcessInstance) -> None:
    async with wire(inproc, "pub-a") as a, wire(inproc, "pub-b") as b:
        await publish(a, "orders", range(1, 4))
        await publish(b, "trades", range(1, 3))  # the seam record: another topic and publisher
        hash_a = publisher_hash("pub-a")
        async with wire(inproc, "reader") as r:
            got, completed = await replay(r, "orders", "0")
            assert got == [f"{hash_a}|{n}|" for n in (1, 2, 3)]
            assert completed["bm"] == f"{hash_a}|3|", "not the record at the seam"
            # resumed from the last one: nothing replayed; bm is where it resumed
            got, completed = await replay(r, "orders", f"{hash_a}|3|", sub="r2")
            assert got == [] and completed["bm"] == f"{hash_a}|3|"
            # another topic from EPOCH: its own last message
            got, completed = await replay(r, "trades", "0", sub="r3")
            assert len(got) == 2 and completed["bm"] == f"{publisher_hash('pub-b')}|2|"


@pytest.mark.parametrize(
    "stamp",
    [
        "20000101T000000",
        "20000101T000000Z",
        "20000101T000000.5Z",
        "2000-01-01T00:00:00Z",
        "2000-01-01T00:00:00.123456789Z",
    ],
)
async def test_every_documented_timestamp_form_replays(tmp_path: Path, stamp: str) -> None:
    async with (
        serve_instance(tmp_path, "stamps") as server,
        wire(server, "pub") as p,
        wire(server, "reader") as r,
    ):
        await publish(p, "orders", range(1, 3))
        got, _ = await replay(r, "orders", stamp)
        assert len(got) == 2


async def test_bookmark_not_found_is_answered_per_option(inproc: InProcessInstance) -> None:
    async with wire(inproc, "pub") as p, wire(inproc, "reader") as r:
        await publish(p, "orders", range(1, 4))
        missing = "12345|6|"
        got, completed = await replay(r, "orders", missing, sub="now")
        assert got == []
        assert "not in this instance's journal" in r.processed["reason"]
        assert "bookmark_not_found=now" in completed["reason"]
        got, completed = await replay(r, "orders", missing, "bookmark_not_found=epoch", sub="ep")
        assert len(got) == 3
        assert "bookmark_not_found=epoch" in r.processed["reason"]
        await r.send(
            {
                "c": "subscribe",
                "t": "orders",
                "bm": missing,
                "o": "bookmark_not_found=fail",
                "a": "processed",
                "cid": "f",
            }
        )
        ack = (await r.until(lambda h: h.get("cid") == "f")).header
        assert (ack["status"], ack["reason"]) == ("failure", "bookmark not found")
        assert missing in ack["detail"]


# ---------------------------------------------------------------------- compression


async def test_zlib_transport_compression_is_spoken_both_ways(inproc: InProcessInstance) -> None:
    async with wire(inproc, compressed=True) as w:
        ack = await w.logon("squeezed")
        assert ack["status"] == "success"
        await w.send({"c": "subscribe", "t": "orders", "sub_id": "z", "a": "processed", "cid": "s"})
        await w.until(lambda h: h.get("cid") == "s")
        body = b'{"text":"' + b"compressible " * 2000 + b'"}'
        await w.send({"c": "p", "t": "orders", "s": 1, "a": "persisted"}, body)
        got = await w.until(lambda h: h.get("c") == "publish")
        assert got.payload == body
    # the library client speaks it from the URI option
    uri = inproc.uri + "?compression=zlib"
    async with (
        open_client(uri, "lib-zlib") as client,
        client.subscribe("orders", bookmark="0") as sub,
    ):
        assert (await sub.get(10)).data == body
    assert "zlib transport compression" in inproc.log_text()


async def test_a_damaged_zlib_stream_closes_only_that_connection(inproc: InProcessInstance) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", inproc.port)
    async with stream:
        good = zlib.compressobj()
        await stream.send_all(good.compress(encode_frame({"c": "logon", "client_name": "z"})))
        await stream.send_all(b"\x78\x9c" + b"\xff" * 64)  # garbage inside the stream
        with trio.fail_after(60):
            while await stream.receive_some(65536):
                pass
    async with open_client(inproc.uri, "fine") as client:
        await client.publish_persisted("orders", b"{}")


# ---------------------------------------------------------------------- publish stores


async def test_always_send_persisted_acks_drains_stores_that_do_not_ask(tmp_path: Path) -> None:
    transport_extra = "<AlwaysSendPersistedAcks>true</AlwaysSendPersistedAcks>"
    async with (
        serve_instance(tmp_path, "acks", transport_extra=transport_extra) as server,
        wire(server, "store") as w,
    ):
        for seq in (1, 2, 3):
            await w.send({"c": "p", "t": "orders", "s": seq}, b"{}")  # no "a" at all
        ack = (await w.until(lambda h: h.get("a") == "persisted")).header
        assert ack["status"] == "success" and ack["s"] >= 1


async def test_without_the_option_no_unrequested_persisted_acks(inproc: InProcessInstance) -> None:
    async with wire(inproc, "store") as w:
        for seq in (1, 2, 3):
            await w.send({"c": "p", "t": "orders", "s": seq}, b"{}")
        await w.send({"c": "flush", "a": "processed", "cid": "f"})
        frame = await w.until(lambda h: h.get("c") == "ack")
        assert frame.header.get("cid") == "f", frame.header
