#!/usr/bin/env python3
"""HA client publish throughput (with a :class:`FilePublishStore`) against the plain
:class:`Client`, on one instance process.

Both publish ``--messages`` messages of ``--size`` bytes with the same pipelining: at
most ``--window`` publishes without a persisted ack in flight (before publishing seq
``n`` the publisher waits for the persisted ack of ``n - window``), then wait for the
ack of the last one. The clock runs from the first publish to that ack.

* ``plain``: :func:`open_client`, ``publish`` + ``wait_persisted``;
* ``ha``: :func:`open_ha_client` with a fresh :class:`FilePublishStore` per round (in
  ``--dir``, default a temporary directory), ``publish`` + ``wait_persisted`` (every
  publish written to the store, fsynced once per group, discarded on its ack).

The two alternate in the same process against the same instance (``--rounds`` of each,
plain first), each round under a new client name. Prints one JSON line per run, then a
summary line with the median msg/s of each and ``ratio`` = ha / plain (issue 16's
target: at least 0.8).

    python tools/bench/bench_ha_publish.py [--messages 100000] [--size 256] \\
        [--window 1000] [--rounds 3] [--durability fsync] [--out FILE]

``--pause`` waits for Enter before the rounds (prints the pids), to attach a profiler:
``py-spy record -o out.txt --format raw -p PID``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info, running_instance

from amps_py.client import FilePublishStore, open_client, open_ha_client

TOPIC = "bench"


def make_payload(size: int) -> bytes:
    body = b'{"d":"' + b"x" * max(0, size - 8) + b'"}'
    return body[:size] if len(body) > size else body


async def run_plain(uri: str, name: str, messages: int, window: int, data: bytes) -> float:
    """Seconds for ``messages`` publishes with at most ``window`` unacknowledged."""
    async with open_client(uri, name) as client:
        first = client.seq + 1
        start = time.perf_counter()
        last = 0
        for i in range(messages):
            if i >= window:
                await client.wait_persisted(first + i - window, timeout=60)
            last = await client.publish(TOPIC, data)
        await client.wait_persisted(last, timeout=60)
        return time.perf_counter() - start


async def run_ha(
    uri: str, name: str, messages: int, window: int, data: bytes, store_dir: Path
) -> float:
    """As :func:`run_plain`, through an HA client and a file publish store."""
    with FilePublishStore(store_dir) as store:
        async with open_ha_client(name, [uri], publish_store=store) as ha:
            await ha.wait_connected(30)
            first = store.last_seq + 1
            start = time.perf_counter()
            last = 0
            for i in range(messages):
                if i >= window:
                    await ha.wait_persisted(first + i - window, timeout=60)
                last = await ha.publish(TOPIC, data)
            await ha.wait_persisted(last, timeout=60)
            elapsed = time.perf_counter() - start
            assert len(store) == 0, "every publish is discarded once acknowledged"
            return elapsed


async def bench(uri: str, args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    data = make_payload(args.size)
    results: list[dict[str, Any]] = []
    # a short warm-up of each (imports, the journal files, the first store directory)
    await run_plain(uri, "warm-plain", 2000, args.window, data)
    await run_ha(uri, "warm-ha", 2000, args.window, data, base / "warm-ha")
    for r in range(1, args.rounds + 1):
        for kind in ("plain", "ha"):
            name = f"{kind}-r{r}"
            if kind == "plain":
                secs = await run_plain(uri, name, args.messages, args.window, data)
            else:
                secs = await run_ha(uri, name, args.messages, args.window, data, base / name)
            results.append(
                {
                    "case": kind,
                    "round": r,
                    "seconds": round(secs, 4),
                    "msgs_per_s": round(args.messages / secs),
                }
            )
            emit(
                {
                    **results[-1],
                    "messages": args.messages,
                    "bytes": args.size,
                    "window": args.window,
                },
                args.out,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", default="fsync", help="the instance's journal Durability")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go")
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    parser.add_argument("--pause", action="store_true", help="wait for Enter before the rounds")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-ha-", dir=args.dir))
    try:
        with running_instance(base / "instance", durability=args.durability) as inst:
            uri = f"tcp://127.0.0.1:{inst['port']}/amps/json"
            if args.pause:
                input(f"client pid {os.getpid()}, instance pid {inst['pid']}; Enter to start")
            results = trio.run(bench, uri, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rates = {
        kind: statistics.median(r["msgs_per_s"] for r in results if r["case"] == kind)
        for kind in ("plain", "ha")
    }
    emit(
        {
            "summary": "median of rounds",
            "plain_msgs_per_s": rates["plain"],
            "ha_msgs_per_s": rates["ha"],
            "ratio": round(rates["ha"] / rates["plain"], 3),
            "messages": args.messages,
            "bytes": args.size,
            "window": args.window,
            "rounds": args.rounds,
            "durability": args.durability,
            **env_info(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
