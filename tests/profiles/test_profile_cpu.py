"""CPU: `rltbench profile --device cpu` must measure real decode steps (regression: every arm showed
0 ops/step and a 0 ms median because the engine capped the request at max_model_len before the timed and
profiled steps ran, so they were no-ops)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from rltbench import runtime
from rltbench.arms import parse_arms
from rltbench.commands.profile.collect import (
    ProfileSpec,
    _decode_step,
    _start_decode,
    build_engine,
    decode_tokens,
    run_profile,
)
from rltbench.commands.profile.report import _step_ms

# More timed steps than the old pool sizing (context + 64) allowed: the bug shows as 0 ops and median 0.
ITERS = 140
STEPS = 2


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core runner, OpenMP spin-waits can make steps ~100x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _spec(arms: list[str], iters: int = ITERS, cpu: bool = True) -> ProfileSpec:
    return ProfileSpec(
        source=runtime.ModelSource("ouro-tiny"),
        device="cpu" if cpu else "cuda",
        dtype=torch.float32,
        batch=1,
        context=32,
        arms=parse_arms(",".join(arms)),
        iters=iters,
        rounds=1,
        replays=1,
        steps=STEPS,
    )


def build_model(spec: ProfileSpec, device: str):
    return runtime.load(spec.source, device, spec.dtype)[0]


def test_cpu_profile_counts_ops_and_times_steps(one_thread: None) -> None:
    out = run_profile(_spec(["torch", "approx"]), log=lambda m: None)
    assert out["mode"] == "cpu"
    for arm, res in out["arms"].items():
        assert res["cpu_ops_per_step"] > 0, arm
        assert res["kernels_per_step"] == res["cpu_ops_per_step"]
        assert len(res["wall_us"]) == ITERS and min(res["wall_us"]) > 0, arm
        med, p10, _p90 = _step_ms(res, "cpu")
        assert med > 0 and p10 > 0, arm
    torch_arm = out["arms"]["torch"]
    gemm = {r["class"]: r["count"] for r in torch_arm["classes"]}["gemm"]
    assert gemm > 0, "the torch arm's decode step has no matmul op"
    names = {r["name"] for r in torch_arm["top_kernels"]}
    assert names & {"aten::mm", "aten::addmm", "aten::bmm"}, names


def test_engine_is_sized_for_every_measured_step() -> None:
    assert decode_tokens(_spec(["torch"], iters=500)) == 500 + STEPS
    assert decode_tokens(_spec(["torch"], iters=500, cpu=False)) == STEPS  # GPU times graph replays
    spec = _spec(["torch"], iters=300)
    eng = build_engine(build_model(spec, "cpu"), spec)
    # prefill token + one warm-up step + every timed and profiled step must fit
    assert eng.max_model_len >= spec.context + decode_tokens(spec) + 2


def test_decode_step_refuses_a_noop_step(one_thread: None) -> None:
    spec = _spec(["torch"], iters=1)
    model = build_model(spec, "cpu")
    eng = build_engine(model, spec)
    eng.set_arm("torch")
    ids = _start_decode(eng, spec, int(model.config.vocab_size), 4)
    _decode_step(eng, ids)  # a live request decodes
    eng.abort_request(ids[0])
    with pytest.raises(RuntimeError, match="no token"):
        _decode_step(eng, ids)


def test_profile_engine_uses_the_decode_tables_context_class() -> None:
    """`profile` and the engine's decode table time the same graph for the same (batch, context):
    the serving context class (300 cached tokens -> class 512, not capped at context + 64 as the
    profile's engine once was: 368; on Ouro-1.4B 512 -> 1024, not 576) and the same batch bucket."""
    from dataclasses import replace

    from rltbench.bench.decode import decode_engine_config, serving_len_class
    from rltbench.engine import Engine

    spec = replace(_spec(["torch"], iters=1), context=300, batch=3)
    model = build_model(spec, "cpu")
    max_pos = int(model.config.max_position_embeddings)
    prof = build_engine(model, spec)
    table_cfg = decode_engine_config(128, 300, extra_tokens=128, use_cuda_graph=False, num_blocks=300,
                                     model_max_len=max_pos)
    table = Engine(model, ["torch"], table_cfg)
    assert prof.runner.len_class(301) == table.runner.len_class(301) == serving_len_class(301) == 512
    assert serving_len_class(513) == 1024 and serving_len_class(512) == 512 and serving_len_class(2) == 256
    assert decode_engine_config(1, 512).max_model_len == 1024  # Ouro-1.4B's profile: class 1024
    assert prof.config.max_model_len >= spec.context + decode_tokens(spec) + 2
    gpu = decode_engine_config(3, 512, use_cuda_graph=True)
    assert gpu.num_blocks is None and gpu.graph_batch_sizes is None  # serving pool and buckets
    bucket_of_3 = [min(b for b in e.runner.buckets if b >= 3) for e in (prof, table)]
    assert bucket_of_3 == [4, 4]
