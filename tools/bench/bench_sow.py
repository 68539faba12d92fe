#!/usr/bin/env python3
"""State of the World against a real instance process: fill, queries, snapshot,
publish throughput with and without a SOW topic.

A program, not a test: it prints one JSON line per measurement (``--out`` appends
them to a file too). The instance is started as bench_publish starts it (port 0 and
the ready file, ``Durability`` fsync by default), with one SOW topic ``sow_bench``
keyed by ``/id`` and every topic journaled.

Phases:

* ``sow_fill``: ``--records`` records of ``--size`` bytes (``{"id":N,"g":N%10,"d":"x…"}``)
  published by ``--publishers`` processes (ids split between them), each keeping
  ``--window`` messages without a persisted ack in flight; the rate counts until the
  last persisted ack.
* ``sow_query``: a ``sow`` of the whole topic and one with the filter ``/g = 3`` (1
  record in 10), ``--batch-size`` records per frame, from a raw-socket client: time from
  the command to ``group_end``, the first batch's arrival, records/s.
* ``sow_and_subscribe_snapshot``: the same for a ``sow_and_subscribe`` of the whole
  topic (command -> ``group_end``).
* ``publish_persisted``: ``--publishers`` publishers, ``--size`` bytes, ``--window``
  as bench_publish, for ``--secs`` seconds, to ``sow_bench`` (each message replaces a
  record: ids cycle over the filled ones) and to the plain journaled topic ``plain``
  (the same payloads), alternating.

Every measurement runs ``--repeat`` times (the machine may be shared).

    python tools/bench/bench_sow.py --records 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_publish import cpu_seconds, summarize
from common import RawClient, emit, env_info, running_instance

from amps_py.protocol import encode_frame

SOW_TOPIC = "sow_bench"
PLAIN_TOPIC = "plain"
SOW_XML = (
    f"<SOW><Topic><Name>{SOW_TOPIC}</Name><MessageType>json</MessageType>"
    "<Key>/id</Key></Topic></SOW>"
)
#: the filtered query's filter: 1 record in 10
FILTER = "/g = 3"


def payload_of(ident: int, size: int) -> bytes:
    """A ``size``-byte JSON record with key ``/id`` = ``ident``."""
    head = b'{"id":%d,"g":%d,"d":"' % (ident, ident % 10)
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


def publisher(
    port: int,
    name: str,
    topic: str,
    first_id: int,
    id_count: int,
    total: int | None,
    size: int,
    secs: float,
    window: int,
    q: Any,
) -> None:
    """One publisher process: ids ``first_id`` .. ``first_id + id_count - 1`` in turn
    (cycling), up to ``total`` messages (None: for ``secs`` seconds), at most
    ``window`` without a persisted ack; puts its figures on ``q``."""
    client = RawClient(port, name)
    sock, decoder = client.sock, client.decoder
    seq = acked = client.logon_seq
    first = seq + 1
    sent = 0
    sent_at: dict[int, float] = {}
    lat: list[float] = []
    pc = time.perf_counter
    head = b'{"c":"p","t":"' + topic.encode() + b'","a":"persisted","s":'
    t_start = pc()
    deadline = t_start + secs if total is None else float("inf")
    while True:
        now = pc()
        more = (sent < total) if total is not None else now < deadline
        if more:
            parts: list[bytes] = []
            while seq - acked < window and len(parts) < 128 and (total is None or sent < total):
                seq += 1
                payload = payload_of(first_id + sent % id_count, size)
                sent += 1
                h = head + str(seq).encode() + b"}"
                parts.append((len(h) + len(payload)).to_bytes(4, "big") + h + payload)
                sent_at[seq] = now
            if parts:
                sock.sendall(b"".join(parts))
        elif acked >= seq or now > deadline + 60:
            break
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError(f"{name}: the server closed the connection")
        decoder.receive_data(data)
        now = pc()
        for frame in decoder.frames():
            h = frame.header
            if h.get("c") == "ack" and h.get("a") == "persisted":
                if h.get("status") == "failure":
                    raise RuntimeError(f"{name}: publish refused: {h}")
                s = int(h["s"])
                for k in range(acked + 1, s + 1):
                    t = sent_at.pop(k, None)
                    if t is not None:
                        lat.append(now - t)
                acked = max(acked, s)
    elapsed = pc() - t_start
    client.close()
    q.put({"acked": acked - first + 1, "elapsed": elapsed, "lat": lat, "cpu": time.process_time()})


def run_publishers(
    port: int,
    topic: str,
    publishers: int,
    records: int,
    total: bool,
    size: int,
    secs: float,
    window: int,
    tag: str,
    server_pid: int,
) -> dict[str, Any]:
    """``publishers`` processes; with ``total`` each sends its share of ``records`` ids
    once (the fill), else each cycles over its share for ``secs`` seconds."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    share = records // publishers
    procs = []
    for i in range(publishers):
        count = share if i < publishers - 1 else records - share * (publishers - 1)
        procs.append(
            ctx.Process(
                target=publisher,
                args=(
                    port,
                    f"{tag}-p{i}",
                    topic,
                    i * share,
                    count,
                    count if total else None,
                    size,
                    secs,
                    window,
                    q,
                ),
            )
        )
    for p in procs:
        p.start()
    cpu0 = cpu_seconds(server_pid)
    timeout = secs + 120 if not total else 3600
    results = [q.get(timeout=timeout) for _ in procs]
    server_cpu = cpu_seconds(server_pid) - cpu0
    for p in procs:
        p.join()
    summary = summarize(results, publishers, size, window, secs)
    elapsed = summary.pop("elapsed")
    summary["server_cpu_pct"] = round(100 * server_cpu / elapsed)
    summary["elapsed_s"] = round(elapsed, 2)
    return summary


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def timed_query(
    port: int, command: str, topic: str, flt: str | None, batch_size: int, tag: str
) -> dict[str, Any]:
    """Send one ``sow`` / ``sow_and_subscribe`` from a raw-socket client; time to the
    first batch and to ``group_end``; count the records from the batches' ``bs``."""
    client = RawClient(port, tag)
    header: dict[str, Any] = {
        "c": command,
        "t": topic,
        "bs": batch_size,
        "query_id": tag,
        "a": "processed,completed",
    }
    if command == "sow_and_subscribe":
        header["sub_id"] = tag
    if flt:
        header["f"] = flt
    pc = time.perf_counter
    t0 = pc()
    client.sock.sendall(encode_frame(header))
    records = batches = 0
    first_batch = end = None
    while end is None:
        for frame in client.next_frames(1):
            h = frame.header
            c = h.get("c")
            if c == "sow":
                records += int(h.get("bs", 0))
                batches += 1
                if first_batch is None:
                    first_batch = pc() - t0
            elif c == "group_end":
                end = pc() - t0
            elif c == "ack" and h.get("status") == "failure":
                raise RuntimeError(f"{command} refused: {h}")
    client.close()
    return {
        "records": records,
        "batches": batches,
        "first_batch_s": round(first_batch or end, 3),
        "seconds": round(end, 3),
        "records_per_s": round(records / end) if end else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--durability", default="fsync", choices=["fsync", "page-cache"])
    ap.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    ap.add_argument("--keep", action="store_true", help="keep the journal and SOW store")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    a = ap.parse_args()
    print("#", env_info(), flush=True)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="amps-bench-sow-"))
    common = {"records": a.records, "size": a.size, "durability": a.durability}
    try:
        with running_instance(workdir, durability=a.durability, extra=SOW_XML) as inst:
            port, pid = inst["port"], inst["pid"]
            r = run_publishers(
                port, SOW_TOPIC, a.publishers, a.records, True, a.size, 0, a.window, "fill", pid
            )
            emit(
                {
                    "bench": "sow_fill",
                    **common,
                    "publishers": a.publishers,
                    "window": a.window,
                    "seconds": r["elapsed_s"],
                    "records_per_s": r["msgs_per_s"],
                    "server_cpu_pct": r["server_cpu_pct"],
                    "server_rss_mb": rss_mb(pid),
                },
                a.out,
            )
            for run in range(a.repeat):
                for name, flt in (("full", None), ("filtered_1_in_10", FILTER)):
                    q = timed_query(port, "sow", SOW_TOPIC, flt, a.batch_size, f"q{run}{name}")
                    emit(
                        {
                            "bench": "sow_query",
                            "query": name,
                            "filter": flt,
                            "run": run + 1,
                            **common,
                            "batch_size": a.batch_size,
                            **q,
                            "scanned_per_s": round(a.records / q["seconds"]),
                            "server_peak_rss_mb": peak_rss_mb(pid),
                        },
                        a.out,
                    )
            for run in range(a.repeat):
                q = timed_query(
                    port, "sow_and_subscribe", SOW_TOPIC, None, a.batch_size, f"ss{run}"
                )
                emit(
                    {
                        "bench": "sow_and_subscribe_snapshot",
                        "run": run + 1,
                        **common,
                        "batch_size": a.batch_size,
                        **q,
                        "server_peak_rss_mb": peak_rss_mb(pid),
                    },
                    a.out,
                )
            for run in range(a.repeat):
                for topic in (SOW_TOPIC, PLAIN_TOPIC):
                    r = run_publishers(
                        port,
                        topic,
                        a.publishers,
                        a.records,
                        False,
                        a.size,
                        a.secs,
                        a.window,
                        f"t{run}{topic}",
                        pid,
                    )
                    emit(
                        {
                            "bench": "publish_persisted",
                            "topic": topic,
                            "sow": topic == SOW_TOPIC,
                            "run": run + 1,
                            "durability": a.durability,
                            "sow_records": a.records,
                            **r,
                        },
                        a.out,
                    )
    finally:
        if not a.keep and a.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
