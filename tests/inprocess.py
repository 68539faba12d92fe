"""In-process instances: an amps_py ``Instance`` inside the test's own trio run.

:func:`serve_instance` writes the same XML config as :func:`harness.write_config`, with
the client transport on port 0, loads it, and runs :func:`amps_py.server.serve_instance`
in a nursery of the test's trio run. The port the OS picked is read from the
instance's listeners (``Instance.listeners.bound``), so no port is chosen ahead and
none can be taken by another process in between. Clients (the amps_py client library,
raw frames) connect over real localhost sockets; there is no process to start, so a
test pays for a journal open instead of an interpreter start.

Replication between in-process instances needs no port chosen ahead: start the
destination first (its replication transport on port 0, see :func:`replicated_by`),
read its port with ``bound_port(REPLICATION_TRANSPORT)``, then start the source with a
destination naming that port (or the port of a ``faultproxy.open_fault_proxy`` in
between).

What an :class:`InProcessInstance` offers mirrors :class:`harness.ServerProcess` where
it makes sense in one process: ``uri``/``port``, ``statistics()``, ``log_text()``,
``stop``/``start``/``restart`` (a clean stop, as SIGTERM). What needs a process
(``kill -9``, fsync across a crash, the CLI, startup errors printed by ``serve``)
stays with :class:`harness.ServerProcess`.

Virtual time: heartbeat tests run on :func:`new_virtual_clock` (the ``virtual_clock``
fixture), a ``trio.testing.MockClock`` whose autojump waits a little real time first.
A plain ``autojump_clock`` is not safe here: journal commits run in a worker thread
(``trio.to_thread``) and a task waiting for a thread counts as blocked, so autojump
would move the clock to the next deadline (a ``fail_after`` of the test, a heartbeat)
while the commit is still in progress. With ``VIRTUAL_CLOCK_THRESHOLD`` the clock
jumps only after every task has been idle that long in real time, which a commit on
an idle machine does not reach. Each jump costs that much real time, so poll with
coarse intervals on this clock (``wait_until(..., interval=0.25)``), and keep tests
that commit a lot (the replay seam) on the real clock.

Logging: the ``amps_py`` logger is captured (AMPS-formatted lines, event codes
included) for the duration of :func:`serve_instance`; two instances in one test share
the capture, as they share the process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import trio
import trio.testing
from cluster import REPLICATION_TRANSPORT, replication_transport_xml
from harness import write_config

from amps_py.config import InstanceConfig, load_config
from amps_py.logs import AmpsFormatter
from amps_py.server import Instance
from amps_py.server import serve_instance as run_instance

#: real seconds every task must be idle before the virtual clock jumps (see the module
#: docstring); a commit in the writer thread normally takes far less
VIRTUAL_CLOCK_THRESHOLD: Final = 0.05

#: the client transport :func:`harness.write_config` writes
CLIENT_TRANSPORT: Final = "json-tcp"

__all__ = [
    "CLIENT_TRANSPORT",
    "REPLICATION_TRANSPORT",
    "InProcessInstance",
    "instance_config",
    "new_virtual_clock",
    "replicated_by",
    "serve_instance",
]


def replicated_by(group: str, replication: str = "") -> dict[str, str]:
    """``config_kwargs`` for :func:`serve_instance`: an instance of ``group`` with an
    incoming replication transport on port 0 and ``replication`` (a ``<Replication>``
    element, see :func:`cluster.replication_xml`) as its outgoing links."""
    return {
        "extra_transport": replication_transport_xml(0),
        "extra": f"<Group>{group}</Group>{replication}",
    }


def new_virtual_clock() -> trio.testing.MockClock:
    """A fake clock for tests that wait on timers (heartbeats, delays): idle waits
    take no real time, but not while a journal commit is running (see the module
    docstring). Return it from a fixture and pytest-trio runs the test on it."""
    return trio.testing.MockClock(autojump_threshold=VIRTUAL_CLOCK_THRESHOLD)


class LogCapture(logging.Handler):
    """Keeps every ``amps_py`` record as the AMPS log line a file target would write."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(AmpsFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@asynccontextmanager
