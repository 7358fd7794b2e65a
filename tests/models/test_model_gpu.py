"""GPU: whole-model bitwise exact-vs-torch at the real shapes (random weights) inside a CUDA graph
(the default scope "graph" runs the fused kernels only while capturing), and the decode-step timer.

Run with `pytest --run-gpu tests/models/test_model_gpu.py` (about a minute on an H200)."""

from __future__ import annotations

import pytest
import torch

from rltbench.bench.model_step import capture_step, decode_step_ms, fill_random_kv
from rltbench.models import build_model

pytestmark = pytest.mark.gpu


def _captured_outputs(model, ops, ids, positions, seq_ids, rows_are_seqs):
    cache = model.new_kv_cache(max_seqs=2, max_len=64)
    fill_random_kv(cache, 56, seed=1)
    graph, out = capture_step(model, ops, cache, ids, positions, seq_ids, rows_are_seqs)
    graph.replay()
    torch.cuda.synchronize()
    return {k: v.clone() for k, v in out.items()}


def _check_exact(model, fused_ops):
    from rltbench.arms import ArmSpec
    from rltbench.kernels import make_ops
    from rltbench.kernels.norm import onelaunch

    dev = model.device
    refused_before = dict(onelaunch.validation_report()["refusals"])
    torch_ops, exact_ops = make_ops(ArmSpec.torch()), make_ops(ArmSpec.exact())
    cases = [  # a batched decode step, then an 8-token prefill chunk of one sequence
        (torch.tensor([11, 12], device=dev), torch.tensor([40, 47], device=dev), torch.arange(2, device=dev),
         True),
        (torch.arange(100, 108, device=dev), torch.arange(48, 56, device=dev),
         torch.zeros(8, dtype=torch.long, device=dev), False),
    ]
    for ids, pos, seqs, rows in cases:
        ref = _captured_outputs(model, torch_ops, ids, pos, seqs, rows)
        ex = _captured_outputs(model, exact_ops, ids, pos, seqs, rows)
        for key in ("hidden", "logits", "next_token"):
            assert torch.equal(ex[key], ref[key]), key
    assert exact_ops.stats.fallback_count() == 0, exact_ops.stats.to_dict()
    # the models' activations and weights are the one-launch norm's own specialisation: no norm
    # call was sent to the 3-launch path for its pointer or row stride (onelaunch.layout_reason)
    refused = onelaunch.validation_report()["refusals"]
    for why in ("row_stride", "unaligned_pointer"):
        assert refused.get(why, 0) == refused_before.get(why, 0), refused
    fused = {op for op, n in exact_ops.stats.fused.items() if n > 0}
    # where the one-launch norm is validated, Ouro's residual norm runs fused with the next norm
    if "residual_rms_norm_norm" in fused:
        fused.add("residual_rms_norm")
    assert fused_ops <= fused, exact_ops.stats.to_dict()


def test_ouro_14b_exact_equals_torch_in_graph():
    model = build_model("ouro-1.4b", device="cuda", dtype=torch.bfloat16, seed=0)
    _check_exact(model, {"rms_norm", "residual_rms_norm", "rope_neox", "silu_mul"})


def test_huginn_exact_equals_torch_in_graph():
    model = build_model("huginn-0125", device="cuda", dtype=torch.bfloat16, seed=0, mean_recurrence=2)
    _check_exact(model, {"rms_norm_huginn", "add_rms_norm_huginn", "rope_interleaved", "silu_mul"})


def test_decode_step_ms_runs():
    from rltbench.kernels import ARMS, make_ops

    model = build_model("ouro-1.4b", device="cuda", dtype=torch.bfloat16, seed=0)
    res = decode_step_ms(model, make_ops(ARMS["torch"]), batch=1, context=512, iters=20)
    assert 0 < res["p10_ms"] <= res["median_ms"] <= res["p90_ms"] and len(res["samples_ms"]) == 20
    assert res["num_kv_planes"] == 96
    print(f"ouro-1.4b batch-1 decode step (torch arm): median {res['median_ms']:.2f} ms")
