"""The native (CUDA C++) RoPE of q and k in one launch, NeoX (Ouro) or interleaved (Huginn), rounded
where the reference expressions round (rltbench/native/csrc/rope.cu)."""

from __future__ import annotations

import torch

from rltbench import native


def rope_native(kind: str, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                qo: torch.Tensor, ko: torch.Tensor) -> None:
    """RoPE ("neox" or "interleaved") of q [T, Hq, D] and k [T, Hk, D] into contiguous qo/ko; the
    contract of fused.rope (the caller checked shapes, dtypes and layouts)."""
    if q.numel() == 0 and k.numel() == 0:
        return
    native.load().rope(q, k, cos, sin, qo, ko, kind == "interleaved")
