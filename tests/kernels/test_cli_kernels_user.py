"""`rltbench kernels` as a demanding new user runs it: rerun into the same directory, read --help,
look for why an arm did not run fused, interrupt it, re-render a damaged run."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from rltbench.bench import kernel_sweep as bench
from rltbench.commands.kernels import cli as kcli
from rltbench.commands.kernels import report
from rltbench.errors import UsageError

from .test_cli_kernels import _app, _rows


@pytest.fixture
def invoke(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    runner = CliRunner()
    return lambda *args: runner.invoke(_app(), ["kernels", *args], catch_exceptions=False)


SMALL = ("--ops", "silu_mul", "--tokens", "1", "--widths", "8", "--arms", "torch")


def test_second_run_into_the_same_result_dir_is_refused(invoke, tmp_path):
    out = tmp_path / "run"
    assert invoke(*SMALL, "--result-dir", str(out)).exit_code == 0
    before = (out / "rows.jsonl").read_text()
    res = invoke(*SMALL, "--dtypes", "fp16", "--result-dir", str(out))
    assert res.exit_code == 2 and "already holds an rltbench run" in res.output
    assert (out / "rows.jsonl").read_text() == before  # the first run's rows are not mixed with others


def test_help_names_the_op_cases_and_the_cpu_caps(invoke):
    res = invoke("--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for op in ("rmsnorm_residual", "add_rmsnorm_huginn", "rope_interleaved", "silu_mul"):
        assert op in text, op
    assert "without a GPU" in text and "GPU only" in text


def test_width_error_for_all_ops_says_how_to_get_past_it(invoke, tmp_path):
    res = invoke("--widths", "100", "--tokens", "1", "--result-dir", str(tmp_path / "r"))
    assert res.exit_code == 2 and "--ops" in res.output


class _FallbackOps:
    """An arm that always hands the op to torch, recording why (as Ops.stats does)."""

    class _Stats:
        def to_dict(self) -> dict[str, Any]:
            return {"fused": {}, "reference": {}, "fallbacks": {"silu_mul": {"layout": 1}}}

    stats = _Stats()

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(gate) * up


def test_fallback_row_says_why_and_notes_are_joined():
    cfg, _ = kcli.build_config("2", "silu_mul", "fp32", "8", "all", 3, "eager", "graph", 0, False)
    case = bench.Case("silu_mul", "fp32", 8, 2)
    real = bench.make_arm_ops
    rows, _ = bench.case_rows(case, ["torch", "exact"], torch.device("cpu"), cfg, None,
                              lambda arm, scope: _FallbackOps() if arm == "exact" else real(arm, scope))
    exact = next(r for r in rows if r["arm"] == "exact")
    assert exact["status"] == "fallback" and "silu_mul: layout" in exact["note"]
    assert "scope graph" not in exact["note"]  # no timing ran (no GPU): no note about eager timing
    assert bench._join_note("a", "b") == "a; b" and bench._join_note("", "b") == "b"


def test_interrupted_manifest_counts_finished_cases(invoke, tmp_path, monkeypatch):
    real, calls = bench.case_rows, {"n": 0}

    def interrupting(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(bench, "case_rows", interrupting)
    out = tmp_path / "int"
    res = invoke("--ops", "silu_mul", "--tokens", "1,2,3,4", "--widths", "8", "--result-dir", str(out))
    said = [ln for ln in res.output.splitlines() if "interrupted" in ln]
    assert res.exit_code == 130 and said == [
        f"interrupted: finished results were kept in {out} (2 of 4 cases finished, table.md rendered)"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["result"] == {"rows": 8, "failing_rows": 0, "cases_done": 2, "cases_planned": 4}
    rows = _rows(out)
    assert len(rows) == 8 and {r["tokens"] for r in rows} == {1, 2}  # the finished cases, whole
    assert "silu_mul" in (out / "table.md").read_text()  # rendered from what finished


def test_report_of_a_damaged_run_is_one_line(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(_app(), ["kernels", *SMALL, "--result-dir", str(out)], catch_exceptions=False)
    assert res.exit_code == 0
    (out / report.SUMMARY).write_text("{torn")
    with pytest.raises(UsageError, match="summary.json"):
        report.render(out)


@pytest.mark.parametrize("mode, modes", [("hot", ["hot"]), ("all", ["graph", "eager", "hot"]),
                                         ("BOTH", ["graph", "eager"])])
def test_mode_choices(mode: str, modes: list[str]) -> None:
    cfg, _ = kcli.build_config("1", "silu_mul", "fp32", "8", "torch", 3, mode, "all", 0, False)
    assert cfg.modes == modes


@pytest.mark.parametrize(("args", "says"), [
    (["--placements", "0"], "--placements must be an integer >= 1, got 0"),
    (["--placements", "2", "--mode", "eager"], "--placements applies to graph mode"),
])
def test_bad_placements_are_one_line_before_any_work(invoke, tmp_path, args, says):
    out = tmp_path / "r"
    res = invoke(*SMALL, *args, "--result-dir", str(out))
    assert res.exit_code == 2 and says in res.output and not out.exists()


def test_placements_default_to_one_and_reach_the_config():
    cfg, _ = kcli.build_config("1", "silu_mul", "fp32", "8", "torch", 3, "graph", "all", 0, False)
    assert cfg.placements == 1 and cfg.to_dict()["placements"] == 1
    cfg, _ = kcli.build_config("1", "silu_mul", "fp32", "8", "torch", 3, "all", "all", 0, False, placements=4)
    assert cfg.placements == 4
