"""The one Markdown table writer of every report: header, alignment row and one line per row.

A cell is written as `str(cell)`; an empty cell is written as a single space between its bars
(`| a | |`), as the reports always wrote it. Alignment per column: "" (left, `---`), "r" (`---:`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def row(cells: Iterable[Any]) -> str:
    """One table line: `| a | b |`."""
    return "|" + "".join(f" {c} |" if str(c) != "" else " |" for c in cells)


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str | Sequence[str] = "") -> list[str]:
    """The lines of a Markdown table. `align`: one code per column ("" or "l" left, "r" right), or a
    single code for every column."""
    codes = [align] * len(header) if isinstance(align, str) and len(align) <= 1 else list(align)
    sep = "|" + "".join("---:|" if a == "r" else "---|" for a in codes)
    return [row(header), sep, *(row(r) for r in rows)]
