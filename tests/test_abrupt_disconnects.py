"""A client that closes abruptly is an ``info`` disconnect, never an error traceback.

A client that resets its connection (SO_LINGER 0, then close) while the server sends it
a backlog, or while it is sending, can break the session's read loop and its send loop
at once: trio then raises an ExceptionGroup of two connection errors. That is one
disconnect, logged at info with how the connection broke; a real bug in a session
still logs its traceback.
"""

from __future__ import annotations

import errno
import random
import socket
import struct
from pathlib import Path

import trio
from harness import ServerProcess, start_instance, wait_until
from inprocess import serve_instance

from amps_py.client import open_client
from amps_py.protocol import encode_frame
from amps_py.trio_util import connection_error_words, is_connection_error

SEED = 2417
#: raw clients of each kind in the real-process test
CLIENTS = 12


# ------------------------------------------------------------------ the rule, pure


def test_a_group_of_connection_errors_is_a_disconnect_and_anything_else_is_not() -> None:
    reset = trio.BrokenResourceError("reading")
    reset.__cause__ = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    pipe = trio.BrokenResourceError("writing")
    pipe.__cause__ = BrokenPipeError(errno.EPIPE, "Broken pipe")
    both = ExceptionGroup("session", [reset, pipe])
    assert is_connection_error(both)
    assert is_connection_error(ExceptionGroup("x", [ExceptionGroup("y", [pipe]), reset]))
    assert is_connection_error(ConnectionResetError(errno.ECONNRESET, "Connection reset"))
    assert is_connection_error(trio.ClosedResourceError())
    assert connection_error_words(both) == "connection reset by peer (ECONNRESET)"
    assert connection_error_words(pipe) == "broken pipe (EPIPE)"
    assert not is_connection_error(ExceptionGroup("bug", [reset, KeyError("sub")]))
    assert not is_connection_error(KeyError("sub"))
    assert not is_connection_error(trio.Cancelled._create())


# ------------------------------------------------------- both loops break at once


class BreakingStream(trio.abc.Stream):
    """A client connection that logs on, asks for an ack, then breaks both ways at the
    same moment: once :attr:`broken` is set, the server's pending ``receive_some``
    fails with a reset and its pending ``send_all`` with a broken pipe (as a socket
    reset by its peer does). ``read_fault`` replaces the reset, to stand for a bug."""

    def __init__(self, read_fault: BaseException | None = None) -> None:
        self.incoming = [
            encode_frame({"c": "logon", "cid": "1", "client_name": "breaker", "a": "processed"}),
            encode_frame({"c": "flush", "cid": "2", "a": "processed"}),
        ]
        self.broken = trio.Event()
        self.logon_acked = trio.Event()
        self.sends = 0
        self.send_blocked = False
        self.read_fault = read_fault

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if len(self.incoming) == 1:
            await self.logon_acked.wait()  # so that the flush ack is a send of its own
        if self.incoming:
            return self.incoming.pop(0)
        await self.broken.wait()
        if self.read_fault is not None:
            raise self.read_fault
        raise trio.BrokenResourceError("socket connection broken") from ConnectionResetError(
            errno.ECONNRESET, "Connection reset by peer"
        )

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends += 1
        if self.sends == 1:
            self.logon_acked.set()
            return  # the logon ack
        self.send_blocked = True  # the flush ack: the client stopped reading
        await self.broken.wait()
        raise trio.BrokenResourceError("socket connection broken") from BrokenPipeError(
            errno.EPIPE, "Broken pipe"
        )

    async def wait_send_all_might_not_block(self) -> None:
        await self.broken.wait()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def run_broken_session(tmp_path: Path, stream: BreakingStream) -> list[str]:
    """Serve ``stream`` as a client connection of an in-process instance, break it
    once the server is blocked sending to it; return the log lines."""
    async with serve_instance(tmp_path, "abrupt") as served:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(served.instance._serve_client, stream, "json-tcp", "192.0.2.9:4000")
            await wait_until(
                lambda: None if stream.send_blocked else "the server has not sent the flush ack",
                60,
            )
            stream.broken.set()
        return list(served.logs.lines)


