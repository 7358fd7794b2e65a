#!/usr/bin/env python3
"""GPU tuning of the fused kernels' launch knobs, correctness first, in one run directory.

1. Exact one-launch norm: the general kernel and the fast kernel (norm_onelaunch_fast.py) with
   4/8 warps, and its low-warp layout (norm_onelaunch_lowwarp.py) at 1/2/4 warps, 4-D and flat
   tiles; with --pdl also programmatic dependent launch. Hot L2 at decode sizes (activations were
   just written by the previous kernel), the one-element-kernel floor beside. Every configuration is
   first compared with torch bit for bit on adversarial rows (all forms, every reduction plan:
   the validation cases); a configuration with any mismatch is reported and not timed. Then
   CUDA-graph latency per call (graphs of `calls` calls rotating over input sets; > 3x L2 for
   large T) of the single norm and the fused norm-add-norm at widths 2048/5280 and T = 1..4096,
   configurations interleaved.
2. Approx norm at T=4096 (cold L2): rows per program x warps, GB/s and % of a copy measured in
   the same run.
3. Exact SiLU*up: column tile per program (RLTBENCH_ACT_BLOCK) at T = 1, 8, 4096, bitwise checked.

    python scripts/kernel_tune.py --result-dir results/gpu/tune
    python scripts/kernel_tune.py --from-results results/gpu/tune --write-tuned   # re-select, no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from rltbench import tuned
from rltbench.bench.timing import (
    GraphCalls,
    l2_cache_bytes,
    measure_copy_bandwidth,
    rotation_sets,
    summarize,
    time_interleaved,
)
from rltbench.kernels import norm_onelaunch as nol
from rltbench.kernels import norm_onelaunch_fast as fast
from rltbench.kernels import reference as ref
from rltbench.kernels.act_exact import silu_mul_exact_rows
from rltbench.kernels.norm_approx import rms_norm_approx_rows
from rltbench.results import RunDir
from rltbench.results.provenance import git_info

EPS = 1e-6
ROOT = Path(__file__).resolve().parent.parent
def _fast(warps: int, pdl: int = 0, lowwarp: str = "", flat: bool = False) -> dict[str, str]:
    """The fast exact norm's knobs; lowwarp "sum" / "halve": the low-warp layout (with `warps` warps
    for 512 lanes) with Triton's reduction / explicit halvings for the (h, w) levels, on the 4-D or
    the flat lane tile (norm_onelaunch_lowwarp._lanes)."""
    return {"RLTBENCH_NORM_FAST": "1", "RLTBENCH_NORM_FAST_WARPS": str(warps), "RLTBENCH_NORM_TREE_SUM": "0",
            "RLTBENCH_PDL": str(pdl), "RLTBENCH_NORM_LOWWARP": "1" if lowwarp else "0",
            "RLTBENCH_NORM_LOWWARP_TLSUM": "1" if lowwarp == "sum" else "0",
            "RLTBENCH_NORM_LOWWARP_WARPS": str(warps), "RLTBENCH_NORM_LOWWARP_FLAT": "1" if flat else "0"}


EXACT_CONFIGS: dict[str, dict[str, str]] = {
    "general": {"RLTBENCH_NORM_FAST": "0"},
    **{f"fast-w{w}": _fast(w) for w in (4, 8)},
    # torch's lowest lane bits on the warps (norm_onelaunch_lowwarp): one exchange per reduction.
    # The 4-D tile with Triton's reduction failed the bitwise checks on the H200 (Triton 3.6 lays
    # it out with r and w on lanes); the flat tile has the intended layout under 3.6 and 3.9 (the
    # SASS test checks it). Fewer warps move torch's shared-memory levels into registers: at 1 warp
    # (512 lanes: 16 per thread) the whole tree is in-thread adds and one warp butterfly, no barrier
    "lowwarp-halve-w4": _fast(4, lowwarp="halve"),
    **{f"lowwarp-flat-halve-w{w}": _fast(w, lowwarp="halve", flat=True) for w in (1, 2, 4)},
    **{f"lowwarp-flat-sum-w{w}": _fast(w, lowwarp="sum", flat=True) for w in (1, 2, 4)},
}
# programmatic dependent launch (pdl.py, --pdl): back-to-back calls overlap launch and weight loads;
# informational (the decode-step profile decides the tuned ``pdl`` section)
PDL_CONFIGS: dict[str, dict[str, str]] = {f"fast-w8-pdl{m}": _fast(8, m) for m in (1, 2)}
# per-call cost of the smallest possible kernel in the same harness (one program loads and stores one
# element): the floor under any T=1 latency measured here
FLOOR = "floor (1-element kernel)"
# the ladder between that floor and the exact norm at T=1: the norm's row I/O alone (load x and w,
# store x*w: no reduction) and the approx norm (Triton's own one-pass reduction); where the exact
# kernel's time goes, and what any single-launch T=1 norm costs in this harness
ROW_IO = "row I/O (x*w, no reduction)"
APPROX_T1 = "approx norm"
REFERENCE_ROWS = ("torch", FLOOR, ROW_IO, APPROX_T1)
SAME_SIZE_COPY = "same-size copy"   # reference row of the approx table, not a kernel configuration
# PDL configurations of the approx norm apply from this many rows: they are timed at T=4096 only, and
# PDL made the decode step slower on the exact kernels (results/gpu/profile-pdl1, -pdl2)
PDL_MIN_ROWS = 1024
# approx norm: one program per row block (rows x warps), or the persistent kernel (programs per SM
# x software-pipeline stages x warps)
APPROX_CONFIGS: dict[str, dict[str, str]] = {
    **{f"rows{r}-w{nw}": {"RLTBENCH_APPROX_NORM_ROWS": str(r), "RLTBENCH_APPROX_NORM_WARPS": str(nw)}
       for r, nw in ((1, 4), (1, 8))},
    **{f"persist{p}-s{st}-w{nw}": {"RLTBENCH_APPROX_NORM_PERSIST": str(p),
                                   "RLTBENCH_APPROX_NORM_STAGES": str(st),
                                   "RLTBENCH_APPROX_NORM_WARPS": str(nw)}
       for p, st, nw in [(p, st, 4) for p in (4, 8, 12, 16) for st in (3, 4, 5)]
       + [(8, st, nw) for st in (3, 4) for nw in (2, 8)]},
    # evict-first loads + streaming stores on the best plain and persistent settings
    **{f"{name}-stream": {**knobs, "RLTBENCH_APPROX_NORM_STREAM": "1"} for name, knobs in (
        ("rows1-w4", {"RLTBENCH_APPROX_NORM_ROWS": "1", "RLTBENCH_APPROX_NORM_WARPS": "4"}),
        ("rows1-w8", {"RLTBENCH_APPROX_NORM_ROWS": "1", "RLTBENCH_APPROX_NORM_WARPS": "8"}),
        ("persist8-s3-w2", {"RLTBENCH_APPROX_NORM_PERSIST": "8", "RLTBENCH_APPROX_NORM_STAGES": "3",
                            "RLTBENCH_APPROX_NORM_WARPS": "2"}),
        ("persist4-s5-w4", {"RLTBENCH_APPROX_NORM_PERSIST": "4", "RLTBENCH_APPROX_NORM_STAGES": "5",
                            "RLTBENCH_APPROX_NORM_WARPS": "4"}))},
    # where the one-row kernel loads its (cold) weight row (norm_approx._wload), and two rows per
    # program (the weight read once per two rows)
    **{f"rows1-w4{sfx}-{wname}": {"RLTBENCH_APPROX_NORM_ROWS": "1", "RLTBENCH_APPROX_NORM_WARPS": "4",
                                  "RLTBENCH_APPROX_NORM_STREAM": st, "RLTBENCH_APPROX_NORM_WLOAD": wl}
       for sfx, st in (("", "0"), ("-stream", "1")) for wname, wl in (("wafter", "1"), ("wlast", "2"))},
    **{f"rows2-w{nw}": {"RLTBENCH_APPROX_NORM_ROWS": "2", "RLTBENCH_APPROX_NORM_WARPS": str(nw)}
       for nw in (4, 8)},
    # programmatic dependent launch (norm_approx.pdl_requested), the weight read before the wait
    # (wload 0) or after the row (wload 1): the launch overlaps the previous call's tail
    **{f"rows1-w{nw}{sfx}-pdl{m}{wname}": {
        "RLTBENCH_APPROX_NORM_ROWS": "1", "RLTBENCH_APPROX_NORM_WARPS": str(nw),
        "RLTBENCH_APPROX_NORM_STREAM": st,
        "RLTBENCH_APPROX_NORM_WLOAD": wl, "RLTBENCH_APPROX_NORM_PDL": str(m),
        "RLTBENCH_APPROX_NORM_PDL_MIN_ROWS": str(PDL_MIN_ROWS)}
       for nw, sfx, st, m, wname, wl in ((4, "-stream", "1", 1, "", "0"), (4, "-stream", "1", 2, "", "0"),
                                         (4, "-stream", "1", 2, "-wafter", "1"), (8, "", "0", 2, "", "0"),
                                         (8, "-stream", "1", 2, "", "0"))},
}
KNOBS = ("RLTBENCH_NORM_FAST", "RLTBENCH_NORM_FAST_WARPS", "RLTBENCH_NORM_TREE_SUM", "RLTBENCH_NORM_LOWWARP",
         "RLTBENCH_NORM_LOWWARP_TLSUM", "RLTBENCH_NORM_LOWWARP_WARPS", "RLTBENCH_NORM_LOWWARP_FLAT",
         "RLTBENCH_APPROX_NORM_ROWS", "RLTBENCH_APPROX_NORM_WARPS", "RLTBENCH_APPROX_NORM_PERSIST",
         "RLTBENCH_APPROX_NORM_STAGES", "RLTBENCH_APPROX_NORM_STREAM", "RLTBENCH_APPROX_NORM_WLOAD",
         "RLTBENCH_APPROX_NORM_PDL", "RLTBENCH_APPROX_NORM_PDL_MIN_ROWS", "RLTBENCH_ACT_BLOCK",
         "RLTBENCH_PDL")


@contextlib.contextmanager
def env(values: dict[str, str]) -> Iterator[None]:
    """Set the knobs for one configuration (the kernels read them at launch)."""
    old = {k: os.environ.get(k) for k in KNOBS}
    for k in KNOBS:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_exact(dev: torch.device, widths: list[int], tokens: list[int]) -> dict[str, dict[str, Any]]:
    """Every exact configuration against torch, bitwise, at the timed shapes: the start-up
    validation's case (nol.validation_case: every form and the variance, contiguous and strided rows).
    The variance matters: a 1-ulp order slip often leaves the bf16 outputs equal."""
    out: dict[str, dict[str, Any]] = {}
    for name, knobs in EXACT_CONFIGS.items():
        per = {}
        with env(knobs):
            for W in widths:
                g = torch.Generator(device=dev).manual_seed(W)
                bad, elems = [], 0
                for T in tokens:
                    for strided in (False, True):   # every form and the variance, as the validation
                        elems += nol.validation_case(dev, torch.bfloat16, W, T, g, strided, "down", bad)
                per[W] = {"elements": elems, "mismatches": len(bad), "first": bad[:3]}
        out[name] = per
        print(f"check {name}: " + ", ".join(f"w{W} {p['mismatches']} bad / {p['elements']:.3g}"
                                            for W, p in per.items()), flush=True)
    return out


def _sets(T: int, W: int, n_arrays: int) -> int:
    return rotation_sets(T * W * 2 * n_arrays, l2_cache_bytes(), max_sets=64).sets


def _call(op: str, torch_ref: bool, xs: list[torch.Tensor], rs: list[torch.Tensor], w1: torch.Tensor,
          w2: torch.Tensor, h: torch.Tensor, o: torch.Tensor) -> Any:
    """Call i of a captured graph: the op on input set i % len(xs) (torch reference or one-launch)."""
    n = len(xs)
    if op == "norm":
        if torch_ref:
            return lambda i: ref.rms_norm(xs[i % n], w1, EPS)
        return lambda i: nol.rms_norm_onelaunch_rows(xs[i % n], w1, EPS, o)
    if torch_ref:
        return lambda i: ref.residual_rms_norm_norm(rs[i % n], xs[i % n], w1, w2, EPS)
    return lambda i: nol.residual_rms_norm_norm_onelaunch_rows(rs[i % n], xs[i % n], w1, w2, EPS, h, o)


@triton.jit
def _one_element_kernel(x_ptr, o_ptr):
    tl.store(o_ptr + tl.arange(0, 1), tl.load(x_ptr + tl.arange(0, 1)))


def _floor_call(xs: list[torch.Tensor], o: torch.Tensor) -> Any:
    n = len(xs)
    return lambda i: _one_element_kernel[(1,)](xs[i % n], o, num_warps=1)


@triton.jit
def _row_io_kernel(x_ptr, w_ptr, o_ptr, W, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = cols < W
    x = tl.load(x_ptr + cols, mask=m, other=0.0)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    tl.store(o_ptr + cols, x * w, mask=m)


def _path(config: str) -> str:
    """The kernel a timed row ran: a reference row's own name, general, lowwarp or fast."""
    if config in ("general", *REFERENCE_ROWS):
        return config
    return "lowwarp" if config.startswith("lowwarp") else "fast"


