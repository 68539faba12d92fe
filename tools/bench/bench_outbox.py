"""Micro benchmark of the spilling outbox alone (no server): MB/s through one client's
outbox online (memory) and offline (spill files).

Run with ``python tools/bench/bench_outbox.py [--mb N] [--sizes 128,1024,16384]``. A
program, not a test: it prints one JSON line per phase and piece size (``--out``
appends them to a file too) and exits 0.

Phases, for each piece size (the caller's frames); the reader takes up to 1 MiB at a
time, as the session's send loop writes about 1 MiB per ``send_all``:

* ``online``: append 1 MiB of pieces, take them, repeat: the in-memory path;
* ``offline_through``: offlined with an 8 MiB backlog, then append 1 MiB and take
  1 MiB, repeat: every byte goes to the spill file and is read back (a client that
  reads as fast as it is sent to but never catches up);
* ``go_offline``: moving a 64 MiB in-memory backlog to a new spill file: the call
  itself (``first_step_ms``: it writes one batch) and then the ``spill`` steps of 1 MiB
  the session runs between other work (``seconds``, ``mb_per_s``: all of it);
* ``offline_fill``: appends to an offline outbox with no reader (writes only);
* ``offline_drain``: then taking all of it back (reads only).

The spill files are not fsynced, so reads just after writes mostly hit the page cache:
the figures are the outbox's CPU cost plus the kernel's copy, not the disk's speed.
``--dir`` puts the spill files somewhere else (default: a temporary directory).
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

from amps_py.server.outbox import SpillingOutbox

TAKE = 1024 * 1024


def pieces_of(size: int) -> list[bytes]:
    """1 MiB worth of distinct pieces of ``size`` bytes (reused round after round)."""
    count = max(1, TAKE // size)
    return [(i.to_bytes(8, "big") * (size // 8 + 1))[:size] for i in range(count)]


def drain(box: SpillingOutbox) -> int:
    moved = 0
    while got := box.take(TAKE):
        moved += sum(len(p) for p in got)
    return moved


def mb_per_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 1)


def run(size: int, total: int, directory: Path, out: Path | None) -> None:
    chunk = pieces_of(size)
    chunk_bytes = sum(len(p) for p in chunk)
    rounds = max(1, total // chunk_bytes)
    common = {"piece_bytes": size, "mb": round(rounds * chunk_bytes / 1e6, 1)}
    now = 0.0

    # online: append a round, take it
    box = SpillingOutbox("bench-online")
    start = time.perf_counter()
    moved = 0
    for _ in range(rounds):
        for data in chunk:
            box.append(data, now)
        while got := box.take(TAKE):
            moved += sum(len(p) for p in got)
    elapsed = time.perf_counter() - start
    emit({"phase": "online", **common, "mb_per_s": mb_per_s(moved, elapsed)}, out)

    # offline_through: a standing 8 MiB backlog on disk, then as much in as out
    box = SpillingOutbox("bench-through")
    for _ in range(8):
        for data in chunk:
            box.append(data, now)
    box.go_offline(directory)
    start = time.perf_counter()
    moved = 0
    for _ in range(rounds):
        for data in chunk:
            box.append(data, now)
        taken = 0
        while taken < chunk_bytes and (got := box.take(TAKE - taken)):
            taken += sum(len(p) for p in got)
        moved += taken
    elapsed = time.perf_counter() - start
    assert box.offline, "the benchmark's reader caught up: the backlog was not kept"
    emit(
        {
            "phase": "offline_through",
            **common,
            "mb_per_s": mb_per_s(moved, elapsed),
            "backlog_mb": round(box.disk_bytes / 1e6, 1),
        },
        out,
    )
    box.discard()

    # go_offline: a 64 MiB backlog to disk at once
    box = SpillingOutbox("bench-spill")
    for _ in range(64):
        for data in chunk:
            box.append(data, now)
    backlog = box.memory_bytes
    start = time.perf_counter()
    box.go_offline(directory)
    first_step = time.perf_counter() - start
    while box.spill(1024 * 1024):
        pass
    elapsed = time.perf_counter() - start
    emit(
        {
            "phase": "go_offline",
            **common,
            "backlog_mb": round(backlog / 1e6, 1),
            "first_step_ms": round(first_step * 1e3, 2),
            "seconds": round(elapsed, 3),
            "mb_per_s": mb_per_s(backlog, elapsed),
        },
        out,
    )
    box.discard()

    # offline_fill then offline_drain
    box = SpillingOutbox("bench-fill")
    box.go_offline(directory)
    start = time.perf_counter()
    for _ in range(rounds):
        for data in chunk:
            box.append(data, now)
    elapsed = time.perf_counter() - start
    filled = box.disk_bytes
    emit(
        {
            "phase": "offline_fill",
            **common,
            "mb_per_s": mb_per_s(filled, elapsed),
            "file_mb": round(box.file_bytes / 1e6, 1),
        },
        out,
    )
    start = time.perf_counter()
    moved = drain(box)
    elapsed = time.perf_counter() - start
    assert moved == filled and not box.offline
    emit({"phase": "offline_drain", **common, "mb_per_s": mb_per_s(moved, elapsed)}, out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=int, default=256, help="MiB through the outbox per phase")
    ap.add_argument("--sizes", default="128,1024,16384", help="piece sizes in bytes")
    ap.add_argument("--dir", type=Path, default=None, help="spill directory")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    tmp = None
    if a.dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    directory = a.dir or tmp
    try:
        for size in (int(s) for s in a.sizes.split(",")):
            run(size, a.mb * 1024 * 1024, directory, a.out)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
