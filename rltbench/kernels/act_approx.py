"""Approximate SiLU·up: one launch, fp32 (fast exp, compiler's division), one final rounding."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench.kernels.layout import col_block, row_block, row_stride, warps_for
from rltbench.kernels.rounding import dtype_code, interpret_mode, load_f32, store_f32


@triton.jit
def _silu_mul_approx_kernel(
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
):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None].to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C))[None, :]
    mask = (rows < R) & (cols < W)
    g = load_f32(g_ptr + rows * sg + cols, mask, DT, INTERPRET)
    u = load_f32(u_ptr + rows * su + cols, mask, DT, INTERPRET)
    y = g / (1.0 + tl.exp(-g)) * u
    store_f32(out_ptr + rows * W + cols, y, mask, DT, INTERPRET)


def silu_mul_approx_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """out = silu(gate) * up in fp32 with one rounding, over 2-D rows."""
    R, W = gate.shape
    if R == 0 or W == 0:
        return
    interp = interpret_mode()
    block_c = col_block(W, interp, gpu_cap=2048)
    block_r = row_block(R, block_c, interp)
    grid = (triton.cdiv(R, block_r), triton.cdiv(W, block_c))
    _silu_mul_approx_kernel[grid](
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
    )
