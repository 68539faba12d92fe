#!/usr/bin/env python3
"""Replication throughput: a hot-hot sync pair under publish load, and a full resync.

``pair``: instances A and B (two processes, durable fsync journals) replicate every
topic to each other with ``SyncType sync``. Publisher processes (bench_publish's
publisher: blocking sockets, up to ``window`` messages without a persisted ack) publish
to A only. A persisted ack from A now means "committed on A and acknowledged by B after
B's own commit", so msg/s and latency here are the "durable on two nodes" figures.
Cases: 1 and 4 publishers x each size with window 1000, then 1 publisher with window 1
(latency anchor). Server CPU is reported per process (100 = one core). ``--baseline``
also runs every case against a standalone instance started beside the pair, case by
case (single, then pair), so the ratio pair / single comes from the same minutes.

``resync``: fills instance A's journal with ``--records`` 256 B JSON records through
the txlog library (bench_replay's fill; not measured), starts A with an async
Destination to B (B not running yet), then starts B on an empty journal and measures
from B's process start until B's statistics file shows all records. Run once without
and once with ``<Compression>zstd</Compression>`` on the destination; reports records/s
and A's destination ``bytes_out`` (on the wire) against ``raw_bytes_out``.
``--payload random`` replaces the filler's constant padding (which zstd shrinks far
more than real data) with fresh random base64 per record. B's first and last commit
times (``local_ts`` of its first and last record) give a second, exact rate.

``--full-window`` (pair) uses :func:`publisher_full` instead of bench_publish's
publisher. A case whose publishers get stuck waiting for persisted acks is reported
as an ``"error"`` line with A's destination and B's upstream counters.

    python tools/bench/bench_replication.py --case all
    python tools/bench/bench_replication.py --case pair --secs 5 --baseline
    python tools/bench/bench_replication.py --case resync --records 500000 --payload random
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import multiprocessing as mp
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_publish import cpu_seconds, publisher, summarize
from bench_replay import fill
from common import emit, env_info, ready_ports, reserve_port

from txlog import Journal, Record, publisher_hash
from txlog.journal import DEFAULT_SEGMENT_SIZE

HOST = "127.0.0.1"


# ------------------------------------------------------------------ instances


def destination_xml(
    name: str, group: str, sync: bool, repl_port: int, compression: str = "none"
) -> str:
    comp = f"<Compression>{compression}</Compression>" if compression != "none" else ""
    return (
        f"<Destination><Name>{name}</Name><Group>{group}</Group>"
        f"<SyncType>{'sync' if sync else 'async'}</SyncType>"
        # one-way links (resync case) do not replicate back: relax that check
        "<Topic><Name>.*</Name><MessageType>json</MessageType>"
        "<ExcludeValidation>replicate</ExcludeValidation></Topic>"
        f"<Transport><Type>amps-replication</Type><InetAddr>{HOST}:{repl_port}</InetAddr>"
        "<ReconnectTimeout>50ms</ReconnectTimeout></Transport>"
        f"{comp}</Destination>"
    )


class Node:
    """One instance process with a client port, a replication port and a stats file."""

    def __init__(self, work: Path, name: str, group: str, durability: str = "fsync") -> None:
        self.work = work
        self.name = name
        self.group = group
        self.durability = durability
        #: 0 (the OS picks) until the first start; kept for restarts
        self.port = 0
        #: 0 until the first start, or until :meth:`reserve_repl_port`
        self.repl_port = 0
        self._reservation: socket.socket | None = None
        self.journal = work / f"{name}-journal"
        self.stats_file = work / f"{name}.stats.json"
        self.ready_file = work / f"{name}.ready.json"
        self.destinations: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> Path:
        repl = (
            "<Replication>" + "".join(self.destinations) + "</Replication>"
            if self.destinations
            else ""
        )
        xml = f"""<AMPSConfig>
  <Name>{self.name}</Name><Group>{self.group}</Group>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>{HOST}:{self.port}</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType></Transport>
    <Transport><Name>repl</Name><Type>amps-replication</Type>
      <InetAddr>{HOST}:{self.repl_port}</InetAddr></Transport>
  </Transports>
  <TransactionLog><JournalDirectory>{self.journal}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
    <Durability>{self.durability}</Durability>
  </TransactionLog>
  <Logging><Target><Protocol>file</Protocol>
    <FileName>{self.work / (self.name + ".log")}</FileName><Level>info</Level>
  </Target></Logging>
  {repl}
