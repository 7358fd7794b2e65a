"""Bucketed prefill graphs on CPU (fake capture, the Triton attention in the interpreter): steps of
any shape replay their token-count bucket's graph and generate what eager prefill generates; the
padding never writes KV and never reaches an output.

Why these checks: a bucket graph serves steps it was not captured for, so what must hold is that
the padded step computes the real rows exactly as an unpadded step would (to fp32 rounding: the
bucket's attention is the device-metadata kernel, not SDPA) and that every later shape needs no
capture once the buckets are warm."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.arm_state import PrefillGraphSet, is_bucket
from rltbench.engine.runner import PrefillLayout, pack_prefill, prefill_buckets
from tests.engine.engine_testutil import prompts
from tests.engine.test_prefill_graphs import fake_capture


def config(**kw) -> EngineConfig:
    cfg = dict(block_size=4, max_num_batched_tokens=32, max_num_seqs=4, num_blocks=128,
               enable_prefix_caching=False)
    return EngineConfig(**{**cfg, **kw})


def bucket_engine(model, ops, **kw) -> Engine:
    eng = Engine(model, {"torch": ops}, config(**kw))
    r = eng.runner  # CPU: force the bucketed prefill-graph path on, with a fake capture
    r.use_prefill_graphs = True
    r.prefill_buckets = prefill_buckets(r.config.max_num_batched_tokens)
    r._capture_graph = fake_capture(eng)
    return eng


def eager_engine(model, ops, **kw) -> Engine:
    return Engine(model, {"torch": ops}, config(**kw))


def run(eng: Engine, ps, max_tokens=3):
    outs = eng.generate(ps, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert not eng.has_unfinished() and eng.blocks.check_all_free()
    return [o.token_ids for o in outs]


def test_bucket_list():
    assert prefill_buckets(16) == [16]
    assert prefill_buckets(2048) == [16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    b = prefill_buckets(8192)
    assert b[-1] == 8192 and b == sorted(set(b)) and 5120 in b and 4352 not in b
    assert prefill_buckets(3000)[-1] == 3072  # the last bucket holds the whole budget


def test_pack_pads_tokens_rows_and_finishing():
    """Padding tokens: id 0, position 0, slot -1; padding rows: no queries, lengths 0; padding
    finishing slots index token 0; block tables zero-filled to the layout's width."""
    lay = PrefillLayout(tokens=8, rows=3, finishing=3, width=4)
    tokens = (np.array([5, 6, 7], np.int64), np.array([2, 3, 0], np.int64), np.array([10, 11, 40], np.int64))
    tables = np.array([[2, 9], [10, 0]], np.int64)
    p = pack_prefill(tokens, [0, 2, 3], [4, 1], [2, 0], [1, 2], tables, lay)
    ids, pos, slots, qsl, seq, ctx, last, bt = np.split(p, np.cumsum(lay.splits())[:-1])
    assert ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert pos.tolist() == [2, 3, 0, 0, 0, 0, 0, 0]
    assert slots.tolist() == [10, 11, 40, -1, -1, -1, -1, -1]
    assert qsl.tolist() == [0, 2, 3, 3] and seq.tolist() == [4, 1, 0] and ctx.tolist() == [2, 0, 0]
    assert last.tolist() == [1, 2, 0]
    assert bt.reshape(3, 4).tolist() == [[2, 9, 0, 0], [10, 0, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_prefill(tokens, [0, 2, 3], [4, 1], [2, 0], [1, 2], tables, PrefillLayout(2, 3, 3, 4))


def test_warm_buckets_serve_every_shape_like_eager(ouro_tiny, ops):
    """Mixed lengths under a 32-token budget: chunked rows with context, rows that do not finish,
    steps of 1..4 rows. After `warmup_prefill_buckets` every step replays a bucket graph (no eager
    step, no capture), and the tokens equal eager prefill's."""
    batches = [prompts(4, [5, 40, 3, 9, 1, 17]), prompts(5, [12] * 6)]
    ref = [run(eager_engine(ouro_tiny, ops), ps, max_tokens=4) for ps in batches]
    eng = bucket_engine(ouro_tiny, ops)
    assert eng.runner.prefill_buckets == [16, 32]
    assert eng.runner.warmup_prefill_buckets() == 2
    assert eng.runner.warmup_prefill_buckets() == 0  # held
    captures = eng.stats()["prefill_graph_captures"]
    got = [run(eng, ps, max_tokens=4) for ps in batches]
    s = eng.stats()
    assert got == ref
    assert s["prefill_graph_captures"] == captures  # nothing captured after the warm-up
    assert s["prefill_eager"] == 0 and s["prefill_graph_replays"] >= s["prefill_steps"] > 2
    assert all(is_bucket(k) for k in eng.runner.arm.prefill.graphs)


def test_bucket_warmup_keeps_positions_inside_a_short_context(ouro_tiny, ops):
    """A context shorter than the token budget: the warm-up fills a bucket with several rows of at
    most max_model_len tokens (a single row would index positions past the model's RoPE table), and
    the buckets stop at what a step can hold (rows x context)."""
    eng = bucket_engine(ouro_tiny, ops, max_model_len=12, max_num_seqs=2)
    r = eng.runner
    r.prefill_buckets = [16, 32]  # as the constructor picks them on CUDA: min(32, 2 x 12) -> [16, 32]
    seen = []
    capture = r.capture_prefill
    r.capture_prefill = lambda step: seen.append(step) or capture(step)
    assert r.warmup_prefill_buckets() == 2
    for step in seen:  # every row inside the context and its block table (the attention's reads)
        assert step.bucketed and step.layout.width == r.max_blocks_per_seq
        assert all(b - a <= r.max_model_len for a, b in itertools.pairwise(step.qsl))
        assert all(s <= r.max_model_len for s in step.seq_lens)
    assert [s.layout.tokens for s in seen] == [32, 16] and [s.n_tok for s in seen] == [24, 16]
    assert run(eng, prompts(8, [9, 11, 5]), max_tokens=1)


def test_frozen_missing_bucket_runs_the_padded_step_eagerly(ouro_tiny, ops):
    """A frozen engine never captures: a bucket not warmed runs the same padded forward eagerly
    (counted) and gives the same tokens as the replay of a captured bucket."""
    ps = prompts(6, [7, 20, 11])
    warm = bucket_engine(ouro_tiny, ops)
    warm.runner.warmup_prefill_buckets()
    ref = run(warm, ps)
    eng = bucket_engine(ouro_tiny, ops)
    eng.runner.frozen = True
    assert run(eng, ps) == ref
    s = eng.stats()
    assert s["prefill_graph_captures"] == 0 and s["prefill_eager"] == s["prefill_steps"] > 0


def test_bucket_graphs_are_never_evicted():
    gs = PrefillGraphSet(cap=1)
    for b in (16, 32, 64):
        gs.put(("bucket", b), (None, None))
    gs.put((((0, 3),), 1, (0,)), (None, None))
    gs.put((((0, 5),), 2, (0,)), (None, None))
    assert [k for k in gs.graphs if is_bucket(k)] == [("bucket", 16), ("bucket", 32), ("bucket", 64)]
    assert len(gs.graphs) == 4  # the cap bounds the exact-shape graphs only


def test_padding_writes_no_kv(ouro_tiny, ops):
    """The padded tokens of a bucketed step carry slot -1: the pool outside the real rows' slots is
    untouched."""
    eng = bucket_engine(ouro_tiny, ops)
    before = eng.runner.kv.clone()
    run(eng, prompts(7, [3]), max_tokens=1)  # 3 tokens in the 16-token bucket: 13 padding tokens
    changed = (eng.runner.kv != before).flatten(0, 1).any(dim=(-1, -2))  # [planes*2, blocks, block_size]
    assert int(changed.any(dim=0).sum()) == 3


def test_cpu_default_is_not_bucketed(ouro_tiny, ops):
    eng = eager_engine(ouro_tiny, ops)
    assert eng.runner.prefill_buckets is None and not eng.runner.use_prefill_graphs
    assert torch.device("cpu") == eng.runner.device
