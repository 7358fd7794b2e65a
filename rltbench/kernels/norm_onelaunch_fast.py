"""Exact one-launch RMSNorm, fast path: the same torch CUDA summation order as norm_onelaunch.py,
laid out so the order costs (almost) no data movement.

Why a second kernel: the general kernel (norm_onelaunch.py) keeps torch's lanes as one flat
``[TILE, 4]`` axis and walks the lane tree with nine reshape/sum levels; each level moves data
between threads through shared memory, and its vector loop issues one load at a time. Measured on
an H200 in a decode step, its fused norm-add-norm cost 8.1 us per call at batch 1.

Here torch's ``lanes`` (a power of two, 32..512) are the tile ``[G, 32]`` with
``lane = g * 32 + j``: the shared-memory halving levels of torch's block_x_reduce (offsets
lanes/2 .. 32) pair lanes with the same ``j`` (g and g + G/2, ...), so they are adds inside a
thread whenever ``g`` lives in one thread's registers, and only the five warp levels (offsets
16 .. 1, over ``j``) cross threads. The vector loop is unrolled at compile time (ITERS =
ceil(vectors / lanes)) so every load of a row is in flight at once; the accumulation order is
still torch's (vector k = it * lanes + lane added in ``it`` order into accumulator ``k % 4``...).

Restrictions (the caller uses the general kernel otherwise): width % 4 == 0, so every row of
torch's fp32 temporary starts 16-byte aligned (no head, no tail), and the plan must be supported
(``ReducePlan.unsupported_reason is None``). ``TREE_SUM`` (GPU only) lets Triton's own warp
reduction do the five warp levels: its butterfly (xor offsets 16, 8, 4, 2, 1) gives lane 0 the
same operands, pair by pair, as torch >= 2.10's halving shuffles, and the start-up validation
(norm_onelaunch.validate) checks that on the GPU before anything is trusted. Under the
interpreter the explicit size-2 halving is used, and the CPU tests compare it with
torch_reduce_model bit for bit.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels import norm_onelaunch_lowwarp as lowwarp
from rltbench.kernels.norm_onelaunch import (
    MODE_ADD,
    MODE_X,
    _norm_norm_out,
    _norm_out,
    _rstd,
    _scaled,
    _sq,
    _sq_of,
    _vals,
)
from rltbench.kernels.pdl import launch_kwargs, mode_for
from rltbench.kernels.pdl import wait as pdl_wait
from rltbench.kernels.rounding import add_rn, load_f32, round_to, store_f32

MAX_ITERS = 16          # the static unroll bound: width 2048 at every plan, 5280 down to 128 lanes


@triton.jit
def _halve_g(s, HALF: tl.constexpr):
    """One shared-memory level over g: v[g] + v[g + HALF] (one fp32 add per pair)."""
    return tl.sum(tl.reshape(s, [2, HALF, 32]), axis=0)


@triton.jit
def _halve_j(s, HALF: tl.constexpr):
    """One warp level over j as torch >= 2.10 does it: v[j] + v[j + HALF]."""
    return tl.sum(tl.reshape(s, [2, HALF]), axis=0)


@triton.jit
def _pairs_j(s, HALF: tl.constexpr):
    """One warp level of older torch (offsets 1, 2, ..): v[2j] + v[2j + 1]."""
    return tl.sum(tl.reshape(s, [HALF, 2]), axis=1)


@triton.jit
def _fast_tree(acc, G: tl.constexpr, WARP_DOWN: tl.constexpr, TREE_SUM: tl.constexpr,
               INTERPRET: tl.constexpr):
    """torch's combination of the per-lane accumulators acc [G, 32, 4] (lane = g * 32 + j): each lane
    ((a0 + a1) + a2) + a3, the shared-memory halvings over g, then the five warp levels over j."""
    p, q = tl.split(tl.reshape(acc, [G, 32, 2, 2]))   # p = (a0, a2), q = (a1, a3)
    a0, a2 = tl.split(p)
    a1, a3 = tl.split(q)
    s = add_rn(add_rn(add_rn(a0, a1, INTERPRET), a2, INTERPRET), a3, INTERPRET)   # [G, 32]
    if G >= 16:
        s = _halve_g(s, 8)
    if G >= 8:
        s = _halve_g(s, 4)
    if G >= 4:
        s = _halve_g(s, 2)
    if G >= 2:
        s = _halve_g(s, 1)
    s = tl.reshape(s, [32])
    if WARP_DOWN:
        if TREE_SUM:
            s = tl.sum(tl.reshape(s, [1, 32]), axis=1)
        else:
            s = _halve_j(s, 16)
            s = _halve_j(s, 8)
            s = _halve_j(s, 4)
            s = _halve_j(s, 2)
            s = _halve_j(s, 1)
    else:
        s = _pairs_j(s, 16)
        s = _pairs_j(s, 8)
        s = _pairs_j(s, 4)
        s = _pairs_j(s, 2)
        s = _pairs_j(s, 1)
    return s                                     # [1]


@triton.jit
def _fast_sumsq(x_row, b_row, r_row, w1_ptr, rstd1, nvec, MODE: tl.constexpr, DT: tl.constexpr,
                INTERPRET: tl.constexpr, G: tl.constexpr, ITERS: tl.constexpr, WARP_DOWN: tl.constexpr,
                TREE_SUM: tl.constexpr):
    """Sum of squares of one 16-byte aligned row (width % 4 == 0) in torch's order, lanes = G * 32."""
    g = tl.arange(0, G)[:, None, None]
    j = tl.arange(0, 32)[None, :, None]
    i = tl.arange(0, 4)[None, None, :]
    lane = g * 32 + j
    acc = tl.zeros([G, 32, 4], dtype=tl.float32)
    for it in tl.static_range(ITERS):           # vector k = it * lanes + lane, element i -> acc i
        k = it * (G * 32) + lane
        m = (k < nvec) & (i < 4)
        acc = add_rn(acc, _sq(x_row, b_row, r_row, w1_ptr, rstd1, k * 4 + i, m, MODE, DT, INTERPRET),
                     INTERPRET)
    return _fast_tree(acc, G, WARP_DOWN, TREE_SUM, INTERPRET)


