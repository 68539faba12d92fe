"""Shared fixtures: real instances in real processes (see harness.py) and in the
test's own trio run (see inprocess.py)."""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio.testing
from cluster import Cluster
from harness import ServerProcess, start_instance
from inprocess import InProcessInstance, new_virtual_clock, serve_instance


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[ServerProcess]:
    """A running instance journaling every json topic, on a free port."""
    server = start_instance(tmp_path, "inst")
    try:
        yield server
    finally:
        if server.alive:
            server.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A :class:`cluster.Cluster` rooted in ``tmp_path``; every instance and fault proxy
    it started is stopped (or killed) at teardown."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session (``local[2]``) shared by every Spark test of the run;
    skipped with the reason when pyspark or Java is missing. Stopped at the end."""
    try:
        from amps_py.pipeline.spark import SparkUnavailable, spark_session
    except ImportError as exc:  # pyarrow missing: the spark extra is not installed
        pytest.skip(f"the Spark pipeline tests need the spark extra: {exc}")
    try:
        session = spark_session("amps-py-tests", "local[2]")
    except SparkUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
async def inproc(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    """A running instance journaling every json topic, in the test's own trio run
    (see inprocess.py), its client transport on a port the OS chose."""
    async with serve_instance(tmp_path, "inst") as served:
        yield served


@pytest.fixture
def virtual_clock() -> trio.testing.MockClock:
    """Run the test on a fake clock that skips idle waits (heartbeats, timeouts) but
    not a journal commit in progress; see inprocess.py."""
    return new_virtual_clock()


@pytest.fixture(autouse=True)
def _free_what_the_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Free what the test left behind while it is still the test being run, so a socket
    or file it left open is reported (a ``ResourceWarning``: an error under this
    suite's warning filter) in this test's teardown, never in a neighbour that happens
    to run when the garbage goes.

    Autouse, so set up first and torn down last: the test's other fixtures are torn
    down by then, and pytest collects the teardown's warnings after it. A failed test's
    frames (and whatever they hold) are kept in ``sys.last_traceback`` for post-mortem
    debugging, which pytest drops only when the next test starts: they are dropped here
    instead (``--pdb`` has already run), and a full collection frees them. After a
    passing test only the young generations are collected (a full collection after
    each of the suite's tests would add minutes to a run)."""
    yield
    failed = hasattr(sys, "last_value")
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    if isinstance(request.node, pytest.Function):
        request.node.funcargs.clear()  # torn down: their values may go now
    gc.collect(2 if failed else 1)
