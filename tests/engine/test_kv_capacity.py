"""The capacity prediction (engine.kv_capacity) against what a real engine allocates and admits, and
the scheduler's one-request-per-step prefill policy (max_prefill_seqs)."""

from __future__ import annotations

import pytest
import torch

from rltbench.engine.engine import Engine
from rltbench.engine.kv_capacity import GIB, capacity, engine_layout, per_application_layout
from rltbench.engine.types import EngineConfig, SamplingParams
from rltbench.models import build_model, get_config
from tests.engine.engine_testutil import prompts


@pytest.mark.parametrize("preset,layout", [("ouro-tiny", None), ("huginn-tiny", "full"),
                                           ("huginn-tiny", "compress")])
@pytest.mark.parametrize("prompt_len,output_len,block_size", [(13, 5, 4), (16, 1, 16)])
def test_prediction_equals_engine_allocation_and_admission(preset, layout, prompt_len, output_len,
                                                           block_size, request):
    model = request.getfixturevalue(preset.replace("-", "_"))
    if layout is not None and model.config.kv_layout != layout:
        model = build_model(preset, device="cpu", dtype=torch.float32, seed=0, kv_layout=layout).eval()
    kv = engine_layout(model.config, torch.float32)
    budget = 7.5 * kv.bytes_per_block(block_size) * (prompt_len + output_len) / block_size * 3
    pred = capacity(kv, budget, block_size, prompt_len, output_len)
    assert pred.max_seqs >= 2
    engine = Engine(model, config=EngineConfig(kv_cache_gib=budget / GIB, block_size=block_size,
                                               max_num_seqs=pred.max_seqs + 5, use_cuda_graph=False))
    assert engine.num_blocks == pred.num_blocks
    assert engine.kv.numel() * engine.kv.element_size() == pred.num_blocks * kv.bytes_per_block(block_size)
    assert engine.kv_bytes_per_token == kv.bytes_per_token
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    for i, p in enumerate(prompts(1, [prompt_len] * (pred.max_seqs + 1))):
        engine.add_request(f"r{i}", p, params)
    admitted = [engine.scheduler.admit(seq) for seq in list(engine.scheduler.waiting)]
    assert admitted == [True] * pred.max_seqs + [False]
    assert engine.blocks.num_free_blocks == pred.num_blocks - pred.max_seqs * pred.blocks_per_seq


def test_per_application_baseline_counts_every_layer_application():
    ouro, huginn, bf16 = get_config("ouro-1.4b"), get_config("huginn-0125"), torch.bfloat16
    assert per_application_layout(ouro, bf16).planes == 96 == engine_layout(ouro, bf16).planes
    assert per_application_layout(huginn, bf16).planes == 132
    assert engine_layout(huginn, bf16).bytes_per_token == 132 * 2 * 55 * 96 * 2
    assert per_application_layout(ouro, bf16).bytes_per_token == 768 * 1024


def test_budget_below_one_request_admits_none():
    kv = engine_layout(get_config("ouro-tiny"), torch.float32)
    pred = capacity(kv, kv.bytes_per_block(16) * 1.5, 16, 20, 4)
    assert (pred.num_blocks, pred.blocks_per_seq, pred.max_seqs) == (1, 2, 0)


@pytest.mark.parametrize("limit", [None, 1, 2])
def test_max_prefill_seqs_limits_rows_per_prefill_step_and_keeps_tokens(ouro_tiny, limit):
    """One request per step (limit 1) runs one prefill row per step; the tokens are the packed run's on
    this CPU model (same kernels: fp32 torch rows do not depend on the batch here)."""
    ps = prompts(3, [9, 6, 11, 7])
    outs, rows = {}, {}
    for lim in (None, limit):
        engine = Engine(ouro_tiny, config=EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=64,
                                                       use_cuda_graph=False, max_prefill_seqs=lim))
        engine.start_recording()
        res = engine.generate(ps, SamplingParams(max_tokens=3, ignore_eos=True))
        sched = engine.stop_recording()
        outs[lim] = [r.token_ids for r in res]
        rows[lim] = [len(st.rows) for st in sched.steps if st.kind == "prefill"]
    assert rows[None] == [4]
    assert max(rows[limit]) == (limit or 4) and sum(rows[limit]) == 4
    assert outs[limit] == outs[None]


def test_max_prefill_seqs_must_be_positive():
    with pytest.raises(ValueError):
        EngineConfig(max_prefill_seqs=0).validate()
