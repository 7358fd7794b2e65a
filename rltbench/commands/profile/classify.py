"""Kernel classes from kernel names, for the per-arm breakdown of a decode step.

Two passes, because a name alone cannot always say what a kernel is for:

1. `classify_name(name)` reads one kernel name: GEMMs (cuBLAS/cuBLASLt/CUTLASS names such as
   `nvjet_*`, `sm90_xmma_gemm_*`, `ampere_*gemm*`, `gemv*`), attention and KV-write kernels (the
   engine's Triton kernels in rltbench/engine/attention.py and torch's SDPA/softmax kernels), our
   fused Triton kernels (names of the @triton.jit functions in rltbench/kernels/*.py: they contain
   rms/norm, rope/rotary, silu/act), and torch's native elementwise/reduce kernels by the functor
   name inside the template (`rsqrt_kernel_cuda`, `MeanOps`, `silu_kernel`, `neg_kernel`,
   `CatArrayBatchedCopy`, `MulFunctor`, `CUDAFunctor_add`, `*copy_kernel*`).
   Some of these are *anchors* (their class is certain: rsqrt/pow/mean belong to a norm, silu to
   the activation, neg/cat to rotate_half in RoPE); others are *generic* (mul, add, cast) and
   could belong to several ops.
2. `classify_sequence(names)` gives each generic kernel the class of the op it sits in, from its
   neighbours in execution order, following the reference expressions (kernels.md):
   norm = cast, pow, mean, +eps, rsqrt, mul, cast, mul  -> 1 generic kernel before the `pow`,
   3 after the `rsqrt`; RoPE per tensor = mul, neg, cat, mul, add -> 1 before `neg`, 2 after
   `cat`; SiLU*up = silu, mul -> 1 after `silu`. A generic add that no op claims is a residual
   add; a generic cast is copy/cast; any other generic kernel is "other".
This is a documented heuristic for the torch arm's unfused ops; fused kernels are classified by
their own names and need no context. A fused residual+norm kernel counts as "norm".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

NORM = "norm"
ROPE = "rope"
ACT = "activation"
RESIDUAL = "residual add"
GEMM = "gemm"
ATTN = "attention"
KV_WRITE = "kv write"
COPY = "copy/cast"
OTHER = "other"

CLASSES: tuple[str, ...] = (GEMM, ATTN, KV_WRITE, NORM, ROPE, ACT, RESIDUAL, COPY, OTHER)
FLOOR_CLASSES: tuple[str, ...] = (GEMM, ATTN)  # what no elementwise fusion can remove

# generic kinds (second element of classify_name for kernels whose class needs context)
G_MUL, G_ADD, G_CAST = "mul", "add", "cast"

# Anchor hints: the op position inside the reference expression (see module docstring).
_NORM_POW, _NORM_RSQRT = "norm:pow", "norm:rsqrt"
_ROPE_NEG, _ROPE_CAT = "rope:neg", "rope:cat"
_ACT_SILU = "act:silu"

_GEMM_RE = re.compile(
    r"(nvjet|xmma_gemm|gemm|gemv|cublas|cutlass.*(tensorop|wmma|gemm)|s16816|s1688|h16816|"
    r"splitKreduce|sm90_|sm80_|sm100_|ampere_|hopper_|volta_|turing_|dot_kernel)",
    re.IGNORECASE,
)
_ATTN_RE = re.compile(
    r"(_decode_partial_kernel|_decode_reduce_kernel|paged_(decode|prefill)|attention|attn|flash_fwd|"
    r"flash::|fmha|softmax_warp|SoftMax|cunn_SoftMax|_scaled_dot_product)",
    re.IGNORECASE,
)
_KV_RE = re.compile(
    r"(write_kv|reshape_and_cache|store_kv|kv_write|index_copy|index_put|scatter)", re.IGNORECASE
)
# Our Triton kernels (the @triton.jit names in rltbench/kernels/*.py).
_TRITON_NORM_RE = re.compile(r"(rms|norm|squares)", re.IGNORECASE)
_TRITON_ROPE_RE = re.compile(r"(rope|rotary)", re.IGNORECASE)
_TRITON_ACT_RE = re.compile(r"(silu|swiglu|gelu|_act_)", re.IGNORECASE)


def _is_native(name: str) -> bool:
    """torch's own CUDA kernels carry the at::native namespace (or well-known kernel families)."""
    return re.search(r"(^|[^A-Za-z0-9_])at::", name) is not None


