"""The engine's decode-step figure: one engine sizing and one timing routine for `rltbench profile`
and the decode table of scripts/decode_steps.py, so both report the same number for the same
(model, batch, context, arm).

What a decode-step figure is (docs/measurement.md): GPU time between two CUDA events around one
replay of the engine's captured decode graph (embedding, every loop, LM head, in-graph argmax), the
replays issued back to back; no host work, no metadata upload, no read of the sampled ids. Two things
decide it beyond (model, batch, context, arm) and are therefore fixed here and recorded:
- the decode graph's context class (`ModelRunner.len_class`): attention covers a power of two >= seq_len
  positions, capped by max_model_len; `decode_engine_config` sizes max_model_len so that the class
  of `context + 1` is never capped, as in a serving engine (context 512 -> class 1024);
- the batch bucket: a batch runs in the smallest graph bucket that holds it (padded rows).

`decode_step_cells` warms every (arm, batch) first (the graph captured, kernels compiled), then times
the arms ABBA over repetitions, each cell inside a `ColdWork` (no capture, compile or device malloc);
`decode_step_table` adds the paired speedups, the A/A spread and their labels, and the batch-1 host
overhead check (engine output rate vs 1000 / graph ms, target >= 0.9).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rltbench.bench.decode_benchmark import DecodeBenchmark
from rltbench.bench.warmth import ColdWork
from rltbench.engine.engine import Engine
from rltbench.engine.runner import MIN_LEN_CLASS
from rltbench.engine.types import EngineConfig, SamplingParams
from rltbench.results.quantiles import summarize
from rltbench.results.stats import aa_name, abba_order, compare_to_reference, rep_medians

BLOCK_SIZE = 16


def serving_len_class(seq_len: int, block_size: int = BLOCK_SIZE) -> int:
    """The decode context class of `seq_len` in an engine whose max_model_len does not cap it (the
    uncapped branch of `ModelRunner.len_class`)."""
    c = max(MIN_LEN_CLASS, block_size)
    while c < seq_len:
        c *= 2
    return c


def decode_engine_config(
    max_batch: int,
    context_len: int,
    extra_tokens: int = 64,
    use_cuda_graph: bool = True,
    num_blocks: int | None = None,
    model_max_len: int | None = None,
) -> EngineConfig:
    """The engine a decode-step figure is measured in: max_model_len at least the serving context
    class of `context_len + 1` (so the class is the one a serving engine uses; a model whose context
    `model_max_len` is shorter caps it, as it caps a serving engine) and room for `extra_tokens`
    generated tokens; default graph buckets up to `max_batch`; the KV pool as a serving engine sizes
    it (free GPU memory minus headroom) unless `num_blocks` is given (CPU)."""
    max_len = max(context_len + extra_tokens, serving_len_class(context_len + 1))
    if model_max_len is not None:
        max_len = min(max_len, max(model_max_len, context_len + extra_tokens))
    return EngineConfig(
        block_size=BLOCK_SIZE,
        max_num_seqs=max_batch,
        max_num_batched_tokens=max(2048, context_len + 1),
        enable_prefix_caching=False,
        use_cuda_graph=use_cuda_graph,
        num_blocks=num_blocks,
        max_model_len=max_len,
    )


@dataclass
class DecodeCells:
    """Samples (ms) per (arm, batch), one list per repetition in repetition order; the warm-check
    record of every timed cell; the context class and bucket each batch ran in."""

    samples: dict[tuple[str, int], list[list[float]]]
    warm: list[dict[str, Any]]
    order: list[str]
    len_class: dict[int, int] = field(default_factory=dict)
    bucket: dict[int, int] = field(default_factory=dict)

    def pooled(self, arm: str, batch: int) -> list[float]:
        return [x for rep in self.samples[(arm, batch)] for x in rep]


def decode_step_cells(
    engine: Engine,
    arms: Sequence[str],
    batch_sizes: Sequence[int],
    context_len: int,
    reps: int = 4,
    iters: int = 25,
    warmup: int = 3,
) -> DecodeCells:
    """Warm every (arm, batch) (graph captured, kernels compiled, `warmup` replays), then time
    `iters` replays per cell with the arms in ABBA order over `reps` repetitions. Each timed cell
    re-creates the benchmark (the pool is shared by the arms) and runs inside a ColdWork."""
    cuda = engine.device.type == "cuda"
    cells = DecodeCells({(a, b): [] for a in arms for b in batch_sizes}, [], abba_order(arms, reps))
    for arm in arms:
        engine.set_arm(arm)
        for b in batch_sizes:
            with DecodeBenchmark(engine, b, context_len) as bench:
                for _ in range(warmup):
                    bench.replay()
                cells.len_class[b], cells.bucket[b] = bench.len_class, bench.rows
    if cuda:
        torch.cuda.synchronize(engine.device)
    for i, arm in enumerate(cells.order):
        rep = i // len(arms)
        engine.set_arm(arm)
        for b in batch_sizes:
            with ColdWork(engine) as cold:
                with DecodeBenchmark(engine, b, context_len) as bench:
                    samples = bench.time_ms(iters=iters, warmup=min(warmup, 2))["samples"]
            cells.samples[(arm, b)].append(samples)
            cells.warm.append({"arm": arm, "batch": b, "rep": rep, **cold.record()})
    return cells


def decode_step_table(engine: Engine, arms: Iterable[str] | None = None,
                      batch_sizes: Sequence[int] = (1, 8, 32), context_len: int = 512, iters: int = 25,
                      warmup: int = 3, reps: int = 4, host_tokens: int = 64, seed: int = 0,
                      ref: str | None = None) -> dict[str, Any]:
    """Returns {"rows": [{arm, batch, median_ms, p10, p90, n, len_class, bucket, rep_median_ms}],
    "speedups": [{batch, arm, ref, speedup (interval), aa_spread, label}], "warm": [...],
    "host_overhead": [...], "order": [...]}. The reference is `ref` (default: torch if present, else
    the first arm); its A/A arm is `<ref>#2` when the engine has one. Leaves the engine idle."""
    names = list(arms) if arms is not None else engine.arm_names
    ref = ref or ("torch" if "torch" in names else names[0])
    aa = aa_name(ref) if aa_name(ref) in names else None
    cells = decode_step_cells(engine, names, batch_sizes, context_len, reps, iters, warmup)
    rows, speedups = [], []
    for b in batch_sizes:
        per_rep = {a: rep_medians(cells.samples[(a, b)]) for a in names}
        for a in names:
            s = summarize(cells.pooled(a, b))
            rows.append(
                dict(arm=a, batch=b, median_ms=s.median, p10=s.p10, p90=s.p90, n=s.n,
                     len_class=cells.len_class[b], bucket=cells.bucket[b], rep_median_ms=per_rep[a])
            )  # fmt: skip
        speedups += [{"batch": b, **r} for r in compare_to_reference(per_rep, ref, aa)]
    host = [host_overhead(engine, a, context_len, host_tokens, iters, warmup, seed) for a in names]
    return dict(rows=rows, speedups=speedups, warm=cells.warm, host_overhead=host, order=cells.order,
                context_len=context_len, ref=ref, aa=aa)  # fmt: skip


def host_overhead(
    engine: Engine,
    arm: str,
    context_len: int,
    n_tokens: int = 64,
    iters: int = 50,
    warmup: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Batch-1 output rate of the engine loop vs the graph replay rate at the mid context."""
    engine.set_arm(arm)
    engine.runner.warmup([1], max_context=context_len + n_tokens)
    mid = context_len + n_tokens // 2
    with DecodeBenchmark(engine, 1, mid) as bench:
        graph_ms = bench.time_ms(iters=iters, warmup=warmup)["median"]
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, engine.vocab_size, (context_len,), generator=g).tolist()
    out = engine.generate([prompt], SamplingParams(max_tokens=n_tokens, ignore_eos=True))[0]
    engine.reset_prefix_cache()
    t = np.asarray(out.times)
    rate = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else float("nan")
    graph_rate = 1000.0 / graph_ms if graph_ms > 0 else float("nan")
    return dict(
        arm=arm,
        graph_ms=graph_ms,
        tokens_per_s=rate,
        graph_tokens_per_s=graph_rate,
        ratio=rate / graph_rate,
        n_tokens=len(t),
        context_len=context_len,
    )
