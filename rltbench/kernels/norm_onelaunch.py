"""Exact RMSNorm in ONE launch: the sum of squares is added in torch CUDA's own order.

The 3-launch exact norm (norm_exact.py) lets torch compute ``x.float().pow(2).mean(-1)``. Here one
Triton program per row adds the fp32 squares in the order torch_reduce_model.py describes (read
from Reduce.cuh; docs/onelaunch_norm.md), then runs the same forced-rounding epilogue. The order
depends on ``lanes`` = the threads torch gives a row (its ``step_input``, in 4-element vectors),
on the row's 16-byte alignment in torch's fp32 temporary and on the warp-shuffle order:

* lane l owns vectors k = l, l + lanes, ...; it keeps 4 accumulators (one per vector element),
  fed its vectors in order (``[TILE, 4]`` tiles, explicit adds, a sequential loop);
* a row that does not start on a 16-byte boundary (row*N % 4 = s > 0): its first 4 - s elements
  go to lanes s..3, accumulator 0, before the loop; the last (N - head) % 4 elements to lanes
  0.., accumulator 0, after it;
* each lane combines ((a0 + a1) + a2) + a3;
* the shared-memory part of block_x_reduce halves the lanes (v[i] += v[i + h]) down to 32, then
  the warp shuffles: halving again (torch >= 2.10) or adjacent pairs (older torch);
* mean = sum * factor, factor = float(T) / float(T * N) (MeanOps::project).

Adding an exact 0 never changes an fp32 sum, so masked/absent elements (and the tile lanes past
``lanes``) are added as zeros. Every multiply and accumulation add uses the forced-rounding
helpers (no FMA contraction); the tree adds are size-2 ``tl.sum`` (one add, nothing to contract).
The result is trusted only after ``validate`` compared it with torch on this GPU and torch version
(``is_trusted``); the caller falls back to the 3-launch path otherwise and reports
``validation_report()``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from rltbench.kernels.layout import row_stride, rows_view
from rltbench.kernels.rounding import (
    DTYPE_CODES,
    add_rn,
    dtype_code,
    interpret_mode,
    load_f32,
    mul_rn,
    round_to,
    rsqrt_torch,
    store_f32,
)
from rltbench.kernels.torch_reduce_model import (
    WARP_DOWN,
    WARP_ORDERS,
    GpuProps,
    ReducePlan,
    default_warp_order,
    mean_factor,
    reduce_plan,
)

FORMS = ("ouro", "huginn")
MODE_X, MODE_ADD, MODE_NORM_ADD = 0, 1, 2
MAX_LANES = 512   # torch's MAX_NUM_THREADS for float reductions: the widest row plan


# ----------------------------------------------------------------------------------------------
# Triton: values, the torch-order sum of squares, the epilogue
# ----------------------------------------------------------------------------------------------
@triton.jit
def _vals(x_row, b_row, r_row, w1_ptr, rstd1, cols, mask, MODE: tl.constexpr, DT: tl.constexpr,
          INTERPRET: tl.constexpr):
    """The normalised values (fp32, exactly dtype values) at `cols` of one row.
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
def _sq_of(v, m, INTERPRET: tl.constexpr):
    """Squares of values already in registers; exactly 0 where masked (0 + s == s: with one
    iteration a lane's accumulator is its square)."""
    return tl.where(m, mul_rn(v, v, INTERPRET), 0.0)


