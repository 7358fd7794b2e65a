"""Paged KV-cache attention for the serving engine: KV writes, decode attention and chunked prefill.

Pure functions over tensors (no engine imports) so the engine, the tests and the benchmark share
one implementation. Attention is *not* an arm op: every arm (torch / exact / approx) calls the same
function, so it only has to be deterministic for fixed shapes (same inputs, same batch -> same bits).

KV layout (fixed contract with the engine):
  * pool ``kv``: ``[num_planes, 2, num_blocks, block_size, Hkv, D]`` in the model dtype;
    plane ``p`` uses ``k_cache = kv[p, 0]`` and ``v_cache = kv[p, 1]``, each
    ``[num_blocks, block_size, Hkv, D]``.
  * ``block_tables``: int32 ``[B, max_blocks_per_seq]``, one table per request shared by all planes;
    entries past a row's last used block are ignored (never dereferenced).
  * ``seq_lens``: int32 ``[B]``, tokens in the cache for each row INCLUDING the new token(s).
  * a token at position ``pos`` of row ``b`` lives in slot
    ``block_tables[b, pos // block_size] * block_size + pos % block_size``.

Implementations: a torch reference (CPU, oracle, any device) and Triton kernels for CUDA
(flash-decoding: split-K partial softmax in fp32 + a reduce kernel, or one launch when a single split
covers the context or with ``fused_reduce`` (the last split program of each head group combines the
splits); fixed grid for a given batch, table width and knobs, so it is CUDA-graph capturable).
``impl="auto"`` picks Triton on CUDA tensors and torch elsewhere; tests force
``impl="triton"`` on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from rltbench import tuned

Impl = Literal["auto", "torch", "triton"]

_LOG2E = 1.4426950408889634
# Programs the split-K grid aims for before it stops shrinking the partition (about 4 per SM of an H100/H200).
_TARGET_PROGRAMS = 528
_PARTITIONS = (4096, 2048, 1024, 512, 256, 128, 64, 32)
_REDUCE_SPLIT_TILE = 16


def _use_triton(impl: Impl, t: torch.Tensor) -> bool:
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"impl must be 'auto', 'torch' or 'triton', got {impl!r}")
    if impl == "auto":
        return t.is_cuda
    return impl == "triton"


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must both be [num_blocks, block_size, Hkv, D], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}")
    nb, bs, hkv, d = k_cache.shape
    return nb, bs, hkv, d


# --------------------------------------------------------------------------------------------------
# write_kv
# --------------------------------------------------------------------------------------------------


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    impl: Impl = "auto",
) -> None:
    """Write the new tokens' K/V into one plane's paged cache, in place.

    k_cache/v_cache ``[num_blocks, block_size, Hkv, D]``; k/v ``[N, Hkv, D]`` (same dtype as the cache);
    slot_mapping int64 ``[N]`` with ``slot = block * block_size + offset``; ``slot < 0`` skips the row
    (padding rows of a CUDA-graph bucket). No host sync, so it can be captured in a CUDA graph.
    Duplicate non-negative slots are a caller error (which row wins is unspecified).
    """
    nb, bs, hkv, d = _check_cache(k_cache, v_cache)
    if k.dim() != 3 or k.shape != v.shape or tuple(k.shape[1:]) != (hkv, d):
        raise ValueError(f"k/v must be [N, {hkv}, {d}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [N={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
        raise ValueError(f"k/v dtype {k.dtype} must match the cache dtype {k_cache.dtype}")
    if k.shape[0] == 0:
        return
    if _use_triton(impl, k) and _triton_write_ok(k_cache, v_cache, k, v):
        _write_kv_triton(k_cache, v_cache, k, v, slot_mapping)
    else:
        _write_kv_torch(k_cache, v_cache, k, v, slot_mapping)


def _triton_write_ok(*ts: torch.Tensor) -> bool:
    return all(t.stride(-1) == 1 for t in ts)


def _write_kv_torch(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Sync-free torch scatter. Skipped rows are redirected to the first valid row's slot carrying that
    row's own value (or, with no valid row, to slot 0 carrying its current value), so every duplicate
    write stores identical bits and the result is deterministic."""
    bs = k_cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    any_valid = valid.any()
    first = torch.argmax(valid.to(torch.int32)).reshape(1)  # first valid row (0 when none)
    # index_select, not slots[first]: indexing with a 0-d device tensor syncs (breaks graph capture)
    first_slot = slots.index_select(0, first)[0]
    fill_slot = torch.where(any_valid, first_slot, torch.zeros_like(first_slot))
    slots = torch.where(valid, slots, fill_slot)
    blk, off = slots // bs, slots % bs
    for cache, new in ((k_cache, k), (v_cache, v)):
        fill_val = torch.where(any_valid, new.index_select(0, first)[0], cache[0, 0])
        vals = torch.where(valid[:, None, None], new, fill_val)
        cache.index_put_((blk, off), vals)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_kcb, stride_kct, stride_kch, stride_vcb, stride_vct, stride_vch,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    heads = tl.where(slot >= 0, NUM_HEADS, 0)  # skipped row -> empty mask (no scalar & tensor: interpreter)
    mask = (h[:, None] < heads) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + i * stride_kn + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + i * stride_vn + h[:, None] * stride_vh + d[None, :], mask=mask)
    hd = h[:, None] * stride_kch + d[None, :]
    tl.store(kc_ptr + blk * stride_kcb + off * stride_kct + hd, k, mask=mask)
    hd = h[:, None] * stride_vch + d[None, :]
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vct + hd, v, mask=mask)


