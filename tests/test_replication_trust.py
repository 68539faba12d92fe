"""What a forged or hostile replication peer can do to a real instance process, and
what it cannot: malformed hellos and welcomes are refused naming the field, an
oversized frame before the handshake is refused before it is buffered, a zstd bomb is
refused within the frame limit, a record that would overflow the journal's path field
or cursor is refused instead of failing the commit, and a record whose publisher seq
jumps far ahead is logged (15-0011). After each, the instance keeps serving and its
journal holds exactly what it held (see "Replication trust" in docs/GUARANTEES.md).

The peer here is this test speaking the replication protocol over a real socket.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import zstandard
from cluster import destination_xml, replication_xml
from harness import ServerProcess, assert_journal_sound, wait_until, write_config

from amps_py.client import open_client
from amps_py.protocol import FrameDecoder
from txlog import Record, RecordCodec, publisher_hash

# the link's constants, restated so that this file also runs against older versions
PROTOCOL_VERSION = 2
#: the largest frame after the handshake (link.MAX_REPLICATION_FRAME)
FRAME_LIMIT = 256 * 1024 * 1024
#: the largest frame before it (link.MAX_HANDSHAKE_FRAME)
HANDSHAKE_FRAME = 64 * 1024


def join_records(records: list[bytes]) -> bytes:
    """A data frame payload (link.join_records): the record lengths, then the records."""
    return struct.pack(f">{len(records)}I", *map(len, records)) + b"".join(records)


#: the hello a real upstream sends (amps_py.replication.link.UpstreamLink.hello)
GOOD_HELLO: dict[str, Any] = {
    "version": PROTOCOL_VERSION,
    "name": "forger",
    "group": "forger",
    "destination": "B",
    "sync": "async",
    "compression": "none",
    # B does not replicate back to "forger": without this, validation would refuse
    "topics": [{"name": ".*", "message_type": "json", "exclude_validation": ["replicate"]}],
    "expected_group": "",
}


def replication_transport(extra: str = "") -> str:
    return (
        "<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        f"<InetAddr>127.0.0.1:0</InetAddr>{extra}</Transport>"
    )


class Downstream:
    """A real instance ``B`` with a client and a replication transport on port 0."""

    def __init__(self, tmp_path: Path, transport_extra: str = "", extra: str = "") -> None:
        config = write_config(
            tmp_path, "B", 0, extra_transport=replication_transport(transport_extra), extra=extra
        )
        self.server = ServerProcess(config, tmp_path, 0, "B")
        self.server.start()
        ready = json.loads(self.server.ready_file.read_text())
        self.server.port = ready["transports"]["json-tcp"]
        self.replication_port: int = ready["transports"]["amps-replication"]
        self.pid: int = ready["pid"]

    def log(self) -> str:
        return self.server.log_file.read_text(errors="replace")

    def records(self) -> int:
        return int(self.server.statistics()["journal"]["records"])

    def peak_rss(self) -> int:
        """The process's peak resident set (VmHWM), in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/PID/status")

    async def wait_logged(self, *fragments: str, timeout: float = 10) -> str:
        """The first log line holding every fragment, once there is one."""

        def line() -> str | None:
            return next(
                (ln for ln in self.log().splitlines() if all(f in ln for f in fragments)), None
            )

        await wait_until(lambda: None if line() else f"B has not logged {fragments}", timeout)
        found = line()
        assert found is not None
        return found

    async def still_serves(self, client: str) -> None:
        """A publisher gets its persisted ack and the journal has no damage."""
        before = self.records()
        async with open_client(self.server.uri, client) as pub:
            await pub.publish_persisted("orders", b'{"still":"serving"}', timeout=20)
        await self.wait_records(before + 1)
        assert self.server.alive

    async def wait_records(self, want: int) -> None:
        """The statistics file (rewritten 4 times a second) shows ``want`` records."""

        def check() -> str | None:
            have = self.records()
            return None if have == want else f"B's journal holds {have} records, want {want}"

        await wait_until(check, 60)

    def stop(self) -> None:
        if self.server.alive:
            assert self.server.stop() == 0, self.server.tail()
        assert_journal_sound(self.server.journal_dir)


