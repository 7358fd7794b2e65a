"""Programmatic dependent launch (pdl.py) on the GPU: the approx norm launched with PDL must read
what the kernel just before it wrote, inside a CUDA graph, and give the same bits as without PDL.

Each case captures a graph in which a cuBLAS GEMM (the predecessor a norm has in the models)
writes the kernel's input, then the PDL kernel consumes it, then a second PDL kernel consumes that
output (a PDL kernel after a PDL kernel, mode 2's early trigger). Replayed with new
source contents every time; a missing or misplaced ``griddepcontrol.wait`` shows up as stale
inputs, i.e. a mismatch against the torch reference computed outside the graph.
"""

from __future__ import annotations

import pytest
import torch

from rltbench.kernels import pdl
from rltbench.kernels.norm.approx import residual_rms_norm_norm_approx_rows, rms_norm_approx_rows
from rltbench.kernels.norm.config import ApproxNormLaunch
from tests.kernels._util import assert_bitwise

pytestmark = pytest.mark.gpu
EPS = 1e-6
W = 2048


@pytest.fixture(autouse=True)
def _gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() < (9, 0) or not pdl.triton_supports():
        pytest.skip("PDL needs sm_90+ and a Triton with launch_pdl")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _gemm_inputs(T: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """src [T, 1024] and a [1024, n] bf16: src @ a is the producer GEMM whose output the PDL kernel
    reads; without the wait it could read that buffer before the GEMM has written it."""
    src = torch.randn(T, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    a = (torch.randn(1024, n, generator=gen, device="cuda") / 32).to(torch.bfloat16)
    return src, a


def _replay_check(capture, reference, fill, replays: int = 6) -> None:
    """Capture `capture()` (returns output tensors), replay with `fill()` refilling the sources,
    compare each replay with `reference()` computed eagerly from the same sources."""
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        capture()           # warm-up: compiles and the norm's validation run outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = capture()
    for i in range(replays):
        fill(i)
        g.replay()
        torch.cuda.synchronize()
        for k, (got, want) in enumerate(zip(outs, reference(), strict=True)):
            assert_bitwise(got, want, f"replay {i} output {k}")


@pytest.mark.parametrize("wload", [0, 1])
@pytest.mark.parametrize("mode", [1, 2])
def test_pdl_approx_norm_reads_the_gemm_output(mode: int, wload: int) -> None:
    """The approx norm's PDL launch: the weight is read before the wait (wload 0) or after it
    (wload 1); either way the rows must be the GEMM's fresh output, i.e. the same bits as the same
    kernel launched without PDL."""
    T = 4096
    on, off = ApproxNormLaunch(pdl=mode, wload=wload), ApproxNormLaunch(wload=wload)
    gen = torch.Generator(device="cuda").manual_seed(11 + mode)
    src, a = _gemm_inputs(T, W, gen)
    w = (1 + 0.1 * torch.randn(W, generator=gen, device="cuda")).to(torch.bfloat16)
    x = torch.empty(T, W, device="cuda", dtype=torch.bfloat16)
    y, out = torch.empty_like(x), torch.empty_like(x)
    h, y2 = torch.empty_like(x), torch.empty_like(x)

    def capture():
        torch.matmul(src, a, out=x)
        rms_norm_approx_rows(x, w, EPS, y, config=on)          # PDL after the GEMM
        rms_norm_approx_rows(y, w, EPS, out, config=on)        # PDL after PDL
        residual_rms_norm_norm_approx_rows(out, y, w, w, EPS, h, y2, config=on)   # the norm-add-norm form
        return y, out, h, y2

    def reference():
        yy, oo, hh, yy2 = (torch.empty_like(x) for _ in range(4))
        rms_norm_approx_rows(src @ a, w, EPS, yy, config=off)
        rms_norm_approx_rows(yy, w, EPS, oo, config=off)
        residual_rms_norm_norm_approx_rows(oo, yy, w, w, EPS, hh, yy2, config=off)
        return yy, oo, hh, yy2

    def fill(i: int) -> None:
        src.copy_(torch.randn(src.shape, generator=gen, device="cuda").to(torch.bfloat16) * (1 + i))

    with pdl.launch_modes() as modes:
        _replay_check(capture, reference, fill)
    assert modes[mode] > 0    # PDL did apply
