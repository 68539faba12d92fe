"""A queue acknowledgement the server confirmed survives kill -9 (real processes).

What a user relies on (docs/GUARANTEES.md, Queues): once the server answers a
consumer's acknowledgement (``sow_delete`` by bookmark) with a ``processed`` ack of
status success, that message is never delivered again on this instance, whenever the
server is killed; and no message is lost: every published message is delivered until
it is acknowledged.

Two consumers (blocking sockets, in threads) take messages and acknowledge each batch
at once, asking for ``processed``; meanwhile the server is killed with SIGKILL at
random moments (fixed, printed seed) and restarted. Each consumer reconnects and goes
on. Any delivery of a bookmark whose acknowledgement was confirmed is a failure.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

from harness import ServerProcess, publish_persisted, start_instance, wait_until_sync

from amps_py.protocol import FrameDecoder, encode_frame

QUEUE = "work"
MESSAGES = 3_000
KILLS = 5
SEED = 2411


class Consumer(threading.Thread):
    """Takes queue messages and acknowledges each batch with one ``sow_delete``;
    reconnects when the server goes away."""

    def __init__(self, name: str, server: ServerProcess, ledger: Ledger) -> None:
        super().__init__(name=name, daemon=True)
        self.server = server
        self.ledger = ledger
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self.session()
                except OSError:
                    time.sleep(0.05)  # the server is down: poll until it is back
        except BaseException as exc:  # reported by the test, never lost in a thread
            self.error = exc

    def session(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        sock.settimeout(0.5)
        decoder = FrameDecoder()
        pending: dict[str, list[str]] = {}  # cid -> bookmarks it acknowledges
        cids = 0
        try:
            sock.sendall(encode_frame({"c": "logon", "cid": "logon", "client_name": self.name}))
            sock.sendall(
                encode_frame(
                    {"c": "subscribe", "t": QUEUE, "sub_id": "q", "o": "max_backlog=20"}
                )
            )
            while not self.stopping.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                decoder.receive_data(data)
                marks = []
                for frame in decoder.frames():
                    header = frame.header
                    if header.get("c") in ("p", "publish"):
                        marks.append(str(header["bm"]))
                    elif header.get("c") == "ack" and header.get("cid") in pending:
                        acked = pending.pop(str(header["cid"]))
                        if header.get("status") == "success":
                            self.ledger.confirmed(acked)
                if marks:
                    self.ledger.delivered(self.name, marks)
                    cids += 1
                    cid = f"{self.name}-{self.server.starts}-{cids}"
                    pending[cid] = marks
                    sock.sendall(
                        encode_frame(
                            {
                                "c": "sow_delete",
                                "t": QUEUE,
                                "bm": ",".join(marks),
                                "cid": cid,
                                "a": "processed",
                            }
                        )
                    )
        finally:
            sock.close()


class Ledger:
    """What the consumers saw: deliveries, confirmed acknowledgements, and every
    delivery of a message whose acknowledgement had been confirmed before."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.confirmed_marks: set[str] = set()
        self.seen: set[str] = set()
        self.deliveries = 0
        self.violations: list[str] = []

    def delivered(self, who: str, marks: list[str]) -> None:
        with self.lock:
            self.deliveries += len(marks)
            self.seen.update(marks)
            for mark in marks:
                if mark in self.confirmed_marks:
                    self.violations.append(f"{who} got {mark} after its ack was confirmed")

    def confirmed(self, marks: list[str]) -> None:
        with self.lock:
            self.confirmed_marks.update(marks)

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return len(self.confirmed_marks), len(self.seen)


def test_no_message_whose_ack_was_confirmed_is_delivered_again_across_kill_9(
    tmp_path: Path,
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    queue = f"<SOW><Queue><Name>{QUEUE}</Name><MessageType>json</MessageType>"
    queue += "<LeasePeriod>30s</LeasePeriod></Queue></SOW>"
    server = start_instance(tmp_path, "acks", extra=queue)
    ledger = Ledger()
    consumers: list[Consumer] = []
    try:
        jobs = [(QUEUE, b'{"job": %d}' % i) for i in range(1, MESSAGES + 1)]
        publish_persisted(server.port, "producer", jobs)
        consumers = [Consumer(f"worker-{i}", server, ledger) for i in range(2)]
        for consumer in consumers:
            consumer.start()
        for kill in range(KILLS):
            # a random moment while acknowledgements flow (by count, not by time)
            target = min(MESSAGES, ledger.snapshot()[0] + rng.randint(50, 400))

            def progressed(target: int = target) -> str | None:
                done = ledger.snapshot()[0]
                return None if done >= target else f"{done} of {target} acks confirmed"

            wait_until_sync(progressed, timeout=60)
            server.kill()
            print(f"kill {kill + 1}: {ledger.snapshot()[0]} acks confirmed before it")
            server.start(timeout=60)

        def drained() -> str | None:
            # an ack committed just before a kill is never confirmed (its answer was
            # lost), and its message is gone: done is an empty queue, every message seen
            done, seen = ledger.snapshot()
            depth = server.statistics()["queues"][QUEUE]["depth"]
            if depth or seen < MESSAGES:
                return f"{depth} in the queue, {seen} of {MESSAGES} delivered, {done} confirmed"
            return None

        wait_until_sync(drained, timeout=120)
    finally:
        for consumer in consumers:
            consumer.stopping.set()
        for consumer in consumers:
            consumer.join(timeout=10)
        server.stop()
    errors = [c.error for c in consumers if c.error is not None]
    assert not errors, errors
    print(f"{ledger.deliveries} deliveries for {MESSAGES} messages")
    assert not ledger.violations, ledger.violations[:10]
    assert len(ledger.seen) == MESSAGES
