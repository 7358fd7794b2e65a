"""GPU: profile ouro-tiny at batch 1; graph kernel nodes must equal the profiler's kernels per replay."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.gpu
def test_profile_ouro_tiny_counts_agree() -> None:
    from rltbench import runtime
    from rltbench.arms import parse_arms
    from rltbench.commands.profile.collect import ProfileSpec, run_profile

    spec = ProfileSpec(
        source=runtime.ModelSource("ouro-tiny"),
        device="cuda",
        dtype=torch.bfloat16,
        batch=1,
        context=64,
        arms=parse_arms("torch,exact,approx"),
        iters=20,
        rounds=2,
        replays=2,
        steps=2,
    )
    out = run_profile(spec, log=lambda m: None)
    counts = {}
    for arm, res in out["arms"].items():
        assert res["graph_census"] is not None, res["graph_census_note"]
        assert res["agree"] is True, f"{arm}: {res['agree_reason']}"
        assert res["profiler"]["replays"] == 2
        assert res["replay_stats_us"]["n"] >= 20 and res["replay_stats_us"]["median"] > 0
        assert res["engine_steps_graph_launches"] == 2
        assert res["gemm_floor_us"] > 0
        counts[arm] = res["kernels_per_step"]
    assert counts["exact"] < counts["torch"] and counts["approx"] < counts["exact"]
    facts = out["decode_step"]  # the decode table's figure: serving class, every timed cell warm
    assert facts["len_class"] == 256 and facts["bucket"] == 1
    assert len(facts["warm"]) == 3 * 2
    assert all(w["warm"] and w["cold_work"]["graph_captures"] == 0 for w in facts["warm"])
    assert out["weight_floor_ms"] > 0
    assert out["kv_floor_ms"] > 0 and out["kv_bytes"]["bytes"] > 0
    for res in out["arms"].values():
        assert 0 < res["floor_shares"]["attention"] < 1.5  # a share far above 1 would be a wrong floor