@triton.jit
def _fast_norm_norm_row1(a_row, r_row, w1_ptr, w2_ptr, h_row, y_row, var_row, nvec, eps, factor,
                         STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr, G: tl.constexpr,
                         WARP_DOWN: tl.constexpr, TREE_SUM: tl.constexpr, PDL: tl.constexpr):
    """Norm-add-norm of a row that one pass of the lanes covers (ITERS == 1, e.g. width 2048 at 512
    lanes: Ouro's decode rows): a, r, w1 and w2 are loaded once, up front, so no load waits behind
    the two reductions (w2 was a cold-cache load after both in the looped form), and h never
    leaves registers before it is stored. Same operations, same order as the looped kernel."""
    lane = tl.arange(0, G)[:, None, None] * 32 + tl.arange(0, 32)[None, :, None]
    i = tl.arange(0, 4)[None, None, :]
    cols = lane * 4 + i
    m = (lane < nvec) & (i < 4)
    w1 = load_f32(w1_ptr + cols, m, DT, INTERPRET)   # weights: written by no kernel, read before the wait
    w2 = load_f32(w2_ptr + cols, m, DT, INTERPRET)
    pdl_wait(PDL)
    a = load_f32(a_row + cols, m, DT, INTERPRET)
    r = load_f32(r_row + cols, m, DT, INTERPRET)
    var1, rstd1 = _rstd(_fast_tree(_sq_of(a, m, INTERPRET), G, WARP_DOWN, TREE_SUM, INTERPRET), factor, eps,
                        INTERPRET)
    y1 = _scaled(a, w1, rstd1, DT, INTERPRET)
    h = round_to(add_rn(r, y1, INTERPRET), DT, INTERPRET)
    var2, rstd2 = _rstd(_fast_tree(_sq_of(h, m, INTERPRET), G, WARP_DOWN, TREE_SUM, INTERPRET), factor, eps,
                        INTERPRET)
    if STORE_VAR:
        tl.store(var_row + tl.arange(0, 1), var1)
        tl.store(var_row + 1 + tl.arange(0, 1), var2)
    store_f32(h_row + cols, h, m, DT, INTERPRET)
    y = _scaled(h, w2, rstd2, DT, INTERPRET)
    store_f32(y_row + cols, y, m, DT, INTERPRET)


