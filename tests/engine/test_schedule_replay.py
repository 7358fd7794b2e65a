"""Schedule recording and replay: another arm runs exactly the reference's batches.

Identity between arms is a property of the kernels only when both ran the same batches; these
tests check that a replay reproduces a recorded run's steps (chunked prefill, prefix-cache hits,
requests arriving mid-run, an abort) and that a replay stops every request where the recording did.
"""

from __future__ import annotations

import pytest

from rltbench.engine import Engine, SamplingParams
from rltbench.engine.schedule import ABORT, DECODE, PREFILL, ReplayError, Schedule
from tests.engine.engine_testutil import prompts, record_run, small_engine


def _engine(model, **kw) -> Engine:
    return small_engine(model, **{"max_num_seqs": 3, "max_num_batched_tokens": 12, **kw})


def _record_mixed_run(eng: Engine) -> tuple[Schedule, dict, dict, dict]:
    """A run with a shared prefix, chunked prompts, late arrivals, stop ids and one abort."""
    shared = prompts(1, [8])[0]
    ps = [shared + p for p in prompts(2, [5, 9, 3, 14])]
    sent = {f"r{i}": (p, 6 + i) for i, p in enumerate(ps)}
    arrivals = {0: ["r0", "r1"], 2: ["r2"], 4: ["r3"]}

    def on_step(step: int, out: dict[str, list[int]]) -> None:
        for rid in arrivals.get(step, []):
            eng.add_request(rid, sent[rid][0], SamplingParams(max_tokens=sent[rid][1], ignore_eos=True))
        if step == 7 and "r1" in out:
            eng.abort_request("r1")

    sched, out = record_run(eng, on_step, min_steps=3)
    prompts_by_id = {rid: p for rid, (p, _) in sent.items()}
    max_tokens = {rid: m for rid, (_, m) in sent.items()}
    return sched, prompts_by_id, max_tokens, out


def test_replay_reproduces_steps_and_tokens(ouro_tiny):
    eng = _engine(ouro_tiny)
    sched, ps, mt, out = _record_mixed_run(eng)
    kinds = {st.kind for st in sched.steps}
    assert {PREFILL, DECODE, ABORT} <= kinds
    assert any(row[1] > 0 for st in sched.steps if st.kind == PREFILL for row in st.rows)  # chunk or hit
    eng.start_recording()
    replayed = eng.replay(sched, ps, mt)
    again = eng.stop_recording()
    assert again.signature() == sched.signature()
    assert replayed == out
    assert eng.blocks.check_all_free()


def test_replay_stops_where_the_recording_stopped(ouro_tiny):
    eng = _engine(ouro_tiny)
    sched, ps, mt, out = _record_mixed_run(eng)
    emitted = sched.emitted()
    assert emitted == {rid: len(toks) for rid, toks in out.items()}
    assert emitted["r1"] < mt["r1"]  # aborted early


def test_replay_forces_the_recorded_batches(ouro_tiny):
    """A replay of a schedule recorded with batch limit 3 on an engine whose own scheduler would
    batch differently still runs the recorded batches (the scheduler is bypassed)."""
    eng = _engine(ouro_tiny)
    sched, ps, mt, out = _record_mixed_run(eng)
    other = _engine(ouro_tiny, max_num_batched_tokens=64)
    other.start_recording()
    assert other.replay(sched, ps, mt) == out
    assert other.stop_recording().signature() == sched.signature()


def test_replay_refuses_a_warm_start(ouro_tiny):
    eng = _engine(ouro_tiny)
    with pytest.raises(ReplayError):
        eng.replay(Schedule(clean_start=False), {}, {})


def test_token_steps_name_the_step_of_each_token(ouro_tiny):
    eng = _engine(ouro_tiny)
    sched, ps, mt, out = _record_mixed_run(eng)
    for rid, toks in out.items():
        steps = [sched.step_of_token(rid, k) for k in range(len(toks))]
        assert all(s is not None for s in steps) and steps == sorted(steps)
        assert sched.steps[steps[0]].kind == PREFILL
