"""Decode-attention Triton kernel: every tuning knob against the torch reference, and an sm_90 compile.

The knobs (tile tokens, heads per program, warps, pipeline stages, partition policy, single launch,
fused reduce)
change only speed, never the result beyond float rounding, so each setting is checked against
``_decode_torch`` on a paged cache whose unused slots hold NaN (a wrong slot read shows up as NaN).
CPU runs the kernels under TRITON_INTERPRET=1; the compile test builds them for sm_90 with Triton's
AOT path (no GPU needed) so a kernel that only the real compiler rejects is caught here.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from rltbench.engine.attention import _decode_torch, _decode_triton, decode_config
from tests.engine.engine_testutil import sm90_compile_report
from tests.engine.test_attention import decode_oracle, make_case

KNOBS = [
    pytest.param({}, id="defaults"),
    pytest.param({"tile_tokens": 32, "heads_per_program": 1}, id="t32-h1"),
    pytest.param({"tile_tokens": 16, "heads_per_program": 4, "num_warps": 8}, id="t16-h4-w8"),
    pytest.param({"tile_tokens": 64, "heads_per_program": 2, "num_stages": 2}, id="t64-h2-s2"),
    pytest.param({"tile_tokens": 8, "partition_size": 16}, id="t8-p16"),
    pytest.param({"tile_tokens": 128, "partition_size": 4096}, id="t128-one-split"),
    pytest.param({"partition_size": 4096, "single_launch": False}, id="one-split-with-reduce"),
    pytest.param({"target_programs": 0, "heads_per_program": 8}, id="single-launch-h8"),
    pytest.param({"tile_tokens": 8, "partition_size": 16, "fused_reduce": True}, id="t8-p16-fused"),
    pytest.param({"heads_per_program": 4, "partition_size": 32, "fused_reduce": True}, id="h4-p32-fused"),
    pytest.param({"partition_size": 4096, "single_launch": False, "fused_reduce": True}, id="1split-fused"),
]

# (Hq, Hkv, D, block_size, seq_lens): tiles spanning blocks, ragged lengths, padding rows, odd D, GQA
SHAPES = [
    pytest.param(4, 4, 32, 4, [1, 4, 5, 37, 0, 13], id="mha-d32-bs4"),
    pytest.param(6, 3, 24, 8, [17, 8, 70, 0], id="gqa3-d24-bs8"),
    pytest.param(5, 5, 20, 16, [33, 0, 16, 2], id="mha5-d20-bs16"),
]


def _run(hq: int, hkv: int, d: int, bs: int, lens: list[int], dtype: torch.dtype, knobs: dict) -> None:
    case = make_case(lens, hkv, d, bs, dtype=dtype, seed=hq * d + bs)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(3)).to(dtype)
    scale = d**-0.5
    max_len = case.block_tables.shape[1] * bs
    knobs = dict(knobs)
    part = knobs.pop("partition_size", None)
    out = _decode_triton(q, *case.paged, scale, max_len, part, **knobs)
    ref = _decode_torch(q, *case.paged, scale, max_len)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), decode_oracle(q, case, scale), atol=2e-6, rtol=2e-6)
    else:
        torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)
    for r, n in enumerate(lens):
        if n == 0:
            assert torch.equal(out[r], torch.zeros_like(out[r]))
    again = _decode_triton(q, *case.paged, scale, max_len, part, **knobs)
    assert torch.equal(out, again)  # deterministic per shape


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("hq,hkv,d,bs,lens", SHAPES)
def test_decode_knobs_match_reference_fp32(
    hq: int, hkv: int, d: int, bs: int, lens: list[int], knobs: dict
) -> None:
    _run(hq, hkv, d, bs, lens, torch.float32, knobs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("knobs", KNOBS[:4])
def test_decode_knobs_match_reference_half(dtype: torch.dtype, knobs: dict) -> None:
    _run(4, 2, 48, 8, [1, 31, 0, 64, 9], dtype, knobs)


def test_decode_hint_bounds_work_and_unused_entries_are_never_read() -> None:
    """Table entries past a row's last block point far outside the pool; the hint shortens the grid."""
    lens = [0, 5, 0, 9, 40]
    case = make_case(lens, 2, 16, 4, pad_entry=10**7, seed=4, table_pad=8)
    q = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(5))
    for knobs in ({}, {"tile_tokens": 64, "heads_per_program": 4}, {"target_programs": 0}):
        out = _decode_triton(q, *case.paged, 0.25, 40, None, **knobs)
        torch.testing.assert_close(out.double(), decode_oracle(q, case, 0.25), atol=2e-6, rtol=2e-6)


