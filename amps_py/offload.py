"""Where blocking work leaves the event loop: a worker thread, unless the task tree
runs inline (the simulator, docs/SIMULATION.md).

amps_py hands blocking work (journal opens and commits, checkpoint writes, SOW scans)
to :func:`run_sync` instead of ``trio.to_thread.run_sync``. Under :func:`inline` it
runs in the trio thread, at once: a virtual clock then never moves while a thread is
busy, and the run does the same thing each time, which a simulated schedule needs.
Outside the simulator nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import trio

__all__ = ["inline", "is_inline", "run_sync"]

_T = TypeVar("_T")

_INLINE: ContextVar[bool] = ContextVar("amps_py_offload_inline", default=False)


@contextmanager
def inline() -> Iterator[None]:
    """Within the block (and the tasks started inside it), :func:`run_sync` runs its
    work in the trio thread."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def is_inline() -> bool:
    """True inside :func:`inline`."""
    return _INLINE.get()


async def run_sync(work: Callable[..., _T], *args: object) -> _T:
    """``trio.to_thread.run_sync(work, *args)``, or ``work(*args)`` in this thread
    (after a checkpoint) inside :func:`inline`."""
    if _INLINE.get():
        await trio.lowlevel.checkpoint()
        return work(*args)
    return await trio.to_thread.run_sync(work, *args)
