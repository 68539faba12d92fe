"""Micro-benchmark: what a content filter costs per message type (not a test).

For each message type, N orders of 10 fields (seeded, the same orders for every type)
are encoded once; the timed loop then does what a subscription does for each message:
``document()`` of the payload and one compiled filter evaluation over it. The filter is
the same condition in each type's paths (``/sym`` in JSON, ``/55`` in FIX,
``/Order/sym`` in XML), and matches about one order in five.

Usage: .venv/bin/python tools/bench/bench_filter_types.py [--messages N] [--repeat R]
    [--seed S] [--types fix,xml,...]

Prints the best of R runs per type: messages per second, microseconds per message,
the share of the time spent in document(), and the speed relative to JSON. Numbers
depend on the machine; compare like with like.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import bson
import msgpack
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from amps_py.filters import Filter, compile_filter
from amps_py.message_types import MessageType, default_types

#: FIX tags for the order's fields (standard FIX where one exists)
FIX_TAGS = {
    "id": "11",
    "sym": "55",
    "side": "54",
    "qty": "38",
    "px": "44",
    "account": "1",
    "trader": "50",
    "venue": "100",
    "ts": "60",
    "status": "39",
}
CONDITION = "{sym} IN ('IBM', 'MSFT') AND {qty} > 500 AND {status} = 'open'"
SYMBOLS = ("IBM", "MSFT", "AAPL", "ORCL", "SAP", "INTC", "AMZN", "NVDA")
STATUSES = ("open", "open", "filled", "cancelled")


def make_orders(count: int, seed: int) -> list[dict[str, object]]:
    """``count`` orders of 10 fields: strings, integers and a float."""
    rng = random.Random(seed)
    return [
        {
            "id": f"ord-{n}",
            "sym": rng.choice(SYMBOLS),
            "side": rng.choice(("buy", "sell")),
            "qty": rng.randrange(1, 1000),
            "px": round(rng.uniform(10, 500), 2),
            "account": f"acct-{rng.randrange(100)}",
            "trader": rng.choice(("kim", "lee", "ana", "raj")),
            "venue": rng.choice(("XNYS", "XNAS", "BATS")),
            "ts": 1_700_000_000_000 + n,
            "status": rng.choice(STATUSES),
        }
        for n in range(count)
    ]


def encode(module: str, order: dict[str, object]) -> bytes:
    """One order as a message of ``module``."""
    if module == "json":
        return orjson.dumps(order)
    if module == "bson":
        return bson.encode(order)
    if module == "msgpack":
        packed: bytes = msgpack.packb(order)
        return packed
    if module == "fix":
        return b"".join(f"{FIX_TAGS[k]}={v}\x01".encode() for k, v in order.items())
    if module == "nvfix":
        return b"".join(f"{k}={v}\x01".encode() for k, v in order.items())
    if module == "xml":
        fields = "".join(f"<{k}>{v}</{k}>" for k, v in order.items() if k != "id")
        return f'<Order id="{order["id"]}">{fields}</Order>'.encode()
    raise ValueError(f"no encoder for {module}")


def filter_for(module: str) -> Filter:
    """The benchmark's condition written in ``module``'s paths."""
    if module == "fix":
        paths = {k: f"/{FIX_TAGS[k]}" for k in ("sym", "qty", "status")}
    elif module == "xml":
        paths = {k: f"/Order/{k}" for k in ("sym", "qty", "status")}
    else:
        paths = {k: f"/{k}" for k in ("sym", "qty", "status")}
    return compile_filter(CONDITION.format(**paths))


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs of ``run``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(
    t: MessageType, payloads: list[bytes], compiled: Filter, repeat: int
) -> dict[str, float]:
    """Seconds for document()+matches over every payload, and for document() alone."""
    document = t.document
    matches = compiled.matches

    def both() -> int:
        return sum(1 for p in payloads if matches(document(p)))

    def parse_only() -> None:
        for p in payloads:
            document(p)

    hits = both()
    return {"total": best_of(repeat, both), "parse": best_of(repeat, parse_only), "hits": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="orders per type")
    parser.add_argument("--repeat", type=int, default=5, help="runs per type; the best counts")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated orders")
    parser.add_argument(
        "--types",
        default="json,fix,nvfix,xml,bson,msgpack",
        help="comma-separated message types to measure (json is the baseline)",
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.types.split(",") if n.strip()]
    types = default_types()
    orders = make_orders(args.messages, args.seed)
    results: dict[str, tuple[float, float, float, int]] = {}
    for name in names:
        t = types[name]
        payloads = [encode(t.module, order) for order in orders]
        assert all(t.document(p) is not None for p in payloads[:10]), f"{name}: bad encoder"
        result = measure(t, payloads, filter_for(t.module), args.repeat)
        size = sum(map(len, payloads)) / len(payloads)
        rate = args.messages / result["total"]
        results[name] = (rate, result["parse"] / result["total"], size, int(result["hits"]))
    baseline = results["json"][0] if "json" in results else next(iter(results.values()))[0]
    print(f"{args.messages:,} orders of 10 fields, seed {args.seed}, best of {args.repeat}")
    print(
        f"{'type':<8} {'msgs/s':>12} {'us/msg':>8} {'parse %':>8} {'vs json':>8} "
        f"{'bytes/msg':>10} {'matched':>8}"
    )
    for name, (rate, parse_share, size, hits) in results.items():
        print(
            f"{name:<8} {rate:>12,.0f} {1e6 / rate:>8.2f} {100 * parse_share:>7.0f}% "
            f"{rate / baseline:>7.2f}x {size:>10.0f} {hits:>8,}"
        )


if __name__ == "__main__":
    main()
