"""Run an instance as a program does: until cancelled, with its ready file (written
once every listener is bound) and its statistics file."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from amps_py.config import InstanceConfig

from .instance import Instance
from .statsfile import write_ready_file, write_statistics


async def serve_instance(
    config: InstanceConfig,
    *,
    ready_file: str | os.PathLike[str] | None = None,
    stats_file: str | os.PathLike[str] | None = None,
    stats_interval: float = 0.25,
    allow_empty_journal: bool = False,
    task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an instance until cancelled; write ``ready_file`` (JSON) once listening.

    The ready file holds ``{"name": ..., "pid": ..., "transports": {name: port}}`` and
    is written atomically, so a test or script can poll for it. ``allow_empty_journal``
    lets the journal start empty where one existed (see :class:`txlog.Journal`).
    """
    instance = Instance(config, allow_empty_journal=allow_empty_journal)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(instance.serve)
        if stats_file is not None:
            # before the ready file: whoever sees "ready" finds this process's statistics
            await nursery.start(
                write_statistics, instance.statistics, Path(stats_file), stats_interval
            )
        if ready_file is not None:
            write_ready_file(Path(ready_file), instance.name, listeners)
        task_status.started(instance)
