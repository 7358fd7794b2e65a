"""Forced rounding points and torch-matching special functions for the exact kernels.

Why this module exists: the exact arm must round exactly where torch's eager reference rounds.
On the GPU, Triton/LLVM may keep an fp32 value live across ``.to(bf16).to(fp32)``, contract
``a*b + c`` into an FMA and lower fp32 ``/`` to an approximate division. Every helper here
therefore has two paths, chosen by the ``INTERPRET`` constexpr (set by the Python wrapper from
``TRITON_INTERPRET`` at call time):

* GPU path: inline PTX that the compiler cannot fold (``cvt.rn``, ``mul.rn``, ``add.rn``,
  ``sub.rn``, ``div.rn``; ``rsqrt.approx.f32`` = what CUDA's ``rsqrtf`` (libdevice
  ``__nv_rsqrtf``, no FTZ) emits; libdevice ``__nv_expf`` = CUDA's accurate ``expf``).
* Interpreter path (inline asm and libdevice do not run under ``TRITON_INTERPRET=1``): numpy
  fp32 arithmetic, which already rounds every operation once (no FMA contraction), plus an
  explicit round-to-nearest-even for bf16 done on the bits. Special functions follow torch's
  *CPU* formulas, because on CPU the reference is torch CPU: ``rsqrt(x) = 1 / sqrt(x)``
  (``Vectorized<float>::rsqrt`` and the scalar path both divide by a correctly rounded sqrt).

Dtype codes (constexpr ints, cheaper to specialise on than dtype objects): 0 fp32, 1 bf16, 2 fp16.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.0 (GPU box: 3.6)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older layout
    from triton.language.extra.cuda import libdevice  # type: ignore[no-redef]

DT_FP32: int = 0
DT_BF16: int = 1
DT_FP16: int = 2

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: DT_FP32,
    torch.bfloat16: DT_BF16,
    torch.float16: DT_FP16,
}


def interpret_mode() -> bool:
    """True when Triton runs kernels in the CPU interpreter (read at call time, never cached)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dtype_code(dtype: torch.dtype) -> int:
    """Constexpr code for a supported activation dtype (KeyError for others: callers check first)."""
    return DTYPE_CODES[dtype]


# ----------------------------------------------------------------------------------------------
# rounding to the activation dtype (result kept in fp32, exactly representable in the dtype)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _bf16_rne_bits(x):
    """Round fp32 -> bf16 (nearest even) on the bits, NaN kept NaN (interpreter path)."""
    u = x.to(tl.uint32, bitcast=True)
    lsb = (u >> 16) & 1
    r = (u + 0x7FFF + lsb) & 0xFFFF0000
    r = tl.where(x != x, u | 0x00400000, r)  # quiet NaN, never rounded into inf
    return r.to(tl.float32, bitcast=True)