def _ladder_calls(xs: list[torch.Tensor], w: torch.Tensor, o: torch.Tensor) -> dict[str, Any]:
    """One-row kernels timed beside the exact norm at T=1 (FLOOR, ROW_IO, APPROX_T1)."""
    n, W = len(xs), xs[0].shape[-1]
    warps = fast.num_warps_for(512, False)   # as the fast exact norm's 512-lane rows
    return {
        FLOOR: _floor_call(xs, o),
        ROW_IO: lambda i: _row_io_kernel[(1,)](xs[i % n], w, o, W, BLOCK=triton.next_power_of_2(W),
                                               num_warps=warps),
        APPROX_T1: lambda i: rms_norm_approx_rows(xs[i % n], w, EPS, o),
    }


def time_exact(dev: torch.device, widths: list[int], tokens: list[int], ok: set[str], calls: int,
               rounds: int, reps: int) -> list[dict[str, Any]]:
    """Latency per call of the single norm and the norm-add-norm for each passing configuration."""
    rows = []
    for W in widths:
        for T in tokens:
            n_sets = min(calls, _sets(T, W, 3))
            g = torch.Generator(device=dev).manual_seed(W * 10007 + T)
            xs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
            rs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
            w1 = torch.randn(W, generator=g, device=dev).to(torch.bfloat16)
            w2 = torch.randn(W, generator=g, device=dev).to(torch.bfloat16)
            o, h = torch.empty_like(xs[0]), torch.empty_like(xs[0])
            for op in ("norm", "norm_norm"):
                graphs: dict[str, GraphCalls] = {}
                for name in [c for c in EXACT_CONFIGS if c in ok] + ["torch"]:
                    fn = _call(op, name == "torch", xs, rs, w1, w2, h, o)
                    with env(EXACT_CONFIGS.get(name, {})):
                        graphs[name] = GraphCalls(fn, calls)
                if T == 1 and op == "norm":
                    for name, fn in _ladder_calls(xs, w1, o).items():
                        graphs[name] = GraphCalls(fn, calls)
                samples = time_interleaved({n: gc.replay for n, gc in graphs.items()}, calls=calls,
                                           rounds=rounds, reps=reps)
                for name, s in samples.items():
                    st = summarize(s)
                    rows.append({"width": W, "tokens": T, "op": op, "config": name, "median_us": st.median,
                                 "p10_us": st.p10, "p90_us": st.p90, "sets": n_sets,
                                 "path": _path(name)})
                best = min((r for r in rows[-len(samples):] if r["config"] not in REFERENCE_ROWS),
                           key=lambda r: r["median_us"], default=None)
                if best:
                    print(f"w{W} T{T} {op}: best {best['config']} {best['median_us']:.2f} us", flush=True)
    return rows


