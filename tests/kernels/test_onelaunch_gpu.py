"""One-launch exact RMSNorm vs torch CUDA, bitwise (run with `pytest --run-gpu` on the GPU box).

Budget: well under a minute on an H200 (about 20 Triton compiles; > 1e8 elements per dtype at
widths 2048 and 5280 in batches of 8192 rows). Failures print which form / token count / dtype
differed; the validation report is printed (-s) for the results.
"""

from __future__ import annotations

import json

import pytest
import torch

from rltbench.kernels import reference as ref
from rltbench.kernels.norm import onelaunch as nol
from rltbench.kernels.norm import torch_order as trm
from rltbench.kernels.norm.config import OneLaunchConfig
from rltbench.kernels.norm.validate import adversarial, run_cases, weights

pytestmark = pytest.mark.gpu

EPS = 1e-6
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
WIDTHS = [2048, 5280, 5632, 4096, 1000, 5633]
TOKENS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 127, 255, 257, 1000, 1025, 2048, 4099,
          8192]


@pytest.fixture(scope="module")
def dev() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


def _adv(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator, dev: torch.device) -> torch.Tensor:
    return adversarial(shape, dtype, gen, dev)


def _order(dev: torch.device, dtype: torch.dtype, width: int) -> str:
    res = nol.validate(dev, dtype, width)
    return res.warp_order or res.expected_warp_order


@pytest.mark.parametrize("dtype", DTYPES)
def test_onelaunch_equals_torch_cuda_all_shapes(dev: torch.device, dtype: torch.dtype) -> None:
    """Every width x token count: variance and output torch.equal to the torch expressions."""
    gen = torch.Generator(device=dev).manual_seed(1)
    bad = []
    for W in WIDTHS:
        order = _order(dev, dtype, W)
        w = weights(W, dtype, gen, dev)
        for T in TOKENS:
            x = _adv((T, W), dtype, gen, dev)
            out = torch.empty_like(x)
            var = torch.empty(T, device=dev)
            nol.rms_norm_onelaunch_rows(x, w, EPS, out, var_out=var, warp_order=order)
            if not torch.equal(var, x.float().pow(2).mean(-1)):
                bad.append(("var", W, T))
            if not torch.equal(out, ref.rms_norm(x, w, EPS)):
                bad.append(("out", W, T))
    assert not bad, f"{dtype}: differs from torch at (what, width, tokens) {bad[:10]} ({len(bad)} total)"


