#!/usr/bin/env python3
"""One run: amps-py publish -> persisted ack beside the real peers on this machine.

Runs, in this order and in one invocation: the peers kit (``../shared/peers``:
NATS JetStream R1 file store and Redis streams with ``appendfsync always``, single
server), then ``bench_publish.py`` on amps-py with the same sizes and duration, and
prints one table with the ratios amps-py / peer. Needs root for the kit's apt-get
(``setup.sh`` is idempotent).

    python tools/bench/bench_peers.py --runs 3 --secs 3

``--replicated`` instead runs the kit's replicated peers (NATS JetStream 3-node R3
cluster: ``bench_nats.py`` without ``--skip-cluster``; Redis primary + replica with
XADD + WAIT 1: ``bench_redis.py`` without ``--skip-replica``; both scripts also run their
single-server cases first) and ``bench_replication.py --case pair`` (amps-py hot-hot sync
pair, publishing to A), and prints the table amps-py sync pair / replicated peer.

    python tools/bench/bench_peers.py --replicated --runs 2 --secs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PEERS = REPO.parent / "shared" / "peers"
PEERS_PY = Path("/tmp/peers-venv/bin/python")


def run(cmd: list[str], timeout: float) -> None:
    print("#", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=timeout)


def median_case(
    doc: dict[str, Any], must: list[str], group: str | None = None
) -> tuple[str, float, str] | None:
    """(case name, median msg/s, median p50 µs or "") of the first case matching all
    (and in ``group``, when given)."""
    for case in doc.get("cases", []):
        if group is not None and case.get("group") != group:
            continue
        if all(m in case["case"] for m in must):
            values = [r["msgs_per_s"] for r in case["runs"] if "msgs_per_s" in r]
            p50 = [r["lat_p50_us"] for r in case["runs"] if r.get("lat_p50_us") is not None]
            if values:
                lat = f"{statistics.median(p50):,.0f}" if p50 else ""
                return case["case"], statistics.median(values), lat
    return None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None, help="only print the table of DIR")
    ap.add_argument(
        "--replicated",
        action="store_true",
        help="NATS R3 cluster and Redis primary+replica (WAIT) vs the amps-py sync pair",
    )
    ap.add_argument(
        "--full-window",
        action="store_true",
        help="with --replicated: pass --full-window to bench_replication.py",
    )
    a = ap.parse_args()
    sizes = [s for s in a.sizes.split(",") if s]
    if a.report is not None:
        if a.replicated:
            report_replicated(a.report, sizes)
        else:
            report(a.report, sizes)
        return
    out = a.out or Path(tempfile.mkdtemp(prefix="amps-bench-peers-"))
    out.mkdir(parents=True, exist_ok=True)
    run(["bash", str(PEERS / "setup.sh")], 1800)
    common = ["--out", str(out), "--runs", str(a.runs), "--secs", str(a.secs), "--sizes", a.sizes]
    if a.replicated:
        replicated(a, out, sizes, common)
        return
    run([str(PEERS_PY), str(PEERS / "bench_nats.py"), *common, "--skip-cluster"], 3600)
    run([str(PEERS_PY), str(PEERS / "bench_redis.py"), *common, "--skip-replica"], 3600)
    ours_file = out / "amps-py.jsonl"
    for _ in range(a.runs):
        run(
            [
                sys.executable,
                str(HERE / "bench_publish.py"),
                "--publishers",
                "1",
                "4",
                "--sizes",
                *sizes,
                "--secs",
                str(a.secs),
                "--sequential",
                "--out",
                str(ours_file),
            ],
            3600,
        )
    report(out, sizes)


def report(out: Path, sizes: list[str]) -> None:
    ours: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for line in (out / "amps-py.jsonl").read_text().splitlines():
        r = json.loads(line)
        ours.setdefault((r["publishers"], r["size"], r["window"]), []).append(r)
    nats = json.loads((out / "nats.json").read_text())
    redis = json.loads((out / "redis.json").read_text())
    print(f"\n# results in {out}\n")
    print(
        "| size | amps-py case | amps-py msg/s | p50 µs | peer case | peer msg/s | p50 µs | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        s = int(size)
        rows = [
            ((4, s, 1000), nats, ["Go nats.go 4 pubs", f"| {s} B"]),
            ((1, s, 1000), nats, ["Go nats.go 1 pub", "async", f"| {s} B"]),
            ((1, s, 1000), nats, ["nats-py", "async", f"| {s} B"]),
            ((1, s, 1), nats, ["Go nats.go 1 pub", "sequential", f"| {s} B"]),
            ((1, s, 1), nats, ["nats-py", "sequential", f"| {s} B"]),
            ((4, s, 1000), redis, ["-c 4 -P 100", f"| {s} B"]),
            ((1, s, 1000), redis, ["redis-py", "x1000", f"| {s} B"]),
            ((1, s, 1), redis, ["-c 1 -P 1", f"| {s} B"]),
        ]
        for key, doc, must in rows:
            mine = ours.get(key)
            peer = median_case(doc, must)
            if not mine or peer is None:
                continue
            m = statistics.median(r["msgs_per_s"] for r in mine)
            lat = statistics.median(r["p50_us"] for r in mine)
            label = f"{key[0]} pub, window {key[2]}"
            name = peer[0].replace("|", "/")
            print(
                f"| {s} B | {label} | {m:,.0f} | {lat:,.0f} | {doc['bench']}: {name} "
                f"| {peer[1]:,.0f} | {peer[2]} | {m / peer[1]:.2f} |"
            )


def replicated(a: argparse.Namespace, out: Path, sizes: list[str], common: list[str]) -> None:
    """Replicated peers, then the amps-py sync pair, then the table."""
    run([str(PEERS_PY), str(PEERS / "bench_nats.py"), *common], 3600)
    run([str(PEERS_PY), str(PEERS / "bench_redis.py"), *common], 3600)
    ours_file = out / "amps-py-pair.jsonl"
    for _ in range(a.runs):
        cmd = [
            sys.executable,
            str(HERE / "bench_replication.py"),
            "--case",
            "pair",
            "--publishers",
            "1",
            "4",
            "--sizes",
            *sizes,
            "--secs",
            str(a.secs),
            "--out",
            str(ours_file),
        ]
        run(cmd + (["--full-window"] if a.full_window else []), 3600)
    report_replicated(out, sizes)


NATS_R3 = "nats_cluster_R3"
REDIS_WAIT = "redis_primary+replica_WAIT1"


def report_replicated(out: Path, sizes: list[str]) -> None:
    ours: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    failed = 0
    for line in (out / "amps-py-pair.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("bench") != "replication_pair":
            continue
        if "error" in r:
            failed += 1
            continue
        ours.setdefault((r["publishers"], r["size"], r["window"]), []).append(r)
    nats = json.loads((out / "nats.json").read_text())
    redis = json.loads((out / "redis.json").read_text())
    print(f"\n# results in {out}\n")
    if failed:
        print(f"# {failed} amps-py case run(s) failed (see amps-py-pair.jsonl)\n")
    print(
        "| size | amps-py sync pair case | msg/s | p50 µs | A+B CPU % "
        "| replicated peer case | peer msg/s | p50 µs | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        s = int(size)
        rows = [
            ((4, s, 1000), nats, NATS_R3, ["Go nats.go 4 pubs", f"| {s} B"]),
            ((1, s, 1000), nats, NATS_R3, ["Go nats.go 1 pub", "async", f"| {s} B"]),
            ((1, s, 1000), nats, NATS_R3, ["nats-py", "async", f"| {s} B"]),
            ((1, s, 1), nats, NATS_R3, ["Go nats.go 1 pub", "sequential", f"| {s} B"]),
            ((1, s, 1), nats, NATS_R3, ["nats-py", "sequential", f"| {s} B"]),
            ((4, s, 1000), redis, REDIS_WAIT, ["4 conn x batch 100 + WAIT", f"| {s} B"]),
            ((1, s, 1000), redis, REDIS_WAIT, ["redis-py", "x1000 + WAIT", f"| {s} B"]),
            ((1, s, 1000), redis, REDIS_WAIT, ["redis-py", "x100 + WAIT", f"| {s} B"]),
            ((1, s, 1), redis, REDIS_WAIT, ["1 conn x batch 1 + WAIT", f"| {s} B"]),
            ((1, s, 1), redis, REDIS_WAIT, ["redis-py", "per msg", f"| {s} B"]),
        ]
        for key, doc, group, must in rows:
            mine = ours.get(key)
            peer = median_case(doc, must, group)
            if not mine or peer is None:
                continue
            m = statistics.median(r["msgs_per_s"] for r in mine)
            lat = statistics.median(r["p50_us"] for r in mine)
            cpu = statistics.median(r["server_cpu_pct"] for r in mine)
            label = f"{key[0]} pub, window {key[2]}"
            name = peer[0].replace("|", "/")
            print(
                f"| {s} B | {label} | {m:,.0f} | {lat:,.0f} | {cpu:.0f} | {group}: {name} "
                f"| {peer[1]:,.0f} | {peer[2]} | {m / peer[1]:.2f} |"
            )


if __name__ == "__main__":
    main()
