"""Decode-attention microbenchmark and tuning sweep (one plane, Ouro-1.4B shape by default).

Times ``paged_decode_attention`` the way the engine runs it: inside a CUDA graph, median per call of
``reps`` timing windows between CUDA events. Blocks are shuffled over the pool so reads are as scattered
as in a long-running engine, and the graph cycles over several KV pools (as the engine cycles over its
24 layers x 4 loops of planes) so a small batch does not time an L2-resident cache.

The sweep (``rltbench tune attention``) times the Triton kernel's knobs (tile tokens, heads per
program, warps, pipeline stages, partition policy / single launch / fused reduce) at batch
1/8/32/128 x context 512 and batch 1/32 x context 4096 against the code defaults (no tuned table in
force), checks every variant against the torch reference first and reports the best variant per
case; `tuned_rows` turns the bests into the tuned file's ``decode_attention`` table. A case is timed
as the engine's decode graph runs it: each row's seq_len somewhere in the ``DECODE_RUN`` tokens after
the context (a burst's decode phase), attention covering the graph's context class (a power of two
>= the longest row: 1024 for context 512), so splits past a row's end cost what they cost there.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rltbench import tuned
from rltbench.bench.decode import serving_len_class
from rltbench.bench.timing import time_windows
from rltbench.engine.attention import (
    _decode_torch,
    _decode_triton,
    choose_partition_size,
    decode_config,
    paged_decode_attention,
)
from rltbench.errors import UsageError


def _fused(**knobs: Any) -> dict[str, Any]:
    """A sweep variant with the fused reduce (several splits combined in one launch)."""
    return knobs | {"fused_reduce": True}


# (batch, context) cases of the sweep
SWEEP_CASES = ((1, 512), (8, 512), (32, 512), (128, 512), (1, 4096), (32, 4096))
# name -> knobs for _decode_triton; "default" is the engine's choice, "v1" approximates the kernel before
# the rewrite (16-token tiles, one head, partitions 32..256 for ~528 programs, always a reduce launch)
SWEEP_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "v1": {
        "tile_tokens": 16,
        "heads_per_program": 1,
        "num_warps": 4,
        "num_stages": 1,
        "single_launch": False,
    },
    "t32h1w4": {"tile_tokens": 32, "heads_per_program": 1, "num_warps": 4, "num_stages": 1},
    "t64h1w8": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 8, "num_stages": 1},
    "t128h1w8": {"tile_tokens": 128, "heads_per_program": 1, "num_warps": 8, "num_stages": 1},
    "t32h2w4": {"tile_tokens": 32, "heads_per_program": 2, "num_warps": 4, "num_stages": 1},
    "t16h4w4": {"tile_tokens": 16, "heads_per_program": 4, "num_warps": 4, "num_stages": 1},
    "t32h4w8": {"tile_tokens": 32, "heads_per_program": 4, "num_warps": 8, "num_stages": 1},
    "t32h1w4s2": {"tile_tokens": 32, "heads_per_program": 1, "num_warps": 4, "num_stages": 2},
    "t64h2w8s2": {"tile_tokens": 64, "heads_per_program": 2, "num_warps": 8, "num_stages": 2},
    "t32h1w4-2x": {"tile_tokens": 32, "heads_per_program": 1, "num_warps": 4, "target_programs": 1056},
    "t32h1w4-half": {"tile_tokens": 32, "heads_per_program": 1, "num_warps": 4, "target_programs": 264},
    "t64h2w8-1split": {"tile_tokens": 64, "heads_per_program": 2, "num_warps": 8, "target_programs": 0},
    # fixed partitions (batch 1 otherwise always gets 32-token partitions, capping the tile at 32)
    "p16t16h1w4": {"tile_tokens": 16, "heads_per_program": 1, "num_warps": 4, "partition_size": 16},
    "p64t64h1w4": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 4, "partition_size": 64},
    "p128t64h1w8": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 8, "partition_size": 128},
    # fused reduce: the last program of each head group combines the splits (one launch, no reduce kernel)
    "p64t64h1w4-fused": _fused(tile_tokens=64, heads_per_program=1, num_warps=4, partition_size=64),
    "p128t64h1w8-fused": _fused(tile_tokens=64, heads_per_program=1, num_warps=8, partition_size=128),
    "p256t64h1w8-fused": _fused(tile_tokens=64, heads_per_program=1, num_warps=8, partition_size=256),
    "p128t32h2w4-fused": _fused(tile_tokens=32, heads_per_program=2, num_warps=4, partition_size=128),
    "t32h1w4-fused": _fused(tile_tokens=32, heads_per_program=1, num_warps=4),
    # one split per row, pipelined (no program covers only positions past the row's end; batch >= 32)
    "t64h1w4s2-1split": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 4, "num_stages": 2,
                         "target_programs": 0},
    "t64h1w2s2-1split": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 2, "num_stages": 2,
                         "target_programs": 0},
    "p64t64h1w2": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 2, "partition_size": 64},
    "p256t64h1w4s2": {"tile_tokens": 64, "heads_per_program": 1, "num_warps": 4, "num_stages": 2,
                      "partition_size": 256},
}
_V1_PARTITIONS = (256, 128, 64, 32)
DECODE_RUN = 128  # a case's rows are this many tokens or fewer past the context (burst output: 128)
_COLD_BYTES = 256 << 20  # KV read per graph replay at least this (H200 L2: 50 MB)
_MAX_COPIES = 64
_DEVICE = "cuda"  # where the inputs live (the CPU test of the sweep plumbing sets "cpu")
_TOL = 2e-2  # max abs error vs the fp32 torch reference for bf16/fp16 outputs


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
    spread: int = 0,
) -> tuple[torch.Tensor, ...]:
    """q, K/V caches, block tables and seq_lens of one KV pool (blocks shuffled over the pool); each
    row's seq_len drawn from [context_len, context_len + spread]."""
    g = torch.Generator(device=_DEVICE).manual_seed(seed)
    nb = batch * table_blocks + 1
    kc = torch.randn(nb, bs, hkv, d, generator=g, device=_DEVICE).to(dtype)
    vc = torch.randn(nb, bs, hkv, d, generator=g, device=_DEVICE).to(dtype)
    perm = torch.randperm(nb, generator=g, device=_DEVICE)[: batch * table_blocks]
    tables = perm.view(batch, table_blocks).to(torch.int32)
    lens = torch.randint(context_len, context_len + spread + 1, (batch,), generator=g, device=_DEVICE,
                         dtype=torch.int32)
    q = torch.randn(batch, hq, d, generator=g, device=_DEVICE).to(dtype)
    return q, kc, vc, tables, lens


