"""Fallback torch reference `Ops` and `default_ops()`.

The models take every norm / RoPE / activation from an `Ops` object (DESIGN.md section 1). The real
implementation lives in `rltbench.kernels`; this module only provides the same reference expressions
for the case where that package is not importable (it is developed in parallel), so the models and
their tests never depend on it being ready. When it is importable, `default_ops()` returns
`make_ops(ARMS["torch"])`, the project's reference arm.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchReferenceOps:
    """The models' own expressions, op by op (the `torch` arm), with the `Ops` method names."""

    selection: Any = None

    def __init__(self) -> None:
        self.stats: dict[str, int] = {}

    def rms_norm(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + eps)
        return w * h.to(x.dtype)

    def rms_norm_huginn(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return h.type_as(x) * w

    def residual_rms_norm(self, residual: Tensor, branch: Tensor, w: Tensor, eps: float) -> Tensor:
        return residual + self.rms_norm(branch, w, eps)

    def add_rms_norm_huginn(self, x: Tensor, branch: Tensor, w: Tensor, eps: float) -> Tensor:
        return self.rms_norm_huginn(x + branch, w, eps)

    def residual_rms_norm_norm(
        self, residual: Tensor, branch: Tensor, w1: Tensor, w2: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        h = self.residual_rms_norm(residual, branch, w1, eps)
        return h, self.rms_norm(h, w2, eps)

    def rope_neox(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s

    def rope_interleaved(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)

        def rot(x: Tensor) -> Tensor:
            x2 = x.unflatten(-1, (-1, 2)).float()
            a, b = x2[..., 0], x2[..., 1]
            return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2).type_as(x)

        return rot(q), rot(k)

    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        return torch.nn.functional.silu(gate) * up


def default_ops() -> Any:
    """The project's torch arm if `rltbench.kernels` is importable, else `TorchReferenceOps()`."""
    try:
        from rltbench.kernels import ARMS, make_ops
    except ImportError:
        return TorchReferenceOps()
    return make_ops(ARMS["torch"])
