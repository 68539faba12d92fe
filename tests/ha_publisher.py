"""An HA-style test publisher that fails over between instances and reorders on purpose.

It keeps every message until a persisted ack covers it, and after each reconnect it
republishes that unacknowledged tail in a seeded random order, interleaved with new
messages (the mistake real client libraries make after a failover, which the server
must survive). New seqs continue above both its own counter and the logon ack's ``s``.

When is a message acknowledged? Acks are cumulative and the server writes everything
on one ordered stream, so a message counts as acknowledged when a persisted ack with
``s >= seq`` arrives on the connection after that message's ``processed`` ack (the
server had it in hand when it computed the persisted ack). A persisted ack that raced
ahead of a resend proves nothing about that resend and is not counted for it.

Every payload follows tests/checker.py's convention (``{"p": name, "s": seq}``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import trio

from amps_py.client.uri import parse_uri
from amps_py.protocol import FrameDecoder, encode_frame
from amps_py.trio_util import unwrapping_groups

NETWORK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError)


class HAPublisher:
    """Publishes ``topic`` as client ``name`` to whichever of ``uris`` is up."""

    def __init__(
        self, name: str, uris: Sequence[str], topic: str, rng: random.Random, window: int = 64
    ) -> None:
        self.name = name
        self.uris = list(uris)
        self.topic = topic
        self.rng = rng
        self.window = window
        self.next_seq = 1
        #: sent at least once and not yet acknowledged
        self.unacked: dict[int, bytes] = {}
        #: acknowledged by a persisted ack
        self.acked: set[int] = set()
        #: per logon: (uri, the logon ack's s, the highest seq acknowledged before it)
        self.logon_seqs: list[tuple[str, int, int]] = []
        self.connections = 0
        self.current = 0  # index into uris

    def payload(self, seq: int) -> bytes:
        return b'{"p":"%s","s":%d}' % (self.name.encode(), seq)

    async def run(self, stop: trio.Event) -> None:
        """Publish until ``stop`` is set, failing over on every lost connection."""
        while not stop.is_set():
            try:
                await self._session(stop)
            except NETWORK_ERRORS:
                pass
            if not stop.is_set():
                self.current = (self.current + 1) % len(self.uris)
                await trio.sleep(0.02)  # pacing between dials to a dead instance

    async def _session(self, stop: trio.Event, *, drain: bool = False) -> None:
        """One connection: log on, then publish until ``stop`` (with ``drain``: then
        wait until every message is acknowledged)."""
        target = parse_uri(self.uris[self.current])
        stream = await trio.open_tcp_stream(target.host, target.port)
        async with stream:
            decoder = FrameDecoder(max_frame_size=64 * 1024 * 1024)
            await stream.send_all(
                encode_frame(
                    {"c": "logon", "cid": "logon", "client_name": self.name, "a": "processed"}
                )
            )
            logon = await self._first_ack(stream, decoder)
            if logon.get("status") != "success":
                raise OSError(f"logon refused: {logon}")
            held = int(logon.get("s", 0))
            self.logon_seqs.append((self.uris[self.current], held, max(self.acked, default=0)))
            self.connections += 1
            self.next_seq = max(self.next_seq, held + 1)
            known: set[int] = set()  # processed-acked on this connection, not yet acked
            progress = trio.Event()

            async def reader() -> None:
                nonlocal progress
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise EOFError("server closed the connection")
                    decoder.receive_data(data)
                    for frame in decoder.frames():
                        h = frame.header
                        if h.get("c") != "ack" or h.get("status") != "success":
                            continue
                        if h.get("a") == "processed" and "cid" in h:
                            known.add(int(h["cid"]))
                        elif h.get("a") == "persisted" and "s" in h:
                            upto = int(h["s"])
                            for seq in [s for s in known if s <= upto]:
                                known.discard(seq)
                                self.unacked.pop(seq, None)
                                self.acked.add(seq)
                            progress.set()
                            progress = trio.Event()

            tail = sorted(self.unacked)
            self.rng.shuffle(tail)
            async with unwrapping_groups(NETWORK_ERRORS), trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                while not stop.is_set():
                    if len(self.unacked) - len(tail) >= self.window:
                        with trio.move_on_after(0.2):
                            await progress.wait()
                        continue
                    # interleave: a new message, then (half the time) a resend
                    seq = self.next_seq
                    self.next_seq += 1
                    self.unacked[seq] = self.payload(seq)
                    await self._publish(stream, seq)
                    if tail and self.rng.random() < 0.5:
                        await self._publish(stream, tail.pop())
                for seq in tail:
                    await self._publish(stream, seq)
                while drain and self.unacked:
                    await progress.wait()
                nursery.cancel_scope.cancel()

    async def _publish(self, stream: trio.SocketStream, seq: int) -> None:
        header = {"c": "p", "t": self.topic, "s": seq, "cid": str(seq), "a": "processed,persisted"}
        await stream.send_all(encode_frame(header, self.payload(seq)))

    async def _first_ack(self, stream: trio.SocketStream, decoder: FrameDecoder) -> dict:  # type: ignore[type-arg]
        with trio.fail_after(60):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    raise EOFError("server closed the connection during logon")
                decoder.receive_data(data)
                for frame in decoder.frames():
                    if frame.header.get("c") == "ack":
                        return dict(frame.header)

    async def settle(self, timeout: float) -> None:
        """Resend the unacknowledged tail (no new messages) until every message is
        acknowledged; the instances must be up.

        Raises:
            TimeoutError: messages still unacknowledged after ``timeout`` seconds.
        """
        stop = trio.Event()
        stop.set()
        with trio.move_on_after(timeout):
            while self.unacked:
                try:
                    await self._session(stop, drain=True)
                except NETWORK_ERRORS:
                    self.current = (self.current + 1) % len(self.uris)
                    await trio.sleep(0.05)
        if self.unacked:
            raise TimeoutError(
                f"{self.name}: {len(self.unacked)} messages still unacknowledged after "
                f"{timeout} s (first: {sorted(self.unacked)[:5]})"
            )
