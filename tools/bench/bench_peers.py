#!/usr/bin/env python3
"""One run: amps-py publish -> persisted ack beside the real peers on this machine.

Runs, in this order and in one invocation: the peers kit (``../shared/peers``:
NATS JetStream R1 file store and Redis streams with ``appendfsync always``, single
server), then ``bench_publish.py`` on amps-py with the same sizes and duration, and
prints one table (msg/s, p50 and p99 of both sides, ratios amps-py / peer of msg/s
and, for the one-at-a-time rows, of p50), then the goal lines of issue 17 items 1
and 2 ("goal: ... — amps-py X vs Y = ratio (target T): met/missed"): one at a time,
256 B, p50 within 2x and p99 within 3x of ``redis-benchmark -c 1 -P 1``; pipelined,
4 publishers, msg/s at least 0.8 of ``redis-benchmark -c 4 -P 100`` at 256 B and at
least 1.0 at 1 KiB. Needs root for the kit's apt-get (``setup.sh`` is idempotent).

    python tools/bench/bench_peers.py --runs 3 --secs 3

``--replicated`` instead runs the kit's replicated peers (NATS JetStream 3-node R3
cluster: ``bench_nats.py`` without ``--skip-cluster``; Redis primary + replica with
XADD + WAIT 1: ``bench_redis.py`` without ``--skip-replica``; both scripts also run their
single-server cases first), then per run ``bench_replication.py --case pair`` (amps-py
hot-hot sync pair, publishing to A) and ``bench_publish.py`` (single instance, as
above). It prints the single-instance table and goals 1 and 2, the table amps-py sync
pair / replicated peer, the table sync pair / single instance, and the goal lines of
item 3: pair one at a time p50 within 2.5x of the single instance's, pipelined pair
(4 publishers, window 1000) at least 0.75 of the single instance's msg/s.

    python tools/bench/bench_peers.py --replicated --runs 2 --secs 3

``--report DIR`` (with or without ``--replicated``) only prints the tables and goals
of a finished run in DIR; a missing file or case shows as "n/a". Figures are medians
over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PEERS = REPO.parent / "shared" / "peers"
PEERS_PY = Path("/tmp/peers-venv/bin/python")


def run(cmd: list[str], timeout: float) -> None:
    print("#", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=timeout)


Key = tuple[int, int, int]  # (publishers, size, window)


@dataclass
class Fig:
    """Medians over runs of one case; None where the data has no such field."""

    msgs: float | None
    p50: float | None
    p99: float | None
    name: str = ""


def median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    vals = [r[field] for r in runs if isinstance(r.get(field), (int, float))]
    return statistics.median(vals) if vals else None


def load_doc(path: Path) -> dict[str, Any]:
    """A peers kit result file (nats.json / redis.json); no cases when missing or broken."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"# n/a: cannot read {path} ({exc.__class__.__name__})")
        return {"cases": []}
    return doc if isinstance(doc, dict) else {"cases": []}


def load_ours(path: Path, bench: str) -> tuple[dict[Key, list[dict[str, Any]]], int]:
    """amps-py JSON lines of ``bench`` by (publishers, size, window), and the number of
    error lines; empty when the file is missing."""
    ours: dict[Key, list[dict[str, Any]]] = {}
    failed = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        print(f"# n/a: cannot read {path}")
        return ours, failed
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict) or r.get("bench") != bench:
            continue
        if "error" in r:
            failed += 1
            continue
        try:
            key = (int(r["publishers"]), int(r["size"]), int(r["window"]))
        except (KeyError, TypeError, ValueError):
            continue
        ours.setdefault(key, []).append(r)
    return ours, failed


def ours_fig(ours: dict[Key, list[dict[str, Any]]], key: Key) -> Fig | None:
    runs = ours.get(key)
    if not runs:
        return None
    return Fig(median_of(runs, "msgs_per_s"), median_of(runs, "p50_us"), median_of(runs, "p99_us"))


def peer_fig(doc: dict[str, Any], must: list[str], group: str | None = None) -> Fig | None:
    """Medians of the first case whose name contains all of ``must`` (and in ``group``,
    when given)."""
    for case in doc.get("cases", []):
        if group is not None and case.get("group") != group:
            continue
        if all(m in case.get("case", "") for m in must):
            runs = [r for r in case.get("runs", []) if isinstance(r, dict)]
            fig = Fig(
                median_of(runs, "msgs_per_s"),
                median_of(runs, "lat_p50_us"),
                median_of(runs, "lat_p99_us"),
                case["case"],
            )
            if fig.msgs is not None:
                return fig
    return None


