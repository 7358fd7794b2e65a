"""One-launch exact RMSNorm on CPU (Triton interpreter).

torch CPU sums in another order than torch CUDA, so the CPU tests prove three narrower things:
(a) the Triton kernel adds the squares in exactly the modelled torch-CUDA order (kernel == model,
bit for bit, for every plan shape, both warp orders, odd widths, misaligned rows);
(b) that comparison can fail: on the same data the model differs from other orders (a naive
sequential sum, the other warp order, another plan);
(c) the epilogue equals the torch expression given the same variance, for every form.
Whether torch CUDA really uses the modelled order is checked on the GPU (test_onelaunch_gpu.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltbench.kernels.norm import onelaunch as nol
from rltbench.kernels.norm import torch_order as trm
from tests.kernels._util import assert_bitwise

EPS = 1e-6


def _adv(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Adversarial rows: per-element magnitudes 2**[-lim, lim] (the fp32 sum is order sensitive)."""
    g = torch.Generator().manual_seed(seed)
    lim = 11 if dtype == torch.float16 else 20
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-lim, lim + 1, shape, generator=g).float())
    return x.to(dtype)


def _sq(x: torch.Tensor) -> np.ndarray:
    v = x.float().numpy()
    return (v * v).astype(np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.int32)


# ---------------------------------------------------------------------------------------------
# the plan (setReduceConfig)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "T,N,lanes",
    [(1, 2048, 512), (2, 2048, 256), (3, 2048, 256), (4, 5280, 128), (7, 5280, 128), (8, 5280, 64),
     (15, 4096, 64), (16, 2048, 32), (8192, 5632, 32), (1, 1000, 128), (1, 130, 32), (1, 8192, 512)],
)
def test_plan_lanes(T: int, N: int, lanes: int) -> None:
    plan = trm.reduce_plan(T, N)
    assert plan.unsupported_reason is None and plan.lanes == lanes


def test_model_widths_never_split_rows_across_warps_or_blocks() -> None:
    """docs/onelaunch_norm.md: for the models' widths no row is split across warps or blocks for
    any T <= 8192, so SM count / threads per SM (which only the block split reads) never matter."""
    for N in (1000, 2048, 4096, 5280, 5632, 5633):
        for T in range(1, 8193):
            p = trm.reduce_plan(T, N, trm.GpuProps(sm_count=1, max_threads_per_sm=2048))
            assert not p.split_y and p.ctas_per_output == 1 and p.unsupported_reason is None, (T, N)


def test_plan_unsupported_shapes() -> None:
    assert trm.reduce_plan(1, 128).unsupported_reason is not None          # not vectorized
    assert trm.reduce_plan(16, 8192).unsupported_reason is not None        # split across warps
    assert trm.reduce_plan(1, 8192).unsupported_reason is None             # split_y, one warp-row
    big = trm.reduce_plan(1, 1 << 17)
    assert big.ctas_per_output > 1 and big.unsupported_reason is not None  # global reduce
    assert trm.reduce_plan(1 << 17, 4096).unsupported_reason is not None   # 64-bit indexing


def test_mean_factor_is_torchs_float_division() -> None:
    for T, N in ((1, 2048), (3, 5280), (8191, 5633), (8192, 5280)):
        assert trm.mean_factor(T, N) == np.float32(T) / np.float32(T * N)
    # T*N not representable in fp32: the factor is not simply fp32(1/N)
    assert any(trm.mean_factor(T, 5633) != np.float32(1.0) / np.float32(5633) for T in range(8000, 8192))


def test_default_warp_order() -> None:
    assert trm.default_warp_order("2.11.0+cu130") == trm.WARP_DOWN
    assert trm.default_warp_order("2.10.0a0+gitabc") == trm.WARP_DOWN
    assert trm.default_warp_order("2.9.1") == trm.WARP_UP
    assert trm.default_warp_order("2.13.0") == trm.WARP_DOWN


# ---------------------------------------------------------------------------------------------
# (a) kernel == model, bit for bit
# ---------------------------------------------------------------------------------------------
CASES = [  # (T, N): lanes 512/256/128/64/32, N % 4 in {0,1,2,3} (misaligned rows), tails, odd N
    (1, 2048), (1, 1001), (2, 5633), (3, 1002), (5, 517), (10, 1030), (9, 130), (17, 301), (20, 515),
    (1, 8195),
]


