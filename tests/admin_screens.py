"""Run `amps-py admin` as a user does and read what it prints.

- :func:`admin_cli` runs the venv's `amps-py` console script with its output piped (so
  not a terminal: rich lays out for 80 columns unless COLUMNS says otherwise).
- :func:`table` finds a table of the console's layout (a header line, a rule of ``━``,
  then rows; columns at least two spaces apart) and returns its rows as dicts.
- :func:`words` joins wrapped lines, so a sentence can be searched whatever the width.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import ServerProcess


def admin_url(server: ServerProcess) -> str:
    """The admin interface of a running instance, from its ready file."""
    ready = json.loads(server.ready_file.read_text())
    return f"http://127.0.0.1:{ready['transports']['admin']}"


def admin_cli(url: str, *args: str, columns: int | None = 80) -> subprocess.CompletedProcess[str]:
    """``amps-py admin --url URL ARGS``, piped; ``columns`` sets COLUMNS (None: unset,
    rich's own default for a pipe)."""
    script = Path(sys.executable).with_name("amps-py")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "amps_py"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({"NO_COLOR": "1", "TERM": "dumb"})
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [*command, "admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def admin_json(url: str, *args: str) -> Any:
    """``amps-py admin --url URL --json ARGS``, parsed."""
    result = admin_cli(url, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def table(screen: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the table whose first column is headed ``first_header``, as dicts
    keyed by header (a header wrapped over several lines is joined with spaces).

    Columns are found where every header and row line has two or more spaces in a
    row; a cell folded onto a second line fails the check.
    """
    lines = screen.splitlines()
    last_header = next(
        (i for i, line in enumerate(lines) if _split(line)[:1] == [first_header]), None
    )
    assert last_header is not None, f"no table with a {first_header!r} column in:\n{screen}"
    rule = last_header + 1
    assert set(lines[rule].strip()) == {"━"}, f"no rule under the header:\n{screen}"
    top = last_header
    while top > 0 and lines[top - 1].startswith(" ") and lines[top - 1].strip():
        top -= 1  # the header's upper lines (the title starts at column 0)
    body = []
    for line in lines[rule + 1 :]:
        if not line.startswith(" ") or not line.strip():
            break  # the caption, or what follows the table
        body.append(line)
    spans = _columns([*lines[top:rule], *body])
    headers = [
        " ".join(filter(None, (line[a:b].strip() for line in lines[top:rule]))) for a, b in spans
    ]
    rows = []
    for line in body:
        cells = [line[a:b].strip() for a, b in spans]
        assert all(cells), f"row {line!r} has an empty or folded cell ({headers})"
        rows.append(dict(zip(headers, cells, strict=True)))
    return rows


def _split(line: str) -> list[str]:
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


def _columns(lines: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each run of text that no gap of two spaces interrupts in any
    of ``lines``."""
    width = max(len(line) for line in lines)
    used = [any(i < len(line) and line[i] != " " for line in lines) for i in range(width)]
    spans: list[tuple[int, int]] = []
    start: int | None = None
    gap = 0
    for i, busy in enumerate([*used, False, False]):
        if busy:
            if start is None:
                start = i
            gap = 0
            end = i + 1
        elif start is not None:
            gap += 1
            if gap == 2:
                spans.append((start, end))
                start = None
    return spans


def words(text: str) -> str:
    """``text`` with every run of white space (line breaks included) made one space."""
    return " ".join(text.split())
