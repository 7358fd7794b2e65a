"""Full-size models on a CPU: a warning before long work, and a KV pool that cannot fit is one line."""

from __future__ import annotations

import pytest
import torch

from rltbench import runtime
from rltbench.errors import UsageError
from rltbench.models import build_model, cpu_size_note


def test_cpu_size_note_only_for_large_models_on_cpu() -> None:
    model = build_model("ouro-tiny", device="cpu", dtype=torch.float32, seed=0)
    assert cpu_size_note(model) is None
    note = cpu_size_note(model, limit_params=10)
    assert note is not None and "--model ouro-tiny" in note


def test_kv_pool_larger_than_memory_is_refused_in_one_line(monkeypatch) -> None:
    model = build_model("ouro-tiny", device="cpu", dtype=torch.float32, seed=0)
    monkeypatch.setattr(runtime, "_available_memory_bytes", lambda: 2**20)
    with pytest.raises(UsageError, match=r"GiB of KV cache .* GiB free"):
        runtime.check_cpu_pool(model, num_blocks=10_000, block_size=16)
    monkeypatch.setattr(runtime, "_available_memory_bytes", lambda: 2**40)
    runtime.check_cpu_pool(model, num_blocks=10_000, block_size=16)
