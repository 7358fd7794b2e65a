"""How long the cache state one timed slot leaves behind lasts, and whom it favours.

Why: `rltbench kernels` times arms in interleaved slots (ABBA rounds, one untimed primer per slot).
The inputs rotate over more than 3 x L2, so every call reads them from DRAM, but the cache's
*state* (which lines are dirty, which are marked evict-first) is whatever the previous slot left.
A kernel whose loads are marked evict-first keeps lines of normal priority that another kernel
left for a long time. If that moves its time, its figure depends on which arms stand next to it
in the order. `rltbench kernels --diagnose carryover` measures it directly: for a subject (the
exact arm's op, or the
same-size copy) captured exactly as the kernels command captures it, each trial runs a subject
slot (a common start), then one predecessor slot, then P replays of the subject, each timed on
its own. Predecessors: the subject's twin (the same op on other buffers), torch's op, the other
subject, an L2 flush (the kernels command's flush buffer zeroed) and an idle gap of a torch
slot's length. Position 0 follows a device sync, so it also holds the host's launch of the graph
(the reason the kernels command's slots open with a primer). Trials alternate the predecessors'
order forward and reverse.

Writes samples.json (every timed replay), summary.json (median per subject, predecessor and
position; each predecessor's median at positions 1 and 2, the two samples a kernels slot times
after its primer, against the twin's), table.md and the manifest.

    rltbench kernels --diagnose carryover --result-dir results/gpu/carryover
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rltbench.errors import UsageError

SUBJECTS = ("exact", "same-size copy")
PREDECESSORS = ("twin", "torch", "other", "flush", "idle")
IDLE_S = 0.004          # about one torch slot of the norm at 4096 x 2048 (3 replays of 32 calls)
SLOT_REPLAYS = 3        # a kernels slot: the primer and two timed samples


@dataclass(frozen=True)
class CarryoverSpec:
    """One diagnosis: the case (op, rows, width, dtype), replays timed per trial, trials, seed."""

    op: str = "rmsnorm"
    tokens: int = 4096
    width: int = 2048
    dtype: str = "bf16"
    positions: int = 8
    trials: int = 16
    seed: int = 0


def check_args(a: CarryoverSpec) -> None:
    """Every bad input as one UsageError before any GPU work."""
    from rltbench.bench.kernel_sweep import DTYPES
    from rltbench.kernels.cases import op_case

    op_case(a.op)   # UsageError for an unknown op
    if a.dtype not in DTYPES:
        raise UsageError(f"--dtypes {a.dtype!r}: expected one of {', '.join(DTYPES)}")
    if a.tokens < 1 or a.width < 1:
        raise UsageError("--tokens and --widths must be positive")
    if a.positions < 3:
        raise UsageError("--positions must be at least 3 (positions 1 and 2 are a kernels slot's samples)")
    if a.trials < 2:
        raise UsageError("--trials must be at least 2 (forward and reverse predecessor order)")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("carryover times CUDA graphs: no CUDA device here")


def summarize(samples: dict[str, dict[str, list[list[float]]]]) -> dict[str, Any]:
    """Per subject and predecessor: the median at each position, and the median of positions 1 and 2
    (a kernels slot's two timed samples) with its ratio to the twin's (> 1: slower than after the
    twin)."""
    out: dict[str, Any] = {}
    for subject, by_pred in samples.items():
        rows: dict[str, Any] = {}
        for pred, positions in by_pred.items():
            slot = [t for pos in positions[1:3] for t in pos]
            rows[pred] = {"median_us": [statistics.median(p) for p in positions],
                          "slot_median_us": statistics.median(slot)}
        twin = rows["twin"]["slot_median_us"]
        for r in rows.values():
            r["slot_vs_twin"] = r["slot_median_us"] / twin
        out[subject] = rows
    return out


def table(summary: dict[str, Any], config: dict[str, Any]) -> str:
    lines = [f"# Carry-over between slots: {config['op']} {config['tokens']} x {config['width']} "
             f"{config['dtype']}",
             "",
             f"{config['graph_calls']} calls per replay over {config['rotation_sets']} rotated input sets, "
             f"{config['trials']} trials per predecessor; us per call, median over trials. Position 0 "
             "follows a device sync (it holds the graph's launch); positions 1-2 are what a kernels slot "
             "times after its primer.",
             ""]
    n = len(next(iter(next(iter(summary.values())).values()))["median_us"])
    head = "| subject | after | " + " | ".join(f"pos {i}" for i in range(n)) + " | pos 1-2 | vs twin |"
    lines += [head, "|" + "---|" * (n + 4)]
    for subject, rows in summary.items():
        for pred, r in rows.items():
            cells = " | ".join(f"{m:.3f}" for m in r["median_us"])
            lines.append(f"| {subject} | {pred} | {cells} | {r['slot_median_us']:.3f} "
                         f"| {r['slot_vs_twin']:.4f} |")
    lines += ["", "twin: the subject's op on other buffers; other: the other subject; flush: the kernels "
              "command's L2 flush buffer zeroed; idle: a host sleep of about one torch slot."]
    return "\n".join(lines) + "\n"


def build(a: CarryoverSpec) -> tuple[dict[str, Callable[[], None]], dict[str, Any]]:
    """Runners (graph replays and the L2 flush) for each subject and its twin and torch's op, the
    graphs captured as the kernels command captures a case whose sets rotate past L2; and the
    case's facts."""
    import torch

    from rltbench.bench import timing
    from rltbench.bench.kernel_sweep import (
        BenchConfig,
        Case,
        make_arm_ops,
        make_inputs,
        size_copy,
        size_copy_sources,
    )
    from rltbench.kernels import pdl
    from rltbench.kernels.cases import op_case

    dev = torch.device("cuda")
    case = Case(a.op, a.dtype, a.width, a.tokens)
    oc = op_case(a.op)
    first = make_inputs(case, dev, a.seed, 0)
    nbytes = int(oc.bytes_moved(first))
    l2 = timing.l2_cache_bytes(dev)
    plan = timing.rotation_sets(nbytes, l2)
    k = max(plan.sets, BenchConfig.min_graph_calls)   # never flushed per sample here, unlike tiny cases

    def op_graph(arm: str) -> Any:
        ops = make_arm_ops(arm, "all")
        sets = [make_inputs(case, dev, a.seed, i) for i in range(plan.sets)]
        return timing.GraphCalls(lambda i: oc.run(ops, sets[i % len(sets)]), k, keep_outputs=plan.sets)

    def copy_graph() -> Any:
        srcs = size_copy_sources(nbytes, plan.sets, dev)
        return timing.GraphCalls(lambda i: size_copy(srcs[i % len(srcs)]), k, keep_outputs=plan.sets)

    with pdl.plain_launches():
        graphs = {"exact": op_graph("exact"), "exact~twin": op_graph("exact"), "torch": op_graph("torch"),
                  "same-size copy": copy_graph(), "same-size copy~twin": copy_graph()}
    flusher = timing.L2Flusher(dev)
    runs: dict[str, Callable[[], None]] = {n: g.replay for n, g in graphs.items()}
    runs["flush"] = flusher.flush
    facts = {"graph_calls": k, "rotation_sets": plan.sets, "rotates_past_l2": plan.covers_l2,
             "bytes_per_call": nbytes, "l2_bytes": l2, "flush_bytes": flusher.buffer.numel() * 4,
             "device": torch.cuda.get_device_name(dev)}
    return runs, facts


def measure(a: CarryoverSpec, runs: dict[str, Callable[[], None]]
            ) -> dict[str, dict[str, list[list[float]]]]:
    """Per subject, predecessor and position: the replay's time (us for all of its calls)."""
    import torch

    from rltbench.bench.timing import time_consecutive

    def slot(name: str) -> None:
        if name == "idle":
            time.sleep(IDLE_S)
        elif name == "flush":
            runs["flush"]()
        else:
            for _ in range(SLOT_REPLAYS):
                runs[name]()
        torch.cuda.synchronize()

    for name in runs:
        slot(name)
    samples: dict[str, dict[str, list[list[float]]]] = {}
    for subject in SUBJECTS:
        other = next(s for s in SUBJECTS if s != subject)
        named = {"twin": f"{subject}~twin", "torch": "torch", "other": other, "flush": "flush",
                 "idle": "idle"}
        samples[subject] = {p: [[] for _ in range(a.positions)] for p in PREDECESSORS}
        for t in range(a.trials):
            for pred in PREDECESSORS if t % 2 == 0 else PREDECESSORS[::-1]:
                slot(subject)
                slot(named[pred])
                for j, ms in enumerate(time_consecutive(runs[subject], a.positions)):
                    samples[subject][pred][j].append(ms * 1000.0)
        print(f"{subject}: {a.trials} trials x {len(PREDECESSORS)} predecessors", flush=True)
    return samples


def run_carryover(a: CarryoverSpec, result_dir: Path | None) -> str:
    """Check, build, measure and write the run directory; returns the table (and where it lies)."""
    from rltbench.results import RunDir

    check_args(a)
    config = {**asdict(a), "subjects": list(SUBJECTS), "predecessors": list(PREDECESSORS),
              "slot_replays": SLOT_REPLAYS, "idle_s": IDLE_S}
    run = RunDir.create("carryover", result_dir, argv=sys.argv, config=config)
    try:
        runs, facts = build(a)
        config |= facts
        run.update_manifest(config=config)
        raw = measure(a, runs)
        k = facts["graph_calls"]
        per_call = {s: {p: [[t / k for t in pos] for pos in by_pos] for p, by_pos in by_pred.items()}
                    for s, by_pred in raw.items()}
        run.write_json("samples.json", {"unit": "us per call", "samples": per_call})
        summary = summarize(per_call)
    except BaseException as exc:
        run.mark_ended(exc)
        raise
    return run.finish(table(summary, config), summary=summary)
