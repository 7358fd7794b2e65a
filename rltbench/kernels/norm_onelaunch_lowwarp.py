"""Exact one-launch RMSNorm, low-warp layout: torch's CUDA summation order with the warps on
torch's *lowest* lane bits, so Triton's own reduction performs torch's tree.

Why: torch's block reduction over `lanes` (a power of two) halves by the highest lane bit first
(offsets lanes/2 .. 32 in shared memory, then 16 .. 1 in the warp): a balanced tree whose *last*
levels pair lanes that differ in bits 1 and 0. norm_onelaunch_fast puts 32 consecutive torch lanes
on a warp, so its cross-warp levels (lane bits 6 and 5 at 512 lanes) fall in the middle of the
tree, and each costs Triton a shared-memory exchange with its barriers (7 barriers per norm at 4
warps; 2.21 us at T=1 against 1.54 for the approx norm's single exchange, results/gpu/tune-t1).

Here a program of NW warps holds torch lane ``l = r * 32 NW + h * NW + w`` in warp w, hardware
lane h, in-thread index r < lanes / (32 NW), four columns each (at 4 warps and 512 lanes:
l = r * 128 + h * 4 + w). The tree then runs as: the in-thread levels over r (torch's first ones),
then one ``tl.sum`` over the 32 NW (h, w) partials, whose lowering is a warp butterfly over h (xor
16 .. 1: torch's offsets 16 NW .. NW) and one cross-warp round over w (xor NW/2 .. 1: offsets
NW/2 .. 1); every add has torch's two operands (a + b == b + a bit for bit). One shared-memory
exchange instead of several, whatever the warp count. That butterfly is Triton's lowering, not a
language guarantee: on the 4-D tile under Triton 3.6 it held at 4 and 8 warps only (tl_sum() says
where it failed), so the default writes the same tree out as explicit size-2 halvings (one add each,
whatever the layout; three barriers at 4 warps). The flat tile (_lanes FLAT) gives Triton the
intended layout, and there its reduction is the butterfly: the H200's tuned choice (flat, tl.sum,
4 warps: 1.56 us at T=1). The start-up validation compares any of them with torch on the GPU before
it is trusted, and the CPU tests compare the halvings with torch_reduce_model bit for bit.

Shapes: width % 4 == 0 (16-byte aligned fp32 rows in torch's temporary, as the fast kernel), lanes
32..512 (NW is capped at lanes / 32), at most MAX_ITERS vectors per lane.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels.norm_onelaunch import _norm_norm_out, _norm_out, _rstd, _scaled, _sq, _sq_of, _vals
from rltbench.kernels.pdl import launch_kwargs, mode_for
from rltbench.kernels.pdl import wait as pdl_wait
from rltbench.kernels.rounding import add_rn, load_f32, round_to, store_f32

MAX_ITERS = 16
MAX_WARPS = 16


@triton.jit
def _lanes(R: tl.constexpr, NW: tl.constexpr, FLAT: tl.constexpr):
    """torch lane (l = r * 32 NW + h * NW + w) of each row of the tile and the column offset i.

    FLAT == 0: a [R, NW, 32, 1] lane tile and [1, 1, 1, 4] offsets, laid out as Triton's coalescing
    pass decides: Triton 3.9 puts h on the lanes, w on the warps and r in registers, Triton 3.6
    (order [3, 0, 1, 2]) r and w on lanes and h on warps, which costs it shuffles and a second
    exchange. FLAT == 1: a [R * NW * 32, 1] tile (row m = r * 32 NW + w * 32 + h) and [1, 4]
    offsets: with one non-contiguous dim every Triton lays m out as lane = m % 32, warp = (m / 32)
    % NW, register = r, which is the intended layout; the tree reshapes it to [R, NW, 32, 4]."""
    if FLAT:
        m = tl.arange(0, R * NW * 32)[:, None]
        r = m // (32 * NW)
        w = (m // 32) % NW
        h = m % 32
        return r * (32 * NW) + h * NW + w, tl.arange(0, 4)[None, :]
    else:
        r = tl.arange(0, R)[:, None, None, None]
        w = tl.arange(0, NW)[None, :, None, None]
        h = tl.arange(0, 32)[None, None, :, None]
        i = tl.arange(0, 4)[None, None, None, :]
        return r * (32 * NW) + h * NW + w, i


@triton.jit
def _zeros(R: tl.constexpr, NW: tl.constexpr, FLAT: tl.constexpr):
    if FLAT:
        return tl.zeros([R * NW * 32, 4], dtype=tl.float32)
    else:
        return tl.zeros([R, NW, 32, 4], dtype=tl.float32)


@triton.jit
def _tree(acc, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr, LOG_NW: tl.constexpr,
          TL_SUM: tl.constexpr, INTERPRET: tl.constexpr):
    """torch's combination of the per-lane accumulators acc [R, NW, 32, 4]: each lane
    ((a0 + a1) + a2) + a3, the levels over r (in-thread), then over h, then over w."""
    p, q = tl.split(tl.reshape(acc, [R, NW, 32, 2, 2]))   # p = (a0, a2), q = (a1, a3); FLAT rows too
    a0, a2 = tl.split(p)
    a1, a3 = tl.split(q)
    s = add_rn(add_rn(add_rn(a0, a1, INTERPRET), a2, INTERPRET), a3, INTERPRET)   # [R, NW, 32]
    for k in tl.static_range(LOG_R):             # r: pairs (r, r + R/2), .. (r, r + 1)
        s = tl.sum(tl.reshape(s, [2, R >> (k + 1), NW, 32]), axis=0)
    s = tl.reshape(s, [NW, 32])                  # [w, h]
    if TL_SUM and not INTERPRET:
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
def _rstd_of(v, m, factor, eps, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr, LOG_NW: tl.constexpr,
             TL_SUM: tl.constexpr, INTERPRET: tl.constexpr):
    """(variance, rstd) of a one-pass row whose values are in registers (masked lanes add 0)."""
    total = _tree(_sq_of(v, m, INTERPRET), R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)
    return _rstd(total, factor, eps, INTERPRET)


@triton.jit
def _sumsq(x_row, b_row, r_row, w1_ptr, rstd1, nvec, MODE: tl.constexpr, DT: tl.constexpr,
           INTERPRET: tl.constexpr, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr,
           LOG_NW: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr, FLAT: tl.constexpr):
    """Sum of squares of one 16-byte aligned row in torch's order, lanes = R * 32 * NW."""
    lane, i = _lanes(R, NW, FLAT)
    acc = _zeros(R, NW, FLAT)
    for it in tl.static_range(ITERS):           # vector k = it * lanes + lane, element i -> acc i
        k = it * (R * 32 * NW) + lane
        m = (k < nvec) & (i < 4)
        acc = add_rn(acc, _sq(x_row, b_row, r_row, w1_ptr, rstd1, k * 4 + i, m, MODE, DT, INTERPRET),
                     INTERPRET)
    return _tree(acc, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)


