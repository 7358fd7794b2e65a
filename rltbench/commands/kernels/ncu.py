"""Counters and kernel timestamps of the norms at 4096 x 2048 (bf16) beside streaming copies.

Why: `rltbench kernels` times each arm by replaying a CUDA graph of calls back to back (inputs
rotated over more than 3 x L2) and reports its rate as a percentage of the device copy. At 4096 x
2048 the exact plain norm sits a few percent below a streaming copy of its own size there
(docs/limits.md), and timings alone cannot say where that goes: DRAM bytes beyond the kernel's
input and output, fewer programs resident, SMs idle while the DRAM works, or the company the
kernel keeps (the dirty lines and the launch of the call before it). Nsight Compute counts the
first three; kernel timestamps split the time between the kernel and what lies between kernels.

Three views, each its own pass over the same cases:
* alone (`kernel`, Nsight Compute): every launch profiled by itself, L2 flushed and invalidated
  before it (`--cache-control all`): the kernel's own duration and traffic, with no neighbour;
* back to back (`graph`, Nsight Compute): the kernels command's graph of calls (at least 32,
  cycling over the rotated sets) profiled as one workload (`--graph-profiling graph`,
  `--cache-control none`), counters per call. Nsight Compute replays the graph once per pass of
  counters and does its own work between the nodes, so the graph's duration is not reported;
* back to back, timestamps (`trace`): the same graph replayed under torch.profiler (CUPTI kernel
  records): each kernel's duration, the gap to the next one and the period from start to start,
  which splits the per-call time the kernels command measures into the kernel and what lies
  between kernels.
Clocks are left free (`--clock-control none`). The kernels command's figures stay the headline;
here a kernel is compared with the copies beside it in the same view.

`rltbench kernels --diagnose ncu` runs Nsight Compute on this module: the child (`--workload`)
builds the cases, warms them
(compiles, the exact norm's validation, graph captures), then launches each case once per
repetition (cases in ABBA order) between cudaProfilerStart/Stop (or under torch.profiler) and
writes the launch plan; the parent reads each report back as CSV and joins its rows to the plan in
launch order (it fails if their counts differ: a case is one kernel or one graph). Writes
metrics_<view>.csv (every metric collected, per launch), plan_<view>.json, launches.jsonl,
summary.json and table.md (with --keep-reports also the raw reports, ncu_<view>.ncu-rep.gz); each
view's rows are kept as soon as it ends.

    rltbench kernels --diagnose ncu --result-dir results/gpu/ncu-norm
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rltbench.bench.kernel_sweep import BenchConfig
from rltbench.errors import UsageError

if TYPE_CHECKING:
    from rltbench.results import RunDir

# what each metric answers (Nsight Compute names; base units: ns, bytes, %); launch__* only alone
METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "duration, ns",
    "dram__bytes_read.sum": "bytes read from DRAM",
    "dram__bytes_write.sum": "bytes written to DRAM",
    "lts__t_sectors_srcunit_tex_op_read.sum": "L2 sectors read by the SMs' loads",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum": "of those, hits in L2",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, % of the warp slots",
    "sm__cycles_active.avg": "cycles an SM had a resident warp (mean over SMs)",
    "gpc__cycles_elapsed.max": "cycles elapsed",
    "launch__registers_per_thread": "registers per thread",
    "launch__grid_size": "programs (thread blocks)",
    "launch__occupancy_limit_registers": "programs per SM the registers allow",
}
PER_CALL = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum")
VIEWS: dict[str, list[str] | None] = {   # view -> its Nsight Compute options (None: no ncu)
    "kernel": ["--cache-control", "all"],
    "graph": ["--graph-profiling", "graph", "--cache-control", "none"],
    "trace": None,
}
GRAPH_CALLS = BenchConfig.min_graph_calls   # at least this many calls per graph, as the kernels command
LARGE_COPY = "large copy"
Call = Callable[[int], Any]   # one launch on input set i % sets




@dataclass(frozen=True)
class NcuSpec:
    """One diagnosis: the norms' rows and width, launches per case and view, the views, the large
    copy's size, whether the raw reports are kept, and the Nsight Compute executable."""

    tokens: int = 4096
    width: int = 2048
    reps: int = 8
    views: tuple[str, ...] = tuple(VIEWS)
    large_copy_mib: int = 1024
    keep_reports: bool = False
    ncu: str = "ncu"


