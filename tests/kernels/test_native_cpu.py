"""The native arm `cuda` on a machine that cannot run it (CPU CI): the unavailable path and its
message in every command, the routing and fallback counting through Ops with the extension mocked,
the arithmetic facts the kernels rely on (packed 16-bit multiplies and adds equal torch's fp32
opmath then rounding; the lane layout reproduces torch's reduction tree), and, where nvcc exists,
the CUDA sources compiled for sm_90 with the instructions the exactness needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
from typer.testing import CliRunner

from rltbench import native
from rltbench.errors import UsageError
from rltbench.kernels import ARMS, OpSelection, make_ops
from rltbench.kernels import ops as ops_mod
from rltbench.kernels import reference as ref
from rltbench.kernels.norm import native as norm_native
from rltbench.kernels.norm import torch_order as trm
from rltbench.native import build
from tests.kernels._util import assert_bitwise

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6


@pytest.fixture(autouse=True)
def _fresh_native_state():
    native.reset()
    norm_native.reset_validation()
    yield
    native.reset()
    norm_native.reset_validation()


# ----------------------------------------------------------------------------------------------
# unavailable: the reason, and every command refusing the arm with it
# ----------------------------------------------------------------------------------------------
def test_reasons_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU build" in native.unavailable_reason()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert native.unavailable_reason() == "no CUDA GPU is visible"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    assert native.unavailable_reason().startswith("nvcc not found")
    monkeypatch.setattr(build, "find_nvcc", lambda: "/x/nvcc")
    monkeypatch.setattr(build, "find_ninja", lambda: None)
    assert native.unavailable_reason().startswith("ninja not found")


def test_build_failure_is_a_remembered_one_line_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing_build(verbose: bool = False):
        calls.append(1)
        raise RuntimeError("Error building extension 'rltbench_native_x': [1/5] nvcc ...\n"
                           "norm.cu(42): error: identifier \"foo\" is undefined\n1 error detected")

    monkeypatch.setattr(native, "_environment_reason", lambda: None)
    monkeypatch.setattr(build, "build", failing_build)
    for _ in range(2):
        with pytest.raises(native.NativeUnavailable, match=r"build failed: norm.cu\(42\): error"):
            native.load()
    assert calls == [1]
    assert native.unavailable_reason().startswith("build failed")
    assert native.provenance() == {"loaded": False, "build": None, "unavailable": native.unavailable_reason()}


def test_selecting_the_arm_here_is_a_usage_error() -> None:
    if native.unavailable_reason() is None:
        pytest.skip("the native arm can be built on this machine")
    with pytest.raises(UsageError, match="unavailable: "):
        native.require([ARMS["cuda"]])
    with pytest.raises(UsageError, match="unavailable"):
        make_ops(OpSelection(norm="cuda"))
    assert native.require([ARMS["exact"], ARMS["torch"]]) is None   # nothing native selected: no load


def _cli(*args: str):
    from rltbench.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "250"})


@pytest.mark.parametrize("args", [
    ["kernels", "--arms", "torch,cuda", "--ops", "rmsnorm", "--tokens", "1", "--widths", "64"],
    ["e2e", "--model", "ouro-tiny", "--arms", "torch,cuda", "--device", "cpu"],
    ["e2e", "--model", "ouro-tiny", "--arms", "torch,exact", "--norm", "cuda", "--device", "cpu"],
    ["profile", "--model", "ouro-tiny", "--cpu", "--arms", "torch,cuda"],
    ["gsm8k", "--model", "ouro-tiny", "--arms", "torch,cuda", "--limit", "1"],
])
def test_commands_refuse_the_unavailable_arm_with_exit_2(args: list[str], tmp_path: Path) -> None:
    if native.unavailable_reason() is None:
        pytest.skip("the native arm can be built on this machine")
    res = _cli(*args, "--result-dir", str(tmp_path / "run"))
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unavailable" in lines[0], res.output
    assert not (tmp_path / "run").exists()


def test_kernels_with_default_arms_notes_the_unavailable_arm(tmp_path: Path) -> None:
    if native.unavailable_reason() is None:
        pytest.skip("the native arm can be built on this machine")
    res = _cli("kernels", "--ops", "silu_mul", "--tokens", "1", "--widths", "16", "--result-dir",
               str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    assert "native arm unavailable: " in res.output
    rows = [ln for ln in (tmp_path / "run" / "rows.jsonl").read_text().splitlines() if ln.strip()]
    assert rows and all('"arm": "cuda"' not in ln for ln in rows)


def test_module_entry_point_status_and_build() -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rltbench.native", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    status = run("--status")
    assert status.returncode == 0 and status.stdout.startswith("native arm: "), status.stderr
    if "unavailable" not in status.stdout:
        pytest.skip("the native arm can be built on this machine")
    built = run("--build")
    assert built.returncode == 1 and built.stdout.startswith("native arm: unavailable: "), built.stdout


# ----------------------------------------------------------------------------------------------
# routing with the extension mocked (CPU tensors admitted as if they were CUDA ones)
# ----------------------------------------------------------------------------------------------
class FakeExtension:
    """Stands in for the compiled module: records each call and writes torch's answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def rms_norm(self, x, branch, residual, w, out, var_out, eps, factor, lanes, warp_down):  # noqa: ANN001
        self.calls.append(("rms_norm", {"eps": eps, "factor": factor, "lanes": lanes, "down": warp_down}))
        v = x if branch is None else branch + x
        y = ref.rms_norm(v, w, EPS)
        out.copy_(y if residual is None else residual + y)

    def rms_norm_norm(self, residual, branch, w1, w2, h_out, y_out, var_out, eps, factor, lanes, down):  # noqa: ANN001
        self.calls.append(("rms_norm_norm", {"lanes": lanes}))
        h, y = ref.residual_rms_norm_norm(residual, branch, w1, w2, EPS)
        h_out.copy_(h)
        y_out.copy_(y)

    def silu_mul(self, gate, up, out):  # noqa: ANN001
        self.calls.append(("silu_mul", {}))
        out.copy_(ref.silu_mul(gate, up))

    def rope(self, q, k, cos, sin, qo, ko, interleaved):  # noqa: ANN001
        self.calls.append(("rope", {"interleaved": interleaved}))
        fn = ref.rope_interleaved if interleaved else ref.rope_neox
        a, b = fn(q, k, cos, sin)
        qo.copy_(a)
        ko.copy_(b)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeExtension:
    ext = FakeExtension()
    monkeypatch.setattr(native, "load", lambda verbose=False: ext)
    common = ops_mod._common_reason   # the Triton checks: CPU tensors pass under the interpreter (conftest)
    monkeypatch.setattr(ops_mod, "_common_reason", lambda ts, native_impl=False: common(ts, False))
    monkeypatch.setattr(norm_native, "untrusted_reason", lambda x: None)
    return ext


