"""Routing: scope graph vs all, fallbacks counted per op and reason,
the op cases used by the benchmark."""

from __future__ import annotations

import pytest
import torch

from rltbench import tuned
from rltbench.errors import UsageError
from rltbench.kernels import ARMS, OPS, OpSelection, make_ops, norm, op_case
from rltbench.kernels import reference as ref
from rltbench.kernels.norm import onelaunch
from rltbench.kernels.norm.config import ExactNormRouting
from rltbench.kernels.ops import Ops
from tests.kernels._util import assert_bitwise


def _norm_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 40, generator=g).to(dtype), (torch.randn(40, generator=g) + 1).to(dtype)


def test_scope_graph_keeps_torch_on_cpu_and_all_runs_kernels() -> None:
    x, w = _norm_inputs()
    graph_ops = make_ops(OpSelection.exact(scope="graph"))
    assert_bitwise(graph_ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    assert graph_ops.stats.reference["rms_norm"] == 1 and not graph_ops.stats.fused
    all_ops = make_ops(OpSelection.exact(scope="all"))
    all_ops.rms_norm(x, w, 1e-6)
    assert all_ops.stats.fused["rms_norm"] == 1 and all_ops.stats.fallback_count() == 0
    torch_ops = make_ops()
    torch_ops.silu_mul(x, x)
    assert torch_ops.stats.reference["silu_mul"] == 1 and torch_ops.selection == ARMS["torch"]


def test_fallbacks_are_counted_and_still_correct(monkeypatch) -> None:
    ops = make_ops(OpSelection.exact(scope="all"))
    x, w = _norm_inputs()
    cases = [
        (
            "layout",
            lambda: (
                ops.rms_norm(x.t().contiguous().t(), w, 1e-6),
                ref.rms_norm(x.t().contiguous().t(), w, 1e-6),
            ),
        ),
        ("mixed_dtype", lambda: (ops.rms_norm(x, w.float(), 1e-6), ref.rms_norm(x, w.float(), 1e-6))),
        (
            "dtype",
            lambda: (ops.rms_norm(x.double(), w.double(), 1e-6), ref.rms_norm(x.double(), w.double(), 1e-6)),
        ),
        ("shape", lambda: (ops.silu_mul(x, x[:1]), ref.silu_mul(x, x[:1]))),
    ]
    for reason, run in cases:
        got, want = run()
        assert torch.equal(got, want), reason
        assert ops.stats.fallback_count(reason=reason) == 1, (reason, ops.stats.to_dict())
    xg = x.clone().requires_grad_(True)
    got = ops.rms_norm(xg, w, 1e-6)
    assert got.requires_grad and ops.stats.fallback_count("rms_norm", "requires_grad") == 1
    with torch.no_grad():
        ops.rms_norm(xg, w, 1e-6)
    assert ops.stats.fused["rms_norm"] == 1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert torch.equal(ops.silu_mul(x, x), ref.silu_mul(x, x))
    assert ops.stats.fallback_count("silu_mul", "cpu_no_interpreter") == 1
    d = ops.stats.to_dict()
    assert d["fallbacks"]["rms_norm"]["mixed_dtype"] == 1 and d["fused"]["rms_norm"] == 1
    ops.stats.reset()
    assert ops.stats.fallback_count() == 0


def test_rope_fallbacks() -> None:
    ops = make_ops(OpSelection.exact(scope="all"))
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, 8, generator=g), torch.randn(2, 1, 8, generator=g)
    cos64, sin64 = torch.randn(2, 4, generator=g).double(), torch.randn(2, 4, generator=g).double()
    got = ops.rope_interleaved(q, k, cos64, sin64)
    want = ref.rope_interleaved(q, k, cos64, sin64)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert ops.stats.fallback_count("rope_interleaved", "mixed_dtype") == 1
    odd = torch.randn(2, 2, 7, generator=g)
    ops.rope_neox(odd, odd, torch.randn(2, 7, generator=g), torch.randn(2, 7, generator=g))
    assert ops.stats.fallback_count("rope_neox", "shape") == 1


