"""scripts/kernel_tune.py's selection, no GPU: the exact norm configuration is chosen by its
geometric-mean slowdown over the decode-sized cases (a small T=1 win is not drowned by the larger
T=128 latencies, as the summed latency did), and --from-results re-selects from a run's files and
writes the tuned file with that run's provenance."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from rltbench import tuned

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kernel_tune.py"


@pytest.fixture(scope="module")
def kt() -> dict:
    return runpy.run_path(str(SCRIPT))


def _rows(times: dict[str, dict[int, float]]) -> list[dict]:
    return [{"width": 2048, "tokens": T, "op": "norm", "config": c, "median_us": us}
            for c, per in times.items() for T, us in per.items()]


# "a" wins at T=1 by 5%, "b" at T=128 by 0.1 us (1%): summed us picks b, the ratios pick a;
# torch and the harness ladder rows are never candidates; T > 128 is not a decode case
TIMES = {"lowwarp-flat-sum-w4": {1: 1.56, 8: 3.46, 128: 10.1, 4096: 99.0},
         "lowwarp-halve-w4": {1: 1.65, 8: 3.46, 128: 10.0, 4096: 1.0},
         "torch": {1: 0.5, 8: 0.5, 128: 0.5}}


def test_geomean_picks_the_t1_win_that_summed_latency_missed(kt: dict) -> None:
    slow, totals = kt["exact_slowdowns"](_rows(TIMES))
    assert set(slow) == {"lowwarp-flat-sum-w4", "lowwarp-halve-w4"}
    assert min(totals, key=totals.get) == "lowwarp-halve-w4"          # the old criterion
    assert min(slow, key=slow.get) == "lowwarp-flat-sum-w4"
    assert slow["lowwarp-flat-sum-w4"] == pytest.approx((1.0 * 1.0 * 1.01) ** (1 / 3))
    knobs = kt["best_knobs"](_rows(TIMES), [], [])["norm_fast"]
    assert knobs["config"] == "lowwarp-flat-sum-w4"
    assert (knobs["lowwarp"], knobs["lowwarp_flat"], knobs["lowwarp_tl_sum"], knobs["lowwarp_warps"]) == (
        True, True, True, 4)


def test_a_config_missing_a_case_is_not_a_candidate(kt: dict) -> None:
    rows = _rows(TIMES) + _rows({"fast-w4": {1: 0.1}})                # never timed at T=8/128
    slow, _ = kt["exact_slowdowns"](rows)
    assert "fast-w4" not in slow


def test_from_results_writes_the_runs_provenance(kt: dict, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "tune"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"provenance": {
        "gpu": "NVIDIA Test GPU", "git_sha": "abc", "date_utc": "2026-11-30", "command_line": "kt"}}))
    (run / "exact_timing.json").write_text(json.dumps(_rows(TIMES)))
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path / "tuned")
    monkeypatch.setattr(sys, "argv", ["kernel_tune.py", "--from-results", str(run), "--write-tuned"])
    tuned._load.cache_clear()
    assert kt["main"]() == 0
    data = json.loads((tmp_path / "tuned" / "NVIDIA_Test_GPU.json").read_text())
    assert data["norm_fast"]["config"] == "lowwarp-flat-sum-w4"
    src = data["sources"]["norm_fast"]
    assert (src["git_sha"], src["date"], src["result_dir"]) == ("abc", "2026-11-30", str(run))
    assert "--from-results" in src["selected_offline"]["command"]
    tuned._load.cache_clear()


def test_from_results_bad_directory_is_one_line_and_exit_2(kt: dict, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["kernel_tune.py", "--from-results", str(tmp_path / "none")])
    assert kt["main"]() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a kernel_tune.py result directory" in err[0]
