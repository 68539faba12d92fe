"""Resync without a cursor between real instance processes: a downstream that already
holds an upstream's records but no cursor for it (a failover to the other member of a
group, a lost cursor) is sent only what it lacks; one that misses part of an origin is
sent all it misses; a peer without the exchange (an older amps-py, or a journal from
before holdings) gets the full resync it always got.

Counts come from the upstream destination's statistics (``messages_out``,
``resync_records``, ``resync_skipped``), taken as deltas around the reconnection;
"nothing lost" is a replay from EPOCH on the downstream. The comparison itself is
tested without processes in ``test_resync_exchange.py``.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import lmdb
import orjson
import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import ServerProcess, assert_journal_sound, wait_until, write_config
from test_replication import body, publish, replay, wait_connected, wait_remote, wait_stored

from amps_py.client import open_client
from amps_py.protocol import FrameDecoder
from txlog import publisher_hash
from txlog.holdings import Fingerprint

#: what the downstream's replay must show: every (publisher, i) once, in order
Replayed = list[tuple[str, int, str]]


def counters(cluster: Cluster, source: str, dest: str) -> dict[str, int]:
    d = cluster.server(source).destination(dest)
    return {k: int(d[k]) for k in ("messages_out", "resync_records", "resync_skipped")}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def edit_journal(journal_dir: Path, db: bytes, key: bytes, value: bytes | None) -> None:
    """Change one entry of a stopped instance's journal (``None``: delete it)."""
    env = lmdb.open(str(journal_dir), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(db)) as txn:
            if value is None:
                assert txn.delete(key), f"{key!r} not in {db!r} of {journal_dir}"
            else:
                txn.put(key, value)
    finally:
        env.close()


def forget_cursor(cluster: Cluster, name: str, upstream: str) -> None:
    """Instance ``name`` (stopped) loses how far it holds ``upstream``'s stream."""
    edit_journal(cluster.journal_dir(name), b"upstreams", upstream.encode(), None)


def forget_holdings(cluster: Cluster, name: str) -> None:
    """Instance ``name``'s journal (stopped) looks written by an amps-py without
    holdings: it neither offers nor answers the exchange from now on."""
    edit_journal(cluster.journal_dir(name), b"meta", b"holdings", b"off")


async def wait_link_down(cluster: Cluster, source: str, dest: str) -> None:
    def check() -> str | None:
        d = cluster.server(source).destination(dest)
        if d["is_connected"] or d["disconnect_count"] < 1:
            return f"{source} shows {dest} connected={d['is_connected']}"
        return None

    await wait_until(check, 60)


async def wait_sent(cluster: Cluster, source: str, dest: str, out: int) -> dict[str, int]:
    """The destination's counters once it has sent ``out`` messages in all."""

    def check() -> str | None:
        n = counters(cluster, source, dest)["messages_out"]
        return None if n >= out else f"{source}->{dest} sent {n} of {out}"

    await wait_until(check, 60)
    return counters(cluster, source, dest)


def in_order(got: Replayed, name: str, n: int) -> None:
    assert [(p, i) for p, i, _ in got] == [(name, i) for i in range(n)], (
        f"replay shows {len(got)} messages, want {name} 0..{n - 1} once each in order"
    )


