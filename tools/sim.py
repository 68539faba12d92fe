"""Run simulated schedules of a whole fabric (docs/SIMULATION.md).

python tools/sim.py --seeds 1000            # seeds 1..1000, exit 1 on a violation
python tools/sim.py --seed 42 --digest      # one line: the digest of seed 42's trace
python tools/sim.py --seed 42               # one schedule, its plan and verdict
python tools/sim.py --seeds 200 --inject ack-before-sync   # the planted bug is found
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amps_py.sim.runner import (
    DEFAULT_TIME_LIMIT,
    INJECTIONS,
    Outcome,
    replay_command,
    run_alone,
    run_seeds,
    shrink,
)


def _fixed_hash_seed() -> None:
    """Run again with PYTHONHASHSEED=0 unless it is set so: set iteration order (and
    with it the schedule) must not change from one process to the next."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def _quiet_logs() -> None:
    """The instances' log lines would drown the verdict: they are dropped (the
    trace records what happened)."""
    import logging

    logger = logging.getLogger("amps_py")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


def _keep_option(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if text == "none":
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"give fault indexes like 0,2 (or none); got {text!r}") from None


def _report(outcome: Outcome, inject: str | None, messages: int) -> None:
    click.echo(f"seed {outcome.seed}: {len(outcome.violations)} violation(s)", err=True)
    for line in outcome.violations:
        click.echo(f"  {line}", err=True)
    click.echo("shrinking (dropping faults, fewer messages) ...", err=True)
    small, keep, fewer = shrink(outcome, inject=inject, messages=messages)
    click.echo(f"still fails with faults {small.plan or 'none'} and {fewer} message(s):", err=True)
    for line in small.violations:
        click.echo(f"  {line}", err=True)
    click.echo("the trace's last events:", err=True)
    for line in small.tail:
        click.echo(f"  {line}", err=True)
    command = replay_command(outcome.seed, inject=inject, keep=keep, messages=fewer)
    click.echo(f"replay: {command}", err=True)


@click.command()
@click.option(
    "--seeds", type=click.IntRange(min=1), default=None, help="Run seeds START..START+N-1."
)
@click.option("--start", type=int, default=1, show_default=True, help="The first seed of --seeds.")
@click.option("--seed", type=int, default=None, help="Run this one seed.")
@click.option("--digest", is_flag=True, help="With --seed: print only the trace's digest.")
@click.option(
    "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: CPUs)."
)
@click.option("--messages", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--keep", default=None, help="With --seed: keep only these faults (indexes, or none)."
)
@click.option("--verbose", is_flag=True, help="A line per schedule: seed, seconds, digest.")
@click.option("--inject", type=click.Choice(sorted(INJECTIONS)), default=None, help="Plant a bug.")
@click.option("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, show_default=True,
              help="Real seconds one schedule may take.")  # fmt: skip
def main(
    seeds: int | None,
    start: int,
    seed: int | None,
    digest: bool,
    jobs: int | None,
    messages: int,
    keep: str | None,
    inject: str | None,
    verbose: bool,
    time_limit: float,
) -> None:
    """Run simulated schedules; exit status 1 if any breaks a guarantee."""
    _fixed_hash_seed()
    _quiet_logs()
    if (seeds is None) == (seed is None):
        raise click.UsageError("give --seeds N (a batch) or --seed S (one schedule)")
    if seed is not None:
        outcome = run_alone(seed, inject=inject, keep=_keep_option(keep), messages=messages,
                          time_limit=time_limit)  # fmt: skip
        if digest:
            click.echo(outcome.digest or "hung")
        else:
            click.echo(f"seed {seed}: plan {outcome.plan or 'no faults'}; "
                       f"{outcome.seconds:.2f} s; digest {outcome.digest}")  # fmt: skip
        if outcome.violations:
            for line in outcome.violations:
                click.echo(f"  {line}", err=True)
            for line in outcome.tail:
                click.echo(f"  {line}", err=True)
        sys.exit(1 if outcome.violations else 0)
    assert seeds is not None
    workers = jobs or os.cpu_count() or 1
    began = time.perf_counter()
    failed: Outcome | None = None
    count = 0
    for outcome in run_seeds(range(start, start + seeds), jobs=workers, messages=messages,
                             inject=inject, time_limit=time_limit):  # fmt: skip
        count += 1
        if verbose:
            click.echo(f"seed {outcome.seed}: {outcome.seconds:.2f} s {outcome.digest or 'hung'}"
                       f"{' VIOLATION' if outcome.violations else ''}")  # fmt: skip
        if outcome.violations and failed is None:
            failed = outcome
    took = time.perf_counter() - began
    click.echo(f"{count} schedule(s), seeds {start}..{start + seeds - 1}, {workers} worker(s): "
               f"{took:.1f} s, {count / took:.1f} schedules/s; "
               f"{'a violation' if failed else 'no violation'}")  # fmt: skip
    if failed is not None:
        _report(failed, inject, messages)
        sys.exit(1)


if __name__ == "__main__":
    main()