def _time_graph(fns: Sequence[Callable[[], torch.Tensor]], reps: int, min_calls: int) -> list[float]:
    """Per-call microseconds: one graph replays every fn once (each on its own KV pool); ``reps``
    windows of enough replays for ``min_calls`` calls each."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    replays = max(1, -(-min_calls // len(fns)))
    windows_ms = time_windows(graph.replay, reps, replays)
    times = [ms * 1000.0 / (replays * len(fns)) for ms in windows_ms]
    del graph
    return times


def _shape(hq: int, hkv: int, d: int, bs: int, dtype: torch.dtype) -> dict[str, Any]:
    dt = str(dtype).removeprefix("torch.")
    return {"num_heads": hq, "num_kv_heads": hkv, "head_dim": d, "block_size": bs, "dtype": dt}


def _v1_partition(batch: int, hq: int, max_len: int) -> int:
    for p in _V1_PARTITIONS:
        if batch * hq * max(1, -(-max_len // p)) >= 528:
            return p
    return _V1_PARTITIONS[-1]


def _resolve(name: str, knobs: dict[str, Any], batch: int, hq: int, max_len: int) -> dict[str, Any]:
    """Full knob set (defaults filled in), the partition and the launch count of one variant."""
    cfg = decode_config(batch, hq, max_len)
    full = {
        "tile_tokens": knobs.get("tile_tokens", cfg.tile_tokens),
        "heads_per_program": knobs.get("heads_per_program", cfg.heads_per_program),
        "num_warps": knobs.get("num_warps", cfg.num_warps),
        "num_stages": knobs.get("num_stages", cfg.num_stages),
        "target_programs": knobs.get("target_programs", cfg.target_programs),
        "single_launch": knobs.get("single_launch", cfg.single_launch),
        "fused_reduce": knobs.get("fused_reduce", cfg.fused_reduce),
    }
    if "partition_size" in knobs:
        part = knobs["partition_size"]
    elif name == "v1":
        part = _v1_partition(batch, hq, max_len)
    else:
        part = choose_partition_size(batch, hq, max_len, full["heads_per_program"], full["target_programs"])
    splits = max(1, -(-max_len // part))
    launches = 1 if (splits == 1 and full["single_launch"]) or full["fused_reduce"] else 2
    return full | {"partition_size": part, "num_splits": splits, "launches": launches}


def sweep_decode_attention(
    cases: Sequence[tuple[int, int]] = SWEEP_CASES,
    variants: dict[str, dict[str, Any]] | None = None,
    *,
    num_heads: int = 16,
    num_kv_heads: int = 16,
    head_dim: int = 128,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    reps: int = 5,
    min_calls: int = 200,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time every variant on every (batch, context) case, against the code defaults (the tuned table
    is not in force: "default" is the built-in choice); a variant whose output differs from
    ``_decode_torch`` by more than the tolerance is reported (ok=False) but never chosen as best."""
    if not torch.cuda.is_available():
        raise UsageError("the decode attention benchmark needs a CUDA GPU")
    variants = SWEEP_VARIANTS if variants is None else variants
    with tuned.use(None):
        return _sweep(cases, variants, num_heads, num_kv_heads, head_dim, block_size, dtype, reps, min_calls,
                      seed, log)