def _write_kv_triton(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    n, hkv, d = k.shape
    h_pad, d_pad = triton.next_power_of_2(hkv), triton.next_power_of_2(d)
    _write_kv_kernel[(n,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=hkv, HEAD_DIM=d, H_PAD=h_pad, D_PAD=d_pad, BLOCK_SIZE=k_cache.shape[1],
        num_warps=4 if h_pad * d_pad <= 4096 else 8,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# decode attention
# --------------------------------------------------------------------------------------------------


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len_hint: int | None = None,
    *,
    impl: Impl = "auto",
    partition_size: int | None = None,
) -> torch.Tensor:
    """One query token per row attending to cached positions ``[0, seq_lens[b])`` of its row.

    q ``[B, Hq, D]`` (Hq a multiple of Hkv; q head h reads KV head ``h // (Hq // Hkv)``);
    k_cache/v_cache ``[num_blocks, block_size, Hkv, D]``; block_tables int32 ``[B, max_blocks_per_seq]``;
    seq_lens int32 ``[B]``. Returns ``[B, Hq, D]`` in q's dtype; softmax is computed in fp32.
    Rows with ``seq_lens == 0`` return zeros and read no KV.

    ``max_seq_len_hint`` (python int, must be >= every seq_len) only bounds the work: the grid covers
    ``min(hint, max_blocks_per_seq * block_size)`` positions, so keep it fixed across graph replays.
    ``partition_size`` (Triton only; power of two >= 32) fixes the split-K partition; by default it is
    chosen from B, Hq and the covered length (so results are deterministic per shape, and batch
    invariant when the caller passes a fixed value).
    """
    nb, bs, hkv, d = _check_cache(k_cache, v_cache)
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv != 0:
        raise ValueError(f"q must be [B, Hq, {d}] with Hq a multiple of {hkv}, got {tuple(q.shape)}")
    b = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(f"block_tables must be [B={b}, max_blocks], got {tuple(block_tables.shape)}")
    if seq_lens.shape != (b,):
        raise ValueError(f"seq_lens must be [B={b}], got {tuple(seq_lens.shape)}")
    max_len = block_tables.shape[1] * bs
    if max_seq_len_hint is not None:
        if max_seq_len_hint < 0:
            raise ValueError(f"max_seq_len_hint must be >= 0, got {max_seq_len_hint}")
        max_len = min(max_len, int(max_seq_len_hint))
    if b == 0:
        return torch.empty_like(q)
    if _use_triton(impl, q) and (impl == "triton" or bs & (bs - 1) == 0):
        return _decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, max_len, partition_size)
    return _decode_torch(q, k_cache, v_cache, block_tables, seq_lens, scale, max_len)


def _decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor, scale: float, max_len: int) -> torch.Tensor:
    """Reference: gather the row's blocks, masked softmax in fp32. Sync-free (graph capturable)."""
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = hq // hkv
    nblk = max(1, -(-max_len // bs))
    lens = seq_lens.to(torch.int64)
    cols = torch.arange(nblk, device=q.device)
    used = cols[None, :] * bs < lens[:, None]  # never dereference table entries past the row's last block
    bt = torch.where(used, block_tables[:, :nblk].to(torch.int64), 0)
    pos = torch.arange(nblk * bs, device=q.device)
    valid = (pos[None, :] < lens[:, None]) & (pos[None, :] < max_len)  # [B, L]
    k = k_cache[bt].reshape(b, nblk * bs, hkv, d).float()
    v = v_cache[bt].reshape(b, nblk * bs, hkv, d).float()
    v = torch.where(valid[:, :, None, None], v, 0.0)  # unused slots may hold NaN/garbage
    qf = q.float().view(b, hkv, group, d)
    s = torch.einsum("bkgd,blkd->bkgl", qf, k) * scale
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    o = torch.einsum("bkgl,blkd->bkgd", p, v) / torch.where(denom > 0, denom, 1.0)
    return o.reshape(b, hq, d).to(q.dtype)


@triton.jit
def _combine_splits(
    m_ptr, l_ptr, acc_ptr, o_ptr, b, hq, hmask, n_live, num_heads, num_splits, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, HEADS: tl.constexpr, SPLIT_TILE: tl.constexpr,
):  # fmt: skip
    """Combine the first ``n_live`` split partials of q heads ``hq`` (``[HEADS]``) of row b with weights
    2^(m_s - max m) and store the normalised output; a row with no live split gives 0.

    Shared by the reduce kernel (one head per program) and the fused last-program tail (a group of
    heads), so both give the same bits: the max is exact in any order, and the sums run split by split
    in a fixed order with elementwise ops only (``tl.sum`` would reduce in a layout-dependent tree that
    can differ between the two kernels' warp counts). The inner ``static_range`` unrolls SPLIT_TILE
    independent loads so they are in flight together. Splits past ``n_live`` start at or after seq_len:
    they hold no partials and are never read. Loads use ``.cg`` (L2): in the fused tail the partials
    were written by other programs, possibly on other SMs.
    """
    d = tl.arange(0, D_PAD)
    base = (b * num_heads + hq) * num_splits  # [HEADS]
    offs = tl.arange(0, SPLIT_TILE)
    m_tile = tl.full([HEADS, SPLIT_TILE], float("-inf"), dtype=tl.float32)
    for s0 in range(0, n_live, SPLIT_TILE):
        sm = hmask[:, None] & (s0 + offs < n_live)[None, :]
        m_s = tl.load(m_ptr + base[:, None] + s0 + offs[None, :], mask=sm, other=float("-inf"),
                      cache_modifier=".cg")  # fmt: skip
        m_tile = tl.maximum(m_tile, m_s)
    m_g = tl.max(m_tile, axis=1)
    m_g = tl.where(m_g == float("-inf"), 0.0, m_g)  # [HEADS]
    l_tot = tl.zeros([HEADS], dtype=tl.float32)
    o = tl.zeros([HEADS, D_PAD], dtype=tl.float32)
    for s0 in range(0, n_live, SPLIT_TILE):
        for j in tl.static_range(SPLIT_TILE):
            s = s0 + j
            sm = hq < tl.where(s < n_live, num_heads, 0)  # no scalar & tensor (interpreter)
            m_s = tl.load(m_ptr + base + s, mask=sm, other=float("-inf"), cache_modifier=".cg")
            l_s = tl.load(l_ptr + base + s, mask=sm, other=0.0, cache_modifier=".cg")
            a_s = tl.load(acc_ptr + (base + s)[:, None] * D_PAD + d[None, :], mask=sm[:, None], other=0.0,
                          cache_modifier=".cg")  # fmt: skip
            w = tl.exp2(m_s - m_g)
            l_tot += l_s * w
            o += a_s * w[:, None]
    o = o / tl.where(l_tot > 0, l_tot, 1.0)[:, None]
    o_offs = b * stride_ob + hq[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=hmask[:, None] & (d < HEAD_DIM)[None, :])


@triton.jit
def _decode_partial_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, o_ptr, cnt_ptr,
    qk_scale, max_len, partition, num_splits,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_btb,
    stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, TILE: tl.constexpr, HEADS: tl.constexpr, NUM_STAGES: tl.constexpr,
    SINGLE: tl.constexpr, FUSED: tl.constexpr, SPLIT_TILE: tl.constexpr,
):  # fmt: skip
    """Program (b, head group g, split s): online softmax of q heads [g*HEADS, (g+1)*HEADS) of row b over
    positions [s*partition, (s+1)*partition) (clipped to seq_len), TILE tokens per iteration.

    A tile may span several KV blocks: each token's block id is gathered from the block table (masked
    to valid positions, so entries past seq_len are never read) and the K and V tiles
    ``[TILE, HEADS, D]`` are both issued before the math. With SINGLE (one split) the normalised output
    is stored directly; otherwise the running max (log2 domain), the sum and the unnormalised fp32
    accumulator go to the partial buffers. An empty split (start >= seq_len: most of them when max_len
    is the graph's capacity) loads no q and stores no partials (the combine reads live splits only).

    Without FUSED the reduce kernel combines the partials. With FUSED each live split of (b, g) then
    takes a ticket from the group's counter (``cnt_ptr[b * groups + g]``, zero at launch); every
    program derives the number of live splits from the same seq_len, so the one that draws the last
    ticket knows all partials are stored: it combines them and puts the counter back to 0 for the next
    launch (or graph replay). Empty splits take no ticket and exit at once (with max_len the graph's
    capacity most programs are empty, and an atomic round trip each cost more than the reduce launch
    saved at batch 8+); a row with seq_len 0 lets split 0 take the one ticket and write its zeros.
    The barrier makes every thread's partial stores precede the releasing atomic (issued by one
    thread); the atomic's acquire side plus the barrier that broadcasts its result order the last
    program's loads after the other programs' stores (the threadfence-reduction pattern).
    """
    b = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.minimum(tl.load(lens_ptr + b), max_len)
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_DIM
    hq = g * HEADS + tl.arange(0, HEADS)
    hmask = hq < NUM_HEADS
    start = s * partition
    live = hq < tl.where(start < seq_len, NUM_HEADS, 0)  # hmask, empty for an empty split
    kvh = (hq // GROUP).to(tl.int64)
    qmask = hmask[:, None] & dmask[None, :]
    q_offs = b * stride_qb + hq[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=live[:, None] & dmask[None, :], other=0.0)
    q = q.to(tl.float32) * qk_scale  # [HEADS, D_PAD]
    end = tl.minimum(start + partition, seq_len)
    m_i = tl.full([HEADS], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([HEADS], dtype=tl.float32)
    acc = tl.zeros([HEADS, D_PAD], dtype=tl.float32)
    offs = tl.arange(0, TILE)
    hd_mask = hmask[:, None] & dmask[None, :]
    k_hd = (kvh[:, None] * stride_kh + d[None, :])[None, :, :]  # [1, HEADS, D_PAD]
    v_hd = (kvh[:, None] * stride_vh + d[None, :])[None, :, :]
    for t0 in tl.range(start, end, TILE, num_stages=NUM_STAGES):  # every tile holds a valid position
        pos = t0 + offs
        valid = pos < end
        blk = tl.load(bt_ptr + b * stride_btb + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        tok = (pos % BLOCK_SIZE).to(tl.int64)
        kv_mask = valid[:, None, None] & hd_mask[None, :, :]
        k_row = (blk * stride_kb + tok * stride_kt)[:, None, None]
        v_row = (blk * stride_vb + tok * stride_vt)[:, None, None]
        k = tl.load(k_ptr + k_row + k_hd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + v_row + v_hd, mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :, :], axis=2)  # [TILE, HEADS]
        qk = tl.where(valid[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[None, :])
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    if SINGLE:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_offs = b * stride_ob + hq[:, None] * stride_oh + d[None, :]
        tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=qmask)
    else:
        idx = (b * NUM_HEADS + hq) * num_splits + s  # [HEADS]
        tl.store(m_ptr + idx, m_i, mask=live)
        tl.store(l_ptr + idx, l_i, mask=live)
        tl.store(acc_ptr + idx[:, None] * D_PAD + d[None, :], acc, mask=live[:, None])
        # live splits take tickets; so does split 0 of a row with none (seq_len 0), to write its zeros
        n_live = (seq_len + partition - 1) // partition
        n_tickets = tl.maximum(n_live, 1)
        if FUSED and s < n_tickets:
            cnt = cnt_ptr + b * tl.num_programs(1) + g
            tl.debug_barrier()  # all threads' partial stores before the (single-thread) release
            ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if ticket == n_tickets - 1:  # every other live split of (b, g) has stored its partials
                _combine_splits(
                    m_ptr, l_ptr, acc_ptr, o_ptr, b, hq, hmask, n_live, NUM_HEADS, num_splits,
                    stride_ob, stride_oh, HEAD_DIM=HEAD_DIM, D_PAD=D_PAD, HEADS=HEADS, SPLIT_TILE=SPLIT_TILE,
                )  # fmt: skip
                tl.store(cnt, 0)  # ready for the next launch: no other program of (b, g) is left


@triton.jit
def _decode_reduce_kernel(
    m_ptr, l_ptr, acc_ptr, o_ptr, lens_ptr, max_len, partition, num_splits, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLIT_TILE: tl.constexpr,
):  # fmt: skip
    """Program (b, h): combine the live split partials of head h (``_combine_splits``); empty rows give 0."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.minimum(tl.load(lens_ptr + b), max_len)
    n_live = (seq_len + partition - 1) // partition
    hq = h + tl.arange(0, 1)
    num_heads = tl.num_programs(1)
    _combine_splits(
        m_ptr, l_ptr, acc_ptr, o_ptr, b, hq, hq < num_heads, n_live, num_heads, num_splits,
        stride_ob, stride_oh, HEAD_DIM=HEAD_DIM, D_PAD=D_PAD, HEADS=1, SPLIT_TILE=SPLIT_TILE,
    )  # fmt: skip


@dataclass(frozen=True)
class DecodeConfig:
    """Tuning knobs of the Triton decode kernel (see ``_decode_triton``).

    ``target_programs``: the partition policy; the partition (tokens per split) is the largest power of
    two in ``_PARTITIONS`` that still gives about this many programs (0: always one split).
    ``fused_reduce``: with several splits, combine them in the partial kernel's last program per head
    group instead of a second (reduce) launch; same output bits, one launch less (see
    ``_decode_partial_kernel``). Off by default so tuned files written before it keep their meaning.
    """

    tile_tokens: int = 32
    heads_per_program: int = 1
    num_warps: int = 4
    num_stages: int = 1
    target_programs: int = _TARGET_PROGRAMS
    single_launch: bool = True
    partition_size: int | None = None  # fixed split-K partition (tokens); None: the policy above
    fused_reduce: bool = False  # several splits: the last program of each head group reduces (one launch)


# Default knobs keyed by (max batch, max covered length): the first row whose bounds hold is used.
# The code default where no tuned table applies (``rltbench tune attention`` measures a GPU's).
_DECODE_DEFAULTS: tuple[tuple[int, int, DecodeConfig], ...] = (
    (1 << 30, 1 << 30, DecodeConfig()),
)


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(DecodeConfig))


DecodeRows = tuple[tuple[int, int, DecodeConfig], ...]


@tuned.register
@dataclass(frozen=True)
class DecodeTable:
    """The GPU's tuned rows (``rltbench tune attention`` writes them): [{"max_batch", "max_len",
    knobs...}, ...] in lookup order, read once; None where there are none or they do not parse (a
    broken table falls back to the built-in one rather than stopping a run)."""

    SECTION = "decode_attention"
    rows: DecodeRows | None = None

    @classmethod
    def from_section(cls, value: object) -> DecodeTable:
        if not isinstance(value, list):
            return cls()
        try:
            return cls(tuple(
                (int(r["max_batch"]), int(r["max_len"]),
                 DecodeConfig(**{k: r[k] for k in r if k in _CONFIG_FIELDS}))
                for r in value
            ))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return cls()


def decode_config(batch: int, num_heads: int, max_len: int) -> DecodeConfig:
    """The knobs for a decode call of this shape (deterministic per shape): the first row of the
    GPU's tuned table (else the built-in one) whose bounds hold."""
    del num_heads  # the table is keyed by batch and length only (for now)
    for max_b, max_l, cfg in tuned.config(DecodeTable).rows or _DECODE_DEFAULTS:
        if batch <= max_b and max_len <= max_l:
            return cfg
    return DecodeConfig()


def choose_partition_size(
    batch: int,
    num_heads: int,
    max_len: int,
    heads_per_program: int = 1,
    target_programs: int = _TARGET_PROGRAMS,
) -> int:
    """Largest split-K partition (tokens) that still gives about ``target_programs`` programs; small
    batches get short partitions (more parallelism), large batches long ones (fewer partials, and one
    split -- a single launch without the reduce kernel -- once a partition covers ``max_len``)."""
    groups = batch * -(-num_heads // heads_per_program)
    cap = max(_PARTITIONS[-1], triton.next_power_of_2(max(1, max_len)))
    for p in _PARTITIONS:
        if p <= cap and groups * max(1, -(-max_len // p)) >= target_programs:
            return p
    return _PARTITIONS[-1]


def _decode_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, max_len: int, partition_size: int | None,
    *,
    tile_tokens: int | None = None,
    heads_per_program: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    target_programs: int | None = None,
    single_launch: bool | None = None,
    fused_reduce: bool | None = None,
) -> torch.Tensor:
    """Launch the partial kernel (+ the reduce kernel when there is more than one split, unless fused).

    Knobs left as None come from ``decode_config(B, Hq, max_len)``; the benchmark sweep
    (rltbench tune attention) sets them explicitly. ``partition_size`` (power of two >= 16) overrides the
    partition policy (``target_programs``); a partition >= ``max_len`` gives one split, and with
    ``single_launch`` that split writes the output itself (no reduce kernel). With ``fused_reduce`` and
    several splits, the last program of each head group combines the splits (same bits as the reduce
    kernel) using the device's split counters (``_split_counters``).
    """
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    cfg = decode_config(b, hq, max_len)
    tile_tokens = cfg.tile_tokens if tile_tokens is None else tile_tokens
    heads = cfg.heads_per_program if heads_per_program is None else heads_per_program
    num_warps = cfg.num_warps if num_warps is None else num_warps
    num_stages = cfg.num_stages if num_stages is None else num_stages
    target = cfg.target_programs if target_programs is None else target_programs
    single_launch = cfg.single_launch if single_launch is None else single_launch
    fused_reduce = cfg.fused_reduce if fused_reduce is None else fused_reduce
    for name, val in (("tile_tokens", tile_tokens), ("heads_per_program", heads)):
        if val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {val}")
    if partition_size is None and target_programs is None:
        partition_size = cfg.partition_size  # a tuned fixed partition, unless the caller set a policy
    if partition_size is None:
        partition_size = choose_partition_size(b, hq, max_len, heads, target)
    if partition_size < 16 or partition_size & (partition_size - 1):
        raise ValueError(f"partition_size must be a power of two >= 16, got {partition_size}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim for the Triton kernel")
    if not seq_lens.is_contiguous():
        raise ValueError("seq_lens must be contiguous for the Triton kernel")
    if bs & (bs - 1):
        raise ValueError(f"the Triton decode kernel needs a power-of-two block_size, got {bs}")
    d_pad = triton.next_power_of_2(d)
    heads = min(heads, triton.next_power_of_2(hq))
    tile = min(tile_tokens, partition_size)
    num_splits = max(1, -(-max_len // partition_size))
    single = single_launch and num_splits == 1
    groups = -(-hq // heads)
    fused = bool(fused_reduce) and not single
    out = torch.empty_like(q)
    if single:
        m = l_ = acc = out  # unused by the kernel
    else:
        m = torch.empty((b, hq, num_splits), dtype=torch.float32, device=q.device)
        l_ = torch.empty_like(m)
        acc = torch.empty((b, hq, num_splits, d_pad), dtype=torch.float32, device=q.device)
    cnt = _split_counters(q.device, b * groups) if fused else out  # unused unless fused
    _decode_partial_kernel[(b, groups, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, m, l_, acc, out, cnt,
        float(scale) * _LOG2E, max_len, partition_size, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        NUM_HEADS=hq, GROUP=hq // hkv, BLOCK_SIZE=bs, HEAD_DIM=d, D_PAD=d_pad, TILE=tile, HEADS=heads,
        NUM_STAGES=num_stages, SINGLE=single, FUSED=fused, SPLIT_TILE=_REDUCE_SPLIT_TILE,
        num_warps=num_warps,
    )  # fmt: skip
    if not (single or fused):
        _decode_reduce_kernel[(b, hq)](
            m, l_, acc, out, seq_lens, max_len, partition_size, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=d, D_PAD=d_pad, SPLIT_TILE=_REDUCE_SPLIT_TILE, num_warps=4,
        )  # fmt: skip
    return out


# Split counters of the fused reduce, per device: int32 zeros that every fused launch leaves zero.
# Smaller buffers are kept (never freed) when one grows: a captured CUDA graph may still point at them.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}
_MIN_COUNTERS = 1 << 14


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 counters on ``device``, all zero between fused decode launches.

    Cached rather than ``torch.zeros`` per call (a memset launch would cost what fusing saves): each
    launch's last programs put their counters back to 0, so the buffer is clean at every call and
    graph replay. Keyed by device only, because capture runs on its own stream: two fused decode
    launches running *concurrently* on different streams of one device would share counters and give
    wrong results; the engine runs its decode on one stream, so launches never overlap. A launch that
    dies mid-way (e.g. a device fault) leaves the counters dirty; ``reset_split_counters`` clears them.
    Allocate (first call per device, or growth) before capture if possible: during capture the
    zeroing memset becomes part of the graph (still correct, one node more).
    """
    bufs = _COUNTERS.setdefault(device, [])
    if not bufs or bufs[-1].numel() < n:
        size = max(_MIN_COUNTERS, triton.next_power_of_2(n))
        bufs.append(torch.zeros(size, dtype=torch.int32, device=device))
    return bufs[-1]


def reset_split_counters() -> None:
    """Zero every cached split counter (only needed after a fused decode launch was aborted)."""
    for bufs in _COUNTERS.values():
        for buf in bufs:
            buf.zero_()


# --------------------------------------------------------------------------------------------------
# chunked prefill attention
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillRow:
    """One row of a prefill step, resolved on the host once and shared by every KV plane."""

    start: int  # first query index in q
    end: int  # one past the last
    length: int  # cached tokens the queries attend to (context + chunk)
    blocks: torch.Tensor  # int64 [ceil(length / block_size)] block indices
    mask: torch.Tensor  # bool [n, length]: key position <= query position


def prefill_plan(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    num_queries: int,
) -> list[PrefillRow]:
    """Read a prefill step's row metadata on the host (three syncs) and build the per-row block
    indices and causal masks. The model calls attention once per KV plane (96 for Ouro-1.4B), so
    the engine builds this once per step instead of once per plane."""
    b = block_tables.shape[0]
    if query_start_loc.shape != (b + 1,) or context_lens.shape != (b,) or seq_lens.shape != (b,):
        raise ValueError(
            f"with B={b} rows expected query_start_loc [B+1], context_lens [B], seq_lens [B]; got "
            f"{tuple(query_start_loc.shape)}, {tuple(context_lens.shape)}, {tuple(seq_lens.shape)}"
        )
    qsl = query_start_loc.tolist()
    ctx = context_lens.tolist()
    lens = seq_lens.tolist()
    if qsl[0] != 0 or qsl[-1] != num_queries or any(qsl[i] > qsl[i + 1] for i in range(b)):
        raise ValueError(f"query_start_loc must rise from 0 to N={num_queries}, got {qsl}")
    rows = []
    device = block_tables.device
    for r in range(b):
        s, e = qsl[r], qsl[r + 1]
        n = e - s
        if n == 0:
            continue
        length = ctx[r] + n
        nblk = -(-length // block_size)
        if ctx[r] < 0 or length > lens[r] or nblk > block_tables.shape[1]:
            raise ValueError(
                f"row {r}: context {ctx[r]} + {n} queries exceeds seq_len {lens[r]} or its block table"
            )
        qpos = torch.arange(ctx[r], length, device=device)
        kpos = torch.arange(length, device=device)
        rows.append(
            PrefillRow(s, e, length, block_tables[r, :nblk].to(torch.int64), kpos[None, :] <= qpos[:, None])
        )
    return rows


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    plan: list[PrefillRow] | None = None,
) -> torch.Tensor:
    """Causal attention for chunked prefill (also fine for decode rows with one query).

    q ``[N, Hq, D]``: row b's queries are ``q[query_start_loc[b]:query_start_loc[b+1]]`` at positions
    ``context_lens[b] + i``; each attends to cached positions ``<=`` its own (the chunk's K/V are
    already written, so ``context_lens[b] + n_b <= seq_lens[b]``). query_start_loc int32 ``[B+1]``,
    context_lens/seq_lens int32 ``[B]``. Returns ``[N, Hq, D]`` in q's dtype. `plan` (from
    `prefill_plan`) skips the host reads when the caller attends over many planes with one step's
    metadata.

    Torch implementation (per-row gather + SDPA with an explicit causal mask); it reads the row
    metadata on the host, so it is not CUDA-graph capturable (prefill is never captured).
    """
    nb, bs, hkv, d = _check_cache(k_cache, v_cache)
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv != 0:
        raise ValueError(f"q must be [N, Hq, {d}] with Hq a multiple of {hkv}, got {tuple(q.shape)}")
    if plan is None:
        plan = prefill_plan(block_tables, seq_lens, query_start_loc, context_lens, bs, q.shape[0])
    hq = q.shape[1]
    out = torch.zeros_like(q)
    for row in plan:
        nblk = row.blocks.shape[0]
        k = k_cache[row.blocks].reshape(nblk * bs, hkv, d)[: row.length]
        v = v_cache[row.blocks].reshape(nblk * bs, hkv, d)[: row.length]
        qh = q[row.start : row.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        kh = k.transpose(0, 1).unsqueeze(0)
        vh = v.transpose(0, 1).unsqueeze(0)
        if hq != hkv:
            kh = kh.repeat_interleave(hq // hkv, dim=1)
            vh = vh.repeat_interleave(hq // hkv, dim=1)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=row.mask, scale=scale)
        out[row.start : row.end] = o[0].transpose(0, 1)
    return out
