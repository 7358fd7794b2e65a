"""Prefill steps per arm: one engine prefill step of ROWS x LEN tokens per prompt length (`--lengths`,
default one length: 4 x 512 = 2048, the step of a 512-token burst under the default 2048-token budget),
eager vs graph replay, arms and modes interleaved ABBA over repetitions, with an A/A arm (torch#2:
torch measured twice). The graph is the engine's default prefill path (a token-count bucket's graph);
eager shows the same step launched from the host, so eager wall against graph GPU time says how much of
a step is host launch time. After the timing each arm's graph is replayed once more and the K and V it
wrote in every plane are compared with the torch arm's (identity of the whole step).

Warm-up (untimed), per arm: the step is scheduled and captured once (as the engine does on a shape's
second sighting), then run eagerly and replayed `--warmup` times, so every shape a timed sample runs has
been seen and every kernel compiled. Timing: the units (arm, eager|graph) in ABBA order over `--reps`
repetitions, `--iters` samples per unit and repetition; a sample is upload + forward (eager) or replay
(graph) + argmax + the D2H read of the sampled ids: CUDA events give the GPU-side span (host-bound
eager steps show their launch cost there too), perf_counter the wall time. Each unit's repetition runs
inside a ColdWork check (graph captures, Triton compiles, device mallocs: all must be 0, else the table
flags it).

Reported per unit: median and p10-p90 over all samples. Speedups are paired per repetition (graph over
eager for each arm; each arm over torch in each mode) with their order-statistic interval, beside the
A/A spread of the same mode; one whose interval reaches into that spread is "within noise". Also:
whether replay and eager sample the same ids (and each arm the torch arm's), and how much the graph
pool grew for the capture (the memory that must fit in kv_headroom_gib). Random-weight Ouro-1.4B, bf16;
about a minute on an H200.

    rltbench profile --bench prefill --result-dir results/gpu/prefill
    rltbench profile --bench prefill --batch 1 --lengths 512,2048,4096,8192
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rltbench.bench.timing import time_synced_call
from rltbench.bench.warmth import ColdWork, cold_cells
from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine.scheduler import PrefillBatch
from rltbench.errors import UsageError
from rltbench.kernels import ARMS
from rltbench.kernels.norm import onelaunch as norm_onelaunch
from rltbench.models import build_model
from rltbench.results import RunDir
from rltbench.results.quantiles import summarize
from rltbench.results.stats import (
    aa_name,
    abba_order,
    compare_to_reference,
    format_interval,
    format_spread,
    noise_label,
    paired_ratio_interval,
    rep_medians,
)

MODES = ("eager", "graph")
REF = "torch"


def unit_name(arm: str, mode: str) -> str:
    return f"{arm}/{mode}"


def timed_call(fn: Callable[[], list[int]], cuda: bool) -> tuple[float, float, list[int]]:
    """(GPU ms by CUDA events, wall ms, sampled ids) of one call; `fn` ends in a D2H read (a sync).
    Without CUDA the GPU span is the wall time."""
    if not cuda:
        t0 = time.perf_counter()
        ids = fn()
        wall = (time.perf_counter() - t0) * 1e3
        return wall, wall, ids
    return time_synced_call(fn)


def interleaved_samples(
    units: dict[str, Callable[[], list[int]]],
    reps: int,
    iters: int,
    cuda: bool,
    engine: Any = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Time every unit `iters` times per repetition, units in ABBA order over `reps` repetitions, each
    repetition of a unit inside a ColdWork check. Returns {"gpu_ms": {unit: [[rep samples]...]}, "wall_ms":
    same, "warm": [records], "order": [...], "ids": {unit: last sampled ids}}."""
    names = list(units)
    out: dict[str, Any] = {"gpu_ms": {n: [] for n in names}, "wall_ms": {n: [] for n in names},
                           "warm": [], "order": abba_order(names, reps), "ids": {}}  # fmt: skip
    for i, name in enumerate(out["order"]):
        gpu, wall = [], []
        with ColdWork(engine, device) as check:
            for _ in range(iters):
                g, w, out["ids"][name] = timed_call(units[name], cuda)
                gpu.append(g)
                wall.append(w)
        out["gpu_ms"][name].append(gpu)
        out["wall_ms"][name].append(wall)
        out["warm"].append({"unit": name, "rep": i // len(names), **check.record()})
    return out


def summarize_units(timed: dict[str, Any], arms: list[str]) -> dict[str, Any]:
    """Per unit: median and p10-p90 over every sample (GPU and wall), per-repetition medians; the
    paired speedups with their intervals, A/A spreads and labels."""
    units: dict[str, Any] = {}
    for name, reps in timed["gpu_ms"].items():
        gpu = summarize([x for r in reps for x in r])
        wall = summarize([x for r in timed["wall_ms"][name] for x in r])
        units[name] = {"median_ms": gpu.median, "p10_ms": gpu.p10, "p90_ms": gpu.p90, "n": gpu.n,
                       "wall_median_ms": wall.median, "rep_median_ms": rep_medians(reps)}  # fmt: skip
    aa = aa_name(REF) if aa_name(REF) in arms else None
    vs_torch, aa_iv = {}, {}
    for mode in MODES:
        per_rep = {a: units[unit_name(a, mode)]["rep_median_ms"] for a in arms}
        vs_torch[mode] = compare_to_reference(per_rep, REF, aa) if REF in arms else []
        aa_iv[mode] = paired_ratio_interval(per_rep[REF], per_rep[aa]) if aa else None
    # graph over eager is judged against the wider of the two modes' A/A spreads
    noise = max((iv for iv in aa_iv.values() if iv is not None), key=lambda iv: iv.spread, default=None)
    graph_over_eager = []
    for a in arms:
        iv = paired_ratio_interval(units[unit_name(a, "eager")]["rep_median_ms"],
                                   units[unit_name(a, "graph")]["rep_median_ms"])  # fmt: skip
        graph_over_eager.append({"arm": a, "speedup": iv.to_dict() if iv else None,
                                 "aa_spread": noise.spread if noise else None,
                                 "label": noise_label(iv, noise)})  # fmt: skip
    return {"units": units, "vs_torch": vs_torch, "graph_over_eager": graph_over_eager,
            "aa": aa, "cold_cells": cold_cells(timed["warm"])}  # fmt: skip


def schedule_step(engine: Engine, tag: str, prompts: list[list[int]]) -> tuple[Any, list[str]]:
    """Queue `prompts` and schedule them as one prefill step; returns (step layout, request ids)."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    ids = [f"pf-{tag}-{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, p, params)
    batch = engine.scheduler.schedule()
    assert isinstance(batch, PrefillBatch) and batch.num_tokens == sum(map(len, prompts)), batch
    step, done = engine.runner.prefill_layout(batch)
    assert len(done) == len(prompts)
    return step, ids


def step_units(engine: Engine, arm: str, step: Any) -> dict[str, Callable[[], list[int]]]:
    """The eager step (the engine's eager path: torch ops for scope-graph arms) and the replay of the
    arm's captured graph for `step`'s shape, each reading `step`'s metadata from the static buffer."""
    runner, state = engine.runner, engine._arms[arm]

    def eager() -> list[int]:
        runner.upload_prefill(step.packed)
        out = runner.prefill_forward(step, state.ops)
        assert out is not None
        return out.tolist()

    entry = state.prefill.get(step.key)
    if entry is None:
        raise RuntimeError(f"{arm}: no prefill graph for the step's shape (capture failed or evicted)")
    graph, gout = entry
    assert gout is not None

    def replay() -> list[int]:
        runner.upload_prefill(step.packed)
        graph.replay()
        return gout.tolist()

    return {unit_name(arm, "eager"): eager, unit_name(arm, "graph"): replay}


def warm_arm(engine: Engine, arm: str, prompts: list[list[int]], warmup: int) -> dict[str, Any]:
    """Untimed: capture the arm's graph for the step's shape, then run eager and replay `warmup`
    times; returns capture seconds, pool growth and whether replay samples the eager ids."""
    engine.set_arm(arm)
    step, ids = schedule_step(engine, f"warm-{arm}", prompts)
    engine.runner.upload_prefill(step.packed)  # sizes the static buffer before the capture reads it
    torch.cuda.synchronize()
    reserved0 = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    if engine.runner.capture_prefill(step) is None:
        raise RuntimeError(f"{arm}: prefill capture failed (see the warning above)")
    capture_s = time.perf_counter() - t0
    pool_mib = (torch.cuda.memory_reserved() - reserved0) / 2**20
    got: dict[str, list[int]] = {}
    for name, fn in step_units(engine, arm, step).items():
        for _ in range(max(1, warmup)):
            got[name] = fn()
    for rid in ids:
        engine.abort_request(rid)
    eager_ids, graph_ids = got[unit_name(arm, "eager")], got[unit_name(arm, "graph")]
    return {"arm": arm, "tokens": step.n_tok, "rows": step.nb, "capture_s": capture_s,
            "pool_growth_mib": pool_mib, "graph_ids_equal_eager": graph_ids == eager_ids}  # fmt: skip


def kv_of_step(engine: Engine, step: Any) -> torch.Tensor:
    """Every plane's K and V at the step's real tokens (a copy): what each layer of each loop computed
    for every token, so arms whose copies are equal computed the whole step to the same bits."""
    kv = engine.runner.kv
    planes, two, nb, bs = kv.shape[:4]
    t = step.layout.tokens
    slots = torch.as_tensor(step.packed[2 * t : 2 * t + step.n_tok], device=kv.device)
    return kv.view(planes, two, nb * bs, *kv.shape[4:]).index_select(2, slots)


def kv_identity(engine: Engine, arms: list[str], step: Any) -> dict[str, bool]:
    """Replay each arm's graph of the timed step once and compare the K/V it wrote in every plane
    with the torch arm's (torch.equal): identity of the whole step, not only of its sampled ids."""
    out: dict[str, bool] = {}
    ref = None
    for arm in [REF] + [a for a in arms if a != REF]:
        replay = step_units(engine, arm, step)[unit_name(arm, "graph")]
        replay()
        got = kv_of_step(engine, step)
        if ref is None:
            ref = got
        out[arm] = torch.equal(got, ref)
        del got
    return out


def measure_length(model: Any, arms: list[str], rows: int, length: int, reps: int, iters: int,
                   warmup: int) -> dict[str, Any]:
    """One prompt length: an engine sized for one step of `rows` x `length` tokens, every arm's graph
    captured and warmed, the units timed ABBA; the per-length part of summary.json."""
    tokens = rows * length
    bs = 16
    cfg = EngineConfig(
        block_size=bs,
        num_blocks=rows * -(-length // bs) + 16,
        max_num_seqs=max(8, rows),
        max_num_batched_tokens=tokens,
        max_model_len=length + 16,
        enable_prefix_caching=False,
    )
    g = torch.Generator().manual_seed(1234 + length)
    prompts = torch.randint(3, model.config.vocab_size, (rows, length), generator=g).tolist()
    out: dict[str, Any] = {"rows": rows, "length": length}
    engine = Engine(model, {a: ARMS[a.split("#")[0]] for a in arms}, cfg)
    out["warmup"] = [warm_arm(engine, a, prompts, warmup) for a in arms]
    step, ids = schedule_step(engine, "timed", prompts)
    out["step_tokens"], out["bucketed"] = step.layout.tokens, step.bucketed
    units = {n: fn for a in arms for n, fn in step_units(engine, a, step).items()}
    timed = interleaved_samples(units, reps, iters, True, engine, torch.device("cuda"))
    out["kv_equal_torch"] = kv_identity(engine, arms, step)
    for rid in ids:
        engine.abort_request(rid)
    out["order"], out["warm"] = timed["order"], timed["warm"]
    out["samples_ms"] = timed["gpu_ms"]
    out["result"] = summarize_units(timed, arms)
    ref_ids = timed["ids"][unit_name(REF, "graph")]
    out["ids_equal_torch"] = {a: timed["ids"][unit_name(a, "graph")] == ref_ids for a in arms}
    out["graph_ids"] = {a: timed["ids"][unit_name(a, "graph")] for a in arms}
    del engine, units
    torch.cuda.empty_cache()
    return out


def table(summary: dict[str, Any]) -> str:
    """table.md from summary.json: the arms at every prompt length, then each length's detail."""
    s = summary
    done = s.get("per_length", [])
    lines = [
        f"# Prefill step per arm, {s['rows']} prompt(s) of {', '.join(map(str, s['lengths']))} tokens "
        f"(random-weight {s['model']})",
        "",
        f"Per length one prefill step (rows x length tokens; a bucketed step's graph holds its token-count "
        f"bucket, `step tokens`). Units (arm/mode) ABBA over {s['reps']} repetitions x {s['iters']} samples, "
        "every kernel and graph warmed first. ms = CUDA-event span of upload + step + argmax + D2H ids "
        "(median, p10-p90 over all samples); wall = perf_counter. eager = the step launched from the host "
        "(the arm's eager ops: torch ops for scope-graph arms), graph = its CUDA graph replayed (what the "
        "engine runs by default). Speedups are medians of per-repetition ratios with their order-statistic "
        "interval; within noise = the interval reaches into the A/A spread "
        f"({s['aa'] or 'no A/A arm'}). KV = torch: every plane's K and V of the step equal to the torch "
        "arm's bit for bit (each arm's graph replayed once after the timing).",
        "",
        "| prompt tokens | step tokens | arm | graph ms (p10-p90) | graph vs torch (interval) | A/A spread "
        "| label | eager wall ms | graph/eager | KV = torch | ids = torch |",
        "|" + "---|" * 11,
    ]
    for d in done:
        res = d["result"]
        vs = {r["arm"]: r for r in res["vs_torch"]["graph"]}
        goe = {r["arm"]: r for r in res["graph_over_eager"]}
        for w in d["warmup"]:
            a = w["arm"]
            g, e = res["units"][unit_name(a, "graph")], res["units"][unit_name(a, "eager")]
            cmp = _speedup(vs[a]) if a in vs else "ref | - | -"
            lines.append(
                f"| {d['rows'] * d['length']} | {d['step_tokens']} | {a} | {_ms(g)} | {cmp} | "
                f"{e['wall_median_ms']:.2f} | {format_interval(goe[a]['speedup'], 2)} | "
                f"{d['kv_equal_torch'].get(a, '-')} | {d['ids_equal_torch'].get(a, '-')} |"
            )
    for d in done:
        lines += ["", *length_detail(d, s)]
    missing = [n for n in s["lengths"] if n not in {d["length"] for d in done}]
    if missing:
        lines += ["", f"Not measured (the run ended first): {', '.join(map(str, missing))} tokens."]
    return "\n".join(lines)


def length_detail(d: dict[str, Any], s: dict[str, Any]) -> list[str]:
    """One length's warm-cell line, eager vs graph per arm and the arm comparisons per mode."""
    res = d["result"]
    lines = [f"## {d['rows']} x {d['length']} tokens", ""]
    cold = res["cold_cells"]
    lines += [f"**{len(cold)} timed cells were not warm**: " + ", ".join(
        f"{c['unit']} rep {c['rep']}" for c in cold), ""] if cold else [
        f"All {len(d['warm'])} timed cells warm (no capture, compile or device malloc inside any).",
        ""]
    lines += ["| arm | eager ms (p10-p90) | eager wall ms | graph ms (p10-p90) | graph wall ms | graph/eager "
              "speedup | A/A | label | pool MiB | ids = eager | ids = torch |", "|" + "---|" * 11]
    goe = {r["arm"]: r for r in res["graph_over_eager"]}
    for w in d["warmup"]:
        a = w["arm"]
        e, g = res["units"][unit_name(a, "eager")], res["units"][unit_name(a, "graph")]
        lines.append(
            f"| {a} | {_ms(e)} | {e['wall_median_ms']:.2f} | {_ms(g)} | {g['wall_median_ms']:.2f} | "
            f"{_speedup(goe[a], 2)} | {w['pool_growth_mib']:.0f} | {w['graph_ids_equal_eager']} | "
            f"{d['ids_equal_torch'].get(a, '-')} |"
        )
    for mode in MODES:
        lines += ["", f"| {mode}: arm vs torch | speedup (interval) | A/A spread | label |", "|" + "---|" * 4]
        lines += [f"| {r['arm']} | {_speedup(r)} |" for r in res["vs_torch"][mode]]
    return lines


def _ms(u: dict[str, Any]) -> str:
    return f"{u['median_ms']:.2f} ({u['p10_ms']:.2f}-{u['p90_ms']:.2f})"


def _speedup(r: dict[str, Any], digits: int = 3) -> str:
    """'speedup (interval) | A/A spread | label' cells of one comparison row."""
    return f"{format_interval(r['speedup'], digits)} | {format_spread(r['aa_spread'])} | {r['label']}"


def run_prefill_steps(model_name: str, arms_text: str, no_aa: bool, rows: int, lengths: list[int], reps: int,
                      iters: int, warmup: int, result_dir: Path | None) -> str:
    """`rltbench profile --bench prefill`: the run directory's table (UsageError before any work).
    Lengths run one after another; summary.json is rewritten after each, so an interrupted run keeps
    the lengths it finished."""
    if not torch.cuda.is_available():
        raise UsageError("--bench prefill needs a CUDA GPU")
    arms = [a for a in arms_text.split(",") if a]
    if REF not in arms or any(a not in ARMS for a in arms):
        raise UsageError(f"--arms must include {REF} and name arms of {sorted(ARMS)}")
    if not no_aa:
        arms.append(aa_name(REF))
    run = RunDir.create(
        "prefill",
        result_dir,
        argv=list(sys.argv),
        config={"model": model_name, "arms": arms, "rows": rows, "lengths": lengths,
                "reps": reps, "iters": iters, "warmup": warmup,
                "selections": {a: ARMS[a.split("#")[0]].to_dict() for a in arms}, "random_weights": True},
    )  # fmt: skip
    model = build_model(model_name, device="cuda", dtype=torch.bfloat16, seed=0)
    norm_onelaunch.prevalidate([model.config.hidden_size], [torch.bfloat16])
    summary: dict[str, Any] = {"model": model_name, "rows": rows, "lengths": lengths, "reps": reps,
                               "iters": iters, "arms": arms, "aa": aa_name(REF) if not no_aa else None,
                               "per_length": []}  # fmt: skip
    try:
        with torch.inference_mode():
            for length in lengths:
                print(f"prefill step: {rows} x {length} tokens", flush=True)
                summary["per_length"].append(measure_length(model, arms, rows, length, reps, iters, warmup))
                run.write_json("summary.json", summary)
    except BaseException as exc:
        if summary["per_length"]:
            run.write_text("table.md", table(summary) + "\n")
        run.mark_ended(exc)
        raise
    return run.finish(table(summary), summary=summary)
