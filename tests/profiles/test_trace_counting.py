"""Counting on a recorded (synthetic) chrome trace: replays, outside-graph work, verdicts."""

from __future__ import annotations

import json
from pathlib import Path

from rltbench.commands.profile import counting
from rltbench.commands.profile.collect import PHASE_REPLAYS, PHASE_STEPS, summarize_trace
from rltbench.commands.profile.graph_nodes import GraphCensus
from rltbench.commands.profile.trace import group_by_launch, one_replay_trace, parse_trace, split_phase

FIX = Path(__file__).parent / "fixtures"
STEP = len(json.loads((FIX / "step_kernels.json").read_text())["step"])


def test_replay_counts_per_replay() -> None:
    parsed = parse_trace(FIX / "decode_trace.json")
    rc = counting.replay_counts(parsed, PHASE_REPLAYS)
    assert rc.replays == 3
    assert rc.kernels_per_replay == STEP
    assert rc.memset_per_replay == 1 and rc.memcpy_per_replay == 0
    assert rc.consistent and rc.per_replay_kernels == [STEP] * 3


def test_outside_graph_work_per_step() -> None:
    parsed = parse_trace(FIX / "decode_trace.json")
    oc = counting.outside_counts(parsed, PHASE_STEPS, steps=2)
    assert oc.kernels_per_step == 0 and oc.copies_per_step == 2
    assert set(oc.names) == {"Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)"}
    assert split_phase(parsed, PHASE_STEPS).graph_launches == 2
    # the unannotated eager kernel belongs to no phase
    assert split_phase(parsed, "no-such-phase").in_graph == []


def test_agreement_verdicts() -> None:
    parsed = parse_trace(FIX / "decode_trace.json")
    rc = counting.replay_counts(parsed, PHASE_REPLAYS)
    assert counting.agreement(STEP, rc)[0] is True
    ok, why = counting.agreement(STEP - 1, rc)
    assert ok is False and "+1" in why
    assert counting.agreement(None, rc)[0] is None
    dropped = counting.ReplayCounts(3, (2 * STEP + 5) / 3, 0, 0, [STEP, STEP, 5])
    ok, why = counting.agreement(STEP, dropped)
    assert ok is False and "dropped" in why
    assert counting.agreement(STEP, counting.ReplayCounts(2, 0, 0, 0, [0, 0]))[0] is False


def test_breakdown_and_floor() -> None:
    parsed = parse_trace(FIX / "decode_trace.json")
    groups = group_by_launch(parsed, split_phase(parsed, PHASE_REPLAYS).in_graph)
    assert len(groups) == 3
    rows, top = counting.breakdown([[e for e in g if e.kind == "kernel"] for g in groups])
    by = {r.cls: r for r in rows}
    assert by["norm"].count == 32 and by["gemm"].count == 5 and by["attention"].count == 2
    assert by["gemm"].time_us == 4 * 10.0 + 2.0  # 3 nvjet + 1 gemv at 10 us, the split-K reduce at 2 us
    assert counting.floor_time_us(rows) == by["gemm"].time_us + by["attention"].time_us
    assert abs(sum(r["share"] for r in top) - 1.0) < 1e-9


def test_summarize_trace_and_one_replay_trace() -> None:
    trace = json.loads((FIX / "decode_trace.json").read_text())
    census = GraphCensus(kernels=STEP, memcpy=0, memset=1)
    res, small = summarize_trace(trace, census, "fake", steps=2)
    assert res["agree"] is True
    assert res["kernels_per_step"] == STEP + 2  # graph kernels + H2D + D2H per engine step
    assert res["graph_copies_per_step"] == 1
    kept = [e for e in small["traceEvents"] if e.get("ph") == "X"]
    assert len(kept) == STEP + 2  # launch call + memset + kernels of ONE replay
    corr = {e["args"]["correlation"] for e in kept}
    assert len(corr) == 1
    assert one_replay_trace(trace, -5)["traceEvents"] == [e for e in trace["traceEvents"] if e["ph"] == "M"]