def classify_name(name: str) -> tuple[str, str | None]:
    """(class, hint) of one kernel name, with no context.

    `hint` is None for a final class, an anchor position (e.g. "norm:rsqrt") for anchors, or a
    generic kind ("mul", "add", "cast") when the class depends on the neighbours (then class is
    the fallback used when no op claims it).
    """
    n = name.strip()
    low = n.lower()
    if low.startswith("memcpy") or low.startswith("memset") or "cudamemcpy" in low:
        return COPY, None
    # Engine attention / KV kernels and torch attention kernels.
    if _KV_RE.search(n):
        return KV_WRITE, None
    if _ATTN_RE.search(n):
        return ATTN, None
    if not _is_native(n):
        # cuBLAS / CUTLASS GEMMs (and split-K reductions) are never at::native.
        if _GEMM_RE.search(n):
            return GEMM, None
        # Our fused Triton kernels, named by their @triton.jit function.
        if _TRITON_ROPE_RE.search(n):
            return ROPE, None
        if _TRITON_ACT_RE.search(n):
            return ACT, None
        if _TRITON_NORM_RE.search(n):
            return NORM, None
        return OTHER, None
    # torch native kernels: read the functor inside the template.
    if "MeanOps" in n:
        return NORM, _NORM_POW  # mean of squares; counts as the norm's reduction (same position as pow)
    if "rsqrt" in low:
        return NORM, _NORM_RSQRT
    if "pow_tensor_scalar" in n or "pow_kernel" in low:
        return NORM, _NORM_POW
    if "silu" in low:
        return ACT, _ACT_SILU
    if "neg_kernel" in n:
        return ROPE, _ROPE_NEG
    if "CatArrayBatchedCopy" in n or "cat_" in low and "copy" in low:
        return ROPE, _ROPE_CAT
    if "MulFunctor" in n or "mul_kernel" in low or "_mul" in low:
        return OTHER, G_MUL
    if "CUDAFunctor_add" in n or "CUDAFunctorOnSelf_add" in n or "AddFunctor" in n or "add_kernel" in low:
        return RESIDUAL, G_ADD
    if "copy_kernel" in low or "copy_" in low:
        return COPY, G_CAST
    if "indexSelect" in n or "embedding" in low:
        return OTHER, None  # token embedding lookup
    return OTHER, None


def classify_sequence(names: Sequence[str]) -> list[str]:
    """Classes of kernels in execution order (one decode step on one stream).

    Generic kernels (mul/add/cast) adopt the class of the reference op they sit in, judged from
    the nearest anchors (see the module docstring for the positions).
    """
    first = [classify_name(n) for n in names]
    out = [cls for cls, _ in first]
    hints = [h for _, h in first]
    anchors = {_NORM_POW, _NORM_RSQRT, _ROPE_NEG, _ROPE_CAT, _ACT_SILU}
    generic = {G_MUL, G_ADD, G_CAST}

    def prev_anchor(i: int) -> tuple[str | None, int]:
        for j in range(i - 1, max(-1, i - 4), -1):
            if hints[j] in anchors:
                return hints[j], i - j
            if hints[j] not in generic:
                break
        return None, 0

    def next_anchor(i: int) -> tuple[str | None, int]:
        for j in range(i + 1, min(len(names), i + 3)):
            if hints[j] in anchors:
                return hints[j], j - i
            if hints[j] not in generic:
                break
        return None, 0

    for i, hint in enumerate(hints):
        if hint not in generic:
            continue
        pa, pd = prev_anchor(i)
        na, nd = next_anchor(i)
        if pa == _NORM_RSQRT and pd <= 3 and hint in (G_MUL, G_CAST):
            out[i] = NORM
        elif pa == _ACT_SILU and pd == 1 and hint == G_MUL:
            out[i] = ACT
        elif pa == _ROPE_CAT and pd <= 2 and hint in (G_MUL, G_ADD):
            out[i] = ROPE
        elif na == _ROPE_NEG and nd == 1 and hint == G_MUL:
            out[i] = ROPE
        elif na == _NORM_POW and nd == 1 and hint == G_CAST:
            out[i] = NORM
        elif pa == _NORM_POW and pd == 1 and hint == G_ADD:
            out[i] = NORM  # var + eps right after the mean
        elif hint == G_ADD:
            out[i] = RESIDUAL
        elif hint == G_CAST:
            out[i] = COPY
        else:
            out[i] = OTHER
    return out