@triton.jit
def _fast_norm_row1(x_row, b_row, w_ptr, r_row, out_row, var_row, nvec, eps, factor, MODE: tl.constexpr,
                    HAS_R: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                    G: tl.constexpr, WARP_DOWN: tl.constexpr, TREE_SUM: tl.constexpr, PDL: tl.constexpr):
    """Single norm of a row one pass of the lanes covers (ITERS == 1: Ouro's and Huginn's decode
    rows at 512 lanes): x (b), w and r are all loaded before the reduction, so the weight and
    residual loads overlap it instead of following it, and x is not read twice. Same operations in
    the same order as the looped kernel (_vals MODE 0/1, _fast_tree, _norm_out)."""
    lane = tl.arange(0, G)[:, None, None] * 32 + tl.arange(0, 32)[None, :, None]
    i = tl.arange(0, 4)[None, None, :]
    cols = lane * 4 + i
    m = (lane < nvec) & (i < 4)
    w = load_f32(w_ptr + cols, m, DT, INTERPRET)     # the weight is read before the wait
    pdl_wait(PDL)
    v = _vals(x_row, b_row, x_row, w_ptr, 1.0, cols, m, MODE, DT, INTERPRET)
    if HAS_R:
        r = load_f32(r_row + cols, m, DT, INTERPRET)
    var, rstd = _rstd(_fast_tree(_sq_of(v, m, INTERPRET), G, WARP_DOWN, TREE_SUM, INTERPRET), factor, eps,
                      INTERPRET)
    if STORE_VAR:
        tl.store(var_row + tl.arange(0, 1), var)
    y = _scaled(v, w, rstd, DT, INTERPRET)
    if HAS_R:
        y = round_to(add_rn(r, y, INTERPRET), DT, INTERPRET)
    store_f32(out_row + cols, y, m, DT, INTERPRET)


