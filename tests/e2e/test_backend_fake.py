"""EngineBackend and the run schedule against a fake engine: statuses, timeouts, deadline, Ctrl-C."""

from __future__ import annotations

import time

import pytest
from e2e_fakes import FakeEngine

from rltbench.backends.base import Backend, CellResult, DeadlineReached, ReplayBackend, Request, Timeouts
from rltbench.backends.engine import EngineBackend
from rltbench.backends.openai import OpenAIBackend
from rltbench.bench.workload import Cell
from rltbench.commands.e2e.display import RunDisplay
from rltbench.commands.e2e.report import render
from rltbench.commands.e2e.runner import Plan, run_plan
from rltbench.results import RunDir


def reqs(n, out=5, arrival=0.0):
    return [Request(index=i, prompt=[i + 1, 2, 3], output_len=out, arrival=arrival * i) for i in range(n)]


def test_cell_records_tokens_and_times():
    eng = FakeEngine()
    be = EngineBackend(eng, ["torch"])
    recs = be.run_cell("torch", "c", reqs(3), Timeouts()).records
    assert [r["status"] for r in recs] == ["ok"] * 3
    for r in recs:
        assert r["token_ids"] == [eng.token([r["request"] + 1, 2, 3], i, "torch") for i in range(5)]
        assert r["send"] <= r["first"] <= r["last"] and len(r["event_times"]) == 5
    assert eng.resets == 1 and not eng.live


def test_statuses_error_timeout_length_mismatch_and_stall():
    eng = FakeEngine(reject={"0"}, silent={"1"}, short={"2": 3}, stall_after={"3": 2}, step_sleep=0.002)
    be = EngineBackend(eng, ["torch"])
    result = be.run_cell("torch", "c", reqs(5), Timeouts(first_token=0.15, stall=0.15))
    recs = {r["request"]: r for r in result.records}
    assert recs[0]["status"] == "error" and "rejected" in recs[0]["error"]
    assert recs[1]["status"] == "timeout" and "first token" in recs[1]["error"]
    assert recs[2]["status"] == "length_mismatch" and len(recs[2]["token_ids"]) == 3
    assert (
        recs[3]["status"] == "timeout" and "no token" in recs[3]["error"] and len(recs[3]["token_ids"]) == 2
    )
    assert recs[4]["status"] == "ok"
    assert not eng.live  # timed-out requests were aborted


def test_engine_step_failure_fails_inflight_requests_only():
    eng = FakeEngine(fail_step=2)
    be = EngineBackend(eng, ["torch"])
    recs = be.run_cell("torch", "c", reqs(2), Timeouts()).records
    assert all(r["status"] == "error" and "fake engine failure" in r["error"] for r in recs)
    assert be.run_cell("torch", "d", reqs(2), Timeouts()).records[0]["status"] == "ok"


def test_global_deadline_raises_with_records():
    eng = FakeEngine(step_sleep=0.01)
    be = EngineBackend(eng, ["torch"])
    with pytest.raises(DeadlineReached) as exc:
        be.run_cell(
            "torch", "c", reqs(3, out=1000, arrival=0.05), Timeouts(deadline=time.perf_counter() + 0.06)
        )
    st = [r["status"] for r in exc.value.records]
    assert len(st) == 3 and all(s == "timeout" for s in st)
    assert not eng.live
    # the cut cell's timed window still reports what it ran and its cold work (the run's cell_meta)
    assert exc.value.result.schedule is not None and exc.value.result.cold_work is not None


def test_both_backends_follow_the_backend_protocol():
    """backends.base.Backend is the contract the e2e load, the GSM8K gate and the serve soak run on;
    only the engine replays schedules."""
    engine_backend = EngineBackend(FakeEngine(), ["torch"])
    server_backend = OpenAIBackend({"A": "http://127.0.0.1:1"})
    assert isinstance(engine_backend, Backend) and isinstance(server_backend, Backend)
    assert isinstance(engine_backend, ReplayBackend) and not isinstance(server_backend, ReplayBackend)


def test_timed_cell_result_holds_schedule_cold_work_and_requests():
    be = EngineBackend(FakeEngine(), ["torch"])
    result = be.run_cell("torch", "c", reqs(3), Timeouts())
    assert isinstance(result, CellResult) and len(result.records) == 3
    assert result.schedule is not None and set(result.schedule.emitted()) == set(result.requests)
    assert sorted(r.index for r in result.requests.values()) == [0, 1, 2]
    untimed = be.run_cell("torch", "u", reqs(2), Timeouts(), timed=False)
    assert untimed.schedule is None and untimed.cold_work == {}


def test_session_arrivals_are_respected():
    eng = FakeEngine()
    be = EngineBackend(eng, ["torch"])
    recs = be.run_cell("torch", "s", reqs(3, out=2, arrival=0.05), Timeouts()).records
    sends = [r["send"] for r in recs]
    assert sends[1] - sends[0] == pytest.approx(0.05) and sends[2] - sends[0] == pytest.approx(0.10)
    assert all(r["first"] >= r["send"] for r in recs)


def _plan(arms, cells, repeats=2, exact=()):
    def prompts(cell, rep):
        return [Request(index=i, prompt=[rep + 1, i + 1, cell.C], output_len=4) for i in range(cell.C)]

    return Plan("burst", arms, "torch", repeats, cells, prompts, reqs(1, out=2), Timeouts(), set(exact))


