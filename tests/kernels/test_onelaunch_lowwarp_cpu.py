"""The low-warp exact norm layout (norm_onelaunch_lowwarp.py) on CPU, through the Triton interpreter.

It serves the fast path's plans (32..512 lanes at any aligned width) with torch lane
``l = r * 32 NW + h * NW + w`` for NW warps; the tree it writes out under the interpreter (the levels over r,
then h, then w) must be the modelled torch-CUDA order bit for bit, and every form must give the
same bits as the general one-launch kernel. A spy checks that the low-warp kernel is what ran, so
these tests cannot pass on the fast kernel's behalf. Triton's own reduction for the (h, w) levels
(TL_SUM, GPU only) is checked by the start-up validation and the SASS test below."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


@pytest.mark.parametrize("warps", [4, 16])
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
@pytest.mark.parametrize("T,N,warps", [(1, 2048, 4), (1, 2048, 8), (2, 5280, 4), (4, 2052, 2), (8, 2048, 4)])
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


SASS_SCRIPT = textwrap.dedent(r'''
    import os, re, subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels import norm_onelaunch_lowwarp as lw
    target = GPUTarget("cuda", 90, 32)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32",
           "N": "i32", "sx": "i32", "sb": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    for nw in (4, 8, 16):
        r = 512 // (32 * nw)
        consts = {"MODE": 0, "HAS_R": False, "STORE_VAR": True, "DT": 1, "INTERPRET": False, "R": r,
                  "LOG_R": r.bit_length() - 1, "NW": nw, "LOG_NW": nw.bit_length() - 1, "ITERS": 1,
                  "TL_SUM": True, "FLAT": True, "PDL": 0}
        full = {**sig, **{c: "constexpr" for c in consts}}
        names = list(full)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if full[n].startswith("*") or n in ("N", "sx", "sb", "sr")}
        k = triton.compile(ASTSource(fn=lw._norm_kernel, signature=full, constexprs=consts, attrs=attrs),
                           target=target, options={"num_warps": nw})
        assert "fma.rn.f32" not in k.asm["ptx"] and "fma.f32" not in k.asm["ptx"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        steps = re.findall(r"SHFL\.BFLY PT, R\d+, R\d+, (0x[0-9a-f]+)|(BAR\.SYNC)|(STS)|(LDS)", sass)
        seq = [s[0] or s[1] or s[2] or s[3] for s in steps]
        print(nw, seq)
        # torch's h levels as a warp butterfly (xor 16 .. 1), one exchange, the w levels (xor NW/2 .. 1)
        cross = [hex(nw >> j) for j in range(1, nw.bit_length())]
        want = ["0x10", "0x8", "0x4", "0x2", "0x1", "STS", "BAR.SYNC", "LDS", *cross]
        # after the tree at most a broadcast of the result through shared memory (Triton 3.6 does)
        assert seq[:len(want)] == want and set(seq[len(want):]) <= {"STS", "BAR.SYNC", "LDS"}, (nw, seq)
    print("SASS_OK")
''')


def test_tl_sum_lowers_to_torch_tree_with_one_exchange() -> None:
    """sm_90 SASS, with the installed Triton, of the 512-lane single norm with the flat tile and
    TL_SUM at 4, 8 and 16 warps: the (h, w) levels are the warp butterfly xor 16 .. 1 (torch's
    offsets 16 NW .. NW), one shared-memory exchange, then xor NW/2 .. 1 over the warps (offsets
    NW/2 .. 1): torch's order. Checked by hand with Triton 3.6 (the H200's) and 3.9 (CI's); the
    4-D tile is laid out differently by 3.6 (r and w on lanes), which is why its TL_SUM variant
    failed the GPU validation at 2 and 16 warps. A Triton that
    lowers the reduction differently fails here before any GPU sees it."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SASS_SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    missing = "not found" in proc.stderr and ("ptxas" in proc.stderr or "cuobjdump" in proc.stderr)
    if proc.returncode != 0 and missing:
        pytest.skip("ptxas/cuobjdump unavailable")
    assert proc.returncode == 0 and "SASS_OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