def _approx_call(xs: list[torch.Tensor], ws: list[torch.Tensor], outs: list[torch.Tensor]) -> Any:
    n = len(xs)
    return lambda i: rms_norm_approx_rows(xs[i % n], ws[i % n], EPS, outs[i % n])


def _copy_call(xs: list[torch.Tensor], outs: list[torch.Tensor]) -> Any:
    n = len(xs)
    return lambda i: outs[i % n].copy_(xs[i % n])


def time_approx(dev: torch.device, copy_gbps: float, calls: int, rounds: int, reps: int
                ) -> list[dict[str, Any]]:
    """Approx norm at T=4096 per (rows, warps): % of the measured copy (cold L2). Each input set
    has its own weight row, cold like the rows (as in a model, whose norm weight was last read a
    layer ago, and in the kernels sweep). With one weight for every call it stayed L2-hot: one row
    per program took 9.93 us (results/gpu/tune, session 6), 10.25 with cold per-set weights
    (results/gpu/tune-approx); the sweep measured 10.55 (commit 3af642d's results/gpu/kernels), so
    the weights explain about half of that gap."""
    rows = []
    for W, huginn in ((2048, False), (5280, True)):
        T = 4096
        n_sets = _sets(T, W, 2)
        g = torch.Generator(device=dev).manual_seed(W)
        xs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
        ws = [(1 + 0.1 * torch.randn(W, generator=g, device=dev)).to(torch.bfloat16) for _ in range(n_sets)]
        outs = [torch.empty_like(xs[0]) for _ in range(n_sets)]
        graphs = {}
        for name, knobs in APPROX_CONFIGS.items():
            with env(knobs):
                graphs[name] = GraphCalls(_approx_call(xs, ws, outs), calls)
        # the same bytes moved by a plain copy, timed the same way (graph of `calls` rotated calls): the
        # size-matched roofline, which carries the same fixed per-kernel cost as the norm; reported
        # beside (not instead of) the % of the large copy
        graphs[SAME_SIZE_COPY] = GraphCalls(_copy_call(xs, outs), calls)
        samples = time_interleaved({n: gc.replay for n, gc in graphs.items()}, calls=calls, rounds=rounds,
                                   reps=reps)
        nbytes = 2 * T * W * 2 + W * 2
        same_gbps = 2 * T * W * 2 / (summarize(samples[SAME_SIZE_COPY]).median * 1e-6) / 1e9
        for name, s in samples.items():
            st = summarize(s)
            gb = (nbytes if name != SAME_SIZE_COPY else 2 * T * W * 2) / (st.median * 1e-6) / 1e9
            rows.append({"width": W, "tokens": T, "form": "huginn" if huginn else "ouro", "config": name,
                         "median_us": st.median, "p10_us": st.p10, "p90_us": st.p90, "gbps": gb,
                         "pct_copy": 100 * gb / copy_gbps, "pct_same_size_copy": 100 * gb / same_gbps,
                         "sets": n_sets})
        best = max((r for r in rows[-len(samples):] if r["config"] != SAME_SIZE_COPY),
                   key=lambda r: r["pct_copy"])
        print(f"approx w{W} T4096: best {best['config']} {best['median_us']:.2f} us "
              f"{best['pct_copy']:.1f}% of copy, {best['pct_same_size_copy']:.1f}% of a same-size copy",
              flush=True)
    return rows


