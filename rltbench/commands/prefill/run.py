"""Glue of `rltbench prefill`: per model one engine, per prompt length a warm-up under both policies,
then timed bursts with the policies interleaved A B A', A' B A over repetitions (A' = the packed policy
again: the A/A arm), each cell's step times paired with its recorded schedule.

Both policies share one engine, one KV pool and one arm: only `scheduler.max_prefill_seqs` changes
between cells, so any difference is the scheduling policy's.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rltbench import runtime
from rltbench.arms import ArmSpec
from rltbench.backends.base import Timeouts
from rltbench.backends.engine import EngineBackend
from rltbench.bench.workload import Cell, burst_prompts, schedule, warmup_prompts
from rltbench.commands.prefill import report
from rltbench.engine.schedule import PREFILL
from rltbench.engine.types import EngineConfig
from rltbench.results import RunDir

PACKED, ONE, PACKED_AA = "packed", "one-per-step", "packed#2"
POLICIES = (PACKED, ONE, PACKED_AA)
MAX_PREFILL_SEQS = {PACKED: None, ONE: 1, PACKED_AA: None}


@dataclass
class PrefillSpec:
    """A validated `rltbench prefill` run: per model the prompt lengths that fit its context."""

    lengths: dict[str, list[int]]  # model preset -> prompt lengths
    concurrency: int
    output_len: int
    repeats: int
    arm: str
    arm_spec: ArmSpec
    kv_layout: str
    max_num_batched_tokens: int
    block_size: int
    enforce_eager: bool
    prefill_graphs: bool
    seed: int
    device: str
    dtype: torch.dtype
    result_dir: Path | None
    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # defaults chosen for these models, said aloud


def _step_times(t0: float, ends: list[float], sched: Any) -> tuple[list[float], list[int]] | None:
    """(duration, rows) of every prefill step: step i ran from the end of step i-1 (the cell start for
    the first) to its own end. None when the step ends and the recorded steps do not pair up."""
    if sched is None or len(ends) != len(sched.steps):
        return None
    out, rows, prev = [], [], t0
    for end, st in zip(ends, sched.steps, strict=True):
        if st.kind == PREFILL:
            out.append(end - prev)
            rows.append(len(st.rows))
        prev = end
    return out, rows


def _stamp(ends: list[float]) -> Callable[[], None]:
    """An on_step callback that appends each step's end time to `ends`."""
    return lambda: ends.append(time.perf_counter())


def _model_runs(spec: PrefillSpec, preset: str, run: RunDir) -> None:
    lens = spec.lengths[preset]
    c, bs = spec.concurrency, spec.block_size
    layout = spec.kv_layout if runtime.ModelSource(preset).config().family == "huginn" else None
    source = runtime.ModelSource(preset, "random", spec.seed, layout)
    model, _tok = runtime.load(source, spec.device, spec.dtype)
    max_len = max(lens) + spec.output_len
    config = EngineConfig(block_size=bs, max_num_seqs=c, max_num_batched_tokens=spec.max_num_batched_tokens,
                          enable_prefix_caching=False, use_cuda_graph=not spec.enforce_eager,
                          prefill_graphs=spec.prefill_graphs, max_model_len=max_len)
    engine = runtime.build_engine(model, {spec.arm: spec.arm_spec}, config, c * math.ceil(max_len / bs))
    backend, timeouts = EngineBackend(engine, [spec.arm]), Timeouts()
    for length in lens:
        warm = warmup_prompts(model.config, c, length, min(spec.output_len, 4), spec.seed)
        engine.scheduler.max_prefill_seqs = None
        backend.warmup(spec.arm, warm, timeouts)
        engine.scheduler.max_prefill_seqs = 1
        backend.run_cell(spec.arm, "warmup-one", warm, timeouts, timed=False)
    cells = [Cell(f"{preset} L={n}", c) for n in lens]
    for rep, cell, policy in schedule(list(POLICIES), cells, spec.repeats):
        length = int(cell.name.rsplit("=", 1)[1])
        engine.scheduler.max_prefill_seqs = MAX_PREFILL_SEQS[policy]
        reqs = burst_prompts(model.config, c, length, spec.output_len, spec.seed, rep, length)
        ends: list[float] = []
        t0 = time.perf_counter()
        result = backend.run_cell(spec.arm, f"{policy}/{cell.name}/r{rep}", reqs, timeouts,
                                  on_step=_stamp(ends))
        recs = result.records
        steps = _step_times(t0, ends, result.schedule)
        for r in recs:
            r.update(arm=policy, cell=cell.name, C=c, rep=rep, model=preset, input_len=length)
        run.extend_jsonl("requests.jsonl", recs)
        run.append_jsonl("cell_meta.jsonl", {
            "arm": policy, "cell": cell.name, "C": c, "rep": rep, "model": preset, "input_len": length,
            "workload": "burst", "wall_s": time.perf_counter() - t0,
            "cold_work": dict(result.cold_work),
            "prefill_step_s": steps[0] if steps else None, "prefill_rows": steps[1] if steps else None,
        })


def run(spec: PrefillSpec) -> Path:
    """Run every model's cells into one run directory and render it; returns its path."""
    config = {
        "lengths": spec.lengths, "concurrency": spec.concurrency, "output_len": spec.output_len,
        "repeats": spec.repeats, "arm": spec.arm, "arm_spec": spec.arm_spec.settings(),
        "kv_layout": spec.kv_layout, "max_num_batched_tokens": spec.max_num_batched_tokens,
        "block_size": spec.block_size, "policies": {p: MAX_PREFILL_SEQS[p] for p in POLICIES},
        "cuda_graphs": not spec.enforce_eager and spec.device.startswith("cuda"),
        "prefill_graphs": spec.prefill_graphs, "seed": spec.seed,
        "device": spec.device, "dtype": runtime.dtype_name(spec.dtype), "random_weights": True,
        "notes": spec.notes,
    }
    run_dir = RunDir.create("prefill", result_dir=spec.result_dir, argv=spec.argv, config=config)
    for note in spec.notes:
        Console().print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
    with run_dir.recording(report.render):
        for preset in spec.lengths:
            _model_runs(spec, preset, run_dir)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return run_dir.path
