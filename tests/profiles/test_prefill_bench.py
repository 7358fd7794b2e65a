"""`rltbench profile --bench prefill` without a GPU: units (arm/mode) timed ABBA over repetitions with an A/A
arm, each repetition inside a ColdWork check (a capture there flags the cell), paired speedups labelled
against the A/A spread, and the table that says so."""

from __future__ import annotations

import pytest

from rltbench.commands.profile import prefill_steps

ARMS = ["torch", "exact", "torch#2"]
# eager: the same torch ops in every arm (scope graph); graph: exact's fused kernels are faster
BASE_MS = {"torch/eager": 150.0, "torch/graph": 70.0, "exact/eager": 150.0, "exact/graph": 50.0,
           "torch#2/eager": 150.0, "torch#2/graph": 70.0}


@pytest.fixture(scope="module")
def ps() -> dict:
    return vars(prefill_steps)


def _units(calls: list[str]) -> dict:
    def unit(name: str):
        def run() -> list[int]:
            calls.append(name)
            return [1, 2]

        run.unit = name  # type: ignore[attr-defined]
        return run

    return {name: unit(name) for name in BASE_MS}


class _Engine:
    """The engine counters ColdWork reads; `captures[0]` is the graph captures so far."""

    def __init__(self, captures: list[int]) -> None:
        self.captures = captures

    def cold_counters(self) -> dict[str, int]:
        return {"graph_captures": self.captures[0], "prefill_graph_captures": 0, "buffer_growths": 0}


def _fake_timer(calls: list[str]):
    """GPU ms = the unit's base, slowly drifting upward (as a warming device does) by call count."""
    def timed_call(fn, cuda):
        ids = fn()
        ms = BASE_MS[fn.unit] * (1 + 0.002 * len(calls))
        return ms, ms + 0.05, ids

    return timed_call


def test_units_interleave_abba_and_label_speedups(ps, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(ps["interleaved_samples"].__globals__, "timed_call", _fake_timer(calls))
    run = ps["interleaved_samples"]
    timed = run(_units(calls), reps=4, iters=2, cuda=False, engine=_Engine([0]))
    names = list(BASE_MS)
    assert timed["order"] == names + names[::-1] + names + names[::-1]
    assert all(len(timed["gpu_ms"][n]) == 4 and all(len(r) == 2 for r in timed["gpu_ms"][n]) for n in names)
    assert len(timed["warm"]) == 24
    assert all(w["warm"] and w["cold_work"]["graph_captures"] == 0 for w in timed["warm"])
    res = ps["summarize_units"](timed, ARMS)
    assert res["aa"] == "torch#2" and res["cold_cells"] == []
    eager = {r["arm"]: r for r in res["vs_torch"]["eager"]}
    graph = {r["arm"]: r for r in res["vs_torch"]["graph"]}
    assert eager["exact"]["label"] == "within noise"   # two identical computations: no verdict
    assert graph["exact"]["label"] == "faster"
    assert graph["exact"]["speedup"]["estimate"] == pytest.approx(1.4, 0.01)
    assert graph["torch#2"]["label"] == "A/A"
    goe = {r["arm"]: r for r in res["graph_over_eager"]}
    assert goe["exact"]["label"] == "faster"
    assert goe["exact"]["speedup"]["estimate"] == pytest.approx(3.0, 0.01)
    assert res["units"]["exact/graph"]["n"] == 8 and res["units"]["exact/graph"]["median_ms"] > 50.0


def test_a_capture_inside_a_timed_cell_is_flagged(ps, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(ps["interleaved_samples"].__globals__, "timed_call", _fake_timer(calls))
    captures = [0]
    units = _units(calls)
    slow = units["exact/graph"]

    def capturing() -> list[int]:
        if captures[0] == 0:
            captures[0] += 1  # a lazy capture inside the first timed sample
        return slow()

    capturing.unit = "exact/graph"  # type: ignore[attr-defined]
    units["exact/graph"] = capturing
    timed = ps["interleaved_samples"](units, reps=2, iters=1, cuda=False, engine=_Engine(captures))
    res = ps["summarize_units"](timed, ARMS)
    cold = [(c["unit"], c["rep"], c["cold_work"]["graph_captures"]) for c in res["cold_cells"]]
    assert cold == [("exact/graph", 0, 1)]
    length = {"rows": 4, "length": 512, "step_tokens": 2048, "bucketed": True, "result": res,
              "warm": timed["warm"], "ids_equal_torch": {a: True for a in ARMS},
              "kv_equal_torch": {a: a != "exact" for a in ARMS},
              "warmup": [{"arm": a, "pool_growth_mib": 0.0, "graph_ids_equal_eager": True} for a in ARMS]}
    summary = {"model": "m", "rows": 4, "lengths": [512, 4096], "reps": 2, "iters": 1, "aa": res["aa"],
               "per_length": [length]}
    text = ps["table"](summary)
    assert "**1 timed cells were not warm**: exact/graph rep 0" in text
    assert "| eager: arm vs torch |" in text and "| graph: arm vs torch |" in text
    assert "| torch#2 | " in text and "A/A" in text
    exact = next(line for line in text.splitlines() if line.startswith("| 2048 | 2048 | exact |"))
    assert "| False | True |" in exact  # KV identity is reported apart from the sampled ids
    assert "Not measured (the run ended first): 4096 tokens." in text


@pytest.mark.parametrize("args, message", [
    (["--bench", "nope"], "--bench: unknown value 'nope'"),
    (["--bench", "exit", "--batches", "0"], "--batches: 0 must be >= 1"),
    (["--bench", "exit", "--threshold", "1"], "--threshold"),
    (["--bench", "prefill", "--warmup", "-1"], "--warmup"),
    (["--bench", "prefill", "--lengths", "512,,2048"], "--lengths"),
    (["--bench", "prefill", "--lengths", "0"], "--lengths: 0 must be >= 1"),
    (["--lengths", "512"], "--lengths is read by --bench prefill only, not by the profile"),
    (["--bench", "decode", "--no-aa"], "--no-aa is read by --bench prefill only, not by --bench decode"),
    (["--bench", "prefill", "--attribute"], "--attribute is read by --bench decode only"),
])
def test_bad_bench_input_exits_2_before_any_work(tmp_path, monkeypatch, args, message) -> None:
    from typer.testing import CliRunner

    from rltbench.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    res = CliRunner().invoke(app, ["profile", *args, "--result-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and message in res.output
    assert not (tmp_path / "run").exists()
