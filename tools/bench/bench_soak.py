#!/usr/bin/env python3
"""A long soak of one instance process under a steady mixed load (issue 24).

The load, all from this one trio process over raw sockets:

- one publisher sends ``--rate`` messages a second (default 3,000; 200 B JSON, its
  seq and its send time in the payload) to topic ``soak`` and reads its persisted acks;
- ``--live`` live subscribers (default 10) subscribe before the first publish and read
  everything;
- every ``--replay-every`` seconds (default 0.5) a new client logs on and subscribes
  from a timestamp bookmark 0.5 to ``--replay-seconds`` (default 5) seconds back (a
  bookmark replay that goes live), reads for 1 to 4 s after its replay completed, and
  leaves; one in ``--abrupt-one-in`` (default 10) leaves abruptly (SO_LINGER 0, then
  close: the server sees a connection reset while it is sending). While
  ``--max-replaying`` (default 20) replaying clients are still connected, no new one
  starts (a starved machine would otherwise pile them up without end); the minute's
  line counts those ``skipped``.

Every minute it prints one line: messages published and delivered (live and replayed)
in that minute, the server's RssAnon (anonymous memory, from /proc/PID/status), its
open fds and threads, its CPU, and the p50/p99 publish-to-delivery latency seen by
the live subscribers (every tenth message; measured in this process, so it includes
this process's own scheduling).

At the end it stops publishing, waits for the live subscribers to receive every
message, and checks that none lost nothing and saw nothing out of order or twice; that
every replaying client saw a gap-free sequence across the replay/live seam; and that
the server log has no error-level line and no traceback. Memory: the mean RssAnon of
minutes 5-10 is compared with the mean of the last 5 minutes (for runs shorter than
15 minutes: the middle third against the last third), and it is sampled again
``--settle`` seconds after the load stopped. Exit status 1 when a check fails.

    python tools/bench/bench_soak.py                 # one hour
    python tools/bench/bench_soak.py --minutes 12
    python tools/bench/bench_soak.py --minutes 3 --heap-stats     # heap figures per minute

With ``--heap-stats`` the server also writes its heap figures every minute (see
``_HEAP_STATS_SERVER``) to ``heap.jsonl`` in the work directory, and this program
prints, per minute, Python's allocated blocks, glibc's bytes in use and free, and the
GC-tracked types whose count grew most; after the settle time it asks the server to
``malloc_trim`` and prints RssAnon before and after. (tracemalloc is no use here: it
slows the server below the load.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import config_xml, percentile, ready_ports

from amps_py.protocol import encode_frame

_LEN = struct.Struct(">I")
TOPIC = "soak"
#: payload: fixed-width fields, so a reader slices them out without a JSON parser
_PAYLOAD = b'{"n":%010d,"t":%019d,"pad":"' + b"x" * 140 + b'"}'
_N_AT = len(b'{"n":')
_T_AT = len(b'{"n":0000000000,"t":')
_PAYLOAD_HEAD = b'{"n":'

#: started with ``--heap-stats``: the server with two signal handlers. SIGUSR1 appends
#: one JSON line to $SOAK_HEAP_STATS: Python's allocated blocks, glibc's malloc figures
#: (mallinfo2: bytes in use, free bytes kept in the heap, mmapped bytes) and the count
#: of every GC-tracked type (gc.get_objects: a pause of a fraction of a second).
#: SIGUSR2 runs ``malloc_trim(0)`` (give free heap memory back to the system) and
#: appends a line with ``trimmed``: RssAnon that then falls was free memory glibc kept,
#: not memory anything holds.
_HEAP_STATS_SERVER = """
import collections, ctypes, gc, json, os, signal, sys, time
_libc = ctypes.CDLL("libc.so.6")
class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]
_libc.mallinfo2.restype = _Mallinfo2
def _rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return -1
def _anon_by_kind():
    # anonymous memory by mapping: the brk heap (glibc's main arena), 1 MiB mappings
    # (pymalloc arenas), up to 64 MiB (other glibc arenas: one per thread that mallocs),
    # the rest (big mmapped blocks, stacks)
    kinds = {"brk_heap": 0, "pymalloc_1m": 0, "thread_arenas": 0, "other": 0}
    size = 0
    kind = "other"
    for line in open("/proc/self/smaps"):
        first = line.split()
        if "-" in first[0] and not first[0].endswith(":"):
            lo, hi = (int(x, 16) for x in first[0].split("-"))
            size = hi - lo
            name = first[5] if len(first) > 5 else ""
            if name == "[heap]":
                kind = "brk_heap"
            elif name:
                kind = None
            elif size == 1 << 20:
                kind = "pymalloc_1m"
            elif (32 << 20) < size <= (64 << 20):
                kind = "thread_arenas"
            else:
                kind = "other"
        elif first[0] == "Anonymous:" and kind is not None:
            kinds[kind] += int(first[1]) * 1024
    return kinds
