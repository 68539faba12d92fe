"""Micro-benchmark for the content filter: evaluations per second on pre-parsed dicts.

Run with ``python tools/bench/bench_filters.py [--seconds N]``. A program, not a test:
it prints one line per expression and exits 0.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from amps_py.filters import compile_filter

DOC: dict[str, object] = {
    "a": 5,
    "b": "xylophone",
    "sym": "MSFT",
    "qty": 1500,
    "price": "101.25",
    "status": "open",
    "order": {"id": "A-17", "trader": {"desk": "rates", "name": "kim"}},
    "items": [{"qty": 1, "sku": "p-1"}, {"qty": 5, "sku": "p-2"}, {"qty": 9, "sku": "p-3"}],
    "tags": ["urgent", "fx", "eu"],
}

EXPRESSIONS = [
    "/a = 5 AND /b LIKE 'x'",
    "/a = 5",
    "/sym IN ('IBM', 'MSFT', 'AAPL', 'ORCL')",
    "/qty > 1000 AND /status = 'open' AND /order/trader/desk = 'rates'",
    "/price > 100.5",
    "/items/qty > 8",
    "/tags = 'fx' OR /tags = 'jp'",
    "/b BEGINS WITH ('xy', 'ab') AND /sym NOT IN ('IBM')",
    "UPPER(/sym) = 'MSFT' AND INSTR(/b, 'phone') > 0",
    "(/qty * 2 + 10) / 3 >= 1000 AND /missing IS NULL",
]


def measure(call: Callable[[Any], object], arg: object, seconds: float) -> float:
    """Calls per second of ``call(arg)`` over roughly ``seconds`` of wall time."""
    batch = 1000
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            call(arg)
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.5, help="time per expression")
    args = parser.parse_args()

    payload = orjson.dumps(DOC)
    print(f"{'expression':<72} {'matches':>7} {'evals/s':>12} {'json evals/s':>13}")
    for text in EXPRESSIONS:
        compiled = compile_filter(text)
        rate = measure(compiled.matches, DOC, args.seconds)
        json_rate = measure(compiled.matches_json, payload, args.seconds)
        print(f"{text:<72} {compiled.matches(DOC)!s:>7} {rate:>12,.0f} {json_rate:>13,.0f}")
    compile_rate = measure(compile_filter, EXPRESSIONS[3], args.seconds)
    print(f"compile_filter({EXPRESSIONS[3]!r}): {compile_rate:,.0f}/s")


if __name__ == "__main__":
    main()
