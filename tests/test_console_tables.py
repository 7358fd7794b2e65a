"""Every command's console table at 80 columns: it folds (parts of fewer columns, or one record per
block) and never splits a value across lines. The old kernels table printed `bf1` / `6` and
`tor` / `ch` at 80 columns. Inputs are the committed GPU runs (the widest tables there are: timing
columns included) and small synthetic tables; nothing here runs a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from rltbench.results.console import _blocks, _md_cells, _text, fitted, markdown_table, print_markdown

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "results" / "gpu"
WIDTH = 80


def _render(renderable, width: int = WIDTH) -> list[str]:
    con = Console(width=width, record=True, force_terminal=False, color_system=None)
    con.print(renderable)
    return con.export_text().splitlines()


def _cells(table: Table) -> list[str]:
    return [_text(c).plain.strip() for col in table.columns for c in [col.header, *col._cells]]


def assert_whole(values: list[str], lines: list[str], width: int = WIDTH) -> None:
    """No line is wider than the console, nothing is cut with an ellipsis, and every value is on one
    line whole; a value with spaces may wrap only at its spaces (each word whole on some line, unless
    the word alone is wider than the console: a 90-character kernel name)."""
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    text = "\n".join(lines)
    assert "…" not in text
    for v in filter(None, values):
        if any(v in line for line in lines):
            continue
        assert " " in v, f"{v!r} is split across lines"
        words = {w for line in lines for w in line.replace("│", " ").replace("┃", " ").split()}
        missing = [w for w in v.split() if len(w) <= width  # a longer word cannot be kept whole
                   and w not in words and not any(w in line for line in lines)]
        assert not missing, f"{v!r}: {missing} split across lines"


# ---- the shared fold -----------------------------------------------------------------------------
def _wide(rows: int = 4) -> Table:
    t = Table(title="a wide table")
    for name in ("op", "dtype", "arm", *(f"metric number {i}" for i in range(8))):
        t.add_column(name, justify="left" if name in ("op", "dtype", "arm") else "right")
    for r in range(rows):
        t.add_row("add_rmsnorm_huginn", "bf16", f"torch#{r}", *(f"{1234.5678 * (i + r):.2f} (12.3%)"
                                                                for i in range(8)))
    return t


def test_a_table_that_fits_prints_unchanged() -> None:
    t = Table()
    t.add_column("arm")
    t.add_column("x", justify="right")
    t.add_row("torch", "1.00")
    assert _render(fitted(t)) == _render(t)


def test_a_wide_table_folds_into_parts_that_repeat_the_key_columns() -> None:
    t = _wide()
    lines = _render(fitted(t, keys=3))
    assert_whole(_cells(t), lines)
    text = "\n".join(lines)
    assert "(part 1 of" in text and "(part 2 of" in text
    assert text.count("add_rmsnorm_huginn") > 4  # every part names its rows


def test_when_even_one_column_does_not_fit_each_record_is_a_block() -> None:
    t = _wide(rows=2)
    lines = _render(fitted(t, keys=3), width=40)
    assert_whole(_cells(t), lines, width=40)
    assert any(line.startswith("op add_rmsnorm_huginn") for line in lines)


def test_a_value_wider_than_the_console_wraps_at_spaces_only() -> None:
    t = Table()
    t.add_column("arm", no_wrap=True)
    t.add_column("n", justify="right", no_wrap=True)
    t.add_column("verdict")
    t.add_row("approx_long", "1319/1319", "inconclusive: random weights " * 3)
    lines = _render(fitted(t), width=40)
    assert_whole(["approx_long", "1319/1319", "inconclusive:", "random", "weights"], lines, width=40)
    assert any(line.startswith("arm approx_long") for line in lines)  # one record per block


def test_markdown_tables_fold_and_prose_wraps_at_spaces() -> None:
    header = "| cell | policy | " + " | ".join(f"metric {i} (p10-p90)" for i in range(6)) + " |"
    rule = "|---|---|" + "---:|" * 6
    row = "| C=128 | one-per-step | " + " | ".join("1234.56 (1200.00-1300.00)" for _ in range(6)) + " |"
    prose = "word " * 40
    narrow = ["| a | b |", "|---|---|", "| 1 | 2 |"]
    text = "\n".join(["# title", "", prose, "", header, rule, row, row, "", *narrow])
    lines = _render_md(text)
    assert_whole([c for line in (header, row) for c in _md_cells(line)] + ["word"], lines)
    assert "| a | b |" in lines  # a table that fits stays Markdown


def _render_md(text: str, width: int = WIDTH) -> list[str]:
    con = Console(width=width, record=True, force_terminal=False, color_system=None)
    print_markdown(con, text)
    return con.export_text().splitlines()


def _md_values(text: str) -> list[str]:
    return [c for is_table, lines in _blocks(text) if is_table for line in lines for c in _md_cells(line)
            if set(c) - set("-: ")]


# ---- each command's console table ----------------------------------------------------------------
def test_kernels_table_at_80_columns() -> None:
    from rltbench.commands.kernels import report
    from rltbench.results import RunDir

    df, verdicts = report.load_run(RunDir.open(GPU / "kernels-verdicts"))
    df = df[df["op"].isin(["rmsnorm", "silu_mul"])]
    for table in (report.rich_table(df), report.rich_verdicts(verdicts)):
        assert table is not None
        assert_whole(_cells(table), _render(fitted(table, keys=report.KEY_COLUMNS)))


def test_kernels_cpu_table_at_80_columns() -> None:
    """The main job's table on a machine without a GPU (no timing columns): the cells that were cut."""
    import pandas as pd

    from rltbench.commands.kernels import report

    rows = [{"op": "add_rmsnorm_huginn", "dtype": "bf16", "width": 512, "tokens": t, "arm": arm,
             "status": "ok", "mismatches": 188 if arm == "approx" else 0, "mismatch_share": 0.367,
             "max_ulp_vs_torch": 2, "max_ulp_vs_oracle": 1.56, "max_err_over_bound": 2.59,
             "share_differs_oracle": 0.3672}
            for t in (1, 8) for arm in ("torch", "torch#2", "exact", "approx")]
    table = report.rich_table(pd.DataFrame(rows))
    lines = _render(fitted(table, keys=report.KEY_COLUMNS))
    assert_whole(_cells(table), lines)
    assert any("bf16" in line and "torch#2" in line for line in lines)