def test_run_plan_interleaves_warms_up_and_flags_exact_mismatch(tmp_path):
    eng = FakeEngine(diverge={"exact": 2})
    arms = ["torch", "exact", "torch#2"]
    be = EngineBackend(eng, arms)
    run = RunDir.create(
        "e2e",
        result_dir=tmp_path / "run",
        config={"arm_names": arms, "reference_arm": "torch", "exact_arms": ["exact"]},
    )
    plan = _plan(arms, [Cell("C=1", 1), Cell("C=3", 3)], exact=["exact"])
    with RunDisplay(live=False) as d:
        assert run_plan(plan, be, run, d) == "complete"
    assert eng.warmed == arms
    assert len(run.read_jsonl("requests.jsonl")) == 2 * 3 * (1 + 3)
    assert len(run.read_jsonl("cell_meta.jsonl")) == 12
    run.update_manifest(status="complete")
    a = render(run.path)
    # free-running identity is information; the verdict is the replay on torch's own batches
    free = {(r["arm"], r["cell"]): r for r in a["identity"]}[("exact", "C=3")]
    assert free["first_divergence_min"] == 2 and not free["exact_mismatch"]
    rep = {(r["arm"], r["cell"]): r for r in a["replay_identity"]}
    assert eng.replays.count("exact") == 4 and eng.replays.count("torch#2") == 4  # 2 cells x 2 reps
    assert rep[("exact", "C=3")]["exact_mismatch"] and rep[("exact", "C=3")]["identical"] == 0
    fd = rep[("exact", "C=3")]["first_divergence"]
    assert fd["token_index"] == 2 and fd["step"] is not None
    assert rep[("torch#2", "C=3")]["identical"] == rep[("torch#2", "C=3")]["compared"] == 6
    assert a["summary"]["exact_arm_mismatch"] is True and a["summary"]["identity_method"] == "schedule replay"
    text = (run.path / "table.md").read_text()
    assert "EXACT ARM MISMATCH (schedule replay)" in text and "TPOT = (E2E - TTFT) / (N - 1)" in text
    assert "None: all 12 timed cells ran warm" in text
    assert all(c["cold_work"]["graph_captures"] == 0 for c in run.read_jsonl("cell_meta.jsonl"))
    assert {c["max_decode_batch"] for c in run.read_jsonl("cell_meta.jsonl") if c["C"] == 3} == {3}
    for f in ("cells.csv", "comparison.csv", "identity.csv", "summary.json", "throughput.png", "speedup.png"):
        assert (run.path / f).is_file(), f


def test_cold_work_inside_a_timed_cell_is_flagged(tmp_path):
    eng = FakeEngine()
    eng.captures_in_timed = 1  # a capture on every timed step: the cell records and the table flag it
    arms = ["torch", "torch#2"]
    be = EngineBackend(eng, arms)
    run = RunDir.create("e2e", result_dir=tmp_path / "run", config={"arm_names": arms})
    with RunDisplay(live=False) as d:
        run_plan(_plan(arms, [Cell("C=2", 2)], repeats=1), be, run, d)
    run.update_manifest(status="complete")
    a = render(run.path)
    assert len(a["summary"]["cold_cells"]) == 2
    assert all(c["cold_work"]["graph_captures"] > 0 for c in a["summary"]["cold_cells"])
    assert "did cold work" in (run.path / "table.md").read_text()


def test_ctrl_c_leaves_a_readable_run(tmp_path):
    eng = FakeEngine()
    be = EngineBackend(eng, ["torch", "torch#2"])
    calls = {"n": 0}
    orig = be.run_cell

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:  # warm-up x2, then the third measured cell
            raise KeyboardInterrupt
        return orig(*a, **k)

    be.run_cell = flaky
    run = RunDir.create("e2e", result_dir=tmp_path / "run", config={"arm_names": ["torch", "torch#2"]})
    with pytest.raises(KeyboardInterrupt), RunDisplay(live=False) as d:
        run_plan(_plan(["torch", "torch#2"], [Cell("C=2", 2)]), be, run, d)
    run.update_manifest(status="interrupted")
    a = render(run.path)
    assert len(a["cells"]) == 3 and sum(c["valid"] for c in a["cells"]) == 2
    assert RunDir.open(run.path).manifest["status"] == "interrupted"
    assert "interrupted" in (run.path / "table.md").read_text()


def test_live_identity_ignores_requests_cut_short(tmp_path):
    """The live table compares only what both arms finished: a stalled torch request is no mismatch."""
    eng = FakeEngine(stall_after={"1": 2}, stall_arms={"torch"})
    arms = ["torch", "exact"]
    be = EngineBackend(eng, arms)
    run = RunDir.create("e2e", result_dir=tmp_path / "run", config={"arm_names": arms})
    plan = _plan(arms, [Cell("C=2", 2)], exact=["exact"])
    plan.timeouts = Timeouts(first_token=5.0, stall=0.05)
    with RunDisplay(live=False) as d:
        run_plan(plan, be, run, d)
    rows = [r for r in d.rows if r["arm"] == "exact"]
    assert len(rows) == 2 and not any(r["exact_mismatch"] for r in rows)
    assert [r["identity"] for r in rows] == ["1/1", "1/1"]  # request 1 (cut short) not compared
