"""Approximate RoPE (q and k in one launch): fp32 arithmetic (the compiler may fuse into FMAs),
one rounding at the store. NeoX skips the reference's three intermediate roundings; interleaved
differs from exact only where an FMA changes the fp32 result."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench.kernels.rope_exact import launch_rope, rope_launch_shape, store_kv_rows
from rltbench.kernels.rounding import dtype_code, load_f32, store_f32


@triton.jit
def _neox_rotate(
    x_ptr,
    c_ptr,
    s_ptr,
    head,
    T,
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
    """One head of a token tile rotated in fp32 (not yet rounded): (t, j, mask, o1, o2). Shared by
    the plain and the cache-storing kernels, so the cache holds the bits the plain rope returns."""
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
    return t, j, mask, x1 * c1 - x2 * s1, x2 * c2 + x1 * s2


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
    t, j, mask, o1, o2 = _neox_rotate(
        x_ptr, c_ptr, s_ptr, head, T, sxt, sxh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
    )
    ob = o_ptr + (t * H + head) * (2 * HALF)
    store_f32(ob + j, o1, mask, DT, INTERPRET)
    store_f32(ob + j + HALF, o2, mask, DT, INTERPRET)


@triton.jit
def _neox_cache_tile(
    k_ptr, v_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr, head, T,
    skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One kv head of a token tile: the rotated k (rounded once, at the store) and the raw v rows
    into each token's cache slot (rope_exact.store_kv_rows)."""
    t, j, mask, o1, o2 = _neox_rotate(
        k_ptr, c_ptr, s_ptr, head, T, skt, skh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
    )
    store_kv_rows(v_ptr, kc_ptr, vc_ptr, slot_ptr, head, T, t, j, mask, o1, o2, svt, svh, s_slot,
                  skcb, skct, skch, svcb, svct, svch, HALF, BLOCK_SIZE, DT, INTERPRET)


@triton.jit
def _rope_neox_store_approx_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr,
    T, HQ, sqt, sqh, skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Grid (token blocks, Hq + Hk): q heads into qo, kv heads into the paged caches."""
    h = tl.program_id(1)
    if h < HQ:
        _neox_tile(
            q_ptr, qo_ptr, c_ptr, s_ptr, h, T, HQ, sqt, sqh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
        )
    else:
        _neox_cache_tile(
            k_ptr, v_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr, h - HQ, T,
            skt, skh, svt, svh, sct, sst, s_slot,
            skcb, skct, skch, svcb, svct, svch, HALF,
            BLOCK_SIZE, DT, INTERPRET, BLOCK_T, BLOCK_H,
        )  # fmt: skip


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


def rope_neox_store_approx(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    qo: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Approx NeoX RoPE of q into qo and of k into ``k_cache``, plus v into ``v_cache``, one launch
    (layouts as rope_exact.rope_neox_store_exact; the cache holds the bits ``rope_approx`` returns)."""
    T, HQ, D = q.shape
    HK = k.shape[1]
    if T == 0 or HQ + HK == 0 or D == 0:
        return
    interp, half, block_h, block_t, nw, strides = rope_launch_shape(q, k, v, cos, sin, slot_mapping)
    _rope_neox_store_approx_kernel[(triton.cdiv(T, block_t), HQ + HK)](
        q, k, v, qo, k_cache, v_cache, cos, sin, slot_mapping, T, HQ, *strides,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        half,
        BLOCK_SIZE=k_cache.shape[1], DT=dtype_code(q.dtype), INTERPRET=interp,
        BLOCK_T=block_t, BLOCK_H=block_h, num_warps=nw,
    )  # fmt: skip