@pytest.fixture
def downstream(tmp_path: Path) -> AsyncIterator[Downstream]:
    b = Downstream(tmp_path)
    try:
        yield b
    finally:
        b.stop()


class Peer:
    """This test as a replication peer: raw frames over a real socket."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(FRAME_LIMIT)
        self.closed = False

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        head = json.dumps(header).encode()  # stdlib json: integers of any size
        await self.stream.send_all(struct.pack(">I", len(head) + len(payload)) + head + payload)

    async def hello(self, body: dict[str, Any]) -> None:
        await self.send({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(body))

    async def receive(self, timeout: float = 10) -> tuple[dict[str, Any], Any]:
        """The next frame other than a heartbeat: (header, JSON payload or None; the
        raw payload of a data frame); ``({}, None)`` once the other end has closed the
        connection."""
        with trio.fail_after(timeout):
            while True:
                for frame in self._decoder.frames():
                    if frame.command == "repl_data":
                        return frame.header, frame.payload
                    if frame.command != "repl_hb":
                        body = orjson.loads(frame.payload) if frame.payload else None
                        return frame.header, body
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    self.closed = True
                    return {}, None
                self._decoder.receive_data(data)

    async def refusal(self) -> dict[str, Any]:
        """The repl_refuse the other end sends, after which it closes."""
        header, body = await self.receive()
        assert header.get("c") == "repl_refuse", (header, body)
        rest, _ = await self.receive()
        assert rest == {} and self.closed, f"still open after the refusal: {rest}"
        return dict(body)

    async def handshake(self, **changes: Any) -> dict[str, Any]:
        """Send a well-formed hello; return the welcome."""
        await self.hello({**GOOD_HELLO, **changes})
        header, welcome = await self.receive()
        assert header.get("c") == "repl_welcome", (header, welcome)
        return dict(welcome)


@asynccontextmanager
async def peer(port: int) -> AsyncIterator[Peer]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        yield Peer(stream)
    finally:
        await trio.aclose_forcefully(stream)


def stored_record(
    client: str,
    seq: int,
    txid: int,
    *,
    origin: str = "forger",
    path: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A record as an upstream stores and sends it (CRC included)."""
    return RecordCodec().encode(
        Record(
            topic="orders",
            payload=b'{"forged":true}',
            pub_hash=publisher_hash(client),
            seq=seq,
            client_name=client,
            origin=origin,
            origin_txid=txid,
            txid=txid,
            path=path,
        )
    )


def data_frame(records: list[bytes], upto: int, start: int = 0, **header: Any) -> dict[str, Any]:
    return {
        "c": "repl_data",
        "from": start,
        "upto": upto,
        "upto_bm": "",
        "n": len(records),
        **header,
    }


# ------------------------------------------------------------------------------ hellos

