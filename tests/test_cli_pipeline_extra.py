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