def _rows(T: int = 3, W: int = 160, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(T, W, generator=g).to(dtype) for _ in range(3)) + (
        (torch.randn(W, generator=g) + 1).to(dtype), (torch.randn(W, generator=g) + 1).to(dtype))


def test_every_op_routes_to_the_extension(fake: FakeExtension) -> None:
    ops = make_ops(OpSelection.cuda(scope="all"))
    x, r, b, w1, w2 = _rows()
    assert_bitwise(ops.rms_norm(x, w1, EPS), ref.rms_norm(x, w1, EPS))
    assert_bitwise(ops.rms_norm_huginn(x, w1, EPS), ref.rms_norm_huginn(x, w1, EPS))
    assert_bitwise(ops.residual_rms_norm(r, x, w1, EPS), ref.residual_rms_norm(r, x, w1, EPS))
    assert_bitwise(ops.add_rms_norm_huginn(x, b, w1, EPS), ref.add_rms_norm_huginn(x, b, w1, EPS))
    want_hy = ref.residual_rms_norm_norm(r, x, w1, w2, EPS)
    for got, want in zip(ops.residual_rms_norm_norm(r, x, w1, w2, EPS), want_hy, strict=True):
        assert_bitwise(got, want)
    assert_bitwise(ops.silu_mul(x, b), ref.silu_mul(x, b))
    q = x.view(3, 20, 8)
    c = torch.randn(3, 8).to(torch.bfloat16)
    for got, want in zip(ops.rope_neox(q, q, c, c), ref.rope_neox(q, q, c, c), strict=True):
        assert_bitwise(got, want)
    cf = torch.randn(3, 4)
    for got, want in zip(ops.rope_interleaved(q, q, cf, cf), ref.rope_interleaved(q, q, cf, cf), strict=True):
        assert_bitwise(got, want)
    assert [c for c, _ in fake.calls] == ["rms_norm"] * 4 + ["rms_norm_norm", "silu_mul", "rope", "rope"]
    norm_call = fake.calls[0][1]
    plan = trm.reduce_plan(3, 160)
    assert norm_call["lanes"] == plan.lanes and norm_call["factor"] == float(trm.mean_factor(3, 160))
    assert norm_call["eps"] == float(np.float32(EPS))
    assert norm_call["down"] == (trm.default_warp_order(torch.__version__) == trm.WARP_DOWN)
    stats = ops.stats.to_dict()
    assert stats["fallbacks"] == {} and sum(stats["native_calls"].values()) == 8
    assert stats["native_calls"]["residual_rms_norm_norm"] == 1
    assert ops.stats.native == ops.stats.fused