def _sweep(cases: Sequence[tuple[int, int]], variants: dict[str, dict[str, Any]], num_heads: int,
           num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, reps: int, min_calls: int,
           seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    elem = torch.tensor([], dtype=dtype).element_size()
    out_cases = []
    for batch, ctx in cases:
        t0 = time.perf_counter()
        max_len = serving_len_class(ctx + DECODE_RUN, block_size)  # the decode graph's coverage
        width = max_len // block_size
        mean_len = ctx + 1 + (DECODE_RUN - 1) / 2
        kv_bytes = round(batch * mean_len * num_kv_heads * head_dim * 2 * elem)  # expected KV read per call
        copies = max(1, min(_MAX_COPIES, math.ceil(_COLD_BYTES / kv_bytes)))
        pools = [
            _inputs(batch, ctx + 1, width, num_heads, num_kv_heads, head_dim, block_size, dtype, seed + i,
                    spread=DECODE_RUN - 1)
            for i in range(copies)
        ]
        q, kc, vc, tables, lens = pools[0]
        scale = head_dim**-0.5
        ref = _decode_torch(q, kc, vc, tables, lens, scale, max_len).float()
        rows = []
        for name, knobs in variants.items():
            info = _resolve(name, knobs, batch, num_heads, max_len)
            call = dict(knobs)
            part = info["partition_size"] if name == "v1" else call.pop("partition_size", None)
            row: dict[str, Any] = {"name": name, **info}
            try:
                got = _decode_triton(q, kc, vc, tables, lens, scale, max_len, part, **call)
                err = (got.float() - ref).abs().max().item()
                row |= {"max_abs_err": err, "ok": bool(math.isfinite(err) and err <= _TOL)}
                fns = [functools.partial(_decode_triton, *p, scale, max_len, part, **call) for p in pools]
                times = _time_graph(fns, reps, min_calls)
                med = statistics.median(times)
                row |= {"median_us": med, "min_us": min(times), "kv_gbps": kv_bytes / (med * 1e-6) / 1e9}
            except Exception as exc:  # a variant that fails to compile/launch is reported, not fatal
                row |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
        good = [r for r in rows if r.get("ok") and "median_us" in r]
        best = min(good, key=lambda r: r["median_us"]) if good else None
        out_cases.append(
            {"batch": batch, "context_len": ctx, "covered_len": max_len, "decode_run": DECODE_RUN,
             "kv_bytes": kv_bytes, "kv_pools": copies, "best": best, "results": rows}
        )  # fmt: skip
        log(_case_line(out_cases[-1], time.perf_counter() - t0))
        del pools, q, kc, vc, tables, lens, ref
        torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "shape": _shape(num_heads, num_kv_heads, head_dim, block_size, dtype)
        | {"reps": reps, "min_calls": min_calls},
        "variants": variants,
        "cases": out_cases,
    }


def _by_name(case: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in case["results"] if r["name"] == name and "median_us" in r), None)


def _case_line(case: dict[str, Any], secs: float) -> str:
    best, default, v1 = case["best"], _by_name(case, "default"), _by_name(case, "v1")
    head = f"B={case['batch']:<4d} ctx={case['context_len']:<5d}"
    if best is None:
        return f"{head} no variant passed the correctness check ({secs:.1f}s)"
    parts = [f"best {best['name']:<15s} {best['median_us']:8.2f} us {best['kv_gbps']:7.0f} GB/s"]
    parts.append(f"P={best['partition_size']} splits={best['num_splits']} launches={best['launches']}")
    for label, r in (("default", default), ("v1", v1)):
        if r is not None:
            parts.append(f"{label} {r['median_us']:.2f} us (x{r['median_us'] / best['median_us']:.2f})")
    return f"{head} " + " | ".join(parts) + f" ({secs:.1f}s)"


