"""GPU checks of the native arm `cuda` (run with --run-gpu on the H200; builds the extension first):
the norm's validation per dtype and width, every op bitwise vs torch CUDA over >= 1e8 elements per
dtype through Ops (special values, odd widths, storage offsets, strided rows; both kernel variants,
vector and scalar, exercised), every launch shape of the norm and SiLU*up at 1..4096 rows, empty
inputs, the current stream, CUDA-graph replay with new inputs, and Ouro / Huginn forwards equal to
torch's inside a graph."""

from __future__ import annotations

import pytest
import torch

from rltbench import native
from rltbench.kernels import OPS, OpSelection, make_ops
from rltbench.kernels import reference as ref
from rltbench.kernels.norm import native as nn
from tests.kernels._util import (
    BIG,
    arm_bitwise_cuda,
    assert_bitwise,
    graph_replay_bitwise,
    offset_copy,
    strided_rows,
)

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-6


@pytest.fixture(scope="module")
def ext():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        return native.load()
    except native.NativeUnavailable as exc:  # on the GPU machine this is a failure, not a skip
        pytest.fail(f"native arm unavailable on a GPU machine: {exc}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_validates_at_model_and_odd_widths(ext, dtype: torch.dtype) -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    for width in (2048, 5280, 5632, 1000, 5633):
        res = nn.validate(dev, dtype, width)
        assert res.passed, res.to_dict()
        assert res.warp_order == res.expected_warp_order, res.to_dict()
    print(nn.validation_report())


@pytest.mark.parametrize("dtype", DTYPES)
def test_native_bitwise_vs_torch_cuda_big(ext, dtype: torch.dtype) -> None:
    """Every op through the cuda arm over >= 1e8 elements, with inf/nan/denormals; then T = 1 and 3
    with strided rows and with storage offsets (the scalar kernels)."""
    ops = make_ops(OpSelection.cuda(scope="all"))
    total = arm_bitwise_cuda(ops, BIG, dtype, ("strided", "offset"))
    assert total >= 1e8, total
    assert ops.stats.fallback_count() == 0, ops.stats.to_dict()
    assert sum(ops.stats.native.values()) == sum(ops.stats.fused.values()) > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_forms_bulk_1e8(ext, dtype: torch.dtype) -> None:
    """Every norm form and the variance, >= 1e8 elements per dtype on the validation's adversarial
    rows (wide magnitudes: the sum is order sensitive), at 2048 and 5280 for 1..8192 rows."""
    from rltbench.kernels.norm.validate import NormKernels, validation_case

    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(2)
    done = 0
    for W in (2048, 5280):
        order = nn.validate(dev, dtype, W).warp_order
        for T in (1, 2, 4, 8, 16, 100, 8192, 8192, 8192):
            bad: list[dict] = []
            kernels = NormKernels(nn.rms_norm_native_rows, nn.residual_rms_norm_norm_native_rows)
            done += validation_case(dev, dtype, W, T, gen, T % 2 == 1, order, bad, kernels)
            assert not bad, (W, T, bad[:3])
    assert done >= 1e8, done


def test_both_kernel_variants_are_exercised(ext) -> None:
    """The test inputs above reach the vector and the scalar variant of every kernel."""
    x = torch.randn(4, 2048, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x)
    assert ext.norm_variant(x, None, w, out) == "vec"
    assert ext.norm_variant(strided_rows(x), None, w, out) == "scalar"
    assert ext.norm_variant(x[:, :2047], None, w[:2047], out[:, :2047].contiguous()) == "scalar"
    g = torch.randn(4, 5632, device="cuda").to(torch.bfloat16)
    assert ext.silu_mul_variant(g, g, torch.empty_like(g)) == "vec"
    assert ext.silu_mul_variant(offset_copy(g), g, torch.empty_like(g)) == "scalar"
    q = torch.randn(2, 16, 128, device="cuda").to(torch.bfloat16)
    c = torch.randn(2, 128, device="cuda").to(torch.bfloat16)
    assert ext.rope_variant(q, q, c, c, torch.empty_like(q), torch.empty_like(q), False) == "vec"
    qo, ko = torch.empty_like(q), torch.empty_like(q)
    assert ext.rope_variant(offset_copy(q), q, c, c, qo, ko, False) == "scalar"


def test_empty_inputs(ext) -> None:
    ops = make_ops(OpSelection.cuda(scope="all"))
    for T, W in ((0, 2048), (4, 0)):
        x = torch.randn(T, W, device="cuda").to(torch.bfloat16)
        w = torch.randn(W, device="cuda").to(torch.bfloat16)
        assert_bitwise(ops.rms_norm(x, w, EPS), ref.rms_norm(x, w, EPS), f"norm {T}x{W}")
        assert_bitwise(ops.silu_mul(x, x), ref.silu_mul(x, x), f"silu {T}x{W}")
    q = torch.randn(0, 4, 128, device="cuda").to(torch.bfloat16)
    c = torch.randn(0, 128, device="cuda").to(torch.bfloat16)
    for a, b in zip(ops.rope_neox(q, q, c, c), ref.rope_neox(q, q, c, c), strict=True):
        assert_bitwise(a, b, "rope empty")
    assert ops.stats.fallback_count("rms_norm", "empty") >= 1


def test_runs_on_the_current_stream(ext) -> None:
    """Inputs written on a side stream after a long sleep: a kernel launched on any other stream
    would read them before they exist."""
    ops = make_ops(OpSelection.cuda(scope="all"))
    src = torch.randn(8, 2048, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, device="cuda").to(torch.bfloat16)
    nn.prevalidate([2048], [torch.bfloat16])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros_like(src)
        torch.cuda._sleep(50_000_000)
        x.copy_(src)
        out = ops.rms_norm(x, w, EPS)
        act = ops.silu_mul(x, x)
    s.synchronize()
    assert_bitwise(out, ref.rms_norm(src, w, EPS), "norm on a side stream")
    assert_bitwise(act, ref.silu_mul(src, src), "silu on a side stream")


def test_graph_capture_replay_bitwise_with_new_inputs(ext) -> None:
    ops = make_ops(OpSelection.cuda(scope="graph"))
    nn.prevalidate([2048], [torch.bfloat16])   # never validated during a capture
    graph_replay_bitwise(ops, make_ops(OpSelection.torch()), torch.Generator(device="cuda").manual_seed(2))
    assert sum(ops.stats.native.values()) == len(OPS), ops.stats.to_dict()


def test_unvalidated_width_falls_back_during_capture(ext) -> None:
    ops = make_ops(OpSelection.cuda(scope="graph"))
    x = torch.randn(2, 3333, device="cuda").to(torch.bfloat16)
    w = torch.randn(3333, device="cuda").to(torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.rms_norm(x, w, EPS)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(out, ref.rms_norm(x, w, EPS), "fallback in capture")
    assert ops.stats.fallback_count("rms_norm", "not_prevalidated_before_capture") == 1


@pytest.mark.parametrize("preset,forms", [
    ("ouro-1.4b", {"rms_norm", "residual_rms_norm_norm", "rope_neox", "silu_mul"}),
    ("huginn-0125", {"rms_norm_huginn", "add_rms_norm_huginn", "rope_interleaved", "silu_mul"}),
])
def test_model_forward_equals_torch_in_graph(ext, preset: str, forms: set[str]) -> None:
    from rltbench.bench.model_step import capture_step, fill_random_kv
    from rltbench.models import build_model

    kw = {"mean_recurrence": 2} if preset.startswith("huginn") else {}
    model = build_model(preset, device="cuda", dtype=torch.bfloat16, seed=0, **kw)
    nn.prevalidate([model.config.hidden_size], [torch.bfloat16])
    dev = model.device
    cuda_ops, torch_ops = make_ops(OpSelection.cuda()), make_ops(OpSelection.torch())
    ids, pos = torch.tensor([11, 12], device=dev), torch.tensor([40, 47], device=dev)
    seqs = torch.arange(2, device=dev)
    outs = []
    for ops in (torch_ops, cuda_ops):
        cache = model.new_kv_cache(max_seqs=2, max_len=64)
        fill_random_kv(cache, 56, seed=1)
        graph, out = capture_step(model, ops, cache, ids, pos, seqs, True)
        graph.replay()
        torch.cuda.synchronize()
        outs.append({k: v.clone() for k, v in out.items()})
    for key in ("hidden", "logits", "next_token"):
        assert torch.equal(outs[0][key], outs[1][key]), key
    assert cuda_ops.stats.fallback_count() == 0, cuda_ops.stats.to_dict()
    assert forms <= {op for op, n in cuda_ops.stats.native.items() if n > 0}, cuda_ops.stats.to_dict()


def test_norm_refuses_an_output_that_aliases_an_input(ext) -> None:
    """The norm kernel reads through __restrict__ pointers (loads move ahead of stores), so the
    binding refuses an output sharing storage with an input instead of computing garbage."""
    x = torch.randn(8, 2048, device="cuda").to(torch.bfloat16)
    w = torch.randn(2048, device="cuda").to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="must not share storage"):
        ext.rms_norm(x, None, None, w, x, None, 1e-6, 1.0 / 2048, 32, True)
    h, y = torch.empty_like(x), torch.empty_like(x)
    with pytest.raises(RuntimeError, match="must not share storage"):
        ext.rms_norm_norm(x, x.clone(), w, w, h, h, None, 1e-6, 1.0 / 2048, 32, True)
    ext.rms_norm_norm(x, x.clone(), w, w, h, y, None, 1e-6, 1.0 / 2048, 32, True)  # distinct outputs: fine


ROW_COUNTS = (1, 8, 128, 1024, 4096)   # 1 and 8: 512 and 64 lanes; from 16: 32 lanes; from 1024: rows kernel
# rows kernel (16-byte groups, width <= 2048), vector kernel past that width or with 8-byte vectors
# only (2052), odd widths (scalar kernel)
NORM_WIDTHS = (2048, 1032, 1000, 2056, 2052, 5280, 5633)


def _norm_layouts(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """t as contiguous rows, 4 elements into its storage (8-byte but not 16-byte aligned for 16-bit
    types), one element in (unaligned), and rows with a padded stride (8 and 3 elements)."""
    return {"contiguous": t, "offset4": offset_copy(t, 4), "offset1": offset_copy(t, 1),
            "stride+8": strided_rows(t, pad=8, offset=0), "stride+3": strided_rows(t, pad=3, offset=1)}


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_launch_shapes_bitwise_at_every_row_count(ext, dtype: torch.dtype) -> None:
    """Every norm form the cuda arm serves at 1, 8, 128, 1024 and 4096 rows (the straight-line
    kernels of width 2048 at 64 and 32 lanes, the guarded ones, the rows kernel from 1024 rows at
    32 lanes, the scalar kernel) over aligned, offset and strided rows of random data with wide
    magnitudes: torch.equal to the torch reference, and each launch shape reached."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(5)
    ops = make_ops(OpSelection.cuda(scope="all"))
    reached: set[str] = set()
    for W in NORM_WIDTHS:
        nn.prevalidate([W], [dtype])
        w = torch.randn(W, device=dev, generator=gen).to(dtype)
        for T in ROW_COUNTS:
            scale = 2.0 ** torch.randint(-6, 7, (T, 1), device=dev, generator=gen)
            x = (torch.randn(T, W, device=dev, generator=gen) * scale).to(dtype)
            other = torch.randn(T, W, device=dev, generator=gen).to(dtype)
            for name, xv in _norm_layouts(x).items():
                ov = _norm_layouts(other)[name]
                out = torch.empty(T, W, device=dev, dtype=dtype)
                reached.add(ext.norm_variant(xv, None, w, out))
                reached.add(ext.norm_variant(xv, ov, w, out))
                case = f"{dtype} {T}x{W} {name}"
                assert_bitwise(ops.rms_norm(xv, w, EPS), ref.rms_norm(xv, w, EPS), f"plain {case}")
                assert_bitwise(ops.residual_rms_norm(ov, xv, w, EPS), ref.residual_rms_norm(ov, xv, w, EPS),
                               f"residual {case}")
                want = ref.add_rms_norm_huginn(xv, ov, w, EPS)
                assert_bitwise(ops.add_rms_norm_huginn(xv, ov, w, EPS), want, f"add {case}")
                for got, want in zip(ops.residual_rms_norm_norm(ov, xv, w, w.flip(0), EPS),
                                     ref.residual_rms_norm_norm(ov, xv, w, w.flip(0), EPS), strict=True):
                    assert_bitwise(got, want, f"norm-add-norm {case}")
    assert ops.stats.fallback_count() == 0, ops.stats.to_dict()
    assert reached == {"rows", "vec", "scalar"}, reached


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_launch_shapes_bitwise_at_every_row_count(ext, dtype: torch.dtype) -> None:
    """SiLU*up at 1, 8, 128 and 4096 rows (the few-blocks kernel, 128 threads x 8 bytes with the
    tail in the same launch, below one 256-thread block per SM; the 256 x 16-byte body once the grid
    fills the GPU; the scalar kernel for unaligned rows) at model and odd widths, aligned, offset and
    strided: torch.equal to torch."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(6)
    ops = make_ops(OpSelection.cuda(scope="all"))
    for W in (5632, 17920, 1000, 5633):
        for T in (1, 8, 128, 4096):
            g = (torch.randn(T, W, device=dev, generator=gen) * 4).to(dtype)
            u = torch.randn(T, W, device=dev, generator=gen).to(dtype)
            for name, (gv, uv) in {"contiguous": (g, u), "offset1": (offset_copy(g), u),
                                   "offset4": (offset_copy(g, 4), offset_copy(u, 4)),
                                   "stride+8": (strided_rows(g, pad=8, offset=0), u)}.items():
                assert_bitwise(ops.silu_mul(gv, uv), ref.silu_mul(gv, uv), f"silu {dtype} {T}x{W} {name}")
    assert ops.stats.fallback_count() == 0, ops.stats.to_dict()