def test_untrusted_norm_falls_back_counted_and_graph_scope_keeps_torch(fake, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(norm_native, "untrusted_reason", lambda x: "validation_failed")
    ops = make_ops(OpSelection.cuda(scope="all"))
    x, r, _, w1, w2 = _rows()
    assert_bitwise(ops.rms_norm(x, w1, EPS), ref.rms_norm(x, w1, EPS))
    h, y = ops.residual_rms_norm_norm(r, x, w1, w2, EPS)   # not fused: the two ops, each refused
    rh, ry = ref.residual_rms_norm_norm(r, x, w1, w2, EPS)
    assert_bitwise(h, rh)
    assert_bitwise(y, ry)
    assert ops.stats.fallback_count(reason="validation_failed") == 3
    assert ops.stats.to_dict()["native_norm_validation"] is not None
    assert [c for c, _ in fake.calls] == []
    assert_bitwise(ops.silu_mul(x, x), ref.silu_mul(x, x))   # the other families still run natively
    graph_ops = make_ops(OpSelection.cuda(scope="graph"))
    graph_ops.rms_norm(x, w1, EPS)
    graph_ops.silu_mul(x, x)
    assert graph_ops.stats.reference == {"rms_norm": 1, "silu_mul": 1} and not graph_ops.stats.native


def test_inputs_the_kernels_cannot_take_fall_back_by_reason(fake: FakeExtension) -> None:
    ops = make_ops(OpSelection(norm="cuda", rope="cuda", act="cuda", scope="all"))
    x, r, _, w1, _ = _rows()
    ops.rms_norm(x.t().contiguous().t(), w1, EPS)            # last dim not contiguous
    ops.rms_norm(x, w1.float(), EPS)                          # mixed dtypes
    ops.rms_norm(x.double(), w1.double(), EPS)                # dtype
    ops.rms_norm(x[:0], w1, EPS)                              # empty
    ops.silu_mul(x, x[:1])                                    # shape
    q, c = torch.randn(3, 4, 7).to(torch.bfloat16), torch.randn(3, 7).to(torch.bfloat16)
    ops.rope_neox(q, q, c, c)                                 # odd head dim
    fb = ops.stats.to_dict()["fallbacks"]
    assert fb["rms_norm"] == {"layout": 1, "mixed_dtype": 1, "dtype": 1, "empty": 1}
    assert fb["silu_mul"] == {"shape": 1} and fb["rope_neox"] == {"shape": 1}
    assert fake.calls == []


def test_cpu_tensors_are_not_cuda_for_the_native_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "load", lambda verbose=False: FakeExtension())
    ops = make_ops(OpSelection.cuda(scope="all"))
    x, _, _, w1, _ = _rows()
    assert_bitwise(ops.rms_norm(x, w1, EPS), ref.rms_norm(x, w1, EPS))
    assert_bitwise(ops.silu_mul(x, x), ref.silu_mul(x, x))
    assert ops.stats.fallback_count(reason="not_cuda") == 2