def test_op_cases_shapes_bytes_and_errors() -> None:
    assert OPS == ["rmsnorm", "rmsnorm_huginn", "rmsnorm_residual", "add_rmsnorm_huginn", "rope_neox",
                   "rope_interleaved", "silu_mul"]
    g = torch.Generator().manual_seed(0)
    d = op_case("rope_neox").make_inputs(3, 256, torch.bfloat16, "cpu", g)
    assert d["q"].shape == (3, 2, 128) and d["cos"].shape == (3, 128) and d["cos"].dtype == torch.bfloat16
    d = op_case("rope_interleaved").make_inputs(3, 192, torch.bfloat16, "cpu", g)
    assert d["q"].shape == (3, 2, 96) and d["cos"].shape == (3, 48) and d["cos"].dtype == torch.float32
    n = op_case("rmsnorm_residual").make_inputs(4, 10, torch.float16, "cpu", g)
    assert op_case("rmsnorm_residual").bytes_moved(n) == (4 * 10 * 2) * 3 + 10 * 2
    with pytest.raises(UsageError):
        op_case("layernorm")
    with pytest.raises(UsageError):
        op_case("rope_neox").make_inputs(1, 100, torch.bfloat16, "cpu", g)


def test_exact_norm_path_is_recorded_and_onelaunch_needs_trust(monkeypatch) -> None:
    """CPU tensors are never trusted for the one-launch norm (torch CPU sums in another order), so
    the exact arm takes the 3-launch path and says so; when trust is granted the one-launch kernels
    are the ones called, norm-add-norm included."""
    sel = OpSelection(norm="exact", rope="off", act="off", scope="all")
    g = torch.Generator().manual_seed(3)
    r, a = (torch.randn(4, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    w1, w2 = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    ops = make_ops(sel)
    ops.residual_rms_norm_norm(r, a, w1, w2, 1e-6)
    assert ops.stats.paths[("residual_rms_norm", "3launch")] == 1
    assert ops.stats.paths[("rms_norm", "3launch")] == 1
    assert ops.stats.to_dict()["exact_norm_paths"]["rms_norm"] == {"3launch": 1}

    calls: list[str] = []
    monkeypatch.setattr(onelaunch, "is_trusted", lambda x: True)
    monkeypatch.setattr(onelaunch, "rms_norm_onelaunch_rows", lambda *a, **k: calls.append("norm"))
    monkeypatch.setattr(onelaunch, "residual_rms_norm_norm_onelaunch_rows",
                        lambda *a, **k: calls.append("nn"))
    ops2 = make_ops(sel)
    ops2.rms_norm(a, w1, 1e-6)
    ops2.residual_rms_norm_norm(r, a, w1, w2, 1e-6)
    assert calls == ["norm", "nn"]
    assert ops2.stats.paths[("residual_rms_norm_norm", "onelaunch")] == 1
    off = Ops(sel, onelaunch_norm=False)
    off.rms_norm(a, w1, 1e-6)
    assert calls == ["norm", "nn"] and off.stats.paths[("rms_norm", "3launch")] == 1
    with tuned.use({"norm_exact": {"onelaunch": False}}):   # the tuned routing can switch it off too
        make_ops(sel).rms_norm(a, w1, 1e-6)
    assert calls == ["norm", "nn"]


def test_wide_rows_take_the_one_launch_norm_from_the_tuned_row_count(monkeypatch) -> None:
    """Rows wider than WIDE_ROW take the one-launch norm from ExactNormRouting.wide_min_rows rows (by
    default 1: every row count); below a tuned threshold they keep the 3-launch exact norm."""
    calls: list[int] = []
    monkeypatch.setattr(onelaunch, "is_trusted", lambda x: True)
    monkeypatch.setattr(onelaunch, "rms_norm_onelaunch_rows", lambda x, *a, **k: calls.append(x.shape[0]))
    ops = make_ops(OpSelection(norm="exact", rope="off", act="off", scope="all"))
    W = ExactNormRouting.WIDE_ROW + 8
    g = torch.Generator().manual_seed(5)
    w = torch.randn(W, generator=g).to(torch.bfloat16)
    few = torch.randn(2, W, generator=g).to(torch.bfloat16)
    with tuned.use(None):
        assert ExactNormRouting().wide_min_rows == 1
        ops.rms_norm(few, w, 1e-6)
    assert calls == [2] and ops.stats.paths[("rms_norm", "onelaunch")] == 1
    with tuned.use({"norm_exact": {"wide_min_rows": 128}}):
        ops.rms_norm(few, w, 1e-6)  # runs the real 3-launch kernels through the interpreter
        assert calls == [2] and ops.stats.paths[("rms_norm", "3launch")] == 1
        many = torch.randn(128, W, generator=g).to(torch.bfloat16)
        ops.rms_norm(many, w, 1e-6)
    assert calls == [2, 128] and ops.stats.paths[("rms_norm", "onelaunch")] == 2


def test_dispatch_table_per_arm(monkeypatch) -> None:
    """norm.route: the kernel and the fused norm-add-norm each arm's call gets, and the fallback the
    caller counts (approx too wide, the native norm untrusted)."""
    x = torch.randn(3, 64)
    exact = norm.route("exact", x)
    assert (exact.kernel, exact.norm_norm, exact.fallback) == ("3launch", None, None)   # CPU: not trusted
    approx = norm.route("approx", x)
    assert approx.kernel == "approx" and approx.norm_norm is not None
    wide = torch.empty(1, norm.approx.MAX_WIDTH + 1)
    assert norm.route("approx", wide).fallback == "width"
    assert norm.route("cuda", x).fallback == "not_cuda"
    assert norm.route("cuda", torch.empty(0, 64)).fallback == "empty"
    monkeypatch.setattr(norm.native, "untrusted_reason", lambda t: None)
    assert norm.route("cuda", x).kernel == "native"
    with pytest.raises(ValueError):
        norm.route("off", x)


def _rows(T: int, W: int, stride: int, start: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(T + stride)
    buf = torch.randn(start + T * stride, generator=g).to(torch.bfloat16)
    return buf[start:].view(T, stride)[:, :W]


def test_onelaunch_norm_reads_only_rows_of_its_validated_specialisation(monkeypatch) -> None:
    """Even where the width is trusted, the exact arm's one-launch kernels get only the Triton
    specialisation validation covers: 16-byte aligned pointers and row strides as divisible by 16 as
    the width (contiguous rows, or a padded stride like 2064 for 2048). Other rows take the 3-launch
    path, and the refusal is counted by reason (onelaunch.layout_reason)."""
    onelaunch.reset_validation()
    calls: list[str] = []
    monkeypatch.setattr(onelaunch, "is_trusted", lambda x: True)
    monkeypatch.setattr(onelaunch, "rms_norm_onelaunch_rows", lambda *a, **k: calls.append("one"))
    monkeypatch.setattr(onelaunch, "residual_rms_norm_norm_onelaunch_rows",
                        lambda *a, **k: calls.append("nn"))
    monkeypatch.setattr(norm.exact, "rms_norm_exact_rows", lambda *a, **k: calls.append("three"))
    ops = make_ops(OpSelection(norm="exact", rope="off", act="off", scope="all"))
    w64 = torch.ones(64, dtype=torch.bfloat16)
    cases = [((4, 64, 64, 0), "one"), ((4, 64, 80, 16), "one"), ((4, 64, 72, 0), "three"),
             ((4, 64, 64, 1), "three"), ((1, 64, 72, 0), "one"),   # one row: its stride is never read
             ((4, 40, 40, 0), "one"), ((4, 40, 48, 0), "three"), ((4, 40, 56, 8), "one")]
    for (T, W, stride, start), want in cases:
        calls.clear()
        w = w64[:W] if W == 64 else torch.ones(W, dtype=torch.bfloat16)
        ops.rms_norm(_rows(T, W, stride, start), w, 1e-6)
        assert calls == [want], ((T, W, stride, start), calls)
    assert onelaunch.validation_report()["refusals"] == {"row_stride": 2, "unaligned_pointer": 1}
    # the tensors read beside x count too: a residual, a branch, the weights
    x, ok = _rows(4, 64, 64, 0), _rows(4, 64, 64, 0)
    for call in (lambda: ops.residual_rms_norm(_rows(4, 64, 72, 0), x, w64, 1e-6),
                 lambda: ops.add_rms_norm_huginn(x, _rows(4, 64, 64, 1), w64, 1e-6),
                 lambda: ops.rms_norm(x, torch.ones(65, dtype=torch.bfloat16)[1:], 1e-6)):
        calls.clear()
        call()
        assert calls == ["three"], calls
    calls.clear()
    ops.residual_rms_norm_norm(ok, x, w64, w64, 1e-6)
    assert calls == ["nn"]
    calls.clear()
    ops.residual_rms_norm_norm(_rows(4, 64, 72, 0), x, w64, w64, 1e-6)   # two composed norms
    assert "nn" not in calls and calls[0] == "three", calls
    onelaunch.reset_validation()
