"""SiLU·up in ONE Triton launch, with exact or approx numerics (the ``EXACT`` constexpr).

Exact: ``round(round(silu(g)) * up)`` with torch's silu ``x / (1 + exp(-x))`` in fp32 opmath (CUDA:
libdevice expf, IEEE div.rn; each op rounded). Approx: fp32 throughout (fast exp, the compiler's
division), one final rounding. One numerics switch: the arms share loads, stores and tiling.

CPU caveat (interpreter path): torch CPU's vectorised SiLU uses SLEEF ``expf_u10`` (<= 1 ulp) and
``std::exp`` for loop tails, while the interpreter uses a correctly rounded exp. For bf16/fp16 the
1-ulp fp32 difference is absorbed by the rounding of silu to the dtype (no mismatch seen in 4M
random samples) but that is not a guarantee; for fp32 about 4% of silu values differ by 1 ulp
from torch CPU (Ops hands exact fp32 SiLU on CPU to torch). The GPU path targets torch CUDA and is
checked by the GPU tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels.act.config import ActExactConfig
from rltbench.kernels.layout import col_block, row_block, row_col_tile, row_stride, warps_for
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

APPROX_BLOCK = 2048   # the approx arm's column tile on the GPU


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, R, W, sg, su, EXACT: tl.constexpr, DT: tl.constexpr,
                     INTERPRET: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, cols, mask = row_col_tile(R, W, BLOCK_R, BLOCK_C)
    g = load_f32(g_ptr + rows * sg + cols, mask, DT, INTERPRET)
    u = load_f32(u_ptr + rows * su + cols, mask, DT, INTERPRET)
    if EXACT:
        e = exp_torch(-g, INTERPRET)
        s = round_to(div_rn(g, add_rn(1.0, e, INTERPRET), INTERPRET), DT, INTERPRET)  # silu(g) in dtype
        y = round_to(mul_rn(s, u, INTERPRET), DT, INTERPRET)  # * up
    else:
        y = g / (1.0 + tl.exp(-g)) * u
    store_f32(out_ptr + rows * W + cols, y, mask, DT, INTERPRET)


def silu_mul_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor, exact: bool,
                  config: ActExactConfig | None = None) -> None:
    """out = silu(gate) * up over 2-D rows (row strides free, last dim contiguous, out contiguous).
    `config` (exact arm): the column tiles; None = the tuned one in force."""
    R, W = gate.shape
    if R == 0 or W == 0:
        return
    interp = interpret_mode()
    if exact:
        cap = (config if config is not None else tuned.config(ActExactConfig)).block_for(R)
    else:
        cap = APPROX_BLOCK
    block_c = col_block(W, interp, gpu_cap=cap)
    block_r = row_block(R, block_c, interp)
    grid = (triton.cdiv(R, block_r), triton.cdiv(W, block_c))
    _silu_mul_kernel[grid](gate, up, out, R, W, row_stride(gate), row_stride(up), EXACT=exact,
                           DT=dtype_code(gate.dtype), INTERPRET=interp, BLOCK_R=block_r, BLOCK_C=block_c,
                           num_warps=warps_for(block_r * block_c))