def test_selection_names_and_bitwise_arms() -> None:
    from rltbench.arms import is_exact, parse_arms
    from rltbench.bench import kernel_sweep as bench

    assert ARMS["cuda"] == OpSelection("cuda", "cuda", "cuda", "graph") and ARMS["cuda"].name == "cuda"
    assert OpSelection(norm="cuda", act="exact").name == "norm:cuda/rope:off/act:exact"
    assert bench.bitwise_arm("cuda") and bench.bitwise_arm("exact") and not bench.bitwise_arm("approx")
    assert not bench.bitwise_arm("torch") and bench.fused_arm("cuda") and not bench.fused_arm("liger")
    assert is_exact(OpSelection.cuda()) and is_exact(OpSelection(norm="cuda", act="exact"))
    assert not is_exact(OpSelection(norm="cuda", act="approx"))
    if native.unavailable_reason() is not None:
        with pytest.raises(UsageError, match="unavailable"):
            parse_arms("torch,custom=norm:cuda")


# ----------------------------------------------------------------------------------------------
# the arithmetic the kernels rely on
# ----------------------------------------------------------------------------------------------
FORMATS = {"bf16": (8, -126, 127, torch.bfloat16), "fp16": (11, -14, 15, torch.float16)}


def _round_p(x: np.ndarray, p: int, emin: int, emax: int) -> np.ndarray:
    """float64 -> nearest value with a p-bit significand (subnormals below 2**emin, RNE, inf past
    the largest finite value): a correctly rounded cast from float64."""
    _, e = np.frexp(x)
    ulp = np.ldexp(1.0, np.maximum(e, emin + 1) - p)
    r = np.rint(x / ulp) * ulp
    big = (2.0 - 2.0 ** (1 - p)) * 2.0**emax
    return np.where(np.abs(r) > big, np.copysign(np.inf, x), r)


def _samples(name: str, n: int, gen: np.random.Generator) -> np.ndarray:
    """Random finite values of the format as float64: every bit pattern, plus a share forced to tiny
    exponents so that products land in fp32's subnormal range (bf16) and sums in subnormals."""
    dt = FORMATS[name][3]
    bits = torch.from_numpy(gen.integers(0, 2**16, n, dtype=np.int64).astype(np.int16))
    v = bits.view(dt).double().numpy()
    tiny = gen.random(n) < 0.3
    v = np.where(tiny, v * 2.0 ** (-gen.integers(0, 60, n)), v)
    v = torch.from_numpy(v).to(dt).double().numpy()      # exact: rescaled back onto the format
    return v[np.isfinite(v)]


@pytest.mark.parametrize("name", list(FORMATS))
def test_packed_16bit_mul_and_add_equal_fp32_opmath_then_round(name: str) -> None:
    """What __hmul2_rn / __hadd2_rn compute (the exact result rounded once) equals torch's fp32
    result rounded to the dtype, for bf16 and fp16 operands (fp32 has >= 2p + 2 bits)."""
    p, emin, emax, _ = FORMATS[name]
    gen = np.random.default_rng(0)
    a, b = _samples(name, 400_000, gen), _samples(name, 400_000, gen)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    for op in (np.multiply, np.add):
        once = _round_p(op(a, b), p, emin, emax)   # float64 result: exact (mul) or >= 2p + 2 bits (add)
        with np.errstate(over="ignore"):
            twice = _round_p(op(a.astype(np.float32), b.astype(np.float32)).astype(np.float64), p, emin, emax)
        np.testing.assert_array_equal(once, twice, err_msg=f"{name} {op.__name__}")
    if name == "bf16":   # products in fp32's subnormal range were covered
        assert ((np.abs(a * b) < 2.0**-126) & (a * b != 0)).sum() > 1000


def _torch_lane(h: int, w: int, k: int, log_r: int, down: bool) -> int:
    """norm_rows.cuh's torch_lane (reduced_bit inlined), ported for the layout checks below."""
    def bit(i: int) -> int:
        return k - 1 - i if (down or i < k - 5) else i - (k - 5)

    lane = sum(((h >> j) & 1) << bit(log_r + 4 - j) for j in range(5))
    return lane + sum(((w >> j) & 1) << bit(k - 1 - j) for j in range(k - 5 - log_r))


