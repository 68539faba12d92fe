"""Every `amps-py pipeline` command without the spark extra: one line naming what is
missing and the install command that fits this amps-py (a source checkout's `pip
install -e '.[spark]'`, an installed package's `pip install 'amps-py[spark]'`), exit
status 2, no traceback. The real CLI runs with pyarrow and pyspark made unimportable
by a finder put first on sys.meta_path before amps_py's main starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli_env, installed_layout
from harness import REPO

BLOCKING_MAIN = """
import sys

BLOCKED = set(sys.argv[1].split(","))


class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocked())
del sys.argv[1]
sys.argv[0] = "amps-py"
from amps_py.cli import main

main()
"""

COMMANDS = {
    "stats": ["pipeline", "stats", "journal"],
    "export": ["pipeline", "export", "journal", "out"],
    "audit": ["pipeline", "audit", "--config", "c.xml", "--journals", "journal"],
}


def run_blocked(
    blocked: str, args: list[str], cwd: Path, pythonpath: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKING_MAIN, blocked, *args],
        cwd=cwd,
        env=cli_env({"PYTHONPATH": str(pythonpath)}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_in_a_source_checkout_the_line_says_pip_install_e(command: str, tmp_path: Path) -> None:
    res = run_blocked("pyarrow,pyspark", COMMANDS[command], tmp_path, REPO)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    needs = "pyarrow is" if command == "export" else "pyspark and pyarrow are"
    java = "" if command == "export" else "; the Spark jobs also need Java 17 or newer"
    assert res.stderr == (
        f"amps-py: this command needs the spark extra, and {needs} not installed: "
        f"cd {REPO} && pip install -e '.[spark]'{java}\n"
    )
    # from the checkout's own directory, `.` is the checkout
    here = run_blocked("pyarrow", COMMANDS[command], REPO, REPO)
    assert here.returncode == 2
    assert here.stderr.endswith(f"pyarrow is not installed: pip install -e '.[spark]'{java}\n")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_installed_package_says_the_distribution_name(command: str, tmp_path: Path) -> None:
    site = installed_layout(tmp_path / "site", REPO)
    res = run_blocked("pyarrow", COMMANDS[command], tmp_path, site)
    assert res.returncode == 2, res.stderr
    java = "" if command == "export" else "; the Spark jobs also need Java 17 or newer"
    assert res.stderr == (
        "amps-py: this command needs the spark extra, and pyarrow is not installed: "
        f"pip install 'amps-py[spark]'{java}\n"
    )


def test_help_works_without_the_extra(tmp_path: Path) -> None:
    res = run_blocked("pyarrow,pyspark", ["pipeline", "stats", "--help"], tmp_path, REPO)
    assert res.returncode == 0, res.stderr
    assert "Message counts" in res.stdout


# ---------------------------------------------------------------------- audit failures
#: how Spark reports failures the audit must not take for "problems found" (exit 1)
SPARK_FAILURES = {
    "out of memory": (
        "An error occurred while calling o97.collectToPython.\n: org.apache.spark."
        "SparkException: Job aborted due to stage failure: Task 1 in stage 12.0 failed 4 "
        "times, most recent failure: Lost task 1.3 in stage 12.0 (TID 80): "
        "java.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.util.Arrays",
        ["Spark ran out of memory (java.lang.OutOfMemoryError: Java heap space)"],
    ),
    "lost executor": (
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times: "
        "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) "
        "Reason: Remote RPC client disassociated.",
        ["a Spark executor was lost"],
    ),
    "dead driver JVM": (
        "Answer from Java side is empty",
        ["the Spark driver's JVM stopped answering"],
    ),
    "damaged record": (
        'Job aborted: ... Traceback (most recent call last):\n  File "readplan.py"\n'
        "txlog.errors.JournalDamaged: journal /j/A: record txid 7 is corrupt: CRC mismatch;"
        " restore the journal from a replica or backup (amps-py txlog verify lists every "
        "damaged record)\n\tat org.apache.spark",
        ["journal /j/A: record txid 7 is corrupt: CRC mismatch", "amps-py txlog verify"],
    ),
    "anything else": (
        "org.apache.spark.SparkException: Job 4 cancelled because SparkContext was shut down",
        ["the Spark job failed: org.apache.spark.SparkException: Job 4 cancelled"],
    ),
}


@pytest.mark.parametrize("case", sorted(SPARK_FAILURES))
def test_a_failed_audit_job_says_what_failed_and_what_to_do(case: str) -> None:
    """Exit status 3 goes with one line: what failed, and (for memory) the settings
    to raise; the damaged record's own message and fix come through unchanged."""
    pytest.importorskip("click")
    from amps_py.cli.pipeline import audit_failure

    text, wanted = SPARK_FAILURES[case]
    line = audit_failure(RuntimeError(text))
    assert "\n" not in line
    assert line.startswith("the audit could not complete: ")
    for part in wanted:
        assert part in line, line
    if case in ("out of memory", "lost executor", "dead driver JVM"):
        assert "spark.driver.memory=4g" in line and "spark.executor.memory=4g" in line


class _DeadJvmError(Exception):
    """As py4j's Py4JJavaError once the JVM has exited (out of memory): its text must
    be fetched from the JVM, which no longer answers."""

    errmsg = "An error occurred while calling o412.collectToPython.\n"

    def __str__(self) -> str:
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_job_whose_jvm_died_is_one_line_not_a_traceback() -> None:
    """Seen at 2M records with 480 MB of heap: the JVM died of OutOfMemoryError, and
    reading the exception's text raised ConnectionRefusedError out of the CLI."""
    pytest.importorskip("click")
    from amps_py.cli.pipeline import audit_failure

    line = audit_failure(_DeadJvmError())
    assert "\n" not in line
    assert line.startswith("the audit could not complete: the Spark driver's JVM stopped answering")
    assert "spark.driver.memory=4g" in line