</AMPSConfig>
"""
        path = self.work / f"{self.name}.xml"
        path.write_text(xml)
        return path

    def spawn(self) -> None:
        """Start the process; do not wait for it."""
        cfg = self.config()
        self.ready_file.unlink(missing_ok=True)
        self.stats_file.unlink(missing_ok=True)
        with open(self.work / f"{self.name}.out", "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "amps_py",
                    "serve",
                    "--config",
                    str(cfg),
                    "--ready-file",
                    str(self.ready_file),
                    "--stats-file",
                    str(self.stats_file),
                ],
                cwd=self.work,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def reserve_repl_port(self) -> int:
        """The replication port, reserved now when a peer's config must name it
        before this instance starts (held until :meth:`stop`)."""
        if self.repl_port == 0:
            self._reservation = reserve_port(HOST)
            self.repl_port = int(self._reservation.getsockname()[1])
        return self.repl_port

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"instance {self.name} not ready after {timeout} s")
            time.sleep(0.005)
        ports = ready_ports(self.ready_file)
        self.port, self.repl_port = ports["json-tcp"], ports["repl"]

    def start(self) -> Node:
        self.spawn()
        self.wait_ready()
        return self

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            out = (self.work / f"{self.name}.out").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"instance {self.name} exited: {out}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stats(self) -> dict[str, Any] | None:
        """The latest statistics (the server rewrites the file every 0.25 s), or None."""
        try:
            return dict(json.loads(self.stats_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def destination(self, name: str) -> dict[str, Any] | None:
        s = self.stats()
        for d in ((s or {}).get("replication") or {}).get("destinations", []):
            if d["name"] == name:
                return dict(d)
        return None

    def records(self) -> int:
        s = self.stats()
        return int(s["journal"]["records"]) if s and s.get("journal") else -1

    def commits(self) -> tuple[int, float, float]:
        """Group commits so far, seconds in commits, of which waiting for fsync."""
        s = self.stats()
        w = (s or {}).get("writer") or {}
        return int(w.get("commits", 0)), w.get("commit_seconds", 0.0), w.get("sync_seconds", 0.0)

    def stop(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def poll(what: str, check: Any, timeout: float, interval: float = 0.01) -> Any:
    """Call ``check`` until it returns something truthy; raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def same_records(a: Node, b: Node) -> int:
    """The record count when both journals hold the same (non-zero) number, else 0."""
    x, y = a.records(), b.records()
    return x if x == y and x > 0 else 0


def sent_all(node: Node, dest: str, n: int) -> dict[str, Any] | None:
    """``dest``'s statistics on ``node`` once it has sent ``n`` messages, else None."""
    d = node.destination(dest)
    return d if d and d["messages_out"] >= n else None


def connected(node: Node, dest: str) -> bool:
    d = node.destination(dest)
    return bool(d and d["is_connected"])


# ------------------------------------------------------------------ pair


def publisher_full(port: int, name: str, size: int, secs: float, window: int, q: Any) -> None:
    """bench_publish's publisher refilling the whole window after every receive
    (bench_publish's default sends at most 128 messages per receive, so with acks that
    arrive rarely, as behind a sync peer, fewer than ``window`` are in flight)."""
    publisher(port, name, size, secs, window, q, top_up=0)


class PublishersStuck(RuntimeError):
    pass


