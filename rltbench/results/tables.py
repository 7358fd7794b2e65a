"""The one Markdown table writer of every report: a header, its alignment row and one line per row.

Every cell is written as ` {cell} |` (str() of the value), so the same rows always give the same
bytes and a re-rendered table.md compares equal to the stored one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def row(cells: Iterable[Any]) -> str:
    """One table line: `| a | b |`."""
    return "|" + "".join(f" {c} |" for c in cells)


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str | Sequence[str] = "") -> list[str]:
    """The lines of a Markdown table. `align`: one code per column ("" left: `---`, "r" right: `---:`),
    or one code for every column."""
    codes = [align] * len(header) if isinstance(align, str) and len(align) <= 1 else list(align)
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in codes)
    return [row(header), rule, *(row(r) for r in rows)]
