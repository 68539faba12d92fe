"""Shared pieces of the benchmark programs: start an instance, raw-socket clients,
latency summaries. Programs, not tests: they print figures."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from amps_py.protocol import FrameDecoder, encode_frame  # noqa: E402

_LEN = struct.Struct(">I")


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """Reserve a port for an instance whose port a peer's config must name before the
    instance starts (a replication pair); everywhere else, listen on port 0 and read the
    port from the ready file.

    Returns a socket bound to the port, with SO_REUSEADDR and not listening: while it is
    open the kernel gives the port to no port-0 bind or outgoing connection, yet the
    instance (trio binds with SO_REUSEADDR) can listen on it. Close it when done.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def ready_ports(ready_file: Path) -> dict[str, int]:
    """Listener name -> bound port, from an instance's ``--ready-file``."""
    info = json.loads(ready_file.read_text())
    return {name: int(port) for name, port in info["transports"].items()}


def config_xml(
    name: str,
    port: int,
    journal: Path,
    durability: str = "fsync",
    compression: str = "none",
    txlog_extra: str = "",
    extra: str = "",
) -> str:
    """A standalone instance journaling every topic; ``txlog_extra`` goes inside
    TransactionLog, ``extra`` inside AMPSConfig (e.g. Admin)."""
    return f"""<AMPSConfig>
  <Name>{name}</Name>
  <Transports><Transport><Name>json-tcp</Name><Type>tcp</Type>
    <InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol><MessageType>json</MessageType>
  </Transport></Transports>
  <TransactionLog><JournalDirectory>{journal}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
    <Durability>{durability}</Durability><Compression>{compression}</Compression>
    {txlog_extra}
  </TransactionLog>{extra}
  <Logging><Target><Protocol>file</Protocol>
    <FileName>{journal.parent / (name + ".log")}</FileName><Level>warning</Level>
  </Target></Logging>
</AMPSConfig>
"""


@contextmanager
def running_instance(
    workdir: Path | None = None, name: str = "bench", **kwargs: Any
) -> Iterator[dict[str, Any]]:
    """Start an instance process; yield {port, ports, journal, workdir, start_seconds}
    (``port``: the client port; ``ports``: every listener's, ``admin`` included). The
    client transport listens on ``port`` if given, else on one the OS picks."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="amps-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    port = kwargs.pop("port", None) or 0
    journal = tmp / f"{name}-journal"
    cfg = tmp / f"{name}.xml"
    cfg.write_text(config_xml(name, port, journal, **kwargs))
    ready = tmp / f"{name}.ready"
    ready.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "amps_py",
            "serve",
            "--config",
            str(cfg),
            "--ready-file",
            str(ready),
        ],
        cwd=tmp,
        stdout=open(tmp / f"{name}.out", "ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"instance did not start: {(tmp / (name + '.out')).read_text()}")
        time.sleep(0.002)
    started = time.perf_counter() - t0
    ports = ready_ports(ready)
    try:
        yield {
            "port": ports["json-tcp"],
            "ports": ports,
            "journal": journal,
            "workdir": tmp,
            "start_seconds": started,
            "pid": proc.pid,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


class RawClient:
    """A blocking-socket AMPS client for load generation (no trio overhead)."""

    def __init__(self, port: int, name: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(max_frame_size=1 << 30)
        self.sock.sendall(
            encode_frame({"c": "logon", "cid": "1", "client_name": name, "a": "processed"})
        )
        ack = self.next_frames(1)[0]
        self.logon_seq = int(ack.header.get("s", 0))

    def next_frames(self, at_least: int = 1) -> list[Any]:
        frames: list[Any] = []
        while len(frames) < at_least:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("server closed the connection")
            self.decoder.receive_data(data)
            frames.extend(self.decoder.frames())
        return frames

    def close(self) -> None:
        self.sock.close()


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def emit(result: dict[str, Any], out: Path | None) -> None:
    line = json.dumps(result)
    print(line, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(line + "\n")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def env_info() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "cpus": os.cpu_count()}
