"""Pure parts of the kernels benchmark: planning/caps, parsing, ULP comparison."""

from __future__ import annotations

import pytest
import torch

from rltbench.bench import kernel_sweep as bench
from rltbench.commands.kernels import cli as kcli
from rltbench.errors import UsageError


def _cfg(**kw) -> bench.BenchConfig:
    base = dict(ops=["rmsnorm", "rope_neox", "silu_mul"], tokens=[1, 8, 128, 4096], dtypes=["bf16"],
                widths=None, arms=["torch", "exact", "approx"], modes=["graph"])
    base.update(kw)
    return bench.BenchConfig(**base)


def test_plan_gpu_uses_model_widths_and_all_tokens():
    plan = bench.plan_cases(_cfg(), on_gpu=True)
    widths = {(c.op, c.width) for c in plan.cases}
    assert widths == {("rmsnorm", 2048), ("rope_neox", 2048), ("silu_mul", 5632), ("silu_mul", 17920)}
    assert {c.tokens for c in plan.cases} == {1, 8, 128, 4096}
    assert len(plan.cases) == 4 * 4 and not plan.notes


def test_plan_cpu_caps_tokens_and_widths_and_says_so():
    plan = bench.plan_cases(_cfg(), on_gpu=False)
    assert max(c.tokens for c in plan.cases) == bench.CPU_MAX_TOKENS
    assert all(c.width <= bench.CPU_MAX_WIDTH for c in plan.cases)
    assert all(c.width % 128 == 0 for c in plan.cases if c.op == "rope_neox")
    text = " ".join(plan.notes)
    assert "tokens capped" in text and "widths capped" in text and "timings need a CUDA GPU" in text


def test_cap_width_respects_head_dim():
    assert bench.cap_width("rope_interleaved", 5280, 512) == 480
    assert bench.cap_width("rope_neox", 2048, 512) == 512
    assert bench.cap_width("silu_mul", 17920, 512) == 512
    assert bench.cap_width("silu_mul", 40, 512) == 40


def test_case_seed_is_stable_and_distinct():
    a = bench.Case("rmsnorm", "bf16", 2048, 8)
    assert a.seed(0) == bench.Case("rmsnorm", "bf16", 2048, 8).seed(0)
    assert a.seed(0) != a.seed(1) and a.seed(0) != bench.Case("rmsnorm", "bf16", 2048, 9).seed(0)


def test_parse_helpers():
    assert kcli.parse_tokens("1, 8,8,128") == [1, 8, 128]
    assert kcli.parse_widths("model") is None and kcli.parse_widths("64,96") == [64, 96]
    assert kcli.parse_choice("bfloat16,fp32", "--dtypes", list(bench.DTYPES), bench.DTYPE_ALIASES) == \
        ["bf16", "fp32"]
    for bad in ("0", "-1", "2.0", "x"):
        with pytest.raises(UsageError):
            kcli.parse_tokens(bad)
    cfg, notes = kcli.build_config("1", "silu_mul", "bf16", "model", "exact", 5, "both", "graph", 0, True)
    assert cfg.arms == ["torch", "exact"] and cfg.modes == ["graph", "eager"] and notes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ulp_distance_counts_representable_steps(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1000, generator=g) * 10).to(dtype)
    up = torch.nextafter(x.float(), torch.full_like(x.float(), float("inf"))).to(dtype) \
        if dtype == torch.float32 else _next_up(x)
    d = bench.ulp_distance(up, x)
    assert torch.all(d == 1)
    assert int(bench.ulp_distance(_next_up(_next_up(x)), x).max()) == 2
    # across zero: -0 and +0 are equal, the smallest subnormals on both sides are 2 apart
    z = torch.tensor([0.0, -0.0], dtype=dtype)
    assert bench.ulp_distance(z[:1], z[1:]).item() == 0
    tiny = torch.tensor([1], dtype={torch.float32: torch.int32}.get(dtype, torch.int16)).view(dtype)
    assert bench.ulp_distance(tiny, -tiny).item() == 2


def _next_up(x: torch.Tensor) -> torch.Tensor:
    """Next representable value towards +inf for positive and negative finite non-zero x."""
    bits = torch.int32 if x.dtype == torch.float32 else torch.int16
    i = x.view(bits)
    return torch.where(x > 0, i + 1, torch.where(x < 0, i - 1, i)).view(x.dtype)


def test_compare_nan_and_counts():
    a = torch.tensor([1.0, float("nan"), 3.0, 0.0])
    b = torch.tensor([1.0, float("nan"), 3.5, -0.0])
    c = bench.compare((a,), (b,))
    assert c["mismatches"] == 1 and c["n_elements"] == 4 and c["mismatch_share"] == 0.25
    c = bench.compare((a,), (torch.tensor([1.0, 2.0, 3.0, 0.0]),))
    assert c["mismatches"] == 1 and c["max_ulp"] > 2**40  # NaN vs number is maximal
    with pytest.raises(ValueError):
        bench.compare((a,), (a, a))


def test_failing_rule():
    assert bench.failing({"arm": "exact", "status": "MISMATCH"})
    assert bench.failing({"arm": "approx", "status": "error"})
    assert not bench.failing({"arm": "approx", "status": "ok"})
    assert not bench.failing({"arm": bench.PEER_ARM, "status": "error"})
