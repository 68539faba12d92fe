#!/usr/bin/env python3
"""Queue throughput: publish -> consume -> acknowledge, on one instance and on a
hot-hot pair, against real instance processes.

Publishers (as in ``bench_publish.py``: each its own process, up to ``--window``
messages without a persisted ack) publish to the queue for ``--secs`` seconds;
consumer processes subscribe to it with ``max_backlog=--backlog`` and acknowledge
what each read brought with one ``sow_delete`` naming the bookmarks (no ack
requested). The figure is messages published / time from the first publish to the
last acknowledgement, and the consumers' acknowledged count must equal the published
count (each message processed once; a mismatch is reported).

Cases: ``single`` (publishers and ``--consumers`` consumers on one instance) and
``pair`` (a sync hot-hot pair with a distributed queue: publishers on A, half the
consumers on A and half on B, which gets messages by ownership transfer when A's
consumers are busy).

    python tools/bench/bench_queue.py --case single pair --secs 5

A program, not a test: one JSON line per case and round (``--out`` appends them).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_publish import publisher, summarize
from bench_replication import HOST, Node, connected
from common import RawClient, emit, env_info

from amps_py.protocol import encode_frame

QUEUE = "bench"  # the topic bench_publish's publishers publish to


def queue_xml(backlog: int) -> str:
    return (
        f"<SOW><Queue><Name>{QUEUE}</Name><MessageType>json</MessageType>"
        f"<MaxPerSubscriptionBacklog>{backlog}</MaxPerSubscriptionBacklog></Queue></SOW>"
    )


def queue_destination(name: str, group: str, repl_port: int) -> str:
    return (
        f"<Destination><Name>{name}</Name><Group>{group}</Group><SyncType>sync</SyncType>"
        "<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
        "<PassThrough>.*</PassThrough>"
        f"<Transport><Type>amps-replication</Type><InetAddr>{HOST}:{repl_port}</InetAddr>"
        "<ReconnectTimeout>50ms</ReconnectTimeout></Transport></Destination>"
    )


class QueueNode(Node):
    """An instance process with the queue configured."""

    def __init__(self, work: Path, name: str, group: str, backlog: int) -> None:
        super().__init__(work, name, group)
        self.backlog = backlog

    def config(self) -> Path:
        path = super().config()
        text = path.read_text().replace("</AMPSConfig>", queue_xml(self.backlog) + "</AMPSConfig>")
        path.write_text(text)
        return path


def consumer(port: int, name: str, backlog: int, total: Any, stop: Any, q: Any) -> None:
    """A queue consumer process: acknowledges what each read brings in one
    ``sow_delete``; counts into ``total``; ends once ``stop`` is set and nothing came
    for 0.2 s."""
    client = RawClient(port, name)
    sock, decoder = client.sock, client.decoder
    sock.sendall(
        encode_frame({"c": "subscribe", "t": QUEUE, "sub_id": "q", "o": f"max_backlog={backlog}"})
    )
    sock.settimeout(0.2)
    count = 0
    while True:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            if stop.is_set():
                break
            continue
        if not data:
            break
        decoder.receive_data(data)
        marks = [f.header["bm"] for f in decoder.frames() if f.header.get("c") in ("p", "publish")]
        if marks:
            sock.sendall(encode_frame({"c": "sow_delete", "t": QUEUE, "bm": ",".join(marks)}))
            count += len(marks)
            with total.get_lock():
                total.value += len(marks)
    client.close()
    q.put((name, count))


def run_case(
    args: argparse.Namespace, publish_port: int, consumer_ports: list[int], tag: str
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    total = ctx.Value("q", 0)
    stop = ctx.Event()
    cq = ctx.Queue()
    consumers = [
        ctx.Process(target=consumer, args=(port, f"{tag}-c{i}", args.backlog, total, stop, cq))
        for i, port in enumerate(consumer_ports)
    ]
    for p in consumers:
        p.start()
    time.sleep(0.5)  # let the consumers subscribe before the first publish (a start-up gap)
    pq = ctx.Queue()
    pubs = [
        ctx.Process(
            target=publisher,
            args=(publish_port, f"{tag}-p{i}", args.size, args.secs, args.window, pq),
        )
        for i in range(args.publishers)
    ]
    started = time.perf_counter()
    for p in pubs:
        p.start()
    results = [pq.get(timeout=args.secs + 120) for _ in pubs]
    for p in pubs:
        p.join()
    published = sum(r["acked"] for r in results)
    deadline = time.monotonic() + 120
    while total.value < published and time.monotonic() < deadline:
        time.sleep(0.005)  # polling the shared count
    finished = time.perf_counter()
    stop.set()
    counts = [count for _, count in sorted(cq.get(timeout=60) for _ in consumers)]
    for p in consumers:
        p.join()
    publish = summarize(results, args.publishers, args.size, args.window, args.secs)
    return {
        "bench": "queue",
        "published": published,
        "acknowledged": sum(counts),
        "per_consumer": counts,  # in consumer order (pair: A's first)
        "msgs_per_s": round(published / (finished - started)),
        "publish_msgs_per_s": publish["msgs_per_s"],
        "publish_p99_us": publish["p99_us"],
        "consumers": len(consumers),
        "backlog": args.backlog,
        "size": args.size,
    }


def bench_single(args: argparse.Namespace, work: Path, rnd: int) -> dict[str, Any]:
    node = QueueNode(work / f"single{rnd}", "Q", "q", args.backlog)
    node.work.mkdir(parents=True)
    node.start()
    try:
        row = run_case(args, node.port, [node.port] * args.consumers, f"s{rnd}")
    finally:
        node.stop()
    return {"case": "single", **row}


def bench_pair(args: argparse.Namespace, work: Path, rnd: int) -> dict[str, Any]:
    base = work / f"pair{rnd}"
    base.mkdir(parents=True)
    a = QueueNode(base, "A", "hot", args.backlog)
    b = QueueNode(base, "B", "hot", args.backlog)
    a.destinations = [queue_destination("B", "hot", b.reserve_repl_port())]
    b.destinations = [queue_destination("A", "hot", a.reserve_repl_port())]
    a.spawn()
    b.spawn()
    try:
        a.wait_ready()
        b.wait_ready()
        deadline = time.monotonic() + 30
        while not (connected(a, "B") and connected(b, "A")):
            if time.monotonic() > deadline:
                raise RuntimeError("the pair did not connect")
            time.sleep(0.05)  # polling the stats files
        half = max(1, args.consumers // 2)
        ports = [a.port] * half + [b.port] * max(1, args.consumers - half)
        row = run_case(args, a.port, ports, f"p{rnd}")
    finally:
        a.stop()
        b.stop()
    return {"case": "pair", **row}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", nargs="+", default=["single", "pair"], choices=["single", "pair"])
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--backlog", type=int, default=100, help="max_backlog per consumer")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = ap.parse_args()
    print("#", env_info(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="amps-bench-queue-"))
    for rnd in range(args.rounds):
        for case in args.case:
            row = bench_single(args, work, rnd) if case == "single" else bench_pair(args, work, rnd)
            emit(row, args.out)
            if row["acknowledged"] != row["published"]:
                print(
                    f"# MISMATCH: {row['published']} published, {row['acknowledged']} acknowledged",
                    flush=True,
                )


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
