"""GPU checks of the device-metadata prefill attention (run with --run-gpu on CUDA): Ouro- and
Huginn-like shapes against the torch reference, chunk invariance, a CUDA graph replayed after its
metadata was rewritten in place, and the kernel's TFLOP/s at prompt sizes (printed, not asserted)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rltbench.bench.timing import time_calls
from rltbench.engine.prefill_attention import (
    PrefillAttentionConfig,
    paged_prefill_attention_varlen,
    prefill_attention_flops,
)
from tests.engine.test_attention import make_case
from tests.engine.test_prefill_attention import PrefillCase, check_against_reference, prefill_case

pytestmark = pytest.mark.gpu

# Ouro-1.4B: 16 heads of 128, block size 16; rows with and without context, one off the block grid,
# a one-query row, a row with no queries; 300 trailing padding tokens
OURO_ROWS = [(0, 2048), (1000, 1500), (4003, 96), (0, 1), (517, 0), (77, 333)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_ouro_shapes_match_reference(dtype: torch.dtype) -> None:
    case = prefill_case(OURO_ROWS, 16, 16, 128, 16, dtype=dtype, pad_tokens=300, device="cuda", seed=1)
    check_against_reference(case, None, 2e-2)


def test_huginn_head_dim_96_and_gqa() -> None:
    case = prefill_case([(0, 700), (300, 129), (5, 0)], 8, 4, 96, 16, dtype=torch.bfloat16, pad_tokens=61,
                        device="cuda", seed=2)  # fmt: skip
    check_against_reference(case, None, 2e-2)


def test_fp32_is_ieee_accurate() -> None:
    case = prefill_case([(0, 300), (200, 77)], 4, 4, 64, 16, pad_tokens=9, device="cuda", seed=3)
    check_against_reference(case, None, 1e-4)


def test_chunked_prompt_gives_the_unchunked_bits() -> None:
    """A 3000-token prompt in one step, and its last 1800 tokens as a second chunk after 1200 cached:
    the same bits for those tokens (fixed key tiles, exact no-op for tiles past a query)."""
    whole = prefill_case([(0, 3000)], 16, 16, 128, 16, dtype=torch.bfloat16, device="cuda", seed=4)
    scale = 128**-0.5
    out_whole = paged_prefill_attention_varlen(*whole.args, scale)
    qsl = torch.tensor([0, 1800], dtype=torch.int32, device="cuda")
    ctx = torch.tensor([1200], dtype=torch.int32, device="cuda")
    tail = PrefillCase(whole.q[1200:].clone(), whole.cache, qsl, ctx, 1800)
    out_tail = paged_prefill_attention_varlen(*tail.args, scale)
    assert torch.equal(out_tail, out_whole[1200:])


def test_cuda_graph_replays_with_new_metadata() -> None:
    """Capture one call over static buffers (a 4096-token bucket, 4 row slots), rewrite q, the block
    tables and the row metadata in place (other row lengths, rows swapped, same shapes), replay: the
    eager call's bits, close to the reference."""
    n_pad, scale = 4096, 128**-0.5
    pool = make_case([4090, 3017, 0, 1], 16, 128, 16, dtype=torch.bfloat16, device="cuda", seed=5)
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(n_pad, 16, 128, generator=g, device="cuda").to(torch.bfloat16)
    bt = pool.block_tables.clone()
    qsl = torch.tensor([0, 1000, 3000, 3000, 3000], dtype=torch.int32, device="cuda")
    ctx = torch.tensor([0, 30, 0, 0], dtype=torch.int32, device="cuda")
    args = (q, pool.k_cache, pool.v_cache, bt, qsl, ctx)
    paged_prefill_attention_varlen(*args, scale)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_prefill_attention_varlen(*args, scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, paged_prefill_attention_varlen(*args, scale))
    # next step: rows 0 and 1 swapped (so the tables change), 3091 real tokens, a padding row
    q.copy_(torch.randn(n_pad, 16, 128, generator=g, device="cuda").to(torch.bfloat16))
    bt[0], bt[1] = pool.block_tables[1], pool.block_tables[0]
    qsl.copy_(torch.tensor([0, 3000, 3090, 3090, 3091], dtype=torch.int32))
    ctx.copy_(torch.tensor([17, 4000, 0, 0], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, paged_prefill_attention_varlen(*args, scale))
    lens = pool.seq_lens[[1, 0, 2, 3]]
    step = PrefillCase(q, dataclasses.replace(pool, block_tables=bt, seq_lens=lens), qsl, ctx, 3091)
    assert torch.equal(out[3091:], torch.zeros_like(out[3091:]))
    torch.testing.assert_close(out.float(), step.reference(scale).float(), atol=2e-2, rtol=2e-2)


# the default tiles first, then the alternatives worth timing on a new GPU (all compile without spills)
SWEEP = [
    None,
    PrefillAttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3),
    PrefillAttentionConfig(block_m=128, block_n=128, num_warps=8, num_stages=3),
    PrefillAttentionConfig(block_m=128, block_n=32, num_warps=8, num_stages=3),
]


@pytest.mark.parametrize("tokens", [512, 2048, 4096, 8192])
def test_prefill_attention_throughput(tokens: int) -> None:
    """One prompt of `tokens` from an empty cache, and the same tokens as a chunk after as many cached
    (the second half of a 2x prompt), Ouro-1.4B heads: median ms and causal TFLOP/s per tile config,
    printed (the figures decide the defaults of ``prefill_attention_config``, never a pass/fail)."""
    for ctx_len in (0, tokens):
        case = prefill_case([(ctx_len, tokens)], 16, 16, 128, 16, dtype=torch.bfloat16, device="cuda", seed=7)
        flops = prefill_attention_flops([0, tokens], [ctx_len], 16, 128)
        for cfg in SWEEP:
            call = lambda c=case, k=cfg: paged_prefill_attention_varlen(*c.args, 128**-0.5, config=k)  # noqa: E731
            ms = sorted(time_calls(call, 30, 5))
            med = ms[len(ms) // 2]
            print(f"prefill attention {tokens} queries after {ctx_len} cached, {cfg or 'default'}: "
                  f"{med:.3f} ms, {flops / med / 1e9:.0f} TFLOP/s")  # fmt: skip
