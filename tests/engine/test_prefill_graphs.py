"""Prefill CUDA graphs on CPU: the shape key, the capture policy (second sighting, LRU, buffer growth,
uncapturable keys) with a fake graph standing in for CUDA capture, and the host-built attention plan.

The fake graph reproduces what a CUDA graph does: the "capture" runs the step once and keeps its
output tensor; every replay reruns the same closure (same host shape, reading the static buffer) and
writes into that output in place."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine import attention as _attn
from rltbench.engine.arm_state import PrefillGraphSet
from rltbench.engine.paged_context import prefill_plan_from_host
from rltbench.engine.runner import prefill_key
from rltbench.engine.scheduler import PrefillBatch
from tests.engine.engine_testutil import prompts


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: replay() reruns the captured closure into the static output."""

    def __init__(self, fn, ops, out) -> None:
        self.fn, self.ops, self.out, self.replays = fn, ops, out, 0

    def replay(self) -> None:
        self.replays += 1
        new = self.fn(self.ops)
        if self.out is not None:
            self.out.copy_(new)


def fake_capture(eng: Engine):
    def capture(fn):
        out = fn(eng.runner.arm.ops)
        return FakeGraph(fn, eng.runner.arm.ops, out), out

    return capture


def make_engine(model, ops, graphs: bool = True, **kw) -> Engine:
    cfg = dict(
        block_size=4, max_num_batched_tokens=16, max_num_seqs=8, num_blocks=128, enable_prefix_caching=False
    )
    cfg.update(kw)
    eng = Engine(model, {"torch": ops}, EngineConfig(**cfg))
    if graphs:  # CPU: force the prefill-graph path on, with a fake capture
        eng.runner.use_prefill_graphs = True
        eng.runner._capture_graph = fake_capture(eng)
    return eng


def run(eng: Engine, ps, max_tokens=3):
    outs = eng.generate(ps, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert not eng.has_unfinished() and eng.blocks.check_all_free()
    return [o.token_ids for o in outs]


# ---- key ----------------------------------------------------------------------------------------
def test_prefill_key_from_a_chunked_batch(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops, graphs=False, enable_prefix_caching=False)
    ps = prompts(0, [10, 9])  # 19 tokens under a 16-token budget: the second prompt is chunked
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=1, ignore_eos=True))
    batch = eng.scheduler.schedule()
    assert isinstance(batch, PrefillBatch)
    step, done = eng.runner.prefill_layout(batch)
    assert step.key == (((0, 10), (0, 6)), 3, (0,))  # width: ceil(10 / 4); row 0 completes
    assert [s.request_id for s in done] == ["r0"]
    assert step.qsl == [0, 10, 16] and step.seq_lens == [10, 6] and step.ctx_lens == [0, 0]
    assert step.last_idx == [9]
    assert step.packed.size == 3 * 16 + 3 + 2 + 2 + 1 + 2 * 3
    assert prefill_key([(0, 10), (0, 6)], 3, [0]) == step.key
    hash(step.key)
    for seq, n in batch.chunks:  # advance as _prefill does, then the continuation has context
        seq.num_computed += n
    step2, _ = eng.runner.prefill_layout(eng.scheduler.schedule())
    assert step2.key == (((6, 3),), 3, (0,))


# ---- policy (PrefillGraphSet alone) ---------------------------------------------------------------
def test_graph_set_second_sighting_lru_and_bad_keys():
    gs = PrefillGraphSet(cap=2, seen_cap=3)
    a, b, c, d = (prefill_key([(0, n)], 1, [0]) for n in (1, 2, 3, 4))
    assert not gs.should_capture(a) and gs.should_capture(a)
    gs.put(a, ("ga", None))
    gs.put(b, ("gb", None))
    assert gs.get(a) == ("ga", None)  # a is now the most recently used
    gs.put(c, ("gc", None))
    assert list(gs.graphs) == [a, c] and gs.get(b) is None
    gs.bad.add(d)
    assert not gs.should_capture(d) and not gs.should_capture(d)
    # sighting counts are bounded: the oldest key is forgotten and needs two sightings again
    gs.should_capture(b)
    gs.should_capture(c)
    assert a not in gs.seen and len(gs.seen) == 3
    assert not gs.should_capture(a)
    gs.clear()
    assert not gs.graphs and gs.seen


# ---- engine policy with a fake capture ----------------------------------------------------------
def test_burst_of_equal_prompts_captures_once_then_replays(ouro_tiny, ops):
    ps = prompts(1, [8] * 8)  # two 8-token rows per 16-token step: one shape, four steps
    ref = run(make_engine(ouro_tiny, ops, graphs=False), ps)
    eng = make_engine(ouro_tiny, ops)
    assert run(eng, ps) == ref
    s = eng.stats()
    assert s["prefill_steps"] == 4
    assert s["prefill_eager"] == 1  # first sighting
    assert s["prefill_graph_captures"] == 1
    assert s["prefill_graph_replays"] == 3  # the capturing step replays too
    assert s["prefill_graphs_held"] == 1 and s["prefill_graphs"]


