"""The fast one-launch exact norm (norm_onelaunch_fast.py) on CPU, through the Triton interpreter.

It must add the squares in the modelled torch-CUDA order for every lane count it serves (512 down
to 32: T = 1, 2, 4, 8, >= 16), for widths needing 1..many unrolled iterations, and give the same
bits as the general one-launch kernel for every form (plain, residual, Huginn add, norm-add-norm).
The GPU-only Triton warp reduction (TREE_SUM) is checked by the start-up validation and the GPU
tests; here the explicit halving runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltbench.kernels import norm_onelaunch as nol
from rltbench.kernels import norm_onelaunch_fast as fast
from rltbench.kernels import torch_reduce_model as trm
from tests.kernels._util import assert_bitwise
from tests.kernels.test_onelaunch_cpu import EPS, _adv, _bits, _sq

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fast_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast kernel is opt-in (norm_onelaunch_fast.enabled); these tests exercise it."""
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "1")


def test_fast_kernel_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLTBENCH_NORM_FAST")
    assert not fast.enabled()
    assert nol.kernel_path(2048, 1, CPU, trm.WARP_DOWN) == "general"
# (T, N): every lane count (512/256/128/64/32) and 1 to 16 (MAX_ITERS) iterations per lane
CASES = [(1, 2048), (1, 5280), (2, 2048), (3, 5280), (4, 1000), (4, 5280), (6, 2052), (8, 4096), (12, 132),
         (16, 2048), (33, 260)]


@pytest.mark.parametrize("T,N", CASES)
def test_fast_path_is_taken(T: int, N: int) -> None:
    assert nol.kernel_path(N, T, CPU, trm.WARP_DOWN) == "fast"


def test_fast_path_refuses_what_it_cannot_do(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nol.kernel_path(2051, 1, CPU, trm.WARP_DOWN) == "general"   # rows not 16-byte aligned
    assert nol.kernel_path(2048, 1, CPU, trm.WARP_UP) == "general"     # older torch's order
    assert not fast.supports(4 * 32 * (fast.MAX_ITERS + 1), 32, True)  # unroll bound
    assert nol.kernel_path(5280, 19, CPU, trm.WARP_DOWN) == "general"  # 42 iterations at 32 lanes
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "0")
    assert nol.kernel_path(2048, 1, CPU, trm.WARP_DOWN) == "general"


@pytest.mark.parametrize("T,N", CASES)
def test_fast_sum_equals_model(T: int, N: int) -> None:
    x = _adv((T, N), torch.float32, seed=T * 31 + N)
    var = torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, torch.ones(N), EPS, torch.empty_like(x), var_out=var,
                                warp_order=trm.WARP_DOWN)
    want = trm.mean_rows(_sq(x), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(want))
    # the data tells orders apart, so the equality above is a real check
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(x)))).any() or N < 256


def _all_forms(x: torch.Tensor, r: torch.Tensor, b: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor
               ) -> dict[str, torch.Tensor]:
    T, N = x.shape
    out: dict[str, torch.Tensor] = {}
    var = torch.empty(T)
    y = torch.empty_like(x)
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, var_out=var)
    out["plain"], out["var"] = y.clone(), var.clone()
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, residual=r)
    out["residual"] = y.clone()
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, branch=b)
    out["add_huginn"] = y.clone()
    h, y2, var2 = torch.empty_like(x), torch.empty_like(x), torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, x, w1, w2, EPS, h, y2, var_out=var2)
    out["nn.h"], out["nn.y"], out["nn.var"] = h, y2, var2
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,N", [(1, 2048), (3, 5280), (17, 2048)])
def test_fast_equals_general_kernel_all_forms(T: int, N: int, dtype: torch.dtype,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    big = _adv((T, N + 8), dtype, 7)
    x = big[:, 4:4 + N]                     # strided rows that start mid-buffer
    r, b = _adv((T, N), dtype, 8), _adv((T, N), dtype, 9)
    w1, w2 = _adv((1, N), dtype, 10)[0], _adv((1, N), dtype, 11)[0]
    got = _all_forms(x, r, b, w1, w2)
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "0")
    assert nol.kernel_path(N, T, CPU, trm.WARP_DOWN) == "general"
    want = _all_forms(x, r, b, w1, w2)
    for k in want:
        assert_bitwise(got[k], want[k], k)


def test_fast_norm_norm_differs_when_order_is_wrong() -> None:
    """A discriminating check: the fast norm-add-norm's second variance equals the model on h and
    differs from a sequential sum of the same squares."""
    T, N = 2, 2048
    a, r = _adv((T, N), torch.float32, 51), _adv((T, N), torch.float32, 52)
    w1, w2 = _adv((1, N), torch.float32, 53)[0], _adv((1, N), torch.float32, 54)[0]
    h, y, var = torch.empty_like(a), torch.empty_like(a), torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, a, w1, w2, EPS, h, y, var_out=var)
    want = trm.mean_rows(_sq(h), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var[:, 1].contiguous().numpy()), _bits(want))
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(h)))).any()


def test_validation_falls_back_to_general_kernel_when_fast_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast kernel is trusted only on its own record: if its validation shows a mismatch, the
    general kernel is validated on its own and serves the width (the report says why)."""
    calls: list[str] = []

    def fake_cases(device, dtype, width, seed, tokens, order):  # noqa: ANN001, ANN202
        path = nol.kernel_path(width, 1, device, order)
        calls.append(path)
        bad = [{"form": "var", "tokens": 1, "n_diff": 1, "first_index": 0}] if path == "fast" else []
        return 7, 100, bad, {512, 32}

    monkeypatch.setattr(nol, "run_cases", fake_cases)
    monkeypatch.setattr(nol, "_device_name", lambda d: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    monkeypatch.setattr(nol, "gpu_props", lambda d: trm.GpuProps())
    nol.reset_validation()
    try:
        res = nol.validate(torch.device("cuda", 0), torch.bfloat16, 2048)
        assert calls == ["fast", "general"]
        assert res.passed and res.fast_path.startswith("refused: 1 mismatching")
        assert nol.kernel_path(2048, 1, torch.device("cuda", 0), trm.WARP_DOWN) == "general"
    finally:
        nol.reset_validation()
    assert nol.kernel_path(2048, 1, CPU, trm.WARP_DOWN) == "fast"
