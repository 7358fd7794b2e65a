"""Measuring the fused kernels' launch configurations on the GPU, correctness first.

1. Exact one-launch norm: every OneLaunchConfig of the search space is first run through the
   start-up validation's cases at the timed shapes (every form and the variance, contiguous and
   strided rows, bitwise against torch); a configuration with any mismatch is reported and not
   timed. Then CUDA-graph latency per call (graphs of `calls` calls rotating over input sets; > 3x
   L2 for large T) of the single norm and the fused norm-add-norm, configurations interleaved with
   torch, plus at T=1 the reference ladder: the one-element kernel (the floor under any T=1 figure
   in this harness), the norm's row I/O alone and the approx norm.
2. Approx norm at T=4096 (cold L2: every input set has its own weight row, as in a model): the
   search space's launches as GB/s and % of a copy measured in the same run, and of a same-size
   copy timed the same way.
3. Exact SiLU*up: the column tiles at T = 1, 8, 4096, bitwise checked, beside torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from rltbench.bench.timing import GraphCalls, l2_cache_bytes, rotation_sets, summarize, time_interleaved
from rltbench.commands.tune.select import APPROX_T1, FLOOR, REFERENCE_ROWS, ROW_IO, SAME_SIZE_COPY, TORCH
from rltbench.kernels import reference as ref
from rltbench.kernels.act import fused as act_fused
from rltbench.kernels.act.config import ActExactConfig
from rltbench.kernels.norm import approx, onelaunch
from rltbench.kernels.norm.config import ApproxNormLaunch, OneLaunchConfig
from rltbench.kernels.norm.validate import validation_case

EPS = 1e-6
PARTS = ("exact", "approx", "act")
APPROX_TOKENS = 4096
APPROX_WIDTHS = ((2048, "ouro"), (5280, "huginn"))
ACT_WIDTH = 5632
ACT_TOKENS = (1, 8, 4096)
Call = Callable[[int], Any]


def _sets(nbytes_per_set: int) -> int:
    return rotation_sets(nbytes_per_set, l2_cache_bytes(), max_sets=64).sets


def _time(graphs: dict[str, GraphCalls], calls: int, rounds: int, reps: int) -> dict[str, Any]:
    runners = {n: g.replay for n, g in graphs.items()}
    samples = time_interleaved(runners, calls=calls, rounds=rounds, reps=reps)
    return {n: summarize(s) for n, s in samples.items()}


def check_exact(dev: torch.device, widths: list[int], tokens: list[int],
                log: Callable[[str], None] = print) -> dict[str, dict[int, dict[str, Any]]]:
    """Every exact configuration against torch, bitwise, at the timed shapes (validate.py's case).
    The variance matters: a 1-ulp order slip often leaves the bf16 outputs equal."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name, cfg in OneLaunchConfig.search_space().items():
        per: dict[int, dict[str, Any]] = {}
        kernels = onelaunch.kernels_for(cfg)
        for W in widths:
            g = torch.Generator(device=dev).manual_seed(W)
            bad: list[dict[str, Any]] = []
            elems = 0
            for T in tokens:
                for strided in (False, True):
                    elems += validation_case(dev, torch.bfloat16, W, T, g, strided, "down", bad, kernels)
            per[W] = {"elements": elems, "mismatches": len(bad), "first": bad[:3]}
        out[name] = per
        log(f"check {name}: " + ", ".join(f"w{W} {p['mismatches']} bad / {p['elements']:.3g}"
                                          for W, p in per.items()))
    return out


def _norm_call(op: str, cfg: OneLaunchConfig | None, xs: list[torch.Tensor], rs: list[torch.Tensor],
               w1: torch.Tensor, w2: torch.Tensor, h: torch.Tensor, o: torch.Tensor) -> Call:
    """Call i of a captured graph: the op on input set i % len(xs), torch's (cfg None) or one-launch."""
    n = len(xs)
    if op == "norm":
        if cfg is None:
            return lambda i: ref.rms_norm(xs[i % n], w1, EPS)
        return lambda i: onelaunch.rms_norm_onelaunch_rows(xs[i % n], w1, EPS, o, config=cfg)
    if cfg is None:
        return lambda i: ref.residual_rms_norm_norm(rs[i % n], xs[i % n], w1, w2, EPS)
    return lambda i: onelaunch.residual_rms_norm_norm_onelaunch_rows(rs[i % n], xs[i % n], w1, w2, EPS, h, o,
                                                                      config=cfg)


@triton.jit
def _one_element_kernel(x_ptr, o_ptr):
    tl.store(o_ptr + tl.arange(0, 1), tl.load(x_ptr + tl.arange(0, 1)))


@triton.jit
def _row_io_kernel(x_ptr, w_ptr, o_ptr, W, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    m = cols < W
    x = tl.load(x_ptr + cols, mask=m, other=0.0)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    tl.store(o_ptr + cols, x * w, mask=m)


def _ladder_calls(xs: list[torch.Tensor], w: torch.Tensor, o: torch.Tensor) -> dict[str, Call]:
    """One-row kernels timed beside the exact norm at T=1: where its time goes."""
    n, W = len(xs), xs[0].shape[-1]
    warps = OneLaunchConfig().warps   # as the exact norm's 512-lane rows
    return {
        FLOOR: lambda i: _one_element_kernel[(1,)](xs[i % n], o, num_warps=1),
        ROW_IO: lambda i: _row_io_kernel[(1,)](xs[i % n], w, o, W, BLOCK=triton.next_power_of_2(W),
                                               num_warps=warps),
        APPROX_T1: lambda i: approx.rms_norm_approx_rows(xs[i % n], w, EPS, o),
    }


def time_exact(dev: torch.device, widths: list[int], tokens: list[int], passed: set[str], calls: int,
               rounds: int, reps: int, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Latency per call of the single norm and the norm-add-norm for each configuration that
    passed its checks, torch and (T=1) the reference ladder."""
    space = OneLaunchConfig.search_space()
    rows: list[dict[str, Any]] = []
    for W in widths:
        for T in tokens:
            n_sets = min(calls, _sets(T * W * 2 * 3))
            g = torch.Generator(device=dev).manual_seed(W * 10007 + T)
            xs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
            rs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
            w1 = torch.randn(W, generator=g, device=dev).to(torch.bfloat16)
            w2 = torch.randn(W, generator=g, device=dev).to(torch.bfloat16)
            o, h = torch.empty_like(xs[0]), torch.empty_like(xs[0])
            for op in ("norm", "norm_norm"):
                configs: dict[str, OneLaunchConfig | None] = {n: c for n, c in space.items() if n in passed}
                graphs = {name: GraphCalls(_norm_call(op, cfg, xs, rs, w1, w2, h, o), calls)
                          for name, cfg in {**configs, TORCH: None}.items()}
                if T == 1 and op == "norm":
                    graphs |= {name: GraphCalls(fn, calls) for name, fn in _ladder_calls(xs, w1, o).items()}
                stats = _time(graphs, calls, rounds, reps)
                for name, st in stats.items():
                    rows.append({"width": W, "tokens": T, "op": op, "config": name, "median_us": st.median,
                                 "p10_us": st.p10, "p90_us": st.p90, "sets": n_sets,
                                 "path": name if name in REFERENCE_ROWS else space[name].layout})
                timed = [r for r in rows[-len(stats):] if r["config"] not in REFERENCE_ROWS]
                if timed:
                    best = min(timed, key=lambda r: r["median_us"])
                    log(f"w{W} T{T} {op}: best {best['config']} {best['median_us']:.2f} us")
    return rows


def _approx_call(xs: list[torch.Tensor], ws: list[torch.Tensor], outs: list[torch.Tensor],
                 cfg: ApproxNormLaunch) -> Call:
    n = len(xs)
    return lambda i: approx.rms_norm_approx_rows(xs[i % n], ws[i % n], EPS, outs[i % n], config=cfg)


def _copy_call(xs: list[torch.Tensor], outs: list[torch.Tensor]) -> Call:
    n = len(xs)
    return lambda i: outs[i % n].copy_(xs[i % n])


def _act_call(gs: list[torch.Tensor], us: list[torch.Tensor], out: torch.Tensor, cfg: ActExactConfig | None,
              torch_ref: bool = False) -> Call:
    n = len(gs)
    if torch_ref:
        return lambda i: ref.silu_mul(gs[i % n], us[i % n])
    return lambda i: act_fused.silu_mul_rows(gs[i % n], us[i % n], out, exact=True, config=cfg)


def time_approx(dev: torch.device, copy_gbps: float, calls: int, rounds: int, reps: int,
                log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Approx norm at T=4096 per launch configuration: % of the measured copy (cold L2). With one
    weight for every call it stayed L2-hot (9.93 us per call, results/gpu/tune) where per-set
    weights, cold like the rows, took 10.25 (results/gpu/tune-approx)."""
    rows: list[dict[str, Any]] = []
    T = APPROX_TOKENS
    for W, form in APPROX_WIDTHS:
        n_sets = _sets(T * W * 2 * 2)
        g = torch.Generator(device=dev).manual_seed(W)
        xs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n_sets)]
        ws = [(1 + 0.1 * torch.randn(W, generator=g, device=dev)).to(torch.bfloat16) for _ in range(n_sets)]
        outs = [torch.empty_like(xs[0]) for _ in range(n_sets)]
        graphs = {name: GraphCalls(_approx_call(xs, ws, outs, cfg), calls)
                  for name, cfg in ApproxNormLaunch.search_space().items()}
        # the same bytes moved by a plain copy, timed the same way: the size-matched roofline, which
        # carries the same fixed per-kernel cost as the norm (beside, not instead of, the large copy)
        graphs[SAME_SIZE_COPY] = GraphCalls(_copy_call(xs, outs), calls)
        stats = _time(graphs, calls, rounds, reps)
        copy_bytes = 2 * T * W * 2
        same_gbps = copy_bytes / (stats[SAME_SIZE_COPY].median * 1e-6) / 1e9
        for name, st in stats.items():
            gb = (copy_bytes + (W * 2 if name != SAME_SIZE_COPY else 0)) / (st.median * 1e-6) / 1e9
            rows.append({"width": W, "tokens": T, "form": form, "config": name, "median_us": st.median,
                         "p10_us": st.p10, "p90_us": st.p90, "gbps": gb, "pct_copy": 100 * gb / copy_gbps,
                         "pct_same_size_copy": 100 * gb / same_gbps, "sets": n_sets})
        timed = [r for r in rows[-len(stats):] if r["config"] != SAME_SIZE_COPY]
        best = max(timed, key=lambda r: r["pct_copy"])
        log(f"approx w{W} T{T}: best {best['config']} {best['median_us']:.2f} us {best['pct_copy']:.1f}% of "
            f"copy, {best['pct_same_size_copy']:.1f}% of a same-size copy")
    return rows


def time_act(dev: torch.device, copy_gbps: float, calls: int, rounds: int, reps: int,
             log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Exact SiLU*up per column tile (gate/up are halves of a merged [T, 2W] GEMM output), the tuned
    default ("default") and torch beside."""
    rows: list[dict[str, Any]] = []
    W = ACT_WIDTH
    configs: dict[str, ActExactConfig | None] = {"default": None, **ActExactConfig.search_space()}
    for T in ACT_TOKENS:
        n_sets = min(calls, _sets(T * W * 2 * 3))
        g = torch.Generator(device=dev).manual_seed(T)
        gu = [(torch.randn((T, 2 * W), generator=g, device=dev) * 4).to(torch.bfloat16)
              for _ in range(n_sets)]
        gs, us = [t[:, :W] for t in gu], [t[:, W:] for t in gu]
        out = torch.empty((T, W), device=dev, dtype=torch.bfloat16)
        graphs: dict[str, GraphCalls] = {}
        bad: dict[str, int] = {}
        for name, cfg in configs.items():
            act_fused.silu_mul_rows(gs[0], us[0], out, exact=True, config=cfg)
            bad[name] = int((out != ref.silu_mul(gs[0], us[0])).sum())
            graphs[name] = GraphCalls(_act_call(gs, us, out, cfg), calls)
        graphs[TORCH] = GraphCalls(_act_call(gs, us, out, None, torch_ref=True), calls)
        stats = _time(graphs, calls, rounds, reps)
        nbytes = 3 * T * W * 2
        for name, st in stats.items():
            gb = nbytes / (st.median * 1e-6) / 1e9
            rows.append({"width": W, "tokens": T, "config": name, "median_us": st.median, "p10_us": st.p10,
                         "p90_us": st.p90, "gbps": gb, "pct_copy": 100 * gb / copy_gbps,
                         "mismatches": bad.get(name, 0), "sets": n_sets})
        log(f"act T{T}: " + ", ".join(f"{r['config']} {r['median_us']:.2f}us/{r['mismatches']}bad"
                                      for r in rows[-len(stats):]))
    return rows


def table(exact: list[dict[str, Any]], approx_rows: list[dict[str, Any]], act: list[dict[str, Any]],
          copy: dict[str, float]) -> str:
    """table.md of a tuning run."""
    lines = ["# Kernel launch tuning (bf16, CUDA-graph replay, per call)", "",
             f"Copy: {copy['gbps']:.0f} GB/s (same run).", "",
             "| width | T | op | config | median us | p10 | p90 | path |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['width']} | {r['tokens']} | {r['op']} | {r['config']} | {r['median_us']:.2f} | "
              f"{r['p10_us']:.2f} | {r['p90_us']:.2f} | {r['path']} |" for r in exact]
    lines += ["", "| width | form | config | median us | p10 | p90 | GB/s | % copy | % same-size copy |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['width']} | {r['form']} | {r['config']} | {r['median_us']:.2f} | {r['p10_us']:.2f} | "
              f"{r['p90_us']:.2f} | {r['gbps']:.0f} | {r['pct_copy']:.1f} | "
              f"{r['pct_same_size_copy']:.1f} |" for r in approx_rows]
    lines += ["", "| SiLU*up T | config | median us | p10 | p90 | % copy | mismatches |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['tokens']} | {r['config']} | {r['median_us']:.2f} | {r['p10_us']:.2f} | "
              f"{r['p90_us']:.2f} | {r['pct_copy']:.1f} | {r['mismatches']} |" for r in act]
    return "\n".join(lines) + "\n"
