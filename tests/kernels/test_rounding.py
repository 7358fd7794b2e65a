"""The rounding helpers' interpreter path must really round (and round to nearest even), and the
fp32 helpers must match torch CPU's one-rounding ops. These tests fail for an identity helper."""

from __future__ import annotations

import pytest
import torch
import triton

from rltbench.kernels.rounding import dtype_code
from tests.kernels._rounding_kernel import HELPER_OPS, helper_kernel
from tests.kernels._util import assert_bitwise


def _fp32_cases(gen: torch.Generator) -> torch.Tensor:
    """Random fp32 values over many binades, exact ties for bf16/fp16, specials, overflow edges."""
    bits = torch.randint(0, 2**31 - 1, (20000,), generator=gen, dtype=torch.int64).to(torch.int32)
    rnd = bits.view(torch.float32)
    rnd = rnd[torch.isfinite(rnd)]
    base = torch.randn(4000, generator=gen).to(torch.bfloat16).float()
    ties = base.view(torch.int32) | 0x8000  # exactly half way between two bf16 values
    hbase = torch.randn(4000, generator=gen).to(torch.float16).float()
    hties = (hbase.view(torch.int32) | 0x1000).view(torch.float32)  # half way between fp16 values
    specials = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            -float("inf"),
            float("nan"),
            3.4e38,
            -3.4e38,
            65519.0,
            65520.0,
            1e-40,
            -1e-45,
            6e-8,
            3e-8,
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
        ]
    )
    return torch.cat([rnd, -rnd, ties.view(torch.float32), hties, specials, torch.randn(2000, generator=gen)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_to_interpreter_rounds_to_nearest_even(dtype: torch.dtype) -> None:
    x = _fp32_cases(torch.Generator().manual_seed(1))
    out = torch.empty_like(x)
    helper_kernel[(triton.cdiv(x.numel(), 4096),)](
        x, x, out, x.numel(), OP=HELPER_OPS.index("round"), DT=dtype_code(dtype), INTERPRET=True, BLOCK=4096
    )
    assert not torch.equal(out, x)  # it must change values that are not representable
    assert_bitwise(out, x.to(dtype).float(), f"round_to {dtype}")


@pytest.mark.parametrize("op", ["mul", "add", "sub", "div", "rsqrt"])
def test_fp32_helpers_match_torch_cpu(op: str) -> None:
    gen = torch.Generator().manual_seed(2)
    a = torch.cat(
        [
            torch.randn(5000, generator=gen) * 1e3,
            torch.rand(5000, generator=gen) * 1e-3,
            torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-40, 3e38]),
        ]
    )
    b = torch.cat(
        [
            torch.randn(5000, generator=gen),
            torch.rand(5000, generator=gen) * 7,
            torch.tensor([1.0, 0.0, 2.0, 1.0, 1e-39, 11.0]),
        ]
    )
    if op == "rsqrt":
        a = a.abs()
    out = torch.empty_like(a)
    helper_kernel[(triton.cdiv(a.numel(), 4096),)](a, b, out, a.numel(), OP=HELPER_OPS.index(op), DT=0,
                                                    INTERPRET=True, BLOCK=4096)
    ref = {"mul": a * b, "add": a + b, "sub": a - b, "div": a / b, "rsqrt": torch.rsqrt(a)}[op]
    assert_bitwise(out, ref, op)
