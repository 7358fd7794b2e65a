"""GPU helpers: capture one model step in a CUDA graph, and time a captured decode step.

`decode_step_ms` is the figure behind "Ouro-1.4B batch-1 decode step" in the GPU script: a dense KV
cache whose first `context` positions hold random K/V, one new token per sequence at position
`context`, the whole step (embedding, all loops, LM head, argmax) captured once and replayed; each
replay is timed with CUDA events (warm-up replays excluded), and median / p10 / p90 are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rltbench.bench.timing import time_calls
from rltbench.models.base import LoopedModel
from rltbench.models.dense_kv import DenseKVCache
from rltbench.results.quantiles import summarize


def capture_step(
    model: LoopedModel,
    ops: Any,
    cache: DenseKVCache,
    input_ids: Tensor,
    positions: Tensor,
    seq_ids: Tensor,
    rows_are_seqs: bool,
    with_head: bool = True,
    warmup: int = 2,
) -> tuple[torch.cuda.CUDAGraph, dict[str, Tensor]]:
    """Capture `forward` (+ logits and argmax) over the static inputs into a CUDA graph.

    The input tensors are the graph's static buffers: update them in place between replays. Warm-up
    runs (eager, on a side stream, as PyTorch recommends) happen before capture and write K/V at the
    given positions. Returns the graph and its static outputs {"hidden", "logits", "next_token"}.
    """

    def step() -> dict[str, Tensor]:
        cache.begin_static(seq_ids, positions, rows_are_seqs=rows_are_seqs)
        hidden = model.forward(input_ids, positions, cache, ops)
        out = {"hidden": hidden}
        if with_head:
            out["logits"] = model.compute_logits(hidden)
            out["next_token"] = out["logits"].argmax(dim=-1)
        return out

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = step()
    torch.cuda.synchronize()
    return graph, outputs


def fill_random_kv(cache: DenseKVCache, length: int, seed: int = 0) -> None:
    """Random K/V (N(0,1) in the cache dtype) at positions [0, length) of every plane and sequence."""
    gen = torch.Generator(device=cache.k.device).manual_seed(seed)
    for buf in (cache.k, cache.v):
        view = buf[:, :, :, :length]
        view.copy_(torch.randn(view.shape, generator=gen, device=buf.device, dtype=torch.float32))


def time_replays(replay: Callable[[], None], iters: int, warmup: int = 10) -> list[float]:
    """Per-call milliseconds of `replay()` measured with CUDA events (after `warmup` untimed calls)."""
    return time_calls(replay, iters, warmup)


def decode_step_ms(
    model: LoopedModel, ops: Any, batch: int = 1, context: int = 512, iters: int = 100, seed: int = 0
) -> dict[str, Any]:
    """Time one captured decode step (batch sequences, each with `context` cached tokens).

    Returns {"median_ms", "p10_ms", "p90_ms", "mean_ms", "iters", "batch", "context", "num_kv_planes",
    "kv_cache_bytes", "samples_ms"}. Requires a CUDA model.
    """
    if model.device.type != "cuda":
        raise RuntimeError("decode_step_ms needs a model on a CUDA device")
    device = model.device
    cache = model.new_kv_cache(max_seqs=batch, max_len=context + 1)
    fill_random_kv(cache, context, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    input_ids = torch.randint(0, model.config.vocab_size, (batch,), generator=gen, device=device)
    positions = torch.full((batch,), context, dtype=torch.long, device=device)
    seq_ids = torch.arange(batch, device=device)
    graph, _ = capture_step(model, ops, cache, input_ids, positions, seq_ids, rows_are_seqs=True)
    samples = time_replays(graph.replay, iters)
    q = summarize(samples)
    return {
        "median_ms": q.median,
        "p10_ms": q.p10,
        "p90_ms": q.p90,
        "mean_ms": q.mean,
        "iters": iters,
        "batch": batch,
        "context": context,
        "num_kv_planes": model.config.num_kv_planes,
        "kv_cache_bytes": cache.nbytes,
        "samples_ms": samples,
    }