def run_publishers(
    port: int,
    publishers: int,
    size: int,
    secs: float,
    window: int,
    tag: str,
    pids: list[int],
    full_window: bool = False,
) -> dict[str, Any]:
    """Publisher processes against ``port``; CPU of every pid in ``pids``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    target = publisher_full if full_window else publisher
    procs = [
        ctx.Process(target=target, args=(port, f"{tag}-p{i}", size, secs, window, q))
        for i in range(publishers)
    ]
    for p in procs:
        p.start()
    cpu0 = [cpu_seconds(pid) for pid in pids]
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + secs + 60
    while len(results) < len(procs):
        try:
            results.append(q.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise PublishersStuck(
                    f"{len(procs) - len(results)} publisher(s) got no result "
                    f"(exit codes {dead}) within {secs + 60:g} s"
                ) from None
    cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
    for p in procs:
        p.join()
    summary = summarize(results, publishers, size, window, secs)
    elapsed = summary.pop("elapsed")
    summary["server_cpu_pct"] = [round(100 * c / elapsed) for c in cpu]
    return summary


def pair_cases(a: argparse.Namespace) -> list[tuple[int, int, int]]:
    cases = []
    for size in a.sizes:
        cases += [(pubs, size, a.window) for pubs in a.publishers]
        cases.append((1, size, 1))
    return cases


def stall_report(A: Node, B: Node) -> dict[str, Any]:
    """What A's destination and B's upstream say after publishers got stuck."""
    d = A.destination("B") or {}
    up = ((B.stats() or {}).get("replication") or {}).get("upstreams") or [{}]
    return {
        "a_dest_sent_txid": d.get("sent_txid"),
        "a_dest_acked_txid": d.get("acked_txid"),
        "a_durable_txid": (A.stats() or {}).get("durable_txid"),
        "b_upstream_cursor_txid": up[0].get("cursor_txid"),
        "b_records": B.records(),
    }


def commit_figures(
    tag: str, before: tuple[int, float, float], after: tuple[int, float, float], secs: float
) -> dict[str, Any]:
    """Commits per second and the mean commit / fsync time (ms) between two readings."""
    n = max(after[0] - before[0], 1)
    return {
        f"{tag}_commits_per_s": round((after[0] - before[0]) / secs),
        f"{tag}_commit_ms": round(1000 * (after[1] - before[1]) / n, 2),
        f"{tag}_fsync_ms": round(1000 * (after[2] - before[2]) / n, 2),
    }


def bench_pair(a: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="amps-bench-pair-"))
    A = Node(work, "A", "pair", a.durability)
    B = Node(work, "B", "pair", a.durability)
    # a hot-hot pair: A's config names B's port before B starts (so it is reserved);
    # B's names A's, which A bound by then
    A.destinations = [destination_xml("B", "pair", True, B.reserve_repl_port())]
    single = Node(work, "S", "single", a.durability) if a.baseline else None
    gen = "full-window" if a.full_window else "bench_publish"
    try:
        A.start()
        B.destinations = [destination_xml("A", "pair", True, A.repl_port)]
        B.start()
        if single is not None:
            single.start()
        poll("the pair to connect", lambda: connected(A, "B") and connected(B, "A"), 30)
        for n, (pubs, size, window) in enumerate(pair_cases(a)):
            args = (pubs, size, a.secs, window)
            if single is not None:
                r = run_publishers(
                    single.port, *args, f"s{n}", [single.pid], full_window=a.full_window
                )
                r["server_cpu_pct"] = r["server_cpu_pct"][0]
                emit(
                    {"bench": "publish_single", "durability": a.durability, "publisher": gen, **r},
                    a.out,
                )
            head = {
                "bench": "replication_pair",
                "sync": "sync",
                "durability": a.durability,
                "publisher": gen,
            }
            commits0 = (A.commits(), B.commits())
            try:
                r = run_publishers(
                    A.port, *args, f"c{n}", [A.pid, B.pid], full_window=a.full_window
                )
            except PublishersStuck as exc:
                # seen with window 1: B stored and acked the last record, but A's
                # destination never counted the ack, so no persisted ack came
                emit(
                    {
                        **head,
                        "publishers": pubs,
                        "size": size,
                        "window": window,
                        "error": str(exc),
                        **stall_report(A, B),
                    },
                    a.out,
                )
                continue
            cpu_a, cpu_b = r.pop("server_cpu_pct")
            for node in (A, B):
                node.check_alive()
            # every acked message is on B; wait for the statistics file to say so
            same = poll("B to hold A's records", functools.partial(same_records, A, B), 10, 0.05)
            emit(
                {
                    **head,
                    **r,
                    "server_cpu_pct": cpu_a + cpu_b,
                    "a_cpu_pct": cpu_a,
                    "b_cpu_pct": cpu_b,
                    "records_a_b": same,
                    # group commits per second: each is one fsync; their rate shows
                    # whether the round trip or the CPU bounds the pair
                    **commit_figures("a", commits0[0], A.commits(), a.secs),
                    **commit_figures("b", commits0[1], B.commits(), a.secs),
                    "b_to_a_messages_out": (B.destination("A") or {}).get("messages_out"),
                },
                a.out,
            )
    finally:
        for node in (A, B, single):
            if node is not None:
                node.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ resync


def fill_random(journal_dir: Path, name: str, n: int, size: int) -> float:
    """bench_replay's fill with random base64 padding instead of constant padding."""
    t0 = time.perf_counter()
    pubs = [(publisher_hash(f"filler-{i}"), f"filler-{i}") for i in range(4)]
    pad_len = size - 30
    with Journal(journal_dir, instance_name=name) as j:
        seq = 0
        ts = time.time_ns() // 1000 - n
        while seq < n:
            recs = []
            count = min(n, seq + 20_000) - seq
            # fresh random bytes for every record: nothing repeats within zstd's window
            rnd = base64.b64encode(os.urandom(count * pad_len))
            for i, k in enumerate(range(seq, seq + count)):
                ph, cname = pubs[k % 4]
                pad = rnd[i * pad_len : (i + 1) * pad_len]
                body = b'{"id":%010d,"pad":"' % k + pad + b'"}'
                recs.append(
                    Record(
                        topic="bench",
                        payload=body,
                        pub_hash=ph,
                        seq=k // 4 + 1,
                        client_name=cname,
                        origin=name,
                    )
                )
            j.append(recs, ts + seq)
            seq += len(recs)
    return time.perf_counter() - t0


def last_commit_us(journal_dir: Path) -> tuple[int, int]:
    """(local_ts of the first, of the last record) of a journal, in wall-clock µs."""
    with Journal(journal_dir, readonly=True) as j:
        first, last = j.get(j.first_txid()), j.get(j.last_txid)
    assert first is not None and last is not None
    return first.local_ts, last.local_ts


