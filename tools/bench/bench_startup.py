"""Start-up time and memory against the journal's length, with the same live state.

Builds journals of several sizes (default 1M and 10M records; ``--sizes`` takes any,
e.g. ``1M,10M,100M``) that hold the same live state at every size:

* a SOW topic ``orders`` keyed by ``/id`` with ``--sow-keys`` keys (default 100,000),
  updated over and over through the journal's history;
* a queue ``work`` that was published ``--queue-messages`` messages (default
  500,000), the older half acknowledged (``QUEUE_ACK`` records of 100 bookmarks);
* plain topics (``trades``) filling the rest.

The records are spread evenly through the history (every chunk of the journal holds
its share of each kind), written straight through :mod:`txlog` (fast; the same
records a server would journal). Then, for each size, it runs the server
(``amps-py serve``) on the standalone layout and prints:

* ``first``: the first start on the built journal (no checkpoint yet: the SOW stores
  and the queue checkpoint are built from the whole journal), then a clean stop;
* ``clean``: starts after a clean stop (``--runs`` of them);
* ``kill9``: starts after a ``kill -9`` of a running instance (``--runs``), with
  ``--tail`` records published just before each kill (so the tail past the last
  checkpoint is not empty);

each with the seconds from spawning ``amps-py serve`` to its ready file, the server's
``RssAnon`` right after ready (anonymous memory: what the process built, not journal
pages mapped from disk) and how many journal records the start read past its
checkpoints (from the server's log).

``--unit-costs`` measures instead what one SOW key and one queued message cost in
anonymous memory: clean starts of three journals of the first size, the default live
state, twice the SOW keys, and twice the queue.

Run from the repository root::

    .venv/bin/python tools/bench/bench_startup.py --sizes 1M,10M --work /tmp/bench-startup
    .venv/bin/python tools/bench/bench_startup.py --sizes 1M --unit-costs --queue-messages 200K

Built journals are kept under ``--work`` (reused by the next run with the same
shape; ``--rebuild`` builds them again). A journal of 10M records of 256 B takes
about 3 GB and a few minutes to build; 100M takes ten times that.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, emit, encode_frame, env_info
from synthetic_journal import build_journal, padded

NAME = "startup-bench"


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def config_text(journal: Path, log_file: Path) -> str:
    return f"""<AMPSConfig>
  <Name>{NAME}</Name>
  <Transports><Transport><Name>json-tcp</Name><Type>tcp</Type>
    <InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol><MessageType>json</MessageType>
  </Transport></Transports>
  <TransactionLog><JournalDirectory>{journal}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
    <JournalSize>256MB</JournalSize>
  </TransactionLog>
  <SOW>
    <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
    <Queue><Name>work</Name><MessageType>json</MessageType><LeasePeriod>1m</LeasePeriod></Queue>
  </SOW>
  <Logging><Target><Protocol>file</Protocol><FileName>{log_file}</FileName>
    <Level>info</Level></Target></Logging>
</AMPSConfig>
"""


def rss_anon_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


def start(workdir: Path) -> tuple[subprocess.Popen[bytes], float, dict[str, Any]]:
    """Spawn the server; return it, seconds to its ready file, and the ready file."""
    ready = workdir / "ready.json"
    ready.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "amps_py", "serve", str(workdir / "config.xml"),
         "--ready-file", str(ready)],
        cwd=workdir,
        stdout=open(workdir / "server.out", "ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 3600
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start; see {workdir / 'server.out'}")
        time.sleep(0.002)
    seconds = time.perf_counter() - t0
    return proc, seconds, orjson.loads(ready.read_text())


def stop(proc: subprocess.Popen[bytes], hard: bool) -> None:
    if hard:
        proc.send_signal(signal.SIGKILL)
    else:
        proc.terminate()
    proc.wait(timeout=600)


def publish_tail(port: int, count: int) -> None:
    """Publish ``count`` messages (SOW, queue and plain) with persisted acks."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode_frame({"c": "logon", "cid": "1", "client_name": f"tail-{time.time_ns()}"}))
    for i in range(count):
        topic = ("orders", "work", "trades")[i % 3]
        body = padded({"id": i % 1000, "tail": i})
        sock.sendall(encode_frame({"c": "publish", "t": topic, "s": i + 1, "a": "persisted"}, body))
    # wait for the last persisted ack
    from amps_py.protocol import FrameDecoder

    decoder = FrameDecoder(max_frame_size=1 << 24)
    seen = 0
    while seen < count:
        decoder.receive_data(sock.recv(1 << 16))
        for frame in decoder.frames():
            if frame.header.get("a") == "persisted":
                seen = max(seen, int(frame.header.get("s", 0)))
    sock.close()


_READ = re.compile(r"read (\d+) journal record")


def records_read(log_file: Path, since: int) -> int | None:
    """Journal records the newest start read past its checkpoints (its log line)."""
    with open(log_file, "rb") as f:
        f.seek(since)
        text = f.read().decode("utf-8", "replace")
    found = [int(m.group(1)) for m in _READ.finditer(text)]
    return sum(found) if found else None


