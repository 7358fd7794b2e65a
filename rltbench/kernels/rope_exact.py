"""Exact RoPE kernels (q and k in ONE launch), bitwise equal to the models' expressions.

NeoX / rotate_half (Ouro, HF Llama): cos/sin [T, D] already in the activation dtype and torch
rounds after every op::

    out[:h] = round(round(x1 * c[:h]) + round(-x2 * s[:h]))
    out[h:] = round(round(x2 * c[h:]) + round( x1 * s[h:]))          (h = D/2)

Interleaved (Huginn ``apply_rotary_emb_complex_like``): pairs (x[2j], x[2j+1]) upcast to fp32,
cos/sin [T, D/2] fp32, each fp32 op rounded, then one cast back::

    out[2j]   = round(x0*c - x1*s)        out[2j+1] = round(x1*c + x0*s)

Grid: (token blocks, Hq + Hk); programs with head index >= Hq rotate k.

``rope_neox_store_exact`` is the NeoX kernel with the engine's KV write folded in: its k programs
store the rotated k and the unrotated v rows straight into one plane's paged cache (no rotated-k
tensor, no separate write launch), bitwise what rope followed by a slot copy stores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rltbench.kernels.pdl import launch_kwargs, mode_for
from rltbench.kernels.pdl import wait as pdl_wait
from rltbench.kernels.rounding import (
    add_rn,
    dtype_code,
    interpret_mode,
    load_f32,
    mul_rn,
    round_to,
    store_f32,
    sub_rn,
)


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
    """One head of a token tile rotated, rounded where torch rounds: (t, j, mask, o1, o2). Shared by
    the plain and the cache-storing kernels so both give the same bits by construction."""
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
    a1 = round_to(mul_rn(x1, c1, INTERPRET), DT, INTERPRET)  # q * cos
    b1 = round_to(mul_rn(-x2, s1, INTERPRET), DT, INTERPRET)  # rotate_half(q) * sin
    o1 = round_to(add_rn(a1, b1, INTERPRET), DT, INTERPRET)
    a2 = round_to(mul_rn(x2, c2, INTERPRET), DT, INTERPRET)
    b2 = round_to(mul_rn(x1, s2, INTERPRET), DT, INTERPRET)
    o2 = round_to(add_rn(a2, b2, INTERPRET), DT, INTERPRET)
    return t, j, mask, o1, o2


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
def _rope_neox_kernel(
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
    PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)   # q, k, cos, sin may come from the previous kernels: nothing is read before
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
def _copy_bits(src, dst, mask, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """Copy DT elements unchanged. A native load/store is a bit copy on the GPU; the interpreter
    converts bf16 through fp32 (losing subnormals), so there they move as unsigned integers."""
    if INTERPRET:
        if DT == 0:
            x = tl.load(src.to(tl.pointer_type(tl.uint32), bitcast=True), mask=mask)
            tl.store(dst.to(tl.pointer_type(tl.uint32), bitcast=True), x, mask=mask)
        else:
            x = tl.load(src.to(tl.pointer_type(tl.uint16), bitcast=True), mask=mask)
            tl.store(dst.to(tl.pointer_type(tl.uint16), bitcast=True), x, mask=mask)
    else:
        tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def store_kv_rows(
    v_ptr, kc_ptr, vc_ptr, slot_ptr, head, T, t, j, mask, k1, k2, svt, svh, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """The rotated k halves (k1, k2, fp32 holding DT values) and the raw v rows of one kv head of a
    token tile into each token's paged cache slot (block = slot // BLOCK_SIZE); a row whose slot is
    < 0 (padding) stores nothing. Shared by the exact and approx rope-and-store kernels."""
    slot = tl.load(slot_ptr + t * s_slot, mask=t < T, other=-1).to(tl.int64)
    keep = mask & (slot >= 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    kb = kc_ptr + blk * skcb + off * skct + head * skch
    store_f32(kb + j, k1, keep, DT, INTERPRET)
    store_f32(kb + j + HALF, k2, keep, DT, INTERPRET)
    vb = v_ptr + t * svt + head * svh
    vcb = vc_ptr + blk * svcb + off * svct + head * svch
    _copy_bits(vb + j, vcb + j, keep, DT, INTERPRET)
    _copy_bits(vb + j + HALF, vcb + j + HALF, keep, DT, INTERPRET)


@triton.jit
def _neox_cache_tile(
    k_ptr, v_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr, head, T,
    skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One kv head of a token tile: the rotated k (same rounding as ``_neox_tile``) and the raw v
    rows go to each token's cache slot (store_kv_rows)."""
    t, j, mask, o1, o2 = _neox_rotate(
        k_ptr, c_ptr, s_ptr, head, T, skt, skh, sct, sst, HALF, DT, INTERPRET, BLOCK_T, BLOCK_H
    )
    store_kv_rows(v_ptr, kc_ptr, vc_ptr, slot_ptr, head, T, t, j, mask, o1, o2, svt, svh, s_slot,
                  skcb, skct, skch, svcb, svct, svch, HALF, BLOCK_SIZE, DT, INTERPRET)