def bench_resync(a: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="amps-bench-resync-"))
    try:
        A = Node(work, "A", "ga", a.durability)
        if a.payload == "random":
            fill_s = fill_random(A.journal, "A", a.records, a.size)
        else:
            fill_s = fill(A.journal, "A", a.records, a.size, "none", DEFAULT_SEGMENT_SIZE)
        mb = (A.journal / "data.mdb").stat().st_size / 1e6
        print(
            f"# filled {a.records} records in {fill_s:.1f} s; A's data.mdb {mb:.0f} MB", flush=True
        )
        for compression in a.compressions:
            B = Node(work, f"B{compression}", "gb", a.durability)
            A.destinations = [
                destination_xml(B.name, "gb", False, B.reserve_repl_port(), compression)
            ]
            try:
                A.start()
                poll("A's statistics", A.stats, 10)
                cpu_a0 = cpu_seconds(A.pid)
                wall0 = time.time_ns() // 1000
                t0 = time.perf_counter()
                B.spawn()
                t_ready: float | None = None
                deadline = t0 + a.timeout
                while True:
                    now = time.perf_counter()
                    if t_ready is None and B.ready_file.exists():
                        t_ready = now
                    s = B.stats()
                    n = int(s["journal"]["records"]) if s and s.get("journal") else 0
                    if n >= a.records:
                        break
                    if now > deadline:
                        a.keep = True  # leave the logs for a post-mortem
                        raise RuntimeError(
                            f"B holds {n} of {a.records} after {a.timeout} s; A's destination: "
                            f"{A.destination(B.name)}; B's replication: "
                            f"{(s or {}).get('replication')}; files in {work}"
                        )
                    B.check_alive()
                    time.sleep(0.01)
                elapsed = time.perf_counter() - t0

                def since(t: float | None, t0: float = t0) -> float | None:
                    return None if t is None else round(t - t0, 3)

                cpu_a = cpu_seconds(A.pid) - cpu_a0
                cpu_b = cpu_seconds(B.pid)
                d = poll(
                    "A's destination statistics to cover the resync",
                    functools.partial(sent_all, A, B.name, a.records),
                    10,
                    0.05,
                )
                first_us, last_us = last_commit_us(B.journal)
                exact = (last_us - wall0) / 1e6
                emit(
                    {
                        "bench": "replication_resync",
                        "records": a.records,
                        "size": a.size,
                        "payload": a.payload,
                        "compression": compression,
                        "records_per_s": round(a.records / elapsed),
                        "elapsed_s": round(elapsed, 2),
                        "records_per_s_by_commit_ts": round(a.records / exact),
                        "records_per_s_first_to_last_commit": round(
                            a.records / ((last_us - first_us) / 1e6)
                        ),
                        "b_start_to_ready_s": since(t_ready),
                        "b_start_to_first_commit_s": round((first_us - wall0) / 1e6, 3),
                        "b_start_to_last_commit_s": round(exact, 3),
                        "bytes_out": d["bytes_out"],
                        "raw_bytes_out": d["raw_bytes_out"],
                        "wire_ratio": round(d["bytes_out"] / d["raw_bytes_out"], 3),
                        "wire_mb_per_s": round(d["bytes_out"] / exact / 1e6, 1),
                        "messages_out": d["messages_out"],
                        "resync_records": d["resync_records"],
                        "a_cpu_pct": round(100 * cpu_a / elapsed),
                        "b_cpu_pct": round(100 * cpu_b / elapsed),
                        "fill_s": round(fill_s, 1),
                        "journal_mb": round(mb),
                    },
                    a.out,
                )
            finally:
                B.stop()
                A.stop()
                shutil.rmtree(B.journal, ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", choices=["pair", "resync", "all"], default="all")
    ap.add_argument("--secs", type=float, default=5, help="seconds per pair case")
    ap.add_argument("--records", type=int, default=500_000, help="records to resync")
    ap.add_argument("--publishers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--durability", default="fsync", choices=["fsync", "page-cache"])
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="pair: also run each case on a standalone instance, just before the pair",
    )
    ap.add_argument(
        "--full-window",
        action="store_true",
        help="pair: publishers refill the whole window after each receive (see publisher_full)",
    )
    ap.add_argument("--size", type=int, default=256, help="resync record payload size")
    ap.add_argument("--payload", choices=["pad", "random"], default="pad")
    ap.add_argument("--compressions", nargs="+", default=["none", "zstd"])
    ap.add_argument("--timeout", type=float, default=300, help="resync: give up after (s)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    if a.case in ("pair", "all"):
        bench_pair(a)
    if a.case in ("resync", "all"):
        bench_resync(a)


if __name__ == "__main__":
    main()
