"""The simulator (tools/sim.py, docs/SIMULATION.md) run as a user runs it: a seed's
trace is the same run after run, a planted bug is found and its printed replay
command fails again, and a batch of schedules holds every guarantee."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "tools" / "sim.py"


def sim(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    return subprocess.run(
        [sys.executable, str(SIM), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_a_seed_prints_the_same_digest_run_after_run() -> None:
    first = sim("--seed", "3", "--digest")
    assert first.returncode == 0, first.stderr
    again = sim("--seed", "3", "--digest")
    other = sim("--seed", "4", "--digest")
    assert len(first.stdout.strip()) == 32, first.stdout
    assert again.stdout == first.stdout, "the same seed gave another trace"
    assert other.stdout != first.stdout, "the seed does not steer the schedule"


def test_a_planted_bug_is_found_and_its_replay_command_fails_again() -> None:
    """Acks that do not wait for the sync destination (ack-before-sync) break "a
    persisted ack means every instance the message is routed to holds it"."""
    found = sim("--seeds", "20", "--inject", "ack-before-sync")
    assert found.returncode == 1, found.stdout + found.stderr
    assert "a violation" in found.stdout
    assert "had a persisted ack through seq" in found.stderr
    replays = [line for line in found.stderr.splitlines() if line.startswith("replay: ")]
    assert replays, found.stderr
    command = shlex.split(replays[0].removeprefix("replay: "))
    assert command[:2] == ["python", "tools/sim.py"] and "--inject" in command
    again = sim(*command[2:])
    assert again.returncode == 1, again.stdout + again.stderr
    assert "had a persisted ack through seq" in again.stderr


def test_a_batch_of_schedules_holds_every_guarantee() -> None:
    batch = sim("--seeds", "24", "--start", "100")
    assert batch.returncode == 0, batch.stdout + batch.stderr[-3000:]
    assert "24 schedule(s), seeds 100..123" in batch.stdout
    assert "no violation" in batch.stdout


def test_bad_arguments_say_what_to_give() -> None:
    neither = sim()
    assert neither.returncode == 2
    assert "give --seeds N (a batch) or --seed S (one schedule)" in neither.stderr
    keep = sim("--seed", "1", "--keep", "x")
    assert keep.returncode == 2
    assert "give fault indexes like 0,2 (or none)" in keep.stderr
