"""Run the ``amps-py`` command as the README gives it, in real subprocesses.

- :func:`amps_py_command` is the venv's ``amps-py`` console script (``.venv/bin/amps-py``,
  beside the Python running the tests), or ``python -m amps_py`` where there is none.
- :func:`run` runs one command and returns its output; :func:`run_on_terminal` runs it
  with stderr on a pseudo-terminal (what a user at a terminal sees).
- :class:`DefaultServe` runs ``amps-py serve`` on the embedded default with the client
  and admin ports moved to free ones (``--port 0 --admin-port 0``) and learns them from
  ``--ready-file``: tests never need a fixed port to be free.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import wait_until_sync


def amps_py_command() -> list[str]:
    script = Path(sys.executable).parent / "amps-py"
    return [str(script)] if script.exists() else [sys.executable, "-m", "amps_py"]


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without the variables the CLI reads (a developer's own
    settings must not change what a test sees), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AMPS_PY_PASSWORD", "AMPS_PY_ADMIN_PASSWORD", "AMPS_PY_ADMIN_URL")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``amps-py ARGS`` with stdout and stderr captured (pipes: not a terminal)."""
    return subprocess.run(
        [*amps_py_command(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=cli_env(env),
        input=input,
    )


def run_on_terminal(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 60
) -> tuple[int, str, str]:
    """``amps-py ARGS`` with stderr on a pseudo-terminal (stdout still a pipe); returns
    ``(exit status, stdout, everything written to the terminal)``."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*amps_py_command(), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=cli_env({"TERM": "xterm", "COLUMNS": "120", **(env or {})}),
    )
    os.close(slave)
    screen = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not data:
            break
        screen += data
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    code = proc.wait(timeout=timeout)
    return code, out.decode(), screen.decode(errors="replace")


class DefaultServe:
    """``amps-py serve ARGS`` in ``workdir``: the embedded default on free ports
    (``port``/``admin_port`` 0; ``None`` leaves that flag out: 9007 / 8085)."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        port: int | None = 0,
        admin_port: int | None = 0,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file = workdir / "serve.ready.json"
        self.output = workdir / "serve.out"
        self.ready_file.unlink(missing_ok=True)
        ports: list[str] = []
        if port is not None:
            ports += ["--port", str(port)]
        if admin_port is not None:
            ports += ["--admin-port", str(admin_port)]
        out = open(self.output, "ab")
        self.proc = subprocess.Popen(
            [*amps_py_command(), "serve", *args, *ports, "--ready-file", str(self.ready_file)],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
        out.close()
        self.ready: dict[str, Any] = {}

        def ready() -> str | None:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"amps-py serve exited with {self.proc.returncode}:\n{self.log()}"
                )
            if not self.ready_file.exists():
                return "amps-py serve has not written its ready file"
            return None

        wait_until_sync(ready, 30)
        self.ready = json.loads(self.ready_file.read_text())

    @property
    def port(self) -> int:
        return int(self.ready["transports"]["json-tcp"])

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}/amps/json"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ready['transports']['admin']}"

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"amps-py serve ignored SIGTERM:\n{self.log()}") from None
        return self.proc.returncode


def installed_layout(site: Path, repo: Path) -> Path:
    """``site`` holding amps_py and txlog as a wheel installs them (``pip install .``):
    the packages alone, the schema and the examples under ``amps_py/_data`` (see
    pyproject.toml's force-include), no pyproject.toml beside them. Returns ``site``."""
    ignore = shutil.ignore_patterns("__pycache__", "_data")
    for package in ("amps_py", "txlog"):
        shutil.copytree(repo / package, site / package, ignore=ignore)
    data = site / "amps_py" / "_data"
    shutil.copytree(repo / "config" / "examples", data / "examples")
    shutil.copy(repo / "config" / "amps.xsd", data / "amps.xsd")
    return site
