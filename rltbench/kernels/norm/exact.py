"""Exact RMSNorm kernels: bitwise equal to the models' torch expressions.

The mean of squares is left to torch so its summation order is torch's own: three launches per
norm (with or without a residual/sum input)::

    kernel 1  sq = v * v            (v = x, or round(x + branch) for Huginn's add form), fp32
    torch     var = sq.mean(-1, keepdim=True)     <- the reference's exact call on the same values
    kernel 2  y = round(w * round(v * rsqrt(var + eps)))   (+ round(residual + y) for the sandwich)

``x.float().pow(2)`` in torch is ``x*x`` rounded once in fp32, which is what kernel 1 writes, into
a fresh contiguous [R, W] fp32 buffer exactly like the reference's temporary, so the reduction
sees identical values in an identical layout. Every later rounding of the reference is forced in
kernel 2 (see rounding.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench.kernels import rounding as rn
from rltbench.kernels.layout import col_block, row_block, row_col_tile, row_stride, warps_for


@triton.jit
def _load_v(
    x_ptr, b_ptr, rows, cols, mask, sx, sb, HAS_B: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr
):
    """The normalised input in fp32: x, or round_dtype(x + branch) (Huginn's `x + branch`)."""
    v = rn.load_f32(x_ptr + rows * sx + cols, mask, DT, INTERPRET)
    if HAS_B:
        b = rn.load_f32(b_ptr + rows * sb + cols, mask, DT, INTERPRET)
        v = rn.round_to(rn.add_rn(v, b, INTERPRET), DT, INTERPRET)
    return v


@triton.jit
def _squares_kernel(x_ptr, b_ptr, sq_ptr, R, W, sx, sb, HAS_B: tl.constexpr, DT: tl.constexpr,
                    INTERPRET: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, cols, mask = row_col_tile(R, W, BLOCK_R, BLOCK_C)
    v = _load_v(x_ptr, b_ptr, rows, cols, mask, sx, sb, HAS_B, DT, INTERPRET)
    tl.store(sq_ptr + rows * W + cols, rn.mul_rn(v, v, INTERPRET), mask=mask)


@triton.jit
def _normalize_kernel(x_ptr, b_ptr, r_ptr, w_ptr, var_ptr, out_ptr, R, W, sx, sb, sr, eps,
                      HAS_B: tl.constexpr, HAS_R: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, cols, mask = row_col_tile(R, W, BLOCK_R, BLOCK_C)
    v = _load_v(x_ptr, b_ptr, rows, cols, mask, sx, sb, HAS_B, DT, INTERPRET)
    var = tl.load(var_ptr + rows, mask=rows < R, other=1.0)
    rstd = rn.rsqrt_torch(rn.add_rn(var, eps, INTERPRET), INTERPRET)  # rsqrt(var + eps)
    h = rn.round_to(rn.mul_rn(v, rstd, INTERPRET), DT, INTERPRET)  # (h * rstd).to(dtype)
    w = rn.load_f32(w_ptr + cols, cols < W, DT, INTERPRET)
    y = rn.round_to(rn.mul_rn(w, h, INTERPRET), DT, INTERPRET)  # w * h  (== h * w)
    if HAS_R:
        r = rn.load_f32(r_ptr + rows * sr + cols, mask, DT, INTERPRET)
        y = rn.round_to(rn.add_rn(r, y, INTERPRET), DT, INTERPRET)  # residual + y
    rn.store_f32(out_ptr + rows * W + cols, y, mask, DT, INTERPRET)


def rms_norm_exact_rows(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor,
                        branch: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> None:
    """Write RMSNorm of the 2-D rows x (or of round(x + branch)) into the contiguous 2-D `out`,
    plus `residual` when given. All inputs: same dtype, last dim contiguous (checked by Ops)."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    interp = rn.interpret_mode()
    dt = rn.dtype_code(x.dtype)
    block_c = col_block(W, interp)
    block_r = row_block(R, block_c, interp)
    grid = (triton.cdiv(R, block_r), triton.cdiv(W, block_c))
    nw = warps_for(block_r * block_c)
    sq = torch.empty((R, W), dtype=torch.float32, device=x.device)
    b = branch if branch is not None else x
    _squares_kernel[grid](x, b, sq, R, W, row_stride(x), row_stride(b), HAS_B=branch is not None, DT=dt,
                          INTERPRET=interp, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=nw)
    var = sq.mean(-1, keepdim=True)  # the reference's own reduction (order = torch's)
    r = residual if residual is not None else x
    eps32 = float(torch.tensor(eps, dtype=torch.float32))  # torch rounds the python scalar to fp32
    _normalize_kernel[grid](x, b, r, w, var, out, R, W, row_stride(x), row_stride(b), row_stride(r), eps32,
                            HAS_B=branch is not None, HAS_R=residual is not None, DT=dt, INTERPRET=interp,
                            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=nw)
