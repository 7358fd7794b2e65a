"""Approximate RMSNorm: one launch, fp32 throughout (one-pass sum of squares in Triton's tree
order), one final rounding. Faster than exact but not bitwise: its error is reported against the
fp64 oracle (oracle.py). Rows must fit one tile (width <= MAX_WIDTH; Ops falls back otherwise)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rltbench import tuned
from rltbench.kernels import pdl
from rltbench.kernels.layout import row_stride
from rltbench.kernels.pdl import wait as pdl_wait
from rltbench.kernels.rounding import dtype_code, interpret_mode, load_f32, round_to, store_f32

MAX_WIDTH = 65536


@triton.jit
def _ld(ptrs, mask, DT: tl.constexpr, INTERPRET: tl.constexpr, STREAM: tl.constexpr):
    """load_f32, or (STREAM, GPU) a load marked evict-first: each row is read once, so it should
    not displace the weight row or the output's pending writes in L2."""
    if STREAM and not INTERPRET:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        return load_f32(ptrs, mask, DT, INTERPRET)


@triton.jit
def _ld_w(ptrs, mask, DT: tl.constexpr, INTERPRET: tl.constexpr, WLOAD: tl.constexpr):
    """The weight row (read by every program): WLOAD 2 marks it evict-last on the GPU, so the rows
    streaming past do not push it out of L2 between programs."""
    if WLOAD == 2 and not INTERPRET:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        return load_f32(ptrs, mask, DT, INTERPRET)


@triton.jit
def _st(ptrs, x, mask, DT: tl.constexpr, INTERPRET: tl.constexpr, STREAM: tl.constexpr):
    """store_f32, or (STREAM, GPU) a streaming store (st.global.cs: written once, not re-read)."""
    if STREAM and not INTERPRET:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        store_f32(ptrs, x, mask, DT, INTERPRET)


@triton.jit
def _rms_norm_approx_kernel(
    x_ptr,
    b_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    R,
    W,
    sx,
    sb,
    sr,
    eps,
    HAS_B: tl.constexpr,
    HAS_R: tl.constexpr,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    STREAM: tl.constexpr,
    WLOAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per BLOCK_R rows. WLOAD: where the weight row is loaded (_wload). PDL (_pdl_mode):
    the weight (WLOAD 0/2) is read before ``griddepcontrol.wait``, the rows after it."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None].to(tl.int64)
    cols = tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < R) & (cols < W)
    # the weight with the row, not after the reduction (in a model the weight row is cold; loaded
    # after the sum, its DRAM latency followed the barrier: 11.0 vs 10.5 us per call at T=4096 with a
    # weight per input set, results/gpu/approx-harness-before)
    if WLOAD != 1:
        w = _ld_w(w_ptr + cols, cols < W, DT, INTERPRET, WLOAD)
    pdl_wait(PDL)
    v = _ld(x_ptr + rows * sx + cols, mask, DT, INTERPRET, STREAM)
    if HAS_B:
        v += _ld(b_ptr + rows * sb + cols, mask, DT, INTERPRET, STREAM)
    if WLOAD == 1:
        w = _ld_w(w_ptr + cols, cols < W, DT, INTERPRET, WLOAD)
    rstd = tl.rsqrt(tl.sum(v * v, axis=1) / W + eps)
    y = v * rstd[:, None] * w
    if HAS_R:
        y += _ld(r_ptr + rows * sr + cols, mask, DT, INTERPRET, STREAM)
    _st(out_ptr + rows * W + cols, y, mask, DT, INTERPRET, STREAM)


@triton.jit
def _rms_norm_approx_persistent_kernel(
    x_ptr,
    b_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    R,
    W,
    sx,
    sb,
    sr,
    eps,
    HAS_B: tl.constexpr,
    HAS_R: tl.constexpr,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_C: tl.constexpr,
    STAGES: tl.constexpr,
    STREAM: tl.constexpr,
):
    """Persistent variant: a grid of a few programs per SM, each striding over rows, so the weight
    row is loaded once per program and the loop's loads can be software-pipelined (``STAGES``):
    the next row is in flight while this one is reduced. Same math as the one-row kernel."""
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < W
    w = load_f32(w_ptr + cols, cmask, DT, INTERPRET)
    # an int64 start makes the loop variable int64 (row * stride cannot overflow)
    for r64 in tl.range(tl.program_id(0).to(tl.int64), R, tl.num_programs(0), num_stages=STAGES):
        v = _ld(x_ptr + r64 * sx + cols, cmask, DT, INTERPRET, STREAM)
        if HAS_B:
            v += _ld(b_ptr + r64 * sb + cols, cmask, DT, INTERPRET, STREAM)
        rstd = tl.rsqrt(tl.sum(v * v, axis=0) / W + eps)
        y = v * rstd * w
        if HAS_R:
            y += _ld(r_ptr + r64 * sr + cols, cmask, DT, INTERPRET, STREAM)
        _st(out_ptr + r64 * W + cols, y, cmask, DT, INTERPRET, STREAM)