@triton.jit
def _fast_norm_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, var_ptr, N, sx, sb, sr, eps, factor,
                      MODE: tl.constexpr, HAS_R: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr,
                      INTERPRET: tl.constexpr, G: tl.constexpr, ITERS: tl.constexpr,
                      WARP_DOWN: tl.constexpr, TREE_SUM: tl.constexpr, PDL: tl.constexpr):
    """One row per program; MODE 0 normalises x, MODE 1 round(x + b); HAS_R adds the residual.
    PDL (pdl.py): reads of x, b, r wait for the previous kernels; one-pass rows load w first."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    b_row = b_ptr + row * sb
    nvec = N // 4
    if ITERS == 1:
        _fast_norm_row1(x_row, b_row, w_ptr, r_ptr + row * sr, out_ptr + row * N, var_ptr + row, nvec, eps,
                        factor, MODE, HAS_R, STORE_VAR, DT, INTERPRET, G, WARP_DOWN, TREE_SUM, PDL)
    else:
        pdl_wait(PDL)
        total = _fast_sumsq(x_row, b_row, x_row, w_ptr, 1.0, nvec, MODE, DT, INTERPRET, G, ITERS, WARP_DOWN,
                            TREE_SUM)
        var, rstd = _rstd(total, factor, eps, INTERPRET)
        if STORE_VAR:
            tl.store(var_ptr + row + tl.arange(0, 1), var)
        lane = tl.arange(0, G)[:, None, None] * 32 + tl.arange(0, 32)[None, :, None]
        i = tl.arange(0, 4)[None, None, :]
        for it in tl.static_range(ITERS):
            k = it * (G * 32) + lane
            cols = k * 4 + i
            _norm_out(x_row, b_row, w_ptr, r_ptr + row * sr, out_ptr + row * N, rstd, cols,
                      (k < nvec) & (i < 4), MODE, HAS_R, DT, INTERPRET)


@triton.jit
def _fast_norm_norm_kernel(a_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, var_ptr, N, sa, sr, eps, factor,
                           STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                           G: tl.constexpr, ITERS: tl.constexpr, WARP_DOWN: tl.constexpr,
                           TREE_SUM: tl.constexpr, PDL: tl.constexpr):
    """h = r + rms_norm(a, w1); y = rms_norm(h, w2); the second sum recomputes h in its order."""
    row = tl.program_id(0).to(tl.int64)
    a_row = a_ptr + row * sa
    r_row = r_ptr + row * sr
    nvec = N // 4
    if ITERS == 1:
        _fast_norm_norm_row1(a_row, r_row, w1_ptr, w2_ptr, h_ptr + row * N, y_ptr + row * N,
                             var_ptr + row * 2, nvec, eps, factor, STORE_VAR, DT, INTERPRET, G, WARP_DOWN,
                             TREE_SUM, PDL)
    else:
        pdl_wait(PDL)
        t1 = _fast_sumsq(a_row, a_row, r_row, w1_ptr, 1.0, nvec, 0, DT, INTERPRET, G, ITERS, WARP_DOWN,
                         TREE_SUM)
        var1, rstd1 = _rstd(t1, factor, eps, INTERPRET)
        t2 = _fast_sumsq(a_row, a_row, r_row, w1_ptr, rstd1, nvec, 2, DT, INTERPRET, G, ITERS, WARP_DOWN,
                         TREE_SUM)
        var2, rstd2 = _rstd(t2, factor, eps, INTERPRET)
        if STORE_VAR:
            tl.store(var_ptr + row * 2 + tl.arange(0, 1), var1)
            tl.store(var_ptr + row * 2 + 1 + tl.arange(0, 1), var2)
        lane = tl.arange(0, G)[:, None, None] * 32 + tl.arange(0, 32)[None, :, None]
        i = tl.arange(0, 4)[None, None, :]
        for it in tl.static_range(ITERS):
            k = it * (G * 32) + lane
            cols = k * 4 + i
            _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_ptr + row * N, y_ptr + row * N, rstd1, rstd2, cols,
                           (k < nvec) & (i < 4), DT, INTERPRET)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------
def enabled() -> bool:
    """On where the device's tuned file says so (scripts/kernel_tune.py --write-tuned: the fastest
    configuration that passed its bitwise checks) or ``RLTBENCH_NORM_FAST=1``; off elsewhere. Being
    on only makes it a candidate: norm_onelaunch.validate still compares it with torch per (GPU,
    torch, dtype, width) and falls back to the general kernel when it differs."""
    return bool(tuned.knob("RLTBENCH_NORM_FAST", "norm_fast", "enabled", False))


def tree_sum_default(interpret: bool) -> bool:
    """Triton's own warp reduction for the five warp levels (GPU only; ``RLTBENCH_NORM_TREE_SUM=1``
    or the device's tuned file). Off by default: on the H200 (Triton 3.6) it changed the variance
    in a few validation rows (results/gpu/fastnorm: 'var' mismatches at 128..512 lanes, outputs
    equal), i.e. its combination order is not the halving order for the layout Triton picks; the
    explicit size-2 halvings are one add per pair whatever the layout."""
    return (not interpret) and bool(tuned.knob("RLTBENCH_NORM_TREE_SUM", "norm_fast", "tree_sum", False))


def variant(width: int, lanes: int, warp_down: bool) -> str:
    """Which fast layout serves a plan: "lowwarp" (norm_onelaunch_lowwarp) or "fast" (this file)."""
    return "lowwarp" if lowwarp.enabled() and lowwarp.supports(width, lanes, warp_down) else "fast"


def num_warps_for(lanes: int, interpret: bool) -> int:
    """Warps per program for the 512-lane plan from ``RLTBENCH_NORM_FAST_WARPS``, else the device's
    tuned file, else lanes / 128; narrower plans scale down (at least a warp of lanes each)."""
    if interpret:
        return 1
    w512 = int(tuned.knob("RLTBENCH_NORM_FAST_WARPS", "norm_fast", "warps", 4))
    return max(1, min(w512 * lanes // 512, lanes // 32))


def supports(width: int, lanes: int, warp_down: bool) -> bool:
    """Shapes the fast kernels take: 16-byte aligned rows, 32..512 lanes, a bounded unroll. The
    older ``up`` warp order keeps the general kernel (never validated on a GPU here)."""
    if width % 4 or lanes < 32 or lanes > 512 or lanes & (lanes - 1) or not warp_down:
        return False
    return triton.cdiv(width // 4, lanes) <= MAX_ITERS


def launch_norm(x, b, r, w, out, var, width: int, sx: int, sb: int, sr: int, eps: float, factor: float,
                lanes: int, mode: int, has_r: bool, store_var: bool, dt: int, interpret: bool,
                warp_down: bool) -> None:
    """Launch the fast single norm over x.shape[0] rows (arguments as the general kernel); the
    low-warp layout (norm_onelaunch_lowwarp) where it is on and takes the plan."""
    if lowwarp.enabled() and lowwarp.supports(width, lanes, warp_down):
        lowwarp.launch_norm(x, b, r, w, out, var, width, sx, sb, sr, eps, factor, lanes, mode, has_r,
                            store_var, dt, interpret)
        return
    _fast_norm_kernel[(x.shape[0],)](
        x, b, r, w, out, var, width, sx, sb, sr, eps, factor,
        MODE=mode, HAS_R=has_r, STORE_VAR=store_var, DT=dt, INTERPRET=interpret, G=lanes // 32,
        ITERS=triton.cdiv(width // 4, lanes), WARP_DOWN=warp_down, TREE_SUM=tree_sum_default(interpret),
        num_warps=num_warps_for(lanes, interpret), **launch_kwargs(mode_for(x, interpret)),
    )  # fmt: skip


def launch_norm_norm(a, r, w1, w2, h, y, var, width: int, sa: int, sr: int, eps: float, factor: float,
                     lanes: int, store_var: bool, dt: int, interpret: bool, warp_down: bool) -> None:
    """Launch the fast fused norm-add-norm over a.shape[0] rows (low-warp layout as launch_norm)."""
    if lowwarp.enabled() and lowwarp.supports(width, lanes, warp_down):
        lowwarp.launch_norm_norm(a, r, w1, w2, h, y, var, width, sa, sr, eps, factor, lanes, store_var, dt,
                                 interpret)
        return
    _fast_norm_norm_kernel[(a.shape[0],)](
        a, r, w1, w2, h, y, var, width, sa, sr, eps, factor,
        STORE_VAR=store_var, DT=dt, INTERPRET=interpret, G=lanes // 32,
        ITERS=triton.cdiv(width // 4, lanes), WARP_DOWN=warp_down, TREE_SUM=tree_sum_default(interpret),
        num_warps=num_warps_for(lanes, interpret), **launch_kwargs(mode_for(a, interpret)),
    )  # fmt: skip


__all__ = ["MODE_ADD", "MODE_X", "enabled", "launch_norm", "launch_norm_norm", "supports"]
