"""Make one trio run repeatable from a seed (docs/SIMULATION.md).

Trio picks the order of tasks that become runnable together from a module-level
``random.Random``; with ``_ALLOW_DETERMINISTIC_SCHEDULING`` set it first sorts them by
creation and then shuffles them with that generator (the hook trio keeps for
Hypothesis). :func:`seeded_scheduling` seeds it and sets the flag for the duration,
so the same seed gives the same interleaving. The rest of the run must not read the
wall clock or the OS's randomness for anything that changes what happens (the
simulator passes its own clock and RNG), and string hashing must be fixed
(``PYTHONHASHSEED``) where set iteration order matters: ``tools/sim.py`` sees to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio._core._run as _trio_run

__all__ = ["seeded_scheduling"]


@contextmanager
def seeded_scheduling(seed: int) -> Iterator[None]:
    """Within the block, trio's scheduler orders runnable tasks from ``seed``."""
    saved_flag = _trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    saved_state = _trio_run._r.getstate()
    _trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    _trio_run._r.seed(seed)
    try:
        yield
    finally:
        _trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved_flag  # type: ignore[misc]
        _trio_run._r.setstate(saved_state)