@pytest.mark.parametrize("order", trm.WARP_ORDERS)
@pytest.mark.parametrize("T,N", CASES)
def test_kernel_sum_equals_model(T: int, N: int, order: str) -> None:
    assert trm.reduce_plan(T, N).unsupported_reason is None
    x = _adv((T, N), torch.float32, seed=T * 7919 + N)
    out = torch.empty_like(x)
    var = torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, torch.ones(N), EPS, out, var_out=var, warp_order=order)
    want = trm.mean_rows(_sq(x), warp_order=order)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_sum_equals_model_half_dtypes(dtype: torch.dtype) -> None:
    T, N = 6, 1003
    x = _adv((T, N), dtype, seed=3)
    var = torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, torch.ones(N, dtype=dtype), EPS, torch.empty_like(x), var_out=var)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(trm.mean_rows(_sq(x))))


def test_kernel_sum_equals_model_add_form() -> None:
    """Huginn's add form reduces round(x + b)."""
    T, N = 5, 771
    x, b = _adv((T, N), torch.bfloat16, 1), _adv((T, N), torch.bfloat16, 2)
    var = torch.empty(T)
    ones = torch.ones(N, dtype=x.dtype)
    nol.rms_norm_onelaunch_rows(x, ones, EPS, torch.empty_like(x), branch=b, var_out=var)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(trm.mean_rows(_sq(x + b))))


# ---------------------------------------------------------------------------------------------
# (b) the comparison can fail: the data is order sensitive
# ---------------------------------------------------------------------------------------------
def test_model_order_is_distinguishable() -> None:
    sq = _sq(_adv((64, 2051), torch.float32, seed=11))
    down = trm.mean_rows(sq, warp_order=trm.WARP_DOWN)
    assert (down != trm.sequential_mean_rows(sq)).sum() > 5
    assert (down != trm.mean_rows(sq, warp_order=trm.WARP_UP)).sum() > 0
    pairwise = sq.sum(axis=1, dtype=np.float32) * trm.mean_factor(64, 2051)  # numpy's pairwise order
    assert (down != pairwise).sum() > 0
    # the same rows under another plan (one row per call: 512 lanes instead of 32)
    one = np.array([trm.mean_rows(sq[i:i + 1])[0] for i in range(64)], dtype=np.float32)
    assert (down != one).sum() > 5


def test_kernel_differs_from_wrong_order() -> None:
    """Kernel == model is discriminative: the kernel differs from the model of the other order."""
    x = _adv((40, 2051), torch.float32, seed=5)
    var = torch.empty(40)
    nol.rms_norm_onelaunch_rows(x, torch.ones(2051), EPS, torch.empty_like(x), var_out=var,
                                warp_order=trm.WARP_DOWN)
    assert (_bits(var.numpy()) != _bits(trm.mean_rows(_sq(x), warp_order=trm.WARP_UP))).any()
    assert (_bits(var.numpy()) != _bits(trm.sequential_mean_rows(_sq(x)))).any()


