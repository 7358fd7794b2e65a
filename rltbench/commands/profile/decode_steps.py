"""GPU evidence for the models and engine decode steps, in one run directory. Every timing: each cell
warmed first (graph captured, kernels compiled), arms ABBA over repetitions with an A/A arm (torch#2),
a ColdWork check per timed cell, speedups as paired intervals labelled against the A/A spread.

1. Plain model decode step (dense KV, CUDA graph) per arm: Ouro-1.4B random weights, batch 1,
   context 512, and whether the exact arm's logits are bitwise equal to the torch arm's.
2. Engine decode step per arm at batch 1/8/32 (context 512): the same figure as `rltbench profile`
   (rltbench.bench.decode: same engine sizing, context class and timing routine), plus the engine's
   host overhead at batch 1 (output rate vs 1000 / graph ms).
3. With --attribute: the batch-1 engine step of torch, exact and torch#2 in four engines, context
   class capped at context + 64 (how `profile` once sized its engine) or the serving class, times a
   KV pool for one request or the serving pool: which of the two moved the figure.
4. A burst of 128 requests x 512/128 tokens through the engine for every arm in one job:
   completion, every KV block returned, token identity of each arm vs torch.

    rltbench profile --bench decode --result-dir results/gpu/decode
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rltbench.bench.decode import (
    BLOCK_SIZE,
    decode_engine_config,
    decode_step_cells,
    decode_step_table,
    serving_len_class,
)
from rltbench.bench.model_step import capture_step, fill_random_kv, time_replays
from rltbench.bench.warmth import ColdWork, cold_cells
from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.errors import UsageError
from rltbench.kernels import ARMS, make_ops
from rltbench.kernels.norm import onelaunch as norm_onelaunch
from rltbench.models import build_model
from rltbench.results import RunDir
from rltbench.results.quantiles import summarize
from rltbench.results.stats import aa_name, abba_order, compare_to_reference, format_interval, format_spread
from rltbench.results.stats import rep_medians as medians_of

REF = "torch"
CONTEXT = 512


def model_steps(model: Any, arms: list[str], reps: int, iters: int, context: int = CONTEXT) -> dict[str, Any]:
    """Dense-KV decode step per arm (batch 1): every arm's graph captured and warmed, then timed ABBA;
    the exact arm's logits compared bitwise with the torch arm's."""
    device = model.device
    graphs: dict[str, tuple[Any, dict[str, torch.Tensor]]] = {}
    for arm in arms:
        cache = model.new_kv_cache(max_seqs=1, max_len=context + 1)
        fill_random_kv(cache, context, seed=0)
        gen = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1,), generator=gen, device=device)
        pos = torch.full((1,), context, dtype=torch.long, device=device)
        graph, outs = capture_step(model, make_ops(ARMS[arm.split("#")[0]]), cache, ids, pos,
                                   torch.arange(1, device=device), rows_are_seqs=True)  # fmt: skip
        time_replays(graph.replay, iters=1, warmup=3)
        graphs[arm] = (graph, outs)
    samples: dict[str, list[list[float]]] = {a: [] for a in arms}
    warm = []
    order = abba_order(arms, reps)
    for i, arm in enumerate(order):
        with ColdWork(device=device) as cold:
            samples[arm].append(time_replays(graphs[arm][0].replay, iters, warmup=2))
        warm.append({"arm": arm, "rep": i // len(arms), **cold.record()})
    torch.cuda.synchronize()
    logits = {a: graphs[a][1]["logits"] for a in arms}
    rows = []
    for arm in arms:
        s = summarize([x for r in samples[arm] for x in r])
        rows.append({"arm": arm, "batch": 1, "context": context, "median_ms": s.median, "p10_ms": s.p10,
                     "p90_ms": s.p90, "n": s.n, "rep_median_ms": medians_of(samples[arm]),
                     "logits_equal_torch": bool(torch.equal(logits[arm], logits[REF]))})  # fmt: skip
    per_rep = {r["arm"]: r["rep_median_ms"] for r in rows}
    aa = aa_name(REF) if aa_name(REF) in arms else None
    return {"rows": rows, "speedups": compare_to_reference(per_rep, REF, aa), "warm": warm, "order": order}


def attribution(
    model: Any, arms: list[str], reps: int, iters: int, context: int = CONTEXT, warmup: int = 3
) -> list[dict]:
    """Batch-1 engine step in four engines: context class capped at context + 64 or the serving
    class, times a KV pool for one request or the serving pool (one engine at a time)."""
    rows = []
    for class_name, max_len in (("capped", context + 64), ("serving", serving_len_class(context + 1))):
        for pool_name in ("one request", "serving"):
            blocks = -(-max_len // BLOCK_SIZE) + 8 if pool_name == "one request" else None
            cfg = EngineConfig(block_size=BLOCK_SIZE, max_num_seqs=1, max_model_len=max_len,
                               num_blocks=blocks, enable_prefix_caching=False)  # fmt: skip
            engine = Engine(model, {a: ARMS[a.split("#")[0]] for a in arms}, cfg)
            cells = decode_step_cells(engine, arms, [1], context, reps=reps, iters=iters, warmup=warmup)
            per_rep = {a: medians_of(cells.samples[(a, 1)]) for a in arms}
            aa = aa_name(REF) if aa_name(REF) in arms else None
            rows.append({
                "context": context, "context_class": cells.len_class[1], "class": class_name,
                "pool": pool_name, "num_blocks": engine.num_blocks,
                "median_ms": {a: summarize(cells.pooled(a, 1)).median for a in arms},
                "speedups": compare_to_reference(per_rep, REF, aa), "cold_cells": cold_cells(cells.warm),
            })  # fmt: skip
            print(f"attribution class {cells.len_class[1]} pool {engine.num_blocks} blocks: "
                  f"{rows[-1]['median_ms']}", flush=True)  # fmt: skip
            del engine, cells
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def burst(engine: Engine, arms: list[str], n: int, input_len: int, output_len: int) -> list[dict]:
    g = torch.Generator().manual_seed(1234)
    prompts = torch.randint(3, engine.vocab_size, (n, input_len), generator=g).tolist()
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    rows, ref = [], None
    for arm in arms:
        engine.set_arm(arm)
        engine.runner.warmup(max_context=input_len + output_len)
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


def _speedup_cells(r: dict[str, Any]) -> str:
    return f"{format_interval(r['speedup'])} | {format_spread(r['aa_spread'])} | {r['label']}"


def _cold_line(records: list[dict[str, Any]]) -> str:
    cold = cold_cells(records)
    if not cold:
        return f"All {len(records)} timed cells warm (no capture, compile or device malloc inside any)."
    return f"**{len(cold)} of {len(records)} timed cells were not warm**: " + ", ".join(
        f"{c['arm']} b={c.get('batch', 1)} rep {c['rep']}" for c in cold
    )


def table(summary: dict[str, Any]) -> str:
    """table.md from summary.json."""
    lines = [
        f"# Decode steps and burst (random-weight {summary['model']})",
        "",
        "GPU ms per step: CUDA events around back-to-back graph replays (no host work, no upload, no D2H "
        "read); median and p10-p90 over all samples of every repetition. Arms ABBA over repetitions; "
        "speedup = median of per-repetition torch/arm ratios with its order-statistic interval; within "
        "noise = the interval reaches into the A/A spread (torch vs torch#2). docs/measurement.md.",
        "",
    ]
    m = summary["model_step"]
    sp = {r["arm"]: r for r in m["speedups"]}
    lines += [f"## Plain model step (dense KV), batch 1, context {CONTEXT}", "", _cold_line(m["warm"]), "",
              "| arm | ms (p10-p90) | speedup vs torch (interval) | A/A spread | label | logits = torch |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [
        f"| {r['arm']} | {r['median_ms']:.3f} ({r['p10_ms']:.3f}-{r['p90_ms']:.3f}) | "
        f"{_speedup_cells(sp[r['arm']]) if r['arm'] in sp else '1.000x | - | reference'} | "
        f"{r['logits_equal_torch']} |"
        for r in m["rows"]
    ]
    e = summary["engine_step"]
    sp = {(r["batch"], r["arm"]): r for r in e["speedups"]}
    lines += ["", f"## Engine decode step, context {e['context_len']} (the `rltbench profile` figure)", "",
              _cold_line(e["warm"]), "",
              "| arm | batch | class | bucket | ms (p10-p90) | speedup vs torch (interval) | A/A spread "
              "| label |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in e["rows"]:
        key = (r["batch"], r["arm"])
        lines.append(
            f"| {r['arm']} | {r['batch']} | {r['len_class']} | {r['bucket']} | {r['median_ms']:.3f} "
            f"({r['p10']:.3f}-{r['p90']:.3f}) | "
            f"{_speedup_cells(sp[key]) if key in sp else '1.000x | - | reference'} |"
        )
    lines += ["", "| arm | graph ms | engine tok/s | 1000/graph ms | ratio |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['arm']} | {r['graph_ms']:.3f} | {r['tokens_per_s']:.1f} | {r['graph_tokens_per_s']:.1f} | "
        f"{r['ratio']:.3f} |"
        for r in e["host_overhead"]
    ]
    if summary.get("attribution"):
        first = summary["attribution"][0]
        arms = list(first["median_ms"])
        lines += ["", f"## Attribution: batch-1 engine step, context {first['context']}", "",
                  "| context class | KV pool (blocks) | " + " | ".join(f"{a} ms" for a in arms)
                  + " | exact vs torch | A/A spread | label |", "|" + "---|" * (len(arms) + 5)]  # fmt: skip
        for r in summary["attribution"]:
            ex = next((s for s in r["speedups"] if s["arm"] == "exact"), None)
            lines.append(
                f"| {r['context_class']} ({r['class']}) | {r['pool']} ({r['num_blocks']}) | "
                + " | ".join(f"{r['median_ms'][a]:.3f}" for a in arms)
                + f" | {_speedup_cells(ex) if ex else '- | - | -'} |"
            )
    if "burst" in summary:
        lines += [
            "",
            "| arm | completed | s | out tok/s | identical to torch | all blocks returned |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['arm']} | {r['completed']}/{r['requests']} | {r['seconds']:.2f} | {r['output_tok_s']:.0f} "
            f"| {r['identical_to_torch']}/{r['requests']} | {r['all_blocks_returned']} |"
            for r in summary["burst"]
        ]
    return "\n".join(lines)


def run_decode_steps(model_name: str, reps: int, iters: int, attribute: bool, skip_burst: bool,
                     result_dir: Path | None) -> str:
    """`rltbench profile --bench decode`: the run directory's table (UsageError before any work)."""
    if not torch.cuda.is_available():
        raise UsageError("--bench decode needs a CUDA GPU")
    arms = ["torch", "exact", "approx", aa_name(REF)]
    run = RunDir.create(
        "decode",
        result_dir,
        argv=list(sys.argv),
        config={"model": model_name, "arms": arms, "reps": reps, "iters": iters,
                "selections": {a: ARMS[a.split("#")[0]].to_dict() for a in arms}, "random_weights": True},
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(model_name, device="cuda", dtype=torch.bfloat16, seed=0)
    # validate the one-launch exact norm before any capture (never validated inside a capture)
    norm_onelaunch.prevalidate([model.config.hidden_size], [torch.bfloat16])
    summary: dict[str, Any] = {"model": model_name, "random_weights": True}
    try:
        with torch.inference_mode():
            summary["model_step"] = model_steps(model, arms, reps, iters)
            run.write_json("summary.json", summary)
            if attribute:
                attr_arms = [REF, "exact", aa_name(REF)]
                summary["attribution"] = attribution(model, attr_arms, reps, iters)
                run.write_json("summary.json", summary)
            cfg = decode_engine_config(128, CONTEXT, extra_tokens=128,
                                       model_max_len=int(model.config.max_position_embeddings))  # fmt: skip
            engine = Engine(model, {a: ARMS[a.split("#")[0]] for a in arms}, cfg)
            summary["engine_step"] = decode_step_table(
                engine, arms, batch_sizes=(1, 8, 32), context_len=CONTEXT, iters=iters, reps=reps
            )
            summary["engine_step"]["num_blocks"] = engine.num_blocks
            summary["engine_stats"] = engine.stats()
            run.write_json("summary.json", summary)
            for r in summary["engine_step"]["rows"]:
                print(f"engine step {r['arm']} b={r['batch']}: {r['median_ms']:.3f} ms", flush=True)
            if not skip_burst:
                summary["burst"] = burst(engine, arms[:3], 128, CONTEXT, 128)
    except BaseException as exc:
        run.write_json("summary.json", summary)
        run.mark_ended(exc)
        raise
    return run.finish(table(summary), summary=summary)
