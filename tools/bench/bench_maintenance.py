#!/usr/bin/env python3
"""What journal maintenance costs publishers: persisted-ack throughput and latency while
the admin API compresses, archives and removes journal segments.

1. Starts an instance with 10 MB journal segments, an archive directory and the admin
   API, and fills it with publishes (``--fill-secs``) so that several segments are
   sealed.
2. Baseline: ``--publishers`` full-window publishers for ``--secs`` (bench_publish's
   publisher processes), nothing else.
3. Same load again, and meanwhile ``compress``, ``archive`` and ``remove`` through the
   newest sealed segment, one after the other, each timed from request to answer
   (remove: until its purge has finished, polled from the admin tree).

    python tools/bench/bench_maintenance.py --publishers 4 --size 256 --secs 8
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_publish import run_case
from common import emit, env_info, running_instance


def admin(base: str, path: str, method: str = "GET") -> Any:
    # administrator actions (POST) carry the header the admin API requires of changes
    headers = {"X-AMPS-Admin": "1"} if method == "POST" else {}
    request = urllib.request.Request(f"{base}{path}", method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def sealed_through(base: str) -> int:
    journals = admin(base, "/amps/instance/transaction_log/journals.json")
    sealed = [int(k) for k, j in journals.items() if not j["is_current"]]
    return max(sealed) if sealed else 0


def maintain(base: str, timings: dict[str, float], start_after: float) -> None:
    time.sleep(start_after)  # let the publishers reach their pace first
    through = sealed_through(base)
    timings["segments"] = through
    for action in ("compress", "archive", "remove"):
        t0 = time.perf_counter()
        admin(base, f"/amps/administrator/transaction_log/journals/{through}/{action}", "POST")
        timings[f"{action}_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    while True:  # the removal's purge runs in the background: wait for its end
        journals = admin(base, "/amps/instance/transaction_log/journals.json")
        if str(through) not in journals:
            break
        time.sleep(0.05)
    timings["remove_gone_s"] = round(timings["remove_s"] + time.perf_counter() - t0, 3)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--secs", type=float, default=8)
    ap.add_argument("--fill-secs", type=float, default=6)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    with running_instance(
        txlog_extra="<JournalSize>10MB</JournalSize>"
        "<JournalArchiveDirectory>archive</JournalArchiveDirectory>",
        extra="<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>",
    ) as inst:
        port, pid = inst["port"], inst["pid"]
        base = f"http://127.0.0.1:{inst['ports']['admin']}"
        run_case(port, a.publishers, a.size, a.fill_secs, a.window, "fill", pid)
        print(f"# filled: {sealed_through(base)} sealed segments", flush=True)
        baseline = run_case(port, a.publishers, a.size, a.secs, a.window, "base", pid)
        emit({**baseline, "bench": "maintenance", "case": "baseline"}, a.out)
        timings: dict[str, float] = {}
        worker = threading.Thread(target=maintain, args=(base, timings, 1.0))
        worker.start()
        during = run_case(port, a.publishers, a.size, a.secs, a.window, "during", pid)
        worker.join()
        emit({**during, "bench": "maintenance", "case": "during", **timings}, a.out)


if __name__ == "__main__":
    main()