def _write(extra):
    m = _libc.mallinfo2()
    line = {"at": time.time(), "rss_anon": _rss_anon(), "blocks": sys.getallocatedblocks(),
            "malloc_in_use": m.uordblks, "malloc_free": m.fordblks, "mmapped": m.hblkhd,
            "heap": m.arena, "anon": _anon_by_kind(), **extra}
    with open(os.environ["SOAK_HEAP_STATS"], "a") as f:
        f.write(json.dumps(line) + "\\n")
def _stats(signum, frame):
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    _write({"types": dict(types.most_common(60))})
def _trim(signum, frame):
    before = _rss_anon()
    _libc.malloc_trim(0)
    _write({"trimmed": True, "rss_anon_before_trim": before})
signal.signal(signal.SIGUSR1, _stats)
signal.signal(signal.SIGUSR2, _trim)
from amps_py.cli import main
sys.argv = ["amps-py", *sys.argv[1:]]
main()
"""


@dataclass
class Figures:
    """What the load saw; the per-minute fields are reset every minute."""

    published: int = 0
    acked: int = 0
    live_delivered: int = 0
    replay_delivered: int = 0
    latencies: list[float] = field(default_factory=list)
    replays_started: int = 0
    replays_completed: int = 0
    abrupt_closes: int = 0
    clean_closes: int = 0
    replay_errors: list[str] = field(default_factory=list)
    #: replaying clients connected now, and the most at once this minute
    replaying_now: int = 0
    replaying_max: int = 0
    #: replaying clients not started this minute because --max-replaying were connected
    skipped: int = 0
    # totals (never reset)
    total_published: int = 0
    total_live: int = 0
    total_replayed: int = 0
    total_replays: int = 0
    total_abrupt: int = 0


@dataclass
class LiveSub:
    """One live subscriber's order check: ``last`` is the highest seq seen."""

    index: int
    #: set once it has received the publisher's last message
    caught_up: trio.Event = field(default_factory=trio.Event)
    last: int = 0
    received: int = 0
    out_of_order: int = 0
    gaps: int = 0
    missing: int = 0


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict (Linux)."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def server_sample(pid: int) -> dict[str, float]:
    """RssAnon (MB), open fds, threads and CPU seconds of the server process."""
    status = proc_status(pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {
        "rss_anon_mb": int(status["RssAnon"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"]),
        "cpu_s": cpu,
    }


def timestamp_bookmark(unix_seconds: float) -> str:
    """An AMPS timestamp bookmark (UTC, microseconds) for ``unix_seconds``."""
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y%m%dT%H%M%S.%fZ")


async def logon(stream: trio.SocketStream, name: str) -> bytes:
    """Log on as ``name``; returns bytes received after the logon ack."""
    await stream.send_all(
        encode_frame({"c": "logon", "cid": "logon", "client_name": name, "a": "processed"})
    )
    buf = b""
    while True:
        data = await stream.receive_some(1 << 16)
        if not data:
            raise ConnectionError(f"{name}: the server closed the connection at logon")
        buf += data
        if len(buf) >= 4:
            (size,) = _LEN.unpack_from(buf, 0)
            if len(buf) >= 4 + size:
                return buf[4 + size :]


def walk(buf: bytes) -> tuple[list[bytes], bytes]:
    """Split ``buf`` into whole frames (without length prefixes) and the rest."""
    frames = []
    pos = 0
    end = len(buf)
    while end - pos >= 4:
        (size,) = _LEN.unpack_from(buf, pos)
        if end - pos - 4 < size:
            break
        frames.append(buf[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames, buf[pos:]


def payload_fields(frame: bytes) -> tuple[int, int] | None:
    """(seq, send time ns) of a delivered soak message, None for any other frame."""
    if not frame.startswith(b'{"c":"p"'):
        return None
    at = frame.find(_PAYLOAD_HEAD)
    if at < 0:
        return None
    return int(frame[at + _N_AT : at + _N_AT + 10]), int(frame[at + _T_AT : at + _T_AT + 19])


class Soak:
    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.args = args
        self.port = port
        self.fig = Figures()
        self.live = [LiveSub(i) for i in range(args.live)]
        self.rng = random.Random(args.seed)
        self.publishing = True
        self.last_seq = 0
        #: set once the publisher has sent its last message and seen it acknowledged
        self.publisher_done = trio.Event()
        #: the last seq, once publishing stopped (0 until then)
        self.final_seq = 0
        self.all_acked = trio.Event()

    async def connect(self) -> trio.SocketStream:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return stream

    async def publisher(self, started: trio.Event) -> None:
        """Publish ``--rate`` messages a second, in 10 ms ticks, until told to stop."""
        stream = await self.connect()
        await logon(stream, "soak-publisher")
        head = b'{"c":"p","t":"' + TOPIC.encode() + b'","a":"persisted","s":'
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_acks, stream)
            started.set()
            t0 = trio.current_time()
            rate = self.args.rate
            seq = 0
            while self.publishing:
                due = int((trio.current_time() - t0) * rate)
                parts = []
                now_ns = time.perf_counter_ns()
                while seq < due:
                    seq += 1
                    h = head + b"%d}" % seq
                    body = _PAYLOAD % (seq, now_ns)
                    parts.append(_LEN.pack(len(h) + len(body)) + h + body)
                if parts:
                    await stream.send_all(b"".join(parts))
                    self.fig.published += len(parts)
                    self.fig.total_published += len(parts)
                    self.last_seq = seq
                await trio.sleep(0.01)
            # every message acknowledged (with a deadline), then close
            self.final_seq = seq
            self._check_done()
            with trio.move_on_after(60):
                await self.all_acked.wait()
            nursery.cancel_scope.cancel()
        await stream.aclose()
        self.publisher_done.set()

    def _check_done(self) -> None:
        """Once publishing stopped: set the events of whoever has everything."""
        final = self.final_seq
        if not final:
            return
        if self.fig.acked >= final:
            self.all_acked.set()
        for sub in self.live:
            if sub.last >= final:
                sub.caught_up.set()

    async def _read_acks(self, stream: trio.SocketStream) -> None:
        buf = b""
        while True:
            data = await stream.receive_some(1 << 16)
            if not data:
                return
            frames, buf = walk(buf + data)
            for frame in frames:
                if b'"a":"persisted"' in frame:
                    at = frame.find(b'"s":')
                    end = at + 4
                    while frame[end : end + 1].isdigit():
                        end += 1
                    self.fig.acked = max(self.fig.acked, int(frame[at + 4 : end]))
            self._check_done()

    async def live_subscriber(self, sub: LiveSub, ready: trio.Event) -> None:
        """Subscribe live before the first publish; check every seq arrives once, in
        order; sample the latency of every tenth message."""
        stream = await self.connect()
        rest = await logon(stream, f"soak-live-{sub.index}")
        await stream.send_all(
            encode_frame(
                {"c": "subscribe", "t": TOPIC, "sub_id": "live", "cid": "s", "a": "processed"}
            )
        )
        ready.set()
        buf = rest
        fig = self.fig
        lat = fig.latencies
        pc = time.perf_counter_ns
        while True:
            data = await stream.receive_some(1 << 20)
            if not data:
                raise ConnectionError(f"live subscriber {sub.index}: the server closed it")
            frames, buf = walk(buf + data)
            now = pc()
            n_here = 0
            for frame in frames:
                got = payload_fields(frame)
                if got is None:
                    continue
                n, sent = got
                n_here += 1
                if n != sub.last + 1:
                    if n <= sub.last:
                        sub.out_of_order += 1
                    else:
                        sub.gaps += 1
                        sub.missing += n - sub.last - 1
                sub.last = max(sub.last, n)
                if n % 10 == sub.index % 10:
                    lat.append((now - sent) / 1e6)
            sub.received += n_here
            fig.live_delivered += n_here
            fig.total_live += n_here
            if self.final_seq and sub.last >= self.final_seq:
                sub.caught_up.set()

    async def replayer(self, index: int, abrupt: bool, back: float, stay: float) -> None:
        """One replaying client: from ``back`` seconds ago, then live for ``stay``
        seconds after the replay completed; close abruptly or cleanly."""
        fig = self.fig
        name = f"soak-replay-{index}"
        stream = await self.connect()
        fig.replaying_now += 1
        fig.replaying_max = max(fig.replaying_max, fig.replaying_now)
        try:
            rest = await logon(stream, name)
            await stream.send_all(
                encode_frame(
                    {
                        "c": "subscribe",
                        "t": TOPIC,
                        "sub_id": "r",
                        "cid": "r",
                        "bm": timestamp_bookmark(time.time() - back),
                        "a": "completed",
                    }
                )
            )
            buf = rest
            last = 0
            leave_at: float | None = None
            while leave_at is None or trio.current_time() < leave_at:
                with trio.move_on_at(leave_at if leave_at is not None else float("inf")):
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        fig.replay_errors.append(f"{name}: the server closed the connection")
                        return
                    frames, buf = walk(buf + data)
                    n_here = 0
                    for frame in frames:
                        if frame.startswith(b'{"c":"ack"') and leave_at is None:
                            if b'"status":"failure"' in frame:
                                fig.replay_errors.append(f"{name}: {frame[:300]!r}")
                                return
                            fig.replays_completed += 1
                            leave_at = trio.current_time() + stay
                            continue
                        got = payload_fields(frame)
                        if got is None:
                            continue
                        n = got[0]
                        n_here += 1
                        if last and n != last + 1:
                            fig.replay_errors.append(f"{name}: seq {n} after {last}")
                        last = n
                    fig.replay_delivered += n_here
                    fig.total_replayed += n_here
        finally:
            fig.replaying_now -= 1
            if abrupt:
                # RST: the server's next read or write fails with a reset
                stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                fig.abrupt_closes += 1
                fig.total_abrupt += 1
            else:
                fig.clean_closes += 1
            stream.socket.close()

    async def replay_spawner(self, nursery: trio.Nursery) -> None:
        index = 0
        a = self.args
        while self.publishing:
            await trio.sleep(a.replay_every)
            if self.fig.replaying_now >= a.max_replaying:
                self.fig.skipped += 1
                continue
            index += 1
            abrupt = self.rng.randrange(a.abrupt_one_in) == 0
            back = self.rng.uniform(0.5, a.replay_seconds)
            stay = self.rng.uniform(1.0, 4.0)
            self.fig.replays_started += 1
            self.fig.total_replays += 1
            nursery.start_soon(self._replayer_guarded, index, abrupt, back, stay)

    async def _replayer_guarded(self, index: int, abrupt: bool, back: float, stay: float) -> None:
        try:
            await self.replayer(index, abrupt, back, stay)
        except (OSError, trio.BrokenResourceError, ConnectionError) as exc:
            self.fig.replay_errors.append(f"soak-replay-{index}: {exc!r}")


MB = 1024 * 1024


async def heap_stats(pid: int, signum: int, path: Path) -> dict[str, Any]:
    """Send ``signum`` to the server and return the line it appends to ``path`` (polled,
    with a deadline)."""
    file = trio.Path(path)
    count = len((await file.read_text()).splitlines()) if await file.exists() else 0
    os.kill(pid, signum)
    deadline = trio.current_time() + 30
    while trio.current_time() < deadline:
        lines = (await file.read_text()).splitlines() if await file.exists() else []
        if len(lines) > count:
            return dict(json.loads(lines[count]))
        await trio.sleep(0.05)
    raise SystemExit(f"the server wrote no heap figures to {path} within 30 s")


async def heap_line(pid: int, path: Path, prev: dict[str, Any] | None) -> dict[str, Any]:
    """Ask the server for its heap figures, print them (with the types that grew most
    since ``prev``) and return them."""
    now = await heap_stats(pid, signal.SIGUSR1, path)
    grew = ""
    if prev is not None:
        old = prev["types"]
        deltas = sorted(((n - old.get(t, 0), t) for t, n in now["types"].items()), reverse=True)
        grew = ", ".join(f"{t} +{d}" for d, t in deltas[:6] if d > 0)
    anon = ", ".join(f"{k} {v / MB:.1f}" for k, v in now["anon"].items())
    print(
        f"#   heap: {now['blocks']} blocks, main arena in use {now['malloc_in_use'] / MB:.1f} MB "
        f"free {now['malloc_free'] / MB:.1f} MB; anon MB: {anon}"
        f"{'; grew: ' + grew if grew else ''}",
        flush=True,
    )
    return now


def memory_verdict(rss: list[float]) -> tuple[str, bool]:
    """Compare the warm memory (minutes 5-10, or the middle third of a short run) with
    the end (the last 5 minutes, or the last third). Flat: within 2 MB or 5 %."""
    n = len(rss)
    if n >= 15:
        warm, end, how = rss[4:10], rss[-5:], "minutes 5-10 vs the last 5 minutes"
    elif n >= 3:
        third = n // 3
        warm, end, how = rss[third : 2 * third], rss[-third:], "middle third vs last third"
    else:
        return "too short to judge (fewer than 3 minutes)", True
    w, e = statistics.mean(warm), statistics.mean(end)
    flat = e - w <= max(2.0, 0.05 * w)
    return (
        f"RssAnon mean {w:.1f} MB ({how}: {e:.1f} MB): "
        f"{'flat' if flat else f'grew by {e - w:.1f} MB'}",
        flat,
    )


def log_problems(log_path: Path) -> tuple[list[str], int]:
    """Error-or-worse lines and traceback starts in the server log; and the number of
    client disconnects logged."""
    problems = []
    disconnects = 0
    if not log_path.exists():
        return ["no server log at " + str(log_path)], 0
    for line in log_path.read_text(errors="replace").splitlines():
        severe = any(f"] {level}: " in line for level in ("error", "critical", "emergency"))
        if severe or line.startswith("Traceback") or "ExceptionGroup" in line:
            problems.append(line[:300])
        if " disconnected: " in line:
            disconnects += 1
    return problems, disconnects


def start_server(work: Path, a: argparse.Namespace) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Start the instance (info-level log, so disconnects are counted); return the
    process, its client port and its log file."""
    journal = work / "soak-journal"
    cfg = work / "soak.xml"
    cfg.write_text(config_xml("soak", 0, journal).replace("<Level>warning", "<Level>info"))
    ready = work / "soak.ready"
    env = dict(os.environ)
    if a.heap_stats:
        env["SOAK_HEAP_STATS"] = str(work / "heap.jsonl")
        cmd = [sys.executable, "-c", _HEAP_STATS_SERVER]
    else:
        cmd = [sys.executable, "-m", "amps_py"]
    proc = subprocess.Popen(
        [*cmd, "serve", "--config", str(cfg), "--ready-file", str(ready)],
        cwd=work,
        env=env,
        stdout=open(work / "soak.out", "ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"instance did not start: {(work / 'soak.out').read_text()}")
        time.sleep(0.01)
    return proc, ready_ports(ready)["json-tcp"], journal.parent / "soak.log"


async def run(a: argparse.Namespace, pid: int, port: int, log_path: Path) -> int:
    soak = Soak(a, port)
    fig = soak.fig
    rss_per_minute: list[float] = []
    failures: list[str] = []
    print(
        "# min  published  acked_total  live_deliv  replay_deliv  replays(abrupt)  "
        "max_replaying(skipped)  rss_anon_MB  fds  threads  cpu%  gen_cpu%  p50_ms  p99_ms",
        flush=True,
    )
    async with trio.open_nursery() as nursery:
        ready = [trio.Event() for _ in soak.live]
        for sub, ev in zip(soak.live, ready, strict=True):
            nursery.start_soon(soak.live_subscriber, sub, ev)
        for ev in ready:
            await ev.wait()
        await trio.sleep(0.2)  # (load generator only) let the subscribe commands land
        started = trio.Event()
        nursery.start_soon(soak.publisher, started)
        await started.wait()
        nursery.start_soon(soak.replay_spawner, nursery)
        prev = server_sample(pid)
        gen_prev = time.process_time()
        heap_prev: dict[str, Any] | None = None
        for minute in range(1, a.minutes + 1):
            await trio.sleep(60)
            now = server_sample(pid)
            gen_now = time.process_time()
            lat = sorted(fig.latencies)
            fig.latencies.clear()  # (the subscribers append to this very list)
            rss_per_minute.append(now["rss_anon_mb"])
            print(
                f"{minute:5d}  {fig.published:9d}  {fig.acked:11d}  {fig.live_delivered:10d}  "
                f"{fig.replay_delivered:12d}  {fig.replays_started:6d}({fig.abrupt_closes:3d})  "
                f"{fig.replaying_max:13d}({fig.skipped:4d})  "
                f"  {now['rss_anon_mb']:11.1f}  {now['fds']:3.0f}  {now['threads']:7.0f}  "
                f"{100 * (now['cpu_s'] - prev['cpu_s']) / 60:4.0f}  "
                f"{100 * (gen_now - gen_prev) / 60:8.0f}  "
                f"{percentile(lat, 50):6.2f}  {percentile(lat, 99):6.2f}",
                flush=True,
            )
            if a.heap_stats:
                heap_prev = await heap_line(pid, log_path.parent / "heap.jsonl", heap_prev)
            prev, gen_prev = now, gen_now
            fig.published = fig.live_delivered = fig.replay_delivered = 0
            fig.replays_started = fig.abrupt_closes = fig.clean_closes = 0
            fig.replaying_max = fig.replaying_now
            fig.skipped = 0
        soak.publishing = False
        with trio.move_on_after(120):
            await soak.publisher_done.wait()
        last = soak.last_seq
        # every live subscriber gets everything (with a deadline)
        with trio.move_on_after(120):
            for sub in soak.live:
                await sub.caught_up.wait()
        nursery.cancel_scope.cancel()
    print(
        f"# published {fig.total_published} (acked up to {fig.acked}); live delivered "
        f"{fig.total_live} ({a.live} x {fig.total_published} expected); replayed "
        f"{fig.total_replayed} to {fig.total_replays} replaying clients "
        f"({fig.total_abrupt} closed abruptly)",
        flush=True,
    )
    if fig.acked < last:
        failures.append(f"persisted acks reached {fig.acked}, published {last}")
    for s in soak.live:
        if s.last < last or s.missing or s.out_of_order or s.received != last:
            failures.append(
                f"live subscriber {s.index}: received {s.received} of {last} "
                f"(highest {s.last}), {s.missing} missing in {s.gaps} gaps, "
                f"{s.out_of_order} out of order or repeated"
            )
    for err in fig.replay_errors[:10]:
        failures.append("replaying client " + err)
    if len(fig.replay_errors) > 10:
        failures.append(f"... and {len(fig.replay_errors) - 10} more replaying-client errors")
    verdict, flat = memory_verdict(rss_per_minute)
    print(f"# memory: {verdict}", flush=True)
    if not flat:
        failures.append("anonymous memory grew after warm-up: " + verdict)
    # memory after the load stopped (every client gone)
    await trio.sleep(a.settle)
    after = server_sample(pid)
    print(
        f"# {a.settle:.0f} s after the load stopped: RssAnon {after['rss_anon_mb']:.1f} MB, "
        f"{after['fds']:.0f} fds, {after['threads']:.0f} threads",
        flush=True,
    )
    if a.heap_stats:
        heap_file = log_path.parent / "heap.jsonl"
        await heap_line(pid, heap_file, None)
        trimmed = await heap_stats(pid, signal.SIGUSR2, heap_file)
        print(
            f"# after malloc_trim(0): RssAnon {trimmed['rss_anon_before_trim'] / MB:.1f} -> "
            f"{trimmed['rss_anon'] / MB:.1f} MB (glibc kept "
            f"{(trimmed['rss_anon_before_trim'] - trimmed['rss_anon']) / MB:.1f} MB free)",
            flush=True,
        )
    problems, disconnects = log_problems(log_path)
    print(f"# server log: {disconnects} client disconnects, {len(problems)} error/traceback lines")
    for line in problems[:10]:
        print("#   " + line)
    if problems:
        failures.append(f"the server log has {len(problems)} error-level or traceback lines")
    for f in failures:
        print("FAIL:", f, flush=True)
    if not failures:
        print("OK: nothing lost or reordered, memory flat, no error in the log", flush=True)
    return 1 if failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--rate", type=int, default=3000, help="messages published a second")
    ap.add_argument("--live", type=int, default=10, help="live subscribers")
    ap.add_argument("--replay-every", type=float, default=0.5, help="seconds between replays")
    ap.add_argument(
        "--replay-seconds", type=float, default=5.0, help="a replay starts up to this far back"
    )
    ap.add_argument(
        "--max-replaying",
        type=int,
        default=20,
        help="no new replaying client while this many are connected",
    )
    ap.add_argument("--abrupt-one-in", type=int, default=10)
    ap.add_argument("--settle", type=float, default=30.0, help="seconds after the load stops")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--heap-stats", action="store_true", help="the server's heap figures every minute"
    )
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.randrange(1 << 32)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="amps-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"# soak: {a.minutes} min, {a.rate} msg/s, {a.live} live subscribers, a replay "
        f"every {a.replay_every} s, 1 in {a.abrupt_one_in} abrupt, seed {a.seed}, "
        f"workdir {work}",
        flush=True,
    )
    proc, port, log_path = start_server(work, a)
    print(f"# server pid {proc.pid}, port {port}, log {log_path}", flush=True)
    try:
        status = trio.run(run, a, proc.pid, port, log_path)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    sys.exit(status)


if __name__ == "__main__":
    main()
