"""`rltbench kernels` end to end on CPU (Triton interpreter): errors, a small run, report, exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rltbench.bench import kernel_sweep as bench
from rltbench.commands.kernels import report


def _app() -> typer.Typer:
    from rltbench.cli import app

    return app


@pytest.fixture
def invoke(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich must not wrap the one error line
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(_app(), ["kernels", *args], catch_exceptions=False)

    return run


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


def test_unwritable_result_dir_exit_2(invoke, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = invoke("--ops", "silu_mul", "--tokens", "1", "--widths", "16", "--result-dir", str(blocker / "sub"))
    assert res.exit_code == 2, res.output
    assert len(_error_lines(res.output)) == 1 and "Traceback" not in res.output


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "rows.jsonl").read_text().splitlines() if x.strip()]


def test_small_cpu_run_end_to_end_and_report(invoke, tmp_path):
    out = tmp_path / "run"
    res = invoke("--ops", "rmsnorm,silu_mul", "--tokens", "1,3", "--dtypes", "bf16,fp16", "--widths", "40",
                 "--repeats", "3", "--result-dir", str(out))
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "kernels" and manifest["status"] == "complete"
    assert manifest["config"]["ops"] == ["rmsnorm", "silu_mul"]
    rows = _rows(out)
    # ops x tokens x dtypes x arms (torch, exact, approx and the A/A arm torch#2; no native on CPU)
    assert len(rows) == 2 * 2 * 2 * 4
    assert {r["arm"] for r in rows} == {"torch", "exact", "approx", "torch#2"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["n_elements"] == r["tokens"] * 40
        assert math.isnan(r["graph_us_median"]) if isinstance(r["graph_us_median"], float) \
            else r["graph_us_median"] is None  # no made-up timings on CPU
        if r["arm"] in ("torch", "exact", "torch#2"):
            assert r["mismatches"] == 0 and r["max_ulp_vs_torch"] == 0
        if r["arm"] in ("exact", "approx") and r["fused_calls"] is not None:
            assert r["fused_calls"] >= 1  # the kernel really ran (interpreter)
    assert any(r["arm"] == "approx" and r["max_ulp_vs_oracle"] is not None for r in rows)
    table = (out / "table.md").read_text()
    assert "timings need a CUDA GPU" in table and "| rmsnorm |" in table
    assert (out / "accuracy_bf16.png").stat().st_size > 0 and (out / "cases.csv").exists()
    assert "timings need a CUDA GPU" in res.output
    # report re-renders from the raw files only
    (out / "table.md").unlink()
    (out / "accuracy_bf16.png").unlink()
    written = report.render(out)
    assert "table.md" in written and (out / "table.md").read_text() == table
    assert (out / "accuracy_bf16.png").exists()


def test_report_command_of_lead_app(tmp_path, monkeypatch):
    from rltbench.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "run"
    runner = CliRunner()
    res = runner.invoke(app, ["kernels", "--ops", "silu_mul", "--tokens", "2", "--widths", "24",
                              "--arms", "exact", "--result-dir", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (out / "table.md").unlink()
    res = runner.invoke(app, ["report", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "silu_mul" in (out / "table.md").read_text()


class _Corrupting:
    """Wraps an Ops object; every tensor it returns gets one element moved by one ULP."""

    def __init__(self, ops):
        self._ops = ops
        self.stats = getattr(ops, "stats", None)

    def __getattr__(self, name):
        import torch

        fn = getattr(self._ops, name)
        if not callable(fn):
            return fn

        def bump(t):
            t = t.clone()
            flat = t.view(-1)
            flat[0] = torch.nextafter(flat[0].float(), torch.tensor(math.inf)).to(t.dtype) \
                if t.dtype == torch.float32 else (flat[0].float() * 1.01 + 1e-3).to(t.dtype)
            return t

        def wrapped(*a, **k):
            out = fn(*a, **k)
            return tuple(bump(o) for o in out) if isinstance(out, tuple) else bump(out)

        return wrapped


def test_injected_exact_mismatch_exit_1(invoke, tmp_path, monkeypatch):
    real = bench.make_arm_ops

    def corrupt_exact(arm, scope, specs=None):
        ops = real(arm, scope, specs)
        return _Corrupting(ops) if arm == "exact" else ops

    monkeypatch.setattr(bench, "make_arm_ops", corrupt_exact)
    out = tmp_path / "bad"
    res = invoke("--ops", "silu_mul", "--tokens", "2", "--dtypes", "fp32", "--widths", "8",
                 "--result-dir", str(out))
    assert res.exit_code == 1, res.output
    rows = {r["arm"]: r for r in _rows(out)}
    assert rows["exact"]["status"] == "MISMATCH" and rows["exact"]["mismatches"] >= 1
    assert rows["exact"]["max_ulp_vs_torch"] >= 1
    assert rows["approx"]["status"] != "MISMATCH"
    assert "must be 0" in (out / "table.md").read_text()
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def test_failing_case_is_a_row_and_exit_1(invoke, tmp_path, monkeypatch):
    def broken(case, device, seed, index=0):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(bench, "make_inputs", broken)
    out = tmp_path / "err"
    res = invoke("--ops", "silu_mul", "--tokens", "1", "--widths", "8", "--result-dir", str(out))
    assert res.exit_code == 1, res.output
    rows = _rows(out)
    assert rows and all(r["status"] == "error" and "kernel exploded" in r["note"] for r in rows)
