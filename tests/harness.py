"""Test harness: real amps-py instances as real processes, and pollers.

- :func:`write_config` writes a real AMPS-style XML config; give it port 0 and the OS
  picks a free port when the instance listens.
- :class:`ServerProcess` starts ``python -m amps_py serve --config ... --ready-file ...``,
  waits for the ready file (no sleeps), reads the ports every listener bound from it,
  and can ``stop`` (SIGTERM), ``kill`` (SIGKILL) and ``restart``.
- :func:`start_instance` starts one on port 0; a restart comes back on the port the
  first run bound.
- :func:`reserve_port` is for the cases port 0 cannot serve: a config that must name
  a peer's port before the peer has started (hot-hot pairs, rings), a transport that
  listens again on its configured port once re-enabled.
- :func:`wait_until` polls a function that returns what is still wrong (or ``None``)
  and fails with that text at the deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[1]


#: the client transport :func:`write_config` writes
CLIENT_TRANSPORT = "json-tcp"


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """Reserve a port for an instance that has not started yet, when a config must name
    it before then (replication peers that dial each other, a fault proxy in front of
    one, a transport re-enabled on its configured port). Everywhere else, listen on port
    0 and read the port from the ready file.

    Returns a socket bound to the port (``getsockname()[1]``), with SO_REUSEADDR and
    not listening; keep it open as long as the instance may (re)start there. While it
    is bound the kernel gives that port to no port-0 bind and no outgoing connection
    (ours or another program's), unlike a bind-close-reuse "free port"; yet the
    instance, which binds with SO_REUSEADDR as trio's listeners do, can listen on it.
    Connections to it are refused until the instance listens. Close it when done.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def write_config(
    directory: Path,
    name: str,
    port: int,
    *,
    topics: tuple[tuple[str, str], ...] = ((".*", "json"),),
    journal: bool = True,
    extra_transport: str = "",
    extra: str = "",
    max_message_size: str | None = None,
    journal_extra: str = "",
    transport_extra: str = "",
    client_message_type: str | None = "json",
) -> Path:
    """Write ``<directory>/<name>.xml`` for an instance with one client transport
    (``journal_extra`` goes inside ``TransactionLog``, ``transport_extra`` inside that
    client ``Transport``, whose MessageType is ``client_message_type``: None accepts
    every type)."""
    directory.mkdir(parents=True, exist_ok=True)
    topic_xml = "".join(
        f"<Topic><Name>{n}</Name><MessageType>{m}</MessageType></Topic>" for n, m in topics
    )
    txlog = (
        f"<TransactionLog><JournalDirectory>{directory / (name + '-journal')}</JournalDirectory>"
        f"{topic_xml}{journal_extra}</TransactionLog>"
        if journal
        else ""
    )
    mms = f"<MaxMessageSize>{max_message_size}</MaxMessageSize>" if max_message_size else ""
    client_type = f"<MessageType>{client_message_type}</MessageType>" if client_message_type else ""
    xml = f"""<?xml version="1.0"?>
<AMPSConfig>
  <Name>{name}</Name>
  <Transports>
    <Transport>
      <Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr>
      <Protocol>amps</Protocol>{client_type}{mms}{transport_extra}
    </Transport>
    {extra_transport}
  </Transports>
  {txlog}
  <Logging>
    <Target>
      <Protocol>file</Protocol><FileName>{directory / (name + ".log")}</FileName>
      <Level>info</Level>
    </Target>
  </Logging>
  {extra}
</AMPSConfig>
"""
    path = directory / f"{name}.xml"
    path.write_text(xml)
    return path


def wait_until_sync(
    check: Callable[[], str | None], timeout: float, interval: float = 0.02
) -> None:
    """Poll ``check`` (returns what is still wrong, or None) until None or the deadline."""
    deadline = time.monotonic() + timeout
    problem = check()
    while problem is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s still: {problem}")
        time.sleep(interval)  # polling interval of a condition, not a synchronisation sleep
        problem = check()


async def wait_until(
    check: Callable[[], str | None], timeout: float, interval: float = 0.02
) -> None:
    """Async twin of :func:`wait_until_sync`."""
    deadline = trio.current_time() + timeout
    problem = check()
    while problem is not None:
        if trio.current_time() > deadline:
            raise AssertionError(f"after {timeout} s still: {problem}")
        await trio.sleep(interval)
        problem = check()


class ServerProcess:
    """One amps-py instance in its own process, started from a config file.

    ``port`` is the client port the config names; 0 (the usual case) lets the OS pick
    one. Each start reads the ready file: ``ports`` maps every listener (transport
    names, ``admin``) to the port it bound, and ``port`` becomes the bound port of
    ``client_transport`` when the instance has one.
    """

    def __init__(
        self,
        config: Path,
        workdir: Path,
        port: int = 0,
        name: str = "inst",
        client_transport: str = CLIENT_TRANSPORT,
    ) -> None:
        self.config = config
        self.workdir = workdir
        self.port = port
        self.name = name
        self.client_transport = client_transport
        #: listener name -> bound port, from the ready file of the last start
        self.ports: dict[str, int] = {}
        self.ready_file = workdir / f"{name}.ready.json"
        self.output = workdir / f"{name}.out"
        self.stats_file = workdir / f"{name}.stats.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}/amps/json"

    def statistics(self) -> dict[str, Any]:
        """The instance's latest statistics (rewritten by the server 4 times a second)."""
        for _ in range(50):
            try:
                return dict(json.loads(self.stats_file.read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.01)  # the file is replaced atomically; retry a missed read
        raise AssertionError(f"instance {self.name} writes no statistics to {self.stats_file}")

    def destination(self, name: str) -> dict[str, Any]:
        """Statistics of one outgoing replication destination."""
        repl = self.statistics().get("replication") or {}
        for d in repl.get("destinations", []):
            if d["name"] == name:
                return dict(d)
        raise AssertionError(f"instance {self.name} has no destination {name!r}")

    @property
    def journal_dir(self) -> Path:
        return self.workdir / f"{self.name}-journal"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self, timeout: float = 120) -> ServerProcess:
        # a previous run's files must not pass for this process's (it rewrites both
        # before it reports ready)
        self.ready_file.unlink(missing_ok=True)
        self.stats_file.unlink(missing_ok=True)
        out = open(self.output, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "amps_py",
                "serve",
                "--config",
                str(self.config),
                "--ready-file",
                str(self.ready_file),
                "--stats-file",
                str(self.stats_file),
            ],
            cwd=self.workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        out.close()
        self.starts += 1
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        def check() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"instance {self.name} exited with {self.proc.returncode} before it was "
                    f"ready; output:\n{self.tail()}"
                )
            if not self.ready_file.exists():
                return f"instance {self.name} has not written {self.ready_file.name}"
            return None

        wait_until_sync(check, timeout)
        ready = dict(json.loads(self.ready_file.read_text()))
        self.ports = {name: int(port) for name, port in ready["transports"].items()}
        self.port = self.ports.get(self.client_transport, self.port)
        return ready

    def tail(self, n: int = 40) -> str:
        text = ""
        for f in (self.output, self.log_file):
            if f.exists():
                text += (
                    f"--- {f.name}\n"
                    + "\n".join(f.read_text(errors="replace").splitlines()[-n:])
                    + "\n"
                )
        return text

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the running instance (e.g. SIGUSR1 for on-signal actions)."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (crash test)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"instance {self.name} ignored SIGTERM; output:\n{self.tail()}"
                ) from None
        return self.proc.returncode

    def restart(self, timeout: float = 120) -> ServerProcess:
        self.stop()
        return self.start(timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def publish_persisted(port: int, client: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish ``messages`` ((topic, payload), seqs 1..N) as ``client`` over a plain
    socket, asking for persisted acks, and return once the last is persisted.

    Raises:
        AssertionError: the server closed the connection first, or a persisted ack
            is a failure.
    """
    from amps_py.protocol import FrameDecoder, encode_frame

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(encode_frame({"c": "logon", "cid": "logon", "client_name": client}))
        for seq, (topic, payload) in enumerate(messages, 1):
            header = {"c": "publish", "t": topic, "s": seq, "a": "persisted"}
            sock.sendall(encode_frame(header, payload))
        decoder = FrameDecoder()
        persisted = 0
        while persisted < len(messages):
            data = sock.recv(65536)
            assert data, f"the server closed {client}'s connection before the persisted acks"
            decoder.receive_data(data)
            for frame in decoder.frames():
                if frame.header.get("a") == "persisted":
                    assert frame.header.get("status") == "success", frame.header
                    persisted = max(persisted, int(frame.header.get("s", 0)))
    finally:
        sock.close()


def assert_journal_sound(journal_dir: Path) -> None:
    """``amps-py txlog verify`` (a real subprocess) finds no damaged record."""
    verify = subprocess.run(
        [sys.executable, "-m", "amps_py", "txlog", "verify", str(journal_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def start_instance(
    tmp_path: Path, name: str = "inst", port: int = 0, **config_kwargs: Any
) -> ServerProcess:
    """Start instance ``name`` (files under ``tmp_path``); ``config_kwargs`` go to
    :func:`write_config`.

    ``port``: the client port its config names; 0 (the default) lets the OS pick one.
    Give a port from :func:`reserve_port` only where the running instance must listen
    again on its configured port (a transport disabled and enabled again)."""
    server = ServerProcess(write_config(tmp_path, name, port, **config_kwargs), tmp_path, 0, name)
    server.start()
    # Tests restart instances and reconnect clients (some holding the URI) to the same
    # address, so from now on the config names the port this first run bound. Only a
    # restart can lose it to another process, in the moment the instance is down.
    write_config(tmp_path, name, server.port, **config_kwargs)
    return server


def security_xml(directory: Path, users: dict[str, str], rules: dict[str, Any]) -> str:
    """Authentication (an amps-password-file with ``users``: name -> password, made
    with the real ``amps-py users add``) and Entitlement (amps-rule-entitlement with
    ``rules``) elements for a test config, the files written into ``directory``."""
    password_file = directory / "users.pw"
    users_add = [sys.executable, "-m", "amps_py", "users", "add", "--password-stdin"]
    for user, password in users.items():
        added = subprocess.run(
            [*users_add, str(password_file), user],
            input=password + "\n",
            capture_output=True,
            text=True,
            check=False,
        )
        assert added.returncode == 0, added.stderr
    rules_file = directory / "rules.json"
    rules_file.write_text(json.dumps(rules))
    return (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{password_file}</PasswordFile></Options></Authentication>"
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{rules_file}</RulesFile></Options></Entitlement>"
    )
