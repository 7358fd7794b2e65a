"""The lowwarp layout of the exact one-launch norm (the default, OneLaunchConfig) on CPU, through the
Triton interpreter.

It serves the aligned plans (32..512 lanes) with torch lane ``l = r * 32 NW + h * NW + w`` for NW
warps; the tree it writes out under the interpreter (the levels over r, then h, then w: the explicit
halvings, as Triton's butterfly is GPU only) must be the modelled torch-CUDA order bit for bit,
and every form must give the same bits as the general layout. A spy checks which kernel ran, so
these tests cannot pass on the general layout's behalf. Triton's own reduction for the (h, w)
levels is checked by the start-up validation and by a SASS test in test_onelaunch_ptx.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltbench import tuned
from rltbench.kernels.norm import onelaunch as nol
from rltbench.kernels.norm import torch_order as trm
from rltbench.kernels.norm.config import OneLaunchConfig
from rltbench.kernels.norm.validate import ValidationResult
from tests.kernels._util import assert_bitwise
from tests.kernels.test_onelaunch_cpu import EPS, _adv, _bits, _sq

CPU = torch.device("cpu")
GENERAL = OneLaunchConfig(layout="general")
# (T, N): 512 .. 32 lanes, 1 to 16 iterations per lane, widths that leave lanes idle
CASES = [(1, 2048), (1, 5280), (2, 1028), (3, 5280), (4, 1000), (4, 2052), (1, 16384), (8, 2048),
         (16, 2048), (33, 260), (12, 132)]


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the one-launch kernels launched during the test."""
    calls: list[str] = []
    for name in ("_lowwarp_norm_kernel", "_lowwarp_rows_norm_kernel", "_lowwarp_held_norm_kernel",
                 "_lowwarp_norm_norm_kernel", "_general_norm_kernel", "_general_norm_norm_kernel"):
        real = getattr(nol, name)

        class Spy:
            def __getitem__(self, grid, _real=real, _name=name):  # noqa: ANN001, ANN204
                calls.append(_name)
                return _real[grid]

        monkeypatch.setattr(nol, name, Spy())
    return calls


def test_lowwarp_is_the_default_and_takes_the_aligned_plans() -> None:
    down = trm.WARP_DOWN
    assert OneLaunchConfig() == tuned.config(OneLaunchConfig) == OneLaunchConfig("lowwarp", 4, "tl_sum")
    assert nol.layout_for(2048, 1, CPU, down) == "lowwarp"
    assert nol.layout_for(2048, 16, CPU, down) == "lowwarp"
    assert nol.layout_for(2050, 1, CPU, down) == "general"                 # rows not 16-byte aligned
    assert nol.layout_for(2048, 1, CPU, trm.WARP_UP) == "general"          # older torch's warp order
    assert nol.layout_for(5280, 19, CPU, down) == "lowwarp"                # 42 iterations: two passes
    assert not nol.lowwarp_supports(4 * 128 * (nol.MAX_ITERS + 1), 128, True)
    assert nol.layout_for(2048, 1, CPU, down, GENERAL) == "general"
    with pytest.raises(ValueError, match="power of two"):
        OneLaunchConfig(warps=3)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="two_pass_min_rows"):
            OneLaunchConfig(two_pass_min_rows=bad)
    with pytest.raises(ValueError, match="packed"):
        OneLaunchConfig(packed=1)
    assert [c.name for c in OneLaunchConfig.search_space().values()][:2] == ["general", "lowwarp-flat-sum-w1"]


@pytest.mark.parametrize("warps", [1, 4, 16])
@pytest.mark.parametrize("T,N", CASES)
def test_lowwarp_sum_equals_model(T: int, N: int, warps: int, ran: list[str]) -> None:
    x = _adv((T, N), torch.float32, seed=T * 37 + N)
    var = torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, torch.ones(N), EPS, torch.empty_like(x), var_out=var,
                                warp_order=trm.WARP_DOWN, config=OneLaunchConfig(warps=warps))
    assert ran == ["_lowwarp_norm_kernel"]
    want = trm.mean_rows(_sq(x), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(want))
    # the data tells orders apart, so the equality above is a real check
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(x)))).any() or N < 256


