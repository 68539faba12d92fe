"""Batches of simulated schedules, shrinking a failure and saying how to replay it
(``tools/sim.py``; docs/SIMULATION.md)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from amps_py.sim.schedule import Result, run_schedule

__all__ = ["INJECTIONS", "Outcome", "replay_command", "run_alone", "run_one", "run_seeds", "shrink"]

#: real seconds a schedule may run before it counts as hung (a task spinning without
#: letting the virtual clock move)
DEFAULT_TIME_LIMIT: Final = 60.0


def _ack_before_sync() -> ExitStack:
    """The planted bug: persisted acks stop waiting for sync destinations."""
    from amps_py.replication.outgoing import Destination

    stack = ExitStack()
    saved = Destination.__dict__.get("sync")
    Destination.sync = property(lambda self: False)  # type: ignore[assignment,method-assign]

    def restore() -> None:
        if saved is None:
            del Destination.sync
        else:
            Destination.sync = saved  # type: ignore[method-assign]

    stack.callback(restore)
    return stack


#: bugs the simulator can plant in the real code, to show it finds them
INJECTIONS: Final[dict[str, Callable[[], ExitStack]]] = {"ack-before-sync": _ack_before_sync}


@dataclass
class Outcome:
    """One schedule's verdict, small enough to cross a process boundary."""

    seed: int
    digest: str
    violations: list[str]
    plan: list[str]
    tail: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Hung(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hung()


def run_one(
    seed: int,
    *,
    inject: str | None = None,
    keep: Sequence[int] | None = None,
    messages: int = 20,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> Outcome:
    """Run schedule ``seed`` (with the planted bug ``inject``), within ``time_limit``
    real seconds."""
    started = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit)
    try:
        result: Result = run_schedule(
            seed,
            messages=messages,
            inject=INJECTIONS[inject] if inject else None,
            keep=keep,
            workdir=_workdir(),
        )
    except _Hung:
        return Outcome(
            seed,
            "",
            [
                f"the schedule ran {time_limit:g} real seconds: a task spins without letting "
                "the virtual clock move"
            ],
            [],
            seconds=time.perf_counter() - started,
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(
        seed,
        result.digest,
        result.violations,
        [fault.describe() for fault in result.plan],
        result.trace.tail(30) if result.violations else [],
        time.perf_counter() - started,
    )


def _workdir() -> Path | None:
    """Journals go to memory when the machine has /dev/shm."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def _worker(job: tuple[int, dict[str, Any]]) -> Outcome:
    seed, options = job
    return run_one(seed, **options)


_warmed = False


def _warm_up() -> None:
    """Run one schedule (seed 0, no faults) in this process, once: what the first run
    of a process sets up (imports done on first use, compiled patterns, caches) is
    then in place before any schedule is forked off it, so each one starts from the
    same state, in a batch or replayed alone."""
    global _warmed
    if not _warmed:
        run_one(0, keep=[], messages=2)
        _warmed = True


def run_seeds(seeds: Sequence[int], *, jobs: int = 1, **options: Any) -> Iterator[Outcome]:
    """Run each of ``seeds`` in a process of its own, forked from this one once it is
    warmed up (:func:`_warm_up`), ``jobs`` at a time; yields the outcomes in seed
    order. The same seed gives the same outcome however it is run."""
    _warm_up()
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, maxtasksperchild=1) as pool:
        yield from pool.imap(_worker, [(seed, options) for seed in seeds], chunksize=1)


def run_alone(seed: int, **options: Any) -> Outcome:
    """One schedule, as :func:`run_seeds` runs it."""
    return next(run_seeds([seed], jobs=1, **options))


def shrink(
    outcome: Outcome, *, inject: str | None, messages: int
) -> tuple[Outcome, list[int], int]:
    """The smallest variant of a failing schedule that still fails: its faults dropped
    one at a time, then fewer messages. Returns the outcome, the faults kept (indexes
    of the seed's plan) and the message count."""
    keep = list(range(len(outcome.plan)))
    best = outcome
    for index in list(keep):
        trial = [i for i in keep if i != index]
        tried = run_alone(outcome.seed, inject=inject, keep=trial, messages=messages)
        if tried.violations:
            keep, best = trial, tried
    while messages > 1:
        fewer = max(1, messages // 2)
        tried = run_alone(outcome.seed, inject=inject, keep=keep, messages=fewer)
        if not tried.violations:
            break
        messages, best = fewer, tried
    return best, keep, messages


def replay_command(
    seed: int, *, inject: str | None, keep: Sequence[int] | None, messages: int
) -> str:
    """The command that runs this one schedule again."""
    parts = ["python", "tools/sim.py", "--seed", str(seed)]
    if keep is not None:
        parts += ["--keep", ",".join(map(str, keep)) or "none"]
    if messages != 20:
        parts += ["--messages", str(messages)]
    if inject:
        parts += ["--inject", inject]
    return " ".join(parts)