# ---------------------------------------------------------------------------------------------
# (c) the epilogue equals the torch expression given the same variance
# ---------------------------------------------------------------------------------------------
def _norm_given_var(v: torch.Tensor, var: torch.Tensor, w: torch.Tensor, huginn: bool = False
                    ) -> torch.Tensor:
    h = v.float() * torch.rsqrt(var[:, None] + EPS)
    return h.type_as(v) * w if huginn else w * h.to(v.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_epilogue_equals_reference_given_variance(dtype: torch.dtype) -> None:
    T, N = 7, 1001
    x, r, b = _adv((T, N), dtype, 21), _adv((T, N), dtype, 22), _adv((T, N), dtype, 23)
    w = _adv((1, N), dtype, 24)[0]
    var = torch.empty(T)
    out = torch.empty_like(x)
    nol.rms_norm_onelaunch_rows(x, w, EPS, out, var_out=var)
    assert_bitwise(out, _norm_given_var(x, var, w), "ouro")
    nol.rms_norm_onelaunch_rows(x, w, EPS, out, residual=r, var_out=var)
    assert_bitwise(out, r + _norm_given_var(x, var, w), "residual")
    nol.rms_norm_onelaunch_rows(x, w, EPS, out, branch=b, var_out=var)
    assert_bitwise(out, _norm_given_var(x + b, var, w, huginn=True), "add_huginn")
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(trm.mean_rows(_sq(x + b))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_norm_given_variances(dtype: torch.dtype) -> None:
    T, N = 5, 2050
    a, r = _adv((T, N), dtype, 31), _adv((T, N), dtype, 32)
    w1, w2 = _adv((1, N), dtype, 33)[0], _adv((1, N), dtype, 34)[0]
    h, y = torch.empty_like(a), torch.empty_like(a)
    var = torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, a, w1, w2, EPS, h, y, var_out=var)
    np.testing.assert_array_equal(_bits(var[:, 0].numpy()), _bits(trm.mean_rows(_sq(a))))
    assert_bitwise(h, r + _norm_given_var(a, var[:, 0].contiguous(), w1), "h")
    np.testing.assert_array_equal(_bits(var[:, 1].numpy()), _bits(trm.mean_rows(_sq(h))))
    assert_bitwise(y, _norm_given_var(h, var[:, 1].contiguous(), w2), "y")


def test_public_wrappers_shapes_and_strided_rows() -> None:
    """[B, S, W] inputs and row-strided views give the same bits as contiguous 2-D rows."""
    B, S, N = 2, 3, 515
    x = _adv((B, S, N), torch.bfloat16, 41)
    r = _adv((B, S, N), torch.bfloat16, 42)
    w, w2 = _adv((1, N), torch.bfloat16, 43)[0], _adv((1, N), torch.bfloat16, 44)[0]
    flat = torch.empty(B * S, N, dtype=x.dtype)
    nol.rms_norm_onelaunch_rows(x.view(-1, N), w, EPS, flat)
    assert_bitwise(nol.rms_norm_onelaunch(x, w, EPS), flat.view(B, S, N), "3-D")
    assert_bitwise(nol.rms_norm_onelaunch(x, w, EPS, form="huginn"), flat.view(B, S, N), "huginn form")
    big = torch.full((B * S, N + 7), float("nan"), dtype=x.dtype)
    big[:, 3:3 + N] = x.view(-1, N)
    assert_bitwise(nol.rms_norm_onelaunch(big[:, 3:3 + N], w, EPS), flat, "strided rows")
    h, y = nol.residual_rms_norm_norm_onelaunch(r, x, w, w2, EPS)
    assert_bitwise(h, nol.residual_rms_norm_onelaunch(r, x, w, EPS), "norm_norm h")
    assert_bitwise(y, nol.rms_norm_onelaunch(h, w2, EPS), "norm_norm y")
    assert_bitwise(nol.add_rms_norm_huginn_onelaunch(x, r, w, EPS), nol.rms_norm_onelaunch(x + r, w, EPS),
                   "add form")


def test_bad_inputs_raise() -> None:
    x = torch.randn(2, 300)
    with pytest.raises(ValueError):
        nol.rms_norm_onelaunch(x, torch.randn(301), EPS)
    with pytest.raises(ValueError):
        nol.rms_norm_onelaunch(x, torch.randn(300, dtype=torch.bfloat16), EPS)
    with pytest.raises(ValueError):
        nol.rms_norm_onelaunch(x, torch.randn(300), EPS, form="llama")
    with pytest.raises(ValueError):  # torch does not vectorize 128-wide rows: order not modelled
        nol.rms_norm_onelaunch(torch.randn(2, 128), torch.randn(128), EPS)
    with pytest.raises(ValueError):
        nol.rms_norm_onelaunch_rows(x, torch.randn(300), EPS, torch.empty_like(x), warp_order="sideways")


# ---------------------------------------------------------------------------------------------
# trust decisions off the GPU
# ---------------------------------------------------------------------------------------------
def test_never_trusted_on_cpu() -> None:
    nol.reset_validation()
    x = torch.randn(3, 2048)
    assert not nol.is_trusted(x)
    res = nol.validate("cpu", torch.float32, 2048)
    assert not res.passed and "CUDA" in res.reason
    rep = nol.validation_report()
    assert rep["refusals"].get("not_cuda") == 1
    order = nol.warp_order_for(torch.device("cpu"), torch.float32, 2048)
    assert order == trm.default_warp_order(torch.__version__)
    nol.reset_validation()
