"""RoPE of q and k in ONE Triton launch, with exact or approx numerics (the ``EXACT`` constexpr).

Exact: bitwise equal to the models' expressions. NeoX / rotate_half (Ouro, HF Llama): cos/sin
[T, D] already in the activation dtype, and torch rounds after every op::

    out[:h] = round(round(x1 * c[:h]) + round(-x2 * s[:h]))
    out[h:] = round(round(x2 * c[h:]) + round( x1 * s[h:]))          (h = D/2)

Interleaved (Huginn ``apply_rotary_emb_complex_like``): pairs (x[2j], x[2j+1]) upcast to fp32,
cos/sin [T, D/2] fp32, each fp32 op rounded, then one cast back::

    out[2j]   = round(x0*c - x1*s)        out[2j+1] = round(x1*c + x0*s)

Approx: the same formulas in fp32 (the compiler may fuse into FMAs), one rounding at the store;
NeoX skips the reference's three intermediate roundings, interleaved differs from exact only where
an FMA changes the fp32 result. One numerics switch instead of two copies of every kernel: the
arms differ in their arithmetic only, so they share loads, stores and grids by construction.

Grid: (token blocks, Hq + Hk); programs with head index >= Hq rotate k. ``rope_neox_store`` folds
the engine's KV write in: its k programs store the rotated k and the unrotated v rows straight into
one plane's paged cache (no rotated-k tensor, no separate write launch), bitwise what the same arm's
rope followed by a slot copy stores.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from rltbench.kernels import rounding as rn

KINDS = ("neox", "interleaved")


@triton.jit
def _neox_rotate(x_ptr, c_ptr, s_ptr, head, T, sxt, sxh, sct, sst, HALF, EXACT: tl.constexpr,
                 DT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """One head of a token tile rotated: (t, j, mask, o1, o2), rounded where torch rounds (EXACT)
    or fp32 (rounded at the store). Shared by the plain and the cache-storing kernels so both give
    the same bits by construction."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None].to(tl.int64)
    j = tl.arange(0, BLOCK_H)[None, :]
    mask = (t < T) & (j < HALF)
    xb = x_ptr + t * sxt + head * sxh
    x1 = rn.load_f32(xb + j, mask, DT, INTERPRET)
    x2 = rn.load_f32(xb + j + HALF, mask, DT, INTERPRET)
    c1 = rn.load_f32(c_ptr + t * sct + j, mask, DT, INTERPRET)
    c2 = rn.load_f32(c_ptr + t * sct + j + HALF, mask, DT, INTERPRET)
    s1 = rn.load_f32(s_ptr + t * sst + j, mask, DT, INTERPRET)
    s2 = rn.load_f32(s_ptr + t * sst + j + HALF, mask, DT, INTERPRET)
    if EXACT:
        a1 = rn.round_to(rn.mul_rn(x1, c1, INTERPRET), DT, INTERPRET)  # q * cos
        b1 = rn.round_to(rn.mul_rn(-x2, s1, INTERPRET), DT, INTERPRET)  # rotate_half(q) * sin
        o1 = rn.round_to(rn.add_rn(a1, b1, INTERPRET), DT, INTERPRET)
        a2 = rn.round_to(rn.mul_rn(x2, c2, INTERPRET), DT, INTERPRET)
        b2 = rn.round_to(rn.mul_rn(x1, s2, INTERPRET), DT, INTERPRET)
        o2 = rn.round_to(rn.add_rn(a2, b2, INTERPRET), DT, INTERPRET)
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    return t, j, mask, o1, o2