async def captured_logs(level: int = logging.INFO) -> AsyncIterator[LogCapture]:
    """Capture the ``amps_py`` logger at ``level`` and above; restore it on exit."""
    logger = logging.getLogger("amps_py")
    capture = LogCapture()
    old_level = logger.level
    logger.addHandler(capture)
    logger.setLevel(level)
    try:
        yield capture
    finally:
        logger.removeHandler(capture)
        logger.setLevel(old_level)


class InProcessInstance:
    """One instance served in the test's trio run; see the module docstring.

    Contract: :meth:`start` returns once every listener is bound (``port`` is then
    the real one); :meth:`stop` cancels the instance and returns once it has closed
    its journal. A failure of the instance fails the test through the nursery.
    """

    def __init__(
        self, config: InstanceConfig, workdir: Path, nursery: trio.Nursery, logs: LogCapture
    ) -> None:
        self.config = config
        self.workdir = workdir
        self.name = config.name
        self.logs = logs
        self._nursery = nursery
        self._instance: Instance | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self.starts = 0

    @property
    def instance(self) -> Instance:
        if self._instance is None:
            raise RuntimeError(f"instance {self.name} is not running; start() it first")
        return self._instance

    def bound_port(self, transport: str = CLIENT_TRANSPORT) -> int:
        """The port transport ``transport`` listens on (what the OS chose for port 0)."""
        bound = self.instance.listeners.bound
        if transport not in bound:
            raise KeyError(f"instance {self.name} has no open transport {transport!r}: {bound}")
        return bound[transport][1]

    @property
    def port(self) -> int:
        return self.bound_port()

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}/amps/json"

    @property
    def journal_dir(self) -> Path:
        return self.workdir / f"{self.name}-journal"

    @property
    def alive(self) -> bool:
        return self._instance is not None

    def statistics(self) -> dict[str, Any]:
        """The instance's statistics, as the stats file of a process holds them."""
        return dataclasses.asdict(self.instance.statistics())

    def log_text(self) -> str:
        """Every line the ``amps_py`` logger wrote so far (all instances of the test)."""
        return "\n".join(self.logs.lines)

    async def start(self) -> InProcessInstance:
        if self._instance is not None:
            raise RuntimeError(f"instance {self.name} is already running")
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()
        self._instance = await self._nursery.start(self._run, self._scope, self._stopped)
        self.starts += 1
        return self

    async def _run(
        self,
        scope: trio.CancelScope,
        stopped: trio.Event,
        *,
        task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with scope:
                await run_instance(self.config, task_status=task_status)
        finally:
            stopped.set()

    def cancel(self) -> None:
        """Stop without waiting (the enclosing nursery waits for the instance)."""
        if self._scope is not None:
            self._scope.cancel()
        self._scope = None
        self._instance = None

    async def stop(self) -> None:
        """Stop as SIGTERM would: cancel the instance and wait until it has closed."""
        stopped = self._stopped
        self.cancel()
        await stopped.wait()

    async def restart(self) -> InProcessInstance:
        """Stop, then start from the same config and journal. The client port is 0
        again: read ``uri``/``port`` after the restart."""
        await self.stop()
        return await self.start()


def instance_config(tmp_path: Path, name: str = "inst", **config_kwargs: Any) -> InstanceConfig:
    """The config :func:`harness.write_config` writes (client transport on port 0),
    loaded. ``config_kwargs`` go to ``write_config`` (topics, transport_extra, ...)."""
    return load_config(write_config(tmp_path, name, 0, **config_kwargs))


@asynccontextmanager
async def serve_instance(
    tmp_path: Path, name: str = "inst", **config_kwargs: Any
) -> AsyncIterator[InProcessInstance]:
    """Run instance ``name`` (journal and files under ``tmp_path``) in this trio run
    until the block exits; ``config_kwargs`` go to :func:`harness.write_config`."""
    config = instance_config(tmp_path, name, **config_kwargs)
    async with captured_logs() as logs, trio.open_nursery() as nursery:
        served = InProcessInstance(config, tmp_path, nursery, logs)
        await served.start()
        try:
            yield served
        finally:
            served.cancel()  # the nursery waits until the journal is closed
