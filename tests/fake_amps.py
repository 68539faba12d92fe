"""A tiny AMPS-speaking server for client tests: real sockets (trio, port 0), every
frame it sends built with :mod:`amps_py.protocol.messages`.

:func:`fake_server` serves in the test's trio run; :func:`fake_server_thread` serves
in a thread of its own (for code that calls ``trio.run`` itself, such as the CLI).
Logons are answered; every other command goes to the :class:`SowFake` given (or is
only recorded). :class:`SowFake` keeps a last-value store per topic, keyed by the ``k``
header or the payload's ``/id``, and answers ``sow``, ``sow_and_subscribe``,
``sow_delete``, ``publish`` and ``delta_publish`` (a shallow merge) the way AMPS
orders its answers: processed ack, ``group_begin``, batches of ``bs`` records,
``group_end``, completed ack, stats ack. It is a stand-in for the real server, not a
model of it: filters other than ``1=1`` match everything except the filter ``bad``
(refused with ``bad filter``), and ``orderby`` is ignored.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from amps_py.protocol import Frame, FrameDecoder, messages


class FakeConnection:
    """One client connection to the fake: what it sent, and a way to answer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.name = ""

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))


@dataclass
class Subscriber:
    conn: FakeConnection
    sub_id: str
    topic: str
    oof: bool


@dataclass
class SowFake:
    """The SOW behaviour of the fake (see the module docstring).

    ``topics`` are the SOW topics; a query on any other topic is refused with
    ``invalid topic``. ``received`` holds every frame after the logons; ``hold``
    makes queries answer only their processed ack (for timeouts), and ``damage``
    damages every batch (its first record's ``l`` made too long).
    """

    topics: set[str]
    store: dict[str, dict[str, tuple[bytes, str, str]]] = field(default_factory=dict)
    received: list[Frame] = field(default_factory=list)
    subscribers: list[Subscriber] = field(default_factory=list)
    damage: bool = False
    hold: bool = False
    _txid: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def put(self, topic: str, key: str, payload: bytes, correlation_id: str = "") -> str:
        """Store a record directly; returns its bookmark."""
        bookmark = f"77|{next(self._txid)}|"
        self.store.setdefault(topic, {})[key] = (payload, correlation_id, bookmark)
        return bookmark

    async def handle(self, conn: FakeConnection, frame: Frame) -> None:
        self.received.append(frame)
        header = frame.header
        handler = getattr(self, "on_" + header["c"], None)
        if handler is not None:
            await handler(conn, header, frame.payload)

    # ------------------------------------------------------------------ commands
    async def on_publish(self, conn: FakeConnection, header: dict[str, Any], data: bytes) -> None:
        await self._store_and_deliver(conn, header, data, merge=False)

    async def on_delta_publish(
        self, conn: FakeConnection, header: dict[str, Any], data: bytes
    ) -> None:
        await self._store_and_deliver(conn, header, data, merge=True)

    async def _store_and_deliver(
        self, conn: FakeConnection, header: dict[str, Any], data: bytes, merge: bool
    ) -> None:
        topic = header["t"]
        key = str(header.get("k") or orjson.loads(data)["id"])
        stored = self.store.get(topic, {}).get(key)
        if merge and stored is not None:
            data = orjson.dumps({**orjson.loads(stored[0]), **orjson.loads(data)})
        bookmark = self.put(topic, key, data, str(header.get("x", "")))
        for sub in self.subscribers:
            if sub.topic == topic:
                head = (
                    messages.topic_head(topic)
                    + messages.sub_id_part(sub.sub_id)
                    + messages.bookmark_part(bookmark)
                    + b',"k":' + orjson.dumps(key)
                )  # fmt: skip
                await sub.conn.send(messages.frame_head(head, len(data)) + data)
        if "persisted" in str(header.get("a", "")):
            await conn.send(messages.persisted_ack(header["s"], 77))

    async def on_sow(self, conn: FakeConnection, header: dict[str, Any], _: bytes) -> None:
        await self._query(conn, header, subscribe=False)

    async def on_sow_and_subscribe(
        self, conn: FakeConnection, header: dict[str, Any], _: bytes
    ) -> None:
        await self._query(conn, header, subscribe=True)

    async def _query(self, conn: FakeConnection, header: dict[str, Any], subscribe: bool) -> None:
        topic = header["t"]
        query_id = header.get("query_id") or header.get("cid", "")
        sub_id = header.get("sub_id") if subscribe else None
        if topic not in self.topics or header.get("f") == "bad":
            reason = "invalid topic" if topic not in self.topics else "bad filter"
            await self._acks(conn, header, ("processed", "completed", "stats"), reason=reason)
            return
        await self._acks(conn, header, ("processed",))
        if self.hold:
            return
        records = list(self.store.get(topic, {}).items())
        if header.get("sow_keys"):
            wanted = header["sow_keys"].split(",")
            records = [r for r in records if r[0] in wanted]
        matches = len(records)
        if "top_n" in header:
            records = records[: header["top_n"]]
        await conn.send(messages.group_begin(query_id))
        size = header.get("bs", 1)
        for start in range(0, len(records), size):
            chunk = [
                (key, payload, x, bm, 0) for key, (payload, x, bm) in records[start : start + size]
            ]
            frame = messages.sow_batch(topic, query_id, chunk, sub_id=sub_id)
            if self.damage:  # the first record's l gets a leading 1: too long
                body = frame[4:].replace(b'"l":', b'"l":1', 1)
                frame = len(body).to_bytes(4, "big") + body
            await conn.send(frame)
        if subscribe:  # atomic enough here: nothing else runs between these sends
            oof = "oof" in str(header.get("o", "")).split(",")
            self.subscribers.append(Subscriber(conn, str(sub_id), topic, oof))
        await conn.send(messages.group_end(query_id))
        stats = {
            "records_returned": len(records),
            "topic_matches": len(self.store.get(topic, {})),
            "matches": matches,
        }
        fields: dict[str, Any] = {"query_id": query_id}
        if sub_id is not None:
            fields["sub_id"] = sub_id
        await self._acks(conn, header, ("completed",), **fields)
        await self._acks(conn, header, ("stats",), **fields, **stats)

    async def on_sow_delete(
        self, conn: FakeConnection, header: dict[str, Any], data: bytes
    ) -> None:
        topic = header["t"]
        if topic not in self.topics:
            await self._acks(conn, header, ("processed", "stats"), reason="invalid topic")
            return
        records = self.store.get(topic, {})
        if "sow_keys" in header:
            keys = [k for k in header["sow_keys"].split(",") if k in records]
        elif "f" in header:
            keys = list(records) if header["f"] == "1=1" else []
        else:
            keys = [k for k in [str(orjson.loads(data)["id"])] if k in records]
        total = len(records)
        for key in keys:
            payload, x, _ = records.pop(key)
            for sub in self.subscribers:
                if sub.topic == topic and sub.oof:
                    await sub.conn.send(
                        messages.oof(topic, sub.sub_id, key, "deleted", payload, x or None)
                    )
        await self._acks(conn, header, ("processed",))
        stats = {"records_deleted": len(keys), "topic_matches": total, "matches": len(keys)}
        await self._acks(conn, header, ("stats",), **stats)

    async def on_unsubscribe(self, conn: FakeConnection, header: dict[str, Any], _: bytes) -> None:
        self.subscribers = [
            s for s in self.subscribers if not (s.conn is conn and s.sub_id == header.get("sub_id"))
        ]

    async def _acks(
        self,
        conn: FakeConnection,
        header: dict[str, Any],
        kinds: tuple[str, ...],
        reason: str = "",
        **fields: Any,
    ) -> None:
        """The acks of ``kinds`` that the command asked for (a failure when
        ``reason`` is given)."""
        asked = str(header.get("a", "")).split(",")
        status = "failure" if reason else "success"
        if reason:
            fields["reason"] = reason
        for kind in kinds:
            if kind in asked:
                await conn.send(messages.ack(kind, status, header.get("cid"), **fields))


