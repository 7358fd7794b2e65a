"""One Triton kernel that applies a rounding helper of kernels/rounding.py elementwise: the CPU tests
launch it interpreted (the helpers' Python path), the GPU tests compiled (their PTX path), so both
paths are checked through the same kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from rltbench.kernels.rounding import add_rn, div_rn, exp_torch, mul_rn, round_to, rsqrt_torch, sub_rn

# the OP codes of helper_kernel, in order
HELPER_OPS = ("round", "mul", "add", "sub", "div", "rsqrt", "exp", "mul_add")


@triton.jit
def helper_kernel(a_ptr, b_ptr, out_ptr, N, OP: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                  BLOCK: tl.constexpr):
    """out = HELPER_OPS[OP] of (a, b): round_to(a, DT), a * b, a + b, a - b, a / b, rsqrt(a), exp(a)
    or a * b + b, each operation through its helper (masked lanes read 1.0 and store nothing)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i, mask=i < N, other=1.0)
    b = tl.load(b_ptr + i, mask=i < N, other=1.0)
    if OP == 0:
        r = round_to(a, DT, INTERPRET)
    elif OP == 1:
        r = mul_rn(a, b, INTERPRET)
    elif OP == 2:
        r = add_rn(a, b, INTERPRET)
    elif OP == 3:
        r = sub_rn(a, b, INTERPRET)
    elif OP == 4:
        r = div_rn(a, b, INTERPRET)
    elif OP == 5:
        r = rsqrt_torch(a, INTERPRET)
    elif OP == 6:
        r = exp_torch(a, INTERPRET)
    else:
        r = add_rn(mul_rn(a, b, INTERPRET), b, INTERPRET)
    tl.store(out_ptr + i, r, mask=i < N)
