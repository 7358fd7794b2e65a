"""Helpers shared by the engine tests (a uniquely named module: several test folders have a
conftest.py, so importing helpers `from conftest` depends on collection order)."""

from __future__ import annotations

import torch

from rltbench.kernels import ARMS, make_ops
from rltbench.models import build_model


def tiny_model(preset: str, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 model on CPU with random weights."""
    return build_model(preset, device="cpu", dtype=torch.float32, seed=seed).eval()


def torch_ops():
    """The reference (torch arm) Ops."""
    return make_ops(ARMS["torch"])


def prompts(seed: int, lengths: list[int], vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