@triton.jit
def _norm_norm_approx_kernel(
    x_ptr,
    r_ptr,
    w1_ptr,
    w2_ptr,
    h_ptr,
    y_ptr,
    R,
    W,
    sx,
    sr,
    eps,
    DT: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    STREAM: tl.constexpr,
    PDL: tl.constexpr,
):
    """Ouro's norm-add-norm in one launch: h = r + rms_norm(x, w1), y = rms_norm(h, w2), fp32 inside.
    h is rounded to the activation dtype before the second norm reads it, because h is the residual
    stream the model stores: y is the norm of the stored h (as torch computes it), not of an fp32 h
    no later layer sees. Each output has one rounding."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None].to(tl.int64)
    cols = tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < R) & (cols < W)
    w1 = load_f32(w1_ptr + cols, cols < W, DT, INTERPRET)
    w2 = load_f32(w2_ptr + cols, cols < W, DT, INTERPRET)
    pdl_wait(PDL)
    v = _ld(x_ptr + rows * sx + cols, mask, DT, INTERPRET, STREAM)
    r = _ld(r_ptr + rows * sr + cols, mask, DT, INTERPRET, STREAM)
    rstd1 = tl.rsqrt(tl.sum(v * v, axis=1) / W + eps)
    h = round_to(r + v * rstd1[:, None] * w1, DT, INTERPRET)
    _st(h_ptr + rows * W + cols, h, mask, DT, INTERPRET, STREAM)
    rstd2 = tl.rsqrt(tl.sum(h * h, axis=1) / W + eps)
    _st(y_ptr + rows * W + cols, h * rstd2[:, None] * w2, mask, DT, INTERPRET, STREAM)


def _knob(env: str, key: str, default: int, width: int) -> int:
    """A launch knob: the environment, else the device's tuned value for this width (``by_width``),
    else its tuned default, else `default`."""
    return int(tuned.knob(env, "norm_approx", key, default, sub=("by_width", str(width))))


def _pow2_knob(env: str, key: str, default: int, width: int) -> int:
    v = _knob(env, key, default, width)
    if v < 1 or v & (v - 1):
        raise ValueError(f"{env} must be a power of two, got {v}")
    return v


def _rows_per_program(width: int) -> int:
    return _pow2_knob("RLTBENCH_APPROX_NORM_ROWS", "rows", 1, width)


def _persist(width: int) -> int:
    """Programs per SM of the persistent kernel (0: one program per row block, the default)."""
    v = _knob("RLTBENCH_APPROX_NORM_PERSIST", "persist", 0, width)
    if v < 0:
        raise ValueError(f"RLTBENCH_APPROX_NORM_PERSIST must be >= 0, got {v}")
    return v


def _stages(width: int) -> int:
    v = _knob("RLTBENCH_APPROX_NORM_STAGES", "stages", 1, width)
    if v < 1:
        raise ValueError(f"RLTBENCH_APPROX_NORM_STAGES must be >= 1, got {v}")
    return v


def _stream(width: int) -> bool:
    """Evict-first loads and streaming stores (``RLTBENCH_APPROX_NORM_STREAM`` / tuned ``stream``)."""
    return bool(_knob("RLTBENCH_APPROX_NORM_STREAM", "stream", 0, width))


def _wload(width: int) -> int:
    """Weight load of the one-row kernel (``RLTBENCH_APPROX_NORM_WLOAD`` / tuned ``wload``): 0 before
    the row (default), 1 right after the row's loads (the row's DRAM requests go first; the weight is
    the same few lines for every program, so with a cold weight the first wave queues on them), 2
    before the row, evict-last."""
    v = _knob("RLTBENCH_APPROX_NORM_WLOAD", "wload", 0, width)
    if v not in (0, 1, 2):
        raise ValueError(f"RLTBENCH_APPROX_NORM_WLOAD must be 0, 1 or 2, got {v}")
    return v


def pdl_requested(rows: int, width: int) -> int:
    """The PDL mode asked for a launch over `rows` rows (``RLTBENCH_APPROX_NORM_PDL`` / tuned ``pdl``,
    modes as pdl.py, 0 by default), 0 below ``RLTBENCH_APPROX_NORM_PDL_MIN_ROWS`` / tuned
    ``pdl_min_rows``: PDL overlaps the launch and the weight's load with the previous kernel's tail
    (at T=4096: 9.25 vs 10.26 us per call, results/gpu/approx-harness), but at decode sizes PDL on the
    exact kernels made the step slower (results/gpu/profile-pdl1), so small launches stay plain."""
    mode = _knob("RLTBENCH_APPROX_NORM_PDL", "pdl", 0, width)
    if mode not in pdl.MODES:
        raise ValueError(f"RLTBENCH_APPROX_NORM_PDL must be one of {pdl.MODES}, got {mode}")
    min_rows = _knob("RLTBENCH_APPROX_NORM_PDL_MIN_ROWS", "pdl_min_rows", 0, width)
    return mode if rows >= min_rows else 0


def _pdl_mode(x: torch.Tensor, interp: bool) -> int:
    """The mode the one-row kernel launches with: the request, where the device can do PDL."""
    return pdl.mode_for(x, interp, pdl_requested(x.shape[0], x.shape[-1]))


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _warps(tile: int, width: int) -> int:
    """Warps per program: ``RLTBENCH_APPROX_NORM_WARPS`` / the tuned file, else as Liger's
    calculate_settings by tile size."""
    return _pow2_knob("RLTBENCH_APPROX_NORM_WARPS", "warps", 16 if tile >= 8192 else 8 if tile >= 2048 else 4,
                      width)


def _row_block(R: int, W: int, block_c: int, interp: bool) -> tuple[int, int]:
    """(rows per program, warps) of the one-row kernels. GPU: RLTBENCH_APPROX_NORM_ROWS (a power of
    two, 1 by default; tuned per width), warps as Liger's calculate_settings per tile. Interpreter:
    as many rows as fit a 16K-element tile, one warp (its cost is per program, not per element)."""
    if interp:
        return max(1, min(triton.next_power_of_2(R), 16384 // block_c)), 1
    block_r = min(_rows_per_program(W), triton.next_power_of_2(R))
    return block_r, _warps(block_r * block_c, W)


def rms_norm_approx_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    branch: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """One-launch RMSNorm of the 2-D rows x (+ branch) into `out` (+ residual)."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    interp = interpret_mode()
    block_c = triton.next_power_of_2(W)
    block_r, nw = _row_block(R, W, block_c, interp)
    b = branch if branch is not None else x
    r = residual if residual is not None else x
    persist = _persist(W)
    if persist and (interp or x.is_cuda):
        sms = _sm_count(x.device.index if x.device.index is not None else torch.cuda.current_device()) \
            if x.is_cuda else 2
        _rms_norm_approx_persistent_kernel[(max(1, min(R, persist * sms)),)](
            x, b, r, w, out, R, W, row_stride(x), row_stride(b), row_stride(r), float(eps),
            HAS_B=branch is not None, HAS_R=residual is not None, DT=dtype_code(x.dtype), INTERPRET=interp,
            BLOCK_C=block_c, STAGES=_stages(W), STREAM=_stream(W),
            num_warps=1 if interp else _warps(block_c, W),
        )  # fmt: skip
        return
    _rms_norm_approx_kernel[(triton.cdiv(R, block_r),)](
        x,
        b,
        r,
        w,
        out,
        R,
        W,
        row_stride(x),
        row_stride(b),
        row_stride(r),
        float(eps),
        HAS_B=branch is not None,
        HAS_R=residual is not None,
        DT=dtype_code(x.dtype),
        INTERPRET=interp,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        STREAM=_stream(W),
        WLOAD=_wload(W),
        num_warps=nw,
        **pdl.launch_kwargs(_pdl_mode(x, interp)),
    )


def residual_rms_norm_norm_approx_rows(
    residual: torch.Tensor,
    branch: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    eps: float,
    h_out: torch.Tensor,
    y_out: torch.Tensor,
) -> None:
    """One-launch approx ``h = residual + rms_norm(branch, w1)``, ``y = rms_norm(h, w2)`` of 2-D rows
    (h_out, y_out contiguous). Launch knobs as the single norm's one-row kernel at this width (the
    persistent kernel has no norm-add-norm form)."""
    R, W = branch.shape
    if R == 0 or W == 0:
        return
    interp = interpret_mode()
    block_c = triton.next_power_of_2(W)
    block_r, nw = _row_block(R, W, block_c, interp)
    _norm_norm_approx_kernel[(triton.cdiv(R, block_r),)](
        branch, residual, w1, w2, h_out, y_out, R, W, row_stride(branch), row_stride(residual), float(eps),
        DT=dtype_code(branch.dtype), INTERPRET=interp, BLOCK_R=block_r, BLOCK_C=block_c, STREAM=_stream(W),
        num_warps=nw, **pdl.launch_kwargs(_pdl_mode(branch, interp)),
    )  # fmt: skip
