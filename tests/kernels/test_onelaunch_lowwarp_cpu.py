"""The low-warp exact norm layout (norm_onelaunch_lowwarp.py) on CPU, through the Triton interpreter.

It serves the fast path's plans (32..512 lanes at any aligned width) with torch lane
``l = r * 32 NW + h * NW + w`` for NW warps; the tree it writes out under the interpreter (the levels over r,
then h, then w) must be the modelled torch-CUDA order bit for bit, and every form must give the
same bits as the general one-launch kernel. A spy checks that the low-warp kernel is what ran, so
these tests cannot pass on the fast kernel's behalf. Triton's own reduction for the (h, w) levels
(TL_SUM, GPU only) is checked by the start-up validation and by a SASS test in
test_onelaunch_ptx.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltbench.kernels import norm_onelaunch as nol
from rltbench.kernels import norm_onelaunch_fast as fast
from rltbench.kernels import norm_onelaunch_lowwarp as lowwarp
from rltbench.kernels import torch_reduce_model as trm
from tests.kernels._util import assert_bitwise
from tests.kernels.test_onelaunch_cpu import EPS, _adv, _bits, _sq
from tests.kernels.test_onelaunch_fast_cpu import _all_forms

CPU = torch.device("cpu")
# (T, N): 512 .. 32 lanes, 1 to 16 iterations per lane, widths that leave lanes idle
CASES = [(1, 2048), (1, 5280), (2, 2048), (2, 1028), (3, 5280), (4, 1000), (4, 2052), (1, 16384), (8, 2048),
         (16, 2048), (33, 260), (12, 132)]


@pytest.fixture(autouse=True, params=["tile4d", "flat"])
def _lowwarp_on(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test with both lane tiles (_lanes FLAT 0 and 1): same adds, same order."""
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "1")
    monkeypatch.setenv("RLTBENCH_NORM_LOWWARP", "1")
    monkeypatch.setenv("RLTBENCH_NORM_LOWWARP_FLAT", "1" if request.param == "flat" else "0")


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the low-warp launches made during the test."""
    calls: list[str] = []
    for name in ("launch_norm", "launch_norm_norm"):
        real = getattr(lowwarp, name)

        def spy(*a, _real=real, _name=name, **k):  # noqa: ANN002, ANN003, ANN202
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(lowwarp, name, spy)
    return calls


def test_lowwarp_is_opt_in_and_takes_every_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fast.variant(2048, 512, True) == "lowwarp"
    assert fast.variant(2048, 32, True) == "lowwarp"
    assert lowwarp.warps_for(512) == 4 and lowwarp.warps_for(64) == 2 and lowwarp.warps_for(32) == 1
    assert not lowwarp.supports(2050, 512, True)            # rows not 16-byte aligned
    assert not lowwarp.supports(2048, 512, False)           # older torch's warp order
    assert not lowwarp.supports(4 * 128 * (lowwarp.MAX_ITERS + 1), 128, True)
    monkeypatch.setenv("RLTBENCH_NORM_LOWWARP_WARPS", "3")
    with pytest.raises(ValueError, match="power of two"):
        lowwarp.warps_for(512)
    monkeypatch.delenv("RLTBENCH_NORM_LOWWARP_WARPS")
    assert lowwarp.describe().startswith("lowwarp (4 warps at 512 lanes, ")
    monkeypatch.delenv("RLTBENCH_NORM_LOWWARP")
    assert not lowwarp.enabled()
    assert fast.variant(2048, 512, True) == "fast"


@pytest.mark.parametrize("warps", [1, 4, 16])
@pytest.mark.parametrize("T,N", CASES)
def test_lowwarp_sum_equals_model(T: int, N: int, warps: int, ran: list[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_NORM_LOWWARP_WARPS", str(warps))
    x = _adv((T, N), torch.float32, seed=T * 37 + N)
    var = torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, torch.ones(N), EPS, torch.empty_like(x), var_out=var,
                                warp_order=trm.WARP_DOWN)
    assert ran == ["launch_norm"]
    want = trm.mean_rows(_sq(x), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(want))
    # the data tells orders apart, so the equality above is a real check
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(x)))).any() or N < 256


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,N,warps", [(1, 2048, 1), (1, 2048, 4), (1, 2048, 8), (2, 5280, 4), (4, 2052, 2),
                                       (8, 2048, 4)])
def test_lowwarp_equals_general_kernel_all_forms(T: int, N: int, warps: int, dtype: torch.dtype,
                                                 ran: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_NORM_LOWWARP_WARPS", str(warps))
    big = _adv((T, N + 8), dtype, 17)
    x = big[:, 4:4 + N]                     # strided rows that start mid-buffer
    r, b = _adv((T, N), dtype, 18), _adv((T, N), dtype, 19)
    w1, w2 = _adv((1, N), dtype, 20)[0], _adv((1, N), dtype, 21)[0]
    got = _all_forms(x, r, b, w1, w2)
    assert ran.count("launch_norm") == 3 and ran.count("launch_norm_norm") == 1
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "0")
    want = _all_forms(x, r, b, w1, w2)
    for k in want:
        assert_bitwise(got[k], want[k], k)


def test_lowwarp_norm_norm_second_variance_is_in_torch_order(ran: list[str]) -> None:
    T, N = 1, 2048
    a, r = _adv((T, N), torch.float32, 61), _adv((T, N), torch.float32, 62)
    w1, w2 = _adv((1, N), torch.float32, 63)[0], _adv((1, N), torch.float32, 64)[0]
    h, y, var = torch.empty_like(a), torch.empty_like(a), torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, a, w1, w2, EPS, h, y, var_out=var)
    assert ran == ["launch_norm_norm"]
    want = trm.mean_rows(_sq(h), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var[:, 1].contiguous().numpy()), _bits(want))
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(h)))).any()
