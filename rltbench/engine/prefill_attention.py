"""Chunked, causal, paged prefill attention in one Triton launch that reads every row's metadata on
the device, so one CUDA graph serves every step of a token-count bucket.

Why a second prefill implementation: ``attention.paged_prefill_attention`` needs a host-side per-row
plan (row bounds, block lists, masks), so a step's shapes fix the graph and session prefill (unique
shapes) runs eagerly. Here the grid depends only on host shapes (``N``, ``B``, ``Hq``) and each
program finds its row and query tile on the device, so the metadata may change between graph replays
as long as the tensors keep their shapes.

Work split (the tile-offset trick of vLLM's unified Triton attention): row ``r``'s query tiles get
program ids starting at ``qsl[r] // BLOCK_M + r``; these offsets rise strictly with ``r`` and leave
room for ``ceil(n_r / BLOCK_M)`` tiles per row, so ``cdiv(N, BLOCK_M) + B`` programs per head cover
every step that fits ``N`` tokens. A program binary-searches ``query_start_loc`` for its row; surplus
programs either exit (a row's spare slot) or write the zeros of the trailing padding tokens
``[qsl[B], N)``, so the output needs no memset and every element is written by exactly one program.

Per program (row, query tile, q head): flash-attention online softmax in fp32 (log2 domain), ``tl.dot``
on the input dtype's tiles, keys gathered through the block table ``BLOCK_N`` at a time. Key tiles
that every query of the tile sees in full run without a mask; only the tiles on the diagonal (and a
ragged row end) are masked, and the loop stops at the tile's last query position. Fixed tiles and
loop order, no atomics: the same inputs give the same bits on every call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rltbench.engine.attention import _check_cache
from rltbench.kernels.rounding import interpret_mode

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class PrefillAttentionConfig:
    """Launch knobs of the kernel. ``block_m`` queries and ``block_n`` keys per tile (powers of two,
    >= 16 for ``tl.dot``); the grid is ``cdiv(N, block_m) + B`` programs per head. Results depend on
    the config (tile order of the fp32 sums), so an engine keeps one config for every call."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3


def prefill_attention_config(dtype: torch.dtype, head_dim: int) -> PrefillAttentionConfig:
    """The default knobs for a dtype and head dim (a pure function of both, so every call of an
    engine, and therefore every graph bucket, uses the same tiling).

    16-bit inputs with ``D <= 128`` (Ouro, Huginn): 128 x 64 tiles, two warpgroups (one 64-row wgmma
    each), K/V gathered by cp.async two tiles ahead (num_stages 3: 2 x 2 x 16 KiB + 32 KiB of Q at
    D=128; 194 registers, no spills on sm_90). Wider heads and fp32 (fp32 models, tests) take smaller
    tiles so registers and shared memory still fit.
    """
    d_pad = triton.next_power_of_2(head_dim)
    if dtype == torch.float32:
        return PrefillAttentionConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if d_pad > 128:
        return PrefillAttentionConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    return PrefillAttentionConfig()


