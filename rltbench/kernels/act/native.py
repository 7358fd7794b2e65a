"""The native (CUDA C++) SiLU·up: ``round(round(silu(g)) * up)`` as torch computes it, one launch
(rltbench/native/csrc/act.cu: 16-byte vector body with packed bf16x2/half2 multiplies, scalar
tail in the same kernel, a grid sized to the GPU)."""

from __future__ import annotations

import torch

from rltbench import native


def silu_mul_native_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """out = silu(gate) * up over 2-D rows (row strides free, last dim contiguous, out contiguous)."""
    if gate.numel() == 0:
        return
    native.load().silu_mul(gate, up, out)
