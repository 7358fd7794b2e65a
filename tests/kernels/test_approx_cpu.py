"""approx arm vs the fp64 oracle, with its stated bound (rltbench/kernels/oracle.py).

|out - oracle| <= 0.6 ulp (fp32: 8 ulp) at the oracle value + 2^-20 x the magnitude of the terms of
the output's last sum: one final rounding of an fp32 value, plus that value's own fp32 error. The
second part only matters where the output cancels (residual + y, x*cos - y*sin): there no fp32
computation is within 0.6 output ulps (test_cancellation_needs_the_slack). The exact arm, by contrast,
matches torch, which rounds twice and is outside this bound (test_torch_double_rounding_breaks_bound).
"""

from __future__ import annotations

import pytest
import torch

from rltbench.kernels import OPS, OpSelection, make_ops, op_case
from rltbench.kernels.norm import approx as norm_approx
from rltbench.kernels.norm.config import ApproxNormLaunch
from rltbench.kernels.oracle import bound_ratio, error_summary, rms_norm_terms
from rltbench.kernels.oracle import rms_norm as rms_norm_oracle


def _within_bound(name: str, ops, inputs) -> dict[str, float]:
    case = op_case(name)
    outs, oracle, terms = case.run(ops, inputs), case.oracle(inputs), case.terms(inputs)
    worst: dict[str, float] = {"max_bound_ratio": 0.0, "max_ulp": 0.0}
    for out, o, t in zip(outs, oracle, terms, strict=True):
        err = error_summary(out, o, terms=t)
        worst = {k: max(worst[k], err[k]) for k in worst}
    return worst


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", OPS)
def test_approx_within_bound(name: str, dtype: torch.dtype) -> None:
    ops = make_ops(OpSelection.approx(scope="all"))
    width = 384 if name.startswith("rope") else 1000
    inputs = op_case(name).make_inputs(7, width, dtype, "cpu", torch.Generator().manual_seed(3))
    err = _within_bound(name, ops, inputs)
    assert err["max_bound_ratio"] <= 1.0, (name, dtype, err)
    assert ops.stats.fused and ops.stats.fallback_count() == 0


def test_cancellation_needs_the_slack() -> None:
    """residual = -y rounded, + a few ulps: the outputs are tiny next to y, so the fp32 error of y is
    many output ulps (what the GPU found on 6M random rows), yet within the stated bound."""
    case = op_case("rmsnorm_residual")
    d = case.make_inputs(4, 1000, torch.bfloat16, "cpu", torch.Generator().manual_seed(8))
    y = case.oracle({**d, "residual": torch.zeros_like(d["residual"])})[0]
    d["residual"] = (-y).to(torch.bfloat16)
    ops = make_ops(OpSelection.approx(scope="all"))
    err = _within_bound("rmsnorm_residual", ops, d)
    assert err["max_ulp"] > 4, err                       # the ULP-only bound would fail
    assert err["max_bound_ratio"] <= 1.0, err


def test_torch_double_rounding_breaks_bound() -> None:
    """The bound is tight enough to fail: torch's residual add (y rounded to bf16, then added)
    exceeds it, so a kernel that rounded twice would be caught."""
    case = op_case("rmsnorm_residual")
    d = case.make_inputs(16, 1000, torch.bfloat16, "cpu", torch.Generator().manual_seed(9))
    err = _within_bound("rmsnorm_residual", make_ops(OpSelection.torch()), d)
    assert err["max_bound_ratio"] > 1.0, err


def test_bound_ratio_counts_the_slack() -> None:
    y = torch.tensor([1.0, 1e-6, float("inf")], dtype=torch.float64)
    out = torch.tensor([1.0078125, 1e-6, float("inf")], dtype=torch.bfloat16)
    terms = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    r = bound_ratio(out, y, terms)
    assert r[0].item() == pytest.approx(1 / (0.6 + 2.0**-20 * 2**7), rel=1e-9)   # 1 ulp over 0.6 ulp + slack
    assert r[1].item() <= 1.0 and r[2].item() == 0.0


