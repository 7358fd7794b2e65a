"""Glue of `rltbench capacity`: predicted rows -> run directory -> (optionally) one measured burst per
engine row at the largest C it admits -> report.

Why a burst: arithmetic says C requests fit; the burst shows the engine really holds all C at once
(the largest decode batch of the timed cell equals C), with every request finished and its timed
window warm. Each engine row gets its own model and engine (one at a time: a Huginn "full" pool
takes the whole budget), sized with the row's budget through `--kv-cache-gib`, and the engine's pool
is checked against the prediction before anything runs.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.console import Console

from rltbench import runtime
from rltbench.arms import ArmSpec
from rltbench.backends.base import Timeouts
from rltbench.backends.engine import EngineBackend
from rltbench.bench.workload import burst_prompts, warmup_prompts
from rltbench.commands.capacity import report
from rltbench.commands.capacity.plan import ENGINE
from rltbench.engine.schedule import DECODE
from rltbench.engine.types import EngineConfig
from rltbench.results import RunDir

WARMUP_TOKENS = 4   # generated tokens per warm-up request


@dataclass
class CapacitySpec:
    """A validated `rltbench capacity` run (rows are predicted by plan.capacity_rows)."""

    rows: list[dict[str, Any]]
    arm: str
    arm_spec: ArmSpec
    burst: bool
    repeats: int
    seed: int
    device: str
    dtype: torch.dtype
    block_size: int
    max_num_batched_tokens: int
    enforce_eager: bool
    result_dir: Path | None
    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # defaults chosen for these models, said aloud


def _label(row: dict[str, Any]) -> str:
    return f"{row['model']} / {row['layout']}"


def _kv_layout(row: dict[str, Any]) -> str | None:
    """The --kv-layout of a Huginn row (None: the model's own layout)."""
    return row["layout"] if row["layout"] in ("full", "compress") else None


def _burst(spec: CapacitySpec, row: dict[str, Any], run: RunDir) -> None:
    """Build the row's model and engine, check the pool against the prediction, warm up, then run
    `spec.repeats` timed bursts of C = the row's max_seqs requests."""
    c = int(row["max_seqs"])
    source = runtime.ModelSource(row["model"], "random", spec.seed, _kv_layout(row))
    model, _tok = runtime.load(source, spec.device, spec.dtype)
    config = EngineConfig(kv_cache_gib=row["budget_gib"], block_size=spec.block_size, max_num_seqs=c,
                          max_num_batched_tokens=spec.max_num_batched_tokens, enable_prefix_caching=False,
                          use_cuda_graph=not spec.enforce_eager,
                          max_model_len=row["input_len"] + row["output_len"])
    engine = runtime.build_engine(model, {spec.arm: spec.arm_spec}, config)
    label = _label(row)
    meta_base = {"arm": label, "cell": f"C={c}", "C": c, "workload": "burst",
                 "predicted_num_blocks": row["num_blocks"], "engine_num_blocks": engine.num_blocks,
                 "engine_kv_bytes": engine.kv.numel() * engine.kv.element_size()}
    if engine.num_blocks != row["num_blocks"]:  # never expected: the prediction uses the engine's rule
        run.append_jsonl("cell_meta.jsonl", {**meta_base, "rep": 0, "note": "engine pool differs from "
                                             "the prediction: burst skipped"})
        return
    backend = EngineBackend(engine, [spec.arm])
    timeouts = Timeouts()
    # all C requests, short: every batch size up to C and the whole prefill run once before the
    # timed burst (a 4-request warm-up left Huginn compress's C=176 burst one buffer growth cold)
    warm = warmup_prompts(model.config, c, row["input_len"], min(row["output_len"], WARMUP_TOKENS), spec.seed)
    backend.warmup(spec.arm, warm, timeouts)
    for rep in range(spec.repeats):
        reqs = burst_prompts(model.config, c, row["input_len"], row["output_len"], spec.seed, rep, c)
        started = time.perf_counter()
        result = backend.run_cell(spec.arm, f"C={c}/r{rep}", reqs, timeouts)
        recs, sched = result.records, result.schedule
        decode_rows = [len(st.rows) for st in sched.steps if st.kind == DECODE] if sched else []
        for r in recs:
            r.update(arm=label, cell=f"C={c}", C=c, rep=rep)
        run.extend_jsonl("requests.jsonl", recs)
        run.append_jsonl("cell_meta.jsonl", {
            **meta_base, "rep": rep, "wall_s": time.perf_counter() - started,
            "cold_work": dict(result.cold_work), "schedule": sched.summary() if sched else None,
            "max_decode_batch": max(decode_rows, default=0),
        })


def _release() -> None:
    """Hand a finished row's model, engine and KV pool back before the next row allocates its own."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(spec: CapacitySpec) -> Path:
    """Write the predicted rows, run the bursts (if asked), render; returns the run directory."""
    config = {
        "arm": spec.arm, "arm_spec": spec.arm_spec.settings(), "burst": spec.burst, "repeats": spec.repeats,
        "seed": spec.seed, "device": spec.device, "dtype": runtime.dtype_name(spec.dtype),
        "block_size": spec.block_size, "max_num_batched_tokens": spec.max_num_batched_tokens,
        "cuda_graphs": not spec.enforce_eager and spec.device.startswith("cuda"), "random_weights": True,
        "notes": spec.notes,
    }
    run_dir = RunDir.create("capacity", result_dir=spec.result_dir, argv=spec.argv, config=config)
    for note in spec.notes:
        Console().print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
    run_dir.write_table("capacity", pd.DataFrame(spec.rows))
    with run_dir.recording(report.render):
        if spec.burst:
            for row in spec.rows:
                if row["kind"] == ENGINE:
                    _burst(spec, row, run_dir)
                    _release()
    return run_dir.path