def test_mixed_and_chunked_shapes_match_eager(ouro_tiny, ops):
    """12-token prompts under a 16-token budget: steps (0,12)+(0,4), (4,8)+(0,8), (8,4)+(0,12) repeat, so
    shapes with context rows and without finishing rows are replayed; then odd lengths stay eager."""
    batches = [prompts(2, [12] * 8), prompts(3, [5, 12, 3, 9, 1])]
    ref_eng = make_engine(ouro_tiny, ops, graphs=False)
    ref = [run(ref_eng, ps, max_tokens=4) for ps in batches]
    eng = make_engine(ouro_tiny, ops)
    assert [run(eng, ps, max_tokens=4) for ps in batches] == ref
    s = eng.stats()
    assert s["prefill_graph_captures"] == 3 and s["prefill_graph_replays"] == 3
    assert s["prefill_eager"] + s["prefill_graph_replays"] == s["prefill_steps"]
    keys = list(eng.runner.arm.prefill.graphs)
    assert any(any(start > 0 for start, _ in k[0]) for k in keys), keys  # rows with context
    assert any(k[2] == (0,) and len(k[0]) == 2 for k in keys), keys  # a row that does not finish


def test_warmup_prefill_captures_burst_shapes_without_touching_kv(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    kv = eng.kv.clone()
    assert eng.runner.warmup_prefill(8) == 2  # 16-token budget: steps of 1 and 2 whole 8-token prompts
    assert torch.equal(eng.kv, kv)  # slots -1: the capture runs wrote nothing
    assert eng.runner.warmup_prefill(8) == 0  # already held
    ps = prompts(8, [8] * 5)  # steps of 2, 2, 1 rows
    assert run(eng, ps) == run(make_engine(ouro_tiny, ops, graphs=False), ps)
    s = eng.stats()
    assert s["prefill_eager"] == 0 and s["prefill_graph_replays"] == s["prefill_steps"] == 3
    assert s["prefill_graph_captures"] == 2
    assert make_engine(ouro_tiny, ops, graphs=False).runner.warmup_prefill(8) == 0  # CPU: graphs off


def test_static_buffer_holds_the_largest_step_so_warmed_graphs_survive(ouro_tiny, ops):
    """The static prefill buffer is sized for the largest step at construction: capturing steps of
    1..4 whole prompts never grows it (growth drops every arm's captured graphs, which once put a
    capture inside the first measured burst cell)."""
    eng = make_engine(ouro_tiny, ops, block_size=16, max_num_batched_tokens=2048, max_num_seqs=128)
    assert eng.runner.warmup_prefill(512) == 4
    s = eng.stats()
    assert s["buffer_growths"] == 0 and len(eng.runner.arm.prefill.graphs) == 4


def test_frozen_engine_never_captures(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    eng.freeze(True)
    ps = prompts(3, [8] * 4)
    run(eng, ps)
    run(eng, ps)
    s = eng.stats()
    assert s["prefill_graph_captures"] == 0 and s["prefill_eager"] == s["prefill_steps"]
    eng.freeze(False)
    run(eng, ps)
    assert eng.stats()["prefill_graph_captures"] == 1


def test_lru_cap_bounds_the_graphs_held(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops, prefill_graph_cap=1, max_num_batched_tokens=64)
    for n in (3, 5, 3, 5, 3, 5):
        run(eng, prompts(n, [n]), max_tokens=1)
    s = eng.stats()
    assert s["prefill_graphs_held"] == 1
    assert s["prefill_graph_captures"] == 4  # each shape is evicted by the other and recaptured


def test_buffer_growth_drops_prefill_graphs(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    ps = prompts(3, [8] * 4)
    run(eng, ps)
    assert len(eng.runner.arm.prefill.graphs) == 1
    old = eng.runner._pf_dev
    eng.runner._grow_prefill_buffer(old.numel() + 1)
    assert eng.runner._pf_dev.numel() >= 2 * old.numel() and not eng.runner.arm.prefill.graphs
    ref = run(make_engine(ouro_tiny, ops, graphs=False), ps)
    assert run(eng, ps) == ref
    s = eng.stats()
    assert s["prefill_graph_captures"] == 2  # the hot shape was recaptured at once (count kept)


def test_uncapturable_key_stays_eager_and_warns_once(ouro_tiny, ops, caplog):
    eng = make_engine(ouro_tiny, ops)
    calls = []

    def broken(fn):
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    eng.runner._capture_graph = broken
    ps, ps2 = prompts(4, [8] * 8), prompts(5, [4] * 8)
    ref = run(make_engine(ouro_tiny, ops, graphs=False), ps)
    ref2 = run(make_engine(ouro_tiny, ops, graphs=False), ps2)
    with caplog.at_level(logging.WARNING, logger="rltbench.engine.runner"):
        assert run(eng, ps) == ref
        assert run(eng, ps2) == ref2
    s = eng.stats()
    assert len(calls) == 2  # once per shape, never retried
    assert s["prefill_graph_failures"] == 2 and s["prefill_graph_replays"] == 0
    assert s["prefill_eager"] == s["prefill_steps"]
    assert len([r for r in caplog.records if "prefill graph capture failed" in r.message]) == 1


def test_graph_sets_are_per_arm(ouro_tiny, ops):
    eng = Engine(
        ouro_tiny, {"a": ops, "b": ops}, EngineConfig(block_size=4, max_num_batched_tokens=16, num_blocks=128)
    )
    eng.runner.use_prefill_graphs = True
    eng.runner._capture_graph = fake_capture(eng)
    ps = prompts(6, [8] * 4)
    out_a = run(eng, ps)
    eng.set_arm("b")
    assert not eng.runner.arm.prefill.graphs and eng.stats()["prefill_graph_captures"] == 0
    assert run(eng, ps) == out_a
    eng.set_arm("a")
    assert len(eng.runner.arm.prefill.graphs) == 1


def test_cpu_engine_runs_prefill_eagerly(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops, graphs=False)
    assert not eng.runner.use_prefill_graphs  # no CUDA
    run(eng, prompts(7, [8] * 4))
    s = eng.stats()
    assert s["prefill_eager"] == s["prefill_steps"] > 0 and s["prefill_graph_captures"] == 0


def test_config_validates_the_cap():
    with pytest.raises(ValueError, match="prefill_graph_cap"):
        EngineConfig(prefill_graph_cap=0).validate()


def test_random_state_huginn_is_not_replay_safe(huginn_tiny, ouro_tiny):
    from rltbench.engine.runner import prefill_replay_safe

    assert prefill_replay_safe(ouro_tiny)
    assert prefill_replay_safe(huginn_tiny)  # "position" noise: a function of the position
    old = huginn_tiny.config.state_noise
    try:
        huginn_tiny.config.state_noise = "random"
        assert not prefill_replay_safe(huginn_tiny)
    finally:
        huginn_tiny.config.state_noise = old


# ---- host-built attention plan --------------------------------------------------------------------
def _random_metadata(rng: random.Random, bs: int):
    """Rows with and without cached context (chunked prompts), some rows empty."""
    rows, qsl, seq_lens, ctx_lens = rng.randint(1, 5), [0], [], []
    for _ in range(rows):
        ctx = rng.choice([0, 0, rng.randint(1, 40)])
        n = rng.choice([0, rng.randint(1, 20)])
        qsl.append(qsl[-1] + n)
        ctx_lens.append(ctx)
        seq_lens.append(ctx + n)
    width = max(1, max(-(-s // bs) for s in seq_lens)) + rng.randint(0, 2)
    table = torch.randint(0, 100, (rows, width), dtype=torch.int32)
    return table, qsl, ctx_lens, seq_lens


@pytest.mark.parametrize("seed", range(20))
def test_prefill_plan_from_host_equals_device_plan(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    table, qsl, ctx, lens = _random_metadata(rng, bs)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    want = _attn.prefill_plan(table, i32(lens), i32(qsl), i32(ctx), bs, qsl[-1])
    got = prefill_plan_from_host(table, qsl, ctx, lens, bs, qsl[-1])
    assert len(got) == len(want) == sum(b > a for a, b in zip(qsl, qsl[1:], strict=False))
    for g, w in zip(got, want, strict=True):
        assert (g.start, g.end, g.length) == (w.start, w.end, w.length)
        assert g.blocks.dtype == w.blocks.dtype and torch.equal(g.blocks, w.blocks)
        assert g.mask.dtype == w.mask.dtype and torch.equal(g.mask, w.mask)


def test_prefill_plan_from_host_rejects_bad_metadata():
    table = torch.zeros((1, 2), dtype=torch.int32)
    with pytest.raises(ValueError):
        prefill_plan_from_host(table, [0, 5], [4], [9], 4, 5)  # 9 tokens need 3 blocks, table has 2
    with pytest.raises(ValueError):
        prefill_plan_from_host(table, [0, 5], [0], [5], 4, 6)  # qsl does not end at N
