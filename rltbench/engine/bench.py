"""Decode-step timing table for the lead's GPU script: arms interleaved, plus host overhead at batch 1.

`decode_step_table` times the engine's captured decode step (`Engine.decode_benchmark`) for every
(arm, batch) with the arms interleaved A B C C B A ..., pooling each cell's samples over the passes,
and checks the engine's own loop: at batch 1 the output rate of `generate` (tokens/s between the first
and last decode token) against 1000 / graph_ms of a replay at a similar context. The brief's target is
ratio >= 0.9 (host work per step well under 10% of a ~9-16 ms Ouro-1.4B step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rltbench.engine.decode_bench import summarize_ms
from rltbench.engine.types import SamplingParams

if TYPE_CHECKING:
    from rltbench.engine.engine import Engine


def interleaved_order(arms: Sequence[str], passes: int) -> list[str]:
    """A B C, C B A, A B C, ... (`passes` sweeps)."""
    out: list[str] = []
    for i in range(passes):
        out.extend(arms if i % 2 == 0 else list(reversed(arms)))
    return out


def decode_step_table(
    engine: Engine,
    arms: Iterable[str] | None = None,
    batch_sizes: Sequence[int] = (1, 8, 32),
    context_len: int = 512,
    iters: int = 50,
    warmup: int = 5,
    passes: int = 2,
    host_tokens: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Returns {"rows": [{arm, batch, median_ms, p10, p90, n}], "host_overhead": [{arm, graph_ms,
    tokens_per_s, graph_tokens_per_s, ratio, n_tokens}], "order": [...]}. Leaves the engine idle on the
    last arm of the order (its pool and prefix cache reset)."""
    names = list(arms) if arms is not None else engine.arm_names
    order = interleaved_order(names, passes)
    samples: dict[tuple[str, int], list[float]] = {(a, b): [] for a in names for b in batch_sizes}
    for arm in order:
        engine.set_arm(arm)
        engine.warmup(batch_sizes, max_context=context_len + 1)
        for b in batch_sizes:
            with engine.decode_benchmark(b, context_len) as bench:
                samples[(arm, b)].extend(bench.time_ms(iters=iters, warmup=warmup)["samples"])
    rows = []
    for a in names:
        for b in batch_sizes:
            s = summarize_ms(samples[(a, b)])
            rows.append(dict(arm=a, batch=b, median_ms=s["median"], p10=s["p10"], p90=s["p90"], n=s["n"]))
    host = [host_overhead(engine, a, context_len, host_tokens, iters, warmup, seed) for a in names]
    return dict(rows=rows, host_overhead=host, order=order, context_len=context_len)


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
    engine.warmup([1], max_context=context_len + n_tokens)
    mid = context_len + n_tokens // 2
    with engine.decode_benchmark(1, mid) as bench:
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
