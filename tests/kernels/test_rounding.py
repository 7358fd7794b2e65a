"""The rounding helpers' interpreter path must really round (and round to nearest even), and the
fp32 helpers must match torch CPU's one-rounding ops. These tests fail for an identity helper."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rltbench.kernels.rounding import add_rn, div_rn, dtype_code, mul_rn, round_to, rsqrt_torch, sub_rn
from tests.kernels._util import assert_bitwise


@triton.jit
def _round_kernel(x_ptr, out_ptr, N, DT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < N)
    tl.store(out_ptr + i, round_to(x, DT, INTERPRET), mask=i < N)


@triton.jit
def _binop_kernel(a_ptr, b_ptr, out_ptr, N, OP: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i, mask=i < N, other=1.0)
    b = tl.load(b_ptr + i, mask=i < N, other=1.0)
    if OP == 0:
        r = mul_rn(a, b, INTERPRET)
    elif OP == 1:
        r = add_rn(a, b, INTERPRET)
    elif OP == 2:
        r = sub_rn(a, b, INTERPRET)
    elif OP == 3:
        r = div_rn(a, b, INTERPRET)
    else:
        r = rsqrt_torch(a, INTERPRET)
    tl.store(out_ptr + i, r, mask=i < N)


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
    _round_kernel[(triton.cdiv(x.numel(), 4096),)](
        x, out, x.numel(), DT=dtype_code(dtype), INTERPRET=True, BLOCK=4096
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
    code = ["mul", "add", "sub", "div", "rsqrt"].index(op)
    if op == "rsqrt":
        a = a.abs()
    out = torch.empty_like(a)
    _binop_kernel[(triton.cdiv(a.numel(), 4096),)](a, b, out, a.numel(), OP=code, INTERPRET=True, BLOCK=4096)
    ref = {"mul": a * b, "add": a + b, "sub": a - b, "div": a / b, "rsqrt": torch.rsqrt(a)}[op]
    assert_bitwise(out, ref, op)