def test_gsm8k_gate_table_at_80_columns(monkeypatch) -> None:
    import rltbench.commands.gsm8k.cli as gcli

    summary = json.loads((GPU / "gsm8k" / "summary.json").read_text())
    con = Console(width=WIDTH, record=True, force_terminal=False, color_system=None)
    monkeypatch.setattr(gcli, "console", con)
    gcli._print_summary(summary)
    # the table; the lines under it that explain an inconclusive arm are prose, wrapped by the terminal
    lines = [line for line in con.export_text().splitlines() if ": inconclusive:" not in line]
    assert_whole(["torch", "exact", "approx", "identical", "reference"], lines)


def test_e2e_live_table_at_80_columns() -> None:
    from rltbench.commands.e2e.display import RunDisplay

    display = RunDisplay(console=Console(width=WIDTH), live=False)
    rows = [{"cell": "C=128", "rep": r, "arm": arm, "n_ok": 128, "requests": 128, "output_tok_s": 12345.6,
             "ttft_p50": 1.2345, "valid": True, "identity": "128/128"}
            for r in range(2) for arm in ("torch", "exact", "approx", "torch#2")]
    display.rows = rows
    renderable = display._render()
    table = renderable.renderables[0].table
    assert_whole(_cells(table), _render(renderable))


@pytest.mark.parametrize("run", ["profile-native", "prefill-long", "capacity", "e2e-exact", "gsm8k"])
def test_command_markdown_tables_at_80_columns(run: str) -> None:
    """The commands that print their table.md (capacity, prefill, profile) and the widest table.md
    files there are: every Markdown table folds, no value is cut."""
    text = (GPU / run / "table.md").read_text()
    assert_whole(_md_values(text), _render_md(text))


def test_markdown_table_keeps_alignment() -> None:
    table = markdown_table(["| a | b |", "|---|---:|", "| x | 1 |"])
    assert [c.justify for c in table.columns] == ["left", "right"]
