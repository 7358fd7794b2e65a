"""`rltbench kernels --diagnose ncu` without a GPU: Nsight Compute's raw CSV read back (units row, thousands
separators, notes, n/a), rows joined to the launch plan one to one (a count mismatch is an error, not
a silent shift), figures per call in the back-to-back view, ratios against the copies beside a
kernel, and bad input refused with exit 2 before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rltbench.commands.kernels import ncu as ncu_module
from rltbench.errors import UsageError


@pytest.fixture(scope="module")
def ncu() -> dict:
    return vars(ncu_module)


def _csv(rows: list[tuple[str, float, float, float]]) -> str:
    """A raw-page CSV as `ncu --import --csv --page raw --print-units base` writes it: header, units,
    one quoted row per kernel; an unquoted note line first."""
    cols = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "launch__registers_per_thread"]
    units = '"","","ns","byte","byte","register/thread"'
    lines = ["==PROF== a note", ",".join(f'"{c}"' for c in cols), units]
    for i, (name, dur, rd, wr) in enumerate(rows):
        vals = [str(i), name, f"{dur:,.0f}", f"{rd:,.0f}", f"{wr:,.0f}", "n/a"]
        lines.append(",".join(f'"{v}"' for v in vals))
    return "\n".join(lines) + "\n"


def _plan(cases: list[str], calls: int = 1) -> list[dict]:
    return [{"case": c, "rep": 0, "calls": calls, "read_bytes": 1000, "write_bytes": 1000} for c in cases]


def test_raw_csv_read_back(ncu) -> None:
    rows = ncu["parse_raw_csv"](_csv([("_lowwarp_rows_norm_kernel", 9410, 16_800_000, 520_000)]))
    assert rows == [{"kernel": "_lowwarp_rows_norm_kernel", "gpu__time_duration.sum": 9410.0,
                     "dram__bytes_read.sum": 16_800_000.0, "dram__bytes_write.sum": 520_000.0,
                     "launch__registers_per_thread": None}]
    with pytest.raises(RuntimeError, match="no profiled kernels"):
        ncu["parse_raw_csv"]("==PROF== nothing\n")


def test_metrics_csv_keeps_identity_and_metrics_only(ncu) -> None:
    raw = _csv([("k", 1000, 10, 20)]).replace('"ID",', '"ID","device__attribute_chip",').replace(
        '"","",', '"","","",', 1).replace('"0",', '"0","GH100",')
    cut = ncu["metric_columns"](raw)
    assert "device__attribute_chip" not in cut and "GH100" not in cut and "==PROF==" not in cut
    assert ncu["parse_raw_csv"](cut) == ncu["parse_raw_csv"](raw)


def test_plan_and_rows_must_match_one_to_one(ncu) -> None:
    profiled = ncu["parse_raw_csv"](_csv([("k", 1000, 10, 10)] * 2))
    with pytest.raises(RuntimeError, match="2 rows profiled for 3 planned launches"):
        ncu["join_plan"](_plan(["a", "b", "c"]), profiled, "kernel")


def test_graph_view_is_per_call(ncu) -> None:
    profiled = ncu["parse_raw_csv"](_csv([("graph", 320_000, 32_000, 64_000)]))
    (row,) = ncu["join_plan"](_plan(["exact rmsnorm"], calls=32), profiled, "graph")
    assert (row["gpu__time_duration.sum"], row["dram__bytes_read.sum"], row["dram__bytes_write.sum"]) == (
        10_000.0, 1000.0, 2000.0)
    assert row["view"] == "graph" and row["calls"] == 32


def test_summary_ratios_against_the_copies(ncu) -> None:
    cases = ["exact rmsnorm", "same-size copy rmsnorm", "large copy"]
    profiled = ncu["parse_raw_csv"](_csv([("norm", 9900, 1000, 500), ("copy", 9000, 1000, 500),
                                          ("big", 1000, 2000, 2000)]))
    s = ncu["summarize"](ncu["join_plan"](_plan(cases), profiled, "kernel"), "kernel")
    norm = s["exact rmsnorm"]
    assert norm["duration_vs_same_size_copy"] == pytest.approx(1.1)
    assert norm["dram_read_vs_inputs"] == 1.0 and norm["dram_write_vs_outputs"] == 0.5
    assert norm["dram_rate_pct_of_large_copy"] == pytest.approx(100 * (1500 / 9900) / (4000 / 1000))
    assert "duration_vs_same_size_copy" not in s["same-size copy rmsnorm"]
    # back to back the profiled graph's duration is not the calls' time: counters only
    g = ncu["summarize"](ncu["join_plan"](_plan(cases), profiled, "graph"), "graph")
    assert "duration_ns" not in g["exact rmsnorm"] and g["exact rmsnorm"]["dram_read_vs_inputs"] == 1.0
    md = ncu["table"]({"kernel": s, "graph": g}, {"tokens": 4096, "width": 2048, "reps": 1})
    assert "## Alone (Nsight Compute)" in md and "| exact rmsnorm | 9.90 (9.90-9.90) | 1.100 |" in md
    assert "| exact rmsnorm | - | - | 0.00 / 0.00 | 1.000 | 0.500 | - | - |" in md


def test_trace_view(ncu) -> None:
    spans = [(0.0, 9000.0), (9500.0, 18500.0), (19100.0, 28100.0)]
    rec = ncu["trace_record"](spans)
    assert rec == {"kernels": 3, "duration_ns": 9000.0, "gap_ns": 550.0, "period_ns": 9550.0}
    rows = [{"view": "trace", "case": c, "rep": 0, "calls": 32, **r} for c, r in (
        ("exact rmsnorm", {"kernels": 32, "duration_ns": 9900.0, "gap_ns": 600.0, "period_ns": 10500.0}),
        ("same-size copy rmsnorm", {"kernels": 32, "duration_ns": 9600.0, "gap_ns": 400.0,
                                    "period_ns": 10000.0}))]
    s = ncu["summarize"](rows, "trace")
    norm = s["exact rmsnorm"]
    assert norm["period_vs_same_size_copy"] == pytest.approx(1.05)
    assert norm["duration_vs_same_size_copy"] == pytest.approx(9900 / 9600)
    assert norm["gap_ns_minus_same_size_copy"] == pytest.approx(200.0)
    md = ncu["table"]({"trace": s}, {"tokens": 4096, "width": 2048, "reps": 1})
    assert "| exact rmsnorm | 10.50 (10.50-10.50) | 1.050 | 9.90 | 1.031 | 0.60 | +0.200 | 32 |" in md


def _kernels(*args: str):
    from rltbench.cli import app

    return CliRunner().invoke(app, ["kernels", "--diagnose", "ncu", *args])


def test_bad_input_exits_2(ncu, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    for args, message in ((["--views", "warp"], "--views: warp"), (["--launches", "0"], "--launches"),
                          (["--tokens", "1,8"], "--tokens: --diagnose takes one value")):
        res = _kernels("--result-dir", "x", *args)
        assert res.exit_code == 2 and message in res.output
    with pytest.raises(SystemExit) as exc:
        ncu["parse_workload_args"](["--workload", "plan.json"])   # the child needs every size
    assert exc.value.code == 2
    with pytest.raises(UsageError, match="Nsight Compute not found"):
        ncu["check_environment"]("/nonexistent/ncu")
    with pytest.raises(UsageError, match="needs a CUDA GPU"):   # the trace view needs no ncu
        ncu["check_environment"]("/nonexistent/ncu", needs_ncu=False)


def test_missing_ncu_leaves_no_run_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "run"
    res = _kernels("--result-dir", str(out), "--ncu", "/nonexistent/ncu")
    assert res.exit_code == 2 and not out.exists() and "Nsight Compute not found" in res.output