#: (what is wrong, hello body, the field the refusal must name)
MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("name as a list", {**GOOD_HELLO, "name": [1]}, "'name'"),
    ("topics as a string", {**GOOD_HELLO, "topics": "zz"}, "'topics'"),
    ("no name", {k: v for k, v in GOOD_HELLO.items() if k != "name"}, "'name'"),
    ("no version", {k: v for k, v in GOOD_HELLO.items() if k != "version"}, "'version'"),
    ("version as a string", {**GOOD_HELLO, "version": "2"}, "'version'"),
    ("name too long for a journal key", {**GOOD_HELLO, "name": "x" * 600}, "'name'"),
    ("name with a path separator", {**GOOD_HELLO, "name": "a\x1eb"}, "'name'"),
    ("group as a number", {**GOOD_HELLO, "group": 7}, "'group'"),
    ("sync neither sync nor async", {**GOOD_HELLO, "sync": "maybe"}, "'sync'"),
    ("compression unknown", {**GOOD_HELLO, "compression": "lz4"}, "'compression'"),
    ("a topic that is not an object", {**GOOD_HELLO, "topics": ["orders"]}, "'topics[0]'"),
    (
        "a topic name that is a number",
        {**GOOD_HELLO, "topics": [{"name": 5, "exclude_validation": ["replicate"]}]},
        "'topics[0].name'",
    ),
    (
        "exclude_validation as a string",
        {**GOOD_HELLO, "topics": [{"name": "x", "exclude_validation": "txlog"}]},
        "'topics[0].exclude_validation'",
    ),
    ("credentials of the wrong type", {**GOOD_HELLO, "user_id": 42, "pw": "x"}, "'user_id'"),
    ("back as a string", {**GOOD_HELLO, "back": "yes"}, "'back'"),
    ("expected_group as a list", {**GOOD_HELLO, "expected_group": ["g"]}, "'expected_group'"),
]


async def test_malformed_hellos_are_refused_naming_the_field(downstream: Downstream) -> None:
    problems = []
    for what, body, field in MALFORMED:
        async with peer(downstream.replication_port) as p:
            await p.hello(body)
            header, answer = await p.receive()
            if header.get("c") != "repl_refuse":
                problems.append(f"{what}: answered {header.get('c')} {answer}")
                continue
            if answer.get("reason") != "malformed hello" or field not in answer.get("detail", ""):
                problems.append(
                    f"{what}: refused with {answer}, want malformed hello naming {field}"
                )
    assert not problems, "\n".join(problems)
    line = await downstream.wait_logged("15-0003", "malformed hello", "field 'topics'")
    assert "refused replication from an unidentified peer" in line, line
    assert not downstream.server.statistics()["replication"]["upstreams"]
    # a well-formed hello after all that is welcomed, and the instance still serves
    async with peer(downstream.replication_port) as p:
        assert (await p.handshake())["name"] == "B"
    await downstream.still_serves("after-hellos")


# ------------------------------------------------------------------------ frame sizes


async def test_oversized_frame_before_the_hello_is_refused_unbuffered(
    downstream: Downstream,
) -> None:
    """A 250 MB frame before the hello: the connection is closed once the length prefix
    is read, long before the frame could have been sent, and nothing was buffered."""
    declared = 250_000_000
    rss = downstream.peak_rss()
    chunk = bytes(1024 * 1024)
    sent = 0
    async with peer(downstream.replication_port) as p:
        try:
            with trio.fail_after(60):
                await p.stream.send_all(struct.pack(">I", declared))
                while sent < declared:
                    await p.stream.send_all(chunk)
                    sent += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    print(f"sent {sent} of {declared} bytes before B closed the connection")
    assert sent < 64 * 1024 * 1024, f"B read {sent} bytes of a frame it must refuse unread"
    line = await downstream.wait_logged("15-0004", f"a frame of {declared} bytes")
    assert f"at most {HANDSHAKE_FRAME} bytes" in line, line
    assert downstream.peak_rss() - rss < 32 * 1024 * 1024, "B buffered the frame"
    await downstream.still_serves("after-big-frame")


