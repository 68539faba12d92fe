"""The README's promise: `amps-py serve` with no arguments runs the embedded default,
and the CLI publishes to it and subscribes from it (real processes, real port 9007)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import wait_until_sync

CLI = shutil.which("amps-py") or ""


def amps_py(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [CLI, *args] if CLI else [sys.executable, "-m", "amps_py", *args]
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def port_open(port: int) -> str | None:
    with socket.socket() as s:
        s.settimeout(0.2)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as exc:
            return f"127.0.0.1:{port} not accepting connections ({exc})"
    return None


def test_serve_with_no_arguments_accepts_cli_publish_and_subscribe(tmp_path: Path) -> None:
    if port_open(9007) is None:
        pytest.fail("port 9007 is already in use; stop whatever listens there and rerun")
    cmd = [CLI, "serve"] if CLI else [sys.executable, "-m", "amps_py", "serve"]
    out = open(tmp_path / "serve.out", "wb")
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_until_sync(lambda: port_open(9007), 30)
        uri = "tcp://127.0.0.1:9007/amps/json"
        for i in range(3):
            res = amps_py(
                "publish", uri, "orders", json.dumps({"id": i}), "--name", "cli-pub", cwd=tmp_path
            )
            assert res.returncode == 0, res.stderr
            assert f"persisted through seq {i + 1}" in res.stderr
        res = amps_py("subscribe", uri, "orders", "--bookmark", "0", "--count", "3", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        assert [r["data"] for r in rows] == [{"id": 0}, {"id": 1}, {"id": 2}]
        assert all(
            r["topic"] == "orders" and r["bookmark"].endswith(f"|{n + 1}|")
            for n, r in enumerate(rows)
        )
        res = amps_py(
            "subscribe",
            uri,
            "orders",
            "--bookmark",
            "0",
            "--filter",
            "/id >= 1",
            "--count",
            "2",
            "--raw",
            cwd=tmp_path,
        )
        assert res.stdout.splitlines() == ['{"id": 1}', '{"id": 2}']
        # the embedded default journals under ./amps-data
        assert (tmp_path / "amps-data" / "data.mdb").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        out.close()
    assert code == 0, (tmp_path / "serve.out").read_text()
    log = (tmp_path / "serve.out").read_text()
    assert "00-0004" in log  # clean stop logged


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    res = amps_py("publish", "http://x:1", "t", "{}", cwd=tmp_path)
    assert res.returncode == 1 and "scheme must be tcp://" in res.stderr
    res = amps_py("publish", f"tcp://127.0.0.1:{_closed_port()}/amps/json", "t", "{}", cwd=tmp_path)
    assert res.returncode == 1 and "cannot connect to 127.0.0.1" in res.stderr
    assert "Traceback" not in res.stderr
    res = amps_py("config", "check", str(tmp_path / "nope.xml"), cwd=tmp_path)
    assert res.returncode == 2 and "nope.xml" in res.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_second_instance_on_the_same_journal_is_refused(tmp_path: Path) -> None:
    """Two configs naming the same JournalDirectory: the second instance does not start
    and says which process holds the journal; the first keeps running."""
    from harness import free_port, start_instance, write_config

    first = start_instance(tmp_path / "one", "twin")
    try:
        second_cfg = write_config(tmp_path / "two", "twin", free_port())
        text = second_cfg.read_text().replace(
            str(tmp_path / "two" / "twin-journal"), str(first.journal_dir)
        )
        second_cfg.write_text(text)
        refused = subprocess.run(
            [sys.executable, "-m", "amps_py", "serve", "--config", str(second_cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode != 0
        assert "is already open for writing (by process" in refused.stderr, refused.stderr
        assert first.alive
    finally:
        first.stop()
