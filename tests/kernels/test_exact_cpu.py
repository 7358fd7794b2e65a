"""Every exact kernel, through the interpreter, is bitwise equal to the torch CPU reference:
bf16/fp16/fp32, odd and even widths, several token counts, rows starting mid-tensor with a row
stride larger than the width, and special values (inf, nan, +-0, denormals, huge magnitudes)."""

from __future__ import annotations

import pytest
import torch

from rltbench.kernels import OpSelection, make_ops
from rltbench.kernels import reference as ref
from tests.kernels._util import assert_bitwise, randn, strided_rows, with_specials

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (tokens, width, strided, specials)
NORM_CASES = [
    (1, 64, False, False),
    (3, 5633, False, False),
    (17, 200, True, False),
    (5, 1000, True, True),
    (40, 96, False, True),
]
EPS = 1e-6


@pytest.fixture
def ops():
    return make_ops(OpSelection.exact(scope="all"))


def _maybe(t: torch.Tensor, strided: bool, specials: bool, gen: torch.Generator) -> torch.Tensor:
    if specials:
        t = with_specials(t, gen)
    return strided_rows(t) if strided else t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_huginn", "residual_rms_norm", "add_rms_norm_huginn"])
def test_norms_bitwise(ops, op: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(hash((op, str(dtype))) % 2**31)
    for T, W, strided, specials in NORM_CASES:
        x = _maybe(randn((T, W), dtype, gen, 3.0), strided, specials, gen)
        w = randn((W,), dtype, gen, 0.5) + 1
        other = _maybe(randn((T, W), dtype, gen, 2.0), strided, False, gen)
        if op in ("rms_norm", "rms_norm_huginn"):
            got, want = getattr(ops, op)(x, w, EPS), getattr(ref, op)(x, w, EPS)
        else:
            got, want = (
                getattr(ops, op)(
                    other if op.startswith("residual") else x,
                    x if op.startswith("residual") else other,
                    w,
                    EPS,
                ),
                None,
            )
            want = (
                ref.residual_rms_norm(other, x, w, EPS)
                if op.startswith("residual")
                else ref.add_rms_norm_huginn(x, other, w, EPS)
            )
        assert_bitwise(got, want, f"{op} {dtype} T={T} W={W} strided={strided} specials={specials}")
    assert ops.stats.fused[op] == len(NORM_CASES) and ops.stats.fallback_count() == 0


def test_norm_3d_input_and_composed_norm(ops) -> None:
    gen = torch.Generator().manual_seed(5)
    x = randn((2, 3, 130), torch.bfloat16, gen, 2.0)
    r = randn((2, 3, 130), torch.bfloat16, gen)
    w1, w2 = randn((130,), torch.bfloat16, gen) + 1, randn((130,), torch.bfloat16, gen) + 1
    assert_bitwise(ops.rms_norm(x, w1, EPS), ref.rms_norm(x, w1, EPS), "3d")
    h, y = ops.residual_rms_norm_norm(r, x, w1, w2, EPS)
    h_ref, y_ref = ref.residual_rms_norm_norm(r, x, w1, w2, EPS)
    assert_bitwise(h, h_ref, "h")
    assert_bitwise(y, y_ref, "y")


def _rope_inputs(kind: str, T: int, hq: int, hk: int, D: int, dtype, gen, strided: bool, specials: bool):
    qkv = randn((T, (hq + 2 * hk) * D + (5 if strided else 0)), dtype, gen, 2.0)
    if specials:
        qkv = with_specials(qkv, gen)
    off = 3 if strided else 0
    q = qkv[:, off : off + hq * D].view(T, hq, D)
    k = qkv[:, off + hq * D : off + (hq + hk) * D].view(T, hk, D)
    if not strided:
        q, k = q.contiguous(), k.contiguous()
    pos = torch.randint(0, 4096, (T,), generator=gen).float()
    inv = 1.0 / (1e4 ** (torch.arange(0, D, 2).float() / D))
    f = torch.outer(pos, inv)
    if kind == "neox":
        emb = torch.cat((f, f), -1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    else:
        cos, sin = f.cos(), f.sin()
    if strided:
        cos, sin = strided_rows(cos), strided_rows(sin)
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["neox", "interleaved"])
def test_rope_bitwise(ops, kind: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    cases = [
        (1, 4, 2, 128, False, False),
        (3, 3, 1, 96, True, False),
        (9, 2, 2, 64, True, True),
        (33, 1, 3, 32, False, True),
    ]
    for T, hq, hk, D, strided, specials in cases:
        q, k, cos, sin = _rope_inputs(kind, T, hq, hk, D, dtype, gen, strided, specials)
        fn = ops.rope_neox if kind == "neox" else ops.rope_interleaved
        rf = ref.rope_neox if kind == "neox" else ref.rope_interleaved
        (qo, ko), (qr, kr) = fn(q, k, cos, sin), rf(q, k, cos, sin)
        what = f"rope_{kind} {dtype} T={T} D={D} strided={strided} specials={specials}"
        assert_bitwise(qo, qr, what + " q")
        assert_bitwise(ko, kr, what + " k")
    assert ops.stats.fused[f"rope_{kind}"] == len(cases) and ops.stats.fallback_count() == 0


SILU_CASES = [(1, 64, False, False), (4, 5633, False, False), (13, 300, True, True), (64, 56, True, False)]


def _check_silu(ops, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    for T, W, strided, specials in SILU_CASES:
        fc = randn((T, 2 * W), dtype, gen, 3.0)  # Huginn: gate|up halves of one fc output (strided views)
        if specials:
            fc = with_specials(fc, gen)
        gate, up = (fc[:, :W], fc[:, W:]) if strided else (fc[:, :W].contiguous(), fc[:, W:].contiguous())
        assert_bitwise(ops.silu_mul(gate, up), ref.silu_mul(gate, up), f"silu_mul {dtype} T={T} W={W}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_bitwise(ops, dtype: torch.dtype) -> None:
    _check_silu(ops, dtype)
    assert ops.stats.fused["silu_mul"] == len(SILU_CASES)


def test_silu_mul_fp32_cpu_routes_to_torch(ops) -> None:
    """torch CPU's fp32 exp (SLEEF expf_u10) differs from the interpreter's correctly rounded exp in
    ~4% of values by 1 ulp, so the exact arm hands fp32 SiLU on CPU to torch (counted), never giving
    a different answer. The CUDA path (libdevice expf) is checked bitwise by the gpu tests."""
    _check_silu(ops, torch.float32)
    assert ops.stats.fused["silu_mul"] == 0
    assert ops.stats.fallback_count("silu_mul", "cpu_fp32_exp") == len(SILU_CASES)
