"""`rltbench tune` without a GPU: the selection rules (geometric-mean slowdown for the exact norm, the
incumbent kept within RESELECT_MARGIN for the approx norm, per-class SiLU tiles), only current
configurations chosen, `--from-results` writing the earlier run's provenance with portable paths,
and bad input as one line with exit 2 before any run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rltbench import tuned
from rltbench.cli import main
from rltbench.commands.tune import attention, kernels, select
from rltbench.kernels.norm.config import OneLaunchConfig

ROOT = Path(__file__).resolve().parent.parent


def _rows(times: dict[str, dict[int, float]]) -> list[dict]:
    return [{"width": 2048, "tokens": T, "op": "norm", "config": c, "median_us": us}
            for c, per in times.items() for T, us in per.items()]


# "a" wins at T=1 by 5%, "b" at T=128 by 0.1 us (1%): summed us picks b, the ratios pick a;
# torch and the harness ladder rows are never candidates; T > 128 is not a decode case
TIMES = {"lowwarp-flat-sum-w4": {1: 1.56, 8: 3.46, 128: 10.1, 4096: 99.0},
         "lowwarp-flat-halve-w4": {1: 1.65, 8: 3.46, 128: 10.0, 4096: 1.0},
         "torch": {1: 0.5, 8: 0.5, 128: 0.5}, select.FLOOR: {1: 0.1}}


def test_geomean_picks_the_t1_win_that_summed_latency_missed() -> None:
    slow, totals = select.exact_slowdowns(_rows(TIMES))
    assert set(slow) == {"lowwarp-flat-sum-w4", "lowwarp-flat-halve-w4"}
    assert min(totals, key=totals.get) == "lowwarp-flat-halve-w4"          # the summed criterion
    assert slow["lowwarp-flat-sum-w4"] == pytest.approx((1.0 * 1.0 * 1.01) ** (1 / 3))
    sec = select.onelaunch_section(_rows(TIMES))
    assert (sec["config"], sec["layout"], sec["tree"], sec["warps"]) == ("lowwarp-flat-sum-w4", "lowwarp",
                                                                         "tl_sum", 4)


def test_only_current_configurations_are_chosen_and_missing_cases_disqualify() -> None:
    """A layout of an older run (here "fast-w4", faster everywhere) still sets each case's best, so
    the recorded ratios stay the run's, but cannot be chosen; one never timed at T=8 is no candidate."""
    rows = _rows(TIMES) + _rows({"fast-w4": {1: 1.0, 8: 3.0, 128: 9.0}}) + _rows({"general": {1: 0.1}})
    sec = select.onelaunch_section(rows)
    assert sec["config"] == "lowwarp-flat-sum-w4" and "fast-w4" in sec["geomean_slowdown"]
    assert sec["geomean_slowdown"]["fast-w4"] == 1.0 and "general" not in sec["geomean_slowdown"]
    assert select.onelaunch_section(_rows({"fast-w4": {1: 1.0}})) is None


def _approx_rows(pct: dict[int, dict[str, float]]) -> list[dict]:
    return [{"width": W, "config": c, "pct_copy": p, "median_us": 100 / p}
            for W, per in pct.items() for c, p in per.items()] + \
        [{"width": W, "config": select.SAME_SIZE_COPY, "pct_copy": 99.0, "median_us": 1.0} for W in pct]


def test_approx_incumbent_kept_within_the_margin_replaced_beyond_it() -> None:
    """rows2-w8 led the incumbent persist8-s3-w8 at width 5280 by 0.01 us and then ran 27 us in the
    sweep (the incumbent 24): a lead inside RESELECT_MARGIN keeps the incumbent (and says what it
    was kept over); the PDL configuration's 7% lead at 2048 replaces it."""
    pct = {2048: {"rows1-w4-stream-wafter": 80.8, "rows1-w4-stream-pdl2": 86.9},
           5280: {"persist8-s3-w8": 86.76, "rows2-w8": 86.8}}
    incumbent = {"config": "rows1-w4-stream-wafter",
                 "by_width": {"2048": {"config": "rows1-w4-stream-wafter"},
                              "5280": {"config": "persist8-s3-w8"}}}
    sec = select.approx_section(_approx_rows(pct), incumbent)
    w2048, w5280 = sec["by_width"]["2048"], sec["by_width"]["5280"]
    assert (w2048["config"], w2048["pdl"], w2048["pdl_min_rows"]) == ("rows1-w4-stream-pdl2", 2, 1024)
    assert "kept_over" not in w2048
    assert (w5280["config"], w5280["persist"]) == ("persist8-s3-w8", 8)
    assert w5280["kept_over"]["config"] == "rows2-w8"
    assert select.approx_section(_approx_rows(pct), None)["by_width"]["5280"]["config"] == "rows2-w8"
    gone = select.approx_section(_approx_rows(pct), {"config": "rows9-w1"})
    assert gone["by_width"]["5280"]["config"] == "rows2-w8"