@triton.jit
def _scaled(v, w, rstd, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """round(w * round(v * rstd)): torch's (h * rstd).to(dtype), then w * that, each rounded."""
    return round_to(mul_rn(w, round_to(mul_rn(v, rstd, INTERPRET), DT, INTERPRET), INTERPRET), DT, INTERPRET)


@triton.jit
def _norm_out(x_row, b_row, w_ptr, r_row, out_row, rstd, cols, m, MODE: tl.constexpr, HAS_R: tl.constexpr,
              DT: tl.constexpr, INTERPRET: tl.constexpr):
    """Epilogue of one norm at `cols`: round(w * round(v * rstd)) (+ round(r + y)), stored."""
    v = _vals(x_row, b_row, x_row, w_ptr, 1.0, cols, m, MODE, DT, INTERPRET)
    hn = round_to(mul_rn(v, rstd, INTERPRET), DT, INTERPRET)         # (h * rstd).to(dtype)
    w = load_f32(w_ptr + cols, m, DT, INTERPRET)
    y = round_to(mul_rn(w, hn, INTERPRET), DT, INTERPRET)            # w * h (== h * w)
    if HAS_R:
        r = load_f32(r_row + cols, m, DT, INTERPRET)
        y = round_to(add_rn(r, y, INTERPRET), DT, INTERPRET)         # residual + y
    store_f32(out_row + cols, y, m, DT, INTERPRET)


@triton.jit
def _norm_norm_out(a_row, r_row, w1_ptr, w2_ptr, h_row, y_row, rstd1, rstd2, cols, m, DT: tl.constexpr,
                   INTERPRET: tl.constexpr):
    """Epilogue of norm-add-norm at `cols`: h (recomputed, stored) and round(w2 * round(h * rstd2))."""
    h = _vals(a_row, a_row, r_row, w1_ptr, rstd1, cols, m, 2, DT, INTERPRET)
    store_f32(h_row + cols, h, m, DT, INTERPRET)
    hn = round_to(mul_rn(h, rstd2, INTERPRET), DT, INTERPRET)
    w2 = load_f32(w2_ptr + cols, m, DT, INTERPRET)
    y = round_to(mul_rn(w2, hn, INTERPRET), DT, INTERPRET)
    store_f32(y_row + cols, y, m, DT, INTERPRET)


@triton.jit(do_not_specialize=["N", "sx", "sb", "sr", "lanes"])
def _norm_kernel(x_ptr, b_ptr, r_ptr, w_ptr, out_ptr, var_ptr, N, sx, sb, sr, eps, factor, lanes,
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
                  DT, INTERPRET)


@triton.jit(do_not_specialize=["N", "sa", "sr", "lanes"])
def _norm_norm_kernel(a_ptr, r_ptr, w1_ptr, w2_ptr, h_ptr, y_ptr, var_ptr, N, sa, sr, eps, factor, lanes,
                      STORE_VAR: tl.constexpr, DT: tl.constexpr, INTERPRET: tl.constexpr,
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
                       cols < N, DT, INTERPRET)


# ----------------------------------------------------------------------------------------------
# host side: plans, launches, public functions
# ----------------------------------------------------------------------------------------------
_PROPS: dict[int, GpuProps] = {}


def gpu_props(device: torch.device) -> GpuProps:
    """setReduceConfig's inputs for this device (the H100/H200 defaults for CPU/interpreter)."""
    if device.type != "cuda":
        return GpuProps()
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PROPS:
        p = torch.cuda.get_device_properties(idx)
        _PROPS[idx] = GpuProps(int(p.multi_processor_count), int(p.max_threads_per_multi_processor),
                               int(getattr(p, "warp_size", 32)))
    return _PROPS[idx]


def plan_for(rows: int, width: int, device: torch.device) -> ReducePlan:
    """torch's reduction plan for the variance of `rows` rows of `width` on `device`."""
    return reduce_plan(rows, width, gpu_props(device))


def _checked_plan(x: torch.Tensor) -> ReducePlan:
    R, W = x.shape
    plan = plan_for(R, W, x.device)
    if plan.unsupported_reason is not None:
        raise ValueError(f"one-launch norm: {plan.unsupported_reason}")
    return plan


def _launch_args(x: torch.Tensor, eps: float, warp_order: str | None) -> dict[str, Any]:
    """Constexprs and scalars shared by both kernels: the plan's lanes, warp order, tile, factor."""
    R, W = x.shape
    plan = _checked_plan(x)
    interp = interpret_mode()
    order = warp_order if warp_order is not None else warp_order_for(x.device, x.dtype, W)
    tile = 32 if plan.lanes <= 32 else MAX_LANES   # two compiled variants cover every plan
    if order not in WARP_ORDERS:
        raise ValueError(f"warp_order must be one of {WARP_ORDERS}")
    return {
        "factor": float(mean_factor(R, W)),        # MeanOps factor, exact fp32
        "eps": float(np.float32(eps)),             # torch rounds the python scalar to fp32 (RNE)
        "lanes": plan.lanes, "TILE": tile, "WARP_DOWN": order == WARP_DOWN,
        "DT": dtype_code(x.dtype), "INTERPRET": interp,
        "BLOCK_C": min(triton.next_power_of_2(W), 16384 if interp else 1024),
        "num_warps": 1 if interp else tile // 128 if tile >= 128 else 1,
    }


# (GPU, torch, dtype, width) keys whose validation failed on the fast kernel: the general kernel
# serves them (it is validated on its own; validate() below).
_FAST_OFF: set[tuple[str, str, str, int]] = set()


def _fast_module(x: torch.Tensor, kw: dict[str, Any]) -> Any:
    """norm_onelaunch_fast when it takes this shape (16-byte aligned rows, 32..512 lanes) and has not
    failed validation here, else None. Imported lazily: it builds on this module's Triton helpers."""
    from rltbench.kernels import norm_onelaunch_fast as fast

    W = x.shape[-1]
    if not (fast.enabled() and fast.supports(W, kw["lanes"], kw["WARP_DOWN"])):
        return None
    if x.is_cuda and _FAST_OFF and validation_key(x.device, x.dtype, W) in _FAST_OFF:
        return None
    return fast


def kernel_path(width: int, rows: int, device: torch.device, warp_order: str | None = None) -> str:
    """Which one-launch kernel serves `rows` x `width` ("fast" or "general"), for reports."""
    from rltbench.kernels import norm_onelaunch_fast as fast

    plan = plan_for(rows, width, device)
    order = warp_order or default_warp_order(torch.__version__)
    ok = fast.enabled() and fast.supports(width, plan.lanes, order == WARP_DOWN)
    off = bool(_FAST_OFF) and any(k[0] == _device_name(device) and k[3] == width for k in _FAST_OFF)
    return "fast" if ok and not off else "general"


def rms_norm_onelaunch_rows(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor,
                            branch: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                            var_out: torch.Tensor | None = None, warp_order: str | None = None) -> None:
    """Same contract as norm_exact.rms_norm_exact_rows (2-D rows, last dim contiguous, `out`
    contiguous), one launch. `var_out` (fp32 [R], optional): the variance each row used.
    `warp_order`: None = the validated (else the torch-version default) order. Raises ValueError
    when torch's plan for this shape is not reproducible (callers check is_trusted first)."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    kw = _launch_args(x, eps, warp_order)
    b = branch if branch is not None else x
    r = residual if residual is not None else x
    fast = _fast_module(x, kw)
    if fast is not None:
        fast.launch_norm(x, b, r, w, out, var_out if var_out is not None else out, W, row_stride(x),
                         row_stride(b), row_stride(r), kw["eps"], kw["factor"], kw["lanes"],
                         MODE_X if branch is None else MODE_ADD, residual is not None, var_out is not None,
                         kw["DT"], kw["INTERPRET"], kw["WARP_DOWN"])
        return
    _norm_kernel[(R,)](x, b, r, w, out, var_out if var_out is not None else out, W, row_stride(x),
                       row_stride(b), row_stride(r), kw.pop("eps"), kw.pop("factor"), kw.pop("lanes"),
                       MODE=MODE_X if branch is None else MODE_ADD, HAS_R=residual is not None,
                       STORE_VAR=var_out is not None, **kw)


def residual_rms_norm_norm_onelaunch_rows(residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor,
                                          w2: torch.Tensor, eps: float, h_out: torch.Tensor,
                                          y_out: torch.Tensor, var_out: torch.Tensor | None = None,
                                          warp_order: str | None = None) -> None:
    """h = residual + rms_norm(branch, w1), y = rms_norm(h, w2) in one launch (2-D rows; h_out and
    y_out contiguous). `var_out` (fp32 [R, 2], optional): both variances."""
    R, W = branch.shape
    if R == 0 or W == 0:
        return
    kw = _launch_args(branch, eps, warp_order)
    fast = _fast_module(branch, kw)
    if fast is not None:
        var = var_out if var_out is not None else h_out
        fast.launch_norm_norm(branch, residual, w1, w2, h_out, y_out, var, W, row_stride(branch),
                              row_stride(residual), kw["eps"], kw["factor"], kw["lanes"], var_out is not None,
                              kw["DT"], kw["INTERPRET"], kw["WARP_DOWN"])
        return
    _norm_norm_kernel[(R,)](branch, residual, w1, w2, h_out, y_out, var_out if var_out is not None else h_out,
                            W, row_stride(branch), row_stride(residual), kw.pop("eps"), kw.pop("factor"),
                            kw.pop("lanes"),
                            STORE_VAR=var_out is not None, **kw)


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
# validation against torch on this GPU / torch version, and the trust decision
# ----------------------------------------------------------------------------------------------
VALIDATION_TOKENS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 100, 257, 1000, 2048, 4099, 8192)


@dataclass
class ValidationResult:
    """Outcome of comparing the one-launch kernels with torch on one (GPU, torch, dtype, width)."""

    passed: bool
    device_name: str
    torch_version: str
    dtype: str
    width: int
    reason: str = ""
    warp_order: str = ""            # the order that passed (used by the kernels from then on)
    expected_warp_order: str = ""   # default_warp_order(torch version), tried first
    orders_tried: dict[str, int] = field(default_factory=dict)   # order -> failing comparisons
    cases: int = 0
    elements: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    lanes_covered: list[int] = field(default_factory=list)
    fast_path: str = ""            # the fast kernel (norm_onelaunch_fast): "" = validated or unused
    fast_layout: str = ""          # which fast layouts served the cases ("" = the general kernel)
    triton_version: str = triton.__version__
    allocator_backend: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CACHE: dict[tuple[str, str, str, int], ValidationResult] = {}
_REFUSALS: Counter[str] = Counter()
_LOCK = threading.RLock()


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def validation_key(device: torch.device, dtype: torch.dtype, width: int) -> tuple[str, str, str, int]:
    return (_device_name(device), torch.__version__, str(dtype).replace("torch.", ""), int(width))


def warp_order_for(device: torch.device, dtype: torch.dtype, width: int) -> str:
    """The validated warp order for (device, dtype, width), else this torch version's default."""
    with _LOCK:
        res = _CACHE.get(validation_key(device, dtype, width))
    if res is not None and res.passed:
        return res.warp_order
    return default_warp_order(torch.__version__)


def _adversarial(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator, device: torch.device,
                 ) -> torch.Tensor:
    """Random values scaled by 2**randint per element (wide magnitude range: the sum is order
    sensitive) plus a few huge elements that absorb the small ones' low bits."""
    lim = 11 if dtype == torch.float16 else 20
    x = torch.randn(shape, generator=gen, device=device)
    x = x * torch.exp2(torch.randint(-lim, lim + 1, shape, generator=gen, device=device).float())
    spikes = torch.rand(shape, generator=gen, device=device) < 0.002
    x = torch.where(spikes, x.sign() * 2.0 ** (lim + 2), x)
    return x.to(dtype)


def _weights(width: int, dtype: torch.dtype, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Norm weights ~ N(0, 1): |w * x / rms(x)| <= 5 * sqrt(width) never overflows fp16, so the
    outputs stay finite and torch.equal (NaN != NaN) stays a meaningful comparison."""
    return torch.randn(width, generator=gen, device=device).to(dtype)


def _cmp(name: str, tokens: int, out: torch.Tensor, ref: torch.Tensor, bad: list[dict[str, Any]]) -> int:
    """Bitwise comparison (torch.equal); a mismatch is recorded with its count and first index
    (a NaN where the reference has a NaN counts as equal)."""
    if not torch.equal(out, ref):
        diff = (out != ref) & ~(torch.isnan(out) & torch.isnan(ref))
        n = int(diff.sum())
        if n:
            first = int(diff.flatten().nonzero()[0])
            bad.append({"form": name, "tokens": tokens, "n_diff": n, "first_index": first})
    return out.numel()


def validation_case(device: torch.device, dtype: torch.dtype, width: int, T: int, gen: torch.Generator,
                    strided: bool, order: str, bad: list[dict[str, Any]],
                    norm_rows: Callable[..., None] | None = None,
                    norm_norm_rows: Callable[..., None] | None = None) -> int:
    """One validation case: T adversarial rows (``strided``: starting mid-buffer with a row stride
    > width), every one-launch form and the stored variance against the torch expressions, bitwise.
    Mismatches are appended to `bad`; returns the number of elements compared. Shared by validate(),
    scripts/kernel_tune.py and scripts/diagnose_fast_norm.py so all three check the same things.
    `norm_rows` / `norm_norm_rows`: the kernels under test, with the signatures of
    rms_norm_onelaunch_rows / residual_rms_norm_norm_onelaunch_rows (default: those two); the
    native arm's norm (norm_native.py) is validated through the same cases."""
    from rltbench.kernels import reference as ref

    norm = norm_rows or rms_norm_onelaunch_rows
    norm_norm = norm_norm_rows or residual_rms_norm_norm_onelaunch_rows
    eps = 1e-6
    x, r, b = (_adversarial((T, width), dtype, gen, device) for _ in range(3))
    w1, w2 = _weights(width, dtype, gen, device), _weights(width, dtype, gen, device)
    if strided:
        big = torch.empty((T, width + 5), dtype=dtype, device=device)
        big[:, 3:3 + width] = x
        x = big[:, 3:3 + width]
    out = torch.empty((T, width), dtype=dtype, device=device)
    var = torch.empty(T, dtype=torch.float32, device=device)
    norm(x, w1, eps, out, var_out=var, warp_order=order)
    elems = _cmp("var", T, var, x.float().pow(2).mean(-1), bad)
    elems += _cmp("ouro", T, out, ref.rms_norm(x, w1, eps), bad)
    norm(x, w1, eps, out, warp_order=order)
    elems += _cmp("huginn", T, out, ref.rms_norm_huginn(x, w1, eps), bad)
    norm(x, w1, eps, out, residual=r, warp_order=order)
    elems += _cmp("residual", T, out, ref.residual_rms_norm(r, x, w1, eps), bad)
    norm(x, w1, eps, out, branch=b, warp_order=order)
    elems += _cmp("add_huginn", T, out, ref.add_rms_norm_huginn(x, b, w1, eps), bad)
    h, y = torch.empty_like(out), torch.empty_like(out)
    norm_norm(r, x, w1, w2, eps, h, y, warp_order=order)
    rh, ry = ref.residual_rms_norm_norm(r, x, w1, w2, eps)
    return elems + _cmp("norm_norm.h", T, h, rh, bad) + _cmp("norm_norm.y", T, y, ry, bad)


VALIDATION_FORMS = 7   # comparisons per validation_case


def run_cases(device: torch.device, dtype: torch.dtype, width: int, seed: int, tokens: tuple[int, ...],
              order: str, norm_rows: Callable[..., None] | None = None,
              norm_norm_rows: Callable[..., None] | None = None
              ) -> tuple[int, int, list[dict[str, Any]], set[int]]:
    """Every form against torch for every token count: (cases, elements, mismatches, lanes).
    `norm_rows` / `norm_norm_rows`: the kernels under test (validation_case)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cases, elems, bad, lanes = 0, 0, [], set()
    for i, T in enumerate(tokens):
        plan = plan_for(T, width, device)
        if plan.unsupported_reason is not None:
            continue
        lanes.add(plan.lanes)
        elems += validation_case(device, dtype, width, T, gen, i % 3 == 1, order, bad, norm_rows,
                                 norm_norm_rows)
        cases += VALIDATION_FORMS
    torch.cuda.synchronize(device)
    return cases, elems, bad, lanes


def _cases_fast_then_general(device: torch.device, dtype: torch.dtype, width: int, seed: int,
                             tokens: tuple[int, ...], order: str, key: tuple[str, str, str, int],
                             res: ValidationResult) -> tuple[int, int, list[dict[str, Any]], set[int]]:
    """run_cases; the fast kernel is trusted only on its own record, so when it served the cases and
    failed (a mismatch or an error) the width is taken off it (res.fast_path says why) and the cases
    run again on the general kernel."""
    from rltbench.kernels import norm_onelaunch_lowwarp as lowwarp

    fast_used = key not in _FAST_OFF and kernel_path(width, 1, device, order) == "fast"
    if fast_used:
        res.fast_layout = lowwarp.describe() if lowwarp.enabled() else "fast"
    try:
        out = run_cases(device, dtype, width, seed, tokens, order)
        if not (fast_used and out[2]):
            return out
        why = f"{len(out[2])} mismatching comparisons, e.g. {out[2][:2]}"
    except Exception as exc:
        if not fast_used:
            raise
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
    res.fast_path = f"refused: {why}"
    res.fast_layout = ""
    _FAST_OFF.add(key)
    return run_cases(device, dtype, width, seed, tokens, order)


CaseRunner = Callable[[str, "ValidationResult"], tuple[int, int, list[dict[str, Any]], set[int]]]


def validate(device: torch.device | str, dtype: torch.dtype, width: int, seed: int = 0,
             tokens: tuple[int, ...] = VALIDATION_TOKENS) -> ValidationResult:
    """Compare every one-launch form (and the variance itself) with the torch reference on `device`,
    bitwise, on adversarial rows for several token counts (every reduction plan of this width),
    contiguous and strided inputs. The torch-version default warp order is tried first, then the
    other; only an order with zero mismatches is trusted. Never call it during graph capture.
    Cached per process per (GPU name, torch version, dtype, width)."""
    device = torch.device(device)
    key = validation_key(device, dtype, width)
    def run(order: str, res: ValidationResult) -> tuple[int, int, list[dict[str, Any]], set[int]]:
        return _cases_fast_then_general(device, dtype, width, seed, tokens, order, key, res)

    return validate_with(_CACHE, device, dtype, width, run)


def validate_with(cache: dict[tuple[str, str, str, int], ValidationResult], device: torch.device,
                  dtype: torch.dtype, width: int, run: CaseRunner) -> ValidationResult:
    """The validation procedure of every kernel that claims torch's reduction order: `run(order,
    res)` runs the cases with one warp order (run_cases); the torch-version default order first,
    then the other; trusted only with zero mismatches. The result is stored in `cache` (one per
    kernel family) under validation_key."""
    key = validation_key(device, dtype, width)
    with _LOCK:
        if key in cache:
            return cache[key]
        expected = default_warp_order(torch.__version__)
        res = ValidationResult(False, key[0], key[1], key[2], int(width), expected_warp_order=expected)
        t0 = time.perf_counter()
        if device.type != "cuda":
            res.reason = "not a CUDA device: the modelled order is torch CUDA's (torch CPU sums differently)"
        elif dtype not in DTYPE_CODES:
            res.reason = f"dtype {dtype} not supported"
        else:
            res.allocator_backend = str(torch.cuda.get_allocator_backend())
            first_bad: list[dict[str, Any]] | None = None
            for order in (expected, *[o for o in WARP_ORDERS if o != expected]):
                try:
                    cases, elems, bad, lanes = run(order, res)
                except Exception as exc:  # a compile/launch failure must not take the caller down
                    res.reason = f"validation error: {type(exc).__name__}: {exc}"
                    break
                res.orders_tried[order] = len(bad)
                first_bad = bad if first_bad is None else first_bad
                if cases == 0:
                    res.reason = f"no reproducible reduction plan for width {width}"
                    break
                if not bad:
                    res.passed, res.warp_order, res.cases, res.elements = True, order, cases, elems
                    res.lanes_covered = sorted(lanes)
                    if order != expected:
                        res.reason = f"passed with warp order {order!r}, not the expected {expected!r}"
                    break
            if not res.passed and not res.reason:
                res.mismatches = (first_bad or [])[:20]
                res.reason = "differs from torch with every modelled warp order"
        res.seconds = time.perf_counter() - t0
        cache[key] = res
        return res


def prevalidate(widths: list[int] | tuple[int, ...], dtypes: list[torch.dtype] | tuple[torch.dtype, ...],
                device: torch.device | str | None = None) -> dict[str, Any]:
    """Validate now, e.g. in engine warm-up before any CUDA-graph capture (is_trusted never
    validates during a capture). Returns validation_report()."""
    prevalidate_with(validate, widths, dtypes, device)
    return validation_report()


def prevalidate_with(validate_fn: Callable[[torch.device, torch.dtype, int], ValidationResult],
                     widths: list[int] | tuple[int, ...], dtypes: list[torch.dtype] | tuple[torch.dtype, ...],
                     device: torch.device | str | None = None) -> None:
    """Run `validate_fn` for every (dtype, width) on `device` (default: the current CUDA device)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    for dt in dtypes:
        for wd in widths:
            validate_fn(torch.device(device), dt, wd)


def is_trusted(x: torch.Tensor) -> bool:
    """True when the one-launch norm is validated bitwise for x's rows (x: the tensor normalised,
    [..., width]) on this GPU/torch version. Validates lazily (once per dtype/width), except during
    CUDA-graph capture, where a missing validation means False. Refusals are counted by reason."""
    reason = untrusted_reason(x)
    if reason is not None:
        with _LOCK:
            _REFUSALS[reason] += 1
        return False
    return True


def untrusted_reason(x: torch.Tensor) -> str | None:
    """Why x's rows may not use the one-launch norm (None: they may). Not counted."""
    return trust_reason(x, _CACHE, validate)


def trust_reason(x: torch.Tensor, cache: dict[tuple[str, str, str, int], ValidationResult],
                 validate_fn: Callable[[torch.device, torch.dtype, int], ValidationResult]) -> str | None:
    """Why x's rows ([..., width], the tensor normalised) may not take a kernel family whose
    validations live in `cache` (None: they may): not CUDA, dtype, empty, torch's plan not
    reproducible, not validated before a CUDA-graph capture (never validated during one),
    validation failed, or this plan's lane count not covered. Validates lazily via `validate_fn`."""
    if not x.is_cuda:
        return "not_cuda"
    if x.dtype not in DTYPE_CODES:
        return "dtype"
    if x.dim() == 0 or x.numel() == 0:
        return "shape"
    W = x.shape[-1]
    plan = plan_for(x.numel() // W, W, x.device)
    if plan.unsupported_reason is not None:
        return "plan_not_reproducible"
    key = validation_key(x.device, x.dtype, W)
    with _LOCK:
        res = cache.get(key)
    if res is None:
        if torch.cuda.is_current_stream_capturing():
            return "not_prevalidated_before_capture"
        res = validate_fn(x.device, x.dtype, W)
    if not res.passed:
        return "validation_failed"
    if plan.lanes not in res.lanes_covered:
        return "plan_not_validated"
    return None


def validation_report() -> dict[str, Any]:
    """JSON-ready: every validation of this process and the refusals by reason (for results)."""
    return report_of(_CACHE, _REFUSALS)


def report_of(cache: dict[tuple[str, str, str, int], ValidationResult],
              refusals: Counter[str]) -> dict[str, Any]:
    """JSON-ready report of one kernel family's validations (`cache`) and refusals by reason."""
    with _LOCK:
        return {"results": [r.to_dict() for r in cache.values()], "refusals": dict(refusals)}


def reset_validation() -> None:
    """Forget cached validations and refusal counts (tests)."""
    with _LOCK:
        _CACHE.clear()
        _REFUSALS.clear()
        _FAST_OFF.clear()


# ----------------------------------------------------------------------------------------------
# GPU micro-benchmark for the lead's GPU script
# ----------------------------------------------------------------------------------------------
def _bench_calls(x: torch.Tensor, w: torch.Tensor, eps: float) -> dict[str, Callable[[int], Any]]:
    from rltbench.kernels import reference as ref
    from rltbench.kernels.norm_exact import rms_norm_exact_rows

    o3, o1 = torch.empty_like(x), torch.empty_like(x)
    return {
        "torch": lambda i: ref.rms_norm(x, w, eps),
        "exact3": lambda i: (rms_norm_exact_rows(x, w, eps, o3), o3)[1],
        "onelaunch": lambda i: (rms_norm_onelaunch_rows(x, w, eps, o1), o1)[1],
    }


def bench_onelaunch(widths: tuple[int, ...] = (2048, 5280), tokens: tuple[int, ...] = (1,),
                    dtype: torch.dtype = torch.bfloat16, calls: int = 50, rounds: int = 6,
                    reps: int = 10) -> list[dict[str, Any]]:
    """Per-call CUDA-graph latency (median of CUDA-event samples, arms interleaved; each graph
    holds `calls` calls on one hot input) of the torch reference, the 3-launch exact norm and the
    one-launch norm. Each row also says whether the captured output equals torch's (torch.equal)
    and whether is_trusted() accepts the shape (validated before capture)."""
    from rltbench.bench.timing import GraphCalls, summarize, time_interleaved
    from rltbench.kernels import reference as ref

    dev = torch.device("cuda", torch.cuda.current_device())
    rows: list[dict[str, Any]] = []
    eps = 1e-6
    for W in widths:
        validate(dev, dtype, W)
        for T in tokens:
            gen = torch.Generator(device=dev).manual_seed(W + T)
            x = torch.randn((T, W), generator=gen, device=dev).to(dtype)
            w = torch.randn((W,), generator=gen, device=dev).to(dtype)
            graphs = {a: GraphCalls(f, calls) for a, f in _bench_calls(x, w, eps).items()}
            samples = time_interleaved({a: g.replay for a, g in graphs.items()}, calls=calls, rounds=rounds,
                                       reps=reps)
            expect = ref.rms_norm(x, w, eps)
            for arm, g in graphs.items():
                st = summarize(samples[arm])
                rows.append({
                    "width": W, "tokens": T, "dtype": str(dtype).replace("torch.", ""), "arm": arm,
                    "median_us": st.median, "p10_us": st.p10, "p90_us": st.p90,
                    "kernels_per_call": g.kernel_nodes / calls if g.kernel_nodes is not None else None,
                    "equal_torch": bool(torch.equal(g.outputs[-1], expect)),
                    "trusted": is_trusted(x) if arm == "onelaunch" else None,
                })
    return rows


def format_bench(rows: list[dict[str, Any]]) -> str:
    """Markdown table of bench_onelaunch rows."""
    lines = ["| width | T | arm | median us | p10 | p90 | kernels/call | equal torch | trusted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        k = "-" if r["kernels_per_call"] is None else f"{r['kernels_per_call']:.1f}"
        lines.append(f"| {r['width']} | {r['tokens']} | {r['arm']} | {r['median_us']:.2f} | {r['p10_us']:.2f}"
                     f" | {r['p90_us']:.2f} | {k} | {r['equal_torch']} | {r['trusted']} |")
    return "\n".join(lines)
