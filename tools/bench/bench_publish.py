#!/usr/bin/env python3
"""Publish -> persisted ack throughput and latency against a real instance process.

Each publisher is its own process with a blocking socket (so the load generator costs
as little CPU as possible) and keeps up to ``--window`` messages without a persisted
ack in flight. Latency of a message = time from its send to the persisted ack that
covers it. ``--window 1`` measures one-at-a-time round trips.

    python tools/bench/bench_publish.py --publishers 1 4 --sizes 256 1024 --secs 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RawClient, emit, env_info, percentile, running_instance


def publisher(
    port: int,
    name: str,
    size: int,
    secs: float,
    window: int,
    q: Any,
    top_up: int = 128,
) -> None:
    """One publisher process: keeps up to ``window`` messages without a persisted ack
    in flight, sending at most ``top_up`` new ones after each receive (``top_up=0``:
    refill the whole window every time)."""
    client = RawClient(port, name)
    pad = b"x" * max(0, size - 12)
    payload = b'{"d":"' + pad + b'"}'
    payload = payload + b" " * (size - len(payload))
    sock = client.sock
    decoder = client.decoder
    seq = client.logon_seq
    acked = seq
    first = seq + 1
    sent_at: dict[int, float] = {}
    lat: list[float] = []
    pc = time.perf_counter
    head = b'{"c":"p","t":"bench","a":"persisted","s":'
    n_payload = len(payload)
    # warm-up: 200 messages
    t_start = pc()
    deadline = t_start + secs
    while True:
        now = pc()
        if now < deadline:
            parts = []
            limit = top_up or window
            while seq - acked < window and len(parts) < limit:
                seq += 1
                h = head + str(seq).encode() + b"}"
                parts.append((len(h) + n_payload).to_bytes(4, "big") + h + payload)
                sent_at[seq] = now
            if parts:
                sock.sendall(b"".join(parts))
        elif acked >= seq or now > deadline + 30:
            break
        data = sock.recv(1 << 20)
        if not data:
            break
        decoder.receive_data(data)
        now = pc()
        for frame in decoder.frames():
            h = frame.header
            if h.get("c") == "ack" and h.get("a") == "persisted":
                s = int(h["s"])
                for k in range(acked + 1, s + 1):
                    t = sent_at.pop(k, None)
                    if t is not None:
                        lat.append(now - t)
                acked = max(acked, s)
    elapsed = pc() - t_start
    client.close()
    q.put({"acked": acked - first + 1, "elapsed": elapsed, "lat": lat, "cpu": time.process_time()})


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(
    port: int, publishers: int, size: int, secs: float, window: int, tag: str, server_pid: int = 0
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=publisher, args=(port, f"{tag}-p{i}", size, secs, window, q))
        for i in range(publishers)
    ]
    for p in procs:
        p.start()
    cpu0 = cpu_seconds(server_pid) if server_pid else 0.0
    results = [q.get(timeout=secs + 120) for _ in procs]
    server_cpu = cpu_seconds(server_pid) - cpu0 if server_pid else 0.0
    for p in procs:
        p.join()
    summary = summarize(results, publishers, size, window, secs)
    summary["server_cpu_pct"] = round(100 * server_cpu / summary.pop("elapsed"))
    return {"bench": "publish_persisted", **summary}


def summarize(
    results: list[dict[str, Any]], publishers: int, size: int, window: int, secs: float
) -> dict[str, Any]:
    """One case's figures from its publishers' results (throughput, latency, client CPU);
    ``elapsed`` is the longest publisher's run, for the caller's CPU percentages."""
    total = sum(r["acked"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    return {
        "publishers": publishers,
        "size": size,
        "window": window,
        "secs": secs,
        "messages": total,
        "msgs_per_s": round(total / elapsed),
        "p50_us": round(percentile(lat, 50) * 1e6),
        "p99_us": round(percentile(lat, 99) * 1e6),
        "clients_cpu_pct": round(100 * sum(r["cpu"] for r in results) / elapsed),
        "elapsed": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--publishers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--sequential", action="store_true", help="also run window=1 (latency anchor)")
    ap.add_argument("--durability", default="fsync", choices=["fsync", "page-cache"])
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    with running_instance(durability=a.durability) as inst:
        case = 0
        for size in a.sizes:
            for pubs in a.publishers:
                case += 1
                r = run_case(inst["port"], pubs, size, a.secs, a.window, f"c{case}", inst["pid"])
                r["durability"] = a.durability
                emit(r, a.out)
            if a.sequential:
                case += 1
                r = run_case(inst["port"], 1, size, a.secs, 1, f"c{case}", inst["pid"])
                r["durability"] = a.durability
                emit(r, a.out)


if __name__ == "__main__":
    main()
