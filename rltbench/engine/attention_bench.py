"""Decode-attention microbenchmark for the GPU script (one plane, Ouro-1.4B shape by default).

Times ``paged_decode_attention`` the way the engine runs it: captured in a CUDA graph, replayed
``iters`` times between two CUDA events, ``reps`` such windows, median per call. Blocks are shuffled
over the pool so reads are as scattered as in a long-running engine. ``sweep=True`` also times the
Triton kernel's tuning knobs (partition size, tile tokens, warps) so the defaults can be checked on
the real GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rltbench.engine.attention import _decode_triton, choose_partition_size, paged_decode_attention
from rltbench.errors import UsageError

SWEEP_PARTITIONS = (32, 64, 128, 256)
SWEEP_TILES_WARPS = ((16, 4), (16, 8), (8, 4))


def _inputs(
    batch: int,
    context_len: int,
    table_blocks: int,
    hq: int,
    hkv: int,
    d: int,
    bs: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    nb = batch * table_blocks + 1
    kc = torch.randn(nb, bs, hkv, d, generator=g, device="cuda").to(dtype)
    vc = torch.randn(nb, bs, hkv, d, generator=g, device="cuda").to(dtype)
    perm = torch.randperm(nb, generator=g, device="cuda")[: batch * table_blocks]
    tables = perm.view(batch, table_blocks).to(torch.int32)
    lens = torch.full((batch,), context_len, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, generator=g, device="cuda").to(dtype)
    return q, kc, vc, tables, lens


def _time_graph(fn: Callable[[], torch.Tensor], iters: int, reps: int) -> list[float]:
    """Per-call microseconds of ``reps`` windows of ``iters`` graph replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / iters)
    del graph
    return times


def _time_config(
    inputs: tuple[torch.Tensor, ...],
    impl: str,
    knobs: dict[str, int] | None,
    max_len: int,
    iters: int,
    reps: int,
) -> tuple[list[float], dict[str, Any]]:
    """Time one implementation/knob setting on one batch; returns (per-call us list, knob info)."""
    q, kc, vc, tables, lens = inputs
    scale = q.shape[-1] ** -0.5
    if knobs is None:
        fn = lambda: paged_decode_attention(q, kc, vc, tables, lens, scale, impl=impl)
        part = choose_partition_size(q.shape[0], q.shape[1], max_len) if impl == "triton" else None
        info: dict[str, Any] = {"partition_size": part, "tile_tokens": None, "num_warps": None}
    else:
        fn = lambda: _decode_triton(q, kc, vc, tables, lens, scale, max_len, **knobs)
        info = dict(knobs)
    return _time_graph(fn, iters, reps), info


def bench_decode_attention(
    batch_sizes: Sequence[int] = (1, 8, 32, 128),
    context_len: int = 512,
    *,
    num_heads: int = 16,
    num_kv_heads: int = 16,
    head_dim: int = 128,
    block_size: int = 16,
    table_blocks: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    iters: int = 100,
    reps: int = 7,
    impls: Sequence[str] = ("triton", "torch"),
    sweep: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Median decode-attention time per call for each batch size and implementation.

    ``table_blocks`` is the block-table width (default: just enough for ``context_len``; pass the engine's
    ``max_blocks_per_seq`` to include its empty-split overhead). Returns ``{"device", "shape", "results":
    [{impl, batch, median_us, min_us, kv_bytes, kv_gbps, partition_size, tile_tokens, num_warps}]}``;
    with ``sweep`` extra rows have impl ``"triton-sweep"``.
    """
    if not torch.cuda.is_available():
        raise UsageError("the decode attention benchmark needs a CUDA GPU")
    if context_len < 1 or any(b < 1 for b in batch_sizes):
        raise UsageError("context_len and every batch size must be >= 1")
    width = table_blocks if table_blocks is not None else -(-context_len // block_size)
    if width * block_size < context_len:
        raise UsageError(f"table_blocks={width} cannot hold context_len={context_len}")
    elem = torch.tensor([], dtype=dtype).element_size()
    rows: list[dict[str, Any]] = []
    for batch in batch_sizes:
        inputs = _inputs(
            batch, context_len, width, num_heads, num_kv_heads, head_dim, block_size, dtype, seed
        )
        kv_bytes = batch * context_len * num_kv_heads * head_dim * 2 * elem
        configs: list[tuple[str, dict[str, int] | None]] = [(impl, None) for impl in impls]
        if sweep:
            configs += [
                ("triton-sweep", {"partition_size": p, "tile_tokens": t, "num_warps": w})
                for p in SWEEP_PARTITIONS
                for t, w in SWEEP_TILES_WARPS
            ]
        for impl, knobs in configs:
            times, info = _time_config(inputs, impl, knobs, width * block_size, iters, reps)
            med = statistics.median(times)
            row = {"impl": impl, "batch": batch, "context_len": context_len, "median_us": med}
            row |= {"min_us": min(times), "kv_bytes": kv_bytes, "kv_gbps": kv_bytes / (med * 1e-6) / 1e9}
            rows.append(row | info)
        del inputs
        torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "shape": {
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "block_size": block_size,
            "table_blocks": width,
            "dtype": str(dtype).removeprefix("torch."),
            "iters": iters,
            "reps": reps,
        },
        "results": rows,
    }
