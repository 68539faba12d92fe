"""Spark's Python daemon (``pyspark.daemon``), minus one false alarm.

Spark forks a Python worker per task from this daemon and talks to it over a
socket. When a job fails (a damaged journal, say), Spark cancels the job's other
tasks and closes their sockets, sometimes before a freshly forked worker has read its
first bytes; pyspark's daemon then prints that worker's ``ConnectionResetError``
traceback to the terminal, under the one line ``amps-py pipeline`` prints about what
really went wrong. Nothing failed in that worker: the JVM dropped it, and reports the
task's outcome itself.

Run as Spark's daemon module (``spark.python.daemon.module``, set by
:func:`amps_py.pipeline.spark.spark_session`), this module runs pyspark's own daemon
with its per-worker function wrapped: a worker whose connection the JVM reset or
closed ends quietly with a nonzero code (the daemon then closes it as it closes any
failed worker). Every other error is left to pyspark, as before.
"""

from __future__ import annotations

import socket

from pyspark import daemon

_pyspark_worker = daemon.worker

#: what a worker sees when the JVM drops its socket first
DROPPED_BY_JVM = (ConnectionResetError, BrokenPipeError)


def worker(sock: socket.socket, authenticated: bool) -> int:
    """pyspark's ``daemon.worker``; 1, silently, when the JVM dropped the connection."""
    try:
        return _pyspark_worker(sock, authenticated)
    except DROPPED_BY_JVM:
        return 1


def main() -> None:
    """Run pyspark's daemon with :func:`worker` in place of its own."""
    daemon.worker = worker
    daemon.manager()


if __name__ == "__main__":
    main()
