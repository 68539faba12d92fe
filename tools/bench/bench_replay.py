#!/usr/bin/env python3
"""Bookmark replay throughput and restart time over a large journal.

1. Fills a journal with ``--messages`` records (256 B JSON, 4 publishers) through the
   txlog library in large batches (the fill is not what is measured).
2. Restart time: starts an instance process on that journal and measures the time
   from process start to "listening" (ready file written); also the in-process
   ``Journal(...)`` open time.
3. Replay: one subscriber sends ``subscribe bm=0`` and counts delivered messages until
   the ``completed`` ack; throughput = messages / elapsed. The counting client only
   walks length prefixes, so it does not limit the server.

With ``--offload compressed`` or ``--offload archived`` the journal is filled in 10 MB
segments and every sealed one is moved into a segment file before the runs, so replay
reads the files (journal maintenance, issue 5).

    python tools/bench/bench_replay.py --messages 1000000
    python tools/bench/bench_replay.py --messages 1000000 --runs 1 --offload compressed
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RawClient, emit, env_info, running_instance

from amps_py.protocol import encode_frame
from txlog import Journal, Record, publisher_hash

_LEN = struct.Struct(">I")


def fill(
    journal_dir: Path, name: str, n: int, size: int, compression: str, segment_size: int
) -> float:
    t0 = time.perf_counter()
    pubs = [(publisher_hash(f"filler-{i}"), f"filler-{i}") for i in range(4)]
    body = b'{"id":%010d,"pad":"' + b"x" * (size - 30) + b'"}'
    with Journal(
        journal_dir, instance_name=name, compression=compression, segment_size=segment_size
    ) as j:
        seq = 0
        batch = 20_000
        ts = time.time_ns() // 1000 - n  # one µs apart, in the past
        while seq < n:
            recs = []
            for k in range(seq, min(n, seq + batch)):
                ph, cname = pubs[k % 4]
                recs.append(
                    Record(
                        topic="bench",
                        payload=body % k,
                        pub_hash=ph,
                        seq=k // 4 + 1,
                        client_name=cname,
                        origin=name,
                    )
                )
            j.append(recs, ts + seq)
            seq += len(recs)
    return time.perf_counter() - t0


def offload(journal_dir: Path, name: str, state: str) -> tuple[int, float]:
    """Move every sealed segment into a segment file (``state``: compressed or
    archived), purge LMDB; returns (segments moved, seconds)."""
    t0 = time.perf_counter()
    with Journal(
        journal_dir, instance_name=name, archive_directory=journal_dir.parent / "archive"
    ) as j:
        sealed = j.segments()[:-1]
        for seg in sealed:
            j.mark_offloaded(seg.id, state, j.write_segment_file(seg, state))
        while j.purge_step(50_000):
            pass
    return len(sealed), time.perf_counter() - t0


def replay(port: int, expect: int) -> tuple[int, float]:
    client = RawClient(port, "replayer")
    sock = client.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.sendall(
        encode_frame(
            {"c": "subscribe", "t": "bench", "sub_id": "r", "bm": "0", "a": "completed", "cid": "2"}
        )
    )
    t0 = time.perf_counter()
    count = 0
    buf = b""
    done = False
    while not done:
        data = sock.recv(4 << 20)
        if not data:
            raise ConnectionError("server closed the connection")
        buf = buf + data if buf else data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            if buf[pos + 4 : pos + 13] == b'{"c":"ack':
                done = True
            else:
                count += 1
            pos += 4 + size
        buf = buf[pos:]
    elapsed = time.perf_counter() - t0
    client.close()
    if count != expect:
        print(f"# WARNING: replayed {count}, expected {expect}", flush=True)
    return count, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--compression", default="none", choices=["none", "zstd"])
    ap.add_argument("--runs", type=int, default=3, help="replay runs (restart measured each time)")
    ap.add_argument(
        "--offload",
        default="none",
        choices=["none", "compressed", "archived"],
        help="move sealed 10 MB segments into segment files before replaying",
    )
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="amps-bench-replay-"))
    journal = work / "bench-journal"
    segment_size = 10_000_000 if a.offload != "none" else 1024**3
    fill_s = fill(journal, "bench", a.messages, a.size, a.compression, segment_size)
    size_mb = (journal / "data.mdb").stat().st_size / 1e6
    print(f"# filled {a.messages} records in {fill_s:.1f} s; data.mdb {size_mb:.0f} MB", flush=True)
    if a.offload != "none":
        moved, secs = offload(journal, "bench", a.offload)
        print(f"# {a.offload} {moved} segments in {secs:.1f} s", flush=True)
    t0 = time.perf_counter()
    Journal(journal, instance_name="bench", readonly=True).close()
    open_ms = (time.perf_counter() - t0) * 1000
    for run in range(a.runs):
        with running_instance(work, "bench", compression=a.compression) as inst:
            count, elapsed = replay(inst["port"], a.messages)
        emit(
            {
                "bench": "replay_epoch",
                "run": run,
                "messages": count,
                "size": a.size,
                "compression": a.compression,
                "offload": a.offload,
                "msgs_per_s": round(count / elapsed),
                "elapsed_s": round(elapsed, 2),
                "restart_to_listening_s": round(inst["start_seconds"], 3),
                "journal_open_ms": round(open_ms, 1),
                "journal_mb": round(size_mb),
            },
            a.out,
        )


if __name__ == "__main__":
    main()
