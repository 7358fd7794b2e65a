"""The device-metadata prefill attention kernel (rltbench.engine.prefill_attention) against the torch
reference (attention.paged_prefill_attention), on CPU under TRITON_INTERPRET=1 at small shapes.

The paged cache holds NaN wherever no token lives and the block tables are shuffled and padded, so
a wrong slot, a table entry past a row's last block or a key past a query's position shows up as
NaN or a mismatch. Cases cover rows with and without context (contexts off the block boundary),
chunks of 1..40 queries, rows with no queries, trailing padding tokens (output exactly 0), GQA,
a head dim that is not a power of two, two block sizes and small tiles (many query and key tiles
per row, key tiles spanning blocks) besides the default tiles.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest
import torch

from rltbench.engine.attention import paged_prefill_attention
from rltbench.engine.prefill_attention import (
    PrefillAttentionConfig,
    paged_prefill_attention_varlen,
    prefill_attention_flops,
)
from tests.engine.engine_testutil import sm90_compile_report
from tests.engine.test_attention import Case, make_case

SMALL_TILES = PrefillAttentionConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)


@dataclass
class PrefillCase:
    """One prefill step over a paged cache: q with trailing padding tokens and its row metadata."""

    q: torch.Tensor  # [N, Hq, D]; tokens past query_start_loc[-1] are padding
    cache: Case
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    num_real: int  # query_start_loc[-1]

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        """(q, k_cache, v_cache, block_tables, query_start_loc, context_lens) for the kernel."""
        c = self.cache
        return self.q, c.k_cache, c.v_cache, c.block_tables, self.query_start_loc, self.context_lens

    def reference(self, scale: float) -> torch.Tensor:
        """The torch reference over the real tokens, zeros for the padding tokens."""
        c = self.cache
        t = self.num_real
        out = torch.zeros_like(self.q)
        out[:t] = paged_prefill_attention(
            self.q[:t], c.k_cache, c.v_cache, c.block_tables, c.seq_lens, self.query_start_loc,
            self.context_lens, scale,
        )  # fmt: skip
        return out


def prefill_case(
    rows: list[tuple[int, int]],
    hq: int,
    hkv: int,
    d: int,
    bs: int,
    *,
    dtype: torch.dtype = torch.float32,
    pad_tokens: int = 0,
    device: str = "cpu",
    seed: int = 0,
) -> PrefillCase:
    """Rows given as (context, queries); each row's cache holds context + queries tokens."""
    cache = make_case([c + n for c, n in rows], hkv, d, bs, dtype=dtype, device=device, seed=seed)
    qsl = [0]
    for _, n in rows:
        qsl.append(qsl[-1] + n)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(qsl[-1] + pad_tokens, hq, d, generator=g, device=device).to(dtype)
    return PrefillCase(
        q,
        cache,
        torch.tensor(qsl, dtype=torch.int32, device=device),
        torch.tensor([c for c, _ in rows], dtype=torch.int32, device=device),
        qsl[-1],
    )


def check_against_reference(case: PrefillCase, config: PrefillAttentionConfig | None, atol: float) -> None:
    """Close to the reference, padding tokens exactly 0, finite, and the same bits on a second call."""
    scale = case.q.shape[2] ** -0.5
    out = paged_prefill_attention_varlen(*case.args, scale, config=config)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    assert torch.isfinite(out).all()
    t = case.num_real
    assert torch.equal(out[t:], torch.zeros_like(out[t:]))
    ref = case.reference(scale)
    torch.testing.assert_close(out[:t].float(), ref[:t].float(), atol=atol, rtol=atol)
    again = paged_prefill_attention_varlen(*case.args, scale, config=config)
    assert torch.equal(out, again)


# (Hq, Hkv, D, block_size, rows as (context, queries), trailing padding tokens)
SHAPES = [
    pytest.param(4, 2, 32, 4, [(0, 5), (7, 20), (3, 0), (16, 1), (0, 40), (0, 0)], 7, id="gqa-d32-bs4"),
    pytest.param(4, 2, 24, 16, [(13, 17), (0, 1), (33, 40), (5, 0)], 3, id="gqa-d24-bs16"),
    pytest.param(2, 2, 32, 16, [(0, 33), (20, 12), (1, 2)], 0, id="mha-d32-bs16-nopad"),
]
CONFIGS = [pytest.param(None, id="default-tiles"), pytest.param(SMALL_TILES, id="16x16-tiles")]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hq,hkv,d,bs,rows,pad", SHAPES)
def test_prefill_varlen_matches_reference(
    hq: int, hkv: int, d: int, bs: int, rows: list[tuple[int, int]], pad: int, dtype: torch.dtype,
    config: PrefillAttentionConfig | None,
) -> None:  # fmt: skip
    case = prefill_case(rows, hq, hkv, d, bs, dtype=dtype, pad_tokens=pad, seed=hq * d + bs)
    check_against_reference(case, config, TOLERANCE[dtype])


def test_prefill_varlen_key_tiles_wider_than_blocks_and_new_metadata() -> None:
    """32-key tiles over 4-token blocks; then the same tensors rewritten in place with other row
    lengths (what a graph replay sees) still match the reference."""
    cfg = PrefillAttentionConfig(block_m=16, block_n=32, num_warps=4, num_stages=1)
    case = prefill_case([(5, 30), (0, 3), (9, 0)], 2, 1, 16, 4, pad_tokens=5, seed=7)
    check_against_reference(case, cfg, 1e-5)
    case.query_start_loc.copy_(torch.tensor([0, 2, 4, 4], dtype=torch.int32))  # 34 padding tokens now
    case.context_lens.copy_(torch.tensor([30, 1, 0], dtype=torch.int32))  # within the rows' 35 and 3 tokens
    case.num_real = 4
    check_against_reference(case, cfg, 1e-5)


