"""Whatever the documented walkthroughs create in the repository, git ignores.

A new user runs the README's and docs/CLIENT.md's commands from the repository root:
the stores (``--store DIR``, the client examples' default store directories), the
pipeline's outputs (``--out``, the export directory), the files written out
(``orders.jsonl``) and every relative ``JournalDirectory`` of the shipped example
configs. None of them may show up in ``git status`` afterwards. The paths are read
from the documents, so a walkthrough that gains a path gains a check.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import REPO

DOCS = [REPO / "README.md", REPO / "docs" / "CLIENT.md"]


def documented_paths() -> set[str]:
    """Relative paths the walkthroughs' commands and examples create."""
    found: set[str] = set()
    for doc in DOCS:
        text = doc.read_text()
        fences = re.findall(r"^```(\w*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
        for language, block in fences:
            if language not in ("", "bash", "sh", "shell", "console"):
                continue
            for line in block.splitlines():
                if "amps-py" not in line or line.lstrip().startswith("#"):
                    continue
                try:
                    args = shlex.split(line, comments=True)
                except ValueError:
                    continue
                for flag in ("--store", "--out", "--file"):
                    if flag in args[:-1]:
                        found.add(args[args.index(flag) + 1])
                if args[1:3] == ["pipeline", "export"] or args[2:4] == ["pipeline", "export"]:
                    found.add(args[-1])
        # the client examples' default store directories
        found.update(re.findall(r'"(\./[\w.-]+\.store)"', text))
    for config in sorted((REPO / "config" / "examples").rglob("*.xml")):
        for directory in re.findall(
            r"<JournalDirectory>([^<$]+)</JournalDirectory>", config.read_text()
        ):
            if not Path(directory).is_absolute():
                found.add(directory)
    return {p.removeprefix("./").rstrip("/") for p in found if p not in ("-",) and "$" not in p}


def test_every_path_the_walkthroughs_create_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing for git status to show")
    paths = sorted(documented_paths())
    print("documented paths:", paths)
    assert {"feed.store", "audit.store", "orders-feed.store", "export"} <= set(paths), paths
    # a file inside each (a directory pattern matches what is below it)
    probes = [f"{p}/probe" if not p.endswith((".jsonl", ".pw")) else p for p in paths]
    shown = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *probes],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    not_ignored = [
        line.split("\t")[-1] for line in shown.stdout.splitlines() if line.startswith("::")
    ]
    assert not not_ignored, f"git status would show these walkthrough paths: {not_ignored}"