def prepare(size: int, sow_keys: int, queue_messages: int, args: argparse.Namespace) -> Path:
    """The work directory of a journal of this shape (built when missing), its derived
    state (SOW stores, queue checkpoints) removed and its config written."""
    workdir = Path(args.work) / f"{size}-{sow_keys}-{queue_messages}"
    journal = workdir / "journal"
    if args.rebuild or not (workdir / "built").exists():
        workdir.mkdir(parents=True, exist_ok=True)
        print(f"building a journal of {size:,} records in {journal}", flush=True)
        t0 = time.time()
        made = build_journal(journal, NAME, size, sow_keys, queue_messages, progress=True)
        (workdir / "built").write_text(orjson.dumps(made).decode())
        print(f"  built in {time.time() - t0:.0f} s: {made}", flush=True)
    # the server's derived state (SOW stores, queue checkpoint) starts from nothing
    for derived in ("sow", "queues"):
        shutil.rmtree(journal / derived, ignore_errors=True)
    log_file = workdir / "server.log"
    log_file.unlink(missing_ok=True)
    log_file.touch()
    (workdir / "config.xml").write_text(config_text(journal, log_file))
    return workdir


def one_start(
    workdir: Path, phase: str, kill_after: int | None, args: argparse.Namespace, **shape: Any
) -> dict[str, Any]:
    """Start the server once and print a figures line; then stop it cleanly, or publish
    ``kill_after`` records and kill -9 it."""
    journal = workdir / "journal"
    log_file = workdir / "server.log"
    du = sum(f.stat().st_size for f in journal.rglob("*") if f.is_file())
    since = log_file.stat().st_size
    proc, seconds, ready = start(workdir)
    anon = rss_anon_kb(proc.pid)
    result = {
        "bench": "startup",
        **shape,
        "journal_mb": round(du / 2**20),
        "phase": phase,
        "seconds_to_ready": round(seconds, 3),
        "rss_anon_mb": round(anon / 1024, 1),
        "records_read_at_start": records_read(log_file, since),
        **env_info(),
    }
    emit(result, Path(args.out) if args.out else None)
    if kill_after is not None:
        publish_tail(int(ready["transports"]["json-tcp"]), kill_after)
        stop(proc, hard=True)
    else:
        stop(proc, hard=False)
    return result


def measure(size: int, args: argparse.Namespace) -> None:
    shape = {"records": size, "sow_keys": args.sow_keys, "queue_messages": args.queue_messages}
    workdir = prepare(size, args.sow_keys, args.queue_messages, args)
    one_start(workdir, "first", None, args, **shape)
    for _ in range(args.runs):
        one_start(workdir, "clean", None, args, **shape)
    one_start(workdir, "kill9-setup", args.tail, args, **shape)
    for _ in range(args.runs):
        one_start(workdir, "kill9", args.tail, args, **shape)
    proc, _, _ = start(workdir)
    stop(proc, hard=False)


def unit_costs(size: int, args: argparse.Namespace) -> None:
    """Anonymous memory per SOW key and per queued message: clean starts of journals
    of ``size`` records whose live state differs in one of the two."""
    base_keys, base_queue = args.sow_keys, args.queue_messages
    shapes = [(base_keys, base_queue), (2 * base_keys, base_queue), (base_keys, 2 * base_queue)]
    anon = {}
    for keys, queue in shapes:
        workdir = prepare(size, keys, queue, args)
        shape = {"records": size, "sow_keys": keys, "queue_messages": queue}
        one_start(workdir, "first", None, args, **shape)
        figures = [one_start(workdir, "clean", None, args, **shape) for _ in range(args.runs)]
        anon[(keys, queue)] = min(f["rss_anon_mb"] for f in figures)
    base = anon[shapes[0]]
    per_key = (anon[shapes[1]] - base) * 2**20 / base_keys
    per_message = (anon[shapes[2]] - base) * 2**20 / (base_queue / 2)  # half are live
    emit(
        {
            "bench": "startup-unit-costs",
            "records": size,
            "rss_anon_mb": {f"{k}-keys-{q}-queued": v for (k, q), v in anon.items()},
            "bytes_per_sow_key": round(per_key),
            "bytes_per_queued_message": round(per_message),
            **env_info(),
        },
        Path(args.out) if args.out else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M", help="journal sizes in records: 1M,10M,100M")
    parser.add_argument("--sow-keys", type=parse_size, default=100_000)
    parser.add_argument("--queue-messages", type=parse_size, default=500_000)
    parser.add_argument("--runs", type=int, default=2, help="clean and kill -9 starts per size")
    parser.add_argument("--tail", type=int, default=3_000, help="records published per kill -9")
    parser.add_argument("--work", default="/tmp/bench-startup", help="where journals are kept")
    parser.add_argument("--rebuild", action="store_true", help="build the journals again")
    parser.add_argument("--out", default=None, help="also append the JSON lines here")
    parser.add_argument(
        "--unit-costs",
        action="store_true",
        help="instead: RssAnon per SOW key and per queued message at the first size "
        "(journals with twice the keys, and twice the queue)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.unit_costs:
        unit_costs(sizes[0], args)
        return
    for size in sizes:
        measure(size, args)


if __name__ == "__main__":
    main()
