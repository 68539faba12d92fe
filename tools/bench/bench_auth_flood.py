"""What a flood of wrong passwords does to everyone else: heartbeat round trips of an
authenticated client, and admin API latency, while other processes guess passwords.

Run with ``python tools/bench/bench_auth_flood.py [--attackers 4] [--seconds 10]``.
A program, not a test: it prints one JSON line per phase (``--out`` appends them to a
file too) and exits 0.

It starts an instance (its own process, port 0 and a ready file) with
``amps-password-file`` (scrypt n=2**14, the default) and the admin API, logs one client
on with the right password and sends ``heartbeat`` commands asking for a ``processed``
ack back to back (``--gap`` ms apart), timing each round trip, through these phases:

* ``baseline``: nothing else happens;
* ``flood_one_address``: ``--attackers`` processes each make logons, one after another,
  as user ``alice`` with a different wrong password each, from 127.0.0.1 (a new
  connection per attempt: logon, failure ack, close);
* ``flood_many_addresses``: the same, but each attempt from its own source address
  (127.0.x.y: Linux routes all of 127/8 to the loopback) and as its own user, so no
  per-address or per-user back-off applies and every attempt is checked;
* ``admin_baseline``: authenticated admin GETs (user ``ops``, right password, from
  127.0.0.200), one after another with 20 ms between, timed;
* ``admin_flood``: the same GETs while the attackers send wrong HTTP Basic guesses for
  user ``root`` to the admin API from 127.0.0.1 (a new connection each).

Each phase lasts ``--seconds``. For each: heartbeat round-trip p50/p90/p99/max (ms),
the admin GETs' p50/max (admin phases); ``checked``: attacker attempts whose answer
says the password was checked (``unknown user or wrong password``, or a 401 without
"too many failed logons"), i.e. scrypt runs the flood cost; ``refused_unchecked``: the
rest; ``attempts_per_s``: the attackers' rate (each attempt a new connection).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import multiprocessing
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, env_info, percentile, running_instance

from amps_py.auth import PasswordFile
from amps_py.protocol import FrameDecoder, encode_frame

PASSWORDS = {"alice": "Alice-Bench-Secret-1", "ops": "Ops-Bench-Secret-2"}
TOO_MANY = "too many failed logons"


# ------------------------------------------------------------------ attackers


def _source(index: int, many: bool) -> str:
    if not many:
        return "127.0.0.1"
    return f"127.{1 + (index >> 16) % 254}.{(index >> 8) & 255}.{1 + index % 254}"


def _logon_once(port: int, user: str, password: str, source: str) -> str:
    """One logon; the failure's detail ('' for a success)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((source, 0))
        sock.settimeout(60)
        sock.connect(("127.0.0.1", port))
        header = {"c": "logon", "client_name": f"x{random.getrandbits(40)}", "user_id": user}
        header.update(pw=password, a="processed", cid="1")
        sock.sendall(encode_frame(header))
        decoder = FrameDecoder(1 << 20)
        while data := sock.recv(65536):
            decoder.receive_data(data)
            for frame in decoder.frames():
                h = frame.header
                return "" if h.get("status") == "success" else str(h.get("detail", h))
        return "closed without an answer"
    finally:
        sock.close()


