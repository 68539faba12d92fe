"""Run Python code in a fresh interpreter: what importing a module really loads, with
nothing that other tests imported already counting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_fresh(code: str) -> str:
    """Run ``code`` with ``python -c`` from the repository root; its stripped stdout.
    Fails the test, showing stderr, when the code fails."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
