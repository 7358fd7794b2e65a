"""GPU evidence for Ouro's compute-saving exit: the engine decode step that runs every loop against
the same step in the compute-saving mode (`--exit-mode stop`), timed interleaved in one process.

Why a benchmark of its own: the e2e scenario runs the two modes as separate runs (their tokens differ,
so each mode is its own identity group), and separate runs minutes apart also differ by the GPU's
own drift. Here both engines hold their decode graphs at once and every runner is timed in the same
ABBA rounds with an A/A copy of the reference (rltbench.bench.timing.time_interleaved, CUDA events,
a ColdWork check around the timed samples). Runners per batch (synthetic rows at one context, the
exact arm's graphs, Ouro-1.4B with random bf16 weights and exit threshold Q):

  every-loop      the plain one-graph step (the reference)
  every-loop#2    the same graph again (A/A: the noise floor)
  stop            the compute-saving step: a graph per loop, a host read of "every row has exited"
                  after each, stopping there (loops run are recorded)
  stop-all-loops  the compute-saving step with every loop run (flags read, never acted on): what the
                  mode costs where no row exits early

Random weights: the synthetic rows exit where the random gate sends them, not where a workload's
tokens would; `stop` shows the step at that depth, `stop-all-loops` the mode's overhead.

    rltbench profile --bench exit --result-dir results/gpu/exit-stop-steps
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from rltbench.arms import ArmSpec
from rltbench.bench import timing
from rltbench.bench.warmth import ColdWork
from rltbench.engine import Engine, EngineConfig
from rltbench.errors import UsageError
from rltbench.kernels.norm import onelaunch as norm_onelaunch
from rltbench.models import build_model
from rltbench.results import RunDir
from rltbench.results.stats import compare_to_reference, format_interval, format_spread, rep_medians

REF, AA, STOP, STOP_ALL = "every-loop", "every-loop#2", "stop", "stop-all-loops"


def _engine(model: Any, rows: int) -> Engine:
    return Engine(model, {"exact": ArmSpec.exact("graph")},
                  EngineConfig(max_num_seqs=rows, max_model_len=512, kv_cache_gib=4,
                               graph_batch_sizes=[rows]))


def _stop_all_loops(staged: Any) -> None:
    """Every loop graph, each flag read as the mode reads it, none acted on."""
    for graph, flag in zip(staged.loops[:-1], staged.flags, strict=True):
        graph.replay()
        bool(flag)
    staged.loops[-1].replay()


def cell(model_every: Any, model_stop: Any, rows: int, context: int, rounds: int,
         reps: int) -> dict[str, Any]:
    """One batch size: both engines' decode graphs for `rows` synthetic rows, every runner timed."""
    engines = {False: _engine(model_every, rows), True: _engine(model_stop, rows)}
    per_row = context // 16 + 1  # blocks of 16 tokens holding the context and the new token
    tables = [[r * per_row + b for b in range(per_row)] for r in range(rows)]
    graphs = {}
    for stop, eng in engines.items():
        eng.runner.open_synthetic_decode(tables, context, rows)
        entry = eng.runner.decode_graph(rows, eng.runner.len_class(context + 1))
        assert entry is not None
        graphs[stop] = entry[0]
    loops_run: list[int] = []
    runners = {
        REF: graphs[False].replay,
        AA: graphs[False].replay,
        STOP: lambda: loops_run.append(graphs[True].replay()),
        STOP_ALL: lambda: _stop_all_loops(graphs[True]),
    }
    cold = ColdWork(engines[True])
    samples = timing.time_interleaved(runners, rounds=rounds, reps=reps, window=cold)
    for eng in engines.values():
        eng.runner.close_synthetic_decode()
    per_rep = {n: rep_medians([s[i * reps:(i + 1) * reps] for i in range(rounds)])
               for n, s in samples.items()}
    stats = {n: timing.summarize(s).to_dict("us_") for n, s in samples.items()}
    return {"rows": rows, "context": context, "stats": stats, "per_rep_us": per_rep,
            "speedups": compare_to_reference(per_rep, REF, AA), "cold_work": cold.counts,
            "warm": cold.warm,
            "stop_loops_mean": sum(loops_run) / len(loops_run) if loops_run else None,
            "stop_loops_hist": {k: loops_run.count(k) for k in sorted(set(loops_run))}}


def table(summary: dict[str, Any]) -> str:
    lines = [f"# Ouro compute-saving exit: the decode step, every loop vs stop ({summary['model']}, random "
             f"weights, exit threshold {summary['threshold']})", "",
             "Interleaved in one process (ABBA rounds, CUDA events); speedup = every-loop / runner, its 95% "
             "interval over rounds; the A/A row is the reference timed again.", "",
             "| batch | runner | median us | p10 / p90 | speedup vs every-loop | A/A spread | verdict "
             "| loops run |",
             "|---|---|---|---|---|---|---|---|"]
    for c in summary["cells"]:
        by_arm = {r["arm"]: r for r in c["speedups"]}
        for name, s in c["stats"].items():
            r = by_arm.get(name)
            loops = f"{c['stop_loops_mean']:.2f} {c['stop_loops_hist']}" if name == STOP else "all"
            speed = format_interval(r.get("speedup")) if r else "(ref)"
            spread, label = (format_spread(r.get("aa_spread")), r.get("label", "-")) if r else ("-", "-")
            lines.append(f"| {c['rows']} | {name} | {s['us_median']:.1f} | {s['us_p10']:.1f} / "
                         f"{s['us_p90']:.1f} | {speed} | {spread} | {label} | {loops} |")
        lines.append("")
    warm = all(c["warm"] for c in summary["cells"])
    lines.append(f"Cold work in the timed samples: {'none' if warm else 'see summary.json'}.")
    return "\n".join(lines) + "\n"


def run_exit_steps(model_name: str, threshold: float, batches: list[int], context: int, rounds: int,
                   reps: int, result_dir: Path | None) -> str:
    """`rltbench profile --bench exit`: the run directory's table (UsageError before any work)."""
    if not torch.cuda.is_available():
        raise UsageError("--bench exit needs a CUDA GPU")
    config = {"model": model_name, "threshold": threshold, "batches": batches,
              "context": context, "rounds": rounds, "reps": reps, "arm": "exact (scope graph)",
              "random_weights": True}
    run = RunDir.create("exit-stop-steps", result_dir, argv=sys.argv, config=config)
    summary: dict[str, Any] = {"model": model_name, "threshold": threshold, "cells": []}
    try:
        models = [build_model(model_name, device="cuda", dtype=torch.bfloat16, seed=0,
                              early_exit_threshold=threshold, stop_at_exit=stop)
                  for stop in (False, True)]
        norm_onelaunch.prevalidate([models[0].config.hidden_size], [torch.bfloat16])
        with torch.inference_mode():
            for rows in batches:
                summary["cells"].append(cell(*models, rows, context, rounds, reps))
                run.write_json("summary.json", summary)
                print(f"batch {rows}: done", flush=True)
    except BaseException as exc:
        run.write_json("summary.json", summary)
        run.mark_ended(exc)
        raise
    return run.finish(table(summary), summary=summary)
