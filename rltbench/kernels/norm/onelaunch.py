"""Exact RMSNorm in ONE launch: the sum of squares is added in torch CUDA's own order.

The 3-launch exact norm (exact.py) lets torch compute ``x.float().pow(2).mean(-1)``. Here one Triton
program per row adds the fp32 squares in the order torch_order.py specifies (read from Reduce.cuh;
docs/onelaunch_norm.md), then runs the same forced-rounding epilogue. The order depends on
``lanes`` = the threads torch gives a row (its ``step_input``, in 4-element vectors), on the row's
16-byte alignment in torch's fp32 temporary and on the warp-shuffle order:

* lane l owns vectors k = l, l + lanes, ...; it keeps 4 accumulators (one per vector element), fed
  its vectors in order;
* a row that does not start on a 16-byte boundary (row*N % 4 = s > 0): its first 4 - s elements go
  to lanes s..3, accumulator 0, before the loop; the last (N - head) % 4 elements to lanes 0..,
  accumulator 0, after it;
* each lane combines ((a0 + a1) + a2) + a3;
* the shared-memory part of block_x_reduce halves the lanes (v[i] += v[i + h]) down to 32, then the
  warp shuffles: halving again (torch >= 2.10) or adjacent pairs (older torch);
* mean = sum * factor, factor = float(T) / float(T * N) (MeanOps::project).

Two layouts of the same adds (OneLaunchConfig.layout, config.py):

* ``lowwarp`` (the default): a program of NW warps holds torch lane ``l = r * 32 NW + h * NW + w``
  in warp w, hardware lane h, registers r, four columns each. torch's tree halves by the highest
  lane bit first, so it runs as the in-thread levels over r, a warp butterfly over h (xor 16 .. 1)
  and the levels over w last: one shared-memory exchange per reduction. The tile is flat
  ([R * NW * 32, 4], row m = r * 32 NW + w * 32 + h), which every Triton lays out with m's low five
  bits on the lanes; on it Triton's own ``tl.sum`` over the (h, w) partials is that butterfly
  (``tree="tl_sum"``, GPU; the SASS test checks the shuffle sequence), else explicit size-2
  halvings (one add each, any layout). Rows must be 16-byte aligned (width % 4 == 0), 32..512 lanes
  with torch's halving warp order, at most MAX_ITERS vectors per lane (MAX_ONE_PASS_ITERS for a row
  kept in registers; longer rows take the two-pass form).
* ``general``: lanes as one flat ``[TILE, 4]`` axis, the head and tail lanes, both warp orders, a
  sequential loop: every plan torch_order reproduces.

Adding an exact 0 never changes an fp32 sum, so masked/absent elements (and tile lanes past
``lanes``) are added as zeros. Every multiply and accumulation add uses the forced-rounding helpers
(no FMA contraction); tree adds are size-2 ``tl.sum`` (one add, nothing to contract). The kernels
are trusted only after validate.py compared them with torch on this GPU and torch version
(`is_trusted`); a layout whose validation fails is taken off that key and the general layout is
validated in its place. They read only rows of the Triton specialisation that validation covers:
16-byte aligned pointers, row strides as divisible by 16 as the width (`layout_reason`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels.layout import row_stride, rows_view
from rltbench.kernels.norm.config import OneLaunchConfig
from rltbench.kernels.norm.torch_order import WARP_DOWN, WARP_ORDERS, mean_factor, plan_for
from rltbench.kernels.norm.validate import (
    CaseCounts,
    Key,
    NormKernels,
    Trust,
    ValidationResult,
    run_cases,
    validation_key,
)
from rltbench.kernels.rounding import (
    DTYPE_CODES,
    add_rn,
    dtype_code,
    interpret_mode,
    load_f32,
    mul_rn,
    packed_rn,
    round_to,
    rsqrt_torch,
    store_f32,
)

FORMS = ("ouro", "huginn")
MODE_X, MODE_ADD, MODE_NORM_ADD = 0, 1, 2
MAX_LANES = 512   # torch's MAX_NUM_THREADS for float reductions: the widest row plan
OUT_CHUNK_PER_WARP = 1024   # two-pass output: columns per warp per chunk (32 per thread)
# the two-pass add form (x + branch; fp32 rows, or 16-bit rows with OneLaunchConfig.wide_registers
# off, since the held kernel serves them) of rows wider than the several-rows kernel takes, from
# ADD_OUT_CHUNK_MIN_ROWS rows: chunks of 4096 columns per warp, so a Huginn row (5280) is written in
# two round trips instead of six. In an H200 side comparison this was faster beyond the A/A spread
# at 2048 and 4096 rows, not below 2048 rows nor for the plain form (docs/onelaunch_norm.md)
ADD_OUT_CHUNK_PER_WARP = 4096
ADD_OUT_CHUNK_MIN_ROWS = 2048
ROWS_MAX_WIDTH = 2 * OUT_CHUNK_PER_WARP   # the several-rows kernel loads a row's (at most two) chunks at once
MAX_ITERS = 64    # lowwarp: the two-pass unroll bound (width 5280 at 32 lanes: 42 vectors per lane)
MAX_ONE_PASS_ITERS = 16   # lowwarp: the most vectors per lane a row held in registers takes
HELD_MAX_TILE = 32   # the held kernel (wide rows at 32 lanes): vectors per lane of its largest register tile



# ----------------------------------------------------------------------------------------------
# Triton: values, the epilogue and the general layout (any plan)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _vals(x_row, b_row, r_row, w1_ptr, rstd1, cols, mask, MODE: tl.constexpr, DT: tl.constexpr,
          INTERPRET: tl.constexpr):
    """The normalised values (fp32, exactly dtype values, 0 where masked) at `cols` of one row.
    MODE 0: x;  1: round(x + b) (Huginn add form);  2: h = round(r + round(w1 * round(x * rstd1)))
    (the first norm of norm-add-norm, whose output the second norm normalises)."""
    v = load_f32(x_row + cols, mask, DT, INTERPRET)
    if MODE == 1:
        b = load_f32(b_row + cols, mask, DT, INTERPRET)
        v = round_to(add_rn(v, b, INTERPRET), DT, INTERPRET)
    elif MODE == 2:
        hn = round_to(mul_rn(v, rstd1, INTERPRET), DT, INTERPRET)
        w1 = load_f32(w1_ptr + cols, mask, DT, INTERPRET)
        y1 = round_to(mul_rn(w1, hn, INTERPRET), DT, INTERPRET)
        r = load_f32(r_row + cols, mask, DT, INTERPRET)
        v = round_to(add_rn(r, y1, INTERPRET), DT, INTERPRET)
    return v


@triton.jit
def _sq(x_row, b_row, r_row, w1_ptr, rstd1, cols, mask, MODE: tl.constexpr, DT: tl.constexpr,
        INTERPRET: tl.constexpr):
    """fp32 square of the values, exactly 0 where masked (so adding it is a no-op)."""
    v = _vals(x_row, b_row, r_row, w1_ptr, rstd1, cols, mask, MODE, DT, INTERPRET)
    return tl.where(mask, mul_rn(v, v, INTERPRET), 0.0)


@triton.jit
def _halve(s, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """One halving level: v[i] + v[i + HALF] for i < HALF. A sum over a size-2 axis is exactly one
    fp32 add per pair (commutative, so operand order is irrelevant; no multiply to contract with,
    no reassociation flags) and compiles far smaller than split/permute + inline-asm adds."""
    return tl.sum(tl.reshape(s, [2, HALF]), axis=0)


@triton.jit
def _pairs(s, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """One increasing-offset shuffle level as lane 0 sees it: v[2i] + v[2i + 1] (one add each)."""
    return tl.sum(tl.reshape(s, [HALF, 2]), axis=1)


@triton.jit
def _row_sumsq(x_row, b_row, r_row, w1_ptr, rstd1, N, shift, lanes, MODE: tl.constexpr, DT: tl.constexpr,
               INTERPRET: tl.constexpr, TILE: tl.constexpr, WARP_DOWN: tl.constexpr):
    """Sum of squares of one row in torch's CUDA order (see module docstring). shift = the fp32
    temporary's (row start address % 16) / 4; `lanes` (<= TILE, runtime) = torch's threads per
    row. Tile lanes >= `lanes` stay exactly 0, so the halving levels above `lanes` add zeros and
    change nothing: one compiled TILE serves every lanes value up to it."""
    lane = tl.arange(0, TILE)
    vec = tl.arange(0, 4)
    first = (4 - shift) % 4                      # first element of the 16-byte aligned part
    # head: lanes shift..3 take elements lane - shift into accumulator 0
    hmask = (lane >= shift) & (lane < tl.where(shift > 0, 4, 0))
    hsq = _sq(x_row, b_row, r_row, w1_ptr, rstd1, lane - shift, hmask, MODE, DT, INTERPRET)
    acc = tl.where((vec == 0)[None, :], hsq[:, None], 0.0)
    # vectorized loop: lane l adds vector k = it * lanes + l, element i into accumulator i
    nvec = (N - first) // 4
    for it in range(0, tl.cdiv(nvec, lanes)):
        k = it * lanes + lane
        cols = first + k[:, None] * 4 + vec[None, :]
        m = ((k < nvec) & (lane < lanes))[:, None] & (vec[None, :] < 4)
        acc = add_rn(acc, _sq(x_row, b_row, r_row, w1_ptr, rstd1, cols, m, MODE, DT, INTERPRET), INTERPRET)
    # tail: the (N - first) % 4 last elements to lanes 0.., accumulator 0
    rem = (N - first) - nvec * 4
    tsq = _sq(x_row, b_row, r_row, w1_ptr, rstd1, first + nvec * 4 + lane, lane < rem, MODE, DT, INTERPRET)
    acc = add_rn(acc, tl.where((vec == 0)[None, :], tsq[:, None], 0.0), INTERPRET)
    # combine the accumulators left to right: ((a0 + a1) + a2) + a3
    p, q = tl.split(tl.reshape(acc, [TILE, 2, 2]))    # p = (a0, a2), q = (a1, a3)
    a0, a2 = tl.split(p)
    a1, a3 = tl.split(q)
    s = add_rn(add_rn(add_rn(a0, a1, INTERPRET), a2, INTERPRET), a3, INTERPRET)
    # block_x_reduce: shared-memory halving down to one warp (v[i] += v[i + h], h = lanes/2 .. 32)
    if TILE >= 512:
        s = _halve(s, 256, INTERPRET)
    if TILE >= 256:
        s = _halve(s, 128, INTERPRET)
    if TILE >= 128:
        s = _halve(s, 64, INTERPRET)
    if TILE >= 64:
        s = _halve(s, 32, INTERPRET)
    # then the warp shuffles as lane 0 sees them
    if WARP_DOWN:   # offsets 16, 8, 4, 2, 1: the same halving (torch >= 2.10, pytorch#164790)
        s = _halve(s, 16, INTERPRET)
        s = _halve(s, 8, INTERPRET)
        s = _halve(s, 4, INTERPRET)
        s = _halve(s, 2, INTERPRET)
        s = _halve(s, 1, INTERPRET)
    else:           # offsets 1, 2, 4, 8, 16: adjacent pairs first (older torch)
        s = _pairs(s, 16, INTERPRET)
        s = _pairs(s, 8, INTERPRET)
        s = _pairs(s, 4, INTERPRET)
        s = _pairs(s, 2, INTERPRET)
        s = _pairs(s, 1, INTERPRET)
    return s                                     # [1]: kept a 1-element tensor (broadcasts)


@triton.jit
def _rstd(total, factor, eps, INTERPRET: tl.constexpr):
    """(mean, rsqrt(mean + eps)) as torch: mean = sum * factor, then add, then rsqrt."""
    var = mul_rn(total, factor, INTERPRET)
    return var, rsqrt_torch(add_rn(var, eps, INTERPRET), INTERPRET)


@triton.jit
def _sq_of(v, INTERPRET: tl.constexpr):
    """Squares of values already in registers. Masked elements were loaded as 0, so their square
    is +0 and adding it changes no sum (a row whose normalised values are NaN sums to NaN either
    way); no select is needed (0 + s == s: with one iteration a lane's accumulator is its square)."""
    return mul_rn(v, v, INTERPRET)


@triton.jit
def _scaled(v, w, rstd, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """round(w * round(v * rstd)): torch's (h * rstd).to(dtype), then w * that, each rounded."""
    return round_to(mul_rn(w, round_to(mul_rn(v, rstd, INTERPRET), DT, INTERPRET), INTERPRET), DT, INTERPRET)


@triton.jit
def _operand(ptrs, m, DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """A weight or residual operand of the epilogue: in its dtype for the packed epilogue, else
    fp32 (0 where masked)."""
    if PACKED:
        return tl.load(ptrs, mask=m, other=0.0)
    else:
        return load_f32(ptrs, m, DT, INTERPRET)


@triton.jit
def _out_vals(v, w, r, rstd, HAS_R: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
              PACKED: tl.constexpr):
    """One norm's output from fp32 values v: round(w * round(v * rstd)) (HAS_R: + r, rounded).
    PACKED (GPU, 16-bit dtypes): w and r in the dtype, v * rstd rounded two at a time and the
    multiply and add as packed 16-bit instructions (rounding.packed_rn: the same values), a
    dtype result; about half the instructions of the fp32 form, which matter once every SM holds
    many rows. Else fp32 operands and an fp32 result holding dtype values."""
    if PACKED:
        y = packed_rn(w, mul_rn(v, rstd, INTERPRET).to(w.dtype), "mul", DT)
        if HAS_R:
            y = packed_rn(r, y, "add", DT)
    else:
        y = _scaled(v, w, rstd, DT, INTERPRET)
        if HAS_R:
            y = round_to(add_rn(r, y, INTERPRET), DT, INTERPRET)
    return y


@triton.jit
def _store_out(ptrs, y, m, DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """Store an _out_vals result (already dtype values: the conversion is exact)."""
    if PACKED:
        tl.store(ptrs, y, mask=m)
    else:
        store_f32(ptrs, y, m, DT, INTERPRET)


@triton.jit
def _streamed(ptrs, m, DT: tl.constexpr, INTERPRET: tl.constexpr, STREAM: tl.constexpr):
    """A load of values this kernel reads for the last time or soon again from L2 (STREAM: marked
    evict-first, so they leave L2 before the lines other kernels still need), in the dtype (fp32
    values under the interpreter, whose conversions go through load_f32)."""
    if INTERPRET:
        return load_f32(ptrs, m, DT, INTERPRET)
    elif STREAM:
        return tl.load(ptrs, mask=m, other=0.0, eviction_policy="evict_first")
    else:
        return tl.load(ptrs, mask=m, other=0.0)


@triton.jit
def _store_y(ptrs, y, m, DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr,
             STREAM: tl.constexpr):
    """Store an _out_vals result: streaming (st.global.cs: this kernel never reads it again) when
    STREAM (GPU only, set by the host), else as _store_out."""
    if STREAM:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=m, cache_modifier=".cs")
    else:
        _store_out(ptrs, y, m, DT, INTERPRET, PACKED)


@triton.jit
def _widened(y, PACKED: tl.constexpr):
    """An _out_vals result as fp32 (exact), for a second sum over it."""
    if PACKED:
        return y.to(tl.float32)
    else:
        return y


@triton.jit
def _norm_out(x_row, b_row, w_ptr, r_row, out_row, rstd, cols, m, MODE: tl.constexpr, HAS_R: tl.constexpr,
              DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr, STREAM: tl.constexpr):
    """Epilogue of one norm at `cols`: round(w * round(v * rstd)) (+ round(r + y)), stored.
    STREAM (the host sets it for the GPU's plain form only, where it was measured: MODE 0 without
    a residual): the row's last read marked evict-first and the output stored streaming
    (st.global.cs): neither is read again by this kernel."""
    w = _operand(w_ptr + cols, m, DT, INTERPRET, PACKED)
    if STREAM:
        v = _streamed(x_row + cols, m, DT, INTERPRET, STREAM).to(tl.float32)
    else:
        v = _vals(x_row, b_row, x_row, w_ptr, 1.0, cols, m, MODE, DT, INTERPRET)
    r = w
    if HAS_R:
        r = _operand(r_row + cols, m, DT, INTERPRET, PACKED)
    _store_y(out_row + cols, _out_vals(v, w, r, rstd, HAS_R, DT, INTERPRET, PACKED), m, DT, INTERPRET, PACKED,
             STREAM)


@triton.jit
def _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_row, y_row, rstd1, rstd2, cols, m, DT: tl.constexpr,
                   INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """Epilogue of norm-add-norm at `cols`: h (recomputed, stored) and round(w2 * round(h * rstd2))."""
    w1 = _operand(w1_ptr + cols, m, DT, INTERPRET, PACKED)
    w2 = _operand(w2_ptr + cols, m, DT, INTERPRET, PACKED)
    a = load_f32(a_row + cols, m, DT, INTERPRET)
    r = _operand(r_row + cols, m, DT, INTERPRET, PACKED)
    h = _out_vals(a, w1, r, rstd1, True, DT, INTERPRET, PACKED)     # every load before a store
    _store_out(h_row + cols, h, m, DT, INTERPRET, PACKED)
    y = _out_vals(_widened(h, PACKED), w2, w2, rstd2, False, DT, INTERPRET, PACKED)
    _store_out(y_row + cols, y, m, DT, INTERPRET, PACKED)


@triton.jit(do_not_specialize=["N", "sx", "sb", "sr", "lanes"])
def _general_norm_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, var_ptr, N, sx, sb, sr, eps, factor, lanes,
                 MODE: tl.constexpr, HAS_R: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr,
                 INTERPRET: tl.constexpr, TILE: tl.constexpr, WARP_DOWN: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    """One row per program: MODE 0 normalises x, MODE 1 round(x + b); HAS_R adds the residual."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    b_row = b_ptr + row * sb
    shift = ((row * N) % 4).to(tl.int32)
    total = _row_sumsq(x_row, b_row, x_row, w_ptr, 1.0, N, shift, lanes, MODE, DT, INTERPRET, TILE, WARP_DOWN)
    var, rstd = _rstd(total, factor, eps, INTERPRET)
    if STORE_VAR:
        tl.store(var_ptr + row + tl.arange(0, 1), var)
    for c0 in range(0, N, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        _norm_out(x_row, b_row, w_ptr, r_ptr + row * sr, out_ptr + row * N, rstd, cols, cols < N, MODE, HAS_R,
                  DT, INTERPRET, False, False)


@triton.jit(do_not_specialize=["N", "sa", "sr", "lanes"])
def _general_norm_norm_kernel(a_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, var_ptr, N, sa, sr, eps, factor,
                              lanes, STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                              TILE: tl.constexpr, WARP_DOWN: tl.constexpr, BLOCK_C: tl.constexpr):
    """h = r + rms_norm(a, w1); y = rms_norm(h, w2): the second sum recomputes h in its order."""
    row = tl.program_id(0).to(tl.int64)
    a_row = a_ptr + row * sa
    r_row = r_ptr + row * sr
    shift = ((row * N) % 4).to(tl.int32)
    t1 = _row_sumsq(a_row, a_row, r_row, w1_ptr, 1.0, N, shift, lanes, 0, DT, INTERPRET, TILE, WARP_DOWN)
    var1, rstd1 = _rstd(t1, factor, eps, INTERPRET)
    t2 = _row_sumsq(a_row, a_row, r_row, w1_ptr, rstd1, N, shift, lanes, 2, DT, INTERPRET, TILE, WARP_DOWN)
    var2, rstd2 = _rstd(t2, factor, eps, INTERPRET)
    if STORE_VAR:
        tl.store(var_ptr + row * 2 + tl.arange(0, 1), var1)
        tl.store(var_ptr + row * 2 + 1 + tl.arange(0, 1), var2)
    for c0 in range(0, N, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_ptr + row * N, y_ptr + row * N, rstd1, rstd2, cols,
                       cols < N, DT, INTERPRET, False)



# ----------------------------------------------------------------------------------------------
# Triton: the lowwarp layout
# ----------------------------------------------------------------------------------------------
@triton.jit
def _lanes(R: tl.constexpr, NW: tl.constexpr):
    """torch lane (l = r * 32 NW + h * NW + w) of each row of the flat [R * NW * 32, 1] tile (row
    m = r * 32 NW + w * 32 + h) and the [1, 4] column offsets i. With one non-contiguous dim every
    Triton lays m out as lane = m % 32, warp = (m / 32) % NW, register = r: the intended layout."""
    m = tl.arange(0, R * NW * 32)[:, None]
    r = m // (32 * NW)
    w = (m // 32) % NW
    h = m % 32
    return r * (32 * NW) + h * NW + w, tl.arange(0, 4)[None, :]


@triton.jit
def _tree(acc, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr, LOG_NW: tl.constexpr,
          TL_SUM: tl.constexpr, INTERPRET: tl.constexpr):
    """torch's combination of the per-lane accumulators acc [R * NW * 32, 4]: each lane
    ((a0 + a1) + a2) + a3, the levels over r (in-thread), then over h, then over w."""
    p, q = tl.split(tl.reshape(acc, [R, NW, 32, 2, 2]))   # p = (a0, a2), q = (a1, a3)
    a0, a2 = tl.split(p)
    a1, a3 = tl.split(q)
    s = add_rn(add_rn(add_rn(a0, a1, INTERPRET), a2, INTERPRET), a3, INTERPRET)   # [R, NW, 32]
    for k in tl.static_range(LOG_R):             # r: pairs (r, r + R/2), .. (r, r + 1)
        s = tl.sum(tl.reshape(s, [2, R >> (k + 1), NW, 32]), axis=0)
    s = tl.reshape(s, [NW, 32])                  # [w, h]
    if TL_SUM:
        # element w * 32 + h: warp butterfly over h (xor 16 .. 1), then the cross-warp round over
        # w (xor NW/2 .. 1): torch's offsets NW * 16 .. NW, then NW/2 .. 1
        return tl.sum(tl.reshape(s, [NW * 32]), axis=0)
    else:
        for k in tl.static_range(5):             # h: pairs (h, h + 16), (h, h + 8), .. (h, h + 1)
            s = tl.sum(tl.reshape(s, [NW, 2, 16 >> k]), axis=1)
        s = tl.reshape(s, [NW])
        for k in tl.static_range(LOG_NW):        # w: pairs (w, w + NW/2), .. (w, w + 1)
            s = tl.sum(tl.reshape(s, [2, NW >> (k + 1)]), axis=0)
        return tl.sum(s, axis=0)                 # the one value left


@triton.jit
def _row_tile(R: tl.constexpr, NW: tl.constexpr, IT: tl.constexpr):
    """The whole row as one flat [IT * lanes, 1] tile of vector indices plus the [1, 4] columns:
    tile row m = it * lanes + (_lanes' row), vector k = it * lanes + torch lane, so every lane
    holds its own IT vectors in registers (it is a higher register index than r). Like _lanes'
    tile it has one non-contiguous dim, which every Triton lays out with m's low five bits on the
    lanes; a 3-D [IT, lanes, 4] tile was laid out with `it` on the lanes by Triton 3.6."""
    L: tl.constexpr = R * 32 * NW
    lane, i = _lanes(R * IT, NW)            # r' = it * R + r: torch lane r' * 32 NW + h * NW + w
    it = lane // L
    return it * L + lane % L, i


@triton.jit
def _fold(sq, L: tl.constexpr, IT: tl.constexpr, INTERPRET: tl.constexpr):
    """Each lane's 4 accumulators fed its vectors in order, ((s0 + s1) + s2) + ..: torch's
    per-thread loop, over the [IT * L, 4] squares of a _row_tile. Slice j is taken by a sum with
    -0.0 everywhere else, exact in any order (x + -0.0 == x; `it` is a register index, so the
    compiler folds it away); slices past the row are squares of masked lanes, +0, which leave a sum
    of squares unchanged. Returns [L, 4]."""
    s3 = tl.reshape(sq, [IT, L, 4])
    it = tl.arange(0, IT)[:, None, None]
    acc = tl.sum(tl.where(it == 0, s3, -0.0), axis=0)            # 0 + s0 == s0
    return _fold_from(acc, s3, 1, IT, INTERPRET)


@triton.jit
def _fold_from(acc, s3, J0: tl.constexpr, IT: tl.constexpr, INTERPRET: tl.constexpr):
    """acc [L, 4] fed slices J0.. of the [IT, L, 4] squares s3 in order (as _fold): the per-lane
    loop continued, so a row held in several register tiles is still one chain per accumulator."""
    it = tl.arange(0, IT)[:, None, None]
    for j in tl.static_range(J0, IT):
        acc = add_rn(acc, tl.sum(tl.where(it == j, s3, -0.0), axis=0), INTERPRET)
    return acc


@triton.jit
def _rstd_of(v, factor, eps, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr,
             LOG_NW: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr, INTERPRET: tl.constexpr):
    """(variance, rstd) of a row held in registers as a _row_tile (masked lanes hold 0)."""
    lane_sums = _fold(_sq_of(v, INTERPRET), R * 32 * NW, ITERS, INTERPRET)
    total = _tree(lane_sums, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)
    return _rstd(total, factor, eps, INTERPRET)


@triton.jit
def _sumsq(x_row, b_row, r_row, w1_ptr, rstd1, nvec, MODE: tl.constexpr, DT: tl.constexpr,
           INTERPRET: tl.constexpr, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr,
           LOG_NW: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr):
    """Sum of squares of one 16-byte aligned row in torch's order, lanes = R * 32 * NW, one vector
    per lane at a time (the two-pass kernels: nothing of the row is kept). Masked vectors load as
    0 and add +0 (see _sq_of)."""
    lane, i = _lanes(R, NW)
    acc = tl.zeros([R * NW * 32, 4], dtype=tl.float32)
    for it in tl.static_range(ITERS):           # vector k = it * lanes + lane, element i -> acc i
        k = it * (R * 32 * NW) + lane
        m = (k < nvec) & (i < 4)
        v = _vals(x_row, b_row, r_row, w1_ptr, rstd1, k * 4 + i, m, MODE, DT, INTERPRET)
        acc = add_rn(acc, _sq_of(v, INTERPRET), INTERPRET)
    return _tree(acc, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)


@triton.jit
def _lowwarp_norm_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, var_ptr, N, sx, sb, sr, eps, factor,
                         MODE: tl.constexpr, HAS_R: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr,
                         INTERPRET: tl.constexpr, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr,
                         LOG_NW: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr,
                         ONE_PASS: tl.constexpr, OUT_CHUNK: tl.constexpr, OUT_CHUNKS: tl.constexpr,
                         PACKED: tl.constexpr, STREAM: tl.constexpr):
    """One row per program (MODE 0: x, MODE 1: round(x + b); HAS_R adds the residual).

    ONE_PASS: the row is read once, as one register tile in torch's lane layout (_row_tile,
    ITERS vectors per lane, a power of two, masked past the row), summed in torch's order and
    written from the same registers; every load comes before the one store. Otherwise it is read
    twice: the sum, one vector per lane at a time, then the output over flat chunks of OUT_CHUNK
    columns, each loaded whole before any of it is stored (``out`` may alias an input as far as the
    compiler knows, so a load after a store waits for it: per-vector epilogues serialised a row
    into ITERS round trips). Two passes serve many rows: fewer live registers, more rows in flight.
    PACKED: _out_vals' packed epilogue."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    b_row = b_ptr + row * sb
    r_row = r_ptr + row * sr
    out_row = out_ptr + row * N
    if ONE_PASS:
        k, i = _row_tile(R, NW, ITERS)
        cols = k * 4 + i
        m = (k < N // 4) & (i < 4)
        w = _operand(w_ptr + cols, m, DT, INTERPRET, PACKED)
        v = _vals(x_row, b_row, x_row, w_ptr, 1.0, cols, m, MODE, DT, INTERPRET)
        r = w
        if HAS_R:
            r = _operand(r_row + cols, m, DT, INTERPRET, PACKED)
        var, rstd = _rstd_of(v, factor, eps, R, LOG_R, NW, LOG_NW, ITERS, TL_SUM, INTERPRET)
        _store_out(out_row + cols, _out_vals(v, w, r, rstd, HAS_R, DT, INTERPRET, PACKED), m, DT, INTERPRET,
                   PACKED)
    else:
        total = _sumsq(x_row, b_row, x_row, w_ptr, 1.0, N // 4, MODE, DT, INTERPRET, R, LOG_R, NW, LOG_NW,
                       ITERS, TL_SUM)
        var, rstd = _rstd(total, factor, eps, INTERPRET)
        for c in tl.static_range(OUT_CHUNKS):
            cols = c * OUT_CHUNK + tl.arange(0, OUT_CHUNK)
            _norm_out(x_row, b_row, w_ptr, r_row, out_row, rstd, cols, cols < N, MODE, HAS_R, DT, INTERPRET,
                      PACKED, STREAM)
    if STORE_VAR:
        tl.store(var_ptr + row, var)


@triton.jit
def _rows_chunk_out(xv, w, out_ptrs, rstd, m, DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr,
                    STREAM: tl.constexpr):
    """The plain epilogue of one [ROWS, CHUNK] chunk already loaded (`xv`, dtype or fp32 values;
    `w` the chunk's weights [1, CHUNK] as _operand loads them, `out_ptrs` [ROWS, CHUNK], `m` the
    chunk's mask): round(w * round(v * rstd)), stored streaming (STREAM) or plainly."""
    wb = tl.broadcast_to(w, m.shape)
    y = _out_vals(xv.to(tl.float32), wb, wb, rstd, False, DT, INTERPRET, PACKED)
    _store_y(out_ptrs, y, m, DT, INTERPRET, PACKED, STREAM)


@triton.jit
def _lowwarp_rows_norm_kernel(x_ptr, w_ptr, out_ptr, var_ptr, T, N, sx, eps, factor,
                              STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                              ROWS: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr,
                              OUT_CHUNK: tl.constexpr, TWO_CHUNKS: tl.constexpr, PACKED: tl.constexpr,
                              STREAM: tl.constexpr):
    """The plain norm, two passes, ROWS rows of torch's 32-lane plan per program: warp j sums row j
    (torch lane = hardware lane, ITERS vectors each, the per-warp butterfly of _tree's one-warp
    case), then the program writes its rows' output in at most two [ROWS, OUT_CHUNK] chunks, both
    loaded before either is stored (a load after a store waits for it, see _lowwarp_norm_kernel).

    Why a program takes several rows: at 4096 rows of width 2048 four rows per program (1024
    programs of four warps) and the second chunk's load ahead of the first store were each faster
    than one row per one-warp program, beyond the spread of an A/A copy, in an H200 side comparison
    (docs/onelaunch_norm.md). STREAM (GPU): both passes read the row evict-first, the output is
    stored streaming. Every load of the output pass (both chunks of x and of the weights) is issued
    before its first store, and each lane's vectors are addressed as one pointer plus constant
    offsets (fewer address registers and instructions): together faster at 4096 x 2048 than the
    weights of the second chunk loaded after the first chunk's stores, beyond the spread of an A/A
    copy of the kernel, in an H200 side comparison (the committed figure of this kernel:
    results/gpu/kernels-placements)."""
    pid = tl.program_id(0).to(tl.int64)
    m = tl.arange(0, ROWS * 32)[:, None]          # warp m // 32 holds row m // 32, lane m % 32
    row = pid * ROWS + m // 32
    lane = m % 32
    i = tl.arange(0, 4)[None, :]
    x_lane = x_ptr + row * sx + lane * 4 + i       # the lane's vector `it` starts it * 128 values on
    acc = tl.zeros([ROWS * 32, 4], dtype=tl.float32)
    for it in tl.static_range(ITERS):             # vector k = it * 32 + lane, element i -> acc i
        k = it * 32 + lane
        v = _streamed(x_lane + it * 128, (row < T) & (k < N // 4) & (i < 4), DT, INTERPRET, STREAM)
        acc = add_rn(acc, _sq_of(v.to(tl.float32), INTERPRET), INTERPRET)
    # the output pass's offsets and masks, ahead of the reduction: placed after it, ptxas (Triton 3.9,
    # sm_90) gave the kernel 72 registers instead of 64, and at 72 not every program of 4096 rows
    # is resident at once
    rows = (pid * ROWS + tl.arange(0, ROWS))[:, None]
    ca = tl.arange(0, OUT_CHUNK)[None, :]
    cb = OUT_CHUNK + ca
    ma = (rows < T) & (ca < N)
    mb = (rows < T) & (cb < N)
    xa_ptrs = x_ptr + rows * sx + ca
    p, q = tl.split(tl.reshape(acc, [ROWS * 32, 2, 2]))   # p = (a0, a2), q = (a1, a3)
    a0, a2 = tl.split(p)
    a1, a3 = tl.split(q)
    s = tl.reshape(add_rn(add_rn(add_rn(a0, a1, INTERPRET), a2, INTERPRET), a3, INTERPRET), [ROWS, 32])
    if TL_SUM:
        total = tl.sum(s, axis=1)                  # per warp: the butterfly xor 16 .. 1
    else:
        for k in tl.static_range(5):               # lanes (h, h + 16), (h, h + 8), .. (h, h + 1)
            s = tl.sum(tl.reshape(s, [ROWS, 2, 16 >> k]), axis=1)
        total = tl.reshape(s, [ROWS])
    var, rstd = _rstd(total, factor, eps, INTERPRET)
    rstd = rstd[:, None]
    xa = _streamed(xa_ptrs, ma, DT, INTERPRET, STREAM)
    if TWO_CHUNKS:
        xb = _streamed(xa_ptrs + OUT_CHUNK, mb, DT, INTERPRET, STREAM)
        wa = _operand(w_ptr + ca, ca < N, DT, INTERPRET, PACKED)
        wb = _operand(w_ptr + cb, cb < N, DT, INTERPRET, PACKED)
        ya_ptrs = out_ptr + rows * N + ca
        _rows_chunk_out(xa, wa, ya_ptrs, rstd, ma, DT, INTERPRET, PACKED, STREAM)
        _rows_chunk_out(xb, wb, ya_ptrs + OUT_CHUNK, rstd, mb, DT, INTERPRET, PACKED, STREAM)
    else:
        wa = _operand(w_ptr + ca, ca < N, DT, INTERPRET, PACKED)
        _rows_chunk_out(xa, wa, out_ptr + rows * N + ca, rstd, ma, DT, INTERPRET, PACKED, STREAM)
    if STORE_VAR:   # last: a store ahead of the output's loads would order them behind it
        vrows = pid * ROWS + tl.arange(0, ROWS)
        tl.store(var_ptr + vrows, var, mask=vrows < T)


@triton.jit
def _widen_for_sum(v, DT: tl.constexpr):
    """16-bit values as fp32 through inline PTX, for their squares. An ordinary conversion here
    would be merged with the output's (``v.to(tl.float32)``), and the row would then stay in
    registers as fp32 from the sum to the output: twice the registers of the dtype values."""
    if DT == 1:
        w = tl.inline_asm_elementwise("{ .reg .b32 t; mov.b32 t, {0, $1}; mov.b32 $0, t; }", "=r,h", [v],
                                      dtype=tl.uint32, is_pure=True, pack=1)
        return w.to(tl.float32, bitcast=True)
    else:
        return tl.inline_asm_elementwise("cvt.f32.f16 $0, $1;", "=f,h", [v], dtype=tl.float32, is_pure=True,
                                         pack=1)


@triton.jit
def _held_cols(K0: tl.constexpr, IT: tl.constexpr, nvec):
    """Columns and mask of a row's vectors K0 .. K0 + IT - 1 per lane as a flat [IT * 32, 4] tile
    (_row_tile at 32 lanes: hardware lane h holds torch lane h's vectors (K0 + it) * 32 + h)."""
    k, i = _row_tile(1, 1, IT)
    k = k + K0 * 32
    return k * 4 + i, (k < nvec) & (i < 4)


@triton.jit
def _held_load(x_row, b_row, K0: tl.constexpr, IT: tl.constexpr, nvec, MODE: tl.constexpr, DT: tl.constexpr,
               INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """One register tile of the row's values (MODE 0: x, 1: round(x + b)), read once: evict-first,
    in the dtype (PACKED: the sum as one packed add per pair, torch's rounding, see packed_rn);
    else fp32 holding dtype values (_vals)."""
    cols, m = _held_cols(K0, IT, nvec)
    if PACKED:
        v = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_first")
        if MODE == 1:
            b = tl.load(b_row + cols, mask=m, other=0.0, eviction_policy="evict_first")
            v = packed_rn(v, b, "add", DT)
    else:
        v = _vals(x_row, b_row, x_row, x_row, 1.0, cols, m, MODE, DT, INTERPRET)
    return v


@triton.jit
def _held_fold(acc, v, IT: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """acc [32, 4] fed the squares of one register tile, vector by vector (_fold_from)."""
    if PACKED:
        v = _widen_for_sum(v, DT)
    return _fold_from(acc, tl.reshape(_sq_of(v, INTERPRET), [IT, 32, 4]), 0, IT, INTERPRET)


@triton.jit
def _held_out(v, w_ptr, out_row, rstd, K0: tl.constexpr, IT: tl.constexpr, nvec, DT: tl.constexpr,
              INTERPRET: tl.constexpr, PACKED: tl.constexpr):
    """The output of one register tile: round(w * round(v * rstd)), stored streaming on the GPU."""
    cols, m = _held_cols(K0, IT, nvec)
    w = _operand(w_ptr + cols, m, DT, INTERPRET, PACKED)
    _store_y(out_row + cols, _out_vals(v.to(tl.float32), w, w, rstd, False, DT, INTERPRET, PACKED), m, DT,
             INTERPRET, PACKED, PACKED)


@triton.jit
def _lowwarp_held_norm_kernel(x_ptr, b_ptr, w_ptr, out_ptr, var_ptr, N: tl.constexpr, sx, sb, eps, factor,
                              MODE: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr,
                              INTERPRET: tl.constexpr, PACKED: tl.constexpr, TL_SUM: tl.constexpr,
                              I0: tl.constexpr, I1: tl.constexpr, I2: tl.constexpr, I3: tl.constexpr):
    """One row per one-warp program at torch's 32-lane plan (MODE 0: x, MODE 1: round(x + b)), the
    row read once and held in registers as dtype values until its output is written.

    Why: a row wider than the several-rows kernel takes (Huginn's 5280: 42 vectors per lane) is
    read twice by the two-pass form, the add form's two inputs included, and written in round trips
    behind its stores. Held in registers, it is read once, and only the weights are loaded after
    the sum. The row is up to four power-of-two tiles of I0 >= I1 >= I2 >= I3 vectors per lane (0:
    none; held_parts), so a 42-vector row holds no padding; each lane's accumulators are fed the
    tiles' vectors in order, one chain, as torch's loop. The width N is compiled in (one binary per
    model width): the masks of every whole vector fold away, fewer registers stay live, and in an
    H200 side comparison that was faster at every row count tried (128..8192, both forms) than the
    width at run time. Against the two passes at width 5280 it was faster at 16..8192 rows in H200
    side comparisons, except the plain form at 2048 rows, within 1% of them (docs/onelaunch_norm.md,
    "Width 5280"); OneLaunchConfig.wide_registers decides."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    b_row = b_ptr + row * sb
    out_row = out_ptr + row * N
    nvec = N // 4
    v0 = _held_load(x_row, b_row, 0, I0, nvec, MODE, DT, INTERPRET, PACKED)
    if I1 > 0:
        v1 = _held_load(x_row, b_row, I0, I1, nvec, MODE, DT, INTERPRET, PACKED)
    if I2 > 0:
        v2 = _held_load(x_row, b_row, I0 + I1, I2, nvec, MODE, DT, INTERPRET, PACKED)
    if I3 > 0:
        v3 = _held_load(x_row, b_row, I0 + I1 + I2, I3, nvec, MODE, DT, INTERPRET, PACKED)
    acc = _held_fold(tl.zeros([32, 4], dtype=tl.float32), v0, I0, DT, INTERPRET, PACKED)   # 0 + s == s
    if I1 > 0:
        acc = _held_fold(acc, v1, I1, DT, INTERPRET, PACKED)
    if I2 > 0:
        acc = _held_fold(acc, v2, I2, DT, INTERPRET, PACKED)
    if I3 > 0:
        acc = _held_fold(acc, v3, I3, DT, INTERPRET, PACKED)
    var, rstd = _rstd(_tree(acc, 1, 0, 1, 0, TL_SUM, INTERPRET), factor, eps, INTERPRET)
    # the small tiles first: each tile's registers are free once it is stored
    if I3 > 0:
        _held_out(v3, w_ptr, out_row, rstd, I0 + I1 + I2, I3, nvec, DT, INTERPRET, PACKED)
    if I2 > 0:
        _held_out(v2, w_ptr, out_row, rstd, I0 + I1, I2, nvec, DT, INTERPRET, PACKED)
    if I1 > 0:
        _held_out(v1, w_ptr, out_row, rstd, I0, I1, nvec, DT, INTERPRET, PACKED)
    _held_out(v0, w_ptr, out_row, rstd, 0, I0, nvec, DT, INTERPRET, PACKED)
    if STORE_VAR:
        tl.store(var_ptr + row, var)


@triton.jit
def _lowwarp_norm_norm_kernel(a_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, var_ptr, N, sa, sr, eps, factor,
                              STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                              R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr, LOG_NW: tl.constexpr,
                              ITERS: tl.constexpr, TL_SUM: tl.constexpr, ONE_PASS: tl.constexpr,
                              OUT_CHUNK: tl.constexpr, OUT_CHUNKS: tl.constexpr, PACKED: tl.constexpr):
    """h = r + rms_norm(a, w1); y = rms_norm(h, w2), read once (ONE_PASS: a, r and h stay in
    registers; w2 is loaded after the first sum, fewer live registers) or as in
    _lowwarp_norm_kernel's two-pass form (the second sum recomputes h)."""
    row = tl.program_id(0).to(tl.int64)
    a_row = a_ptr + row * sa
    r_row = r_ptr + row * sr
    h_row = h_ptr + row * N
    y_row = y_ptr + row * N
    if ONE_PASS:
        k, i = _row_tile(R, NW, ITERS)
        cols = k * 4 + i
        m = (k < N // 4) & (i < 4)
        w1 = _operand(w1_ptr + cols, m, DT, INTERPRET, PACKED)
        a = load_f32(a_row + cols, m, DT, INTERPRET)
        r = _operand(r_row + cols, m, DT, INTERPRET, PACKED)
        var1, rstd1 = _rstd_of(a, factor, eps, R, LOG_R, NW, LOG_NW, ITERS, TL_SUM, INTERPRET)
        w2 = _operand(w2_ptr + cols, m, DT, INTERPRET, PACKED)
        h = _out_vals(a, w1, r, rstd1, True, DT, INTERPRET, PACKED)
        hf = _widened(h, PACKED)
        var2, rstd2 = _rstd_of(hf, factor, eps, R, LOG_R, NW, LOG_NW, ITERS, TL_SUM, INTERPRET)
        _store_out(h_row + cols, h, m, DT, INTERPRET, PACKED)
        _store_out(y_row + cols, _out_vals(hf, w2, w2, rstd2, False, DT, INTERPRET, PACKED), m, DT, INTERPRET,
                   PACKED)
    else:
        t1 = _sumsq(a_row, a_row, r_row, w1_ptr, 1.0, N // 4, 0, DT, INTERPRET, R, LOG_R, NW, LOG_NW, ITERS,
                    TL_SUM)
        var1, rstd1 = _rstd(t1, factor, eps, INTERPRET)
        t2 = _sumsq(a_row, a_row, r_row, w1_ptr, rstd1, N // 4, 2, DT, INTERPRET, R, LOG_R, NW, LOG_NW, ITERS,
                    TL_SUM)
        var2, rstd2 = _rstd(t2, factor, eps, INTERPRET)
        for c in tl.static_range(OUT_CHUNKS):
            cols = c * OUT_CHUNK + tl.arange(0, OUT_CHUNK)
            _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_row, y_row, rstd1, rstd2, cols, cols < N, DT,
                           INTERPRET, PACKED)
    if STORE_VAR:
        tl.store(var_ptr + row * 2, var1)
        tl.store(var_ptr + row * 2 + 1, var2)


# ----------------------------------------------------------------------------------------------
# host side: the layout of a call, launches, public functions
# ----------------------------------------------------------------------------------------------
def lowwarp_supports(width: int, lanes: int, warp_down: bool, max_iters: int = MAX_ITERS) -> bool:
    """Shapes the lowwarp layout takes: 16-byte aligned rows, 32..512 lanes (a power of two),
    torch's halving warp order, at most `max_iters` vectors per lane (the unroll bound)."""
    if width % 4 or lanes < 32 or lanes > MAX_LANES or lanes & (lanes - 1) or not warp_down:
        return False
    return triton.cdiv(width // 4, lanes) <= max_iters


# keys whose validation refused the configured lowwarp layout: the general layout serves them
_LAYOUT_REFUSED: set[Key] = set()


def layout_for(width: int, rows: int, device: torch.device, warp_order: str,
               config: OneLaunchConfig | None = None, dtype: torch.dtype | None = None,
               max_iters: int = MAX_ITERS) -> str:
    """Which layout serves `rows` x `width` ("lowwarp" or "general"): the config's (default: the
    tuned one in force, minus the keys where validation refused it) where it takes the plan with at
    most `max_iters` vectors per lane."""
    cfg = config if config is not None else tuned.config(OneLaunchConfig)
    if cfg.layout != "lowwarp":
        return "general"
    if not lowwarp_supports(width, plan_for(rows, width, device).lanes, warp_order == WARP_DOWN, max_iters):
        return "general"
    if config is None and dtype is not None and _LAYOUT_REFUSED and device.type == "cuda" \
            and validation_key(device, dtype, width) in _LAYOUT_REFUSED:
        return "general"
    return "lowwarp"


def held_parts(iters: int) -> tuple[int, int, int, int]:
    """`iters` vectors per lane as the held kernel's four register tiles (largest first, 0 = none),
    powers of two of at most HELD_MAX_TILE: the largest that fits, three times, then the rest
    rounded up to a power of two (vectors past the row are masked). 42 -> (32, 8, 2, 0)."""
    if not 1 <= iters <= MAX_ITERS:
        raise ValueError(f"held rows take 1..{MAX_ITERS} vectors per lane, got {iters}")
    parts: list[int] = []
    left = iters
    while left > 0 and len(parts) < 3:
        parts.append(min(HELD_MAX_TILE, 1 << (left.bit_length() - 1)))
        left -= parts[-1]
    if left > 0:
        parts.append(triton.next_power_of_2(left))
    return (*parts, *[0] * (4 - len(parts)))  # type: ignore[return-value]


def out_chunk_per_warp(rows: int, width: int, add_form: bool) -> int:
    """Columns per warp of each chunk of the two-pass output: ADD_OUT_CHUNK_PER_WARP for the add
    form of many wide rows (ADD_OUT_CHUNK_MIN_ROWS, wider than ROWS_MAX_WIDTH), else
    OUT_CHUNK_PER_WARP. Only the order of the stores changes: each output is the same expression."""
    if add_form and width > ROWS_MAX_WIDTH and rows >= ADD_OUT_CHUNK_MIN_ROWS:
        return ADD_OUT_CHUNK_PER_WARP
    return OUT_CHUNK_PER_WARP


def _launch(x: torch.Tensor, eps: float, warp_order: str | None, config: OneLaunchConfig | None,
            max_iters: int = MAX_ITERS, add_form: bool = False
            ) -> tuple[str, tuple[float | int, ...], dict[str, Any]]:
    """(layout, the scalars after the strides: eps, factor [, lanes], constexprs + num_warps) of a
    launch over x's rows; `max_iters` bounds the lowwarp layout's vectors per lane; `add_form`: the
    rows are normalised as x + branch (out_chunk_per_warp)."""
    R, W = x.shape
    plan = plan_for(R, W, x.device)
    if plan.unsupported_reason is not None:
        raise ValueError(f"one-launch norm: {plan.unsupported_reason}")
    order = warp_order if warp_order is not None else warp_order_for(x.device, x.dtype, W)
    if order not in WARP_ORDERS:
        raise ValueError(f"warp_order must be one of {WARP_ORDERS}")
    interp = interpret_mode()
    eps32 = float(np.float32(eps))         # torch rounds the python scalar to fp32 (RNE)
    factor = float(mean_factor(R, W))      # MeanOps factor, exact fp32
    layout = layout_for(W, R, x.device, order, config, x.dtype, max_iters)
    consts: dict[str, Any] = {"DT": dtype_code(x.dtype), "INTERPRET": interp}
    if layout == "lowwarp":
        cfg = config if config is not None else tuned.config(OneLaunchConfig)
        nw = min(cfg.warps, plan.lanes // 32)
        r = plan.lanes // (32 * nw)
        consts |= {"R": r, "LOG_R": r.bit_length() - 1, "NW": nw, "LOG_NW": nw.bit_length() - 1,
                   "TL_SUM": cfg.tree == "tl_sum" and not interp,
                   "num_warps": 1 if interp else nw}   # the interpreter runs the same layout
        iters = triton.cdiv(W // 4, plan.lanes)
        one_pass = R < cfg.two_pass_min_rows and iters <= MAX_ONE_PASS_ITERS
        # the single pass holds a power-of-two register tile (masked past the row); two passes
        # unroll exactly the row's vectors
        consts |= {"ONE_PASS": one_pass, "ITERS": triton.next_power_of_2(iters) if one_pass else iters}
        chunk = min(triton.next_power_of_2(W), out_chunk_per_warp(R, W, add_form) * nw)
        # the packed epilogue is inline PTX: GPU only, 16-bit dtypes
        consts |= {"OUT_CHUNK": chunk, "OUT_CHUNKS": triton.cdiv(W, chunk),
                   "PACKED": cfg.packed and not interp and x.dtype != torch.float32}
        return layout, (eps32, factor), consts
    tile = 32 if plan.lanes <= 32 else MAX_LANES    # two compiled variants cover every plan
    consts |= {"TILE": tile, "WARP_DOWN": order == WARP_DOWN,
               "BLOCK_C": min(triton.next_power_of_2(W), 16384 if interp else 1024),
               "num_warps": 1 if interp else tile // 128 if tile >= 128 else 1}
    return layout, (eps32, factor, plan.lanes), consts


def rms_norm_onelaunch_rows(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor,
                            branch: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                            var_out: torch.Tensor | None = None, warp_order: str | None = None,
                            config: OneLaunchConfig | None = None) -> None:
    """Same contract as exact.rms_norm_exact_rows (2-D rows, last dim contiguous, `out`
    contiguous), one launch. `var_out` (fp32 [R], optional): the variance each row used.
    `warp_order`: None = the validated (else the torch-version default) order. `config`: None = the
    tuned one in force. Raises ValueError when torch's plan for this shape is not reproducible
    (callers check is_trusted first)."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    layout, s, consts = _launch(x, eps, warp_order, config, add_form=branch is not None)
    if layout == "lowwarp":   # the streaming epilogue: plain form, two passes, GPU (OneLaunchConfig)
        cfg = config if config is not None else tuned.config(OneLaunchConfig)
        consts["STREAM"] = (cfg.stream and not consts["ONE_PASS"] and not consts["INTERPRET"]
                            and branch is None and residual is None)
        if branch is None and residual is None and _takes_rows_kernel(cfg, consts, W):
            _launch_rows(x, w, out, var_out, s, consts, cfg)
            return
        if residual is None and _takes_held_kernel(cfg, consts, x):
            _launch_held(x, branch, w, out, var_out, s, consts)
            return
    b = branch if branch is not None else x
    r = residual if residual is not None else x
    kernel = _lowwarp_norm_kernel if layout == "lowwarp" else _general_norm_kernel
    kernel[(R,)](x, b, r, w, out, var_out if var_out is not None else out, W, row_stride(x), row_stride(b),
                 row_stride(r), *s, MODE=MODE_X if branch is None else MODE_ADD,
                 HAS_R=residual is not None, STORE_VAR=var_out is not None, **consts)


def _takes_rows_kernel(cfg: OneLaunchConfig, consts: dict[str, Any], width: int) -> bool:
    """Whether a plain-form lowwarp launch (`consts` from _launch) runs _lowwarp_rows_norm_kernel:
    two passes, torch's 32-lane plan (one warp per row), rows of at most ROWS_MAX_WIDTH, and a
    config asking for more than one row per program."""
    return (not consts["ONE_PASS"] and consts["R"] * consts["NW"] == 1 and width <= ROWS_MAX_WIDTH
            and cfg.stream_rows > 1)


def _takes_held_kernel(cfg: OneLaunchConfig, consts: dict[str, Any], x: torch.Tensor) -> bool:
    """Whether a lowwarp launch of the plain or add form (no residual; `consts` from _launch) runs
    _lowwarp_held_norm_kernel: two passes otherwise, torch's 32-lane plan, rows wider than the
    several-rows kernel takes, 16-bit rows held as 16-bit values (the packed epilogue; fp32 values,
    from fp32 rows or with `packed` off, would need twice the registers; the interpreter runs the
    fp32 form to check the order), and the config's wide_registers."""
    return (cfg.wide_registers and not consts["ONE_PASS"] and consts["R"] * consts["NW"] == 1
            and x.shape[1] > ROWS_MAX_WIDTH and x.dtype != torch.float32
            and (consts["PACKED"] or consts["INTERPRET"]))


def _launch_held(x: torch.Tensor, branch: torch.Tensor | None, w: torch.Tensor, out: torch.Tensor,
                 var_out: torch.Tensor | None, scalars: tuple[float | int, ...],
                 consts: dict[str, Any]) -> None:
    """_lowwarp_held_norm_kernel over x's rows (x + branch where given), one one-warp program each."""
    T, W = x.shape
    b = branch if branch is not None else x
    i0, i1, i2, i3 = held_parts(consts["ITERS"])
    _lowwarp_held_norm_kernel[(T,)](
        x, b, w, out, var_out if var_out is not None else out, W, row_stride(x), row_stride(b), *scalars,
        MODE=MODE_X if branch is None else MODE_ADD, STORE_VAR=var_out is not None, DT=consts["DT"],
        INTERPRET=consts["INTERPRET"], PACKED=consts["PACKED"], TL_SUM=consts["TL_SUM"], I0=i0, I1=i1, I2=i2,
        I3=i3, num_warps=1)


def _launch_rows(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, var_out: torch.Tensor | None,
                 scalars: tuple[float | int, ...], consts: dict[str, Any], cfg: OneLaunchConfig) -> None:
    """_lowwarp_rows_norm_kernel over x's rows, cfg.stream_rows rows (and warps) per program, with
    the streaming decision the caller made (consts["STREAM"])."""
    T, W = x.shape
    rows = cfg.stream_rows
    chunk = min(triton.next_power_of_2(W), OUT_CHUNK_PER_WARP)
    interp = consts["INTERPRET"]
    _lowwarp_rows_norm_kernel[(triton.cdiv(T, rows),)](
        x, w, out, var_out if var_out is not None else out, T, W, row_stride(x), *scalars,
        STORE_VAR=var_out is not None, DT=consts["DT"], INTERPRET=interp, ROWS=rows, ITERS=consts["ITERS"],
        TL_SUM=consts["TL_SUM"], OUT_CHUNK=chunk, TWO_CHUNKS=W > chunk, PACKED=consts["PACKED"],
        STREAM=consts["STREAM"], num_warps=1 if interp else rows)


def residual_rms_norm_norm_onelaunch_rows(residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor,
                                          w2: torch.Tensor, eps: float, h_out: torch.Tensor,
                                          y_out: torch.Tensor, var_out: torch.Tensor | None = None,
                                          warp_order: str | None = None,
                                          config: OneLaunchConfig | None = None) -> None:
    """h = residual + rms_norm(branch, w1), y = rms_norm(h, w2) in one launch (2-D rows; h_out and
    y_out contiguous). `var_out` (fp32 [R, 2], optional): both variances."""
    R, W = branch.shape
    if R == 0 or W == 0:
        return
    # norm-add-norm (Ouro, width 2048) keeps the lowwarp layout to rows held in registers: its
    # two-pass form at Huginn's 42 vectors per lane needs 245 registers and a long compile
    layout, s, consts = _launch(branch, eps, warp_order, config, MAX_ONE_PASS_ITERS)
    kernel = _lowwarp_norm_norm_kernel if layout == "lowwarp" else _general_norm_norm_kernel
    kernel[(R,)](branch, residual, w1, w2, h_out, y_out, var_out if var_out is not None else h_out, W,
                 row_stride(branch), row_stride(residual), *s, STORE_VAR=var_out is not None, **consts)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    v = rows_view(t)
    if v is None:
        raise ValueError(f"one-launch norm: {name} must have a contiguous last dim and mergeable rows")
    return v


def _check(tensors: list[torch.Tensor], w: torch.Tensor) -> None:
    x = tensors[0]
    if x.dtype not in DTYPE_CODES or any(t.dtype != x.dtype for t in [*tensors, w]):
        raise ValueError("one-launch norm: fp32/bf16/fp16 inputs of one dtype")
    if any(t.shape != x.shape for t in tensors) or x.dim() == 0:
        raise ValueError("one-launch norm: input shapes differ")
    if w.dim() != 1 or w.shape[0] != x.shape[-1] or w.stride(0) != 1:
        raise ValueError("one-launch norm: weight must be a contiguous [width] vector")


def rms_norm_onelaunch(x: torch.Tensor, w: torch.Tensor, eps: float, form: str = "ouro") -> torch.Tensor:
    """``rms_norm`` (form "ouro") or ``rms_norm_huginn`` (form "huginn"): same bits, one launch."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}")
    _check([x], w)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rms_norm_onelaunch_rows(_rows(x, "x"), w, eps, out.view(-1, x.shape[-1]))
    return out


def residual_rms_norm_onelaunch(residual: torch.Tensor, branch: torch.Tensor, w: torch.Tensor,
                                eps: float) -> torch.Tensor:
    """Ouro sandwich ``residual + rms_norm(branch, w, eps)``, one launch."""
    _check([branch, residual], w)
    out = torch.empty(branch.shape, dtype=branch.dtype, device=branch.device)
    rms_norm_onelaunch_rows(_rows(branch, "branch"), w, eps, out.view(-1, branch.shape[-1]),
                            residual=_rows(residual, "residual"))
    return out


def add_rms_norm_huginn_onelaunch(x: torch.Tensor, branch: torch.Tensor, w: torch.Tensor,
                                  eps: float) -> torch.Tensor:
    """Huginn ``rms_norm_huginn(x + branch, w, eps)``, one launch."""
    _check([x, branch], w)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rms_norm_onelaunch_rows(_rows(x, "x"), w, eps, out.view(-1, x.shape[-1]), branch=_rows(branch, "branch"))
    return out


def residual_rms_norm_norm_onelaunch(residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor,
                                     w2: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + rms_norm(branch, w1)``, ``y = rms_norm(h, w2)``: both, one launch."""
    _check([branch, residual], w1)
    _check([branch], w2)
    h = torch.empty(branch.shape, dtype=branch.dtype, device=branch.device)
    y = torch.empty_like(h)
    W = branch.shape[-1]
    residual_rms_norm_norm_onelaunch_rows(_rows(residual, "residual"), _rows(branch, "branch"), w1, w2, eps,
                                          h.view(-1, W), y.view(-1, W))
    return h, y


# ----------------------------------------------------------------------------------------------
# trust: validation against torch on this GPU / torch version (validate.py)
# ----------------------------------------------------------------------------------------------
def kernels_for(config: OneLaunchConfig | None = None) -> NormKernels:
    """These kernels with `config` (None: the tuned one in force), as validate.py calls them."""
    if config is None:
        return NormKernels(rms_norm_onelaunch_rows, residual_rms_norm_norm_onelaunch_rows)
    return NormKernels(functools.partial(rms_norm_onelaunch_rows, config=config),
                       functools.partial(residual_rms_norm_norm_onelaunch_rows, config=config))


def _run_cases(device: torch.device, dtype: torch.dtype, width: int, order: str, res: ValidationResult
               ) -> CaseCounts:
    """The validation's cases on the layout in force. The lowwarp layout is trusted only on its own
    record: when it served the cases and failed (a mismatch or an error), it is taken off this key
    (res.layout_refused says why) and the cases run again on the general layout."""
    key = validation_key(device, dtype, width)
    cfg = tuned.config(OneLaunchConfig)
    lowwarp = layout_for(width, 1, device, order, None, dtype) == "lowwarp"
    res.layout = cfg.name if lowwarp else "general"
    try:
        out = run_cases(device, dtype, width, order, kernels_for())
        if not (lowwarp and out[2]):
            return out
        why = f"{len(out[2])} mismatching comparisons, e.g. {out[2][:2]}"
    except Exception as exc:
        if not lowwarp:
            raise
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
    res.layout_refused = f"{cfg.name}: {why}"
    res.layout = "general"
    _LAYOUT_REFUSED.add(key)
    return run_cases(device, dtype, width, order, kernels_for())


TRUST = Trust(_run_cases)


def validate(device: torch.device | str, dtype: torch.dtype, width: int) -> ValidationResult:
    """Compare every one-launch form (and the variance) with torch on `device`, bitwise (validate.py);
    cached per process per (GPU name, torch version, dtype, width). Never during graph capture."""
    return TRUST.validate(device, dtype, width)


def prevalidate(widths: list[int] | tuple[int, ...], dtypes: list[torch.dtype] | tuple[torch.dtype, ...],
                device: torch.device | str | None = None) -> dict[str, Any]:
    """Validate now, e.g. in engine warm-up before any CUDA-graph capture (is_trusted never
    validates during a capture). Returns validation_report()."""
    return TRUST.prevalidate(widths, dtypes, device)


def layout_reason(x: torch.Tensor, *others: torch.Tensor | None) -> str | None:
    """Why the one-launch kernels may not read these tensors although their width may be trusted
    (None: they may); a refusal is counted in the validation report. `x`: the rows normalised
    ([..., width]); `others`: the branch, residual and weights read beside it (None: skipped).

    Why: Triton compiles one binary per specialisation of the arguments, and a 16-byte aligned
    pointer or an integer divisible by 16 is built into the code (vector widths, layouts, shared
    memory exchanges). Validation and the bulk GPU tests exercise the binary of contiguous rows of
    the width; a pointer not 16-byte aligned, or a row stride whose divisibility by 16 differs from
    the width's, compiles another one. One such binary (width 2048, row stride 2050 to 2056) was
    found on an H200 writing a few elements of one row in 4096 one or two ulp off torch although its
    validation had passed, so those rows take the 3-launch exact norm (torch's own reduction), which
    is bitwise by construction. Contiguous rows and padded strides that keep the width's
    divisibility (2064 for 2048) run the validated binary."""
    width = x.shape[-1]
    why = None
    for t in (x, *others):
        if t is None:
            continue
        if t.data_ptr() % 16:
            why = "unaligned_pointer"
            break
        rows = rows_view(t) if t.dim() > 1 else None
        if rows is not None and rows.shape[0] > 1 and (rows.stride(0) % 16 == 0) != (width % 16 == 0):
            why = "row_stride"
            break
    if why is not None:
        TRUST.refuse(why)
    return why


def is_trusted(x: torch.Tensor) -> bool:
    """True when the one-launch norm is validated bitwise for x's rows (x: the tensor normalised,
    [..., width]) on this GPU/torch version. Validates lazily (once per dtype/width), except during
    CUDA-graph capture, where a missing validation means False. Refusals are counted by reason."""
    return TRUST.reason(x) is None


def untrusted_reason(x: torch.Tensor) -> str | None:
    """Why x's rows may not use the one-launch norm (None: they may). Not counted."""
    return TRUST.reason(x, count=False)


def warp_order_for(device: torch.device, dtype: torch.dtype, width: int) -> str:
    """The validated warp order for (device, dtype, width), else this torch version's default."""
    return TRUST.warp_order(device, dtype, width)


def validation_report() -> dict[str, Any]:
    """JSON-ready: every validation of this process and the refusals by reason (for results)."""
    return TRUST.report()


def reset_validation() -> None:
    """Forget cached validations, refusal counts and refused layouts (tests)."""
    TRUST.reset()
    _LAYOUT_REFUSED.clear()

