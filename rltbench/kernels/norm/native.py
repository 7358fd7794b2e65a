"""The native (CUDA C++) RMSNorm forms, and when they may be trusted to equal torch bit for bit.

The kernels (rltbench/native/csrc/norm.cu) add the fp32 squares in the order that torch_order.py
specifies, like the Triton one-launch norm (onelaunch.py), but as CUDA C++ with one thread per
torch lane and one barrier per reduction. Every form runs in one launch:
Ouro's ``rms_norm`` and Huginn's ``rms_norm_huginn`` (same bits), the residual form, Huginn's
add form and Ouro's norm-add-norm.

Trust is earned the same way as the one-launch norm's (validate.py): per (GPU, torch version,
dtype, width), the first use runs the validation cases (adversarial rows, every form and the
variance itself, contiguous and strided rows, every reduction plan of the width) through these
kernels, bitwise against torch, with the torch version's warp order first.
Until a width is validated (never during a CUDA-graph capture), where validation failed or
torch's plan is not reproducible, the ops run the torch reference and count the reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rltbench import native
from rltbench.kernels.norm.torch_order import WARP_DOWN, WARP_ORDERS, mean_factor, plan_for
from rltbench.kernels.norm.validate import (
    UNALIGNED_STRIDED,
    CaseCounts,
    NormKernels,
    Trust,
    ValidationResult,
    run_cases,
)


def _launch_scalars(x: torch.Tensor, eps: float, warp_order: str | None) -> tuple[float, float, int, bool]:
    """(eps as fp32, MeanOps factor, torch's lanes per row, warp order is 'down') for x's rows.
    ValueError when torch's plan for this shape is not reproducible (callers check trust first)."""
    R, W = x.shape
    plan = plan_for(R, W, x.device)
    if plan.unsupported_reason is not None:
        raise ValueError(f"native norm: {plan.unsupported_reason}")
    order = warp_order if warp_order is not None else TRUST.warp_order(x.device, x.dtype, W)
    if order not in WARP_ORDERS:
        raise ValueError(f"warp_order must be one of {WARP_ORDERS}")
    return float(np.float32(eps)), float(mean_factor(R, W)), plan.lanes, order == WARP_DOWN


def rms_norm_native_rows(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor,
                         branch: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                         var_out: torch.Tensor | None = None, warp_order: str | None = None) -> None:
    """Same contract as onelaunch.rms_norm_onelaunch_rows (2-D rows, last dim contiguous,
    `out` contiguous; `branch`: the Huginn add form; `residual`: Ouro's residual form), one launch."""
    R, W = x.shape
    if R == 0 or W == 0:
        return
    eps32, factor, lanes, down = _launch_scalars(x, eps, warp_order)
    native.load().rms_norm(x, branch, residual, w, out, var_out, eps32, factor, lanes, down)


def residual_rms_norm_norm_native_rows(residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor,
                                       w2: torch.Tensor, eps: float, h_out: torch.Tensor, y_out: torch.Tensor,
                                       var_out: torch.Tensor | None = None,
                                       warp_order: str | None = None) -> None:
    """h = residual + rms_norm(branch, w1), y = rms_norm(h, w2) in one launch (the contract of
    onelaunch.residual_rms_norm_norm_onelaunch_rows)."""
    R, W = branch.shape
    if R == 0 or W == 0:
        return
    eps32, factor, lanes, down = _launch_scalars(branch, eps, warp_order)
    native.load().rms_norm_norm(residual, branch, w1, w2, h_out, y_out, var_out, eps32, factor, lanes, down)


# ----------------------------------------------------------------------------------------------
# trust: validation on this GPU / torch version (validate.py)
# ----------------------------------------------------------------------------------------------
def _run_cases(device: torch.device, dtype: torch.dtype, width: int, order: str, res: ValidationResult
               ) -> CaseCounts:
    res.layout = "native"
    kernels = NormKernels(rms_norm_native_rows, residual_rms_norm_norm_native_rows)
    # the native norm takes strided and unaligned rows itself (its scalar path): validate those
    return run_cases(device, dtype, width, order, kernels, strided_layout=UNALIGNED_STRIDED)


TRUST = Trust(_run_cases)


def validate(device: torch.device | str, dtype: torch.dtype, width: int) -> ValidationResult:
    """The validation procedure and cases run through the native kernels; cached per process per
    (GPU name, torch version, dtype, width). Never call it during capture."""
    return TRUST.validate(device, dtype, width)


def prevalidate(widths: list[int] | tuple[int, ...], dtypes: list[torch.dtype] | tuple[torch.dtype, ...],
                device: torch.device | str | None = None) -> dict[str, Any]:
    """Validate now (e.g. before a CUDA-graph capture); returns validation_report()."""
    return TRUST.prevalidate(widths, dtypes, device)


def untrusted_reason(x: torch.Tensor) -> str | None:
    """Why x's rows ([..., width]) may not take the native norm (None: they may); counted."""
    return TRUST.reason(x)


def validation_report() -> dict[str, Any]:
    """JSON-ready: every native-norm validation of this process and the refusals by reason."""
    return TRUST.report()


def reset_validation() -> None:
    """Forget cached validations and refusal counts (tests)."""
    TRUST.reset()