def test_ulp_distance_counts_one_ulp() -> None:
    from rltbench.kernels.oracle import ulp_distance

    y = torch.tensor([1.0, 1.0, -3.0, 0.0, float("inf"), float("nan")], dtype=torch.float64)
    out = torch.tensor([1.0, 1.0078125, -3.0, 0.0, float("inf"), float("nan")], dtype=torch.bfloat16)
    assert ulp_distance(out, y).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert ulp_distance(out[:1], torch.tensor([float("nan")], dtype=torch.float64)).item() == float("inf")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("residual", [False, True])
def test_approx_norm_persistent_variant_within_bound(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                                      residual: bool) -> None:
    """The persistent kernel (ApproxNormLaunch.persist > 0: programs stride over rows) keeps the
    one-row kernel's bound; 2 programs over 7 strided rows so every program runs several rows."""
    g = torch.Generator().manual_seed(11)
    big = torch.randn(7, 1013, generator=g).to(dtype)
    x = big[:, 4:1004]                      # row stride 1013, width 1000
    w = torch.randn(1000, generator=g).to(dtype)
    r = torch.randn(7, 1000, generator=g).to(dtype) if residual else None
    one_row = norm_approx._rms_norm_approx_kernel
    monkeypatch.setattr(norm_approx, "_rms_norm_approx_kernel", None)   # must not be used now
    out = torch.empty(7, 1000, dtype=dtype)
    norm_approx.rms_norm_approx_rows(x, w, 1e-6, out, residual=r, config=ApproxNormLaunch(persist=1))
    monkeypatch.setattr(norm_approx, "_rms_norm_approx_kernel", one_row)
    err = error_summary(out, rms_norm_oracle(x, w, 1e-6, residual=r),
                        terms=rms_norm_terms(x, w, 1e-6, residual=r))
    assert err["max_bound_ratio"] <= 1.0, err
    ref_out = torch.empty_like(out)
    norm_approx.rms_norm_approx_rows(x, w, 1e-6, ref_out, residual=r, config=ApproxNormLaunch())
    assert (out.float() - ref_out.float()).abs().max() <= (ref_out.float().abs().max() * 2 ** -6)


@pytest.mark.parametrize("wload", [1, 2])
def test_approx_norm_weight_load_placement_same_bits(wload: int) -> None:
    """Where the weight row is loaded (ApproxNormLaunch.wload) changes timing only: same bits as the
    default placement, with a residual so every load is exercised."""
    g = torch.Generator().manual_seed(12)
    x, r = torch.randn(5, 300, generator=g).bfloat16(), torch.randn(5, 300, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(300, generator=g)).bfloat16()
    outs = []
    for v in (0, wload):
        out = torch.empty_like(x)
        norm_approx.rms_norm_approx_rows(x, w, 1e-6, out, residual=r, config=ApproxNormLaunch(wload=v))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="wload"):
        ApproxNormLaunch(wload=3)


def test_approx_norm_pdl_request_by_rows() -> None:
    """PDL is asked for only from the configured row count up, invalid modes are refused, and a CPU
    (interpreter) launch never uses it whatever is asked (same bits as a plain launch)."""
    cfg = ApproxNormLaunch(pdl=2, pdl_min_rows=1024)
    assert [cfg.pdl_mode(rows) for rows in (4096, 1024, 1023, 1)] == [2, 2, 0, 0]
    assert ApproxNormLaunch(pdl=2).pdl_mode(1) == 2
    assert norm_approx._pdl_mode(torch.randn(3, 64).bfloat16(), ApproxNormLaunch(pdl=2), interp=True) == 0
    assert ApproxNormLaunch().pdl_mode(4096) == 0
    with pytest.raises(ValueError, match="pdl"):
        ApproxNormLaunch(pdl=3)


def test_approx_launch_names_and_search_space() -> None:
    """Configurations are named as in the tuning results and tuned files."""
    space = ApproxNormLaunch.search_space()
    for name in ("rows1-w4", "rows2-w8", "persist8-s3-w8", "persist8-s3-w2-stream", "rows1-w4-stream-wafter",
                 "rows1-w4-wlast", "rows1-w4-stream-pdl2", "rows1-w4-stream-pdl2-wafter", "rows1-w8-pdl2"):
        assert name in space and space[name].name == name
    assert space["rows1-w4-stream-pdl2"].pdl_min_rows == 1024
    assert ApproxNormLaunch().name == "rows1"


