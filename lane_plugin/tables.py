"""Plain text tables that fit a width: the columns that fit are shown, the rest named below the table.

The ``lane`` command and the reports print their tables through :func:`fit`: 100 characters by default
(``lane ... --wide`` shows every column). Columns marked optional are left out, the last named first,
until the table fits; a long text column (a parked job's reason) can go on its own indented line
under each row instead of widening the table. Numbers are never cut or folded.

Example:
    >>> print("\\n".join(fit(["lane", "spent", "note"], [["free", "1,200", "ok"]], right={"spent"})))
    lane  spent  note
    free  1,200  ok
    >>> fit(["a", "b"], [["x", "y" * 40]], width=30, optional=["b"])
    ['a', 'x', '(1 more column with --wide: b)']
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Sequence

WIDTH = 100
GAP = "  "


def _widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]


def line_width(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """Characters one line of the table needs with every cell whole."""
    return sum(_widths(columns, rows)) + len(GAP) * max(0, len(columns) - 1)


def fit(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int = WIDTH,
    wide: bool = False,
    right: Collection[str] = (),
    optional: Sequence[str] = (),
    below: str | None = None,
) -> list[str]:
    """The table's lines: a header, one line per row (and its ``below`` line), then what was left out.

    Args:
        columns: the column names, in the order shown.
        rows: the cells (``None`` shows as empty); each row as long as ``columns``.
        width: the most characters a line may take (``wide`` ignores it).
        wide: show every column, ``below`` in its place, whatever the width.
        right: columns aligned right (numbers).
        optional: columns that may be left out, the last named first, while the table is wider than ``width``.
        below: a text column shown on its own indented line under each row, wrapped to ``width``.
    """
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    keep = list(range(len(columns)))
    under = None
    if not wide and below is not None and below in columns:
        under = columns.index(below)
        keep.remove(under)
    dropped: list[int] = []
    drop_order = [columns.index(c) for c in reversed(list(optional)) if c in columns and columns.index(c) in keep]
    while not wide and drop_order and line_width(*_pick(columns, cells, keep)) > width:
        i = drop_order.pop(0)
        keep.remove(i)
        dropped.append(i)
    names, picked = _pick(columns, cells, keep)
    widths = _widths(names, picked)
    aligned = [columns[i] in right for i in keep]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, aligned)]
        return GAP.join(parts).rstrip()

    out = [line(names)]
    for full, row in zip(cells, picked):
        out.append(line(row))
        if under is not None and full[under]:
            out += textwrap.wrap(full[under], width=max(20, width), initial_indent="  ", subsequent_indent="    ")
    if dropped:
        left = [columns[i] for i in sorted(dropped)]
        said = f"({len(left)} more column{'s' * (len(left) != 1)} with --wide: {', '.join(left)})"
        out += textwrap.wrap(said, width=max(20, width), subsequent_indent=" ", break_on_hyphens=False)
    return out


def _pick(columns: Sequence[str], cells: list[list[str]], keep: list[int]) -> tuple[list[str], list[list[str]]]:
    return [columns[i] for i in keep], [[r[i] for i in keep] for r in cells]


__all__ = ["WIDTH", "fit", "line_width"]
