"""Memory held by replication connections that never finish their hello.

Starts an instance with a replication transport, opens N connections that each send
the length prefix of a frame and most of its body (never the rest, never a hello),
then closes them all. Prints the server's anonymous resident memory (``RssAnon``)
before, while they are open, and after they closed, with the server's counters of
connections and pre-hello bytes when it has them.

    .venv/bin/python tools/bench/bench_prehello_memory.py [--connections 300]
        [--frame-kib 250] [--sent-kib 240] [--max-connections N]

(``--max-connections`` needs a version with Transport/MaxConnections.)

A program, not a test: it prints figures (docs/BENCHMARKS.md, the report of a change).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def rss_anon(pid: int) -> int:
    """The process's anonymous resident memory, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/PID/status")


def settle(pid: int, seconds: float = 3.0) -> int:
    """RssAnon once it has not changed by more than 1 MiB for a second (or ``seconds``)."""
    deadline = time.monotonic() + seconds
    last = rss_anon(pid)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = rss_anon(pid)
        if abs(now - last) > 1024:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= 1.0:
            break
    return rss_anon(pid)


def statistics(stats_file: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(stats_file.read_text()))
    except (OSError, ValueError):
        return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--frame-kib", type=int, default=250, help="declared frame size")
    parser.add_argument("--sent-kib", type=int, default=240, help="bytes of it sent")
    parser.add_argument(
        "--max-connections", type=int, default=0, help="the replication transport's MaxConnections"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="amps-prehello-"))
    config = tmp / "A.xml"
    cap = f"<MaxConnections>{args.max_connections}</MaxConnections>" if args.max_connections else ""
    config.write_text(f"""<AMPSConfig><Name>A</Name>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType></Transport>
    <Transport><Name>repl</Name><Type>amps-replication</Type>
      <InetAddr>127.0.0.1:0</InetAddr>{cap}</Transport>
  </Transports>
  <TransactionLog><JournalDirectory>{tmp / "journal"}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <Logging><Target><Protocol>file</Protocol><FileName>{tmp / "A.log"}</FileName>
    <Level>info</Level></Target></Logging>
</AMPSConfig>
""")
    ready, stats_file = tmp / "ready.json", tmp / "stats.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "amps_py",
            "serve",
            str(config),
            "--ready-file",
            str(ready),
            "--stats-file",
            str(stats_file),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the instance did not start; see {tmp / 'A.log'}")
            time.sleep(0.01)
        port = json.loads(ready.read_text())["transports"]["repl"]
        before = settle(proc.pid)
        body = bytes(args.sent_kib * 1024)
        prefix = struct.pack(">I", args.frame_kib * 1024)
        socks: list[socket.socket] = []
        refused = 0
        t0 = time.perf_counter()
        for _ in range(args.connections):
            s = socket.create_connection(("127.0.0.1", port))
            try:
                s.sendall(prefix + body)
            except OSError:
                refused += 1
            socks.append(s)
        held = settle(proc.pid)
        limits = statistics(stats_file).get("limits", {})
        for s in socks:
            s.close()
        closed = settle(proc.pid, 5.0)
        after_limits = statistics(stats_file).get("limits", {})
        result = {
            "connections": args.connections,
            "frame_kib": args.frame_kib,
            "sent_kib": args.sent_kib,
            "send_failed": refused,
            "open_seconds": round(time.perf_counter() - t0, 2),
            "rss_anon_mib": {
                "before": round(before / 1024, 1),
                "held": round(held / 1024, 1),
                "closed": round(closed / 1024, 1),
            },
            "limits_while_held": {
                k: v for k, v in limits.items() if k in ("connections", "replication_handshakes")
            },
            "limits_after": {
                k: v
                for k, v in after_limits.items()
                if k in ("connections", "replication_handshakes")
            },
        }
        print(json.dumps(result, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
