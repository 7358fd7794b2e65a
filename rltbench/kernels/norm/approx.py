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
from rltbench.kernels.norm.config import ApproxNormConfig, ApproxNormLaunch
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
def _rms_norm_approx_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, R, W, sx, sb, sr, eps, HAS_B: tl.constexpr,
                            HAS_R: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STREAM: tl.constexpr,
                            WLOAD: tl.constexpr, PDL: tl.constexpr):
    """One program per BLOCK_R rows. WLOAD: where the weight row is loaded (ApproxNormLaunch.wload).
    PDL (_pdl_mode):
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
def _rms_norm_approx_persistent_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, R, W, sx, sb, sr, eps,
                                       HAS_B: tl.constexpr, HAS_R: tl.constexpr, DT: tl.constexpr,
                                       INTERPRET: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,
                                       STREAM: tl.constexpr):
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
def _norm_norm_approx_kernel(x_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, R, W, sx, sr, eps, DT: tl.constexpr,
                             INTERPRET: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                             STREAM: tl.constexpr, PDL: tl.constexpr):
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


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _warps(cfg: ApproxNormLaunch, tile: int) -> int:
    """Warps per program: the config's, else as Liger's calculate_settings by tile size."""
    if cfg.warps is not None:
        return cfg.warps
    return 16 if tile >= 8192 else 8 if tile >= 2048 else 4


def _row_block(R: int, block_c: int, cfg: ApproxNormLaunch, interp: bool) -> tuple[int, int]:
    """(rows per program, warps) of the one-row kernels. GPU: the config's rows (at most the rows
    there are), warps per tile. Interpreter: as many rows as fit a 16K-element tile, one warp (its
    cost is per program, not per element)."""
    if interp:
        return max(1, min(triton.next_power_of_2(R), 16384 // block_c)), 1
    block_r = min(cfg.rows, triton.next_power_of_2(R))
    return block_r, _warps(cfg, block_r * block_c)


def _pdl_mode(x: torch.Tensor, cfg: ApproxNormLaunch, interp: bool) -> int:
    """The PDL mode of a launch over x's rows: the config's from its row count (PDL overlaps the
    launch and the weight's load with the previous kernel's tail: at T=4096 9.25 vs 10.26 us per
    call, results/gpu/approx-harness), where the device can do PDL."""
    return pdl.mode_for(x, interp, cfg.pdl_mode(x.shape[0]))


def launch_config(width: int, config: ApproxNormLaunch | None = None) -> ApproxNormLaunch:
    """The launch at `width`: `config`, else the tuned one in force for this width."""
    return config if config is not None else tuned.config(ApproxNormConfig).for_width(width)


def _one_row_launch(x: torch.Tensor, config: ApproxNormLaunch | None
                    ) -> tuple[ApproxNormLaunch, bool, int, int, int]:
    """(launch config, interpreter, BLOCK_C, BLOCK_R, warps) of a one-row-kernel launch over x's rows."""
    R, W = x.shape
    cfg = launch_config(W, config)
    interp = interpret_mode()
    block_c = triton.next_power_of_2(W)
    return (cfg, interp, block_c, *_row_block(R, block_c, cfg, interp))


def rms_norm_approx_rows(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor,
                         branch: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                         config: ApproxNormLaunch | None = None) -> None:
    """One-launch RMSNorm of the 2-D rows x (+ branch) into `out` (+ residual). `config`: None = the
    tuned launch in force for this width."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    cfg, interp, block_c, block_r, nw = _one_row_launch(x, config)
    b = branch if branch is not None else x
    r = residual if residual is not None else x
    persist = cfg.persist
    if persist and (interp or x.is_cuda):
        sms = _sm_count(x.device.index if x.device.index is not None else torch.cuda.current_device()) \
            if x.is_cuda else 2
        _rms_norm_approx_persistent_kernel[(max(1, min(R, persist * sms)),)](
            x, b, r, w, out, R, W, row_stride(x), row_stride(b), row_stride(r), float(eps),
            HAS_B=branch is not None, HAS_R=residual is not None, DT=dtype_code(x.dtype), INTERPRET=interp,
            BLOCK_C=block_c, STAGES=cfg.stages, STREAM=cfg.stream,
            num_warps=1 if interp else _warps(cfg, block_c),
        )  # fmt: skip
        return
    _rms_norm_approx_kernel[(triton.cdiv(R, block_r),)](
        x, b, r, w, out, R, W, row_stride(x), row_stride(b), row_stride(r), float(eps),
        HAS_B=branch is not None, HAS_R=residual is not None, DT=dtype_code(x.dtype), INTERPRET=interp,
        BLOCK_R=block_r, BLOCK_C=block_c, STREAM=cfg.stream, WLOAD=cfg.wload, num_warps=nw,
        **pdl.launch_kwargs(_pdl_mode(x, cfg, interp)),
    )  # fmt: skip


def residual_rms_norm_norm_approx_rows(residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor,
                                       w2: torch.Tensor, eps: float, h_out: torch.Tensor,
                                       y_out: torch.Tensor, config: ApproxNormLaunch | None = None) -> None:
    """One-launch approx ``h = residual + rms_norm(branch, w1)``, ``y = rms_norm(h, w2)`` of 2-D rows
    (h_out, y_out contiguous). Launch as the single norm's one-row kernel at this width (the
    persistent kernel has no norm-add-norm form)."""
    R, W = branch.shape
    if R == 0 or W == 0:
        return
    cfg, interp, block_c, block_r, nw = _one_row_launch(branch, config)
    _norm_norm_approx_kernel[(triton.cdiv(R, block_r),)](
        branch, residual, w1, w2, h_out, y_out, R, W, row_stride(branch), row_stride(residual), float(eps),
        DT=dtype_code(branch.dtype), INTERPRET=interp, BLOCK_R=block_r, BLOCK_C=block_c, STREAM=cfg.stream,
        num_warps=nw, **pdl.launch_kwargs(_pdl_mode(branch, cfg, interp)),
    )  # fmt: skip