def test_decode_knob_validation() -> None:
    case = make_case([3], 2, 8, 4)
    q = torch.randn(1, 2, 8)
    for bad in ({"tile_tokens": 24}, {"heads_per_program": 3}):
        with pytest.raises(ValueError):
            _decode_triton(q, *case.paged, 1.0, 12, None, **bad)
    assert decode_config(1, 16, 512).tile_tokens >= 1


SCRIPT = textwrap.dedent('''
    from rltbench.engine import attention as A
    ptrs = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "bt_ptr": "*i32", "lens_ptr": "*i32",
            "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "o_ptr": "*bf16", "cnt_ptr": "*i32"}
    ints = ["max_len", "partition", "num_splits", "stride_qb", "stride_qh", "stride_kb", "stride_kt",
            "stride_kh", "stride_vb", "stride_vt", "stride_vh", "stride_btb", "stride_ob", "stride_oh"]
    sig = {**ptrs, "qk_scale": "fp32", **{n: "i32" for n in ints}}
    ATOM = r"bar\\.sync[^@]*@%p\\d+ atom\\.global\\.gpu\\.acq_rel\\.add"
    report = []
    for tile, heads, warps, stages, single, group, fused in __VARIANTS__:
        consts = {"NUM_HEADS": 16, "GROUP": group, "BLOCK_SIZE": 16, "HEAD_DIM": 128, "D_PAD": 128,
                  "TILE": tile, "HEADS": heads, "NUM_STAGES": stages, "SINGLE": single, "FUSED": fused,
                  "SPLIT_TILE": 16}
        full = {**sig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=A._decode_partial_kernel, signature=full, constexprs=consts),
                           target=target, options={"num_warps": warps})
        regs, spill = usage(k)
        if fused:  # the release/acquire pattern: a CTA barrier, then one acq_rel atomic at gpu scope
            assert re.search(ATOM, k.asm["ptx"]), "no bar.sync before the acq_rel ticket atomic"
        report.append([tile, heads, warps, stages, single, group, fused, regs, spill])
    consts = {"HEAD_DIM": 128, "D_PAD": 128, "SPLIT_TILE": 16}
    rsig = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "o_ptr": "*bf16", "lens_ptr": "*i32",
            "max_len": "i32", "partition": "i32", "num_splits": "i32", "stride_ob": "i32", "stride_oh": "i32",
            **{c: "constexpr" for c in consts}}
    triton.compile(ASTSource(fn=A._decode_reduce_kernel, signature=rsig, constexprs=consts), target=target)
    print("COMPILE_OK", json.dumps(report))
''')

# (tile, heads, warps, stages, single, group, fused): the defaults and the corners of the benchmark sweep
VARIANTS = [
    (32, 1, 4, 1, False, 1, False), (32, 1, 4, 1, True, 1, False), (16, 1, 4, 1, False, 1, False),
    (64, 1, 4, 1, True, 1, False), (128, 1, 8, 1, True, 1, False), (32, 2, 4, 1, False, 1, False),
    (32, 4, 8, 1, True, 1, False), (16, 4, 4, 1, False, 1, False), (32, 1, 4, 2, False, 1, False),
    (64, 2, 8, 2, True, 1, False), (32, 4, 4, 1, False, 2, False),
    (64, 1, 4, 1, False, 1, True), (64, 1, 8, 1, False, 1, True), (32, 2, 4, 1, False, 1, True),
    (32, 4, 8, 1, False, 2, True),
]


def test_decode_kernels_compile_for_sm90() -> None:
    report = sm90_compile_report(SCRIPT.replace("__VARIANTS__", repr(VARIANTS)))
    print("sm_90 [tile, heads, warps, stages, single, group, fused, registers, local bytes]:", report)
    assert all(r[7] > 0 for r in report), report  # cuobjdump read every cubin
