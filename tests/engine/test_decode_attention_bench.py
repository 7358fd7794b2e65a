"""The decode-attention sweep's bookkeeping on CPU: inputs, the correctness gate, best-variant choice,
the table and the JSON, with the GPU-only parts (CUDA inputs, graph timing) swapped for CPU stand-ins.
The kernels run under TRITON_INTERPRET=1; the timings are fake, only the plumbing is checked."""

from __future__ import annotations

import json

import pytest
import torch

from rltbench.engine import attention_bench as ab


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


def test_sweep_plumbing_on_cpu(cpu_bench: None, tmp_path: object, capsys: pytest.CaptureFixture) -> None:
    variants = {k: ab.SWEEP_VARIANTS[k] for k in ("default", "v1", "t64h2w8s2", "t64h2w8-1split")}
    variants["broken"] = {"tile_tokens": 24}  # not a power of two: reported as an error, never best
    res = ab.sweep_decode_attention(
        cases=((1, 40), (3, 70)), variants=variants, num_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
        dtype=torch.float32, reps=2,
    )  # fmt: skip
    assert [c["batch"] for c in res["cases"]] == [1, 3]
    for case in res["cases"]:
        by = {r["name"]: r for r in case["results"]}
        assert set(by) == set(variants)
        assert not by["broken"]["ok"] and "error" in by["broken"]
        for name in ("default", "v1", "t64h2w8s2", "t64h2w8-1split"):
            assert by[name]["ok"] and by[name]["max_abs_err"] < 1e-5, by[name]
        assert by["v1"]["launches"] == 2 and by["t64h2w8-1split"]["num_splits"] == 1
        assert by["t64h2w8-1split"]["launches"] == 1
        assert case["best"]["name"] == "default"  # the fake timer gives the first variant the least time
    table = ab.format_table(res)
    assert "broken" in table and "error" in table and "*" in table
    json.dumps(res)
    assert "B=1" in capsys.readouterr().out


def test_cli_rejects_unknown_variants(cpu_bench: None) -> None:
    with pytest.raises(ab.UsageError):
        ab.main(["--sweep", "--variants", "nope"])
