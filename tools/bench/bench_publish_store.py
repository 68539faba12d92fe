"""Micro benchmark of the publish stores alone (no server): store() throughput of the
memory store and the file store, with sync() every 100 and every 1000 messages.

Run with ``python tools/bench/bench_publish_store.py [--messages 100000] [--size 256]``.
A program, not a test: it prints one JSON line per case (``--out`` appends them to a
file too) and exits 0.

Cases:

* ``memory``: :class:`MemoryPublishStore` (sync() is a no-op);
* ``file_sync_100`` / ``file_sync_1000``: :class:`FilePublishStore` in ``--dir``
  (default: a temporary directory), fsync every 100 / 1000 messages, as the HA client
  does once per group of publishes;
* ``file_no_sync``: the file store's cost without any fsync (written to the OS only);
* ``discard``: discard_through every 100 messages on a full file store (the cost of a
  persisted ack: one marker rewrite, sometimes a segment deletion).

``msgs_per_s`` is messages stored per second, ``us_per_msg`` its inverse. Every 10,000
messages the store cases also discard what is 10,000 messages old (as persisted acks
would; it is inside the timing), so the store stays well below max_bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info

from amps_py.client.publish_store import FilePublishStore, MemoryPublishStore
from amps_py.client.store_api import PublishStore


def run(store: PublishStore, messages: int, size: int, sync_every: int) -> float:
    """Seconds to store ``messages`` of ``size`` bytes, syncing every ``sync_every``."""
    data = b"x" * size
    start = time.perf_counter()
    for i in range(1, messages + 1):
        store.store("publish", "bench/topic", data)
        if sync_every and i % sync_every == 0:
            store.sync()
        if i % 10_000 == 0:
            store.discard_through(i - 10_000)
    store.sync()
    return time.perf_counter() - start


def run_discards(store: PublishStore, messages: int, size: int) -> float:
    data = b"x" * size
    for _ in range(messages):
        store.store("publish", "bench/topic", data)
    store.sync()
    start = time.perf_counter()
    for seq in range(100, messages + 1, 100):
        store.discard_through(seq)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=None, help="where the file stores go")
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-pstore-", dir=args.dir))
    common = {"messages": args.messages, "bytes": args.size, **env_info()}
    try:
        cases: list[tuple[str, int]] = [
            ("memory", 0),
            ("file_no_sync", 0),
            ("file_sync_1000", 1000),
            ("file_sync_100", 100),
        ]
        for name, sync_every in cases:
            store: PublishStore
            store = MemoryPublishStore() if name == "memory" else FilePublishStore(base / name)
            try:
                seconds = run(store, args.messages, args.size, sync_every)
            finally:
                store.close()
            emit(
                {
                    "case": name,
                    **common,
                    "sync_every": sync_every or None,
                    "seconds": round(seconds, 3),
                    "msgs_per_s": round(args.messages / seconds),
                    "us_per_msg": round(seconds / args.messages * 1e6, 2),
                },
                args.out,
            )
        with FilePublishStore(base / "discard") as store:
            seconds = run_discards(store, args.messages, args.size)
        calls = args.messages // 100
        emit(
            {
                "case": "discard",
                **common,
                "calls": calls,
                "us_per_call": round(seconds / calls * 1e6, 1),
            },
            args.out,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