async def test_zstd_bomb_is_refused_within_the_frame_limit(downstream: Downstream) -> None:
    """A 32 KB zstd data frame inflating to 1 GiB: refused once it passes the frame
    limit, the peak RSS stays below the limit plus a margin, the journal is unchanged."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(16 * 1024 * 1024)
    bomb = b"".join(compressor.compress(zeros) for _ in range(64))
    bomb += compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    print(f"bomb: {len(bomb)} bytes inflating to {64 * len(zeros)}")
    assert len(bomb) < 64 * 1024
    records = downstream.records()
    rss = downstream.peak_rss()
    async with peer(downstream.replication_port) as p:
        await p.handshake(compression="zstd")
        await p.send(data_frame([], 1, z=1, n=1), bomb)
        refusal = await p.refusal()
    grown = downstream.peak_rss() - rss
    print(f"peak RSS grew by {grown / 2**20:.0f} MiB; refused with {refusal}")
    assert grown < FRAME_LIMIT + 64 * 1024 * 1024, f"peak RSS grew by {grown} bytes"
    assert refusal["reason"] == "data too large", refusal
    await downstream.wait_logged("15-0004", "data too large", "inflates past")
    assert downstream.records() == records
    await downstream.still_serves("after-bomb")


# ---------------------------------------------------------------- records and cursors


async def test_records_that_would_fail_the_commit_are_refused(downstream: Downstream) -> None:
    """A record whose path would overflow the journal's 16-bit path length once this
    hop is added, and a data frame whose position does not fit the journal's 64-bit
    cursor: each is refused on its link; neither reaches the journal writer (where it
    would fail the commit and stop the instance)."""
    hops = [(f"hop{i:05d}" + "x" * 50, "g") for i in range(1070)]
    used = len("\x1e".join(f"{n}\x1f{g}" for n, g in hops))
    hops.append(("last" + "x" * (65_530 - used - 4 - 3), "g"))  # "\x1e" + name + "\x1fg"
    long_path = tuple(hops)
    encoded = len("\x1e".join(f"{n}\x1f{g}" for n, g in long_path))
    assert encoded == 65_530, encoded  # fits a record; with "forger" added it does not
    async with peer(downstream.replication_port) as p:
        await p.handshake()
        record = stored_record("pub", 1, 1, origin="hop00000", path=long_path)
        await p.send(data_frame([record], 1), join_records([record]))
        refusal = await p.refusal()
    assert refusal["reason"] == "bad data" and "path" in refusal["detail"], refusal
    async with peer(downstream.replication_port) as p:
        await p.handshake()
        record = stored_record("pub", 1, 1)
        await p.send(data_frame([record], 2**64), join_records([record]))
        refusal = await p.refusal()
    assert refusal["reason"] == "protocol violation" and "upto" in refusal["detail"], refusal
    await downstream.still_serves("after-overflows")
    assert downstream.records() == 1


async def test_seq_far_above_the_publishers_is_logged(tmp_path: Path) -> None:
    """A forged ``victim|1000000`` from an unauthenticated peer: stored (a legitimate
    peer may be far ahead), but logged as 15-0011 naming the upstream, the publisher,
    the seq and the publisher's previous high seq, and counted. The default
    SequenceGapThreshold (100k) lets a jump of 90,000 pass quietly."""
    b = Downstream(tmp_path)
    try:
        async with open_client(b.server.uri, "victim") as victim:
            for i in range(3):
                await victim.publish_persisted("orders", b'{"i":%d}' % i, timeout=20)
        async with peer(b.replication_port) as p:
            await p.handshake()
            forged = [
                stored_record("quiet", 90_000, 1),  # under the threshold
                stored_record("victim", 1_000_000, 2),
            ]
            await p.send(data_frame(forged, 2), join_records(forged))
            header, body = await p.receive()
            assert header == {"c": "repl_ack", "upto": 2}, (header, body)

            def counted() -> str | None:
                ups = b.server.statistics()["replication"]["upstreams"]
                gaps = [u.get("sequence_gaps") for u in ups]
                return None if gaps == [1] else f"upstream sequence_gaps {gaps}, want [1]"

            await wait_until(counted, 60)
        line = await b.wait_logged("15-0011", "'victim'")
        assert "replication from forger" in line, line
        assert "seq 1000000" in line and "(3)" in line, line
        assert "SequenceGapThreshold 100000" in line, line
        assert "'quiet'" not in b.log()
        await b.wait_records(5)
    finally:
        b.stop()


# -------------------------------------------------------------------- forged downstream


async def test_forged_downstream_is_refused_and_the_upstream_carries_on(tmp_path: Path) -> None:
    """An upstream instance A dials a "downstream" that is this test: a welcome whose
    name is a list is refused naming the field; a 250 MB frame before the welcome ends
    the connection once its length prefix arrives; a proper welcome after that gets
    A's journal, so A kept working throughout."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    destination = destination_xml("B", "B", False, f"127.0.0.1:{port}", exclude=("replicate",))
    reconnect = "<ReconnectTimeout>100ms</ReconnectTimeout></Transport>"
    config = write_config(
        tmp_path, "A", 0, extra=replication_xml(destination.replace("</Transport>", reconnect))
    )
    a = ServerProcess(config, tmp_path, 0, "A")
    a.start()
    try:
        a.port = json.loads(a.ready_file.read_text())["transports"]["json-tcp"]
        async with open_client(a.uri, "pub") as pub:
            await pub.publish_persisted("orders", b'{"n":1}', timeout=20)

        async def accept() -> Peer:
            with trio.fail_after(60):
                stream = await listeners[0].accept()
            p = Peer(stream)
            header, hello = await p.receive()
            assert header.get("c") == "repl_hello" and hello["name"] == "A", (header, hello)
            return p

        first = await accept()
        await first.send(
            {"c": "repl_welcome"}, orjson.dumps({"name": [1], "group": "B", "cursor_txid": 0})
        )
        refusal = await first.refusal()
        assert refusal["reason"] == "malformed welcome" and "'name'" in refusal["detail"]
        await trio.aclose_forcefully(first.stream)

        second = await accept()
        sent = 0
        try:
            with trio.fail_after(60):
                await second.stream.send_all(struct.pack(">I", 250_000_000))
                while sent < 250_000_000:
                    await second.stream.send_all(bytes(1024 * 1024))
                    sent += 1024 * 1024
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await trio.aclose_forcefully(second.stream)
        print(f"sent {sent} bytes before A closed the connection")
        assert sent < 64 * 1024 * 1024, f"A read {sent} bytes of a frame before the welcome"

        third = await accept()
        welcome = {"name": "B", "group": "B", "cursor_txid": 0, "cursor_bm": ""}
        await third.send({"c": "repl_welcome"}, orjson.dumps(welcome))
        header, _ = await third.receive()
        assert header.get("c") == "repl_data" and header.get("n") == 1, header
        await trio.aclose_forcefully(third.stream)

        log = a.log_file.read_text()
        assert "malformed welcome: repl_welcome field 'name'" in log
        assert "a frame of 250000000 bytes arrived before the replication handshake" in log
        async with open_client(a.uri, "pub") as pub:
            await pub.publish_persisted("orders", b'{"n":2}', timeout=20)
    finally:
        for listener in listeners:
            await listener.aclose()
        assert a.stop() == 0, a.tail()
    assert_journal_sound(a.journal_dir)


# ------------------------------------------------------------------ the gap rule, pure


def test_sequence_gap_watch() -> None:
    from amps_py.replication.incoming import SequenceGapWatch

    journal = {1: 3}  # publisher hash -> highest seq journaled
    lookups: list[int] = []

    def held(pub_hash: int) -> int:
        lookups.append(pub_hash)
        return journal.get(pub_hash, 0)

    watch = SequenceGapWatch(1000, held)
    assert watch.check(1, 4) is None  # next in line
    assert watch.check(1, 1004) is None  # exactly the threshold above 4
    assert watch.check(1, 1_000_000) == 1004  # far above: the previous high
    assert watch.check(1, 1_000_001) is None  # the stream goes on from there
    assert watch.check(2, 1001) == 0  # an unknown publisher counts from 0
    assert lookups == [1, 1, 2]  # once per publisher, again only on a suspected gap
    # published here meanwhile (the journal moved on): no false alarm
    journal[3] = 0
    assert watch.check(3, 5) is None
    journal[3] = 50_000
    assert watch.check(3, 50_001) is None
    assert SequenceGapWatch(0, held).check(9, 10**9) is None  # 0: off