@triton.jit
def _norm_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, var_ptr, N, sx, sb, sr, eps, factor,
                 MODE: tl.constexpr, HAS_R: tl.constexpr, STORE_VAR: tl.constexpr, DT: tl.constexpr,
                 INTERPRET: tl.constexpr, R: tl.constexpr, LOG_R: tl.constexpr, NW: tl.constexpr,
                 LOG_NW: tl.constexpr, ITERS: tl.constexpr, TL_SUM: tl.constexpr, FLAT: tl.constexpr,
                 PDL: tl.constexpr):
    """One row per program (MODE 0: x, MODE 1: round(x + b); HAS_R adds the residual). A row one
    pass covers (ITERS == 1) is loaded once, weight first, and kept in registers."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    b_row = b_ptr + row * sb
    r_row = r_ptr + row * sr
    out_row = out_ptr + row * N
    nvec = N // 4
    lane, i = _lanes(R, NW, FLAT)
    if ITERS == 1:
        cols = lane * 4 + i
        m = (lane < nvec) & (i < 4)
        w = load_f32(w_ptr + cols, m, DT, INTERPRET)
        pdl_wait(PDL)
        v = _vals(x_row, b_row, x_row, w_ptr, 1.0, cols, m, MODE, DT, INTERPRET)
        if HAS_R:
            r = load_f32(r_row + cols, m, DT, INTERPRET)
        var, rstd = _rstd_of(v, m, factor, eps, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)
        y = _scaled(v, w, rstd, DT, INTERPRET)
        if HAS_R:
            y = round_to(add_rn(r, y, INTERPRET), DT, INTERPRET)
        store_f32(out_row + cols, y, m, DT, INTERPRET)
    else:
        pdl_wait(PDL)
        total = _sumsq(x_row, b_row, x_row, w_ptr, 1.0, nvec, MODE, DT, INTERPRET, R, LOG_R, NW, LOG_NW,
                       ITERS, TL_SUM, FLAT)
        var, rstd = _rstd(total, factor, eps, INTERPRET)
        for it in tl.static_range(ITERS):
            k = it * (R * 32 * NW) + lane
            _norm_out(x_row, b_row, w_ptr, r_row, out_row, rstd, k * 4 + i, (k < nvec) & (i < 4), MODE, HAS_R,
                      DT, INTERPRET)
    if STORE_VAR:
        tl.store(var_ptr + row, var)


@triton.jit
def _norm_norm_kernel(a_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, var_ptr, N, sa, sr, eps, factor,
                      STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr, R: tl.constexpr,
                      LOG_R: tl.constexpr, NW: tl.constexpr, LOG_NW: tl.constexpr, ITERS: tl.constexpr,
                      TL_SUM: tl.constexpr, FLAT: tl.constexpr, PDL: tl.constexpr):
    """h = r + rms_norm(a, w1); y = rms_norm(h, w2). One-pass rows keep a, r, h in registers."""
    row = tl.program_id(0).to(tl.int64)
    a_row = a_ptr + row * sa
    r_row = r_ptr + row * sr
    h_row = h_ptr + row * N
    y_row = y_ptr + row * N
    nvec = N // 4
    lane, i = _lanes(R, NW, FLAT)
    if ITERS == 1:
        cols = lane * 4 + i
        m = (lane < nvec) & (i < 4)
        w1 = load_f32(w1_ptr + cols, m, DT, INTERPRET)
        w2 = load_f32(w2_ptr + cols, m, DT, INTERPRET)
        pdl_wait(PDL)
        a = load_f32(a_row + cols, m, DT, INTERPRET)
        r = load_f32(r_row + cols, m, DT, INTERPRET)
        var1, rstd1 = _rstd_of(a, m, factor, eps, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)
        h = round_to(add_rn(r, _scaled(a, w1, rstd1, DT, INTERPRET), INTERPRET), DT, INTERPRET)
        var2, rstd2 = _rstd_of(h, m, factor, eps, R, LOG_R, NW, LOG_NW, TL_SUM, INTERPRET)
        store_f32(h_row + cols, h, m, DT, INTERPRET)
        store_f32(y_row + cols, _scaled(h, w2, rstd2, DT, INTERPRET), m, DT, INTERPRET)
    else:
        pdl_wait(PDL)
        t1 = _sumsq(a_row, a_row, r_row, w1_ptr, 1.0, nvec, 0, DT, INTERPRET, R, LOG_R, NW, LOG_NW, ITERS,
                    TL_SUM, FLAT)
        var1, rstd1 = _rstd(t1, factor, eps, INTERPRET)
        t2 = _sumsq(a_row, a_row, r_row, w1_ptr, rstd1, nvec, 2, DT, INTERPRET, R, LOG_R, NW, LOG_NW, ITERS,
                    TL_SUM, FLAT)
        var2, rstd2 = _rstd(t2, factor, eps, INTERPRET)
        for it in tl.static_range(ITERS):
            k = it * (R * 32 * NW) + lane
            _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_row, y_row, rstd1, rstd2, k * 4 + i,
                           (k < nvec) & (i < 4), DT, INTERPRET)
    if STORE_VAR:
        tl.store(var_ptr + row * 2, var1)
        tl.store(var_ptr + row * 2 + 1, var2)


# ----------------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------------
def enabled() -> bool:
    """On where the device's tuned file says so (``norm_fast.lowwarp``, written by kernel_tune.py
    when it was the fastest configuration that passed its bitwise checks) or
    ``RLTBENCH_NORM_LOWWARP=1``. A candidate only: validation still decides per GPU/torch/width."""
    return bool(tuned.knob("RLTBENCH_NORM_LOWWARP", "norm_fast", "lowwarp", False))


def tl_sum(interpret: bool) -> bool:
    """Triton's own reduction for the (h, w) levels (GPU only; ``RLTBENCH_NORM_LOWWARP_TLSUM=1`` or
    tuned ``lowwarp_tl_sum``). Off by default: on the 4-D tile under Triton 3.6 it did not match
    torch at 2 and 16 warps (session 5, variance mismatches: that tile's layout puts r and w on
    lanes), so it is not torch's order on every layout; the explicit size-2 halvings are one add per
    pair whatever the layout (three barriers instead of one). On the flat tile (flat()) it is the
    intended butterfly: the H200's tuned file turns both on (0 mismatches at 1, 2 and 4 warps,
    T=1 1.56 us against 1.65 for the halvings, results/gpu/tune, session 6)."""
    return (not interpret) and bool(tuned.knob("RLTBENCH_NORM_LOWWARP_TLSUM", "norm_fast", "lowwarp_tl_sum",
                                               False))


def flat() -> bool:
    """The flat lane tile (_lanes FLAT; ``RLTBENCH_NORM_LOWWARP_FLAT`` / tuned ``lowwarp_flat``): the
    intended layout under every Triton (sm_90 SASS with Triton 3.6: 5 shuffles, the exchange, the
    warp levels; the 4-D tile adds 8 shuffles and a second exchange there). Same adds, same order
    either way. Off by default; tuned on for the H200 with tl_sum() (results/gpu/tune)."""
    return bool(tuned.knob("RLTBENCH_NORM_LOWWARP_FLAT", "norm_fast", "lowwarp_flat", False))


def warps_for(lanes: int) -> int:
    """Warps per program: ``RLTBENCH_NORM_LOWWARP_WARPS`` / tuned ``lowwarp_warps`` (default 4),
    at most one warp per 32 lanes (a 64-lane plan gets 2 warps, a 32-lane plan 1)."""
    nw = int(tuned.knob("RLTBENCH_NORM_LOWWARP_WARPS", "norm_fast", "lowwarp_warps", 4))
    if nw < 1 or nw > MAX_WARPS or nw & (nw - 1):
        raise ValueError(f"RLTBENCH_NORM_LOWWARP_WARPS must be a power of two in 1..{MAX_WARPS}, got {nw}")
    return min(nw, lanes // 32)


def describe() -> str:
    """The knobs in force, for validation reports (which layout a validated width runs)."""
    tree = "tl.sum" if tl_sum(False) else "halvings"
    return f"lowwarp ({warps_for(512)} warps at 512 lanes, {'flat' if flat() else '4-d'} tile, {tree})"


def supports(width: int, lanes: int, warp_down: bool) -> bool:
    """16-byte aligned rows, 32..512 lanes (a power of two), torch's halving warp order, a bounded
    unroll."""
    if width % 4 or lanes < 32 or lanes > 512 or lanes & (lanes - 1) or not warp_down:
        return False
    return triton.cdiv(width // 4, lanes) <= MAX_ITERS


def _shape_args(width: int, lanes: int, interpret: bool) -> dict[str, int]:
    """The layout constexprs of a plan: R torch lanes per thread, NW warps, ITERS vectors per lane.
    The interpreter runs the same layout (its num_warps is only a launch detail there)."""
    nw = warps_for(lanes)
    r = lanes // (32 * nw)
    return {"R": r, "LOG_R": r.bit_length() - 1, "NW": nw, "LOG_NW": nw.bit_length() - 1,
            "ITERS": triton.cdiv(width // 4, lanes), "FLAT": flat(), "num_warps": 1 if interpret else nw}


def launch_norm(x, b, r, w, out, var, width: int, sx: int, sb: int, sr: int, eps: float, factor: float,
                lanes: int, mode: int, has_r: bool, store_var: bool, dt: int, interpret: bool) -> None:
    """The single norm over x.shape[0] rows (arguments as norm_onelaunch_fast.launch_norm)."""
    _norm_kernel[(x.shape[0],)](
        x, b, r, w, out, var, width, sx, sb, sr, eps, factor,
        MODE=mode, HAS_R=has_r, STORE_VAR=store_var, DT=dt, INTERPRET=interpret, TL_SUM=tl_sum(interpret),
        **_shape_args(width, lanes, interpret), **launch_kwargs(mode_for(x, interpret)),
    )  # fmt: skip


def launch_norm_norm(a, r, w1, w2, h, y, var, width: int, sa: int, sr: int, eps: float, factor: float,
                     lanes: int, store_var: bool, dt: int, interpret: bool) -> None:
    """The fused norm-add-norm over a.shape[0] rows."""
    _norm_norm_kernel[(a.shape[0],)](
        a, r, w1, w2, h, y, var, width, sa, sr, eps, factor,
        STORE_VAR=store_var, DT=dt, INTERPRET=interpret, TL_SUM=tl_sum(interpret),
        **_shape_args(width, lanes, interpret), **launch_kwargs(mode_for(a, interpret)),
    )  # fmt: skip
