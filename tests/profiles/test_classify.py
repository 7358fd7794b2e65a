"""Kernel classification on real kernel names (torch CUDA, cuBLAS/CUTLASS, our Triton kernels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltbench.commands.profile.classify import (
    COPY,
    NORM,
    OTHER,
    RESIDUAL,
    ROPE,
    classify_name,
    classify_sequence,
)

FIX = Path(__file__).parent / "fixtures"

# Real kernel names (torch CUDA native kernels, cuBLAS/cuBLASLt/CUTLASS, FlashAttention, our Triton
# kernels) with their expected class.
NAMES = [(r["name"], r["class"]) for r in json.loads((FIX / "kernel_names.json").read_text())]


@pytest.mark.parametrize("name,cls", NAMES)
def test_classify_name_table(name: str, cls: str) -> None:
    assert classify_name(name)[0] == cls


def test_torch_layer_sequence_classified_by_context() -> None:
    data = json.loads((FIX / "step_kernels.json").read_text())
    got = classify_sequence(data["step"])
    assert got == data["expected"]
    # a torch RMSNorm is 8 kernels, RoPE q,k 10 (kernels.md): context must recover both counts
    assert got.count(NORM) == 32 and got.count(ROPE) == 10 and got.count(RESIDUAL) == 2


def test_context_does_not_leak_far() -> None:
    data = json.loads((FIX / "step_kernels.json").read_text())
    step = data["step"]
    mul = next(n for n in step if "MulFunctor" in n)
    add = next(n for n in step if "CUDAFunctor_add<" in n)
    cast = next(n for n in step if "bfloat16_copy_kernel" in n)
    # generic kernels alone: mul -> other, add -> residual, cast -> copy
    assert classify_sequence([mul, add, cast]) == [OTHER, RESIDUAL, COPY]