def _butterfly_then_warps(s: np.ndarray) -> np.float32:
    """s [warp, hardware lane]: a warp butterfly (xor 16..1), then the warps' partials halved from
    the top (the kernels' shared-memory exchange); thread (0, 0)'s result."""
    f32 = np.float32
    for offset in (16, 8, 4, 2, 1):
        s = (s + s[:, np.arange(32) ^ offset]).astype(f32)
    q = s[:, 0].copy()
    half = len(q) // 2
    while half >= 1:
        q[:half] = q[:half] + q[half:2 * half]
        half //= 2
    return q[0]


@pytest.mark.parametrize("order", trm.WARP_ORDERS)
def test_lane_layout_reproduces_torchs_tree(order: str) -> None:
    """The scalar kernel's layout argument: thread (warp w, lane h) plays torch lane
    torch_lane(h, w); a warp butterfly (xor 16..1), then the warps' partials halved from the top,
    gives torch's block_x_reduce result bit for bit (torch_reduce_model) for every lane count and
    both shuffle orders."""
    gen = np.random.default_rng(1)
    for k in range(5, 10):
        nw = 1 << (k - 5)
        for _ in range(20):
            v = (gen.standard_normal(1 << k) * 2.0 ** gen.integers(-20, 20, 1 << k)).astype(np.float32)
            want = trm._block_x_reduce(v.copy(), 32, order)
            down = order == trm.WARP_DOWN
            lanes = np.array([[_torch_lane(h, w, k, 0, down) for h in range(32)] for w in range(nw)])
            assert sorted(lanes.ravel().tolist()) == list(range(1 << k))
            assert _butterfly_then_warps(v[lanes]).tobytes() == want.tobytes(), (k, order)


def _vector_kernel_row_sum(sq: np.ndarray, k: int, log_r: int, down: bool) -> np.float32:
    """norm_rows.cuh's vector kernel on one aligned row of squares, replayed in numpy: thread
    (w, h) with base lane b = torch_lane(h, w) adds the vectors b + s * 32 NW (slot s) into
    accumulator s % R in increasing s, combines each accumulator's four elements, halves over its R
    registers from the top, then the butterfly and the warps' exchange."""
    f32 = np.float32
    r_count, nw = 1 << log_r, 1 << (k - 5 - log_r)
    stride = 32 * nw
    vecs = sq.reshape(-1, 4)
    s = np.zeros((nw, 32), f32)
    for w in range(nw):
        for h in range(32):
            base = _torch_lane(h, w, k, log_r, down)
            assert base < stride
            acc = np.zeros((r_count, 4), f32)
            for slot, v in enumerate(range(base, len(vecs), stride)):
                acc[slot % r_count] = acc[slot % r_count] + vecs[v]
            c = ((acc[:, 0] + acc[:, 1]) + acc[:, 2]) + acc[:, 3]
            half = r_count // 2
            while half >= 1:
                c[:half] = c[:half] + c[half:2 * half]
                half //= 2
            s[w, h] = c[0]
    return _butterfly_then_warps(s)


@pytest.mark.parametrize("order", trm.WARP_ORDERS)
def test_vector_kernel_layouts_reproduce_torchs_row_sum(order: str) -> None:
    """Every (registers, warps) split of every lane count sums an aligned row as torch does
    (torch_order.row_sum): rows that leave lanes idle, and rows longer than the register cache."""
    gen = np.random.default_rng(2)
    down = order == trm.WARP_DOWN
    for rows in (1, 2, 4, 8, 16):
        for n in (300, 1000, 2052, 6000):   # idle lanes; one vector per lane; more; past the cache
            plan = trm.reduce_plan(rows, n)
            k = plan.lanes.bit_length() - 1
            assert plan.unsupported_reason is None and plan.lanes == 1 << k
            x = (gen.standard_normal(n) * 2.0 ** gen.integers(-12, 12, n)).astype(np.float32)
            sq = (x * x).astype(np.float32)
            want = trm.row_sum(sq, plan, 0, order)
            for log_r in range(k - 4):
                got = _vector_kernel_row_sum(sq, k, log_r, down)
                assert got.tobytes() == want.tobytes(), (k, log_r, n, order)


