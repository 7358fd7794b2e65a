"""The decode-attention sweep's bookkeeping on CPU: inputs, the correctness gate, best-variant choice,
the table and the JSON, with the GPU-only parts (CUDA inputs, graph timing) swapped for CPU stand-ins.
The kernels run under TRITON_INTERPRET=1; the timings are fake, only the plumbing is checked."""

from __future__ import annotations

import json

import pytest
import torch

from rltbench.cli import main
from rltbench.commands.tune import attention as ab
from rltbench.engine.attention import _CONFIG_FIELDS, DecodeConfig


@pytest.fixture
def cpu_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = iter(range(1, 10**6))
    monkeypatch.setattr(ab, "_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu-interpreter")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # fake timing: run each variant's first call once (it must work), one distinct time per variant
    monkeypatch.setattr(
        ab, "_time_graph", lambda fns, reps, n: [fns[0]() is not None and float(next(calls))] * reps
    )


@pytest.mark.slow  # about 10 s
def test_sweep_plumbing_on_cpu(cpu_bench: None, tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    names = ("default", "v1", "t64h2w8s2", "t64h2w8-1split", "t32h1w4-fused", "t64h1w2s2-1split")
    variants = {k: ab.SWEEP_VARIANTS[k] for k in names}
    variants["broken"] = {"tile_tokens": 24}  # not a power of two: reported as an error, never best
    res = ab.sweep_decode_attention(
        cases=((1, 40), (3, 70)), variants=variants, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
        dtype=torch.float32, reps=2,
    )  # fmt: skip
    assert [c["batch"] for c in res["cases"]] == [1, 3]
    # timed as the decode graph runs: rows up to DECODE_RUN tokens past the context, the graph's class
    assert [c["covered_len"] for c in res["cases"]] == [256, 256]
    for case in res["cases"]:
        by = {r["name"]: r for r in case["results"]}
        assert set(by) == set(variants)
        assert not by["broken"]["ok"] and "error" in by["broken"]
        for name in names:
            assert by[name]["ok"] and by[name]["max_abs_err"] < 1e-5, by[name]
        assert by["v1"]["launches"] == 2 and by["t64h2w8-1split"]["num_splits"] == 1
        assert by["t64h2w8-1split"]["launches"] == 1
        assert by["t64h1w2s2-1split"]["num_splits"] == 1 and by["t64h1w2s2-1split"]["num_stages"] == 2
        assert by["t32h1w4-fused"]["fused_reduce"] and by["t32h1w4-fused"]["num_splits"] > 1
        assert by["t32h1w4-fused"]["launches"] == 1 and not by["default"]["fused_reduce"]
        assert case["best"]["name"] == "default"  # the fake timer gives the first variant the least time
    table = ab.format_table(res)
    assert "broken" in table and "error" in table and "*" in table
    json.dumps(res)
    assert "B=1" in capsys.readouterr().out


def test_cli_rejects_unknown_variants(cpu_bench: None, capsys: pytest.CaptureFixture) -> None:
    assert main(["tune", "attention", "--variants", "nope"]) == 2
    assert "--variants: unknown" in capsys.readouterr().err


def test_fused_variants_round_trip_through_tuned_rows() -> None:
    """A fused best variant becomes a tuned row whose knobs rebuild the same DecodeConfig."""
    fused = [n for n, k in ab.SWEEP_VARIANTS.items() if k.get("fused_reduce")]
    assert {64, 128, 256} <= {ab.SWEEP_VARIANTS[n].get("partition_size") for n in fused}
    name = "p128t64h1w8-fused"
    best = {"name": name, **ab._resolve(name, ab.SWEEP_VARIANTS[name], 1, 16, 512)}
    best |= {"median_us": 3.0, "kv_gbps": 1.0}
    res = {"variants": ab.SWEEP_VARIANTS, "cases": [{"batch": 1, "context_len": 512, "best": best}]}
    (row,) = ab.tuned_rows(res)
    cfg = DecodeConfig(**{k: v for k, v in row.items() if k in _CONFIG_FIELDS})
    assert cfg.fused_reduce and cfg.partition_size == 128 and cfg.num_warps == 8 and best["launches"] == 1
    json.dumps(row)
