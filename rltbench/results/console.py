"""Console tables that fit the terminal without splitting a word: the one place every command's
console table goes through.

Why: rich shrinks a table wider than the console by wrapping its cells, and a cell narrower than its
value is cut mid-word (`bf1` / `6`, `tor` / `ch`): a number cut in two reads as two numbers.
`fitted(table, keys)` decides at render time, for the width it is given (a terminal's, `COLUMNS`, or
80 in a pipe; a Live display re-decides on every refresh):

1. the table as it is, when every column fits at its natural width (no cell ever wraps: a value
   over two lines reads as two values);
2. else the table in parts of fewer columns, each part repeating the first `keys` columns (the
   columns that name a row), so each row stays readable across parts;
3. else (even the key columns and one more do not fit) one record per block: `header value` pairs,
   packed into lines, a line break only between pairs.

`print_markdown` prints a report's table.md the same way: its Markdown tables that fit are printed
as they are, wider ones go through `fitted`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

UNBOUNDED = 100_000   # a width no table reaches: measures a table's natural width
PIPE_WIDTH = 160      # kernels and profile: a log or pipe without COLUMNS gets room for the whole table
PAIR_GAP = "   "      # between the `header value` pairs of a record


def wide_console(pipe_width: int = PIPE_WIDTH) -> Console:
    """stdout's console; in a log or pipe without `COLUMNS`, `pipe_width` wide. A terminal, or an
    explicit `COLUMNS`, keeps its own width: tables then fold to it (`fitted`)."""
    con = Console()
    if con.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return con
    return Console(width=max(con.width, pipe_width))


def _text(cell: Any) -> Text:
    """A cell as rich Text: markup strings parsed as rich would, Text kept."""
    if isinstance(cell, Text):
        return cell
    return Text.from_markup(cell) if isinstance(cell, str) else Text(str(cell))


def _natural(console: Console, options: ConsoleOptions, renderable: RenderableType) -> Measurement:
    """(minimum, maximum) width of `renderable` with no width limit."""
    return Measurement.get(console, options.update_width(UNBOUNDED), renderable)


class FittedTable:
    """A rich Table rendered to fit the width it is given (module doc). Rows are read from the
    table when rendered, so a table filled later (a live display) is fitted as it is then."""

    def __init__(self, table: Table, keys: int = 1):
        self.table = table
        self.keys = max(0, min(keys, len(table.columns)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        width = options.max_width
        n = len(self.table.columns)
        whole = self._fit(console, options, list(range(n)), width, first=True, last=True)
        if whole is not None:
            yield whole
            return
        parts = self._parts(console, options, width)
        if parts is None:
            yield from self._records(console, options, width)
            return
        for i, cols in enumerate(parts):
            yield self._fit(console, options, cols, width, first=i == 0, last=i == len(parts) - 1,
                            part=(i + 1, len(parts)))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(min(options.max_width, 20), options.max_width)

    # ---- the table, or a part of it --------------------------------------------------------------
    def _fit(self, console: Console, options: ConsoleOptions, cols: Sequence[int], width: int,
             first: bool, last: bool, part: tuple[int, int] | None = None) -> Table | None:
        """The table of columns `cols`, every column at its natural width (no cell wraps), or None
        when that is wider than `width`."""
        t = copy.copy(self.table)
        t.columns = []
        for k, i in enumerate(cols):
            c: Column = copy.copy(self.table.columns[i])
            c._index = k   # rich pads the first and last column by position
            c.no_wrap = True
            t.columns.append(c)
        title = self.table.title
        if part is not None and isinstance(title, str):
            title = f"{title} (part {part[0]} of {part[1]})"
        t.title = title if first or part is not None else None
        t.caption = self.table.caption if last else None
        return t if _natural(console, options, t).maximum <= width else None

    def _parts(self, console: Console, options: ConsoleOptions, width: int) -> list[list[int]] | None:
        """The columns in consecutive groups that each fit beside the key columns, or None."""
        keys = list(range(self.keys))
        rest = list(range(self.keys, len(self.table.columns)))
        parts: list[list[int]] = []
        group: list[int] = []
        for i in rest:
            if self._fit(console, options, keys + group + [i], width, True, True, (1, 2)) is not None:
                group.append(i)
                continue
            if not group:
                return None
            parts.append(keys + group)
            group = [i]
            if self._fit(console, options, keys + group, width, True, True, (1, 2)) is None:
                return None
        if group or not parts:
            parts.append(keys + group)
        return parts

    # ---- one record per block --------------------------------------------------------------------
    def _records(self, console: Console, options: ConsoleOptions, width: int) -> Iterator[RenderableType]:
        if self.table.title:
            yield _text(self.table.title)
        headers = [_text(c.header).plain for c in self.table.columns]
        for r in range(self.table.row_count):
            pairs = []
            for h, c in zip(headers, self.table.columns, strict=True):
                cell = _text(c._cells[r])
                if cell.plain.strip():
                    pairs.append(Text.assemble((f"{h} ", "dim"), cell) if h else cell)
            yield from pack(pairs, width)
            yield Text("")
        if self.table.caption:
            yield _text(self.table.caption)


def pack(pairs: Iterable[Text], width: int, gap: str = PAIR_GAP) -> list[Text]:
    """`pairs` joined into lines of at most `width` cells, a line broken only between pairs (a pair
    wider than the line stands alone and wraps at its spaces)."""
    lines: list[Text] = []
    line = Text("")
    for p in pairs:
        if line.plain and line.cell_len + len(gap) + p.cell_len > width:
            lines.append(line)
            line = Text("")
        line = Text.assemble(line, gap, p) if line.plain else p.copy()
    if line.plain:
        lines.append(line)
    return lines


def fitted(table: Table, keys: int = 1) -> FittedTable:
    """`table` as it prints on any console width without cutting a value (module doc); `keys`: the
    leading columns that name a row, repeated in every part."""
    return FittedTable(table, keys)


# ---- Markdown (table.md) on the console ----------------------------------------------------------
def _md_cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return [c.strip() for c in body.split("|")]


def markdown_table(lines: Sequence[str]) -> Table:
    """A Markdown table (header, alignment rule, rows) as a rich Table: right-aligned where the rule
    says `---:`; cells are plain text (no rich markup)."""
    header = _md_cells(lines[0])
    rule = _md_cells(lines[1]) if len(lines) > 1 else []
    right = [r.endswith(":") and not r.startswith(":") for r in rule] + [False] * len(header)
    table = Table(pad_edge=False, show_edge=False)
    for h, r in zip(header, right, strict=False):
        table.add_column(Text(h), justify="right" if r else "left")
    for line in lines[2:]:
        cells = _md_cells(line)
        cells = (cells + [""] * len(header))[: len(header)]
        table.add_row(*(Text(c) for c in cells))
    return table


def _blocks(text: str) -> Iterator[tuple[bool, list[str]]]:
    """(is a table, lines) runs of `text`: a table is two or more consecutive lines starting with
    '|' whose second line is an alignment rule."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            j += 1
        if j - i >= 2 and set(lines[i + 1].replace("|", "").strip()) <= set("-: "):
            yield True, lines[i:j]
            i = j
        else:
            yield False, lines[i:max(j, i + 1)]
            i = max(j, i + 1)


def print_markdown(console: Console, text: str) -> None:
    """A report's Markdown on the console: prose wraps at spaces, a table that fits the console is
    printed as it is, a wider one through `fitted` (its first column names the row)."""
    for is_table, lines in _blocks(text):
        if is_table and max(len(line) for line in lines) > console.width:
            console.print(fitted(markdown_table(lines), keys=1))
        else:
            for line in lines:
                console.print(line, markup=False, highlight=False)


def print_table_md(path: Path, console: Console | None = None) -> None:
    """A run's table.md on stdout (or `console`), fitted to its width (`print_markdown`)."""
    print_markdown(console or Console(), path.read_text())


__all__ = ["FittedTable", "fitted", "markdown_table", "pack", "print_markdown", "print_table_md",
           "wide_console"]
