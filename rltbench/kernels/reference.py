"""The torch arm: the models' own expressions, op by op, exactly as the model code writes them.

These functions define what "exact" means: the exact Triton kernels must be torch.equal to them.
Do not "simplify" an expression here (operand order, casts, where a rounding happens): that would
change the reference every result is compared against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Ouro / HF Llama RMSNorm: ``w * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)``."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(x.dtype)


def rms_norm_huginn(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Huginn (raven) RMSNorm: ``(x.float() * rsqrt(mean(x.float()^2) + eps)).type_as(x) * w``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.type_as(x) * w


def residual_rms_norm(
    residual: torch.Tensor, branch: torch.Tensor, w: torch.Tensor, eps: float
) -> torch.Tensor:
    """Ouro sandwich: ``residual + rms_norm(branch)`` (the branch is normalised, not the sum)."""
    return residual + rms_norm(branch, w, eps)


def add_rms_norm_huginn(x: torch.Tensor, branch: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Huginn sandwich: the *sum* is normalised, ``rms_norm_huginn(branch + x)`` (raven writes
    ``norm(attn_out + x)``; the add is commutative bit for bit)."""
    return rms_norm_huginn(branch + x, w, eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF Llama rotate_half: ``cat(-x2, x1)`` over the two halves of the last dim."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_neox(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX RoPE: q [T, Hq, D], k [T, Hk, D], cos/sin [T, D] in q's dtype; ``x*cos + rotate_half(x)*sin``."""
    c = cos.unsqueeze(-2)
    s = sin.unsqueeze(-2)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rope_interleaved(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Huginn ``apply_rotary_emb_complex_like``: pairs (x[2j], x[2j+1]) rotated in fp32, cast back.
    cos/sin [T, D/2] fp32 (the model's freqs_cis[..., 0] / [..., 1])."""
    qk_r2 = torch.cat([q, k], dim=1).unflatten(dim=-1, sizes=(-1, 2)).float()
    c = cos.unsqueeze(1)
    s = sin.unsqueeze(1)
    rotated = torch.stack(
        [
            qk_r2[..., 0] * c - qk_r2[..., 1] * s,
            qk_r2[..., 1] * c + qk_r2[..., 0] * s,
        ],
        -1,
    ).flatten(2)
    q_out, k_out = torch.split(
        rotated.type_as(q), [q.shape[1], k.shape[1]], dim=1
    )  # raven: q.shape[2] (Hq == Hk)
    return q_out, k_out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Gated MLP activation: ``silu(gate) * up`` (two kernels in torch)."""
    return F.silu(gate) * up


def residual_rms_norm_norm(
    residual: torch.Tensor, branch: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ouro's post-branch norm then the next pre-norm: ``h = residual + rms_norm(branch, w1)``,
    ``y = rms_norm(h, w2)``."""
    h = residual_rms_norm(residual, branch, w1, eps)
    return h, rms_norm(h, w2, eps)