async def test_a_failover_to_a_member_holding_the_records_sends_only_what_it_lacks(
    cluster: Cluster,
) -> None:
    """A replicates to group site-b (B1, then B2 on failover); B1 passes A's messages
    on to B2. B2 has no cursor for A (it never heard from A), yet holds what A sent
    B1: when B1 dies, A sends B2 only the messages published since."""

    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(
            destination_xml(
                "site-b",
                "site-b",
                False,
                [view.addr("B1"), view.addr("B2")],
                exclude=("replicate",),
            )
        )

    cluster.add_instance("A", "site-a", a_body)
    cluster.add_instance("B1", "site-b", body(("B2", True, ("^site-a$",))))
    cluster.add_instance("B2", "site-b", body(("B1", True, ("^site-a$",))))
    cluster.start_all()
    await wait_remote(cluster, "A", "site-b", "B1")
    await publish(cluster.uri("A"), "pa", 1300)
    await wait_stored(cluster, {"B1": 1300, "B2": 1300})
    before = await wait_sent(cluster, "A", "site-b", 1300)
    cluster.kill("B1")
    await publish(cluster.uri("A"), "pa", 40, start=1300)
    await wait_remote(cluster, "A", "site-b", "B2")
    await wait_stored(cluster, {"B2": 1340})
    after = await wait_sent(cluster, "A", "site-b", before["messages_out"] + 40)
    moved = delta(after, before)
    print(f"A -> site-b across the failover: {moved}")
    assert moved["messages_out"] == 40, f"B2 was sent {moved['messages_out']} messages, not 40"
    assert moved["resync_skipped"] == 1300, moved
    in_order(await replay(cluster.uri("B2")), "pa", 1340)
    assert "no usable cursor, but B2 is proven to hold 1300" in cluster.log("A")


async def test_a_downstream_that_lost_its_cursor_gets_only_the_missing_tail(
    cluster: Cluster,
) -> None:
    cluster.add_instance("A", "g", body(("B", False, ())))
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 2500)
    await wait_stored(cluster, {"B": 2500})
    before = await wait_sent(cluster, "A", "B", 2500)
    cluster.stop("B")
    await wait_link_down(cluster, "A", "B")
    forget_cursor(cluster, "B", "A")
    await publish(cluster.uri("A"), "pa", 60, start=2500)
    cluster.start("B")
    await wait_stored(cluster, {"B": 2560})
    after = await wait_sent(cluster, "A", "B", before["messages_out"] + 60)
    moved = delta(after, before)
    print(f"A -> B after B lost its cursor: {moved}")
    assert moved == {"messages_out": 60, "resync_records": 60, "resync_skipped": 2500}
    # the stream resumed in the bucket of B's high, past the first 2048 records
    assert "resuming after txid 2047, without those" in cluster.log("A")
    in_order(await replay(cluster.uri("B")), "pa", 2560)
    assert "replication from A" in cluster.log("B")
    assert_journal_sound(cluster.journal_dir("B"))


async def test_a_member_missing_part_of_an_origin_is_sent_all_it_misses(
    cluster: Cluster,
) -> None:
    """B1 passes only topic ``orders`` of A's messages on to B2 (a partial path): B2
    holds A's orders, not its trades, interleaved with them. After the failover its
    holdings of A do not match A's anywhere, so A sends it everything of A again:
    the trades arrive, the orders come again as duplicates, nothing is lost."""

    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(
            destination_xml(
                "site-b",
                "site-b",
                False,
                [view.addr("B1"), view.addr("B2")],
                exclude=("replicate",),
            )
        )

    def b1_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(
            destination_xml(
                "B2",
                "site-b",
                False,
                view.addr("B2"),
                topics=("orders",),
                passthrough=("^site-a$",),
                exclude=("replicate", "replicate_filter", "cascade"),
            )
        )

    cluster.add_instance("A", "site-a", a_body)
    cluster.add_instance("B1", "site-b", b1_body)
    cluster.add_instance("B2", "site-b", body())
    cluster.start_all()
    await wait_remote(cluster, "A", "site-b", "B1")
    async with open_client(cluster.uri("A"), "pa") as pub:
        for i in range(200):
            for topic in ("orders", "trades"):
                await pub.publish(topic, b'{"p":"pa","i":%d}' % i)
        await pub.wait_persisted(pub.seq, timeout=30)
    await wait_stored(cluster, {"B1": 400, "B2": 200})
    before = await wait_sent(cluster, "A", "site-b", 400)
    cluster.kill("B1")
    await wait_remote(cluster, "A", "site-b", "B2")
    await wait_stored(cluster, {"B2": 400})
    after = await wait_sent(cluster, "A", "site-b", before["messages_out"] + 400)
    moved = delta(after, before)
    print(f"A -> site-b, B2 holding only A's orders: {moved}")
    assert moved["resync_skipped"] == 0 and moved["messages_out"] == 400, moved
    for topic in ("orders", "trades"):
        in_order(await replay(cluster.uri("B2"), topic), "pa", 200)