def num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def rtxt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def goal(
    text: str,
    mine: float | None,
    other: float | None,
    unit: str,
    target: float,
    at_most: bool,
    sides: tuple[str, str] = ("", "Redis "),
) -> None:
    """One line "goal: text — amps-py X vs Y = ratio (target T): met/missed"."""
    r = ratio(mine, other)
    op = "<=" if at_most else ">="
    if r is None:
        verdict = "n/a"
    else:
        verdict = "met" if (r <= target if at_most else r >= target) else "missed"
    x = "n/a" if mine is None else f"{sides[0]}{num(mine)} {unit}"
    y = "n/a" if other is None else f"{sides[1]}{num(other)} {unit}"
    print(f"goal: {text} — amps-py {x} vs {y} = {rtxt(r)} (target {op} {target:g}): {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--sizes", default="256,1024")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--report", type=Path, default=None, help="only print the tables and goals of DIR"
    )
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
        report(a.report, sizes)
        if a.replicated:
            report_replicated(a.report, sizes)
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
    for _ in range(a.runs):
        run_single(a, out, sizes)
    report(out, sizes)


def run_single(a: argparse.Namespace, out: Path, sizes: list[str]) -> None:
    """One run of bench_publish.py on a single amps-py instance, into out/amps-py.jsonl."""
    cmd = [sys.executable, str(HERE / "bench_publish.py"), "--publishers", "1", "4"]
    cmd += ["--sizes", *sizes, "--secs", str(a.secs), "--sequential"]
    run([*cmd, "--out", str(out / SINGLE_FILE)], 3600)


SINGLE_FILE = "amps-py.jsonl"
PAIR_FILE = "amps-py-pair.jsonl"
NATS_R1 = "nats_single_R1"
REDIS_ALWAYS = "redis_single_aof_always"
NATS_R3 = "nats_cluster_R3"
REDIS_WAIT = "redis_primary+replica_WAIT1"


def report(out: Path, sizes: list[str]) -> None:
    """amps-py single instance vs the single-server peers, then goals 1 and 2."""
    ours, _ = load_ours(out / SINGLE_FILE, "publish_persisted")
    nats = load_doc(out / "nats.json")
    redis = load_doc(out / "redis.json")
    print(f"\n# results in {out}: amps-py single instance vs single-server peers\n")
    print(
        "| size | amps-py case | amps-py msg/s | p50 µs | p99 µs | peer case | peer msg/s "
        "| p50 µs | p99 µs | msg/s ratio | p50 ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        s = int(size)
        rows = [
            ((4, s, 1000), "nats", nats, ["Go nats.go 4 pubs", f"| {s} B"]),
            ((1, s, 1000), "nats", nats, ["Go nats.go 1 pub", "async", f"| {s} B"]),
            ((1, s, 1000), "nats", nats, ["nats-py", "async", f"| {s} B"]),
            ((1, s, 1), "nats", nats, ["Go nats.go 1 pub", "sequential", f"| {s} B"]),
            ((1, s, 1), "nats", nats, ["nats-py", "sequential", f"| {s} B"]),
            ((4, s, 1000), "redis", redis, ["-c 4 -P 100", f"| {s} B"]),
            ((1, s, 1000), "redis", redis, ["redis-py", "x1000", f"| {s} B"]),
            ((1, s, 1), "redis", redis, ["-c 1 -P 1", f"| {s} B"]),
        ]
        for key, bench, doc, must in rows:
            group = NATS_R1 if bench == "nats" else REDIS_ALWAYS
            mine = ours_fig(ours, key)
            peer = peer_fig(doc, must, group)
            if mine is None and peer is None:
                continue
            me = mine or Fig(None, None, None)
            them = peer or Fig(None, None, None, " / ".join(must[:-1]) + " (n/a)")
            p50_ratio = rtxt(ratio(me.p50, them.p50)) if key[2] == 1 else ""
            print(
                f"| {s} B | {key[0]} pub, window {key[2]} | {num(me.msgs)} | {num(me.p50)} "
                f"| {num(me.p99)} | {bench}: {them.name.replace('|', '/')} | {num(them.msgs)} "
                f"| {num(them.p50)} | {num(them.p99)} | {rtxt(ratio(me.msgs, them.msgs))} "
                f"| {p50_ratio} |"
            )
    print()
    seq = ours_fig(ours, (1, 256, 1)) or Fig(None, None, None)
    rb1 = peer_fig(redis, ["redis-benchmark -c 1 -P 1", "| 256 B"], REDIS_ALWAYS)
    rb1 = rb1 or Fig(None, None, None)
    text = "1 one at a time, 256 B, {} vs Redis appendfsync always (redis-benchmark -c 1 -P 1)"
    goal(text.format("p50"), seq.p50, rb1.p50, "µs", 2, True)
    goal(text.format("p99"), seq.p99, rb1.p99, "µs", 3, True)
    for s, target in ((256, 0.8), (1024, 1.0)):
        mine = ours_fig(ours, (4, s, 1000)) or Fig(None, None, None)
        rb4 = peer_fig(redis, ["redis-benchmark -c 4 -P 100", f"| {s} B"], REDIS_ALWAYS)
        text = f"2 pipelined, 4 publishers, {s} B, msg/s vs Redis (redis-benchmark -c 4 -P 100)"
        goal(text, mine.msgs, (rb4 or Fig(None, None, None)).msgs, "msg/s", target, False)


def replicated(a: argparse.Namespace, out: Path, sizes: list[str], common: list[str]) -> None:
    """Replicated peers, then per run the amps-py sync pair and the single instance,
    then the tables and goals."""
    run([str(PEERS_PY), str(PEERS / "bench_nats.py"), *common], 3600)
    run([str(PEERS_PY), str(PEERS / "bench_redis.py"), *common], 3600)
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
            str(out / PAIR_FILE),
        ]
        run(cmd + (["--full-window"] if a.full_window else []), 3600)
        run_single(a, out, sizes)
    report(out, sizes)
    report_replicated(out, sizes)


