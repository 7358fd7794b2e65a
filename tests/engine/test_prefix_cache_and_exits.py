"""The prefix cache switched on and off on one engine, replay across the two settings, and the exit
depths an adaptive-exit model reports per token.

Why: the prefix cache must not change what a request generates (Huginn's position-keyed state noise
makes a cached prefix the same computation as a recomputed one), and an Ouro model with an exit gate
produces tokens *and* exit depths, both of which must survive batching, graphs and replays.
"""

from __future__ import annotations

import pytest
import torch

from rltbench.arms import ArmSpec
from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.schedule import PREFILL, Schedule
from rltbench.errors import UsageError
from rltbench.models import build_model
from tests.engine.engine_testutil import prompts, record_run, small_engine


def _record_session(eng: Engine) -> tuple[Schedule, dict, dict, dict]:
    """Two turns of a conversation: the later requests extend a prefix the earlier ones computed."""
    shared = prompts(3, [12])[0]
    tails = prompts(4, [5, 7, 3])
    ps = {"a": shared + tails[0], "b": shared + tails[0] + tails[1], "c": shared + tails[2]}
    mt = {"a": 4, "b": 5, "c": 3}
    arrivals = {0: ["a"], 5: ["b", "c"]}

    def on_step(step: int, out: dict[str, list[int]]) -> None:
        for rid in arrivals.get(step, []):
            eng.add_request(rid, ps[rid], SamplingParams(max_tokens=mt[rid], ignore_eos=True))

    sched, out = record_run(eng, on_step, min_steps=6)
    return sched, ps, mt, out


def test_cache_on_schedule_replays_with_the_cache_off(huginn_tiny):
    """A hit cannot be replayed without the cache; recomputing each hit prefix in a step of its own
    keeps every recorded step, and the tokens are those of the cache-on run."""
    eng = small_engine(huginn_tiny)
    sched, ps, mt, out = _record_session(eng)
    assert sched.prefix_caching
    hits = [r for st in sched.steps if st.kind == PREFILL for r in st.rows if r[0] != "a" and r[1] > 0]
    assert hits, "the second turn must hit the first turn's prefix"
    off = sched.recomputing_prefix_hits()
    assert not off.prefix_caching and len(off.steps) > len(sched.steps)
    assert [st for st in off.steps if st in sched.steps] == sched.steps  # recorded steps kept, in order
    assert off.emitted() == sched.emitted()
    eng.set_prefix_caching(False)
    eng.start_recording()
    replayed = eng.replay(sched, ps, mt)
    assert eng.stop_recording().signature() == off.signature()
    assert replayed == out
    assert eng.blocks.num_cached_blocks == 0
    eng.set_prefix_caching(True)
    assert eng.replay(sched, ps, mt) == out


def test_prefix_cache_toggle_refuses_random_state_noise():
    model = build_model("huginn-tiny", dtype=torch.float32, seed=0, state_noise="random")
    eng = small_engine(model, enable_prefix_caching=False)
    with pytest.raises(UsageError, match="prefix caching is unsafe"):
        eng.set_prefix_caching(True)
    assert not eng.prefix_caching and eng.stats()["prefix_caching"] is False


def test_exit_depths_reach_every_token_and_replays():
    """Threshold 0.75 splits ouro-tiny's random gates between loops 2 and 3 (seed 1): every generated
    token carries its depth, batched or alone, and a replay reports the same depths."""
    model = build_model("ouro-tiny", dtype=torch.float32, seed=1, early_exit_threshold=0.75)
    eng = small_engine(model)
    assert eng.runner.track_exit_depths
    ps = prompts(5, [9, 14, 6])
    eng.start_recording()
    outs = eng.generate(ps, SamplingParams(max_tokens=6, ignore_eos=True))
    sched = eng.stop_recording()
    depths = [d for o in outs for d in o.exit_depths]
    assert all(len(o.exit_depths) == len(o.token_ids) == 6 for o in outs)
    assert set(depths) <= {1, 2, 3} and len(set(depths)) > 1, depths
    alone = [small_engine(model).generate([p], SamplingParams(max_tokens=6, ignore_eos=True))[0] for p in ps]
    assert [o.exit_depths for o in alone] == [o.exit_depths for o in outs]
    rids = {o.request_id: (o.prompt_token_ids, 6) for o in outs}
    got = eng.replay(sched, {r: p for r, (p, _) in rids.items()}, {r: m for r, (_, m) in rids.items()})
    assert got == {o.request_id: o.token_ids for o in outs}
    assert eng.last_replay_depths == {o.request_id: o.exit_depths for o in outs}


def test_no_gate_no_depths(ouro_tiny):
    eng = small_engine(ouro_tiny)
    assert not eng.runner.track_exit_depths
    (out,) = eng.generate(prompts(6, [5]), SamplingParams(max_tokens=3, ignore_eos=True))
    assert out.exit_depths == [] and len(out.token_ids) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_exit_depths_graphs_equal_eager_and_exact_equals_torch(dtype):
    """On CUDA the exit depths come out of captured decode and prefill graphs: graph == eager, and the
    exact arm (scope all) == torch in tokens and depths, in fp32 and bf16."""
    model = build_model("ouro-tiny", device="cuda", dtype=dtype, seed=0, early_exit_threshold=0.75)
    ps = prompts(7, [5, 17, 33, 9, 40, 12, 12, 12])
    cfg = dict(block_size=16, num_blocks=256, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    runs = {}
    for name, arms, graphs in (("eager", ["torch"], False), ("graph", ["torch"], True),
                               ("exact", {"exact": ArmSpec.exact("all")}, True)):
        eng = Engine(model, arms, EngineConfig(use_cuda_graph=graphs, **cfg))
        eng.generate(ps, SamplingParams(max_tokens=4, ignore_eos=True))  # second sighting: prefill graphs
        outs = eng.generate(ps, SamplingParams(max_tokens=10, ignore_eos=True))
        runs[name] = [(o.token_ids, o.exit_depths) for o in outs]
        if graphs:
            assert eng.stats()["graph_replays"] > 0
    depths = {d for _, ds in runs["eager"] for d in ds}
    assert len(depths) > 1, depths  # the threshold spreads the random gates
    assert runs["graph"] == runs["eager"]
    assert runs["exact"] == runs["graph"]


@pytest.mark.gpu
def test_gpu_cache_on_schedule_replays_with_the_cache_off():
    model = build_model("huginn-tiny", device="cuda", dtype=torch.bfloat16, seed=0)
    eng = small_engine(model, use_cuda_graph=True)
    sched, ps, mt, out = _record_session(eng)
    eng.set_prefix_caching(False)
    assert eng.replay(sched, ps, mt) == out
