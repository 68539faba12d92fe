"""The pipeline's Spark daemon: a worker whose socket the JVM resets ends quietly.

Spark cancels a failed job's other tasks by closing their sockets; pyspark's own
daemon printed a ``ConnectionResetError`` traceback for a worker caught mid-read,
under the pipeline's one-line error (seen in CI on the damaged-journal audit test).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyspark")

#: a worker reading its first bytes from a TCP socket the other end resets
RESET_WORKER = textwrap.dedent(
    """
    import os, socket, struct, sys
    from amps_py.pipeline import spark_daemon

    listener = socket.create_server(("127.0.0.1", 0))
    jvm_side = socket.create_connection(listener.getsockname())
    worker_side, _ = listener.accept()
    # close with SO_LINGER 0: the worker's next read gets a reset, not an end of file
    jvm_side.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    jvm_side.close()
    os.environ["PYTHON_WORKER_FACTORY_SECRET"] = "secret"
    print("code", spark_daemon.{which}(worker_side, False))
    """
)


def run_worker(which: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RESET_WORKER.format(which=which)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_whose_socket_the_jvm_resets_ends_with_code_1_and_no_traceback() -> None:
    done = run_worker("worker")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "code 1"
    assert "Traceback" not in done.stderr, done.stderr


def test_pysparks_own_worker_raises_there_which_is_what_the_wrapper_is_for() -> None:
    """Without the wrapper, the same reset escapes (pyspark's daemon prints it)."""
    done = run_worker("_pyspark_worker")
    assert done.returncode != 0
    assert "ConnectionResetError" in done.stderr, done.stderr


def test_every_pipeline_session_runs_the_quiet_daemon() -> None:
    from amps_py.pipeline.spark import QUIET_DEFAULTS

    assert ("spark.python.daemon.module", "amps_py.pipeline.spark_daemon") in QUIET_DEFAULTS