class FakeServer:
    """A running fake: ``port``, ``uri`` and the :class:`SowFake` behind it."""

    def __init__(self, sow: SowFake, port: int) -> None:
        self.sow = sow
        self.port = port
        self.uri = f"tcp://127.0.0.1:{port}/amps/json"

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        conn = FakeConnection(stream)
        try:
            while data := await stream.receive_some(65536):
                conn.decoder.receive_data(data)
                for frame in conn.decoder.frames():
                    header = frame.header
                    if header["c"] == "logon":
                        conn.name = str(header.get("client_name", ""))
                        fields = {"client_name": conn.name, "s": 0, "version": "5.3.4.0.fake"}
                        await conn.send(messages.ack("processed", cid=header.get("cid"), **fields))
                    else:
                        await self.sow.handle(conn, frame)
        except trio.BrokenResourceError:
            pass
        finally:
            self.sow.subscribers = [s for s in self.sow.subscribers if s.conn is not conn]


@asynccontextmanager
async def fake_server(sow: SowFake) -> AsyncIterator[FakeServer]:
    """Serve ``sow`` on a port the OS picks, in the caller's trio run."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    server = FakeServer(sow, port)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, server.serve_connection, listeners)
        yield server
        nursery.cancel_scope.cancel()


@contextmanager
def fake_server_thread(sow: SowFake) -> Iterator[FakeServer]:
    """Serve ``sow`` from a thread with its own trio run (for code that calls
    ``trio.run`` itself); stopped when the block ends."""
    started: queue.Queue[tuple[FakeServer, trio.lowlevel.TrioToken, trio.CancelScope]] = (
        queue.Queue()
    )

    async def main() -> None:
        with trio.CancelScope() as scope:
            async with fake_server(sow) as server:
                started.put((server, trio.lowlevel.current_trio_token(), scope))
                await trio.sleep_forever()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    server, token, scope = started.get(timeout=30)
    try:
        yield server
    finally:
        token.run_sync_soon(scope.cancel)
        thread.join(timeout=30)