def _act_call(gs: list[torch.Tensor], us: list[torch.Tensor], out: torch.Tensor, torch_ref: bool) -> Any:
    n = len(gs)
    if torch_ref:
        return lambda i: ref.silu_mul(gs[i % n], us[i % n])
    return lambda i: silu_mul_exact_rows(gs[i % n], us[i % n], out)


def time_act(dev: torch.device, copy_gbps: float, calls: int, rounds: int, reps: int) -> list[dict[str, Any]]:
    """Exact SiLU*up per column tile (gate/up are halves of a merged [T, 2W] GEMM output)."""
    rows = []
    W = 5632
    for T in (1, 8, 4096):
        n_sets = min(calls, rotation_sets(T * W * 2 * 3, l2_cache_bytes(), max_sets=64).sets)
        g = torch.Generator(device=dev).manual_seed(T)
        gu = [(torch.randn((T, 2 * W), generator=g, device=dev) * 4).to(torch.bfloat16)
              for _ in range(n_sets)]
        gs, us = [t[:, :W] for t in gu], [t[:, W:] for t in gu]
        out = torch.empty((T, W), device=dev, dtype=torch.bfloat16)
        graphs, bad = {}, {}
        for cap in ("default", "128", "256", "512", "1024", "2048", "4096", "torch"):
            knobs = {} if cap in ("default", "torch") else {"RLTBENCH_ACT_BLOCK": cap}
            with env(knobs):
                if cap != "torch":
                    silu_mul_exact_rows(gs[0], us[0], out)
                    bad[cap] = int((out != ref.silu_mul(gs[0], us[0])).sum())
                graphs[cap] = GraphCalls(_act_call(gs, us, out, cap == "torch"), calls)
        samples = time_interleaved({n: gc.replay for n, gc in graphs.items()}, calls=calls, rounds=rounds,
                                   reps=reps)
        nbytes = 3 * T * W * 2
        for name, smp in samples.items():
            st = summarize(smp)
            gb = nbytes / (st.median * 1e-6) / 1e9
            rows.append({"width": W, "tokens": T, "config": name, "median_us": st.median, "p10_us": st.p10,
                         "p90_us": st.p90, "gbps": gb, "pct_copy": 100 * gb / copy_gbps,
                         "mismatches": bad.get(name, 0), "sets": n_sets})
        print(f"act T{T}: " + ", ".join(f"{r['config']} {r['median_us']:.2f}us/{r['mismatches']}bad"
                                          for r in rows[-len(samples):]), flush=True)
    return rows