def _all_forms(x: torch.Tensor, r: torch.Tensor, b: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
               cfg: OneLaunchConfig) -> dict[str, torch.Tensor]:
    T, N = x.shape
    out: dict[str, torch.Tensor] = {}
    var = torch.empty(T)
    y = torch.empty_like(x)
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, var_out=var, config=cfg)
    out["plain"], out["var"] = y.clone(), var.clone()
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, residual=r, config=cfg)
    out["residual"] = y.clone()
    nol.rms_norm_onelaunch_rows(x, w1, EPS, y, branch=b, config=cfg)
    out["add_huginn"] = y.clone()
    h, y2, var2 = torch.empty_like(x), torch.empty_like(x), torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, x, w1, w2, EPS, h, y2, var_out=var2, config=cfg)
    out["nn.h"], out["nn.y"], out["nn.var"] = h, y2, var2
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("T,N,warps", [(1, 2048, 1), (1, 2048, 4), (2, 5280, 4), (4, 1028, 2), (8, 520, 8)])
def test_lowwarp_equals_general_layout_all_forms(T: int, N: int, warps: int, dtype: torch.dtype,
                                                 ran: list[str]) -> None:
    big = _adv((T, N + 8), dtype, 17)
    x = big[:, 4:4 + N]                     # strided rows that start mid-buffer
    r, b = _adv((T, N), dtype, 18), _adv((T, N), dtype, 19)
    w1, w2 = _adv((1, N), dtype, 20)[0], _adv((1, N), dtype, 21)[0]
    got = _all_forms(x, r, b, w1, w2, OneLaunchConfig(warps=warps, tree="halvings"))
    assert ran == ["_lowwarp_norm_kernel"] * 3 + ["_lowwarp_norm_norm_kernel"]
    want = _all_forms(x, r, b, w1, w2, GENERAL)
    assert ran[4:] == ["_general_norm_kernel"] * 3 + ["_general_norm_norm_kernel"]
    for k in want:
        assert_bitwise(got[k], want[k], k)


@pytest.mark.parametrize("T,N,one_pass",
                         [(16, 1024, False), (16, 1024, True), (3, 5280, False), (8, 1000, True),
                          pytest.param(17, 5280, True, marks=pytest.mark.slow)])   # 42 vectors per lane
def test_lowwarp_one_and_two_pass_forms_equal_general_layout(T: int, N: int, one_pass: bool,
                                                              ran: list[str]) -> None:
    """Both row forms of the lowwarp kernels (one pass below two_pass_min_rows rows, two passes
    from it; the threshold forced here) give the general layout's bits in every form. Past 16
    vectors per lane the single norms take two passes and norm-add-norm the general layout; the
    plain form's two passes at 32 lanes take the several-rows kernel, and wider rows at 32 lanes
    the held kernel (plain and add forms; the residual form keeps two passes)."""
    x, r, b = (_adv((T, N), torch.bfloat16, seed) for seed in (71, 72, 73))
    w1, w2 = _adv((1, N), torch.bfloat16, 74)[0], _adv((1, N), torch.bfloat16, 75)[0]
    got = _all_forms(x, r, b, w1, w2, OneLaunchConfig(two_pass_min_rows=10**9 if one_pass else 1))
    lanes = trm.plan_for(T, N, CPU).lanes
    long_rows = -(-N // 4 // lanes) > nol.MAX_ONE_PASS_ITERS
    nn = "_general_norm_norm_kernel" if long_rows else "_lowwarp_norm_norm_kernel"
    # the plain form's two passes at 32 lanes and width <= 2048: several rows per program
    rows_kernel = not one_pass and lanes == 32 and N <= nol.ROWS_MAX_WIDTH
    held = lanes == 32 and N > nol.ROWS_MAX_WIDTH       # > 16 vectors per lane: never one pass
    plain = ("_lowwarp_rows_norm_kernel" if rows_kernel else "_lowwarp_held_norm_kernel" if held
             else "_lowwarp_norm_kernel")
    add = "_lowwarp_held_norm_kernel" if held else "_lowwarp_norm_kernel"
    assert ran == [plain, "_lowwarp_norm_kernel", add, nn]
    want = _all_forms(x, r, b, w1, w2, GENERAL)
    for k in want:
        assert_bitwise(got[k], want[k], k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T,N,rows", [(16, 2048, 4), (21, 2048, 4), (19, 2048, 8), (18, 1000, 2), (3, 132, 4),
                                      (17, 1028, 16)])