@pytest.mark.parametrize("dtype", DTYPES)
def test_onelaunch_bulk_1e8_elements(dev: torch.device, dtype: torch.dtype) -> None:
    """>= 1e8 elements per width (2048, 5280) per dtype, 8192-row batches, variance + output."""
    gen = torch.Generator(device=dev).manual_seed(2)
    T = 8192
    for W in (2048, 5280):
        order = _order(dev, dtype, W)
        w = weights(W, dtype, gen, dev)
        done, batch = 0, 0
        while done < 100_000_000:
            x = _adv((T, W), dtype, gen, dev)
            out = torch.empty_like(x)
            var = torch.empty(T, device=dev)
            nol.rms_norm_onelaunch_rows(x, w, EPS, out, var_out=var, warp_order=order)
            ok_var = torch.equal(var, x.float().pow(2).mean(-1))
            ok_out = torch.equal(out, ref.rms_norm(x, w, EPS))
            assert ok_var and ok_out, f"{dtype} width {W} batch {batch}: var equal {ok_var}, out {ok_out}"
            done += x.numel()
            batch += 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_held_rows_bulk(dev: torch.device, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The held kernel (rows wider than 2048 at torch's 32 lanes, read once and kept in registers):
    Huginn's plain and add forms at prefill sizes, variance and output torch.equal to torch over
    >= 1e8 elements per form and dtype at width 5280; a spy requires that the held kernel ran."""
    launched: list[int] = []
    real = nol._lowwarp_held_norm_kernel

    class Spy:
        def __getitem__(self, grid):  # noqa: ANN001, ANN204
            launched.append(1)
            return real[grid]

    monkeypatch.setattr(nol, "_lowwarp_held_norm_kernel", Spy())
    gen = torch.Generator(device=dev).manual_seed(5)
    W = 5280
    order = _order(dev, dtype, W)
    w = weights(W, dtype, gen, dev)
    for form, counts in (("plain", (16, 1000, 2048, 4096)), ("add", (16, 1000, 2048, 4096))):
        done = 0
        while done < 100_000_000:
            for T in counts:
                x = _adv((T, W), dtype, gen, dev)
                b = _adv((T, W), dtype, gen, dev) if form == "add" else None
                out, var = torch.empty_like(x), torch.empty(T, device=dev)
                before = len(launched)
                nol.rms_norm_onelaunch_rows(x, w, EPS, out, branch=b, var_out=var, warp_order=order)
                assert len(launched) == before + 1, (form, T)
                v = x if b is None else b + x
                want = ref.rms_norm_huginn(x, w, EPS) if b is None else ref.add_rms_norm_huginn(x, b, w, EPS)
                assert torch.equal(var, v.float().pow(2).mean(-1)), (form, T, dtype)
                assert torch.equal(out, want), (form, T, dtype)
                done += x.numel()


def test_all_forms_bf16(dev: torch.device) -> None:
    """The five public forms at the models' widths, a few token counts, strided input rows."""
    gen = torch.Generator(device=dev).manual_seed(3)
    dt = torch.bfloat16
    for W in (2048, 5280):
        assert nol.validate(dev, dt, W).passed
        w1, w2 = weights(W, dt, gen, dev), weights(W, dt, gen, dev)
        for T in (1, 3, 16, 333):
            big = _adv((T, W + 8), dt, gen, dev)
            x = big[:, 5:5 + W]
            r, b = _adv((T, W), dt, gen, dev), _adv((T, W), dt, gen, dev)
            assert torch.equal(nol.rms_norm_onelaunch(x, w1, EPS), ref.rms_norm(x, w1, EPS))
            assert torch.equal(nol.rms_norm_onelaunch(x, w1, EPS, "huginn"), ref.rms_norm_huginn(x, w1, EPS))
            assert torch.equal(nol.residual_rms_norm_onelaunch(r, x, w1, EPS),
                               ref.residual_rms_norm(r, x, w1, EPS))
            assert torch.equal(nol.add_rms_norm_huginn_onelaunch(x, b, w1, EPS),
                               ref.add_rms_norm_huginn(x, b, w1, EPS))
            h, y = nol.residual_rms_norm_norm_onelaunch(r, x, w1, w2, EPS)
            rh, ry = ref.residual_rms_norm_norm(r, x, w1, w2, EPS)
            assert torch.equal(h, rh) and torch.equal(y, ry), (W, T)


def test_trust_and_capture(dev: torch.device) -> None:
    """is_trusted after prevalidate; inside a CUDA graph capture the kernel is captured and replays
    to torch's bits; an unvalidated width is refused during capture (never validated there)."""
    dt = torch.bfloat16
    nol.prevalidate([2048], [dt], dev)
    x = torch.randn(4, 2048, device=dev).to(dt)
    w = torch.randn(2048, device=dev).to(dt)
    assert nol.is_trusted(x)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nol.rms_norm_onelaunch_rows(x, w, EPS, out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    unvalidated = torch.randn(4, 3000, device=dev).to(dt)
    with torch.cuda.graph(g):
        trusted_in_capture = nol.is_trusted(x)
        refused_in_capture = nol.untrusted_reason(unvalidated)
        nol.rms_norm_onelaunch_rows(x, w, EPS, out)
    x.copy_(torch.randn(4, 2048, device=dev).to(dt))
    g.replay()
    torch.cuda.synchronize()
    assert trusted_in_capture and refused_in_capture == "not_prevalidated_before_capture"
    assert torch.equal(out, ref.rms_norm(x, w, EPS))
    assert not nol.is_trusted(torch.randn(4, 128, device=dev).to(dt))          # not vectorized by torch
    assert nol.untrusted_reason(torch.randn(16, 8192, device=dev).to(dt)) == "plan_not_reproducible"


def test_print_validation_report(dev: torch.device) -> None:
    rep = nol.prevalidate([2048, 5280], DTYPES, dev)
    print("\nONELAUNCH_VALIDATION " + json.dumps(rep, indent=1, default=str))
    for r in rep["results"]:
        if r["width"] in (2048, 5280) and r["device_name"] != "cpu":
            assert r["passed"], r
            assert r["warp_order"] == trm.default_warp_order(torch.__version__), r


@pytest.mark.parametrize("config", [OneLaunchConfig(layout="general"), OneLaunchConfig(tree="halvings"),
                                    OneLaunchConfig(warps=2), OneLaunchConfig(packed=False),
                                    OneLaunchConfig(stream_rows=1), OneLaunchConfig(stream_rows=8),
                                    OneLaunchConfig(stream=False), OneLaunchConfig(wide_registers=False)],
                         ids=lambda c: c.name)
def test_other_layouts_pass_the_validation_cases(dev: torch.device, config: OneLaunchConfig) -> None:
    """The general layout (what serves a key where the default is refused, and the unaligned
    widths) and the lowwarp variants the tuner may choose (the fp32 epilogue, one or eight rows per
    program in the plain two-pass form, no streaming hints, wide rows in two passes instead of held
    in registers among them): the validation's cases at
    the models' widths, bitwise, in bf16."""
    for W in (2048, 5280):
        order = trm.default_warp_order(torch.__version__)
        cases, elems, bad, _ = run_cases(dev, torch.bfloat16, W, order, nol.kernels_for(config))
        assert cases and not bad, (config.name, W, bad[:3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_norm_norm_bulk(dev: torch.device, dtype: torch.dtype) -> None:
    """The decode-sized plans (1..128 rows: 512 down to 32 lanes, the lowwarp layout) of
    the fused norm-add-norm that Ouro runs twice per layer: h, y and both variances bitwise, over
    >= 1e8 elements per dtype at width 2048 (plus 5280 at a few row counts)."""
    gen = torch.Generator(device=dev).manual_seed(4)
    plans = ((2048, (1, 2, 4, 8, 16, 32, 64, 128), 12_500_000), (5280, (1, 3, 8), 2_000_000))
    for W, counts, budget in plans:
        order = _order(dev, dtype, W)
        w1, w2 = weights(W, dtype, gen, dev), weights(W, dtype, gen, dev)
        for T in counts:
            path = nol.layout_for(W, T, dev, order, None, dtype)
            done = 0
            while done < budget:
                reps = max(1, min(64, (budget - done) // (T * W)))
                a, r = _adv((reps * T, W), dtype, gen, dev), _adv((reps * T, W), dtype, gen, dev)
                for i in range(reps):   # T rows per launch: the plan of a T-row step
                    sl = slice(i * T, (i + 1) * T)
                    h, y = torch.empty_like(a[sl]), torch.empty_like(a[sl])
                    var = torch.empty(T, 2, device=dev)
                    nol.residual_rms_norm_norm_onelaunch_rows(r[sl], a[sl], w1, w2, EPS, h, y, var_out=var,
                                                              warp_order=order)
                    rh, ry = ref.residual_rms_norm_norm(r[sl], a[sl], w1, w2, EPS)
                    v1 = a[sl].float().pow(2).mean(-1)
                    v2 = rh.float().pow(2).mean(-1)
                    ok = (torch.equal(h, rh), torch.equal(y, ry), torch.equal(var[:, 0], v1),
                          torch.equal(var[:, 1], v2))
                    assert all(ok), f"{dtype} width {W} T={T} ({path} kernel): h, y, var1, var2 equal {ok}"
                done += reps * T * W