def report_replicated(out: Path, sizes: list[str]) -> None:
    """amps-py sync pair vs the replicated peers, sync pair vs single, then goal 3."""
    ours, failed = load_ours(out / PAIR_FILE, "replication_pair")
    single, _ = load_ours(out / SINGLE_FILE, "publish_persisted")
    nats = load_doc(out / "nats.json")
    redis = load_doc(out / "redis.json")
    print(f"\n# results in {out}: amps-py sync pair vs replicated peers\n")
    if failed:
        print(f"# {failed} amps-py case run(s) failed (see {PAIR_FILE})\n")
    print(
        "| size | amps-py sync pair case | msg/s | p50 µs | p99 µs | A+B CPU % "
        "| replicated peer case | peer msg/s | p50 µs | p99 µs | msg/s ratio | p50 ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
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
            mine = ours_fig(ours, key)
            peer = peer_fig(doc, must, group)
            if mine is None and peer is None:
                continue
            me = mine or Fig(None, None, None)
            them = peer or Fig(None, None, None, " / ".join(must[:-1]) + " (n/a)")
            cpu = median_of(ours.get(key, []), "server_cpu_pct")
            p50_ratio = rtxt(ratio(me.p50, them.p50)) if key[2] == 1 else ""
            print(
                f"| {s} B | {key[0]} pub, window {key[2]} | {num(me.msgs)} | {num(me.p50)} "
                f"| {num(me.p99)} | {num(cpu)} | {group}: {them.name.replace('|', '/')} "
                f"| {num(them.msgs)} | {num(them.p50)} | {num(them.p99)} "
                f"| {rtxt(ratio(me.msgs, them.msgs))} | {p50_ratio} |"
            )
    print("\n# sync pair vs single (same run)\n")
    print(
        "| size | case | pair msg/s | single msg/s | ratio | pair p50 µs | single p50 µs | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    none = Fig(None, None, None)
    for size in sizes:
        s = int(size)
        for key in ((4, s, 1000), (1, s, 1)):
            p = ours_fig(ours, key) or none
            o = ours_fig(single, key) or none
            print(
                f"| {s} B | {key[0]} pub, window {key[2]} | {num(p.msgs)} | {num(o.msgs)} "
                f"| {rtxt(ratio(p.msgs, o.msgs))} | {num(p.p50)} | {num(o.p50)} "
                f"| {rtxt(ratio(p.p50, o.p50))} |"
            )
    print()
    sides = ("pair ", "single ")
    for size in sizes:
        s = int(size)
        p = ours_fig(ours, (1, s, 1)) or none
        o = ours_fig(single, (1, s, 1)) or none
        text = f"3 sync pair one at a time, {s} B, p50 vs single"
        goal(text, p.p50, o.p50, "µs", 2.5, True, sides)
        p = ours_fig(ours, (4, s, 1000)) or none
        o = ours_fig(single, (4, s, 1000)) or none
        text = f"3 pipelined sync pair, 4 publishers window 1000, {s} B, msg/s vs single"
        goal(text, p.msgs, o.msgs, "msg/s", 0.75, False, sides)


if __name__ == "__main__":
    main()
