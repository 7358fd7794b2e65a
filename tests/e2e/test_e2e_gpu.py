"""GPU checks of `rltbench e2e` (run with --run-gpu on a CUDA machine; < 1 minute)."""

from __future__ import annotations

import pytest

from rltbench.cli import main
from rltbench.results import RunDir


def _e2e(out, args: str) -> RunDir:
    """`rltbench e2e` of ouro-tiny on the GPU with torch, exact and the A/A arm; the stored run."""
    base = "e2e --model ouro-tiny --device cuda --arms torch,exact,torch --no-live --kv-cache-gib 1 "
    assert main([*(base + args).split(), "--result-dir", str(out)]) == 0
    return RunDir.open(out)


@pytest.mark.gpu
def test_gpu_burst_graphs_exact_identity(tmp_path):
    args = "--dtype bfloat16 --concurrency 1,4 --input-len 32 --output-len 16 --repeats 1"
    run = _e2e(tmp_path / "burst", args)
    assert run.manifest["config"]["engine"]["cuda_graphs"] is True
    recs = run.read_jsonl("requests.jsonl")
    assert len(recs) == 3 * 5 and all(r["status"] == "ok" for r in recs)
    summary = run.read_json("summary.json")
    assert summary["exact_arm_mismatch"] is False, summary["exact_arm_mismatches"]
    assert summary["identity_method"] == "schedule replay" and not summary["exact_arm_unverified"]
    replays = {(r["arm"], r["cell"]): r for r in summary["replay_identity"]}
    assert replays[("exact", "C=4")]["identical"] == replays[("exact", "C=4")]["compared"] == 4
    meta = run.read_jsonl("cell_meta.jsonl")
    assert {m["max_decode_batch"] for m in meta if m["C"] == 4} == {4}
    assert run.manifest["engine_stats"]["exact"]["graph_replays"] > 0
    # every timed cell warm: no capture, no compile, no new device memory inside it
    assert not summary["cold_cells"], summary["cold_cells"]
    assert all(m["cold_work"]["device_mallocs"] == 0 for m in meta)


@pytest.mark.gpu
def test_gpu_session_prefix_hits(tmp_path):
    run = _e2e(tmp_path / "session", "--workload session --trace mooncake-tiny --max-requests 16 --repeats 2")
    summary = run.read_json("summary.json")
    assert summary["exact_arm_mismatch"] is False and not summary["exact_arm_unverified"]
    exact = [r for r in summary["replay_identity"] if r["arm"] == "exact"]
    assert exact and all(r["identical"] == r["compared"] > 0 for r in exact)
    # no capture and no compile in any timed cell; a session's eager prefill shapes depend on timing,
    # so the allocator may still grow in the first timed cell: that is reported (cold_cells), and
    # must stay the only kind of cold work
    cold = [(c["arm"], c["rep"], c["cold_work"]) for c in summary["cold_cells"]]
    assert all(not any(w.get(k) for k in ("graph_captures", "prefill_graph_captures", "compiles"))
               for _, _, w in cold), cold
    assert all(r["status"] == "ok" for r in run.read_jsonl("requests.jsonl"))
    assert all(c["measured_prefix_hit_rate"] is not None for c in run.read_json("cells.json"))


@pytest.mark.gpu
def test_gpu_rate_sweep_exact_identity_and_capacity(tmp_path):
    """A rate sweep on the GPU: probes, rising rates until every arm saturates or the sweep ends, one
    replay per rate with the exact arm identical, an SLO capacity per arm, no capture in a timed cell."""
    args = ("--dtype bfloat16 --workload rate --request-rate sweep --sweep-rates 3 --duration 2 --repeats 2 "
            "--input-len 32 --output-len 16 --max-num-seqs 16 --slo ttft:200,tpot:50")
    run = _e2e(tmp_path / "rate", args)
    sweep = run.manifest["sweep"]
    assert sweep["probes"]["sync"]["rate"] and sweep["probes"]["saturated"]["rate"] and sweep["stopped"]
    summary = run.read_json("summary.json")
    assert summary["exact_arm_mismatch"] is False and not summary["exact_arm_unverified"]
    exact = [r for r in summary["replay_identity"] if r["arm"] == "exact"]
    assert exact and all(r["identical"] == r["compared"] > 0 and r["reps"] == 1 for r in exact)
    assert {r["arm"] for r in summary["slo_capacity"]} == {"torch", "exact", "torch#2"}
    kinds = ("graph_captures", "prefill_graph_captures", "compiles")
    meta = run.read_jsonl("cell_meta.jsonl")
    assert all(not any(m["cold_work"].get(k) for k in kinds) for m in meta), [m["cold_work"] for m in meta]
