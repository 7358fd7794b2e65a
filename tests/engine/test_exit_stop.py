"""Ouro's compute-saving exit (`stop_at_exit`): decode steps stop their loops once every row exited.

Why these tests: stopping must change nothing but the work done. A step that stops after loop s
must leave the same tokens, exit depths and KV pool as the same step run through every loop with
the exit planes copied (`copy_exit_planes`), and what a request generates must not depend on its
batch. The pool comparison is the sharp check: without the copy the pools differ.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from rltbench.engine import SamplingParams
from rltbench.engine.paged_context import copy_exit_planes
from rltbench.errors import UsageError
from rltbench.models import build_model
from rltbench.runtime import ModelSource
from tests.engine.engine_testutil import prompts, small_engine

NEVER_STOP = "rltbench.models.ouro.OuroRun.all_exited"


def _stopping_model():
    """ouro-tiny (3 loops), seed 0, threshold 0.45: its random gates put tokens at loops 1 and 2, so
    some decode steps stop after loop 1 and others run a second loop."""
    return build_model("ouro-tiny", dtype=torch.float32, seed=0, early_exit_threshold=0.45, stop_at_exit=True)


def _generate(model, ps, batched: bool = True):  # noqa: ANN001
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    if not batched:
        return [(o.token_ids, o.exit_depths) for p in ps for o in small_engine(model).generate([p], sp)], None
    eng = small_engine(model)
    outs = eng.generate(ps, sp)
    return [(o.token_ids, o.exit_depths) for o in outs], eng


def test_copy_exit_planes_copies_the_exit_loop_into_later_planes():
    loops, layers, blocks, bs, heads, dim = 4, 3, 5, 4, 2, 3
    kv = torch.randn(loops * layers, 2, blocks, bs, heads, dim)
    before = kv.clone()
    slots, depths = torch.tensor([5, -1, 13, 7, 2]), torch.tensor([1, 0, 3, 0, 2])
    copy_exit_planes(kv, slots, depths, loops)
    want = before.clone()
    by_loop = want.view(loops, layers, 2, blocks * bs, heads, dim)
    for slot, depth in zip(slots.tolist(), depths.tolist(), strict=True):
        if slot >= 0:
            for j in range(depth + 1, loops):
                by_loop[j, :, :, slot] = by_loop[depth, :, :, slot]
    assert torch.equal(kv, want) and not torch.equal(kv, before)
    padding_only = before.clone()
    copy_exit_planes(padding_only, torch.tensor([-1, -1]), torch.tensor([0, 0]), loops)
    assert torch.equal(padding_only, before)
    with pytest.raises(ValueError, match="whole layers"):
        copy_exit_planes(kv, slots, depths, 5)


def test_stopping_equals_every_loop_with_the_exit_planes():
    model = _stopping_model()
    ps = prompts(5, [9, 14, 6, 11])
    got, eng = _generate(model, ps)
    hist = eng.stats()["decode_loops_hist"]
    assert set(hist) == {1, 2}, hist  # steps stopped after loop 1 and after loop 2, none ran all 3
    with mock.patch(NEVER_STOP, lambda self, rows=None: torch.tensor(False)):
        every, full = _generate(model, ps)
    assert full.stats()["decode_loops_hist"] == {3: sum(hist.values())}
    assert every == got
    assert torch.equal(full.kv, eng.kv)
    with mock.patch("rltbench.engine.exit_stop.copy_exit_planes", lambda *a, **k: None):
        _, stale = _generate(model, ps)
    assert not torch.equal(stale.kv, eng.kv)  # the copy is what makes the pools agree


def test_a_request_generates_the_same_alone_and_batched():
    model = _stopping_model()
    ps = prompts(5, [9, 14, 6, 11])
    batched, _ = _generate(model, ps)
    alone, _ = _generate(model, ps, batched=False)
    assert alone == batched
    assert len({d for _, ds in batched for d in ds}) > 1


def test_prefill_runs_every_loop_and_a_plain_model_is_unchanged():
    """Prompt tokens keep their own K/V in every loop: a prefill-only request's pool equals the pool of
    the same model with every loop run (the gate's mode only changes decode steps)."""
    model = _stopping_model()
    (p,) = prompts(8, [13])
    eng = small_engine(model)
    eng.generate([p], SamplingParams(max_tokens=1, ignore_eos=True))
    assert eng.stats()["decode_loops_hist"] == {}
    with mock.patch(NEVER_STOP, lambda self, rows=None: torch.tensor(False)):
        ref = small_engine(model)
        ref.generate([p], SamplingParams(max_tokens=1, ignore_eos=True))
    assert torch.equal(eng.kv, ref.kv)
    plain = small_engine(build_model("ouro-tiny", dtype=torch.float32, seed=0))
    plain.generate([p], SamplingParams(max_tokens=3, ignore_eos=True))
    assert not plain.stop_at_exit and plain.stats()["decode_loops_hist"] == {}


def test_stopping_needs_an_ouro_exit_gate():
    with pytest.raises(UsageError, match="exit threshold"):
        build_model("ouro-tiny", dtype=torch.float32, seed=0, stop_at_exit=True)
    with pytest.raises(UsageError, match="--exit-threshold"):
        ModelSource("ouro-tiny", stop_at_exit=True).config()
    with pytest.raises(UsageError, match="Ouro option"):
        ModelSource("huginn-tiny", stop_at_exit=True).config()
    assert ModelSource("ouro-tiny", exit_threshold=0.5, stop_at_exit=True).config().stop_at_exit


def test_one_engine_switches_exit_modes_without_leaking_state():
    """`set_stop_at_exit` runs both modes on one engine and pool: each mode gives what an engine built
    for it gives, whichever mode ran before, and keeps its own counters."""
    model = _stopping_model()
    ps = prompts(5, [9, 14, 6, 11])
    stop_alone, _ = _generate(model, ps)
    plain_model = build_model("ouro-tiny", dtype=torch.float32, seed=0, early_exit_threshold=0.45)
    every_alone, _ = _generate(plain_model, ps)
    assert stop_alone != every_alone  # the modes differ here, so a leak between them would show
    eng = small_engine(model)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    for stop in (True, False, True, False):
        eng.set_stop_at_exit(stop)
        got = [(o.token_ids, o.exit_depths) for o in eng.generate(ps, sp)]
        assert got == (stop_alone if stop else every_alone), stop
    assert eng.stats()["decode_loops_hist"] == {} and not eng.stop_at_exit
    eng.set_stop_at_exit(True)
    assert set(eng.stats()["decode_loops_hist"]) == {1, 2}
    with pytest.raises(UsageError, match="exit threshold"):
        small_engine(build_model("ouro-tiny", dtype=torch.float32, seed=0)).set_stop_at_exit(True)


@pytest.mark.gpu
def test_gpu_both_exit_modes_keep_their_graphs():
    """With CUDA graphs each mode captures its own decode graphs once; switching back and forth then
    replays them (no capture) and gives each mode's eager tokens."""
    from rltbench.engine import Engine, EngineConfig

    model = build_model("ouro-tiny", device="cuda", dtype=torch.bfloat16, seed=0, early_exit_threshold=0.45)
    ps = prompts(7, [5, 17, 33, 9])
    cfg = dict(block_size=16, num_blocks=256, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256)
    sp = SamplingParams(max_tokens=10, ignore_eos=True)
    want = {}
    for stop in (False, True):
        eager = Engine(model, ["torch"], EngineConfig(use_cuda_graph=False, **cfg))
        eager.set_stop_at_exit(stop)
        want[stop] = [(o.token_ids, o.exit_depths) for o in eager.generate(ps, sp)]
    eng = Engine(model, ["torch"], EngineConfig(use_cuda_graph=True, **cfg))
    for stop in (False, True):
        eng.set_stop_at_exit(stop)
        eng.runner.warmup()
    captured = eng.cold_counters()["graph_captures"]
    for stop in (True, False, True):
        eng.set_stop_at_exit(stop)
        assert [(o.token_ids, o.exit_depths) for o in eng.generate(ps, sp)] == want[stop], stop
    assert eng.cold_counters()["graph_captures"] == captured and eng.stats()["graph_replays"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_stopping_graphs_equal_eager_and_exact_equals_torch(dtype):
    """On CUDA a compute-saving decode step is one graph per loop plus a finishing graph: the graphs
    give the tokens, depths, loops run and pool of the eager steps, and the exact arm (scope all)
    those of torch."""
    from rltbench.arms import ArmSpec
    from rltbench.engine import Engine, EngineConfig

    model = build_model("ouro-tiny", device="cuda", dtype=dtype, seed=0, early_exit_threshold=0.45,
                        stop_at_exit=True)
    ps = prompts(7, [5, 17, 33, 9, 40, 12, 12, 12])
    # exact-shape prefill (SDPA attention, as the eager engine runs it): the pools compare bit for bit
    cfg = dict(block_size=16, num_blocks=256, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
               prefill_buckets=False)
    runs, pools, hists = {}, {}, {}
    for name, arms, graphs in (("eager", ["torch"], False), ("graph", ["torch"], True),
                               ("exact", {"exact": ArmSpec.exact("all")}, True)):
        eng = Engine(model, arms, EngineConfig(use_cuda_graph=graphs, **cfg))
        outs = eng.generate(ps, SamplingParams(max_tokens=10, ignore_eos=True))
        runs[name] = [(o.token_ids, o.exit_depths) for o in outs]
        pools[name], hists[name] = eng.kv.clone(), eng.stats()["decode_loops_hist"]
        if graphs:
            assert eng.stats()["graph_replays"] > 0
    assert min(hists["eager"]) < model.config.num_loops, hists
    for name in runs:
        assert runs[name] == runs["eager"] and hists[name] == hists["eager"], name
        assert torch.equal(pools[name], pools["eager"]), name
