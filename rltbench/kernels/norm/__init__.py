"""RMSNorm for every kernel arm, and the one table that says which kernel serves a call.

    exact.py        exact norm in three launches: torch computes the mean, in its own order
    onelaunch.py    exact norm in one launch: the squares added in torch's order (two layouts)
    approx.py       approx norm: one launch, fp32 inside, one rounding (not bitwise)
    native.py       the cuda arm's CUDA C++ norm, torch's order
    torch_order.py  the model of torch CUDA's summation order (what onelaunch and native follow)
    validate.py     validation before trust (onelaunch and native: bitwise against torch per GPU)
    config.py       typed launch configs (code default, tuned file, tuner's search space)

`route` is the dispatch table: the torch arm and the op-level fallbacks (dtype, layout, grad,
scope) are rltbench.kernels.ops's; from there on this table decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rltbench import tuned
from rltbench.kernels.norm import approx, exact, native, onelaunch
from rltbench.kernels.norm.config import ExactNormRouting
from rltbench.native import NATIVE_IMPL

RowsKernel = Callable[..., None]


@dataclass(frozen=True)
class Route:
    """What normalises a call: ``kernel`` ("onelaunch", "3launch", "approx", "native" or "torch"),
    the rows kernel (`rows(x, w, eps, out, branch=, residual=)`), the fused norm-add-norm (None:
    the caller composes two norms) and, for "torch", the fallback reason the caller counts."""

    kernel: str
    rows: RowsKernel | None = None
    norm_norm: RowsKernel | None = None
    fallback: str | None = None


def route(arm: str, x: torch.Tensor, onelaunch_allowed: bool = True,
          others: tuple[torch.Tensor | None, ...] = ()) -> Route:
    """THE norm dispatch table: which kernel normalises x's rows ([..., width], the tensor the norm
    reads) for `arm`, once the op-level checks passed. Rows = x.numel() / width; `others`: the
    branch, residual and weights the call reads beside x.

        arm     condition, in order                                  kernel       norm-add-norm
        exact   one-launch allowed (Ops, ExactNormRouting.onelaunch)
                and width <= 4096 or rows >= wide_min_rows
                and every pointer 16-byte aligned, every row stride
                as divisible by 16 as the width (onelaunch.layout_reason)
                and the one-launch norm is validated here             onelaunch    one launch
        exact   otherwise                                            3launch      two norms
        approx  width <= approx.MAX_WIDTH                            approx       one launch
        approx  wider                                                torch        ("width")
        cuda    rows, and the native norm validated here             native       one launch
        cuda    otherwise                                            torch        (the reason)

    The one-launch layout (lowwarp or general) is onelaunch.layout_for's: the tuned OneLaunchConfig
    where it takes torch's plan for these rows and passed validation, else the general layout.
    Trust decisions are counted by reason in each family's validation report."""
    width = x.shape[-1]
    if arm == "exact":
        rows = x.numel() // max(1, width)
        routing = tuned.config(ExactNormRouting)
        if (onelaunch_allowed and routing.takes_onelaunch(rows, width)
                and onelaunch.layout_reason(x, *others) is None and onelaunch.is_trusted(x)):
            return Route("onelaunch", onelaunch.rms_norm_onelaunch_rows,
                         onelaunch.residual_rms_norm_norm_onelaunch_rows)
        return Route("3launch", exact.rms_norm_exact_rows)
    if arm == "approx":
        if width > approx.MAX_WIDTH:
            return Route("torch", fallback="width")
        return Route("approx", approx.rms_norm_approx_rows, approx.residual_rms_norm_norm_approx_rows)
    if arm == NATIVE_IMPL:
        reason = "empty" if x.numel() == 0 else native.untrusted_reason(x)
        if reason is not None:
            return Route("torch", fallback=reason)
        return Route("native", native.rms_norm_native_rows, native.residual_rms_norm_norm_native_rows)
    raise ValueError(f"no norm kernels for arm {arm!r}")
