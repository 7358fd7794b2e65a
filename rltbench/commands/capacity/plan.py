"""The capacity rows of `rltbench capacity`, predicted before anything is built: per model and KV layout
the bytes per token and what a memory budget admits.

Every number comes from `rltbench.engine.kv_capacity`, the functions the engine itself sizes its pool
and admits requests with, so a row is what the engine would allocate, not a parallel formula. The
per-application baseline row is the one row no engine layout backs: one KV plane per layer
application (`config.num_layer_applications`), what an implementation that gives each recurrent
application its own cache allocates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rltbench import runtime
from rltbench.bench.workload import fit_burst_lengths
from rltbench.engine.kv_capacity import (
    GIB,
    KVLayout,
    capacity,
    cuda_free_bytes,
    engine_layout,
    per_application_layout,
)
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.models import HuginnForCausalLM, OuroForCausalLM

# Without a GPU there is no free memory to measure: rows use this fixed KV budget (the KV room of a
# 24 GB-class GPU after an Ouro-1.4B's weights), named as such in every table.
CPU_DEFAULT_GIB = 16.0
ENGINE, BASELINE = "engine", "baseline"
_MODEL_CLASSES = {"ouro": OuroForCausalLM, "huginn": HuginnForCausalLM}


@dataclass(frozen=True)
class Budget:
    """KV bytes of one model's rows and where the figure comes from."""

    bytes: float
    source: str


def weight_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of the model's weights in `dtype` (its checkpoint tensors; a tied head counted once)."""
    shapes = _MODEL_CLASSES[config.family].hf_key_shapes(config)
    elem = torch.empty((), dtype=dtype).element_size()
    return sum(elem * int(torch.Size(s).numel()) for s in shapes.values())


def resolve_budget(config: Any, dtype: torch.dtype, device: str, memory_gib: float | None) -> Budget:
    """`--memory-gib` as given; on a GPU by default what the engine would take after this model's
    weights (free memory minus the weights minus the engine's headroom); on the CPU a fixed default."""
    if memory_gib is not None:
        return Budget(memory_gib * GIB, f"--memory-gib {memory_gib:g}")
    if device.startswith("cuda"):
        free = cuda_free_bytes(torch.device(device))
        weights = weight_bytes(config, dtype)
        headroom = EngineConfig().kv_headroom_gib
        return Budget(free - weights - headroom * GIB,
                      f"free GPU memory {free / GIB:.1f} GiB - weights {weights / GIB:.1f} GiB - engine "
                      f"headroom {headroom:g} GiB")
    return Budget(CPU_DEFAULT_GIB * GIB, f"CPU default {CPU_DEFAULT_GIB:g} GiB (no GPU to measure)")


def request_lengths(models: list[str], input_len: int | None,
                    output_len: int | None) -> tuple[int, int, str | None]:
    """(prompt, generated, note) tokens per request, one pair for every model so that their rows
    compare at the same request. A length left at its default (None) is the burst default (512 +
    128) where every model's context holds it, shortened to the shortest context otherwise, which
    the note says; a length given must fit every model (UsageError naming the flag and a value that
    works). Why: `capacity --models ouro-tiny` stopped on its own defaults (640 > 512 tokens)."""
    contexts = {name: int(runtime.ModelSource(name).config().max_position_embeddings) for name in models}
    shortest = min(contexts, key=contexts.__getitem__)
    inp, out, note = fit_burst_lengths(input_len, output_len, contexts[shortest], shortest)
    if note and len(models) > 1:
        note += " (one request size for every model's rows)"
    return inp, out, note


def _row(model: str, kind: str, kv: KVLayout, budget: Budget, block_size: int, prompt_len: int,
         output_len: int, derivation: str) -> dict[str, Any]:
    cap = capacity(kv, budget.bytes, block_size, prompt_len, output_len)
    return {
        "model": model, "layout": kv.name, "kind": kind, "planes": kv.planes, "kv_heads": kv.kv_heads,
        "head_dim": kv.head_dim, "dtype": runtime.dtype_name(kv.dtype),
        "bytes_per_token_plane": kv.bytes_per_token_plane, "bytes_per_token": kv.bytes_per_token,
        "budget_gib": budget.bytes / GIB, "budget_source": budget.source, "input_len": prompt_len,
        "output_len": output_len, **cap.as_dict(), "derivation": derivation,
    }


def capacity_rows(models: list[str], kv_layouts: list[str], seed: int, dtype: torch.dtype, device: str,
                  memory_gib: float | None, block_size: int, input_len: int,
                  output_len: int) -> list[dict[str, Any]]:
    """Per model its engine layout(s) (Huginn: each of `kv_layouts`) and the per-application
    baseline, each with what the budget admits; `seqs_vs_baseline` compares with the baseline row."""
    rows: list[dict[str, Any]] = []
    for preset in models:
        base_config = runtime.ModelSource(preset, "random", seed).config()
        layouts = kv_layouts if base_config.family == "huginn" else [None]
        budget = resolve_budget(base_config, dtype, device, memory_gib)
        model_rows = []
        for layout in layouts:
            config = runtime.ModelSource(preset, "random", seed, layout).config()
            kv = engine_layout(config, dtype)
            if layout is None:
                kv = KVLayout(f"{config.num_loops} loops x {config.num_layers} layers", kv.planes,
                              kv.kv_heads, kv.head_dim, kv.dtype)
            model_rows.append(_row(preset, ENGINE, kv, budget, block_size, input_len, output_len,
                                   f"engine pool: {kv.planes} planes (config.num_kv_planes) x K,V x "
                                   f"{kv.kv_heads} heads x {kv.head_dim} x {kv.dtype.itemsize} B"))
        base = per_application_layout(base_config, dtype)
        model_rows.append(_row(preset, BASELINE, base, budget, block_size, input_len, output_len,
                               f"derived, no engine layout: one plane per layer application "
                               f"(config.num_layer_applications = {base.planes})"))
        ref = model_rows[-1]
        for r in model_rows:
            r["seqs_vs_baseline"] = r["max_seqs"] / ref["max_seqs"] if ref["max_seqs"] else None
            r["bytes_vs_baseline"] = ref["bytes_per_token"] / r["bytes_per_token"]
        rows.extend(model_rows)
    return rows


def check_admits(rows: list[dict[str, Any]]) -> None:
    """A budget that admits no request of the asked length in an engine row is a usage error (its burst
    could not run, and a capacity of 0 is no comparison)."""
    for r in rows:
        if r["kind"] == ENGINE and r["max_seqs"] < 1:
            need = r["blocks_per_seq"] * r["block_size"] * r["bytes_per_token"]
            raise UsageError(
                f"{r['model']} ({r['layout']}): one request of {r['input_len']}+{r['output_len']} tokens "
                f"needs {need / GIB:.3f} GiB of KV but the budget ({r['budget_source']}) holds "
                f"{r['budget_gib']:.3f} GiB: raise --memory-gib or lower --input-len/--output-len"
            )
