"""Exact SiLU·up in one launch: ``round(round(silu(g)) * up)`` with torch's silu
``x / (1 + exp(-x))`` in fp32 opmath (CUDA: libdevice expf, IEEE div.rn; each op rounded).

CPU caveat (interpreter path): torch CPU's vectorised SiLU uses SLEEF ``expf_u10`` (<= 1 ulp) and
``std::exp`` for loop tails, while the interpreter uses a correctly rounded exp. For bf16/fp16 the
1-ulp fp32 difference is absorbed by the rounding of silu to the dtype (no mismatch seen in 4M
random samples) but that is not a guarantee; for fp32 about 4% of silu values differ by 1 ulp
from torch CPU. The GPU path targets torch CUDA and is checked by the gpu tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels.layout import col_block, row_block, row_stride, warps_for
from rltbench.kernels.pdl import launch_kwargs, mode_for
from rltbench.kernels.pdl import wait as pdl_wait
from rltbench.kernels.rounding import (
    add_rn,
    div_rn,
    dtype_code,
    exp_torch,
    interpret_mode,
    load_f32,
    mul_rn,
    round_to,
    store_f32,
)


@triton.jit
def _silu_mul_kernel(
    g_ptr,
    u_ptr,
    out_ptr,
    R,
    W,
    sg,
    su,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)   # gate and up come from the previous GEMM
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None].to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C))[None, :]
    mask = (rows < R) & (cols < W)
    g = load_f32(g_ptr + rows * sg + cols, mask, DT, INTERPRET)
    u = load_f32(u_ptr + rows * su + cols, mask, DT, INTERPRET)
    e = exp_torch(-g, INTERPRET)
    s = round_to(div_rn(g, add_rn(1.0, e, INTERPRET), INTERPRET), DT, INTERPRET)  # silu(g) in dtype
    y = round_to(mul_rn(s, u, INTERPRET), DT, INTERPRET)  # * up
    store_f32(out_ptr + rows * W + cols, y, mask, DT, INTERPRET)


def act_block_cap(rows: int) -> int:
    """GPU column tile: small for a few rows (more programs share the latency of the accurate exp
    and the IEEE division), larger for many rows (fewer, longer programs stream better).
    ``RLTBENCH_ACT_BLOCK`` overrides both (tuning); the device's tuned file may set each."""
    if rows <= 4:
        return int(tuned.knob("RLTBENCH_ACT_BLOCK", "act_exact", "block_few_rows", 512))
    return int(tuned.knob("RLTBENCH_ACT_BLOCK", "act_exact", "block_many_rows", 2048))


def silu_mul_exact_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """out = silu(gate) * up over 2-D rows (row strides free, last dim contiguous)."""
    R, W = gate.shape
    if R == 0 or W == 0:
        return
    interp = interpret_mode()
    block_c = col_block(W, interp, gpu_cap=act_block_cap(R))
    block_r = row_block(R, block_c, interp)
    grid = (triton.cdiv(R, block_r), triton.cdiv(W, block_c))
    _silu_mul_kernel[grid](
        gate,
        up,
        out,
        R,
        W,
        row_stride(gate),
        row_stride(up),
        DT=dtype_code(gate.dtype),
        INTERPRET=interp,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=warps_for(block_r * block_c),
        **launch_kwargs(mode_for(gate, interp)),
    )
