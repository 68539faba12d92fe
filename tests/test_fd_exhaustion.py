"""An instance out of file descriptors says so in a few lines, and recovers by itself.

While every descriptor its RLIMIT_NOFILE allows is open, ``accept`` fails (EMFILE) for
each client that connects. The listener keeps trying; the log says so at once, then at
most every ACCEPT_REPORT_INTERVAL seconds with the count of failed accepts and the fix
(``ulimit -n`` / LimitNOFILE), never with a traceback; once connections close, it
accepts again, and says that too.
"""

from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import trio
from harness import wait_until, wait_until_sync, write_config

from amps_py.client import open_client
from amps_py.protocol import encode_frame
from amps_py.server.listeners import ACCEPT_REPORT_INTERVAL, AcceptFailures

#: the server's descriptor limit in the real-process test (as reported: nofile 128)
NOFILE = 128
#: connections the test opens: more than the server can hold
CONNECTIONS = 160
SERVE = [sys.executable, "-m", "amps_py", "serve"]


def test_failed_accepts_are_reported_at_once_then_at_most_every_interval() -> None:
    failures = AcceptFailures(interval=10.0)
    assert failures.accepted(0.0) is None, "accepts working: nothing to say"
    assert failures.failed(100.0) == 1, "the first failure is reported at once"
    reported = [failures.failed(100.0 + 0.1 * i) for i in range(1, 100)]  # 9.9 s of them
    assert reported == [None] * 99
    assert failures.failed(110.0) == 100, "then once per interval, with the count since"
    assert failures.failed(110.1) is None
    assert failures.accepted(111.0) == (102, 11.0), "the whole episode, when it ends"
    assert failures.accepted(111.1) is None
    assert failures.failed(200.0) == 1, "a new episode is reported at once again"


def limited_nofile() -> None:
    """(preexec_fn) the server process may open NOFILE descriptors."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def start_limited(config: Path, ready: Path, output: Path) -> subprocess.Popen[bytes]:
    """``amps-py serve`` as a process that may open :data:`NOFILE` descriptors."""
    with open(output, "wb") as out:
        return subprocess.Popen(
            [*SERVE, "--config", str(config), "--ready-file", str(ready)],
            cwd=output.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=limited_nofile,
        )


async def test_out_of_file_descriptors_is_a_few_lines_and_recovers(tmp_path: Path) -> None:
    config = write_config(tmp_path, "nofile", 0)
    ready = tmp_path / "nofile.ready.json"
    output = tmp_path / "nofile.out"
    log_file = tmp_path / "nofile.log"
    proc = start_limited(config, ready, output)
    streams: list[trio.SocketStream] = []
    try:

        def started() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"the instance exited: {output.read_text()}")
            return None if ready.exists() else "no ready file yet"

        wait_until_sync(started, 30)
        port = int(json.loads(ready.read_text())["transports"]["json-tcp"])
        uri = f"tcp://127.0.0.1:{port}/amps/json"

        # more connections than the server has descriptors for, each logging on (the
        # server holds the ones it accepted; the rest wait in its listen queue)
        for i in range(CONNECTIONS):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            streams.append(stream)
            await stream.send_all(
                encode_frame({"c": "logon", "cid": "1", "client_name": f"fd-{i}"})
            )

        def text() -> str:
            return log_file.read_text(errors="replace") if log_file.exists() else ""

        def reported(n: int) -> str | None:
            found = text().count("02-0027")
            return None if found >= n else f"{found} of {n} accept-failure lines logged"

        # the first report at once, a second one an interval later (with its count)
        await wait_until(lambda: reported(1), 60)
        await wait_until(lambda: reported(2), ACCEPT_REPORT_INTERVAL + 20)
        assert proc.poll() is None, "the instance died"
        lines = [line for line in text().splitlines() if "02-0027" in line]
        assert len(lines) <= 3, "\n".join(lines)
        first, second = lines[0], lines[1]
        assert "transport json-tcp cannot accept connections: accept failed with EMFILE" in first
        assert "1 failed accept(s) so far" in first, first
        count = re.search(r"; (\d+) failed accept\(s\) since the last report", second)
        assert count and int(count.group(1)) > 10, second
        for line in lines:
            assert f"RLIMIT_NOFILE soft {NOFILE}" in line, line
            assert "ulimit -n 65536" in line and "LimitNOFILE=65536" in line, line
        everything = text() + output.read_text(errors="replace")
        assert "Traceback" not in everything, everything[-3000:]
        assert "accept returned" not in everything, "trio.serve_listeners logged it"

        # the clients go: the instance accepts again, and a new client logs on
        for stream in streams:
            await trio.aclose_forcefully(stream)
        streams.clear()
        with trio.fail_after(30):
            async with open_client(uri, "after-the-storm") as client:
                await client.publish_persisted("orders", b'{"ok":1}')
        await wait_until(
            lambda: None if "02-0028" in text() else "no 'accepts connections again' line", 60
        )
        again = next(line for line in text().splitlines() if "02-0028" in line)
        assert "transport json-tcp accepts connections again, after " in again, again
        assert "Traceback" not in text()
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, output.read_text()