def table(exact: list[dict[str, Any]], approx: list[dict[str, Any]], copy: dict[str, float]) -> str:
    lines = ["# Norm kernel tuning (bf16, CUDA-graph replay, per call)", "",
             f"Copy: {copy['gbps']:.0f} GB/s (same run).", "",
             "| width | T | op | config | median us | p10 | p90 | path |",
             "|---|---|---|---|---|---|---|---|"]
    for r in exact:
        lines.append(f"| {r['width']} | {r['tokens']} | {r['op']} | {r['config']} | {r['median_us']:.2f} | "
                     f"{r['p10_us']:.2f} | {r['p90_us']:.2f} | {r['path']} |")
    lines += ["", "| width | form | config | median us | p10 | p90 | GB/s | % copy | % same-size copy |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in approx:
        same = r.get("pct_same_size_copy")
        lines.append(f"| {r['width']} | {r['form']} | {r['config']} | {r['median_us']:.2f} | "
                     f"{r['p10_us']:.2f} | {r['p90_us']:.2f} | {r['gbps']:.0f} | {r['pct_copy']:.1f} | "
                     f"{'-' if same is None else f'{same:.1f}'} |")
    return "\n".join(lines) + "\n"


def act_table(act: list[dict[str, Any]]) -> str:
    lines = ["", "| SiLU*up T | config | median us | p10 | p90 | % copy | mismatches |",
             "|---|---|---|---|---|---|---|"]
    for r in act:
        lines.append(f"| {r['tokens']} | {r['config']} | {r['median_us']:.2f} | {r['p10_us']:.2f} | "
                     f"{r['p90_us']:.2f} | {r['pct_copy']:.1f} | {r['mismatches']} |")
    return "\n".join(lines) + "\n"


def _approx_knobs(config: str) -> dict[str, Any]:
    """The tuned-file fields of one approx configuration."""
    knobs = APPROX_CONFIGS[config]
    return {"rows": int(knobs.get("RLTBENCH_APPROX_NORM_ROWS", 1)),
            "warps": int(knobs["RLTBENCH_APPROX_NORM_WARPS"]),
            "persist": int(knobs.get("RLTBENCH_APPROX_NORM_PERSIST", 0)),
            "stages": int(knobs.get("RLTBENCH_APPROX_NORM_STAGES", 1)),
            "stream": int(knobs.get("RLTBENCH_APPROX_NORM_STREAM", 0)),
            "wload": int(knobs.get("RLTBENCH_APPROX_NORM_WLOAD", 0)),
            "pdl": int(knobs.get("RLTBENCH_APPROX_NORM_PDL", 0)),
            "pdl_min_rows": int(knobs.get("RLTBENCH_APPROX_NORM_PDL_MIN_ROWS", 0)), "config": config}


def exact_slowdowns(exact: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Per exact configuration timed in every decode-sized case (T <= 128): the geometric mean of
    its median over the case's best median, and its summed median (informational).

    Why not the summed latency (the criterion until session 6): the T=128 cases are 3x the T=1 ones,
    so a 0.01 us difference there outweighed a 0.08 us (5%) one at T=1, the batch-1 decode case
    (results/gpu/tune, session 6: halvings 25.83 us summed vs tl.sum 25.92, but tl.sum 1.56 vs 1.65
    us at T=1). A ratio per case weighs every case alike. PDL configurations are informational (the
    decode-step profile decides the ``pdl`` section)."""
    cases: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in exact:
        pdl_on = EXACT_CONFIGS.get(r["config"], {}).get("RLTBENCH_PDL", "0") != "0"
        if r["config"] in EXACT_CONFIGS and not pdl_on and r["tokens"] <= 128:
            cases.setdefault((r["op"], r["width"], r["tokens"]), {})[r["config"]] = r["median_us"]
    everywhere = set.intersection(*(set(c) for c in cases.values())) if cases else set()
    logs = {k: 0.0 for k in everywhere}
    totals = {k: 0.0 for k in everywhere}
    for per in cases.values():
        best = min(per[k] for k in everywhere)
        for k in everywhere:
            logs[k] += math.log(per[k] / best)
            totals[k] += per[k]
    return {k: math.exp(v / len(cases)) for k, v in logs.items()}, totals


# a new approx configuration replaces the one in the tuned file only when it is faster by more than
# this share: one configuration's median moves about 2% between runs (session 7: rows1-w8 at width
# 5280, 24.46 then 23.91 us), and rows2-w8 chosen on a 0.01 us lead over the incumbent measured
# 27.0 us in the sweep right after (the incumbent: 24.0)
RESELECT_MARGIN = 0.02


def _keep_incumbent(pct: dict[str, float], incumbent: str | None) -> tuple[str, dict[str, Any] | None]:
    """The configuration with the highest % of copy, unless the incumbent (the tuned file's choice
    when the run started) is within RESELECT_MARGIN of it; then the incumbent, and what it was kept
    over."""
    best = max(pct, key=pct.__getitem__)
    if incumbent is None or incumbent == best or incumbent not in pct:
        return best, None
    if pct[incumbent] * (1 + RESELECT_MARGIN) >= pct[best]:
        return incumbent, {"config": best, "pct_copy": round(pct[best], 2), "margin": RESELECT_MARGIN}
    return best, None


def best_knobs(exact: list[dict[str, Any]], approx: list[dict[str, Any]], act: list[dict[str, Any]],
               incumbent: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The tuned-file sections: the exact configuration with the least geometric-mean slowdown
    against the best configuration of each decode-sized case (T <= 128, both ops and widths;
    exact_slowdowns), the approx configuration with the highest mean % of copy at T=4096 (and the
    best per width; `incumbent`, the norm_approx section in force when the run started, is kept
    where it is within RESELECT_MARGIN), and the SiLU tile fastest at T=1 and at T=4096."""
    out: dict[str, dict[str, Any]] = {}
    slowdown, totals = exact_slowdowns(exact)
    if slowdown:
        best = min(slowdown, key=slowdown.__getitem__)
        knobs = EXACT_CONFIGS[best]
        out["norm_fast"] = {"enabled": knobs.get("RLTBENCH_NORM_FAST") != "0",
                            "warps": int(knobs.get("RLTBENCH_NORM_FAST_WARPS", 4)),
                            "tree_sum": knobs.get("RLTBENCH_NORM_TREE_SUM", "0") != "0",
                            "lowwarp": knobs.get("RLTBENCH_NORM_LOWWARP", "0") != "0",
                            "lowwarp_tl_sum": knobs.get("RLTBENCH_NORM_LOWWARP_TLSUM", "0") != "0",
                            "lowwarp_warps": int(knobs.get("RLTBENCH_NORM_LOWWARP_WARPS", 4)),
                            "lowwarp_flat": knobs.get("RLTBENCH_NORM_LOWWARP_FLAT", "0") != "0",
                            "config": best,
                            "geomean_slowdown": {k: round(v, 4) for k, v in sorted(slowdown.items(),
                                                                                   key=lambda kv: kv[1])},
                            "summed_us": {k: round(totals[k], 3) for k in sorted(slowdown, key=slowdown.get)}}
    pct: dict[str, list[float]] = {}
    per_width: dict[int, dict[str, float]] = {}
    for r in approx:
        if r["config"] == SAME_SIZE_COPY:
            continue
        pct.setdefault(r["config"], []).append(r["pct_copy"])
        per_width.setdefault(int(r["width"]), {})[r["config"]] = r["pct_copy"]
    if pct:
        inc = incumbent if isinstance(incumbent, dict) else {}
        means = {k: sum(v) / len(v) for k, v in pct.items()}
        best, kept = _keep_incumbent(means, inc.get("config"))
        section = {**_approx_knobs(best), "mean_pct_copy": round(means[best], 2), "by_width": {}}
        if kept:
            section["kept_over"] = kept
        inc_by_width = inc.get("by_width") if isinstance(inc.get("by_width"), dict) else {}
        # the best at each timed width; other widths take the mean's best above
        for W, cfgs in sorted(per_width.items()):
            inc_w = inc_by_width.get(str(W), {}).get("config", inc.get("config"))
            b, kept = _keep_incumbent(cfgs, inc_w)
            section["by_width"][str(W)] = {**_approx_knobs(b), "pct_copy": round(cfgs[b], 2),
                                           **({"kept_over": kept} if kept else {})}
        out["norm_approx"] = section
    tiles = [r for r in act if r["config"] not in ("torch", "default") and r["mismatches"] == 0]
    few = [r for r in tiles if r["tokens"] == 1]
    many = [r for r in tiles if r["tokens"] == max(t["tokens"] for t in tiles)] if tiles else []
    if few and many:
        out["act_exact"] = {"block_few_rows": int(min(few, key=lambda r: r["median_us"])["config"]),
                            "block_many_rows": int(min(many, key=lambda r: r["median_us"])["config"])}
    return out


def reselect(src: Path, write: bool) -> int:
    """--from-results: best_knobs over the timing files of the run in `src` (a configuration that
    failed its bitwise checks there was never timed, so it cannot be chosen); the tuned file's
    source names that run and says the selection was redone offline, with which commit."""
    try:
        manifest = json.loads((src / "manifest.json").read_text())
        files = (("exact_timing.json", []), ("approx_timing.json", {"rows": []}), ("act_timing.json", []))
        exact, approx, act = (json.loads((src / f).read_text()) if (src / f).is_file() else default
                              for f, default in files)
        approx = approx["rows"]
    except (OSError, ValueError, KeyError) as e:
        print(f"--from-results {src}: not a kernel_tune.py result directory ({e})", file=sys.stderr)
        return 2
    incumbent = manifest.get("provenance", {}).get("tuned", {}).get("sections", {}).get("norm_approx")
    knobs = best_knobs(exact, approx, act, incumbent)
    print(json.dumps(knobs, indent=1))
    if write:
        prov = manifest.get("provenance", {})
        src_info = {"command": prov.get("command_line"), "result_dir": str(src), "date": prov.get("date_utc"),
                    "git_sha": prov.get("git_sha"),
                    "selected_offline": {"command": " ".join(sys.argv), "git_sha": git_info().get("git_sha")}}
        device = prov.get("gpu")
        if not isinstance(device, str) or not device:
            print(f"--from-results {src}: its manifest names no GPU", file=sys.stderr)
            return 2
        for name, value in knobs.items():
            path = tuned.write_section(device, name, value, src_info)
        print(f"wrote {path}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-dir", help="where this run writes (required unless --from-results)")
    ap.add_argument("--widths", default="2048,5280")
    ap.add_argument("--tokens", default="1,2,4,8,128,4096")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--parts", default="exact,approx,act",
                    help="comma list of exact (one-launch norm), approx (approx norm), act (exact SiLU*up)")
    ap.add_argument("--pdl", action="store_true",
                    help="also time the fast norm with programmatic dependent launch (informational)")
    ap.add_argument("--write-tuned", action="store_true",
                    help="write the best knobs to rltbench/tuned_configs/<device>.json (rltbench/tuned.py)")
    ap.add_argument("--from-results", metavar="DIR",
                    help="no GPU: choose the knobs from an earlier run's timing files (this script's "
                         "current selection rules) and, with --write-tuned, write them with that run's "
                         "provenance")
    args = ap.parse_args()
    if args.pdl:
        EXACT_CONFIGS.update(PDL_CONFIGS)
    if args.from_results:
        return reselect(Path(args.from_results), args.write_tuned)
    if not args.result_dir:
        ap.error("--result-dir is required (unless --from-results)")
    if not torch.cuda.is_available():
        print("kernel_tune.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    widths = [int(w) for w in args.widths.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    parts = set(args.parts.split(","))
    if parts - {"exact", "approx", "act"}:
        print(f"--parts: unknown {sorted(parts - {'exact', 'approx', 'act'})}", file=sys.stderr)
        return 2
    run = RunDir.create("tune", args.result_dir, argv=sys.argv)
    incumbent = tuned.section("norm_approx")   # before this run writes the tuned file
    exact: list[dict[str, Any]] = []
    approx: list[dict[str, Any]] = []
    act: list[dict[str, Any]] = []
    ok = set(EXACT_CONFIGS)
    if "exact" in parts:
        checks = check_exact(dev, widths, tokens)
        run.write_json("exact_checks.json", checks)
        ok = {n for n, per in checks.items() if all(p["mismatches"] == 0 for p in per.values())}
        exact = time_exact(dev, widths, tokens, ok, args.calls, args.rounds, args.reps)
        run.write_json("exact_timing.json", exact)
    copy = measure_copy_bandwidth(dev)
    if "approx" in parts:
        approx = time_approx(dev, copy["gbps"], 20, args.rounds, args.reps)
        run.write_json("approx_timing.json", {"copy": copy, "rows": approx})
    if "act" in parts:
        act = time_act(dev, copy["gbps"], 20, args.rounds, args.reps)
        run.write_json("act_timing.json", act)
    text = table(exact, approx, copy) + act_table(act)
    run.write_markdown("table.md", text)
    print(text)
    knobs = best_knobs(exact, approx, act, incumbent)
    run.write_json("best_knobs.json", knobs)
    print("best knobs:", knobs)
    if args.write_tuned:
        prov = run.manifest.get("provenance", {})
        src = {"command": " ".join(sys.argv), "result_dir": str(run.path.relative_to(ROOT)),
               "date": prov.get("date_utc"), "git_sha": prov.get("git_sha")}
        for name, value in knobs.items():
            path = tuned.write_section(torch.cuda.get_device_name(dev), name, value, src)
        print(f"wrote {path}")
    run.update_manifest(status="complete")
    return 0 if ok == set(EXACT_CONFIGS) else 1


if __name__ == "__main__":
    sys.exit(main())