@triton.jit
def round_to(x, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 -> nearest value of dtype DT (0 fp32, 1 bf16, 2 fp16), returned as fp32."""
    if DT == 0:
        return x
    elif DT == 1:
        if INTERPRET:
            return _bf16_rne_bits(x)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b16 t, z; cvt.rn.bf16.f32 t, $1; mov.b16 z, 0; mov.b32 $0, {z, t}; }",
                "=r,f",
                [x],
                dtype=tl.uint32,
                is_pure=True,
                pack=1,
            ).to(tl.float32, bitcast=True)
    else:
        if INTERPRET:
            return x.to(tl.float16).to(tl.float32)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b16 t; cvt.rn.f16.f32 t, $1; cvt.f32.f16 $0, t; }",
                "=f,f",
                [x],
                dtype=tl.float32,
                is_pure=True,
                pack=1,
            )


# ----------------------------------------------------------------------------------------------
# fp32 arithmetic with one rounding each (no FMA contraction, IEEE division)
# ----------------------------------------------------------------------------------------------
@triton.jit
def mul_rn(a, b, INTERPRET: tl.constexpr):
    """a * b rounded once in fp32 (never fused with a following add)."""
    if INTERPRET:
        return a * b
    else:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def add_rn(a, b, INTERPRET: tl.constexpr):
    """a + b rounded once in fp32 (never fused with a preceding multiply)."""
    if INTERPRET:
        return a + b
    else:
        return tl.inline_asm_elementwise(
            "add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def sub_rn(a, b, INTERPRET: tl.constexpr):
    """a - b rounded once in fp32."""
    if INTERPRET:
        return a - b
    else:
        return tl.inline_asm_elementwise(
            "sub.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def div_rn(a, b, INTERPRET: tl.constexpr):
    """IEEE a / b in fp32 (Triton's fp32 `/` may lower to the approximate div.full.f32)."""
    if INTERPRET:
        return a / b
    else:
        return tl.inline_asm_elementwise(
            "div.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )


# ----------------------------------------------------------------------------------------------
# special functions as torch computes them
# ----------------------------------------------------------------------------------------------
@triton.jit
def rsqrt_torch(x, INTERPRET: tl.constexpr):
    """torch.rsqrt on fp32: CUDA `rsqrtf` (rsqrt.approx.f32, no FTZ); CPU `1 / sqrt(x)`."""
    if INTERPRET:
        return 1.0 / tl.sqrt_rn(x)
    else:
        return tl.inline_asm_elementwise(
            "rsqrt.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def exp_torch(x, INTERPRET: tl.constexpr):
    """Accurate fp32 exp: CUDA libdevice `__nv_expf` (what torch's `::exp` calls); on the
    interpreter a correctly rounded exp (fp64 exp rounded to fp32). torch CPU's SiLU uses SLEEF
    `expf_u10` (<= 1 ulp), which this does not reproduce bit for bit: see act_exact.py."""
    if INTERPRET:
        return tl.exp(x.to(tl.float64)).to(tl.float32)
    else:
        return libdevice.exp(x)


# ----------------------------------------------------------------------------------------------
# loads/stores of activation-dtype tensors as fp32
# ----------------------------------------------------------------------------------------------
@triton.jit
def load_f32(ptrs, mask, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """Load a DT tensor as fp32 (masked lanes 0). The interpreter's bf16 <-> fp32 conversion loses
    subnormals, so under the interpreter bf16 is widened on the bits (exact, as on the GPU)."""
    if INTERPRET and DT == 1:
        b = tl.load(ptrs.to(tl.pointer_type(tl.uint16), bitcast=True), mask=mask, other=0)
        return (b.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


# ----------------------------------------------------------------------------------------------
# 16-bit arithmetic two elements per instruction (GPU only)
# ----------------------------------------------------------------------------------------------
@triton.jit
def packed_rn(a, b, OP: tl.constexpr, DT: tl.constexpr):
    """a OP b ("mul" or "add") of two DT tensors (1 bf16, 2 fp16) as DT, one packed instruction per
    pair (the bf16x2 forms need sm_90): the exact result rounded once to DT. That is torch's DT op:
    the fp32 product of two 16-bit values is exact; a sum torch rounds to fp32 first, then to DT,
    and fp32 has at least 2p + 2 bits of a p-bit format (p = 8 bf16, 11 fp16), so that double
    rounding gives the same value."""
    if DT == 1:
        return tl.inline_asm_elementwise(OP + ".rn.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise(OP + ".rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float16,
                                         is_pure=True, pack=2)


@triton.jit
def store_f32(ptrs, x, mask, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """Store fp32 x to a DT tensor rounding to nearest even (exact when x already holds a DT
    value). GPU: the store's cvt.rn; interpreter: bf16 rounded and narrowed on the bits (the
    interpreter's own conversion neither rounds to even nor keeps subnormals)."""
    if INTERPRET and DT == 1:
        u = _bf16_rne_bits(x).to(tl.uint32, bitcast=True)
        tl.store(ptrs.to(tl.pointer_type(tl.uint16), bitcast=True), (u >> 16).to(tl.uint16), mask=mask)
    else:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)