@pytest.mark.parametrize("older", ["downstream", "upstream"])
async def test_without_holdings_on_either_side_the_resync_is_full(
    cluster: Cluster, older: str
) -> None:
    """A journal from before holdings (marked so) neither offers the exchange in its
    hello nor answers it in its welcome: the downstream that lost its cursor is sent
    the upstream's whole journal again, as an older amps-py was, and keeps each
    message once."""
    cluster.add_instance("A", "g", body(("B", False, ())))
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 200)
    await wait_stored(cluster, {"B": 200})
    before = await wait_sent(cluster, "A", "B", 200)  # A's statistics cover them
    cluster.stop("B")
    forget_cursor(cluster, "B", "A")
    if older == "upstream":
        cluster.stop("A")
        forget_holdings(cluster, "A")
        cluster.start("A")
        before = dict.fromkeys(before, 0)  # a new process counts from 0
    else:
        forget_holdings(cluster, "B")
    cluster.start("B")
    await wait_connected(cluster, "A", "B")
    after = await wait_sent(cluster, "A", "B", before["messages_out"] + 200)
    moved = delta(after, before)
    assert moved == {"messages_out": 200, "resync_records": 200, "resync_skipped": 0}, moved
    in_order(await replay(cluster.uri("B")), "pa", 200)
    assert "proven to hold" not in cluster.log("A")


# ------------------------------------------------------------------ on the wire

PROTOCOL_VERSION = 2
HELLO: dict[str, Any] = {
    "version": PROTOCOL_VERSION,
    "name": "old",
    "group": "old",
    "destination": "B",
    "sync": "async",
    "compression": "none",
    "topics": [{"name": ".*", "message_type": "json", "exclude_validation": ["replicate"]}],
    "expected_group": "",
}


