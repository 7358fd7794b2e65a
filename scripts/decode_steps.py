#!/usr/bin/env python3
"""GPU evidence for the models and engine issues, in one run directory.

1. Plain model decode step (dense KV, CUDA graph) per arm: Ouro-1.4B random weights, batch 1,
   context 512, and whether the exact arm's logits are bitwise equal to the torch arm's.
2. Engine decode step per arm at batch 1/8/32 (context 512), arms interleaved, plus the engine's
   host overhead at batch 1 (output rate vs 1000 / graph ms).
3. A burst of 128 requests x 512/128 tokens through the engine for every arm in one job:
   completion, every KV block returned, token identity of each arm vs torch.

    python scripts/decode_steps.py --result-dir results/gpu/decode
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.bench import decode_step_table
from rltbench.kernels import ARMS, make_ops, norm_onelaunch
from rltbench.models import build_model
from rltbench.models.bench import decode_step_ms
from rltbench.results import RunDir


def model_steps(model, arms: list[str], iters: int) -> list[dict]:
    rows = []
    for arm in arms:
        r = decode_step_ms(model, make_ops(ARMS[arm]), batch=1, context=512, iters=iters)
        rows.append(
            {
                "arm": arm,
                "batch": 1,
                "context": 512,
                "median_ms": r["median_ms"],
                "p10_ms": r["p10_ms"],
                "p90_ms": r["p90_ms"],
                "n": r["iters"],
            }
        )
        print(
            f"model step {arm}: {r['median_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f})",
            flush=True,
        )
    return rows


def burst(engine: Engine, arms: list[str], n: int, input_len: int, output_len: int) -> list[dict]:
    g = torch.Generator().manual_seed(1234)
    prompts = torch.randint(3, engine.vocab_size, (n, input_len), generator=g).tolist()
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    rows, ref = [], None
    for arm in arms:
        engine.set_arm(arm)
        engine.warmup(max_context=input_len + output_len)
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        secs = time.perf_counter() - t0
        toks = [o.token_ids for o in outs]
        st = engine.stats()
        if ref is None:
            ref = toks
        same = sum(a == b for a, b in zip(toks, ref, strict=True))
        rows.append(
            {
                "arm": arm,
                "requests": n,
                "completed": sum(len(t) == output_len for t in toks),
                "seconds": secs,
                "output_tok_s": n * output_len / secs,
                "identical_to_torch": same,
                "free_blocks": st["free_blocks"],
                "total_blocks": st["total_blocks"],
                "all_blocks_returned": st["free_blocks"] == st["total_blocks"],
            }
        )
        print(f"burst {arm}: {rows[-1]}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-dir", default=None)
    ap.add_argument("--model", default="ouro-1.4b")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--skip-burst", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_steps.py needs a CUDA GPU", file=sys.stderr)
        return 2
    arms = ["torch", "exact", "approx"]
    run = RunDir.create(
        "decode",
        args.result_dir,
        config={
            "model": args.model,
            "arms": arms,
            "selections": {a: ARMS[a].to_dict() for a in arms},
            "random_weights": True,
        },
    )
    torch.manual_seed(0)
    model = build_model(args.model, device="cuda", dtype=torch.bfloat16, seed=0)
    # validate the one-launch exact norm before any capture (never validated inside a capture)
    norm_onelaunch.prevalidate([model.config.hidden_size], [torch.bfloat16])
    summary: dict = {"model": args.model, "random_weights": True}
    with torch.inference_mode():
        summary["model_step"] = model_steps(model, arms, args.iters)
        run.write_json("summary.json", summary)
        engine = Engine(model, arms, EngineConfig(max_model_len=1024, max_num_seqs=128))
        table = decode_step_table(
            engine, arms, batch_sizes=(1, 8, 32), context_len=512, iters=args.iters // 2
        )
        summary["engine_step"] = table["rows"]
        summary["host_overhead"] = table["host_overhead"]
        summary["engine_stats"] = engine.stats()
        run.write_json("summary.json", summary)
        for r in table["rows"]:
            print(f"engine step {r['arm']} b={r['batch']}: {r['median_ms']:.3f} ms", flush=True)
        for r in table["host_overhead"]:
            print(f"host overhead {r['arm']}: ratio {r['ratio']:.3f}", flush=True)
        if not args.skip_burst:
            summary["burst"] = burst(engine, arms, 128, 512, 128)
    run.write_json("summary.json", summary)
    lines = [
        "# Decode steps and burst (random-weight " + args.model + ")",
        "",
        "| arm | model step ms (p10-p90) |",
        "|---|---|",
    ]
    lines += [
        f"| {r['arm']} | {r['median_ms']:.3f} ({r['p10_ms']:.3f}-{r['p90_ms']:.3f}) |"
        for r in summary["model_step"]
    ]
    lines += ["", "| arm | batch | engine step ms (p10-p90) | vs torch |", "|---|---|---|---|"]
    base = {r["batch"]: r["median_ms"] for r in summary["engine_step"] if r["arm"] == "torch"}
    lines += [
        f"| {r['arm']} | {r['batch']} | {r['median_ms']:.3f} ({r['p10']:.3f}-{r['p90']:.3f}) | "
        f"{r['median_ms'] / base[r['batch']]:.3f}x |"
        for r in summary["engine_step"]
    ]
    lines += ["", "| arm | graph ms | engine tok/s | 1000/graph ms | ratio |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['arm']} | {r['graph_ms']:.3f} | {r['tokens_per_s']:.1f} | {r['graph_tokens_per_s']:.1f} | "
        f"{r['ratio']:.3f} |"
        for r in summary["host_overhead"]
    ]
    if "burst" in summary:
        lines += [
            "",
            "| arm | completed | s | out tok/s | identical to torch | all blocks returned |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['arm']} | {r['completed']}/{r['requests']} | {r['seconds']:.2f} | "
            f"{r['output_tok_s']:.0f} | "
            f"{r['identical_to_torch']}/{r['requests']} | {r['all_blocks_returned']} |"
            for r in summary["burst"]
        ]
    run.write_markdown("table.md", "\n".join(lines))
    run.update_manifest(status="complete")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
