"""Fixtures for the engine tests: tiny fp32 models on CPU and a torch-reference Ops object.

`build_model` / `make_ops` come from rltbench.models / rltbench.kernels. While either package is still
being written, a local stand-in is used (random init of the model classes; the models' own reference
Ops), so these tests exercise the engine either way.
"""

from __future__ import annotations

import pytest
import torch


def _build(preset: str, seed: int = 0) -> torch.nn.Module:
    try:
        from rltbench.models import build_model
    except ImportError:  # stand-in until rltbench.models exports build_model
        from rltbench.models.configs import get_config

        cfg = get_config(preset)
        if cfg.family == "ouro":
            from rltbench.models.ouro import OuroForCausalLM as cls
        else:
            from rltbench.models.huginn import HuginnForCausalLM as cls
        torch.manual_seed(seed)
        m = cls(cfg, dtype=torch.float32)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.dim() == 1 and "bias" not in name:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5))
        m.reset_buffers()
        return m.eval()
    return build_model(preset, device="cpu", dtype=torch.float32, seed=seed).eval()


@pytest.fixture(scope="session")
def ouro_tiny() -> torch.nn.Module:
    return _build("ouro-tiny")


@pytest.fixture(scope="session")
def huginn_tiny() -> torch.nn.Module:
    return _build("huginn-tiny")


def torch_ops():
    """The reference (torch arm) Ops."""
    try:
        from rltbench.kernels import ARMS, make_ops

        return make_ops(ARMS["torch"])
    except ImportError:
        from rltbench.models._ref_ops import TorchReferenceOps

        return TorchReferenceOps()


@pytest.fixture()
def ops():
    return torch_ops()


def prompts(seed: int, lengths: list[int], vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
