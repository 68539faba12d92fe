"""Tables of the admin console that stay readable at any terminal width.

An ``amps-py admin`` table is printed on a terminal of any width, or piped (where rich
assumes 80 columns). :func:`fit_table` keeps every column whole: when the table is
wider than the console it leaves out the least important columns first (each
:class:`Column` says how soon it may go; the key ones never do) and names them in the
caption; the columns left are never truncated: a cell wider than its share folds onto
the next line instead of ending in an ellipsis. On a screen too narrow even for the
key columns, the rows become paragraphs.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    """One column of a :func:`fit_table`.

    Attributes:
        header: the column's title.
        justify: ``left`` or ``right`` (numbers).
        drop: 0 for a key column, always shown; otherwise the order in which columns
            are left out when the table is too wide (the highest number goes first).
    """

    header: str
    justify: Literal["left", "right"] = "left"
    drop: int = 0


def fit_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int | None,
    *,
    notes: Sequence[str] = (),
) -> RenderableType:
    """A table of ``rows`` (one string per column) that fits ``width`` cells.

    Columns are dropped, highest :attr:`Column.drop` first, until the table's natural
    width fits (``width`` None: never); if it is still too wide, headers wrap between
    their words, and a cell wider than half the screen folds. The caption holds
    ``notes`` and, when columns were dropped, which and how to see them. When even
    that cannot fit, each row becomes a paragraph instead (``first column: header
    value, header value, ...``, every column, wrapped).
    """
    shown = list(range(len(columns)))
    widths = [_natural(columns[i], rows, i) for i in shown]
    if width is not None:
        overhead = _measure(_build(title, columns, rows, shown, widths)) - sum(widths)
        droppable = sorted(
            (i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop
        )
        while droppable and overhead + sum(widths) > width:
            at = shown.index(droppable.pop(0))
            del shown[at], widths[at]
            overhead = _measure(_build(title, columns, rows, shown, widths)) - sum(widths)
        squeezed = _squeeze(
            widths, [_narrowest(columns[i], rows, i, width) for i in shown], width - overhead
        )
        if squeezed is None:
            return _paragraphs(title, columns, rows, notes)
        widths = squeezed
    table = _build(title, columns, rows, shown, widths)
    left_out = [columns[i].header for i in range(len(columns)) if i not in shown]
    caption = list(notes)
    if left_out:
        caption.append(
            f"hidden at {width} columns: {', '.join(left_out)} (widen the terminal, or --json)"
        )
    if caption:
        table.caption = "\n".join(caption)
        table.caption_justify = "left"
    return table


def _natural(column: Column, rows: Sequence[Sequence[str]], i: int) -> int:
    """The width of column ``i`` with nothing wrapped."""
    return max([cell_len(column.header), *(cell_len(row[i]) for row in rows)])


def _narrowest(column: Column, rows: Sequence[Sequence[str]], i: int, width: int) -> int:
    """The narrowest column ``i`` may be: its widest cell (up to half the screen: a
    longer cell folds) and its header's longest word (a header wraps between words)."""
    widest = max((cell_len(row[i]) for row in rows), default=0)
    word = max(cell_len(w) for w in column.header.split())
    return max(min(widest, width // 2), word, 1)


def _squeeze(natural: list[int], narrowest: list[int], room: int) -> list[int] | None:
    """Column widths that add up to at most ``room``, taking the excess from the
    columns with the most to spare; None when even the narrowest do not fit."""
    widths = list(natural)
    excess = sum(widths) - room
    while excess > 0:
        spare = [w - n for w, n in zip(widths, narrowest, strict=True)]
        most = max(range(len(widths)), key=lambda i: spare[i], default=None)
        if most is None or spare[most] <= 0:
            return None
        cut = min(spare[most], excess)
        widths[most] -= cut
        excess -= cut
    return widths


def _build(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    shown: Sequence[int],
    widths: Sequence[int],
) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAVY,
        show_edge=False,
        expand=False,
    )
    for i, width in zip(shown, widths, strict=True):
        column = columns[i]
        table.add_column(column.header, justify=column.justify, overflow="fold", width=width)
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def _paragraphs(
    title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], notes: Sequence[str]
) -> Group:
    """The rows as wrapped paragraphs, for a screen too narrow for the table."""
    parts: list[RenderableType] = [Text(title)]
    for row in rows:
        fields = ", ".join(f"{c.header} {v}" for c, v in zip(columns[1:], row[1:], strict=True))
        parts.append(Text(f"{row[0]}: {fields}"))
    parts.extend(Text(note) for note in notes)
    return Group(*parts)


def _measure(table: Table) -> int:
    """The width ``table`` takes when nothing limits it."""
    console = Console(width=100_000, file=io.StringIO(), color_system=None)
    return Measurement.get(console, console.options, table).maximum