def test_act_tiles_per_row_class_among_the_bitwise_ones() -> None:
    act = [{"tokens": 1, "config": "128", "median_us": 1.0, "mismatches": 0},
           {"tokens": 1, "config": "256", "median_us": 0.5, "mismatches": 3},
           {"tokens": 4096, "config": "512", "median_us": 9.0, "mismatches": 0},
           {"tokens": 4096, "config": "default", "median_us": 1.0, "mismatches": 0}]
    assert select.act_section(act) == {"block_few_rows": 128, "block_many_rows": 512}


def _tune_run(path: Path, files: dict[str, object], gpu: str | None = "NVIDIA Test GPU") -> Path:
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"command": "tune", "provenance": {
        "gpu": gpu, "git_sha": "abc", "date_utc": "2026-11-30",
        "command_line": f"/abs/bin/rltbench tune kernels --result-dir {ROOT}/results/x"}}))
    for name, obj in files.items():
        (path / name).write_text(json.dumps(obj))
    return path


@pytest.fixture
def tuned_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path / "tuned")
    tuned.reload()
    yield tmp_path / "tuned"
    tuned.reload()


def test_from_results_writes_the_runs_provenance_without_machine_paths(tmp_path: Path,
                                                                       tuned_dir: Path) -> None:
    run = _tune_run(tmp_path / "tune", {"exact_timing.json": _rows(TIMES)})
    assert main(["tune", "kernels", "--from-results", str(run), "--write-tuned"]) == 0
    data = json.loads((tuned_dir / "NVIDIA_Test_GPU.json").read_text())
    assert data["norm_onelaunch"]["config"] == "lowwarp-flat-sum-w4"
    src = data["sources"]["norm_onelaunch"]
    assert (src["git_sha"], src["date"], src["result_dir"]) == ("abc", "2026-11-30", "tune")
    assert src["command"] == "rltbench tune kernels --result-dir results/x"   # paths made portable
    assert src["selected_offline"]["command"].startswith("rltbench tune")


def test_from_results_attention_table(tmp_path: Path, tuned_dir: Path) -> None:
    best = {"name": "p64t64h1w4", "tile_tokens": 64, "heads_per_program": 1, "num_warps": 4, "num_stages": 1,
            "target_programs": 528, "single_launch": True, "partition_size": 64, "median_us": 8.0,
            "kv_gbps": 500.0}
    sweep = {"variants": {"p64t64h1w4": {"partition_size": 64}},
             "cases": [{"batch": 1, "context_len": 512, "best": best}]}
    run = _tune_run(tmp_path / "att", {"sweep.json": sweep})
    assert main(["tune", "attention", "--from-results", str(run), "--write-tuned"]) == 0
    rows = json.loads((tuned_dir / "NVIDIA_Test_GPU.json").read_text())["decode_attention"]
    assert [(r["max_batch"], r["partition_size"], r["tile_tokens"]) for r in rows] == [(1 << 30, 64, 64)]


