"""fp64 oracles and ULP distances: how far an arm's output is from the true value.

Used by the tests (approx error bounds) and by the benchmark (error columns beside speed). The
oracle computes each op's mathematical value in float64 from the same inputs (no intermediate
rounding); distances are in units of the output dtype's ulp at the oracle value.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor

# (explicit mantissa bits, minimum normal exponent)
_FORMAT = {torch.bfloat16: (7, -126), torch.float16: (10, -14), torch.float32: (23, -126)}


def rms_norm(
    x: Tensor, w: Tensor, eps: float, branch: Tensor | None = None, residual: Tensor | None = None
) -> Tensor:
    """w * v / sqrt(mean(v^2) + eps) (+ residual), v = x (+ branch), all in fp64."""
    v = x.double() if branch is None else x.double() + branch.double()
    y = w.double() * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return y if residual is None else residual.double() + y


def rope_neox(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)

    def rot(x: Tensor) -> Tensor:
        x = x.double()
        h = x.shape[-1] // 2
        return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s

    return rot(q), rot(k)


def rope_interleaved(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)

    def rot(x: Tensor) -> Tensor:
        p = x.double().unflatten(-1, (-1, 2))
        return torch.stack([p[..., 0] * c - p[..., 1] * s, p[..., 1] * c + p[..., 0] * s], -1).flatten(-2)

    return rot(q), rot(k)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    g = gate.double()
    return g / (1.0 + torch.exp(-g)) * up.double()


def ulp_of(y: Tensor, dtype: torch.dtype) -> Tensor:
    """Spacing of `dtype` values at |y| (fp64), subnormal spacing below the normal range."""
    mant, emin = _FORMAT[dtype]
    a = y.abs().double()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a))))
    e = torch.clamp(torch.where(a > 0, e, torch.full_like(e, float(emin))), min=emin)
    return torch.exp2(e - mant)


def ulp_distance(out: Tensor, oracle: Tensor) -> Tensor:
    """|out - oracle| in ulps of out.dtype at the oracle value (fp64). Non-finite: 0 when both
    agree (same inf, or both NaN), inf otherwise; an oracle beyond the dtype's range counts as
    agreeing with an inf of the same sign."""
    o = out.double()
    y = oracle.double().to(o.device)
    d = (o - y).abs() / ulp_of(y, out.dtype)
    fin = torch.isfinite(o) & torch.isfinite(y)
    big = torch.finfo(out.dtype).max
    same_inf = torch.isinf(o) & ((o == y) | ((y.abs() > big) & (torch.sign(o) == torch.sign(y))))
    both_nan = torch.isnan(o) & torch.isnan(y)
    return torch.where(
        fin, d, torch.where(same_inf | both_nan, torch.zeros_like(d), torch.full_like(d, math.inf))
    )


def error_summary(out: Tensor, oracle: Tensor, reference: Tensor | None = None) -> dict[str, float]:
    """max / mean ULP vs the oracle, and (with `reference`) the share of elements whose bits differ
    from the torch reference (NaN == NaN)."""
    u = ulp_distance(out, oracle)
    res = {"max_ulp": float(u.max()) if u.numel() else 0.0, "mean_ulp": float(u.mean()) if u.numel() else 0.0}
    if reference is not None:
        diff = (out != reference) & ~(torch.isnan(out) & torch.isnan(reference))
        res["frac_diff_vs_torch"] = float(diff.double().mean()) if diff.numel() else 0.0
    return res