async def test_reader_and_writer_broken_at_once_is_one_info_disconnect(tmp_path: Path) -> None:
    lines = await run_broken_session(tmp_path, BreakingStream())
    errors = [line for line in lines if "] error: " in line or "] critical: " in line]
    assert not errors, "an abrupt close was logged as an error:\n" + "\n".join(errors)
    assert not [line for line in lines if "Traceback" in line or "ExceptionGroup" in line]
    gone = [line for line in lines if "client 'breaker'" in line and "disconnected" in line]
    assert len(gone) == 1, "\n".join(lines)
    assert "] info: 07-" in gone[0], gone[0]
    # with how it broke: as the reader or as the writer saw it, whichever raised first
    assert (
        "disconnected: connection closed (connection reset by peer (ECONNRESET))" in gone[0]
        or "disconnected: connection closed (broken pipe (EPIPE))" in gone[0]
    ), gone[0]


async def test_a_bug_in_a_session_still_logs_its_traceback(tmp_path: Path) -> None:
    lines = await run_broken_session(tmp_path, BreakingStream(read_fault=KeyError("a bug")))
    text = "\n".join(lines)
    failed = [line for line in lines if "session of client 'breaker'" in line]
    assert failed and "] error: " in failed[0], text
    assert "Traceback" in text and "KeyError: 'a bug'" in text, text


# ------------------------------------------------------------- real connections


def reset_now(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (RST) rather than a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def logged_on(port: int, name: str) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(
        encode_frame({"c": "logon", "cid": "1", "client_name": name, "a": "processed"})
    )
    await stream.receive_some(65536)  # the logon ack (a few dozen bytes)
    return stream


async def test_clients_that_reset_while_receiving_or_sending_are_info_disconnects(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    server: ServerProcess = start_instance(tmp_path, "resets")
    try:
        body = b'{"pad":"' + b"x" * 4000 + b'"}'
        async with open_client(server.uri, "backlog") as pub:
            for seq in range(1, 3001):  # a 12 MB backlog for the replays
                await pub.publish("orders", body, seq=seq)
            await pub.wait_persisted(3000)

        async def replay_then_reset(i: int) -> None:
            """Replay the backlog without reading, so the server is sending, then reset."""
            stream = await logged_on(server.port, f"reader-{i}")
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await stream.send_all(
                encode_frame({"c": "subscribe", "t": "orders", "sub_id": "s", "bm": "0"})
            )
            for _ in range(rng.randrange(0, 4)):
                await stream.receive_some(rng.choice([1, 4096, 65536]))
            await trio.sleep(rng.uniform(0, 0.05))  # (load only: a varied moment)
            reset_now(stream.socket)

        async def publish_then_reset(i: int) -> None:
            """Send a stream of publishes (acks asked for, never read), reset mid-way."""
            stream = await logged_on(server.port, f"writer-{i}")
            frame = encode_frame({"c": "p", "t": "orders", "a": "processed"}, body)
            for _ in range(rng.randrange(20, 200)):
                await stream.send_all(frame)
            reset_now(stream.socket)

        async with trio.open_nursery() as nursery:
            for i in range(CLIENTS):
                nursery.start_soon(replay_then_reset, i)
                nursery.start_soon(publish_then_reset, i)

        def all_recorded() -> str | None:
            text = server.log_file.read_text()
            names = [f"reader-{i}" for i in range(CLIENTS)] + [
                f"writer-{i}" for i in range(CLIENTS)
            ]
            missing = [n for n in names if f"client {n!r} (connection" not in text]
            return f"no disconnect logged yet for {missing}" if missing else None

        await wait_until(all_recorded, 30)
        lines = server.log_file.read_text().splitlines()
        bad = [
            line
            for line in lines
            if "] error: " in line
            or "] critical: " in line
            or "Traceback" in line
            or "ExceptionGroup" in line
        ]
        assert not bad, "abrupt closes logged as errors:\n" + "\n".join(bad[:20])
        gone = [line for line in lines if "disconnected: connection closed" in line]
        assert len(gone) >= 2 * CLIENTS, "\n".join(gone)
        assert all("] info: " in line for line in gone), "\n".join(gone)
        # the instance is fine: a new client publishes and replays
        async with open_client(server.uri, "after") as after:
            await after.publish_persisted("orders", b'{"after":1}')
        assert server.alive
    finally:
        server.stop()