@triton.jit
def _rope_neox_store_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr,
    T, HQ, sqt, sqh, skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    """Grid (token blocks, Hq + Hk): q heads as ``_rope_neox_kernel``; kv heads into the caches."""
    pdl_wait(PDL)
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
    o0 = sub_rn(mul_rn(x0, c, INTERPRET), mul_rn(x1, s, INTERPRET), INTERPRET)
    o1 = add_rn(mul_rn(x1, c, INTERPRET), mul_rn(x0, s, INTERPRET), INTERPRET)
    o0 = round_to(o0, DT, INTERPRET)
    o1 = round_to(o1, DT, INTERPRET)
    ob = o_ptr + (t * H + head) * (2 * HALF)
    store_f32(ob + 2 * j, o0, mask, DT, INTERPRET)
    store_f32(ob + 2 * j + 1, o1, mask, DT, INTERPRET)


@triton.jit
def _rope_interleaved_kernel(
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
    PDL: tl.constexpr = 0,
):
    pdl_wait(PDL)   # q, k, cos, sin may come from the previous kernels: nothing is read before
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


def _stride0(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[1] * (t.shape[2] if t.dim() == 3 else 1)


def _stride1(t: torch.Tensor) -> int:
    return t.stride(1) if t.shape[1] > 1 else t.shape[2]


def _tiling(T: int, D: int) -> tuple[bool, int, int, int, int]:
    """(interpret, half, BLOCK_H, BLOCK_T, num_warps) for T tokens of head dim D (shared launch shape)."""
    interp = interpret_mode()
    half = D // 2
    block_h = triton.next_power_of_2(half)
    block_t = (
        max(1, min(triton.next_power_of_2(T), 8192 // block_h))
        if interp
        else max(1, min(triton.next_power_of_2(T), 512 // block_h))
    )
    nw = 1 if interp else max(1, min(4, block_t * block_h // 128))
    return interp, half, block_h, block_t, nw


def _table_stride(t: torch.Tensor, T: int) -> int:
    return t.stride(0) if T > 1 else t.shape[1]


def launch_rope(
    kind: str,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    qo: torch.Tensor,
    ko: torch.Tensor,
    kernels: dict,
    pdl_ok: bool = False,
) -> None:
    """Shared launcher (exact and approx): q [T, Hq, D], k [T, Hk, D] (head/token strides free,
    last dim contiguous), cos/sin 2-D with contiguous last dim; qo/ko contiguous outputs."""
    T, HQ, D = q.shape
    HK = k.shape[1]
    if T == 0 or HQ + HK == 0 or D == 0:
        return
    interp, half, block_h, block_t, nw = _tiling(T, D)
    grid = (triton.cdiv(T, block_t), HQ + HK)
    kernels[kind][grid](
        q,
        k,
        qo,
        ko,
        cos,
        sin,
        T,
        HQ,
        HK,
        _stride0(q),
        _stride1(q),
        _stride0(k),
        _stride1(k),
        _table_stride(cos, T),
        _table_stride(sin, T),
        half,
        DT=dtype_code(q.dtype),
        INTERPRET=interp,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        num_warps=nw,
        **(launch_kwargs(mode_for(q, interp)) if pdl_ok else {}),
    )


def rope_launch_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      slot_mapping: torch.Tensor) -> tuple[bool, int, int, int, int, tuple[int, ...]]:
    """(interpret, half, BLOCK_H, BLOCK_T, num_warps, the q/k/v/cos/sin/slot strides) of a
    rope-and-store launch: shared by the exact and approx kernels, which take the same arguments."""
    T, _, D = q.shape
    strides = (_stride0(q), _stride1(q), _stride0(k), _stride1(k), _stride0(v), _stride1(v),
               _table_stride(cos, T), _table_stride(sin, T), slot_mapping.stride(0) if T > 1 else 1)
    return (*_tiling(T, D), strides)


def rope_neox_store_exact(
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
    """Exact NeoX RoPE of q into qo and of k into ``k_cache``, plus v into ``v_cache``, one launch.

    q [T, Hq, D], k/v [T, Hk, D] (token/head strides free, last dim contiguous), cos/sin [T, D];
    k_cache/v_cache ``[num_blocks, block_size, Hk, D]`` (last dim contiguous), slot_mapping integer
    [T] with ``slot = block * block_size + offset``; rows with ``slot < 0`` store nothing. The caller
    checks shapes and dtypes (Ops.rope_neox_store)."""
    T, HQ, D = q.shape
    HK = k.shape[1]
    if T == 0 or HQ + HK == 0 or D == 0:
        return
    interp, half, block_h, block_t, nw, strides = rope_launch_shape(q, k, v, cos, sin, slot_mapping)
    grid = (triton.cdiv(T, block_t), HQ + HK)
    _rope_neox_store_kernel[grid](
        q, k, v, qo, k_cache, v_cache, cos, sin, slot_mapping, T, HQ, *strides,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        half,
        BLOCK_SIZE=k_cache.shape[1], DT=dtype_code(q.dtype), INTERPRET=interp,
        BLOCK_T=block_t, BLOCK_H=block_h, num_warps=nw, **launch_kwargs(mode_for(q, interp)),
    )  # fmt: skip


EXACT_KERNELS = {"neox": _rope_neox_kernel, "interleaved": _rope_interleaved_kernel}


def rope_exact(kind: str, q, k, cos, sin, qo, ko) -> None:
    """Exact RoPE ("neox" or "interleaved") of q and k into qo/ko, one launch."""
    launch_rope(kind, q, k, cos, sin, qo, ko, EXACT_KERNELS, pdl_ok=True)
