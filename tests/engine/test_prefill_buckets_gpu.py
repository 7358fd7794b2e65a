"""Bucketed prefill graphs on CUDA (run with --run-gpu): after the warm-up every prefill step, of any
shape, replays its bucket's graph; the exact arm's tokens equal torch's bit for bit; a frozen engine
that runs a bucket eagerly gives the replay's tokens; fp32 tokens equal eager (SDPA) prefill's.

ouro-tiny at small sizes (a 256-token budget: buckets 16 ... 256), and mixed prompt lengths so that
steps have 1-16 rows, chunked rows with context and rows that do not finish."""

from __future__ import annotations

import pytest
import torch

from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.arm_state import is_bucket
from tests.engine.engine_testutil import prompts

pytestmark = pytest.mark.gpu

MIXED = [5, 1, 170, 33, 16, 9, 400, 3, 12, 77, 250, 2]


def _model(dtype: torch.dtype):
    from rltbench.models import build_model

    return build_model("ouro-tiny", device="cuda", dtype=dtype, seed=0).eval()


def _cfg(**kw) -> EngineConfig:
    base = dict(block_size=16, num_blocks=512, max_num_seqs=16, max_num_batched_tokens=256,
                max_model_len=512,
                enable_prefix_caching=False)
    return EngineConfig(**{**base, **kw})


def _run(eng: Engine, ps, n=6):
    outs = eng.generate(ps, SamplingParams(max_tokens=n, ignore_eos=True))
    assert not eng.has_unfinished() and eng.blocks.check_all_free()
    return [o.token_ids for o in outs]


def _warm(eng: Engine) -> int:
    eng.runner.warmup()
    return eng.runner.warmup_prefill_buckets()


def test_default_prefill_is_bucketed_and_serves_every_shape_after_warmup():
    eng = Engine(_model(torch.bfloat16), ["exact"], _cfg())
    assert eng.runner.prefill_buckets == [16, 32, 64, 128, 256]
    assert _warm(eng) == 5
    captures = eng.stats()["prefill_graph_captures"]
    _run(eng, prompts(0, MIXED))
    _run(eng, prompts(1, [300, 41, 7]))
    s = eng.stats()
    assert s["prefill_graph_captures"] == captures and s["prefill_graph_failures"] == 0
    assert s["prefill_eager"] == 0 and s["prefill_graph_replays"] == s["prefill_steps"] > 5
    assert all(is_bucket(k) for k in eng.runner.arm.prefill.graphs)


def test_exact_arm_equals_torch_bitwise_in_bucket_graphs():
    """Same prompts, same schedule, bf16: the fused kernels inside the bucket graphs change no bit."""
    model = _model(torch.bfloat16)
    got = {}
    for arm in ("torch", "exact"):
        eng = Engine(model, [arm], _cfg())
        _warm(eng)
        got[arm] = [_run(eng, prompts(2, MIXED)), _run(eng, prompts(3, [255, 256, 257, 1]))]
        assert eng.stats()["prefill_eager"] == 0
    assert got["exact"] == got["torch"]


def test_frozen_eager_bucket_step_equals_its_replay():
    model = _model(torch.bfloat16)
    warm = Engine(model, ["exact"], _cfg())
    _warm(warm)
    ref = _run(warm, prompts(4, MIXED))
    cold = Engine(model, ["exact"], _cfg())
    cold.runner.warmup()
    cold.freeze()
    assert _run(cold, prompts(4, MIXED)) == ref
    s = cold.stats()
    assert s["prefill_graph_captures"] == 0 and s["prefill_eager"] == s["prefill_steps"]


def test_fp32_bucketed_prefill_matches_eager_sdpa_prefill():
    """fp32: the bucket attention (device metadata, Triton) and the eager SDPA path differ only by
    rounding, which does not move a greedy token of this model."""
    model = _model(torch.float32)
    on = Engine(model, ["torch"], _cfg())
    _warm(on)
    off = Engine(model, ["torch"], _cfg(prefill_graphs=False))
    assert off.runner.prefill_buckets is None
    ps = prompts(5, MIXED)
    assert _run(on, ps) == _run(off, ps)
