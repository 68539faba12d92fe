"""fit_table: any width, any cells: nothing wider than the screen, no cell cut short,
key columns always there (seeded random tables, rendered by rich as the console does)."""

from __future__ import annotations

import io
import random
import string

import pytest
from rich.console import Console

from amps_py.admin.tables import Column, fit_table

SEED = 20261124
COLUMNS = (
    Column("destination"),
    Column("mode"),
    Column("address", drop=3),
    Column("sent txid", "right"),
    Column("acked txid", "right"),
    Column("behind (s)", "right", drop=2),
    Column("lag (msgs)", "right"),
    Column("downgrades", "right", drop=4),
)


def render(renderable: object, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(renderable)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def random_rows(rng: random.Random, n: int) -> list[tuple[str, ...]]:
    def name() -> str:
        return "".join(rng.choice(string.ascii_lowercase + "-") for _ in range(rng.randint(1, 40)))

    return [
        (
            name(),
            rng.choice(["sync", "async", "async*"]),
            f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.1:{rng.randint(1, 65535)}",
            str(rng.randint(0, 10**12)),
            str(rng.randint(0, 10**12)),
            f"{rng.random() * 1000:.1f}",
            str(rng.randint(0, 10**9)),
            str(rng.randint(0, 99)),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("width", [30, 50, 64, 80, 100, 120, 200])
def test_tables_fit_and_keep_every_key_cell_whole(width: int) -> None:
    rng = random.Random(SEED + width)
    print(f"seed {SEED + width}")
    for _ in range(40):
        rows = random_rows(rng, rng.randint(0, 4))
        text = render(fit_table("replication destinations", COLUMNS, rows, width), width)
        lines = text.splitlines()
        assert max((len(line) for line in lines), default=0) <= width, text
        assert "…" not in text, text
        flat = text.replace("\n", "")
        for row in rows:
            for column, cell in zip(COLUMNS, row, strict=True):
                if column.drop == 0 and len(cell) <= width // 2:
                    # whole, on one line (a longer name may fold, never be cut)
                    assert cell in text, (cell, text)
                elif column.drop == 0:
                    assert all(part in flat for part in cell.split("-") if part), (cell, text)


def test_dropped_columns_are_named_and_all_show_when_there_is_room() -> None:
    rows = [("chicago-secondary", "sync", "127.0.0.1:4000", "700", "700", "0.0", "0", "0")]
    wide = render(fit_table("t", COLUMNS, rows, 200), 200)
    assert "hidden" not in wide and "127.0.0.1:4000" in wide and "downgrades" in wide
    narrow = render(fit_table("t", COLUMNS, rows, 80), 80)
    assert "hidden at 80 columns: address, downgrades (widen" in " ".join(narrow.split())
    assert "127.0.0.1:4000" not in narrow
    # too narrow even for the key columns: one paragraph per row, every column
    tiny = render(fit_table("t", COLUMNS, rows, 30), 30)
    assert "chicago-secondary: mode sync, address 127.0.0.1:4000" in " ".join(tiny.split())


def test_an_empty_table_renders() -> None:
    assert "destination" in render(fit_table("t", COLUMNS, [], 80), 80)