@pytest.mark.parametrize("args, message", [
    (["tune", "layers"], "unknown tune target"),
    (["tune", "kernels", "--from-results", "/nonexistent/run"], "not a run directory"),
    (["tune", "kernels", "--variants", "v1"], "only for `rltbench tune attention`"),
    (["tune", "attention", "--variants", "nope"], "--variants: unknown"),
    (["tune", "kernels", "--parts", "exact,gemm"], "--parts"),
    (["tune", "kernels", "--widths", "2048,x"], "--widths"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    if "--from-results" not in args and args[1] == "kernels" and "--variants" not in args:
        args = [*args, "--from-results", str(_tune_run(tmp_path / "r", {}))]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_measuring_needs_a_gpu_and_creates_no_run_directory(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never"
    assert main(["tune", "kernels", "--result-dir", str(out)]) == 2
    assert "CUDA GPU" in capsys.readouterr().err and not out.exists()


def test_shipped_run_reselects_to_the_shipped_sections() -> None:
    """results/gpu/tune and tune-approx, chosen again under the current rules, give the sections the
    shipped H200 file holds (where those runs are still in the tree)."""
    tune, approx = ROOT / "results" / "gpu" / "tune", ROOT / "results" / "gpu" / "tune-approx"
    if not (tune / "exact_timing.json").is_file() or not (approx / "approx_timing.json").is_file():
        pytest.skip("the tuning runs are not in this tree")
    shipped = json.loads((tuned.TUNED_DIR / "NVIDIA_H200.json").read_text())
    exact = json.loads((tune / "exact_timing.json").read_text())
    act = json.loads((tune / "act_timing.json").read_text())
    manifest = json.loads((approx / "manifest.json").read_text())
    incumbent = manifest["provenance"]["tuned"]["sections"]["norm_approx"]
    rows = json.loads((approx / "approx_timing.json").read_text())["rows"]
    got = select.best_sections(exact, rows, act, incumbent)
    assert got["norm_onelaunch"] == shipped["norm_onelaunch"]
    assert got["act_exact"] == shipped["act_exact"]
    for key in ("config", "mean_pct_copy"):
        assert got["norm_approx"][key] == shipped["norm_approx"][key]
    for w, entry in shipped["norm_approx"]["by_width"].items():
        assert got["norm_approx"]["by_width"][w]["config"] == entry["config"]


def test_exact_checks_run_the_validation_cases_per_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bitwise check before timing, on CPU through the interpreter (torch CPU sums in another
    order, so only the plumbing is checked here: every configuration, width and element counted)."""
    two = {c.name: c for c in (OneLaunchConfig(layout="general"), OneLaunchConfig(tree="halvings"))}
    monkeypatch.setattr(OneLaunchConfig, "search_space", classmethod(lambda cls: two))
    out = kernels.check_exact(torch.device("cpu"), [132], [1], log=lambda line: None)
    assert set(out) == set(two) and all(out[n][132]["elements"] > 0 for n in two)


def test_table_lists_every_row() -> None:
    exact = [{"width": 2048, "tokens": 1, "op": "norm", "config": "general", "median_us": 2.9, "p10_us": 2.8,
              "p90_us": 3.0, "path": "general"}]
    approx = [{"width": 2048, "form": "ouro", "config": "rows1-w4", "median_us": 10.0, "p10_us": 9.9,
               "p90_us": 10.1, "gbps": 3000.0, "pct_copy": 80.0, "pct_same_size_copy": 90.0}]
    act = [{"tokens": 1, "config": "128", "median_us": 1.0, "p10_us": 1.0, "p90_us": 1.1, "pct_copy": 1.0,
            "mismatches": 0}]
    text = kernels.table(exact, approx, act, {"gbps": 4000.0})
    assert "| 2048 | 1 | norm | general | 2.90 |" in text and "| rows1-w4 |" in text and "| 1 | 128 |" in text


def test_attention_rows_serve_from_their_measured_batch_up() -> None:
    """A row serves batches from its case's batch to the next case's: a one-split variant measured
    at batch 32 never runs at batch 16 with half its programs."""
    def case(batch: int, ctx: int, name: str) -> dict:
        best = {"name": name, "tile_tokens": 64, "heads_per_program": 1, "num_warps": 2, "num_stages": 2,
                "target_programs": 0, "single_launch": True, "partition_size": ctx, "median_us": 1.0,
                "kv_gbps": 1.0}
        return {"batch": batch, "context_len": ctx, "best": best}
    res = {"variants": {}, "cases": [case(b, 512, f"b{b}") for b in (32, 1, 128, 8)]
           + [case(b, 4096, f"long{b}") for b in (1, 32)]}
    rows = attention.tuned_rows(res)
    assert [(r["measured"]["variant"], r["max_batch"], r["max_len"]) for r in rows] == [
        ("b1", 7, 2048), ("b8", 31, 2048), ("b32", 127, 2048), ("b128", 1 << 30, 2048),
        ("long1", 31, 1 << 30), ("long32", 1 << 30, 1 << 30)]


def test_shipped_attention_run_reselects_to_the_shipped_table() -> None:
    sweep = ROOT / "results" / "gpu" / "attention" / "sweep.json"
    if not sweep.is_file():
        pytest.skip("the attention sweep is not in this tree")
    shipped = json.loads((tuned.TUNED_DIR / "NVIDIA_H200.json").read_text())["decode_attention"]
    assert attention.tuned_rows(json.loads(sweep.read_text())) == shipped
