"""What every ``amps-py`` command module shares (``amps_py.cli`` and its
``cli_<group>`` modules)."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``amps-py: message`` on stderr and exit with ``code``."""
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)