def test_rows_kernel_equals_model_and_one_row_kernel(T: int, N: int, rows: int, dtype: torch.dtype,
                                                     ran: list[str]) -> None:
    """The several-rows kernel of the plain two-pass form (stream_rows rows per program, one warp
    each; the last program's missing rows masked): the variance is the modelled torch order bit for
    bit, and the output is the one-row kernel's (stream_rows=1), which the general layout checks
    above. Strided rows that start mid-buffer; one and two output chunks. torch gives a row 32
    lanes from 16 rows up at these widths (at any row count below width 256)."""
    big = _adv((T, N + 8), dtype, seed=T * 7 + N)
    x = big[:, 4:4 + N]
    w = _adv((1, N), dtype, 91)[0]
    y, var = torch.empty((T, N), dtype=dtype), torch.empty(T)
    nol.rms_norm_onelaunch_rows(x, w, EPS, y, var_out=var, warp_order=trm.WARP_DOWN,
                                config=OneLaunchConfig(two_pass_min_rows=1, stream_rows=rows))
    assert ran == ["_lowwarp_rows_norm_kernel"]
    np.testing.assert_array_equal(_bits(var.numpy()), _bits(trm.mean_rows(_sq(x), warp_order=trm.WARP_DOWN)))
    y1 = torch.empty_like(y)
    nol.rms_norm_onelaunch_rows(x, w, EPS, y1, warp_order=trm.WARP_DOWN,
                                config=OneLaunchConfig(two_pass_min_rows=1, stream_rows=1))
    assert ran[1:] == ["_lowwarp_norm_kernel"]
    assert_bitwise(y, y1, "plain")


def test_add_form_of_many_wide_rows_writes_wider_chunks(monkeypatch: pytest.MonkeyPatch,
                                                        ran: list[str]) -> None:
    """From ADD_OUT_CHUNK_MIN_ROWS rows wider than ROWS_MAX_WIDTH the add form writes its output in
    chunks of ADD_OUT_CHUNK_PER_WARP columns per warp (two round trips per Huginn row instead of
    six); only the order of the stores changes, so its bits stay the general layout's. The row
    threshold is lowered here so that the interpreter runs the wide chunks at a few rows."""
    many = nol.ADD_OUT_CHUNK_MIN_ROWS
    assert nol.out_chunk_per_warp(many, 5280, add_form=True) == nol.ADD_OUT_CHUNK_PER_WARP
    assert nol.out_chunk_per_warp(many - 1, 5280, add_form=True) == nol.OUT_CHUNK_PER_WARP
    assert nol.out_chunk_per_warp(4096, 5280, add_form=False) == nol.OUT_CHUNK_PER_WARP
    assert nol.out_chunk_per_warp(4096, nol.ROWS_MAX_WIDTH, add_form=True) == nol.OUT_CHUNK_PER_WARP
    monkeypatch.setattr(nol, "ADD_OUT_CHUNK_MIN_ROWS", 2)
    T, N = 16, 5280   # torch's 32 lanes: one warp per row, as at prefill sizes
    x, b = _adv((T, N), torch.bfloat16, 81), _adv((T, N), torch.bfloat16, 82)
    w = _adv((1, N), torch.bfloat16, 83)[0]
    two_pass = OneLaunchConfig(two_pass_min_rows=1, wide_registers=False)   # fp32 rows, or a tuned file
    _, _, consts = nol._launch(x, EPS, None, two_pass, add_form=True)
    assert consts["NW"] == 1 and consts["OUT_CHUNKS"] == 2
    assert consts["OUT_CHUNK"] == nol.ADD_OUT_CHUNK_PER_WARP
    got, want = torch.empty_like(x), torch.empty_like(x)
    nol.rms_norm_onelaunch_rows(x, w, EPS, got, branch=b, config=two_pass)
    nol.rms_norm_onelaunch_rows(x, w, EPS, want, branch=b, config=GENERAL)
    assert ran == ["_lowwarp_norm_kernel", "_general_norm_kernel"]
    assert_bitwise(got, want, "add_huginn")


