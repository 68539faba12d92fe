"""Progress of long work on stderr (a bar with counts and the time), drawn only when
stderr is a terminal: scripts and pipes see nothing extra. :func:`progress` opens one;
:func:`stderr_is_terminal` is the test every command uses before writing extra lines."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


class Progress:
    """Progress of long work, drawn on stderr only when stderr is a terminal (scripts
    and pipes see nothing extra). Use :func:`progress`."""

    def __init__(self, bar: Any, task: Any, room: int = 0) -> None:
        self._bar = bar
        self._task = task
        self._room = room

    def update(
        self, *, completed: float | None = None, total: float | None = None, **fields: Any
    ) -> None:
        """Set the amount done, the total, and/or the text fields (``what``,
        ``detail``)."""
        if self._bar is not None:
            if "what" in fields:
                fields["what"] = _fit(str(fields["what"]), self._room)
            self._bar.update(self._task, completed=completed, total=total, **fields)


#: terminal columns a progress line keeps for the bar (40), the counts and the time
#: (past them, ``what`` is shortened in the middle)
_BAR_ROOM = 62


def _fit(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters: its start (what is being done) and its
    end (a path's end names what), an ellipsis between."""
    if room <= 0 or len(text) <= room:
        return text
    head = room // 3
    return text[:head] + "…" + text[-(room - head - 1) :]


def stderr_is_terminal() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


@contextlib.contextmanager
def progress(what: str, total: float | None, unit: str = "") -> Iterator[Progress]:
    """A progress bar on stderr for ``what`` (``total`` in ``unit``s; ``None`` when
    unknown), removed when the block ends; a no-op unless stderr is a terminal."""
    if not stderr_is_terminal():
        yield Progress(None, None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress
    from rich.table import Column

    console = Console(stderr=True)
    # ``what`` (often a path) gives way on a narrow terminal, keeping its start and
    # end; the bar, the counts and the time keep their room
    room = max(20, console.width - _BAR_ROOM)
    keeps = Column(no_wrap=True)
    columns: list[Any] = [TextColumn("{task.fields[what]}", table_column=keeps), BarColumn()]
    if unit == "bytes":
        from rich.progress import DownloadColumn

        columns.append(DownloadColumn(table_column=keeps))
    else:
        columns.append(MofNCompleteColumn(table_column=keeps))
    columns += [TextColumn("{task.fields[detail]}"), TimeElapsedColumn()]
    bar = RichProgress(*columns, console=console, transient=True)
    with bar:
        task = bar.add_task(what, total=total, what=_fit(what, room), detail="")
        yield Progress(bar, task, room)
