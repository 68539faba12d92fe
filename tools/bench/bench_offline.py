#!/usr/bin/env python3
"""What an offlined slow client costs everyone else, against a real instance process.

The same load runs in three cases, alternating, ``--rounds`` times: pipelined
publishers (as in ``bench_publish.py``: each its own process, up to ``--window``
messages without a persisted ack) and two subscriber processes that keep up (case
``two``); a third that keeps up too (``three``: the cost of one more subscriber); or a
third that has stopped reading (``offline``), so its backlog passes MessageMemoryLimit
(``--memory-mb``) and it is offlined: everything sent to it is written to a spill file
while the others are served. ``offline`` against ``three`` is the cost of offlining.

    python tools/bench/bench_offline.py --secs 5 --size 1024 --rounds 3

Figures, one JSON line per case and round: the publishers' persisted-ack msg/s and p99,
the fast subscribers' delivered msg/s, the server's CPU; for ``offline`` also the bytes
spilled, then how fast the stalled subscriber drains its backlog from disk once it
reads again (MB/s on the wire, decoded by this process) and whether it came back
online. A program, not a test; ``--out`` appends the lines to a file too.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_publish import cpu_seconds, publisher, summarize
from common import RawClient, emit, env_info, running_instance

from amps_py.protocol import FrameDecoder, encode_frame

TOPIC = "bench"  # what bench_publish's publishers publish to


def subscriber(port: int, name: str, stop: Any, q: Any) -> None:
    """A subscriber process that keeps up: counts the messages it receives and when the
    first and last arrived, until ``stop`` is set and nothing came for half a second."""
    client = RawClient(port, name)
    client.sock.sendall(
        encode_frame({"c": "subscribe", "t": TOPIC, "sub_id": "s", "cid": "s", "a": "processed"})
    )
    client.sock.settimeout(0.5)
    count = 0
    first = last = 0.0
    q.put(("subscribed", name))
    while True:
        try:
            data = client.sock.recv(1 << 20)
        except TimeoutError:
            if stop.is_set():
                break
            continue
        if not data:
            break
        client.decoder.receive_data(data)
        now = time.perf_counter()
        for frame in client.decoder.frames():
            if frame.command == "publish":
                if not count:
                    first = now
                count += 1
                last = now
    client.close()
    q.put(("done", {"count": count, "seconds": last - first}))


class StalledSubscriber:
    """A subscriber on a raw socket with a small receive buffer that does not read
    until :meth:`drain`."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.sock.connect(("127.0.0.1", port))
        self.decoder = FrameDecoder(max_frame_size=1 << 30)
        for header in (
            {"c": "logon", "client_name": "stalled", "cid": "l", "a": "processed"},
            {"c": "subscribe", "t": TOPIC, "sub_id": "s", "cid": "s", "a": "processed"},
        ):
            self.sock.sendall(encode_frame(header))
            while not any(f.header.get("cid") == header["cid"] for f in self._read()):
                pass

    def _read(self) -> list[Any]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the stalled subscriber's connection")
        self.received_bytes += len(data)
        self.decoder.receive_data(data)
        return list(self.decoder.frames())

    received_bytes = 0

    def drain(self, count: int) -> dict[str, Any]:
        """Read until ``count`` messages arrived; their bytes and the time it took."""
        got = 0
        self.received_bytes = 0
        start = time.perf_counter()
        while got < count:
            got += sum(1 for f in self._read() if f.command == "publish")
        seconds = time.perf_counter() - start
        return {"drained_mb": round(self.received_bytes / 1e6, 1), "drain_seconds": seconds}

    def close(self) -> None:
        self.sock.close()


def admin(ports: dict[str, int], path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['admin']}{path}", timeout=10) as r:
        return json.loads(r.read())


def run_case(inst: dict[str, Any], args: argparse.Namespace, tag: str, case: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    subs = [
        ctx.Process(target=subscriber, args=(inst["port"], f"{tag}-s{i}", stop, q))
        for i in range(3 if case == "three" else 2)
    ]
    for p in subs:
        p.start()
    for _ in subs:
        assert q.get(timeout=60)[0] == "subscribed"
    slow = StalledSubscriber(inst["port"]) if case == "offline" else None
    pq = ctx.Queue()
    pubs = [
        ctx.Process(
            target=publisher,
            args=(inst["port"], f"{tag}-p{i}", args.size, args.secs, args.window, pq),
        )
        for i in range(args.publishers)
    ]
    cpu0 = cpu_seconds(inst["pid"])
    for p in pubs:
        p.start()
    results = [pq.get(timeout=args.secs + 120) for _ in pubs]
    server_cpu = cpu_seconds(inst["pid"]) - cpu0
    for p in pubs:
        p.join()
    stop.set()
    delivered = [q.get(timeout=120)[1] for _ in subs]
    for p in subs:
        p.join()
    summary = summarize(results, args.publishers, args.size, args.window, args.secs)
    elapsed = summary.pop("elapsed")
    row: dict[str, Any] = {
        "bench": "offline_overhead",
        "case": case,
        **summary,
        "delivered_per_sub_msgs_per_s": round(
            min(d["count"] / max(d["seconds"], 1e-9) for d in delivered)
        ),
        "server_cpu_pct": round(100 * server_cpu / elapsed),
    }
    if slow is not None:
        limits = admin(inst["ports"], "/amps/instance/limits.json")
        row["spilled_mb_at_end"] = round(limits["offline"]["spilled_bytes"] / 1e6, 1)
        row["offlined"] = limits["offline"]["offlined"]
        drained = slow.drain(summary["messages"])
        row["drained_mb"] = drained["drained_mb"]
        row["drain_mb_per_s"] = round(drained["drained_mb"] / drained["drain_seconds"], 1)
        deadline = time.monotonic() + 30
        while admin(inst["ports"], "/amps/instance/limits.json")["offline"]["clients"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the stalled subscriber did not come back online")
            time.sleep(0.05)  # polling the admin API
        row["back_online"] = True
        slow.close()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-mb", type=int, default=32, help="MessageMemoryLimit")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    extra = (
        "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
        f"<MessageMemoryLimit>{a.memory_mb}MB</MessageMemoryLimit>"
        "<MessageDiskLimit>8GB</MessageDiskLimit><ClientMaxCapacity>100%</ClientMaxCapacity>"
    )
    with running_instance(extra=extra) as inst:
        for r in range(a.rounds):
            for case in ("two", "three", "offline"):
                emit(run_case(inst, a, f"r{r}{case}", case), a.out)


if __name__ == "__main__":
    main()
