"""Files an instance writes for whoever started it: the ready file (once listening)
and the statistics file (rewritten a few times a second)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio


async def write_statistics(
    statistics: Callable[[], Any],
    path: Path,
    interval: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Write ``statistics()`` (a dataclass) as JSON to ``path`` every ``interval``
    seconds (atomically), until cancelled; started once the first write is done.
    Tests and scripts poll it beside the admin API."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    started = False
    while True:
        tmp.write_text(json.dumps(dataclasses.asdict(statistics()), default=str))
        tmp.replace(path)
        if not started:
            task_status.started()
            started = True
        await trio.sleep(interval)


def write_ready_file(path: Path, name: str, listeners: dict[str, tuple[str, int]]) -> None:
    """Write ``{"name", "pid", "transports": {name: port}}`` to ``path`` atomically, so
    a test or script polling for it never reads half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(
        json.dumps(
            {
                "name": name,
                "pid": os.getpid(),
                "transports": {n: p for n, (_, p) in listeners.items()},
            }
        )
    )
    tmp.replace(path)