def _admin_once(port: int, user: str, password: str, source: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        conn.request("GET", "/amps/instance/name", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def attacker(job: tuple[str, int, int, float, int]) -> tuple[int, int]:
    """Run one attacker process's attempts for ``seconds``: (checked, refused without
    a check)."""
    kind, port, worker, seconds, seed = job
    rng = random.Random(seed * 1000 + worker)
    checked = unchecked = 0
    deadline = time.monotonic() + seconds
    i = -1
    while time.monotonic() < deadline:
        i += 1
        guess = f"guess-{rng.randrange(10**12)}"
        if kind == "admin":
            status, body = _admin_once(port, "root", guess, "127.0.0.1")
            assert status == 401, (status, body)
            answer = body
        else:
            many = kind == "many"
            user = f"user{worker}-{i}" if many else "alice"
            answer = _logon_once(port, user, guess, _source(worker * 100_000 + i, many))
            assert answer, "a wrong password was accepted"
        if TOO_MANY in answer:
            unchecked += 1
        else:
            checked += 1
    return checked, unchecked


# ------------------------------------------------------------------ measurement


class Heartbeats(threading.Thread):
    """One logged-on client timing heartbeat round trips (``processed`` acks)."""

    def __init__(self, port: int, gap: float) -> None:
        super().__init__(daemon=True)
        self.gap = gap
        self.samples: list[tuple[float, float]] = []  # (sent at, round trip s)
        self.stop = threading.Event()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(1 << 20)
        logon = {"c": "logon", "cid": "0", "client_name": "beat", "a": "processed"}
        logon.update(user_id="alice", pw=PASSWORDS["alice"])
        self.sock.sendall(encode_frame(logon))
        ack = self._next()
        if ack.get("status") != "success":
            raise RuntimeError(f"the measuring client could not log on: {ack}")

    def _next(self) -> dict[str, Any]:
        while True:
            for frame in self.decoder.frames():
                return dict(frame.header)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the measuring connection")
            self.decoder.receive_data(data)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            t0 = time.perf_counter()
            self.sock.sendall(encode_frame({"c": "heartbeat", "a": "processed", "cid": str(n)}))
            while self._next().get("cid") != str(n):
                pass
            self.samples.append((t0, time.perf_counter() - t0))
            time.sleep(self.gap)

    def between(self, start: float, end: float) -> list[float]:
        return sorted(rtt for at, rtt in list(self.samples) if start <= at < end)


class AdminGets(threading.Thread):
    """Authenticated admin GETs one after another while ``running`` is set."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            status, body = _admin_once(self.port, "ops", PASSWORDS["ops"], "127.0.0.200")
            if status != 200:
                raise RuntimeError(f"the admin GET failed: {status} {body}")
            self.samples.append((t0, time.perf_counter() - t0))
            time.sleep(0.02)

    def between(self, start: float, end: float) -> list[float]:
        return sorted(d for at, d in list(self.samples) if start <= at < end)


def ms(values: list[float], p: float) -> float | None:
    return round(percentile(values, p) * 1000, 2) if values else None


def summary(phase: str, beats: list[float], admin: list[float]) -> dict[str, Any]:
    return {
        "phase": phase,
        "heartbeats": len(beats),
        "rtt_p50_ms": ms(beats, 50),
        "rtt_p90_ms": ms(beats, 90),
        "rtt_p99_ms": ms(beats, 99),
        "rtt_max_ms": round(max(beats) * 1000, 2) if beats else None,
        "admin_gets": len(admin),
        "admin_get_p50_ms": ms(admin, 50),
        "admin_get_max_ms": round(max(admin) * 1000, 2) if admin else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--gap", type=float, default=2.0, help="ms between heartbeats")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(f"seed {args.seed}", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="amps-bench-auth-"))
    users = PasswordFile(str(workdir / "users.pw"))
    for user, password in PASSWORDS.items():
        users = users.with_user(user, password)
    users.save()
    extra = (
        "<Authentication><Module>amps-password-file</Module><Options>"
        f"<PasswordFile>{workdir / 'users.pw'}</PasswordFile></Options></Authentication>"
        "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
    )
    with running_instance(workdir, "authflood", extra=extra, durability="page-cache") as inst:
        port, admin_port = inst["port"], inst["ports"]["admin"]
        beats = Heartbeats(port, args.gap / 1000)
        beats.start()
        context = multiprocessing.get_context("fork")
        with context.Pool(args.attackers) as pool:
            for phase, kind, target in (
                ("baseline", "", 0),
                ("flood_one_address", "one", port),
                ("flood_many_addresses", "many", port),
                ("admin_baseline", "", 0),
                ("admin_flood", "admin", admin_port),
            ):
                gets = AdminGets(admin_port)
                if phase.startswith("admin"):
                    gets.start()
                start = time.perf_counter()
                results = [(0, 0)]
                if kind:
                    workers = range(args.attackers)
                    jobs = [(kind, target, w, args.seconds, args.seed) for w in workers]
                    results = pool.map(attacker, jobs)
                else:
                    time.sleep(args.seconds)
                end = time.perf_counter()
                gets.stop.set()
                if gets.is_alive():
                    gets.join(60)
                row = summary(phase, beats.between(start, end), gets.between(start, end))
                if kind:
                    attempts = sum(c + u for c, u in results)
                    row["attempts"] = attempts
                    row["checked"] = sum(c for c, _ in results)
                    row["refused_unchecked"] = sum(u for _, u in results)
                    row["attempts_per_s"] = round(attempts / (end - start), 1)
                else:
                    row.update(env_info())
                emit(row, args.out)
                # let the back-offs of this phase run out before the next one
                time.sleep(2)
        beats.stop.set()
        beats.join(10)


if __name__ == "__main__":
    main()