# ----------------------------------------------------------------------------------------------
# the sources compile for sm_90 with the instructions exactness needs (where nvcc exists)
# ----------------------------------------------------------------------------------------------
# the half/bfloat16 operator switches torch's extension build passes to nvcc
TORCH_DEFINES = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")


def test_sources_compile_to_the_expected_ptx(tmp_path: Path) -> None:
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    flags = ["-std=c++17", "-arch=sm_90", "-ptx", *TORCH_DEFINES, *build.CUDA_FLAGS]
    ptx = {}
    for name in ("norm", "act", "rope"):
        out = tmp_path / f"{name}.ptx"
        proc = subprocess.run([nvcc, *flags, str(build.CSRC / f"{name}.cu"), "-o", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ptx[name] = out.read_text()
    for name in ("norm", "rope"):   # sums and rotations round every op: no contraction
        assert "fma" not in ptx[name], name
    assert "rsqrt.approx.f32" in ptx["norm"] and "rsqrt.approx.ftz" not in ptx["norm"]
    assert "div.rn.f32" in ptx["act"] and "div.full" not in ptx["act"] and "div.approx" not in ptx["act"]
    assert "mul.rn.bf16x2" in ptx["act"] and "mul.rn.f16x2" in ptx["act"]
    # the body reads gate and up with plain read-only loads (evict-first ld.global.cs measured slower)
    assert "ld.global.nc.v4" in ptx["act"] and "ld.global.cs" not in ptx["act"]
    assert ".local" not in ptx["norm"]


def _sass_functions(sass: str) -> dict[str, list[str]]:
    """cuobjdump -sass text -> {mangled kernel name: its instruction lines}."""
    out: dict[str, list[str]] = {}
    for block in sass.split("Function : ")[1:]:
        name, _, body = block.partition("\n")
        lines = body.splitlines()
        out[name.strip()] = [line for line in lines if line.strip().startswith("/*") and ";" in line]
    return out


def _norm_sass(tmp_path: Path) -> dict[str, list[str]]:
    """norm.cu compiled for sm_90 as the build compiles it, disassembled: {kernel: instructions}
    (skips where nvcc or a cuobjdump is missing)."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    # Triton's NVIDIA backend ships a cuobjdump where the CUDA toolkit's is not next to nvcc
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    candidates = [Path(nvcc).with_name("cuobjdump"), bundled]
    cuobjdump = next((c for c in candidates if c.exists()), None)
    if cuobjdump is None:
        pytest.skip("cuobjdump not found")
    cubin = tmp_path / "norm.cubin"
    cmd = [nvcc, "-std=c++17", "-arch=sm_90", "-cubin", *TORCH_DEFINES, *build.CUDA_FLAGS,
           str(build.CSRC / "norm.cu"), "-o", str(cubin)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True,
                          timeout=120).stdout
    return _sass_functions(sass)


def _opcode(line: str) -> str:
    """The opcode of one SASS line (after its predicate)."""
    m = re.search(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)", line)
    return m.group(1) if m else ""


# norm_vec_kernel<bf16, kNormX, residual?, LOG_R 0, LOG_NW, SLOTS, FULL, runtime warp order, LOAD 1>:
# the straight-line kernels of width 2048 at 32 lanes (16 slots, 16..1023 rows) and 64 lanes (8 slots,
# 8..15 rows), plain and residual, with kLoadVolatile
STRAIGHT_LINE = [f"_ZN4rltb4norm15norm_vec_kernelI13__nv_bfloat16Li0ELb{r}ELi0ELi{nw}ELi{slots}ELb1ELin1ELi1"
                 "EEEvNS_8NormArgsE" for r in (0, 1) for nw, slots in ((0, 16), (1, 8))]


def test_norm_kernels_issue_their_loads_ahead_of_the_sum(tmp_path: Path) -> None:
    """The straight-line kernels load every slot (x, weights, residual) before the first square, so
    a row costs one round trip to memory before its sum (norm_rows.cuh: ptxas issues predicated or
    .ca loads of these kernels partly after the squares, one round trip later). The 1-row plain
    kernel (bf16, width 2048 at 512 lanes, torch >= 2.10's warp order) does it with kLoadPredicated:
    eight weak loads. The rows kernel (many 32-lane rows) issues its first pass's 16 evict-first
    loads of a width-2048 bf16 row together, shuffles five times, stores streaming, and its plain
    form fits 64 registers without spilling (every block of 4096 rows resident at once). A ptxas
    that schedules otherwise fails here, not only in a GPU timing."""
    functions = _norm_sass(tmp_path)
    # norm_vec_kernel<bf16, kNormX, no residual, LOG_R 2, LOG_NW 2, 4 slots, FULL, warp order down, LOAD 2>
    name = "_ZN4rltb4norm15norm_vec_kernelI13__nv_bfloat16Li0ELb0ELi2ELi2ELi4ELb1ELi1ELi2EEEvNS_8NormArgsE"
    body = functions[name]
    first_mul = next(i for i, line in enumerate(body) if "FMUL" in line)
    loads = [line for line in body if "LDG" in line]
    assert len(loads) == 8 and all("LDG.E.64 " in line for line in loads), loads
    assert sum("LDG" in line for line in body[:first_mul]) == 8, body[:first_mul + 1]
    for name in STRAIGHT_LINE:
        body = functions[name]
        first_mul = next(i for i, line in enumerate(body) if "FMUL" in line)
        loads = [i for i, line in enumerate(body) if "LDG" in line]
        slots = 16 if "ELi16ELb1" in name else 8
        assert len(loads) == slots * (3 if "Lb1ELi0" in name else 2), name
        assert max(loads) < first_mul, (name, [body[i] for i in loads if i > first_mul][:3])
    # two passes: bf16's add form, fp16's plain, residual and add forms
    two_pass = [("13__nv_bfloat16", "Li1ELb0"), *(("6__half", f) for f in ("Li0ELb0", "Li0ELb1", "Li1ELb0"))]
    for dtype, form in two_pass:
        body = functions[f"_ZN4rltb4norm16norm_rows_kernelI{dtype}{form}ELi1EEEvNS_8NormArgsE"]
        ops = [_opcode(line) for line in body]
        first_mul = next(i for i, line in enumerate(body) if "FMUL" in line)
        assert ops[:first_mul].count("LDG.E.EF.64") == 16, form
        assert ops.count("SHFL.BFLY") == 5 and ops.count("STG.E.EF.128") >= 1, form
    for dtype in ("6__half", "f"):
        body = functions[f"_ZN4rltb4norm16norm_rows_kernelI{dtype}Li0ELb0ELi1EEEvNS_8NormArgsE"]
        assert not any(_opcode(line) in ("STL", "LDL") for line in body), dtype
    # the held form (bf16 plain and residual): x loaded once, 16 loads before the first square, the
    # residual's 8 cp.async copies ahead of them, 8-byte streaming stores, no spill
    for residual in (0, 1):
        body = functions[f"_ZN4rltb4norm21norm_rows_held_kernelILb{residual}EEEvNS_8NormArgsE"]
        ops = [_opcode(line) for line in body if "@!PT" not in line]
        first_mul = ops.index("FMUL")
        assert ops.count("LDG.E.EF.64") == 16 and ops[:first_mul].count("LDG.E.EF.64") == 16, residual
        copies = [i for i, op in enumerate(ops) if op.startswith("LDGSTS")]
        assert len(copies) == 8 * residual, copies
        assert all(i < ops.index("LDG.E.EF.64") for i in copies), residual
        assert ops.count("SHFL.BFLY") == 5 and ops.count("STG.E.EF.64") >= 16, residual
        assert not any(op in ("STL", "LDL") for op in ops), residual


def test_build_key_follows_sources_and_arch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert build.arch_list() == "9.0"
    k90 = build.build_key("9.0")
    assert k90 == build.build_key("9.0") and k90 != build.build_key("10.0")
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    assert build.cache_root() == tmp_path
    monkeypatch.delenv(build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "rltbench" / "native"
    assert all((build.CSRC / s).exists() for s in (*build.SOURCES, *build.HEADERS))


def test_ninja_next_to_the_interpreter_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    (tmp_path / "ninja").write_text("")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert build.find_ninja() == str(tmp_path / "ninja")
