"""The wall clock inside a simulated run (docs/SIMULATION.md).

amps_py stamps records, sessions and outages with ``time.time()`` /
``time.time_ns()`` and times some of its own work with ``time.monotonic()`` (how long
records have waited in the commit log, when positions were last saved). Inside
:func:`virtual_wall_clock` all three answer from trio's (virtual) clock while a trio
run is active, the first two counted from a fixed epoch: what happens then depends on
the schedule alone, so the same seed writes the same bytes and takes the same turns
(a timestamp ends up in compressed replication batches, whose size the trace
records; a real duration would decide when LMDB commits). Outside a trio run they
answer as usual. ``time.perf_counter()`` stays real (trio's own clock reads it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import trio

__all__ = ["SIM_EPOCH", "virtual_wall_clock"]

#: the wall-clock time a simulated run starts at (2026-01-01T00:00:00Z)
SIM_EPOCH: Final = 1_767_225_600.0


@contextmanager
def virtual_wall_clock(epoch: float = SIM_EPOCH) -> Iterator[None]:
    """Within the block, ``time.time()`` and ``time.time_ns()`` read trio's clock
    (plus ``epoch``), and ``time.monotonic()`` trio's clock, while a trio run is
    active."""
    real_time, real_time_ns, real_monotonic = time.time, time.time_ns, time.monotonic

    def virtual_monotonic() -> float:
        try:
            return trio.current_time()
        except RuntimeError:
            return real_monotonic()

    def virtual_time() -> float:
        try:
            return epoch + trio.current_time()
        except RuntimeError:  # no trio run: the real clock
            return real_time()

    def virtual_time_ns() -> int:
        try:
            return int((epoch + trio.current_time()) * 1e9)
        except RuntimeError:
            return real_time_ns()

    time.time, time.time_ns, time.monotonic = virtual_time, virtual_time_ns, virtual_monotonic
    try:
        yield
    finally:
        time.time, time.time_ns, time.monotonic = real_time, real_time_ns, real_monotonic