def parse_views(text: str) -> tuple[str, ...]:
    """`--views`: a comma list of VIEWS (UsageError naming the option otherwise)."""
    views = tuple(v for v in text.split(",") if v)
    unknown = [v for v in views if v not in VIEWS]
    if unknown or not views:
        raise UsageError(f"--views: {','.join(unknown) or 'none given'}; choose from {','.join(VIEWS)}")
    return views


def parse_workload_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The child's command line (written by `child_command`, never by a user)."""
    p = argparse.ArgumentParser(description="the workload of `rltbench kernels --diagnose ncu`")
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--workload-mode", choices=list(VIEWS), default="kernel")
    for name in ("--tokens", "--width", "--reps", "--large-copy-mib"):
        p.add_argument(name, type=int, required=True)
    return p.parse_args(argv)


Case = tuple[Call, int, int, int]   # call, input sets, bytes read once, bytes written once


def build_cases(tokens: int, width: int, large_copy_mib: int) -> dict[str, Case]:
    """case name -> (call(i): one launch on input set i % sets, sets, input bytes, output bytes).
    Norms through the arms' Ops (scope all: eager calls take the fused kernels) as the kernels
    command's cases call them; copies through the kernels command's same-size copy (torch's
    elementwise kernel, never a memcpy). The sets rotate over more than 3 x L2, as the kernels
    command's do."""
    import torch

    from rltbench.bench import timing
    from rltbench.bench.kernel_sweep import liger_available, make_arm_ops, size_copy, size_copy_sources
    from rltbench.kernels.cases import op_case

    dev = torch.device("cuda")
    l2 = timing.l2_cache_bytes(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    cases: dict[str, Case] = {}
    # exact#2: the exact norm again, its own inputs and Ops: the A/A pair that shows each view's spread
    arms = [("exact", "rmsnorm"), ("exact#2", "rmsnorm"), ("exact", "rmsnorm_residual"),
            ("approx", "rmsnorm")]
    if liger_available():
        arms.append(("liger", "rmsnorm"))
    size_of: dict[str, int] = {}
    for arm, op in arms:
        case = op_case(op)
        first = case.make_inputs(tokens, width, torch.bfloat16, dev, gen)
        size_of[op] = case.bytes_moved(first)
        n = timing.rotation_sets(size_of[op], l2).sets
        sets = [first] + [case.make_inputs(tokens, width, torch.bfloat16, dev, gen) for _ in range(n - 1)]
        ops = make_arm_ops(arm.split("#")[0], "all")
        written = sum(first[k].numel() * first[k].element_size() for k in case.output_keys)
        cases[f"{arm} {op}"] = (lambda i, c=case, o=ops, ss=sets: c.run(o, ss[i % len(ss)]), n,
                                size_of[op] - written, written)
    for op, nbytes in size_of.items():
        n = timing.rotation_sets(nbytes, l2).sets
        srcs = size_copy_sources(nbytes, n, dev)
        half = srcs[0].numel() * srcs[0].element_size()
        cases[f"same-size copy {op}"] = (lambda i, ss=srcs: size_copy(ss[i % len(ss)]), n, half, half)
    big = size_copy_sources(large_copy_mib << 20, 1, dev)[0]
    half = big.numel() * big.element_size()
    cases[LARGE_COPY] = (lambda i, s=big: size_copy(s), 1, half, half)
    return cases


def kernel_spans(prof: Any) -> list[tuple[float, float]]:
    """(start, end) in ns of every GPU kernel a torch.profiler run recorded, in start order."""
    from torch.autograd import DeviceType

    return sorted((e.time_range.start * 1e3, e.time_range.end * 1e3) for e in prof.events()
                  if e.device_type == DeviceType.CUDA)


def trace_record(spans: list[tuple[float, float]]) -> dict[str, Any]:
    """One replay's kernels: how many, and the medians of each kernel's duration, of the gap from
    one kernel's end to the next one's start, and of the period from start to start, in ns."""
    pairs = list(zip(spans, spans[1:], strict=False))
    return {"kernels": len(spans),
            "duration_ns": statistics.median(e - b for b, e in spans) if spans else None,
            "gap_ns": statistics.median(n[0] - p[1] for p, n in pairs) if pairs else None,
            "period_ns": statistics.median(n[0] - p[0] for p, n in pairs) if pairs else None}


def run_workload(a: argparse.Namespace) -> None:
    """Warm every case (compiles, the exact norm's validation); in the graph and trace views
    capture each case's calls (at least GRAPH_CALLS, cycling over its sets) into one graph as the
    kernels command does; then launch each case (one kernel, or one replay) once per repetition,
    cases in ABBA order, between cudaProfilerStart/Stop (the Nsight Compute views) or under
    torch.profiler (trace: each kernel's start and end), and write the plan (one entry per
    launch; in the trace view with its kernels' medians)."""
    import torch

    from rltbench.bench import timing
    from rltbench.kernels import pdl
    from rltbench.results.stats import abba_order

    view = a.workload_mode
    cases = build_cases(a.tokens, a.width, a.large_copy_mib)
    # plain launches, as every headline figure of the kernels command (approx's tuned launch would
    # otherwise overlap the previous kernel through programmatic dependent launch)
    with torch.inference_mode(), pdl.plain_launches():
        launch: dict[str, Call] = {}
        calls: dict[str, int] = {}
        for name, (call, n, _, _) in cases.items():
            if view in ("graph", "trace"):
                k = max(n, GRAPH_CALLS)
                graph = timing.GraphCalls(call, k, keep_outputs=n)
                launch[name], calls[name] = (lambda rep, g=graph: g.replay()), k
            else:
                for i in range(n):
                    call(i)
                launch[name], calls[name] = call, 1
        torch.cuda.synchronize()
        plan = []
        for i, name in enumerate(abba_order(list(cases), a.reps)):
            rep = i // len(cases)
            entry = {"case": name, "rep": rep, "calls": calls[name], "read_bytes": cases[name][2],
                     "write_bytes": cases[name][3]}
            if view == "trace":
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    launch[name](rep)
                    torch.cuda.synchronize()
                entry.update(trace_record(kernel_spans(prof)))
            else:
                torch.cuda.profiler.start()
                launch[name](rep)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            plan.append(entry)
    a.workload.write_text(json.dumps(plan))


# ---------------------------------------------------------------------------------------------
# the parent: Nsight Compute on the child, the reports read back
# ---------------------------------------------------------------------------------------------
def number(text: str) -> float | None:
    """An Nsight Compute CSV value as a float (thousands separators dropped); None when empty or
    not a number ("n/a")."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict[str, Any]]:
    """Rows of `ncu --import R --csv --page raw`: a header line, a units line, then one line per
    profiled kernel or graph. Returns per row its name and the METRICS found, as floats."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]   # ncu's own notes are unquoted
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        raise RuntimeError("Nsight Compute returned no profiled kernels")
    header, body = rows[0], rows[2:]
    out = []
    for r in body:
        rec = dict(zip(header, r, strict=False))
        row: dict[str, Any] = {"kernel": rec.get("Kernel Name", "?")}
        row.update({m: number(rec[m]) for m in METRICS if m in rec})
        out.append(row)
    return out


ID_COLUMNS = ("ID", "Kernel Name", "Block Size", "Grid Size", "Device")


def metric_columns(text: str) -> str:
    """The raw CSV cut to the launch's identity and the METRICS (header and units rows kept): the
    raw page also repeats every device attribute on every row, ten times the size."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        return ""
    keep = [i for i, name in enumerate(rows[0]) if name in ID_COLUMNS or name in METRICS]
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([r[i] for i in keep] for r in rows)
    return out.getvalue()


def join_plan(plan: list[dict[str, Any]], profiled: list[dict[str, Any]], view: str) -> list[dict[str, Any]]:
    """The plan's launches and the report's rows in launch order, one to one; the counted
    quantities divided by the launch's calls (figures per call)."""
    if len(plan) != len(profiled):
        raise RuntimeError(f"{view}: {len(profiled)} rows profiled for {len(plan)} planned launches: a "
                           "case launched more or fewer than one kernel or graph")
    rows = []
    for p, k in zip(plan, profiled, strict=True):
        row = {"view": view, **p, **k}
        for m in PER_CALL:
            if row.get(m) is not None:
                row[m] = row[m] / p["calls"]
        rows.append(row)
    return rows


def _same_size_copy(case: str, cases: dict[str, Any]) -> Any:
    """The same-size copy beside a kernel case ("exact rmsnorm" -> "same-size copy rmsnorm"); None
    for the copies themselves."""
    if case.startswith(("same-size", LARGE_COPY)):
        return None
    return cases.get(f"same-size copy {case.split(' ', 1)[1]}")


def summarize_counters(rows: list[dict[str, Any]], view: str) -> dict[str, dict[str, Any]]:
    """Per case of an Nsight Compute view: the median of each metric over its launches, the
    kernel's name, and the derived figures: DRAM bytes against the case's inputs and outputs, L2 hit
    rate of loads; alone also the duration (min-max) against the same-size copy's, the DRAM rate
    against the large copy's and the SM-active share. Back to back those three are left out: a
    profiled graph runs longer than its replay (Nsight Compute's own work between the nodes), so its
    duration is not the calls' time."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r)
    timed = view == "kernel"
    out: dict[str, dict[str, Any]] = {}
    for case, rs in by_case.items():
        med = {m: statistics.median(v) for m in METRICS
               if (v := [r[m] for r in rs if r.get(m) is not None])}
        s: dict[str, Any] = {"kernel": rs[0]["kernel"], "launches": len(rs), "calls": rs[0]["calls"],
                             "read_bytes": rs[0]["read_bytes"], "write_bytes": rs[0]["write_bytes"],
                             "median": med}
        s["dram_read_vs_inputs"] = med.get("dram__bytes_read.sum", 0.0) / s["read_bytes"]
        s["dram_write_vs_outputs"] = med.get("dram__bytes_write.sum", 0.0) / s["write_bytes"]
        reads = med.get("lts__t_sectors_srcunit_tex_op_read.sum")
        if reads:
            hits = med.get("lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum", 0.0)
            s["l2_load_hit_pct"] = 100 * hits / reads
        dur = [r["gpu__time_duration.sum"] for r in rs if r.get("gpu__time_duration.sum") is not None]
        if timed and dur:
            s.update(duration_ns=statistics.median(dur), duration_ns_min=min(dur), duration_ns_max=max(dur))
            dram = med.get("dram__bytes_read.sum", 0.0) + med.get("dram__bytes_write.sum", 0.0)
            s["dram_gbps"] = dram / s["duration_ns"]
            if med.get("gpc__cycles_elapsed.max") and med.get("sm__cycles_active.avg") is not None:
                s["sm_active_pct"] = 100 * med["sm__cycles_active.avg"] / med["gpc__cycles_elapsed.max"]
        out[case] = s
    for case, s in out.items():
        copy = _same_size_copy(case, out)
        if copy and copy.get("duration_ns") and s.get("duration_ns"):
            s["duration_vs_same_size_copy"] = s["duration_ns"] / copy["duration_ns"]
    big = out.get(LARGE_COPY)
    if big and big.get("dram_gbps"):
        for s in out.values():
            if s.get("dram_gbps"):
                s["dram_rate_pct_of_large_copy"] = 100 * s["dram_gbps"] / big["dram_gbps"]
    return out


def summarize_trace(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case of the trace view: medians over its replays of the kernels' duration, the gap
    between kernels and the period (start to start), the period's min-max, and each against the
    same-size copy's (ratios for duration and period, the difference for the gap)."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for case, rs in by_case.items():
        s: dict[str, Any] = {"launches": len(rs), "calls": rs[0]["calls"],
                             "kernels_per_replay": sorted({r["kernels"] for r in rs})}
        for key in ("duration_ns", "gap_ns", "period_ns"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            s[key] = statistics.median(vals) if vals else None
            if key == "period_ns" and vals:
                s["period_ns_min"], s["period_ns_max"] = min(vals), max(vals)
        out[case] = s
    for case, s in out.items():
        copy = _same_size_copy(case, out)
        if copy and copy.get("period_ns") and s.get("period_ns"):
            s["period_vs_same_size_copy"] = s["period_ns"] / copy["period_ns"]
            s["duration_vs_same_size_copy"] = s["duration_ns"] / copy["duration_ns"]
            s["gap_ns_minus_same_size_copy"] = s["gap_ns"] - copy["gap_ns"]
    return out


def summarize(rows: list[dict[str, Any]], view: str) -> dict[str, dict[str, Any]]:
    """A view's summary per case (summarize_trace or summarize_counters)."""
    return summarize_trace(rows) if view == "trace" else summarize_counters(rows, view)


COUNTER_COLUMNS = ("case", "us (min-max)", "x copy time", "DRAM MB read / written", "read / inputs",
                   "written / outputs", "DRAM GB/s", "% of large copy's rate", "L2 hit % of loads",
                   "SM active %", "occupancy %", "regs", "programs", "programs/SM by regs")
TRACE_COLUMNS = ("case", "period us (min-max)", "x copy period", "kernel us", "x copy kernel", "gap us",
                 "gap - copy's, us", "kernels per replay")
TITLES = {"kernel": "Alone (Nsight Compute)", "graph": "Back to back (Nsight Compute)",
          "trace": "Back to back, timestamps (torch.profiler)"}


def _fmt(v: Any, fmt: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v / scale, fmt)


def _counter_cells(case: str, s: dict[str, Any]) -> list[str]:
    m = s["median"]
    return [
        case,
        "-" if s.get("duration_ns") is None else
        f"{_fmt(s['duration_ns'], '.2f', 1e3)} "
        f"({_fmt(s['duration_ns_min'], '.2f', 1e3)}-{_fmt(s['duration_ns_max'], '.2f', 1e3)})",
        _fmt(s.get("duration_vs_same_size_copy"), ".3f"),
        f"{_fmt(m.get('dram__bytes_read.sum'), '.2f', 1e6)} / "
        f"{_fmt(m.get('dram__bytes_write.sum'), '.2f', 1e6)}",
        _fmt(s.get("dram_read_vs_inputs"), ".3f"),
        _fmt(s.get("dram_write_vs_outputs"), ".3f"),
        _fmt(s.get("dram_gbps"), ".0f"),
        _fmt(s.get("dram_rate_pct_of_large_copy"), ".1f"),
        _fmt(s.get("l2_load_hit_pct"), ".1f"),
        _fmt(s.get("sm_active_pct"), ".1f"),
        _fmt(m.get("sm__warps_active.avg.pct_of_peak_sustained_active"), ".1f"),
        _fmt(m.get("launch__registers_per_thread"), ".0f"),
        _fmt(m.get("launch__grid_size"), ".0f"),
        _fmt(m.get("launch__occupancy_limit_registers"), ".0f"),
    ]


def _trace_cells(case: str, s: dict[str, Any]) -> list[str]:
    return [
        case,
        f"{_fmt(s.get('period_ns'), '.2f', 1e3)} "
        f"({_fmt(s.get('period_ns_min'), '.2f', 1e3)}-{_fmt(s.get('period_ns_max'), '.2f', 1e3)})",
        _fmt(s.get("period_vs_same_size_copy"), ".3f"),
        _fmt(s.get("duration_ns"), ".2f", 1e3),
        _fmt(s.get("duration_vs_same_size_copy"), ".3f"),
        _fmt(s.get("gap_ns"), ".2f", 1e3),
        _fmt(s.get("gap_ns_minus_same_size_copy"), "+.3f", 1e3),
        ",".join(map(str, s["kernels_per_replay"])),
    ]


def table(summary: dict[str, dict[str, dict[str, Any]]], config: dict[str, Any]) -> str:
    """table.md: per view, one row per case."""
    lines = [
        f"# Norms at {config['tokens']} x {config['width']} bf16 beside streaming copies: counters, "
        "timestamps",
        "",
        f"Medians over {config['reps']} launches per case and view; clocks free. Compare a kernel with "
        "the copies beside it in the same view; none of these durations is the kernels command's "
        "figure, which stays the headline. Plain launches (no programmatic dependent launch), as the "
        "kernels command's headline. exact#2 is the exact norm again on its own inputs (A/A): how "
        "far it lands from exact is how far two identical kernels differ in that view.",
        "",
        "- Alone: each launch profiled by itself, L2 flushed and invalidated before it; its duration "
        "excludes any launch gap. L2 is write-back, so most of a launch's writes are still in L2 when "
        "it ends ('written / outputs' well below 1).",
        "- Back to back (Nsight Compute): the kernels command's graph of calls over rotated inputs "
        "profiled as one workload, counters per call. No durations: a profiled graph runs longer than "
        "its replay.",
        "- Back to back, timestamps: the same graph replayed under torch.profiler (CUPTI kernel "
        "records); per replay the median kernel duration, gap (one kernel's end to the next one's "
        "start) and period (start to start), the period being what the kernels command divides out.",
        "- 'read / inputs', 'written / outputs': DRAM bytes over the bytes the case reads and writes "
        "once; 'x copy': the same-size copy's figure as 1.",
    ]
    for view, cases in summary.items():
        trace = view == "trace"
        columns, cells = (TRACE_COLUMNS, _trace_cells) if trace else (COUNTER_COLUMNS, _counter_cells)
        lines += ["", f"## {TITLES[view]}", "", "| " + " | ".join(columns) + " |",
                  "|---" * len(columns) + "|"]
        lines += ["| " + " | ".join(cells(case, s)) + " |" for case, s in cases.items()]
    named = next((c for v, c in summary.items() if v != "trace"), {})
    if named:
        lines += ["", "Kernels: " + "; ".join(f"{c}: `{s['kernel'][:60]}`" for c, s in named.items())]
    return "\n".join(lines) + "\n"


def find_ncu(ncu: str) -> str | None:
    """`ncu` as given (a path or a name on PATH), else, for the default name, the CUDA toolkit's copy
    ($CUDA_HOME/bin, /usr/local/cuda/bin: toolkits often leave their bin off PATH)."""
    path = shutil.which(ncu)
    if path is not None or ncu != "ncu":
        return path
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    return next((str(p) for h in homes if h and (p := Path(h) / "bin" / "ncu").is_file()), None)


def check_environment(ncu: str, needs_ncu: bool = True) -> str | None:
    """The ncu executable's path (None when no view needs it); UsageError (exit 2) before any work
    when a needed ncu or a GPU is missing."""
    path = find_ncu(ncu)
    if path is None and needs_ncu:
        raise UsageError(f"Nsight Compute not found ({ncu!r}): install it or pass --ncu PATH")
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--diagnose ncu needs a CUDA GPU; none is visible")
    return path


def child_command(view: str, plan_path: Path, a: NcuSpec) -> list[str]:
    """The workload process of one view (this module run by the same Python)."""
    return [sys.executable, "-m", __name__, "--workload", str(plan_path), "--workload-mode",
            view, "--tokens", str(a.tokens), "--width", str(a.width), "--reps", str(a.reps),
            "--large-copy-mib", str(a.large_copy_mib)]


def profile_view(run: RunDir, ncu: str | None, view: str, a: NcuSpec) -> list[dict[str, Any]]:
    """One view's rows: the trace view runs the child alone (it records its own timestamps); the
    Nsight Compute views run it under ncu, keep its metrics as CSV (and with --keep-reports the
    report itself, gzipped), and join the report's rows to the plan."""
    plan_path = run.file(f"plan_{view}.json")
    child = child_command(view, plan_path, a)
    options = VIEWS[view]
    report = run.file(f"ncu_{view}")
    if options is not None:
        assert ncu is not None
        child = [ncu, "--profile-from-start", "off", *options, "--clock-control", "none",
                 "--metrics", ",".join(METRICS), "--export", str(report), "--force-overwrite", *child]
    print(f"[{view}]", " ".join(child), flush=True)
    subprocess.run(child, check=True, env=_child_env())
    run.adopt(plan_path.name)
    plan = json.loads(plan_path.read_text())
    if options is None:
        return [{"view": view, **p} for p in plan]
    read_back = [ncu, "--import", f"{report}.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]
    csv_text = subprocess.run(read_back, check=True, capture_output=True, text=True).stdout
    run.write_text(f"metrics_{view}.csv", metric_columns(csv_text))
    if a.keep_reports:
        run.adopt(f"ncu_{view}.ncu-rep", gzipped=True)
    else:
        run.file(f"ncu_{view}.ncu-rep").unlink()
    return join_plan(plan, parse_raw_csv(csv_text), view)


def _child_env() -> dict[str, str]:
    """The environment of a child: this package importable whatever the working directory."""
    root = str(Path(__file__).resolve().parents[3])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def run_ncu(a: NcuSpec, result_dir: Path | None) -> str:
    """Check the environment, then profile each view; returns the table (and where the run lies)."""
    from rltbench.results import RunDir

    ncu = check_environment(a.ncu, needs_ncu=any(VIEWS[v] is not None for v in a.views))
    config = {"tokens": a.tokens, "width": a.width, "reps": a.reps, "views": list(a.views),
              "large_copy_mib": a.large_copy_mib, "graph_calls_min": GRAPH_CALLS, "metrics": METRICS,
              "ncu_options": {v: [*o, "--clock-control", "none"] for v in a.views if (o := VIEWS[v])}}
    run = RunDir.create("ncu-norm", result_dir, argv=sys.argv, config=config)
    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        for view in a.views:   # each view's rows are kept as soon as it ends
            view_rows = profile_view(run, ncu, view, a)
            rows += view_rows
            run.write_jsonl("launches.jsonl", rows)
            summary[view] = summarize(view_rows, view)
    except BaseException as exc:
        if summary:
            run.write_json("summary.json", summary)
            run.write_markdown("table.md", table(summary, config))
        run.mark_ended(exc)
        raise
    return run.finish(table(summary, config), summary=summary)


if __name__ == "__main__":   # the child under Nsight Compute (or alone, for the trace view)
    run_workload(parse_workload_args())
