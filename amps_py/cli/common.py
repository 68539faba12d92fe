"""What every ``amps-py`` command module of the :mod:`amps_py.cli` package shares:
:func:`fail` (one line on stderr and an exit status) and :class:`Pacer` (``publish
--rate``)."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``amps-py: message`` on stderr and exit with ``code``."""
    click.echo(f"amps-py: {message}", err=True)
    sys.exit(code)


class Pacer:
    """Spaces the returns of :meth:`wait` ``1 / rate`` seconds apart on trio's clock
    (``publish --rate``); ``rate`` None does not wait at all.

    A caller that fell behind (the server was slow) catches up at full speed, but by at
    most one second's worth of calls: a long stall is not followed by a burst."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next: float | None = None

    async def wait(self) -> None:
        """Return when the next call is due (at once on the first call)."""
        if not self._interval:
            return
        import trio

        now = trio.current_time()
        if self._next is None or self._next < now - 1.0:
            self._next = now
        else:
            await trio.sleep_until(self._next)
        self._next += self._interval
