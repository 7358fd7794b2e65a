"""Row-invariant prefill on CUDA in bf16 (run alone: pytest --run-gpu -m gpu on this file).

Why: on a GPU the kernels pick algorithms by shape (cuBLAS by M, torch's reductions by row count,
SDPA by chunk and context length), which is what makes a cached prefix differ from its recomputation.
These tests record that plain F.linear rows can change with M (information, never asserted: it is
the hardware's and library's choice) and check that under `replay.row_invariant` a prompt's K/V are
bitwise the same alone or in a bigger step, and that a session replays with the prefix cache on and
off to the same tokens, with decode CUDA graphs on.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rltbench.engine.replay import row_invariant
from rltbench.models import build_model
from tests.engine.engine_testutil import small_engine
from tests.engine.test_row_invariant import TILE, _prefill_alone_and_crowded, _session

pytestmark = pytest.mark.gpu

# A Huginn-shaped model with random weights big enough for cuBLAS to pick different GEMM kernels by M
HUGINN_LIKE = dict(hidden_size=1024, intermediate_size=2816, num_heads=8, num_kv_heads=8, head_dim=128,
                   mean_recurrence=4, vocab_size=4096, max_position_embeddings=1024)


def _model(preset: str) -> torch.nn.Module:
    over = HUGINN_LIKE if preset == "huginn-like" else {}
    return build_model("huginn-tiny", device="cuda", dtype=torch.bfloat16, seed=0, **over).eval()


def test_gpu_plain_linear_rows_may_depend_on_m(record_property):
    """Information: how many of the first rows of x @ W^T change when the same rows are computed in a
    GEMM of another M (bf16, Huginn-like widths). Recorded, not asserted."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(2816, 1024, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    full = F.linear(x, w)
    changed = {}
    for m in (1, 3, 8, 17, 64, 200):
        part = F.linear(x[:m], w)
        changed[m] = int((part != full[:m]).any(dim=1).sum())
    record_property("plain_linear_rows_changed_vs_m512", changed)
    print(f"plain F.linear: rows differing from the M=512 result, by M: {changed}")


@pytest.mark.parametrize("preset", ["huginn-tiny", "huginn-like"])
def test_gpu_prompt_kv_bitwise_alone_or_crowded_under_the_mode(preset, record_property):
    """Under the mode the prompt's K/V (all planes) and first token are the same bits alone and beside
    a companion with other chunk boundaries; without it they may differ (recorded)."""
    eng = small_engine(_model(preset), enable_prefix_caching=False, use_cuda_graph=True)
    prompt = torch.randint(3, 256, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    (kv_a, tok_a), (kv_b, tok_b) = _prefill_alone_and_crowded(eng, prompt)
    record_property("plain_prefill_kv_equal", bool(torch.equal(kv_a, kv_b)))
    with row_invariant(eng.runner, TILE):
        (kv_a, tok_a), (kv_b, tok_b) = _prefill_alone_and_crowded(eng, prompt)
    assert torch.equal(kv_a, kv_b)
    assert tok_a == tok_b


@pytest.mark.parametrize("preset", ["huginn-tiny", "huginn-like"])
def test_gpu_cache_on_off_replays_identical_under_the_mode(preset, record_property):
    """A cache-on session schedule replayed with the cache on and off (decode graphs on, eager prefill
    with the arm's kernels) gives the same tokens in identity mode; the plain replays are recorded."""
    eng = small_engine(_model(preset), use_cuda_graph=True)
    sched, ps, mt = _session(eng)
    plain_on = eng.replay(sched, ps, mt, eager_ops=eng.fused_ops)
    on = eng.replay(sched, ps, mt, eager_ops=eng.fused_ops, row_invariant_tile=TILE)
    eng.set_prefix_caching(False)
    plain_off = eng.replay(sched, ps, mt, eager_ops=eng.fused_ops)
    off = eng.replay(sched, ps, mt, eager_ops=eng.fused_ops, row_invariant_tile=TILE)
    record_property("plain_replay_identical", sum(plain_on[r] == plain_off[r] for r in plain_on))
    assert set(on) == set(ps)
    assert on == off