@triton.jit
def _interleaved_rotate(x_ptr, c_ptr, s_ptr, head, T, sxt, sxh, sct, sst, HALF, EXACT: tl.constexpr,
                        DT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_H: tl.constexpr):
    """One head of a token tile, interleaved pairs: (t, j, mask, o0, o1) in fp32."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None].to(tl.int64)
    j = tl.arange(0, BLOCK_H)[None, :]
    mask = (t < T) & (j < HALF)
    xb = x_ptr + t * sxt + head * sxh
    x0 = rn.load_f32(xb + 2 * j, mask, DT, INTERPRET)
    x1 = rn.load_f32(xb + 2 * j + 1, mask, DT, INTERPRET)
    c = tl.load(c_ptr + t * sct + j, mask=mask, other=0.0)
    s = tl.load(s_ptr + t * sst + j, mask=mask, other=0.0)
    if EXACT:
        o0 = rn.sub_rn(rn.mul_rn(x0, c, INTERPRET), rn.mul_rn(x1, s, INTERPRET), INTERPRET)
        o1 = rn.add_rn(rn.mul_rn(x1, c, INTERPRET), rn.mul_rn(x0, s, INTERPRET), INTERPRET)
        o0 = rn.round_to(o0, DT, INTERPRET)
        o1 = rn.round_to(o1, DT, INTERPRET)
    else:
        o0 = x0 * c - x1 * s
        o1 = x1 * c + x0 * s
    return t, j, mask, o0, o1


@triton.jit
def _rope_tile(x_ptr, o_ptr, c_ptr, s_ptr, head, T, H, sxt, sxh, sct, sst, HALF, NEOX: tl.constexpr,
               EXACT: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_T: tl.constexpr,
               BLOCK_H: tl.constexpr):
    """One head of a token tile rotated into the contiguous output [T, H, 2 * HALF]."""
    if NEOX:
        t, j, mask, o1, o2 = _neox_rotate(x_ptr, c_ptr, s_ptr, head, T, sxt, sxh, sct, sst, HALF, EXACT, DT,
                                          INTERPRET, BLOCK_T, BLOCK_H)
        ob = o_ptr + (t * H + head) * (2 * HALF)
        rn.store_f32(ob + j, o1, mask, DT, INTERPRET)
        rn.store_f32(ob + j + HALF, o2, mask, DT, INTERPRET)
    else:
        t, j, mask, o0, o1 = _interleaved_rotate(x_ptr, c_ptr, s_ptr, head, T, sxt, sxh, sct, sst, HALF,
                                                 EXACT, DT, INTERPRET, BLOCK_T, BLOCK_H)
        ob = o_ptr + (t * H + head) * (2 * HALF)
        rn.store_f32(ob + 2 * j, o0, mask, DT, INTERPRET)
        rn.store_f32(ob + 2 * j + 1, o1, mask, DT, INTERPRET)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, c_ptr, s_ptr, T, HQ, HK, sqt, sqh, skt, skh, sct, sst, HALF,
                 NEOX: tl.constexpr, EXACT: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """Grid (token blocks, Hq + Hk): head programs below Hq rotate q, the others k."""
    h = tl.program_id(1)
    if h < HQ:
        _rope_tile(q_ptr, qo_ptr, c_ptr, s_ptr, h, T, HQ, sqt, sqh, sct, sst, HALF, NEOX, EXACT, DT,
                   INTERPRET, BLOCK_T, BLOCK_H)
    else:
        _rope_tile(k_ptr, ko_ptr, c_ptr, s_ptr, h - HQ, T, HK, skt, skh, sct, sst, HALF, NEOX, EXACT, DT,
                   INTERPRET, BLOCK_T, BLOCK_H)


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
def _neox_cache_tile(
    k_ptr, v_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr, head, T,
    skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, EXACT: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One kv head of a token tile: the rotated k (the rounding of ``_neox_rotate``) and the raw v
    rows into each token's paged cache slot (block = slot // BLOCK_SIZE); a row whose slot is < 0
    (padding) stores nothing."""
    t, j, mask, k1, k2 = _neox_rotate(k_ptr, c_ptr, s_ptr, head, T, skt, skh, sct, sst, HALF, EXACT, DT,
                                      INTERPRET, BLOCK_T, BLOCK_H)
    slot = tl.load(slot_ptr + t * s_slot, mask=t < T, other=-1).to(tl.int64)
    keep = mask & (slot >= 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    kb = kc_ptr + blk * skcb + off * skct + head * skch
    rn.store_f32(kb + j, k1, keep, DT, INTERPRET)
    rn.store_f32(kb + j + HALF, k2, keep, DT, INTERPRET)
    vb = v_ptr + t * svt + head * svh
    vcb = vc_ptr + blk * svcb + off * svct + head * svch
    _copy_bits(vb + j, vcb + j, keep, DT, INTERPRET)
    _copy_bits(vb + j + HALF, vcb + j + HALF, keep, DT, INTERPRET)


@triton.jit
def _rope_neox_store_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr,
    T, HQ, sqt, sqh, skt, skh, svt, svh, sct, sst, s_slot,
    skcb, skct, skch, svcb, svct, svch, HALF,
    BLOCK_SIZE: tl.constexpr, EXACT: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Grid (token blocks, Hq + Hk): q heads as ``_rope_kernel``; kv heads into the caches."""
    h = tl.program_id(1)
    if h < HQ:
        _rope_tile(q_ptr, qo_ptr, c_ptr, s_ptr, h, T, HQ, sqt, sqh, sct, sst, HALF, True, EXACT, DT,
                   INTERPRET, BLOCK_T, BLOCK_H)
    else:
        _neox_cache_tile(
            k_ptr, v_ptr, kc_ptr, vc_ptr, c_ptr, s_ptr, slot_ptr, h - HQ, T,
            skt, skh, svt, svh, sct, sst, s_slot,
            skcb, skct, skch, svcb, svct, svch, HALF,
            BLOCK_SIZE, EXACT, DT, INTERPRET, BLOCK_T, BLOCK_H,
        )  # fmt: skip


def _stride0(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[1] * (t.shape[2] if t.dim() == 3 else 1)


def _stride1(t: torch.Tensor) -> int:
    return t.stride(1) if t.shape[1] > 1 else t.shape[2]


def _table_stride(t: torch.Tensor, T: int) -> int:
    return t.stride(0) if T > 1 else t.shape[1]


def _launch(kernel: Any, q: torch.Tensor, k: torch.Tensor, args: tuple[Any, ...], **consts: Any) -> None:
    """Launch `kernel(*args)` on the (token blocks, Hq + Hk) grid of q [T, Hq, D] and k [T, Hk, D],
    with the tile both RoPE kernels use; nothing when there is nothing to rotate."""
    T, HQ, D = q.shape
    if T == 0 or HQ + k.shape[1] == 0 or D == 0:
        return
    interp = rn.interpret_mode()
    block_h = triton.next_power_of_2(D // 2)
    block_t = max(1, min(triton.next_power_of_2(T), (8192 if interp else 512) // block_h))
    kernel[(triton.cdiv(T, block_t), HQ + k.shape[1])](
        *args, DT=rn.dtype_code(q.dtype), INTERPRET=interp, BLOCK_T=block_t, BLOCK_H=block_h,
        num_warps=1 if interp else max(1, min(4, block_t * block_h // 128)), **consts,
    )  # fmt: skip


def rope(kind: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         qo: torch.Tensor, ko: torch.Tensor, exact: bool) -> None:
    """RoPE ("neox" or "interleaved") of q [T, Hq, D] and k [T, Hk, D] (head/token strides free,
    last dim contiguous; cos/sin 2-D with contiguous last dim) into contiguous qo/ko, one launch.
    The caller checked shapes, dtypes and layouts (Ops)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    T, HQ, D = q.shape
    args = (q, k, qo, ko, cos, sin, T, HQ, k.shape[1], _stride0(q), _stride1(q), _stride0(k), _stride1(k),
            _table_stride(cos, T), _table_stride(sin, T), D // 2)
    _launch(_rope_kernel, q, k, args, NEOX=kind == "neox", EXACT=exact)


def rope_neox_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    qo: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, exact: bool) -> None:
    """NeoX RoPE of q into qo and of k into ``k_cache``, plus v into ``v_cache``, one launch.

    q [T, Hq, D], k/v [T, Hk, D] (token/head strides free, last dim contiguous), cos/sin [T, D];
    k_cache/v_cache ``[num_blocks, block_size, Hk, D]`` (last dim contiguous), slot_mapping integer
    [T] with ``slot = block * block_size + offset``; rows with ``slot < 0`` store nothing. The cache
    holds the bits `rope` returns for the same numerics. The caller checks shapes and dtypes
    (Ops.rope_neox_store)."""
    T, HQ, D = q.shape
    args = (q, k, v, qo, k_cache, v_cache, cos, sin, slot_mapping, T, HQ,
            _stride0(q), _stride1(q), _stride0(k), _stride1(k), _stride0(v), _stride1(v),
            _table_stride(cos, T), _table_stride(sin, T), slot_mapping.stride(0) if T > 1 else 1,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), D // 2)
    _launch(_rope_neox_store_kernel, q, k, args, BLOCK_SIZE=k_cache.shape[1], EXACT=exact)
