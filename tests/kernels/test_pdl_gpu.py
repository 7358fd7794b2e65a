"""Programmatic dependent launch (pdl.py) on the GPU: the exact kernels launched with PDL must read
what the kernel just before them wrote, inside a CUDA graph, and give the same bits as without PDL.

Each case captures a graph in which a cuBLAS GEMM (the predecessor the exact kernels have in the
models) writes the kernel's input, then the PDL kernel consumes it, then a second PDL kernel
consumes that output (a PDL kernel after a PDL kernel, mode 2's early trigger). Replayed with new
source contents every time; a missing or misplaced ``griddepcontrol.wait`` shows up as stale
inputs, i.e. a mismatch against the torch reference computed outside the graph.
"""

from __future__ import annotations

import pytest
import torch

from rltbench.kernels import norm_onelaunch as nol
from rltbench.kernels import pdl
from rltbench.kernels import reference as ref
from rltbench.kernels.act_exact import silu_mul_exact_rows
from rltbench.kernels.rope_exact import rope_exact, rope_neox_store_exact
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
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "1")


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


@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("T", [1, 8, 300])
def test_pdl_norm_chain_reads_the_gemm_output(mode: int, T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_PDL", str(mode))
    gen = torch.Generator(device="cuda").manual_seed(100 + T)
    src, a = _gemm_inputs(T, W, gen)
    r = torch.randn(T, W, generator=gen, device="cuda").to(torch.bfloat16)
    w1, w2, w3 = (torch.randn(W, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    x = torch.empty(T, W, device="cuda", dtype=torch.bfloat16)
    h, y, out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)

    def capture():
        torch.matmul(src, a, out=x)                                              # producer (cuBLAS)
        nol.residual_rms_norm_norm_onelaunch_rows(r, x, w1, w2, EPS, h, y)       # PDL after the GEMM
        nol.rms_norm_onelaunch_rows(y, w3, EPS, out, residual=h)                 # PDL after PDL
        return h, y, out

    def reference():
        xx = src @ a
        hh, yy = ref.residual_rms_norm_norm(r, xx, w1, w2, EPS)
        return hh, yy, ref.residual_rms_norm(hh, yy, w3, EPS)

    def fill(i: int) -> None:
        src.copy_(torch.randn(src.shape, generator=gen, device="cuda").to(torch.bfloat16) * (1 + i))

    _replay_check(capture, reference, fill)


@pytest.mark.parametrize("mode", [1, 2])
def test_pdl_silu_and_rope_read_the_gemm_output(mode: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_PDL", str(mode))
    gen = torch.Generator(device="cuda").manual_seed(7)
    T, inter, H, D = 4, 5632, 16, 128
    src, a = _gemm_inputs(T, 2 * inter, gen)
    src2, a2 = _gemm_inputs(T, 3 * H * D, gen)
    gu = torch.empty(T, 2 * inter, device="cuda", dtype=torch.bfloat16)
    qkv = torch.empty(T, 3 * H * D, device="cuda", dtype=torch.bfloat16)
    act = torch.empty(T, inter, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(T, device="cuda") + 37
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    ang = torch.cat([pos[:, None].float() * inv[None]] * 2, dim=-1)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    qo = torch.empty(T, H, D, device="cuda", dtype=torch.bfloat16)
    ko = torch.empty_like(qo)
    k_cache = torch.zeros(8, 16, H, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([3, 17, 40, 41], device="cuda")
    qo2 = torch.empty_like(qo)

    def capture():
        torch.matmul(src, a, out=gu)
        silu_mul_exact_rows(gu[:, :inter], gu[:, inter:], act)
        torch.matmul(src2, a2, out=qkv)
        q, k, v = qkv.view(T, 3, H, D).unbind(1)
        rope_exact("neox", q, k, cos, sin, qo, ko)
        rope_neox_store_exact(q, k, v, cos, sin, qo2, k_cache, v_cache, slots)   # PDL after PDL
        return act, qo, ko, qo2, k_cache, v_cache

    def reference():
        g_u = src @ a
        qkv_r = src2 @ a2
        q, k, v = qkv_r.view(T, 3, H, D).unbind(1)
        rq, rk = ref.rope_neox(q, k, cos, sin)
        kc, vc = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        kc.view(-1, H, D)[slots] = rk
        vc.view(-1, H, D)[slots] = v
        return ref.silu_mul(g_u[:, :inter], g_u[:, inter:]), rq, rk, rq, kc, vc

    def fill(i: int) -> None:
        src.copy_(torch.randn(src.shape, generator=gen, device="cuda").to(torch.bfloat16))
        src2.copy_(torch.randn(src2.shape, generator=gen, device="cuda").to(torch.bfloat16))

    _replay_check(capture, reference, fill)


@pytest.mark.parametrize("wload", [0, 1])
@pytest.mark.parametrize("mode", [1, 2])
def test_pdl_approx_norm_reads_the_gemm_output(mode: int, wload: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The approx norm's own PDL knob: the weight is read before the wait (wload 0) or after it
    (wload 1); either way the rows must be the GEMM's fresh output, i.e. the same bits as the
    same kernel launched without PDL."""
    import os

    from rltbench.kernels.norm_approx import residual_rms_norm_norm_approx_rows, rms_norm_approx_rows

    monkeypatch.setenv("RLTBENCH_APPROX_NORM_WLOAD", str(wload))
    T = 4096
    gen = torch.Generator(device="cuda").manual_seed(11 + mode)
    src, a = _gemm_inputs(T, W, gen)
    w = (1 + 0.1 * torch.randn(W, generator=gen, device="cuda")).to(torch.bfloat16)
    x = torch.empty(T, W, device="cuda", dtype=torch.bfloat16)
    y, out = torch.empty_like(x), torch.empty_like(x)

    h, y2 = torch.empty_like(x), torch.empty_like(x)

    def capture():
        os.environ["RLTBENCH_APPROX_NORM_PDL"] = str(mode)
        torch.matmul(src, a, out=x)
        rms_norm_approx_rows(x, w, EPS, y)          # PDL after the GEMM
        rms_norm_approx_rows(y, w, EPS, out)        # PDL after PDL
        residual_rms_norm_norm_approx_rows(out, y, w, w, EPS, h, y2)   # the norm-add-norm form
        return y, out, h, y2

    def reference():
        os.environ["RLTBENCH_APPROX_NORM_PDL"] = "0"
        yy, oo, hh, yy2 = (torch.empty_like(x) for _ in range(4))
        rms_norm_approx_rows(src @ a, w, EPS, yy)
        rms_norm_approx_rows(yy, w, EPS, oo)
        residual_rms_norm_norm_approx_rows(oo, yy, w, w, EPS, hh, yy2)
        return yy, oo, hh, yy2

    monkeypatch.setenv("RLTBENCH_APPROX_NORM_PDL", "0")   # restored after the test

    def fill(i: int) -> None:
        src.copy_(torch.randn(src.shape, generator=gen, device="cuda").to(torch.bfloat16) * (1 + i))

    _replay_check(capture, reference, fill)
