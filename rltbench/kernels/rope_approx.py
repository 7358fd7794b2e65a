"""Approximate RoPE (q and k in one launch): fp32 arithmetic (the compiler may fuse into FMAs),
one rounding at the store. NeoX skips the reference's three intermediate roundings; interleaved
differs from exact only where an FMA changes the fp32 result."""

from __future__ import annotations

import triton
import triton.language as tl

from rltbench.kernels.rope_exact import launch_rope
from rltbench.kernels.rounding import load_f32, store_f32


@triton.jit
def _neox_tile(
    x_ptr,
    o_ptr,
    c_ptr,
    s_ptr,
    head,
    T,
    H,
    sxt,
    sxh,
    sct,
    sst,
    HALF,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None].to(tl.int64)
    j = tl.arange(0, BLOCK_H)[None, :]
    mask = (t < T) & (j < HALF)
    xb = x_ptr + t * sxt + head * sxh
    x1 = load_f32(xb + j, mask, DT, INTERPRET)
    x2 = load_f32(xb + j + HALF, mask, DT, INTERPRET)
    c1 = load_f32(c_ptr + t * sct + j, mask, DT, INTERPRET)
    c2 = load_f32(c_ptr + t * sct + j + HALF, mask, DT, INTERPRET)
    s1 = load_f32(s_ptr + t * sst + j, mask, DT, INTERPRET)
    s2 = load_f32(s_ptr + t * sst + j + HALF, mask, DT, INTERPRET)
    ob = o_ptr + (t * H + head) * (2 * HALF)
    store_f32(ob + j, x1 * c1 - x2 * s1, mask, DT, INTERPRET)
    store_f32(ob + j + HALF, x2 * c2 + x1 * s2, mask, DT, INTERPRET)


@triton.jit
def _rope_neox_approx_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    c_ptr,
    s_ptr,
    T,
    HQ,
    HK,
    sqt,
    sqh,
    skt,
    skh,
    sct,
    sst,
    HALF,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    h = tl.program_id(1)
    if h < HQ:
        _neox_tile(
            q_ptr, qo_ptr, c_ptr, s_ptr, h, T, HQ, sqt, sqh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
        )
    else:
        _neox_tile(
            k_ptr,
            ko_ptr,
            c_ptr,
            s_ptr,
            h - HQ,
            T,
            HK,
            skt,
            skh,
            sct,
            sst,
            HALF,
            DT,
            INTERPRET,
            BLOCK_T,
            BLOCK_H,
        )


@triton.jit
def _interleaved_tile(
    x_ptr,
    o_ptr,
    c_ptr,
    s_ptr,
    head,
    T,
    H,
    sxt,
    sxh,
    sct,
    sst,
    HALF,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None].to(tl.int64)
    j = tl.arange(0, BLOCK_H)[None, :]
    mask = (t < T) & (j < HALF)
    xb = x_ptr + t * sxt + head * sxh
    x0 = load_f32(xb + 2 * j, mask, DT, INTERPRET)
    x1 = load_f32(xb + 2 * j + 1, mask, DT, INTERPRET)
    c = tl.load(c_ptr + t * sct + j, mask=mask, other=0.0)
    s = tl.load(s_ptr + t * sst + j, mask=mask, other=0.0)
    ob = o_ptr + (t * H + head) * (2 * HALF)
    store_f32(ob + 2 * j, x0 * c - x1 * s, mask, DT, INTERPRET)
    store_f32(ob + 2 * j + 1, x1 * c + x0 * s, mask, DT, INTERPRET)


@triton.jit
def _rope_interleaved_approx_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    c_ptr,
    s_ptr,
    T,
    HQ,
    HK,
    sqt,
    sqh,
    skt,
    skh,
    sct,
    sst,
    HALF,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    h = tl.program_id(1)
    if h < HQ:
        _interleaved_tile(
            q_ptr, qo_ptr, c_ptr, s_ptr, h, T, HQ, sqt, sqh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
        )
    else:
        _interleaved_tile(
            k_ptr,
            ko_ptr,
            c_ptr,
            s_ptr,
            h - HQ,
            T,
            HK,
            skt,
            skh,
            sct,
            sst,
            HALF,
            DT,
            INTERPRET,
            BLOCK_T,
            BLOCK_H,
        )


APPROX_KERNELS = {"neox": _rope_neox_approx_kernel, "interleaved": _rope_interleaved_approx_kernel}


def rope_approx(kind: str, q, k, cos, sin, qo, ko) -> None:
    """Approximate RoPE ("neox" or "interleaved") of q and k into qo/ko, one launch."""
    launch_rope(kind, q, k, cos, sin, qo, ko, APPROX_KERNELS)