def test_prefill_varlen_is_chunk_invariant() -> None:
    """A query's result does not depend on how its prompt was chunked (the key tiles and their order
    are fixed by position; tiles past a query's position leave its state bit-for-bit unchanged)."""
    whole = prefill_case([(0, 37)], 2, 2, 32, 4, seed=3)
    scale = 32**-0.5
    out_whole = paged_prefill_attention_varlen(*whole.args, scale, config=SMALL_TILES)
    tail = PrefillCase(
        whole.q[13:].clone(), whole.cache, torch.tensor([0, 24], dtype=torch.int32),
        torch.tensor([13], dtype=torch.int32), 24,
    )  # fmt: skip
    out_tail = paged_prefill_attention_varlen(*tail.args, scale, config=SMALL_TILES)
    assert torch.equal(out_tail, out_whole[13:])


def test_prefill_varlen_empty_and_bad_input() -> None:
    case = prefill_case([(0, 3)], 2, 2, 16, 4, seed=1)
    q, kc, vc, bt, qsl, ctx = case.args
    empty_rows = paged_prefill_attention_varlen(
        q, kc, vc, bt[:0], qsl[:1], ctx[:0], 1.0
    )  # no rows: every token is padding
    assert torch.equal(empty_rows, torch.zeros_like(q))
    assert paged_prefill_attention_varlen(q[:0], kc, vc, bt, qsl, ctx, 1.0).shape == (0, 2, 16)
    bad = [
        ((q.double(), kc, vc, bt, qsl, ctx), "dtype"),
        ((q, kc, vc, bt.long(), qsl, ctx), "block_tables"),
        ((q, kc, vc, bt, qsl.long(), ctx), "query_start_loc"),
        ((q, kc, vc, bt, qsl, ctx[:0]), "context_lens"),
        ((q[:, :, :8], kc, vc, bt, qsl, ctx), "q must be"),
        ((q.transpose(1, 2).contiguous().transpose(1, 2), kc, vc, bt, qsl, ctx), "contiguous last dim"),
    ]
    for args, msg in bad:
        with pytest.raises(ValueError, match=msg):
            paged_prefill_attention_varlen(*args, 1.0)
    with pytest.raises(ValueError, match="block_m"):
        paged_prefill_attention_varlen(*case.args, 1.0, config=PrefillAttentionConfig(block_m=24))


def test_prefill_attention_flops_counts_causal_pairs() -> None:
    # row 0: 3 queries, no context: 1 + 2 + 3 = 6 pairs; row 1: 2 queries after 10 cached: 11 + 12 = 23
    assert prefill_attention_flops([0, 3, 3, 5], [0, 7, 10], heads=2, head_dim=8) == 4 * 2 * 8 * 29
    with pytest.raises(ValueError, match="query_start_loc"):
        prefill_attention_flops([0, 3], [0, 1], heads=1, head_dim=1)


COMPILE_SCRIPT = textwrap.dedent("""
    import torch
    from rltbench.engine import prefill_attention as P
    ints = ["num_rows", "num_tokens", "stride_qn", "stride_qh", "stride_kb", "stride_kt", "stride_kh",
            "stride_vb", "stride_vt", "stride_vh", "stride_on", "stride_oh", "stride_btb"]
    # pointers and strides divisible by 16, as the launcher specialises them at run time
    attrs = {(i,): [["tt.divisibility", 16]] for i in list(range(7)) + list(range(10, 21))}
    report = []
    for dt, torch_dt, d in __VARIANTS__:
        cfg = P.prefill_attention_config(getattr(torch, torch_dt), d)
        sig = {**{p: "*" + dt for p in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}, "bt_ptr": "*i32",
               "qsl_ptr": "*i32", "ctx_ptr": "*i32", "qk_scale": "fp32", **{n: "i32" for n in ints}}
        consts = {"GROUP": 1, "BLOCK_SIZE": 16, "HEAD_DIM": d, "D_PAD": triton.next_power_of_2(d),
                  "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "DOT_PRECISION": "ieee", "WIDEN": False}
        k = triton.compile(
            ASTSource(fn=P._prefill_attention_kernel, signature={**sig, **{c: "constexpr" for c in consts}},
                      constexprs=consts, attrs=attrs),
            target=target, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
        regs, spill = usage(k)
        ptx = k.asm["ptx"]
        report.append([dt, d, cfg.block_m, cfg.block_n, regs, spill, "wgmma.mma_async" in ptx,
                       ptx.count("cp.async.cg"), k.metadata.shared])
    print("COMPILE_OK", json.dumps(report))
""")
# (Triton pointer type, torch dtype, head dim): Ouro (bf16, 128), Huginn (bf16, 96), the fp32 path
COMPILE_VARIANTS = [("bf16", "bfloat16", 128), ("bf16", "bfloat16", 96), ("fp32", "float32", 64)]


def test_prefill_varlen_compiles_for_sm90() -> None:
    """The real compiler (not the interpreter) accepts the kernel at the default tiles: 16-bit tiles
    run on wgmma with cp.async-pipelined K/V gathers and no register spills."""
    report = sm90_compile_report(COMPILE_SCRIPT.replace("__VARIANTS__", repr(COMPILE_VARIANTS)))
    print("sm_90 [dtype, D, block_m, block_n, registers, local bytes, wgmma, cp.async.cg, smem]:", report)
    for dt, _, _, _, regs, local, wgmma, cp_async, _ in report:
        assert regs > 0 and local == 0, report
        assert cp_async > 0, report
        assert wgmma == (dt != "fp32"), report
