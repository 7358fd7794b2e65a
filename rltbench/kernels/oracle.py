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


# The approx arm's stated bound, per output element: |out - oracle| <= ULPS[dtype] * ulp(oracle) +
# FP32_SLACK * terms. The first part is one final rounding of an fp32 value (0.5 ulp, some margin;
# fp32 outputs: 8 ulp). The second is the fp32 error of that value: a few fp32 roundings (the sum of
# squares' tree, rsqrt.approx, the products: well under 8 fp32 ulps) of the magnitude of the terms of
# the output's last sum. Without cancellation it is ~1e-4 ulp of the output; where the output is a
# near-cancelling sum (residual + y, x*cos - y*sin) it dominates: e.g. r + y with |r + y| = 2^-20 |y|
# is 60 output ulps away from the oracle for any fp32 computation (the GPU tests found 63).
ULPS = {torch.bfloat16: 0.6, torch.float16: 0.6, torch.float32: 8.0}
FP32_SLACK = 2.0**-20


def rms_norm_terms(
    x: Tensor, w: Tensor, eps: float, branch: Tensor | None = None, residual: Tensor | None = None
) -> Tensor:
    """|y| (+ |residual|): the magnitude of the terms of rms_norm's output (FP32_SLACK's scale)."""
    y = rms_norm(x, w, eps, branch).abs()
    return y if residual is None else y + residual.double().abs()


def rope_neox_terms(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """|x * cos| + |rotate_half(x) * sin| per output element."""
    c, s = cos.double().abs().unsqueeze(-2), sin.double().abs().unsqueeze(-2)

    def terms(x: Tensor) -> Tensor:
        a = x.double().abs()
        h = a.shape[-1] // 2
        return a * c + torch.cat((a[..., h:], a[..., :h]), -1) * s

    return terms(q), terms(k)


def rope_interleaved_terms(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """|p0 * cos| + |p1 * sin| per output element (pairs (p0, p1) of the interleaved layout)."""
    c, s = cos.double().abs().unsqueeze(-2), sin.double().abs().unsqueeze(-2)

    def terms(x: Tensor) -> Tensor:
        p = x.double().abs().unflatten(-1, (-1, 2))
        return torch.stack([p[..., 0] * c + p[..., 1] * s, p[..., 1] * c + p[..., 0] * s], -1).flatten(-2)

    return terms(q), terms(k)


def silu_mul_terms(gate: Tensor, up: Tensor) -> Tensor:
    """|silu(gate) * up|: a product, no cancellation."""
    return silu_mul(gate, up).abs()


def bound_ratio(out: Tensor, oracle: Tensor, terms: Tensor) -> Tensor:
    """|out - oracle| / (ULPS * ulp(oracle) + FP32_SLACK * terms) per element: <= 1 is within the
    approx arm's stated bound. Non-finite: 0 where out and oracle agree (ulp_distance), inf
    otherwise."""
    o = out.double()
    y = oracle.double().to(o.device)
    bound = ULPS[out.dtype] * ulp_of(y, out.dtype) + FP32_SLACK * terms.double().to(o.device)
    fin = torch.isfinite(o) & torch.isfinite(y)
    return torch.where(fin, (o - y).abs() / bound, ulp_distance(out, oracle))   # non-finite: 0 or inf


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


def error_summary(out: Tensor, oracle: Tensor, reference: Tensor | None = None,
                  terms: Tensor | None = None) -> dict[str, float]:
    """max / mean ULP vs the oracle, (with `terms`) the max bound_ratio, and (with `reference`) the
    share of elements whose bits differ from the torch reference (NaN == NaN)."""
    u = ulp_distance(out, oracle)
    res = {"max_ulp": float(u.max()) if u.numel() else 0.0, "mean_ulp": float(u.mean()) if u.numel() else 0.0}
    if terms is not None:
        b = bound_ratio(out, oracle, terms)
        res["max_bound_ratio"] = float(b.max()) if b.numel() else 0.0
    if reference is not None:
        diff = (out != reference) & ~(torch.isnan(out) & torch.isnan(reference))
        res["frac_diff_vs_torch"] = float(diff.double().mean()) if diff.numel() else 0.0
    return res