def test_held_parts_cover_the_row_with_at_most_four_register_tiles() -> None:
    assert nol.held_parts(42) == (32, 8, 2, 0)         # Huginn's 5280 at 32 lanes: no padding
    assert nol.held_parts(23) == (16, 4, 2, 1)
    assert nol.held_parts(17) == (16, 1, 0, 0)
    assert nol.held_parts(64) == (32, 32, 0, 0)
    assert nol.held_parts(63) == (32, 16, 8, 8)        # the rest rounded up: one vector masked
    for iters in range(1, nol.MAX_ITERS + 1):
        parts = nol.held_parts(iters)
        assert iters <= sum(parts) < iters + parts[3] + 1 and list(parts) == sorted(parts, reverse=True)
        assert all(p == 0 or (p & (p - 1) == 0 and p <= nol.HELD_MAX_TILE) for p in parts)
    for bad in (0, nol.MAX_ITERS + 1):
        with pytest.raises(ValueError, match="vectors per lane"):
            nol.held_parts(bad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,N", [(16, 2900), (17, 2336), pytest.param(18, 5280, marks=pytest.mark.slow)])
def test_held_kernel_equals_model_and_general_layout(T: int, N: int, dtype: torch.dtype,
                                                     ran: list[str]) -> None:
    """Rows wider than 2048 at torch's 32-lane plan, held in registers (four register tiles at
    width 2900: 16, 4, 2 and 1 vectors per lane, the last lanes of the last vector masked; three at
    2336 and at Huginn's 5280): the variance is the modelled torch order bit for bit, plain and add
    forms give the general layout's bits. Strided rows that start mid-buffer."""
    big = _adv((T, N + 16), dtype, seed=T * 7 + N)
    x = big[:, 8:8 + N]
    b, w = _adv((T, N), dtype, 92), _adv((1, N), dtype, 93)[0]
    for branch, vals in ((None, x), (b, (x.float() + b.float()).to(dtype))):
        y, var = torch.empty((T, N), dtype=dtype), torch.empty(T)
        nol.rms_norm_onelaunch_rows(x, w, EPS, y, branch=branch, var_out=var, warp_order=trm.WARP_DOWN)
        assert ran.pop() == "_lowwarp_held_norm_kernel"
        np.testing.assert_array_equal(_bits(var.numpy()),
                                      _bits(trm.mean_rows(_sq(vals), warp_order=trm.WARP_DOWN)))
        want = torch.empty_like(y)
        nol.rms_norm_onelaunch_rows(x, w, EPS, want, branch=branch, config=GENERAL)
        assert ran.pop() == "_general_norm_kernel"
        assert_bitwise(y, want, "add_huginn" if branch is not None else "plain")


def test_held_kernel_routing() -> None:
    """Which launches take the held kernel: 16-bit rows wider than 2048 at torch's 32-lane plan, in
    the plain and add forms at every such row count; not fp32 rows, not the residual form (its
    launch never asks), not with wide_registers off."""
    cfg = OneLaunchConfig()

    def held(T: int, N: int, dtype: torch.dtype, config: OneLaunchConfig = cfg) -> bool:
        x = torch.empty((T, N), dtype=dtype)
        _, _, consts = nol._launch(x, EPS, trm.WARP_DOWN, config)
        return "ONE_PASS" in consts and nol._takes_held_kernel(config, consts, x)

    assert held(16, 5280, torch.bfloat16) and held(2048, 5280, torch.float16)
    assert held(8192, 5280, torch.bfloat16) and held(16, 2052, torch.bfloat16)
    assert not held(8, 5280, torch.bfloat16)            # 64 lanes: two warps per row
    assert not held(4096, 2048, torch.bfloat16)         # the several-rows width
    assert not held(128, 5280, torch.float32)
    assert not held(128, 5280, torch.bfloat16, OneLaunchConfig(wide_registers=False))
    with pytest.raises(ValueError, match="wide_registers must"):
        OneLaunchConfig(wide_registers=1)  # type: ignore[arg-type]


def test_lowwarp_norm_norm_second_variance_is_in_torch_order(ran: list[str]) -> None:
    T, N = 2, 2048
    a, r = _adv((T, N), torch.float32, 61), _adv((T, N), torch.float32, 62)
    w1, w2 = _adv((1, N), torch.float32, 63)[0], _adv((1, N), torch.float32, 64)[0]
    h, y, var = torch.empty_like(a), torch.empty_like(a), torch.empty(T, 2)
    nol.residual_rms_norm_norm_onelaunch_rows(r, a, w1, w2, EPS, h, y, var_out=var)
    assert ran == ["_lowwarp_norm_norm_kernel"]
    want = trm.mean_rows(_sq(h), warp_order=trm.WARP_DOWN)
    np.testing.assert_array_equal(_bits(var[:, 1].contiguous().numpy()), _bits(want))
    assert (_bits(want) != _bits(trm.sequential_mean_rows(_sq(h)))).any()


def test_validation_refuses_a_failing_layout_and_trusts_the_general_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowwarp layout is trusted only on its own record: if its validation shows a mismatch, the
    general layout is validated on its own and serves that key (the report says why)."""
    gpu = torch.device("cuda", 0)
    calls: list[str] = []

    def fake_cases(device, dtype, width, order, kernels, seed=0, tokens=()):  # noqa: ANN001, ANN202
        layout = nol.layout_for(width, 1, device, order, None, dtype)
        calls.append(layout)
        bad = [{"form": "var", "tokens": 1, "n_diff": 1, "first_index": 0}] if layout == "lowwarp" else []
        return 7, 100, bad, {512, 32}

    monkeypatch.setattr(nol, "run_cases", fake_cases)
    monkeypatch.setattr("rltbench.kernels.norm.validate.device_name", lambda d: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    monkeypatch.setattr("rltbench.kernels.norm.torch_order.device_props", lambda d: trm.GpuProps())
    nol.reset_validation()
    try:
        res: ValidationResult = nol.validate(gpu, torch.bfloat16, 2048)
        assert calls == ["lowwarp", "general"]
        assert res.passed and res.layout == "general"
        assert res.layout_refused.startswith("lowwarp-flat-sum-w4: 1 mismatching")
        assert nol.layout_for(2048, 1, gpu, trm.WARP_DOWN, None, torch.bfloat16) == "general"
        assert nol.layout_for(2048, 1, gpu, trm.WARP_DOWN, None, torch.float16) == "lowwarp"
    finally:
        nol.reset_validation()
    assert nol.layout_for(2048, 1, gpu, trm.WARP_DOWN, None, torch.bfloat16) == "lowwarp"