class RawPeer:
    """This test as a replication peer of another version: frames over a socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(256 * 1024 * 1024)

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        head = orjson.dumps(header)
        await self.stream.send_all(struct.pack(">I", len(head) + len(payload)) + head + payload)

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        """The next frame other than a heartbeat: (header, payload)."""
        with trio.fail_after(30):
            while True:
                for frame in self._decoder.frames():
                    if frame.command != "repl_hb":
                        return frame.header, frame.payload
                data = await self.stream.receive_some(65536)
                assert data, "the instance closed the connection"
                self._decoder.receive_data(data)


@asynccontextmanager
async def raw_peer(port: int) -> AsyncIterator[RawPeer]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        yield RawPeer(stream)
    finally:
        await trio.aclose_forcefully(stream)


def start(tmp_path: Path, name: str, extra: str = "", transport: bool = True) -> ServerProcess:
    repl = (
        "<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        "<InetAddr>127.0.0.1:0</InetAddr></Transport>"
    )
    config = write_config(tmp_path, name, 0, extra_transport=repl if transport else "", extra=extra)
    server = ServerProcess(config, tmp_path, 0, name)
    server.start()
    ready = orjson.loads(server.ready_file.read_text())
    server.port = ready["transports"]["json-tcp"]
    return server


def replication_port(server: ServerProcess) -> int:
    return int(orjson.loads(server.ready_file.read_text())["transports"]["amps-replication"])


async def test_an_older_upstreams_hello_gets_an_older_welcome(tmp_path: Path) -> None:
    """A hello without ``holdings`` (an older upstream) is answered by a welcome
    without them, which that upstream reads as it always did; a hello with them gets
    what this instance holds of the origins it named."""
    b = start(tmp_path, "B")
    try:
        async with open_client(b.uri, "pb") as pub:
            for i in range(3):
                await pub.publish("orders", b'{"i":%d}' % i)
            await pub.wait_persisted(pub.seq, timeout=20)
        port = replication_port(b)
        async with raw_peer(port) as old:
            await old.send({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(HELLO))
            header, payload = await old.receive()
            welcome = orjson.loads(payload)
            assert header["c"] == "repl_welcome" and "holdings" not in welcome, welcome

        async def ask() -> Any:
            async with raw_peer(port) as new:
                hello = {**HELLO, "name": "new", "group": "new", "holdings": {"B": 10**6}}
                await new.send({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(hello))
                _, payload = await new.receive()
                return orjson.loads(payload).get("holdings")

        # B's own three records reach its holdings with its next LMDB commit (100 ms)
        found: Any = None
        with trio.fail_after(20):
            while not found:
                found = await ask()
                await trio.sleep(0.1)
        digest = Fingerprint.of(
            struct.pack(">QQ", publisher_hash("pb"), s) for s in (1, 2, 3)
        ).digest()
        assert found == {"B": {"upto": 3, "digest": digest, "cuts": []}}
    finally:
        assert b.stop() == 0, b.tail()


async def test_an_upstream_sends_all_to_an_older_downstream_and_nothing_held(
    tmp_path: Path,
) -> None:
    """Instance A dials a downstream that is this test. Answering as an older amps-py
    (a welcome without holdings, no cursor), it is sent A's whole journal; answering
    that it holds all of A's records (their digest), it is sent none of them, only
    what A journals after."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    dest = destination_xml("B", "B", False, f"127.0.0.1:{port}", exclude=("replicate",))
    quick = "<ReconnectTimeout>100ms</ReconnectTimeout></Transport>"
    a = start(tmp_path, "A", replication_xml(dest.replace("</Transport>", quick)), transport=False)
    try:
        async with open_client(a.uri, "pa") as pub:
            for i in range(5):
                await pub.publish("orders", b'{"i":%d}' % i)
            await pub.wait_persisted(pub.seq, timeout=20)

            async def downstream(welcome: dict[str, Any], publish_after: bool) -> list[int]:
                """Accept A, answer ``welcome``: the records of each data frame A sends
                until its stream reaches txid 5 (6 when it publishes one more then)."""
                with trio.fail_after(60):
                    stream = await listeners[0].accept()
                peer = RawPeer(stream)
                try:
                    header, payload = await peer.receive()
                    assert header["c"] == "repl_hello" and "holdings" in orjson.loads(payload)
                    await peer.send({"c": "repl_welcome"}, orjson.dumps(welcome))
                    if publish_after:
                        await trio.sleep(0.5)  # A's resync would have sent by now
                        await pub.publish_persisted("orders", b'{"i":5}', timeout=20)
                    frames = []
                    while not frames or header["upto"] < (6 if publish_after else 5):
                        header, _ = await peer.receive()
                        assert header["c"] == "repl_data", header
                        frames.append(header["n"])
                    return frames
                finally:
                    await trio.aclose_forcefully(stream)

            old = {"name": "B", "group": "B", "cursor_txid": 0, "cursor_bm": ""}
            assert sum(await downstream(old, False)) == 5
            # wait for A to see the connection closed and its LMDB to hold all five
            await trio.sleep(0.5)
            digest = Fingerprint.of(
                struct.pack(">QQ", publisher_hash("pa"), s) for s in range(1, 6)
            ).digest()
            held = {**old, "holdings": {"A": {"upto": 5, "digest": digest, "cuts": []}}}
            assert await downstream(held, True) == [1], "sent again what it was proven to hold"

        def counted() -> str | None:
            skipped = a.destination("B")["resync_skipped"]
            return None if skipped == 5 else f"A counts {skipped} records skipped, want 5"

        await wait_until(counted, 10)
    finally:
        for listener in listeners:
            await listener.aclose()
        assert a.stop() == 0, a.tail()
