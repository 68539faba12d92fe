#!/usr/bin/env python3
"""The NATS JetStream work-queue equivalent of ``bench_queue.py --case single``, for
side-by-side figures: a file-backed stream with work-queue retention, publishers that
keep up to ``--window`` acks in flight (the peers kit's Go ``natsbench``, async mode),
and consumer processes with a durable pull consumer that acknowledge each message.

Run it with the peers kit's Python (``bash ../shared/peers/setup.sh`` installs
nats-server, nats-py and the Go load generator):

    /tmp/peers-venv/bin/python tools/bench/nats_workqueue.py --secs 5

It prints one JSON line: messages published, acknowledged, and published / time from
the first publish to the last acknowledgement. NATS acknowledges a publish once the
stream has it in memory (it fsyncs on its own schedule), where amps-py fsyncs before a
persisted ack: the figures compare throughput, not durability.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

STREAM = "WORK"
SUBJECT = "work.jobs"
GOBENCH = Path("/tmp/peers-bin/natsbench")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def make_stream(url: str) -> None:
    import nats
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=STREAM,
            subjects=["work.>"],
            storage=StorageType.FILE,
            retention=RetentionPolicy.WORK_QUEUE,
        )
    )
    await nc.close()


def consumer(url: str, total: Any, stop: Any, q: Any) -> None:
    async def run() -> int:
        import nats

        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.pull_subscribe(SUBJECT, durable="workers")
        count = 0
        while not (stop.is_set() and total.value >= stop_target.value):
            try:
                msgs = await sub.fetch(100, timeout=0.2)
            except Exception:  # a fetch timeout: nothing waiting
                if stop.is_set():
                    break
                continue
            for msg in msgs:
                await msg.ack()
            count += len(msgs)
            with total.get_lock():
                total.value += len(msgs)
        await nc.flush()
        await nc.close()
        return count

    stop_target = total  # ends once stop is set and a fetch finds nothing
    q.put(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--window", type=int, default=1000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nats-wq-"))
    port = free_port()
    conf = work / "nats.conf"
    conf.write_text(f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{work / "store"}" }}\n')
    server = subprocess.Popen(
        ["nats-server", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # waiting for the server to listen
        asyncio.run(make_stream(url))
        ctx = mp.get_context("spawn")
        total = ctx.Value("q", 0)
        stop = ctx.Event()
        q = ctx.Queue()
        consumers = [
            ctx.Process(target=consumer, args=(url, total, stop, q)) for _ in range(a.consumers)
        ]
        for p in consumers:
            p.start()
        time.sleep(1.0)  # the consumers connect and create the durable before publishing
        started = time.perf_counter()
        out = subprocess.run(
            [
                str(GOBENCH),
                "-url",
                url,
                "-mode",
                "async",
                "-subj",
                SUBJECT,
                "-size",
                str(a.size),
                "-secs",
                str(a.secs),
                "-n",
                "10000000",
                "-window",
                str(a.window),
                "-pubs",
                str(a.publishers),
                "-warmup",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=a.secs + 120,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        published = int(result.get("msgs") or result.get("acked") or result.get("n"))
        deadline = time.monotonic() + 120
        while total.value < published and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the shared count
        finished = time.perf_counter()
        stop.set()
        counts = [q.get(timeout=60) for _ in consumers]
        for p in consumers:
            p.join()
        print(
            json.dumps(
                {
                    "case": "nats-workqueue",
                    "published": published,
                    "acknowledged": sum(counts),
                    "per_consumer": counts,
                    "msgs_per_s": round(published / (finished - started)),
                    "publisher": result,
                }
            )
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
