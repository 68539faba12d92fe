"""The README's Quick start, run as it is written: `amps-py serve` on the embedded
default, then `amps-py publish` and `amps-py subscribe` in real processes.

No test here needs a fixed port to be free: the embedded default is started with its
ports moved (`--port 0 --admin-port 0`, learnt from `--ready-file`), so the tests pass
while a user's own Quick start server holds 9007 and 8085
(`test_cli_tests_pass_while_the_quick_start_server_runs` proves it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clirun import DefaultServe, run
from harness import REPO, reserve_port, start_instance, wait_until_sync, write_config


@pytest.fixture
def default_serve(tmp_path: Path) -> Iterator[DefaultServe]:
    serve = DefaultServe(tmp_path)
    try:
        yield serve
    finally:
        serve.stop()


def test_serve_embedded_default_runs_the_readme_commands(tmp_path: Path) -> None:
    serve = DefaultServe(tmp_path)
    try:
        uri = serve.uri
        # the README's publish line, then one the filter leaves out
        for i, qty in ((1, 50), (2, 5), (3, 70)):
            res = run("publish", uri, "orders", json.dumps({"id": i, "qty": qty}), cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            assert "persisted through seq 1" in res.stderr
        # the README's subscribe line; --timeout ends it once nothing more comes
        res = run(
            "subscribe",
            uri,
            "orders",
            "--bookmark",
            "0",
            "--filter",
            "/qty > 10",
            "--timeout",
            "2",
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        assert [r["data"] for r in rows] == [{"id": 1, "qty": 50}, {"id": 3, "qty": 70}]
        assert all(r["topic"] == "orders" and r["bookmark"].endswith("|1|") for r in rows)
        assert "Traceback" not in res.stderr
        res = run(
            "subscribe",
            uri,
            "orders",
            "--bookmark",
            "0",
            "--filter",
            "/id >= 2",
            "--count",
            "2",
            "--raw",
            cwd=tmp_path,
        )
        assert res.stdout.splitlines() == ['{"id": 2, "qty": 5}', '{"id": 3, "qty": 70}']
        # the embedded default journals under ./amps-data
        assert (tmp_path / "amps-data" / "data.mdb").exists()
        # the README's NVFIX lines: another type, its own topic, its paths
        nvfix = uri.replace("/amps/json", "/amps/nvfix")
        res = run(
            "publish",
            nvfix,
            "quotes",
            "Symbol=IBM|Price=140.5|",
            "--delimiter",
            "|",
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        res = run(
            "subscribe",
            nvfix,
            "quotes",
            "--bookmark",
            "0",
            "--filter",
            "/Price > 100",
            "--count",
            "1",
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        (row,) = [json.loads(line) for line in res.stdout.splitlines()]
        assert row["data"] == {"Symbol": "IBM", "Price": "140.5"}, row
        # a json subscriber of the same topic name sees none of it
        res = run("subscribe", uri, "quotes", "--bookmark", "0", "--timeout", "1", cwd=tmp_path)
        assert res.returncode == 0 and res.stdout == "", (res.stdout, res.stderr)
    finally:
        code = serve.stop()
    assert code == 0, serve.log()
    assert "00-0004" in serve.log()  # clean stop logged


def test_subscribe_timeout_ends_cleanly(default_serve: DefaultServe, tmp_path: Path) -> None:
    """`--timeout N` stops after N seconds without a message: exit status 0 with what
    arrived; with --count, 1 when fewer came. Never a traceback."""
    uri = default_serve.uri
    started = time.monotonic()
    res = run("subscribe", uri, "quiet", "--timeout", "1", cwd=tmp_path)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert "no message for 1 s; stopping after 0 message(s)" in res.stderr
    assert "Traceback" not in res.stderr and "TooSlowError" not in res.stderr
    assert 1 <= took < 30, took
    for i in range(2):
        assert run("publish", uri, "quiet", f'{{"i": {i}}}', cwd=tmp_path).returncode == 0
    res = run("subscribe", uri, "quiet", "--bookmark", "0", "--timeout", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert [json.loads(line)["data"] for line in res.stdout.splitlines()] == [{"i": 0}, {"i": 1}]
    short = run(
        "subscribe", uri, "quiet", "--bookmark", "0", "--count", "3", "--timeout", "1", cwd=tmp_path
    )
    assert short.returncode == 1
    assert len(short.stdout.splitlines()) == 2
    assert "only 2 of 3 message(s) arrived: none came for 1 s" in short.stderr
    assert "Traceback" not in short.stderr


def test_serve_takes_the_config_file_as_an_argument(tmp_path: Path) -> None:
    """`amps-py serve config.xml`, as AMPS users start `ampServer config.xml`."""
    config = write_config(tmp_path, "positional", 0)
    serve = DefaultServe(tmp_path, str(config), port=None, admin_port=None)
    try:
        assert serve.ready["name"] == "positional"
        res = run("publish", serve.uri, "orders", '{"id": 1}', cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    finally:
        assert serve.stop() == 0, serve.log()
    other = write_config(tmp_path / "other", "other", 0)
    both = run("serve", str(config), "--config", str(other), cwd=tmp_path)
    assert both.returncode == 2
    assert f"two configs given: {config} and --config {other}; give one" in both.stderr
    with_port = run("serve", str(config), "--port", "0", cwd=tmp_path)
    assert with_port.returncode == 2
    assert "--port applies to the embedded default only" in with_port.stderr


def test_serve_accepts_the_same_config_given_both_ways(tmp_path: Path) -> None:
    config = write_config(tmp_path, "twice", 0)
    serve = DefaultServe(tmp_path, str(config), "--config", str(config), port=None, admin_port=None)
    assert serve.ready["name"] == "twice"
    assert serve.stop() == 0, serve.log()


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    res = run("publish", "http://x:1", "t", "{}", cwd=tmp_path)
    assert res.returncode == 1 and "scheme must be tcp://" in res.stderr
    with reserve_port() as closed:  # bound, not listening: connections are refused
        port = closed.getsockname()[1]
        res = run("publish", f"tcp://127.0.0.1:{port}/amps/json", "t", "{}", cwd=tmp_path)
    assert res.returncode == 1 and "cannot connect to 127.0.0.1" in res.stderr
    assert "Traceback" not in res.stderr
    res = run("config", "check", str(tmp_path / "nope.xml"), cwd=tmp_path)
    assert res.returncode == 2 and "nope.xml" in res.stderr


def test_a_second_instance_on_the_same_journal_is_refused(tmp_path: Path) -> None:
    """Two configs naming the same JournalDirectory: the second instance does not start
    and says which process holds the journal; the first keeps running."""
    first = start_instance(tmp_path / "one", "twin")
    try:
        second_cfg = write_config(tmp_path / "two", "twin", 0)
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


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


#: the CLI test files a newcomer runs right after the Quick start
FIRST_HOUR_TESTS = ("tests/test_cli.py", "tests/test_cli_client.py")


@pytest.mark.slow
def test_cli_tests_pass_while_the_quick_start_server_runs(tmp_path: Path) -> None:
    """The README's order of things: `amps-py serve` (no arguments: 9007 and 8085) is
    left running, then the tests run. Holds the default ports with a real
    `amps-py serve` (where they are free: else whatever holds them stays) and runs the
    first-hour CLI tests in a separate pytest."""
    quick_start = None
    flags = {}
    if _listening(9007):
        flags["port"] = 0  # held already: by a Quick start server, or anything
    if _listening(8085):
        flags["admin_port"] = 0
    if len(flags) < 2:
        quick_start = DefaultServe(
            tmp_path / "quick-start",
            port=flags.get("port"),
            admin_port=flags.get("admin_port"),
        )
    try:
        wait_until_sync(
            lambda: None if _listening(9007) and _listening(8085) else "9007/8085 not held",
            30,
        )
        inner = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",  # in this process: the outer run already has its workers
                "-k",
                "not quick_start_server_runs",
                *FIRST_HOUR_TESTS,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert inner.returncode == 0, inner.stdout[-6000:] + inner.stderr[-3000:]
        assert " passed" in inner.stdout and " failed" not in inner.stdout
    finally:
        if quick_start is not None:
            assert quick_start.stop() == 0, quick_start.log()
