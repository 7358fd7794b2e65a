"""Rich live display of an e2e run: one row per finished cell plus the running one.

The step loop only bumps counters in a CellProgress; rendering happens on rich's refresh thread
(a few times a second), so the display adds no per-step work to the measured loop beyond that.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rltbench.backends.base import CellProgress
from rltbench.results.console import fitted

MAX_ROWS = 24


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


class RunDisplay:
    """Live table (TTY) or one printed line per cell (logs, CI)."""

    def __init__(self, console: Console | None = None, live: bool = True):
        self.console = console or Console()
        self.use_live = live and self.console.is_terminal
        self.rows: list[dict[str, Any]] = []
        self.current: tuple[str, str, int, CellProgress] | None = None
        self.status = ""
        self._live: Live | None = None

    def __enter__(self) -> RunDisplay:
        if self.use_live:
            self._live = Live(
                get_renderable=self._render, console=self.console, refresh_per_second=4, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def note(self, text: str) -> None:
        self.status = text
        if not self.use_live:
            self.console.print(text, highlight=False, soft_wrap=True)

    def start_cell(self, arm: str, cell: str, rep: int, prog: CellProgress) -> None:
        self.current = (arm, cell, rep, prog)

    def finish_cell(self, row: dict[str, Any]) -> None:
        """`row`: arm, cell, rep, requests, n_ok, output_tok_s, ttft_p50, errors, identity (str), and for
        an open-loop rate `load` (achieved against target rate, saturation)."""
        self.current = None
        self.rows.append(row)
        if not self.use_live:
            self.console.print(
                f"{row['cell']:>8} rep {row['rep']} {row['arm']:<10} {row['n_ok']}/{row['requests']} ok  "
                f"{(row.get('output_tok_s') or 0):9.1f} tok/s  TTFT p50 {_ms(row.get('ttft_p50'))} ms  "
                f"identity {row.get('identity', '-')}" + ("" if row.get("valid") else "  [red]INVALID[/]")
                + (f"  {row['load']}" if row.get("load") else ""),
                highlight=False,
                soft_wrap=True,
            )

    def _render(self) -> Any:
        t = Table(title="rltbench e2e", expand=False)
        for col in ("cell", "rep", "arm", "progress", "tok/s", "TTFT p50 ms", "errors", "identity vs ref"):
            t.add_column(col, justify="right" if col not in ("arm", "cell") else "left")
        for r in self.rows[-MAX_ROWS:]:
            ident = r.get("identity", "-")
            style = "bold red" if r.get("exact_mismatch") else None
            t.add_row(
                r["cell"],
                str(r["rep"]),
                r["arm"],
                f"{r['n_ok']}/{r['requests']}",
                f"{(r.get('output_tok_s') or 0):.1f}",
                _ms(r.get("ttft_p50")),
                str(r["requests"] - r["n_ok"]),
                Text(str(ident), style=style or ""),
                style=None if r.get("valid") else "red",
            )
        if self.current is not None:
            arm, cell, rep, p = self.current
            el = max(time.perf_counter() - p.start, 1e-9)
            ttft = statistics.median(p.ttfts) if p.ttfts else None
            t.add_row(
                cell,
                str(rep),
                arm,
                f"{p.done}/{p.total}",
                f"{p.tokens / el:.1f}",
                _ms(ttft),
                str(p.errors),
                "running",
                style="cyan",
            )
        return Group(fitted(t, keys=3), Text(self.status, style="dim"))