def _norm_norm_inputs(rows: int, width: int, dtype: torch.dtype, seed: int, strided: bool):
    """residual/branch rows (optionally views into wider buffers at an offset: strided rows), and two
    weights near 1."""
    g = torch.Generator().manual_seed(seed)
    if strided:
        big = torch.randn(rows, width + 37, generator=g).to(dtype)
        branch = big[:, 5:5 + width]
        residual = (torch.randn(rows, 2 * width, generator=g) * 2).to(dtype)[:, width:]
    else:
        branch = torch.randn(rows, width, generator=g).to(dtype)
        residual = (torch.randn(rows, width, generator=g) * 2).to(dtype)
    w1, w2 = ((1 + 0.1 * torch.randn(width, generator=g)).to(dtype) for _ in range(2))
    return residual, branch, w1, w2


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize(("rows", "width"), [(1, 2048), (5, 1001), (37, 300)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_approx_norm_norm_one_launch_within_bound(dtype: torch.dtype, rows: int, width: int,
                                                  strided: bool) -> None:
    """The approx arm's norm-add-norm is one fused call: h within the bound of residual +
    rms_norm(branch, w1), and y within the bound of rms_norm of the h it stored (the model's
    residual stream is the rounded h; y of an fp32 h would be the norm of values no layer sees)."""

    residual, branch, w1, w2 = _norm_norm_inputs(rows, width, dtype, rows * width, strided)
    ops = make_ops(OpSelection.approx(scope="all"))
    h, y = ops.residual_rms_norm_norm(residual, branch, w1, w2, 1e-6)
    assert ops.stats.fused == {"residual_rms_norm_norm": 1}, ops.stats.fused
    assert ops.stats.fallback_count() == 0
    h_oracle = rms_norm_oracle(branch, w1, 1e-6).double() + residual.double()
    err_h = error_summary(h, h_oracle, terms=rms_norm_terms(branch, w1, 1e-6, residual=residual))
    assert err_h["max_bound_ratio"] <= 1.0, err_h
    err_y = error_summary(y, rms_norm_oracle(h, w2, 1e-6), terms=rms_norm_terms(h, w2, 1e-6))
    assert err_y["max_bound_ratio"] <= 1.0, err_y


def test_approx_norm_norm_differs_from_composed_only_within_bound_and_falls_back_once() -> None:
    """Against the composed approx ops (two launches): the same bound; a layout the kernel cannot
    take (last dim not contiguous) runs torch's reference, counted once as a fallback of the fused
    op, and gives torch's bits."""
    from rltbench.kernels import reference as ref

    residual, branch, w1, w2 = _norm_norm_inputs(6, 640, torch.bfloat16, 4, False)
    ops = make_ops(OpSelection.approx(scope="all"))
    h, y = ops.residual_rms_norm_norm(residual, branch, w1, w2, 1e-6)
    h2 = ops.residual_rms_norm(residual, branch, w1, 1e-6)
    y2 = ops.rms_norm(h2, w2, 1e-6)
    assert (h.float() - h2.float()).abs().max() <= h2.float().abs().max() * 2 ** -7
    assert (y.float() - y2.float()).abs().max() <= y2.float().abs().max() * 2 ** -7
    t = branch.t().contiguous().t()                      # same values, column-major
    ops2 = make_ops(OpSelection.approx(scope="all"))
    h3, y3 = ops2.residual_rms_norm_norm(residual, t, w1, w2, 1e-6)
    assert ops2.stats.fallbacks == {("residual_rms_norm_norm", "layout"): 1}, ops2.stats.fallbacks
    h_ref, y_ref = ref.residual_rms_norm_norm(residual, branch, w1, w2, 1e-6)
    assert torch.equal(h3, h_ref) and torch.equal(y3, y_ref)