def format_table(res: dict[str, Any]) -> str:
    """Variants x cases matrix of median us ('!' marks a variant that failed the check)."""
    cases = res["cases"]
    cols = [f"B{c['batch']}/{c['context_len']}" for c in cases]
    lines = [f"{'variant':<16s}" + "".join(f"{c:>12s}" for c in cols)]
    for name in res["variants"]:
        cells = []
        for c in cases:
            r = next(r for r in c["results"] if r["name"] == name)
            if "median_us" not in r:
                cells.append(f"{'error':>12s}")
            else:
                mark = "" if r["ok"] else "!"
                star = "*" if c["best"] is not None and c["best"]["name"] == name else ""
                cells.append(f"{r['median_us']:>10.2f}{mark or star:1s} ")
        lines.append(f"{name:<16s}" + "".join(cells))
    lines.append("us per call; * best per case; ! wrong result (excluded)")
    return "\n".join(lines)


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
    seed: int = 0,
) -> dict[str, Any]:
    """Median decode-attention time per call of ``paged_decode_attention`` for each batch and impl.

    ``table_blocks`` is the block-table width (default: just enough for ``context_len``; pass the engine's
    ``max_blocks_per_seq`` to include its empty-split overhead). Returns ``{"device", "shape", "results":
    [{impl, batch, median_us, min_us, kv_bytes, kv_gbps, partition_size}]}``.
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
        q, kc, vc, tables, lens = _inputs(
            batch, context_len, width, num_heads, num_kv_heads, head_dim, block_size, dtype, seed
        )
        kv_bytes = batch * context_len * num_kv_heads * head_dim * 2 * elem
        scale = head_dim**-0.5
        for impl in impls:
            fn = functools.partial(paged_decode_attention, q, kc, vc, tables, lens, scale, impl=impl)
            times = _time_graph([fn], reps, iters)
            med = statistics.median(times)
            part = _resolve("default", {}, batch, num_heads, width * block_size)["partition_size"]
            row = {"impl": impl, "batch": batch, "context_len": context_len, "median_us": med}
            row |= {"min_us": min(times), "kv_bytes": kv_bytes, "kv_gbps": kv_bytes / (med * 1e-6) / 1e9}
            rows.append(row | {"partition_size": part if impl == "triton" else None})
        del q, kc, vc, tables, lens
        torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "shape": _shape(num_heads, num_kv_heads, head_dim, block_size, dtype)
        | {"table_blocks": width, "iters": iters, "reps": reps},
        "results": rows,
    }


_SHORT_LEN = 2048  # rows tuned at context 512 serve decode classes up to this covered length


def tuned_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's best variant per case as rows of the tuned table (section "decode_attention",
    read by rltbench.engine.attention.DecodeTable): context-512 cases serve lengths up to
    _SHORT_LEN, the 4096 cases everything longer. A case's row serves batches from its own batch
    up to the next case's (the first case's also every smaller batch): a variant runs with at
    least the rows it was measured with, which a one-split variant needs for its parallelism (at
    batch 16 it would have half the programs of batch 32), while a split-K variant chosen at a
    smaller batch only splits more finely than a larger batch needs."""
    rows = []
    keys = ("tile_tokens", "heads_per_program", "num_warps", "num_stages", "target_programs", "single_launch")
    optional = {"fused_reduce": False}  # knobs newer than some result files: their default when absent
    for long_ctx in (False, True):
        cases = sorted((c for c in res["cases"] if (c["context_len"] > _SHORT_LEN) == long_ctx and c["best"]),
                       key=lambda c: c["batch"])
        for i, c in enumerate(cases):
            best = c["best"]
            fixed = "partition_size" in res["variants"].get(best["name"], {}) or best["name"] == "v1"
            row = {k: best[k] for k in keys} | {k: best.get(k, v) for k, v in optional.items()}
            row["partition_size"] = best["partition_size"] if fixed else None
            last = i == len(cases) - 1
            row["max_batch"] = 1 << 30 if last else cases[i + 1]["batch"] - 1
            row["max_len"] = 1 << 30 if long_ctx else _SHORT_LEN
            row["measured"] = {"batch": c["batch"], "context_len": c["context_len"], "variant": best["name"],
                               "median_us": best["median_us"], "kv_gbps": best["kv_gbps"]}
            rows.append(row)
    return rows