@triton.jit
def _find_row(qsl_ptr, pid, num_rows, BLOCK_M: tl.constexpr):
    """The last row ``r`` whose first tile slot ``qsl[r] // BLOCK_M + r`` is ``<= pid`` (binary search
    over strictly rising offsets; row 0's is 0, so one always exists)."""
    lo = 0
    hi = num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(qsl_ptr + mid) // BLOCK_M + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_tile(ptrs, rows_ok, cols_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, masking rows and/or padded head-dim columns only where the shape needs it
    (an unmasked load keeps the full-tile path free of per-element predicates)."""
    if MASK_ROWS and MASK_COLS:
        t = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
    elif MASK_ROWS:
        t = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    elif MASK_COLS:
        t = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
    else:
        t = tl.load(ptrs)
    return t


@triton.jit
def _dot(a, b, acc, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``acc + a @ b`` with fp32 accumulation. WIDEN (the CPU interpreter with 16-bit inputs, whose
    dot multiplies bf16 bit patterns as integers) widens both operands to fp32 first: exact, and the
    products a 16-bit MMA forms are exact too, so only the summation order differs from the GPU."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _attend_key_tile(
    q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_k, kvh_v, start, kv_end, qpos, d, dmask, qk_scale,
    stride_kb, stride_kt, stride_vb, stride_vt,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, MASK_COLS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over keys ``[start, start + BLOCK_N)`` of the row.

    Each key's block comes from the row's block table (``bt_row[pos // BLOCK_SIZE]``), so a tile may
    span several cache blocks. Unmasked (MASKED off), every key is below ``kv_end`` and visible to
    every query of the tile. Masked, keys at or past ``kv_end`` are not loaded (table entries past the
    row's last block are never read) and a query sees keys ``<= `` its own position. Both variants run
    the same arithmetic on visible scores, so a query's result does not depend on which loop served a
    key tile. Every query row sees key 0 in the first tile, so the running max is finite from then on.
    """
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        kmask = offs_n < kv_end
        blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=kmask, other=0).to(tl.int64)
    else:
        kmask = offs_n >= 0  # unused by the unmasked loads
        blk = tl.load(bt_row + offs_n // BLOCK_SIZE).to(tl.int64)
    tok = (offs_n % BLOCK_SIZE).to(tl.int64)
    k_rows = blk * stride_kb + tok * stride_kt + kvh_k
    v_rows = blk * stride_vb + tok * stride_vt + kvh_v
    k = _load_tile(k_ptr + k_rows[:, None] + d[None, :], kmask, dmask, MASKED, MASK_COLS)
    v = _load_tile(v_ptr + v_rows[:, None] + d[None, :], kmask, dmask, MASKED, MASK_COLS)
    s = _dot(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32), DOT_PRECISION, WIDEN)
    if MASKED:
        visible = (offs_n[None, :] <= qpos[:, None]) & kmask[None, :]
        s = tl.where(visible, s, float("-inf"))
    # scale after the max (exact: rounding is monotonic) so both variants form s * scale - m alike
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    acc = _dot(p.to(v.dtype), v, acc, DOT_PRECISION, WIDEN)
    return acc, m_new, l_i


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, bt_ptr, qsl_ptr, ctx_ptr,
    qk_scale, num_rows, num_tokens,
    stride_qn, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_on, stride_oh, stride_btb,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN: tl.constexpr,
):  # fmt: skip
    """Program (q head, tile slot): one query tile of one row, or the zeros of padding tokens.

    Slots ``[0, qsl[B] // BLOCK_M + B)`` belong to rows (``_find_row``); a slot past its row's last
    tile exits. Slots from ``qsl[B] // BLOCK_M + B`` on walk the padding tokens ``[qsl[B], N)`` one
    tile each and store zeros (there are ``cdiv(N, BLOCK_M) - qsl[B] // BLOCK_M`` of them, exactly
    enough). For a real tile, queries at positions ``ctx + m0 .. ctx + m0 + BLOCK_M - 1`` attend to
    keys ``[0, kv_end)``: full key tiles below ``ctx + m0 + 1`` unmasked, the rest masked.

    Heads are the fast grid axis and slots run in reverse, so the CTAs launch longest-first (a
    row's last tiles see the most keys) and the heads of one tile, which read the same key range of
    the same row, run together (GQA heads even share their K/V in L2).
    """
    h = tl.program_id(0)
    pid = tl.num_programs(1) - 1 - tl.program_id(1)  # heavy (late, long-context) tiles launch first
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_DIM
    MASK_COLS: tl.constexpr = HEAD_DIM != D_PAD
    offs_m = tl.arange(0, BLOCK_M)
    total = tl.load(qsl_ptr + num_rows)
    row_slots = total // BLOCK_M + num_rows
    if pid >= row_slots:  # a padding-token tile: zeros
        tok = (total // BLOCK_M + pid - row_slots) * BLOCK_M + offs_m
        pad = (tok >= total) & (tok < num_tokens)
        o_offs = tok.to(tl.int64)[:, None] * stride_on + h * stride_oh + d[None, :]
        zeros = tl.zeros([BLOCK_M, D_PAD], dtype=o_ptr.dtype.element_ty)
        tl.store(o_ptr + o_offs, zeros, mask=pad[:, None] & dmask[None, :])
        return
    row = _find_row(qsl_ptr, pid, num_rows, BLOCK_M)
    q_start = tl.load(qsl_ptr + row)
    n = tl.load(qsl_ptr + row + 1) - q_start
    m0 = (pid - (q_start // BLOCK_M + row)) * BLOCK_M
    if m0 >= n:  # the row's spare slot (or a padding row with no queries)
        return
    ctx = tl.load(ctx_ptr + row)
    mvalid = m0 + offs_m < n
    qpos = ctx + m0 + offs_m
    tok = (q_start + m0 + offs_m).to(tl.int64)
    q = _load_tile(
        q_ptr + tok[:, None] * stride_qn + h * stride_qh + d[None, :], mvalid, dmask, True, MASK_COLS
    )
    kvh = h // GROUP
    kvh_k = kvh * stride_kh
    kvh_v = kvh * stride_vh
    bt_row = bt_ptr + row.to(tl.int64) * stride_btb
    kv_end = ctx + tl.minimum(m0 + BLOCK_M, n)  # one past the tile's last query position
    full_end = (ctx + m0 + 1) // BLOCK_N * BLOCK_N  # key tiles every query of the tile sees whole
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for start in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_k, kvh_v, start, kv_end, qpos, d, dmask, qk_scale,
            stride_kb, stride_kt, stride_vb, stride_vt,
            BLOCK_SIZE, BLOCK_N, False, MASK_COLS, DOT_PRECISION, WIDEN,
        )  # fmt: skip
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_key_tile(
            q, acc, m_i, l_i, k_ptr, v_ptr, bt_row, kvh_k, kvh_v, start, kv_end, qpos, d, dmask, qk_scale,
            stride_kb, stride_kt, stride_vb, stride_vt,
            BLOCK_SIZE, BLOCK_N, True, MASK_COLS, DOT_PRECISION, WIDEN,
        )  # fmt: skip
    o = acc / l_i[:, None]
    o_offs = tok[:, None] * stride_on + h * stride_oh + d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=mvalid[:, None] & dmask[None, :])


def _check_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                query_start_loc: torch.Tensor, context_lens: torch.Tensor) -> None:
    """Shape, dtype and layout checks on host attributes only (no device reads)."""
    _, _, hkv, d = _check_cache(k_cache, v_cache)
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv != 0:
        raise ValueError(f"q must be [N, Hq, {d}] with Hq a multiple of {hkv}, got {tuple(q.shape)}")
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} must match the cache dtype {k_cache.dtype}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be int32 [B, W], got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    b = block_tables.shape[0]
    if query_start_loc.shape != (b + 1,) or context_lens.shape != (b,):
        raise ValueError(
            f"with B={b} rows expected query_start_loc [B+1] and context_lens [B], got "
            f"{tuple(query_start_loc.shape)} and {tuple(context_lens.shape)}"
        )
    for name, t in (("query_start_loc", query_start_loc), ("context_lens", context_lens)):
        if t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 tensor, got {t.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    for name, t in (("query_start_loc", query_start_loc), ("context_lens", context_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")


def paged_prefill_attention_varlen(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    config: PrefillAttentionConfig | None = None,
) -> torch.Tensor:
    """Causal attention of a chunked-prefill step over the paged cache, with no host reads.

    q ``[N, Hq, D]``; k_cache/v_cache ``[num_blocks, block_size, Hkv, D]`` (``Hq % Hkv == 0``: q head
    h reads KV head ``h // (Hq // Hkv)``); block_tables int32 ``[B, W]``; query_start_loc int32
    ``[B+1]`` rising from 0 with ``query_start_loc[B] <= N``; context_lens int32 ``[B]``. Row b's
    queries ``q[qsl[b]:qsl[b+1]]`` sit at positions ``context_lens[b] + i`` and attend to cached
    positions ``0 .. own`` (their K/V already written through the block table, which must cover them).
    Rows with no queries (repeated qsl entries) and the tokens ``[qsl[B], N)`` are padding: their
    output is 0. Returns a new contiguous ``[N, Hq, D]`` tensor in q's dtype; softmax in fp32.

    The launch depends only on ``N``, ``B``, ``Hq``, the cache's shape and ``config`` (default
    ``prefill_attention_config``), so a captured call replays correctly after the metadata tensors
    are rewritten in place. Deterministic: same inputs, same bits. fp32 inputs use IEEE fp32 dots.
    """
    _check_args(q, k_cache, v_cache, block_tables, query_start_loc, context_lens)
    n_tok, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    b = block_tables.shape[0]
    out = torch.empty((n_tok, hq, d), dtype=q.dtype, device=q.device)
    if n_tok == 0 or hq == 0:
        return out
    if b == 0:
        return out.zero_()
    cfg = config or prefill_attention_config(q.dtype, d)
    for name, val in (("block_m", cfg.block_m), ("block_n", cfg.block_n)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    grid = (hq, triton.cdiv(n_tok, cfg.block_m) + b)
    _prefill_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start_loc, context_lens,
        float(scale) * _LOG2E, b, n_tok,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=hq // hkv, BLOCK_SIZE=bs, HEAD_DIM=d, D_PAD=triton.next_power_of_2(d),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_PRECISION="ieee",
        WIDEN=interpret_mode() and q.dtype != torch.float32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def prefill_attention_flops(
    query_start_loc_host: list[int], context_lens_host: list[int], heads: int, head_dim: int
) -> float:
    """Causal FLOPs of one prefill step's attention (QK^T and PV, 2 FLOPs per multiply-add): query i
    of a row with context c sees ``c + i + 1`` keys, so a row of n queries costs
    ``4 * heads * head_dim * (n * c + n * (n + 1) / 2)``. Masked-out work is not counted, so the
    TFLOP/s figure it gives is the useful rate."""
    if len(query_start_loc_host) != len(context_lens_host) + 1:
        raise ValueError(
            f"query_start_loc has {len(query_start_loc_host)} entries, expected len(context_lens) + 1 = "
            f"{len(context_lens_host) + 1}"
        )
    pairs = 0
    for r, c in enumerate(context_lens_host):
        n = query_start_loc_host[r + 1] - query_start_loc_host[r]
        pairs += n * c + n * (n + 1) // 2
    return 4.0 * heads * head_dim * pairs
