"""Running the measurements: one engine, every arm, GPU (graphs) or CPU (eager, clearly labelled).

GPU order, chosen so the profiler cannot disturb the timings:
1. copy bandwidth; weight bytes of one eager token and the K/V bytes of one step (floors.py);
2. timing: the engine's decode-step figure (rltbench.bench.decode.decode_step_cells, the same routine
   and engine sizing as the engine's decode table): per arm a `decode_benchmark` graph, CUDA events
   around back-to-back replays, arms interleaved A B C C B A, every timed cell warm; no profiler;
3. per arm: the graph-node census (exact kernels per replay), then ONE profiler session with two
   annotated phases: `rltbench.replays` (R replays of the benchmark graph: cross-check of the
   count, class breakdown, one replay kept as trace-<arm>.json.gz) and `rltbench.engine_steps`
   (K real engine decode steps at the same batch: device work launched outside the graph).
CPU (`--device cpu`): the engine runs eagerly (no graphs exist on CPU); counts are CPU `aten::` leaf ops
per decode step and times are host wall-clock - no GPU claim is made.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rltbench import runtime
from rltbench.arms import ARMS, REFERENCE, ArmSpec
from rltbench.bench.decode import decode_engine_config, decode_step_cells
from rltbench.bench.decode_benchmark import DecodeBenchmark
from rltbench.bench.timing import measure_copy_bandwidth
from rltbench.commands.profile import counting, floors
from rltbench.commands.profile.classify import ATTN, CLASSES, GEMM, classify_sequence
from rltbench.commands.profile.compat import cpu_leaf_ops, cpu_op_alias, event_time_us
from rltbench.commands.profile.defaults import DEFAULT_CONTEXT
from rltbench.commands.profile.graph_nodes import graph_census
from rltbench.commands.profile.trace import group_by_launch, one_replay_trace, parse_trace, split_phase
from rltbench.engine.engine import Engine
from rltbench.engine.types import SamplingParams
from rltbench.errors import UsageError
from rltbench.kernels import make_ops
from rltbench.results.quantiles import summarize

PHASE_REPLAYS = "rltbench.replays"
PHASE_STEPS = "rltbench.engine_steps"
TOP_KERNELS = 40


@dataclass
class ProfileSpec:
    """What one profile run measures: the model, its decode batch and context, the arms, the samples."""

    source: runtime.ModelSource
    device: str
    dtype: torch.dtype
    batch: int
    context: int
    arms: dict[str, ArmSpec]
    iters: int
    rounds: int
    replays: int
    steps: int

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def seed(self) -> int:
        return self.source.seed


def decode_tokens(spec: ProfileSpec) -> int:
    """Decode steps one request must live through: the profiled engine steps, plus on CPU the timed
    eager steps (`iters`), which are real engine steps there (GPU timing replays a benchmark graph).

    The engine caps a request at max_model_len; a request that finished early turns the remaining
    steps into no-ops that time ~0 and profile no op, so the pool must be sized for all of them.
    """
    return spec.steps + (spec.iters if spec.cpu else 0)


def extra_tokens(steps: int, iters: int, cpu: bool) -> int:
    """Positions a profiled request needs beyond its `--context` tokens (decode_tokens plus slack)."""
    return max(64, steps + (iters if cpu else 0) + 16)


def fit_context(context: int | None, model_len: int, steps: int, iters: int, cpu: bool,
                model: str) -> tuple[int, str | None]:
    """(--context, note): the cached tokens per sequence. Left at its default it is DEFAULT_CONTEXT,
    or less where the model's context cannot also hold the profiled decode steps (the tiny presets
    hold 512 tokens), and the note says so; a value the user gave must fit, else a UsageError names
    the flags and the largest value that works."""
    extra = extra_tokens(steps, iters, cpu)
    room = model_len - extra
    why = f"{extra} decode positions (--steps {steps}" + (f" + --iters {iters}" if cpu else "") + " + slack)"
    if room < 1:
        raise UsageError(f"{model}'s context of {model_len} tokens cannot hold {why}: lower "
                         + ("--iters" if cpu else "--steps"))
    if context is None:
        if room >= DEFAULT_CONTEXT:
            return DEFAULT_CONTEXT, None
        return room, (f"--context {room}: the default {DEFAULT_CONTEXT} plus {why} does not fit {model}'s "
                      f"context of {model_len} tokens")
    if context > room:
        raise UsageError(f"--context {context} plus {why} exceeds {model}'s context of {model_len} tokens: "
                         f"use --context {room} or less")
    return context, None


def build_engine(model: Any, spec: ProfileSpec) -> Engine:
    """The engine of the decode-step figure (rltbench.bench.decode.decode_engine_config, shared with
    the engine's decode table): the serving context class and graph bucket for (batch, context) and,
    on a GPU, the serving KV pool; on CPU a pool just big enough for the profiled requests."""
    extra = extra_tokens(spec.steps, spec.iters, spec.cpu)
    cfg = decode_engine_config(spec.batch, spec.context, extra_tokens=extra, use_cuda_graph=not spec.cpu,
                               model_max_len=int(model.config.max_position_embeddings))
    if spec.cpu:
        blocks_per_seq = -(-cfg.max_model_len // cfg.block_size)
        cfg.num_blocks = spec.batch * blocks_per_seq + 8
    return runtime.build_engine(model, spec.arms, cfg)


def _prompts(spec: ProfileSpec, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(spec.seed + 1)
    lo = min(8, vocab - 1)
    return [torch.randint(lo, vocab, (spec.context,), generator=g).tolist() for _ in range(spec.batch)]


def _start_decode(eng: Any, spec: ProfileSpec, vocab: int, extra_steps: int) -> list[str]:
    """Add `batch` requests of `context` tokens and step until all of them are decoding."""
    ids = [f"profile-{i}" for i in range(spec.batch)]
    params = SamplingParams(max_tokens=extra_steps + 8, ignore_eos=True)
    for rid, prompt in zip(ids, _prompts(spec, vocab), strict=False):
        eng.add_request(rid, prompt, params)
    started: set[str] = set()
    for _ in range(10_000):
        for ev in eng.step():
            started.add(ev.request_id)
        if len(started) == len(ids):
            break
    eng.step()  # one decode step outside any measurement (captures the bucket's graph if needed)
    return ids


def _decode_step(eng: Any, ids: Sequence[str]) -> None:
    """One engine step that must decode a token for every request in `ids` (never a silent no-op)."""
    got = {ev.request_id for ev in eng.step() if ev.token_ids}
    missing = [rid for rid in ids if rid not in got]
    if missing:
        raise RuntimeError(
            f"decode step produced no token for {len(missing)} of {len(ids)} requests "
            "(finished early? the engine must be sized for every measured step)"
        )


def _finish(eng: Any, ids: Sequence[str]) -> None:
    for rid in ids:
        eng.abort_request(rid)


def _export(prof: Any) -> dict[str, Any]:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="rltbench-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    finally:
        os.unlink(path)


def time_arms_gpu(eng: Any, spec: ProfileSpec) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Per-replay microseconds per arm and the cells' facts (context class, bucket, warm checks):
    the engine's decode-step timing (rltbench.bench.decode.decode_step_cells), arms ABBA over
    `rounds` repetitions of iters / rounds replays each."""
    per_slot = max(1, spec.iters // max(1, spec.rounds))
    arms = list(spec.arms)
    cells = decode_step_cells(eng, arms, [spec.batch], spec.context, reps=spec.rounds, iters=per_slot)
    samples = {a: [ms * 1e3 for ms in cells.pooled(a, spec.batch)] for a in arms}
    facts = {"len_class": cells.len_class[spec.batch], "bucket": cells.bucket[spec.batch],
             "num_blocks": eng.num_blocks, "order": cells.order, "warm": cells.warm}
    return samples, facts


def profile_arm_gpu(eng: Any, spec: ProfileSpec, arm: str, vocab: int) -> tuple[dict[str, Any], dict]:
    """Census + profiler phases for one arm; returns (result, one-replay chrome trace)."""
    eng.set_arm(arm)
    bench = DecodeBenchmark(eng, spec.batch, spec.context)
    census, census_note = graph_census(bench.graph)
    ids: list[str] = []
    try:
        bench.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(PHASE_REPLAYS):
                for _ in range(spec.replays):
                    bench.replay()
                torch.cuda.synchronize()
            bench.release()
            bench = None
            ids = _start_decode(eng, spec, vocab, spec.steps)
            torch.cuda.synchronize()
            with record_function(PHASE_STEPS):
                for _ in range(spec.steps):
                    eng.step()
                torch.cuda.synchronize()
    finally:
        if bench is not None:
            bench.release()
        _finish(eng, ids)
    trace = _export(prof)
    return summarize_trace(trace, census, census_note, spec.steps)


def summarize_trace(
    trace: dict[str, Any], census: Any, census_note: str, steps: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Counts, agreement, breakdown and the one-replay trace from a profiled arm's chrome trace."""
    parsed = parse_trace(trace)
    rc = counting.replay_counts(parsed, PHASE_REPLAYS)
    oc = counting.outside_counts(parsed, PHASE_STEPS, steps)
    steps_launches = split_phase(parsed, PHASE_STEPS).graph_launches
    groups = group_by_launch(parsed, split_phase(parsed, PHASE_REPLAYS).in_graph)
    rows, top = counting.breakdown([[e for e in g if e.kind == "kernel"] for g in groups])
    copies = counting.breakdown([[e for e in g if e.kind != "kernel"] for g in groups])[0]
    graph_kernels = census.kernels if census is not None else None
    agree, why = counting.agreement(graph_kernels, rc)
    base = graph_kernels if graph_kernels is not None else rc.kernels_per_replay
    outside = oc.kernels_per_step + oc.copies_per_step if oc.steps else 0.0
    in_graph_copies = (
        (census.memcpy + census.memset)
        if census is not None
        else (rc.memcpy_per_replay + rc.memset_per_replay)
    )
    result = {
        "graph_census": census.to_dict() if census is not None else None,
        "graph_census_note": census_note,
        "profiler": rc.to_dict(),
        "agree": agree,
        "agree_reason": why,
        "outside_graph": oc.to_dict(),
        "engine_steps_graph_launches": steps_launches,
        "kernels_per_step": base + outside,
        "graph_kernels_per_step": base,
        "graph_copies_per_step": in_graph_copies,
        "classes": [{"class": r.cls, "count": r.count, "time_us": r.time_us} for r in rows],
        "copy_nodes": [{"class": r.cls, "count": r.count, "time_us": r.time_us} for r in copies if r.count],
        "busy_us": sum(r.time_us for r in rows),
        "gemm_floor_us": counting.floor_time_us(rows),
        "top_kernels": top[:TOP_KERNELS],
    }
    first = groups[0][0].correlation if groups and groups[0] else None
    small = one_replay_trace(trace, first) if first is not None else {"traceEvents": []}
    return result, small


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------
def profile_arm_cpu(eng: Any, spec: ProfileSpec, arm: str, vocab: int) -> dict[str, Any]:
    """Eager CPU decode steps: aten leaf ops per step (classified) and host wall-clock per step."""
    eng.set_arm(arm)
    ids = _start_decode(eng, spec, vocab, decode_tokens(spec))
    try:
        wall = []
        for _ in range(spec.iters):
            t0 = time.perf_counter()
            _decode_step(eng, ids)
            wall.append((time.perf_counter() - t0) * 1e6)
        profiled = []  # the profiled steps' own wall time: the share of it the aten ops account for
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(spec.steps):
                t0 = time.perf_counter()
                _decode_step(eng, ids)
                profiled.append((time.perf_counter() - t0) * 1e6)
        ops = cpu_leaf_ops(prof.events())
    finally:
        _finish(eng, ids)
    classes = classify_sequence([cpu_op_alias(e.name) for e in ops])
    per = {c: [0.0, 0.0] for c in CLASSES}
    for e, c in zip(ops, classes, strict=False):
        per[c][0] += 1.0 / spec.steps
        per[c][1] += event_time_us(e) / spec.steps
    counts = [{"class": c, "count": v[0], "time_us": v[1]} for c, v in per.items()]
    names: dict[str, dict[str, Any]] = {}
    for e, c in zip(ops, classes, strict=False):  # per op name: count and host time per step, its class
        row = names.setdefault(e.name, {"name": e.name, "count": 0.0, "time_us": 0.0, "_classes": {}})
        row["count"] += 1.0 / spec.steps
        row["time_us"] += event_time_us(e) / spec.steps
        row["_classes"][c] = row["_classes"].get(c, 0) + 1
    top = sorted(names.values(), key=lambda r: -r["time_us"])[:TOP_KERNELS]
    for row in top:  # an op name seen in several classes (a mul in norm and in act): its most frequent
        cls = row.pop("_classes")
        row["class"] = max(cls, key=cls.get)
    return {
        "cpu_ops_per_step": len(ops) / spec.steps,
        "kernels_per_step": len(ops) / spec.steps,
        "classes": counts,
        "top_kernels": top,
        "wall_us": wall,
        "profiled_wall_us": profiled,
        "agree": None,
        "agree_reason": "CPU mode: no CUDA graph, counts are CPU aten ops",
    }


def class_floor_shares(classes: Sequence[dict[str, Any]], weight_floor_ms: float,
                       kv_floor_ms: float) -> dict[str, float]:
    """Each bounded class's share of its floor: the GEMM class against the weight-bytes floor, the
    attention class against the KV-bytes floor (floors.share_of_floor)."""
    time_us = {r["class"]: r["time_us"] for r in classes}
    return {GEMM: floors.share_of_floor(weight_floor_ms, time_us.get(GEMM)),
            ATTN: floors.share_of_floor(kv_floor_ms, time_us.get(ATTN))}


def run_profile(spec: ProfileSpec, log: Any = print, model: Any = None,
                on_arm: Any = None) -> dict[str, Any]:
    """Everything the command measures, as one JSON-able dict (+ traces under key `_traces`).
    `model`: the loaded model (else loaded here); `on_arm(out)` is called after each arm finished,
    with everything measured so far, so an interrupted run keeps its finished arms."""
    if model is None:
        model, _tok = runtime.load(spec.source, spec.device, spec.dtype)
    done = on_arm or (lambda out: None)
    vocab = int(model.config.vocab_size)
    eng = build_engine(model, spec)
    out: dict[str, Any] = {
        "mode": "cpu" if spec.cpu else "gpu",
        "batch": spec.batch,
        "context": spec.context,
        "arms": {},
        "_traces": {},
    }
    log("counting weight bytes of one eager token")
    wb = floors.count_weight_bytes(model, floors.one_token_forward(model, make_ops(ARMS[REFERENCE])))
    out["weight_bytes"] = wb
    out["kv_bytes"] = floors.kv_bytes_per_step(model.config, spec.dtype, spec.batch, spec.context)
    if spec.cpu:
        for arm in spec.arms:
            log(f"profiling arm {arm} on CPU")
            out["arms"][arm] = profile_arm_cpu(eng, spec, arm, vocab)
            done(out)
        return out
    out["device_name"] = torch.cuda.get_device_name()
    log("measuring device-to-device copy bandwidth")
    bw = measure_copy_bandwidth()
    out["copy_bandwidth"] = bw
    out["weight_floor_ms"] = floors.weight_floor_ms(wb["bytes"], bw["gbps"])
    out["kv_floor_ms"] = floors.floor_ms(out["kv_bytes"]["bytes"], bw["gbps"])
    log(f"timing {len(spec.arms)} arms x {spec.iters} replays (interleaved, no profiler)")
    samples, facts = time_arms_gpu(eng, spec)
    out["decode_step"] = facts
    for arm in spec.arms:
        log(f"profiling arm {arm}: graph census + {spec.replays} replays + {spec.steps} engine steps")
        res, small = profile_arm_gpu(eng, spec, arm, vocab)
        res["replay_us"] = samples[arm]
        res["replay_stats_us"] = summarize(samples[arm]).to_dict()
        res["floor_shares"] = class_floor_shares(res["classes"], out["weight_floor_ms"], out["kv_floor_ms"])
        out["arms"][arm] = res
        out["_traces"][arm] = small
        done(out)
    return out
