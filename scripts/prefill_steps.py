#!/usr/bin/env python3
"""GPU evidence for prefill CUDA graphs: one engine prefill step of ROWS x LEN tokens (default 4 x 512 =
2048, the step of a 512-token burst under the default 2048-token budget) per arm, eager vs graph replay.

Per arm: the step's metadata is uploaded and the step run eagerly (the engine's eager path: torch ops
for scope-graph arms) ITERS times, then captured once (as the engine does on a shape's second sighting)
and replayed ITERS times. Each timing covers upload + forward + argmax + the D2H read of the sampled
ids; CUDA events give the GPU-side span (host-bound eager steps show their launch cost there too) and
perf_counter the wall time. Also: whether replay and eager sample the same ids (and the exact arm the
torch arm's), and how much the graph pool grew for the capture (the memory that must fit in
kv_headroom_gib). Random-weight Ouro-1.4B, bf16; well under a minute on an H200.

    python scripts/prefill_steps.py --result-dir results/gpu/prefill
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.scheduler import PrefillBatch
from rltbench.kernels import ARMS, norm_onelaunch
from rltbench.models import build_model
from rltbench.results import RunDir


def time_step(fn: Callable[[], list[int]], iters: int, warmup: int = 2) -> tuple[dict[str, Any], list[int]]:
    """Median/p10/p90 (ms) of `fn` by CUDA events and by wall clock; `fn` ends in a D2H read (a sync)."""
    for _ in range(warmup):
        fn()
    ev, wall, ids = [], [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        ids = fn()
        b.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ev.append(a.elapsed_time(b))

    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]

    stats = {
        "median_ms": statistics.median(ev),
        "p10_ms": q(ev, 0.1),
        "p90_ms": q(ev, 0.9),
        "wall_median_ms": statistics.median(wall),
        "n": iters,
    }
    return stats, ids


def arm_row(engine: Engine, arm: str, prompts: list[list[int]], iters: int) -> dict[str, Any]:
    """Schedule one prefill step of `prompts`, time it eager and replayed, then abort the requests."""
    engine.set_arm(arm)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"pf-{arm}-{i}", p, params)
    batch = engine.scheduler.schedule()
    assert isinstance(batch, PrefillBatch) and batch.num_tokens == sum(map(len, prompts)), batch
    step, done = engine._prefill_layout(batch)
    assert len(done) == len(prompts)

    def eager() -> list[int]:
        engine._upload_prefill(step.packed)
        out = engine._prefill_forward(step, engine.ops)
        assert out is not None
        return out.tolist()

    eager_stats, eager_ids = time_step(eager, iters)
    torch.cuda.synchronize()
    reserved0 = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    entry = engine._capture_prefill(step)
    capture_s = time.perf_counter() - t0
    if entry is None:
        raise RuntimeError(f"{arm}: prefill capture failed (see the warning above)")
    pool_mib = (torch.cuda.memory_reserved() - reserved0) / 2**20
    graph, out = entry
    assert out is not None

    def replay() -> list[int]:
        engine._upload_prefill(step.packed)
        graph.replay()
        return out.tolist()

    graph_stats, graph_ids = time_step(replay, iters)
    for i in range(len(prompts)):
        engine.abort_request(f"pf-{arm}-{i}")
    row = {
        "arm": arm,
        "tokens": batch.num_tokens,
        "rows": len(prompts),
        "eager": eager_stats,
        "graph": graph_stats,
        "speedup": eager_stats["median_ms"] / graph_stats["median_ms"],
        "wall_speedup": eager_stats["wall_median_ms"] / graph_stats["wall_median_ms"],
        "capture_s": capture_s,
        "pool_growth_mib": pool_mib,
        "graph_ids_equal_eager": graph_ids == eager_ids,
        "eager_ids": eager_ids,
        "graph_ids": graph_ids,
    }
    print(
        f"prefill {arm} {batch.num_tokens} tok: eager {eager_stats['median_ms']:.2f} ms "
        f"(wall {eager_stats['wall_median_ms']:.2f}), graph {graph_stats['median_ms']:.2f} ms "
        f"(wall {graph_stats['wall_median_ms']:.2f}), {row['speedup']:.2f}x; capture {capture_s:.1f} s, "
        f"pool +{pool_mib:.0f} MiB; ids graph==eager {row['graph_ids_equal_eager']}",
        flush=True,
    )
    return row


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"# Prefill step, {summary['rows']} x {summary['length']} tokens (random-weight {summary['model']})",
        "",
        "| arm | eager ms (p10-p90) | eager wall ms | graph ms (p10-p90) | graph wall ms | speedup | "
        "pool MiB | ids = eager | ids = torch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["arms"]:
        e, g = r["eager"], r["graph"]
        lines.append(
            f"| {r['arm']} | {e['median_ms']:.2f} ({e['p10_ms']:.2f}-{e['p90_ms']:.2f}) | "
            f"{e['wall_median_ms']:.2f} | {g['median_ms']:.2f} ({g['p10_ms']:.2f}-{g['p90_ms']:.2f}) | "
            f"{g['wall_median_ms']:.2f} | {r['speedup']:.2f}x | {r['pool_growth_mib']:.0f} | "
            f"{r['graph_ids_equal_eager']} | {r.get('graph_ids_equal_torch', '-')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-dir", default=None)
    ap.add_argument("--model", default="ouro-1.4b")
    ap.add_argument("--arms", default="torch,exact,approx")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("prefill_steps.py needs a CUDA GPU", file=sys.stderr)
        return 2
    arms = [a for a in args.arms.split(",") if a]
    run = RunDir.create(
        "prefill",
        args.result_dir,
        argv=list(sys.argv),
        config={"model": args.model, "arms": arms, "rows": args.rows, "length": args.length,
                "iters": args.iters, "selections": {a: ARMS[a].to_dict() for a in arms},
                "random_weights": True},
    )  # fmt: skip
    model = build_model(args.model, device="cuda", dtype=torch.bfloat16, seed=0)
    norm_onelaunch.prevalidate([model.config.hidden_size], [torch.bfloat16])
    tokens = args.rows * args.length
    bs = 16
    cfg = EngineConfig(
        block_size=bs,
        num_blocks=args.rows * -(-args.length // bs) + 16,
        max_num_seqs=max(8, args.rows),
        max_num_batched_tokens=tokens,
        max_model_len=args.length + 16,
        enable_prefix_caching=False,
    )
    g = torch.Generator().manual_seed(1234)
    prompts = torch.randint(3, model.config.vocab_size, (args.rows, args.length), generator=g).tolist()
    summary: dict[str, Any] = {"model": args.model, "rows": args.rows, "length": args.length, "arms": []}
    with torch.inference_mode():
        engine = Engine(model, arms, cfg)
        for arm in arms:
            summary["arms"].append(arm_row(engine, arm, prompts, args.iters))
            run.write_json("summary.json", summary)
    ref = next((r["graph_ids"] for r in summary["arms"] if r["arm"] == "torch"), None)
    for r in summary["arms"]:
        if ref is not None:
            r["graph_ids_equal_torch"] = r["graph_ids"] == ref
    run.write_json("summary.json", summary)
    text = table(summary)
    run.write_markdown("table.md", text)
    run.update_manifest(status="complete")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
