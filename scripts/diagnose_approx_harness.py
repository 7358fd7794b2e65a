#!/usr/bin/env python3
"""Why does the approx RMSNorm at T=4096 take longer in `rltbench kernels` than in kernel_tune.py?

The same kernel with the same launch knobs measured 10.0-10.1 us per call in the tuner's graphs
(80% of the measured copy) and 10.7-11.1 us in the kernels sweep (73-76%). The two harnesses differ
in where inputs and outputs live: the tuner passes preallocated output buffers (one per input set)
to rms_norm_approx_rows; the sweep calls the arm's Ops, which allocates each output inside the
captured graph (the graph's private pool), with the inputs built by the sweep's make_inputs. This
script times, interleaved in one process, the variants between the two (and a plain copy both
ways), so the difference can be pinned to one of them.

    python scripts/diagnose_approx_harness.py --result-dir results/gpu/approx-harness
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from rltbench.bench.timing import (
    GraphCalls,
    l2_cache_bytes,
    measure_copy_bandwidth,
    rotation_sets,
    summarize,
    time_interleaved,
)
from rltbench.commands.kernels.sweep import BenchConfig, Case, make_arm_ops, make_inputs
from rltbench.kernels import op_case
from rltbench.kernels.norm_approx import rms_norm_approx_rows
from rltbench.results import RunDir

EPS = 1e-6


def variants(T: int, W: int, calls: int, dev: torch.device
             ) -> tuple[dict[str, GraphCalls], int, int, dict[str, list[int]]]:
    """The captured graphs: name -> GraphCalls, the number of input sets, bytes per call, and the
    weight rows' device addresses per harness (placement is a suspect)."""
    case = Case("rmsnorm", "bf16", W, T)
    oc = op_case("rmsnorm")
    cfg = BenchConfig(ops=["rmsnorm"], tokens=[T], dtypes=["bf16"], widths=[W], arms=["approx"],
                      modes=["graph"])
    first = make_inputs(case, dev, cfg.seed, 0)
    nbytes = int(oc.bytes_moved(first))
    n = rotation_sets(nbytes, l2_cache_bytes(dev), max_sets=cfg.max_sets).sets
    sweep_sets = [first] + [make_inputs(case, dev, cfg.seed, i) for i in range(1, n)]
    g = torch.Generator(device=dev).manual_seed(W)
    xs = [torch.randn((T, W), generator=g, device=dev).to(torch.bfloat16) for _ in range(n)]
    w = torch.randn(W, generator=g, device=dev).to(torch.bfloat16)
    outs = [torch.empty_like(xs[0]) for _ in range(n)]
    # kernel_tune.py's cold weights (one per set, allocated after the rows), and the sweep's weight
    # values copied into buffers allocated the same way: values vs placement (session 6: the tuner
    # with per-set weights 9.99 us, the sweep 10.38 us, same kernel and knobs)
    ws = [(1 + 0.1 * torch.randn(W, generator=g, device=dev)).to(torch.bfloat16) for _ in range(n)]
    sweep_ws_moved = [torch.empty_like(ws[0]).copy_(d["w"]) for d in sweep_sets]
    # placement: the per-set weights each in its own 2 MiB page, or packed as rows of one buffer
    apart = torch.empty(n * (1 << 20), device=dev, dtype=torch.bfloat16)
    ws_apart = [apart[i << 20:(i << 20) + W].copy_(ws[i]) for i in range(n)]
    packed = torch.stack(ws)
    ws_packed = [packed[i] for i in range(n)]
    ops = make_arm_ops("approx", "all")

    def sweep_with(env: dict[str, str]) -> GraphCalls:
        """The sweep's graph captured with launch knobs set (read at capture time)."""
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return GraphCalls(lambda i: oc.run(ops, sweep_sets[i % n]), calls, keep_outputs=n)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    knobs = {
        "sweep: Ops, weight before the row (wload 0)": {"RLTBENCH_APPROX_NORM_WLOAD": "0"},
        "sweep: Ops, weight evict-last (wload 2)": {"RLTBENCH_APPROX_NORM_WLOAD": "2"},
        "sweep: Ops, PDL 1, weight before the wait": {"RLTBENCH_APPROX_NORM_PDL": "1",
                                                      "RLTBENCH_APPROX_NORM_WLOAD": "0"},
        "sweep: Ops, PDL 2, weight before the wait": {"RLTBENCH_APPROX_NORM_PDL": "2",
                                                      "RLTBENCH_APPROX_NORM_WLOAD": "0"},
        "sweep: Ops, PDL 1, weight after the row": {"RLTBENCH_APPROX_NORM_PDL": "1",
                                                    "RLTBENCH_APPROX_NORM_WLOAD": "1"},
    }
    return {
        # kernel_tune.py's way: own inputs, one preallocated output per input set
        "tuner: preallocated outputs": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], w, EPS, outs[i % n]), calls),
        # the sweep's inputs (make_inputs sets, each with its own weight), preallocated outputs
        "sweep inputs, preallocated outputs": GraphCalls(
            lambda i: rms_norm_approx_rows(sweep_sets[i % n]["x"], sweep_sets[i % n]["w"], EPS, outs[i % n]),
            calls),
        # which part of the sweep's inputs: its x with the tuner's one weight, the tuner's x with its
        # weights (one per set, values near 1)
        "sweep x, tuner weight": GraphCalls(
            lambda i: rms_norm_approx_rows(sweep_sets[i % n]["x"], w, EPS, outs[i % n]), calls),
        "tuner x, sweep weights": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], sweep_sets[i % n]["w"], EPS, outs[i % n]), calls),
        "tuner x, tuner per-set weights": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], ws[i % n], EPS, outs[i % n]), calls),
        "sweep x, tuner per-set weights": GraphCalls(
            lambda i: rms_norm_approx_rows(sweep_sets[i % n]["x"], ws[i % n], EPS, outs[i % n]), calls),
        "tuner x, sweep weight values in tuner-placed buffers": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], sweep_ws_moved[i % n], EPS, outs[i % n]), calls),
        "tuner x, per-set weights 2 MiB apart": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], ws_apart[i % n], EPS, outs[i % n]), calls),
        "tuner x, per-set weights packed in one buffer": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], ws_packed[i % n], EPS, outs[i % n]), calls),
        **{name: sweep_with(env) for name, env in knobs.items()},
        "tuner x, one sweep weight": GraphCalls(
            lambda i: rms_norm_approx_rows(xs[i % n], sweep_sets[0]["w"], EPS, outs[i % n]), calls),
        # the tuner's inputs through the arm's Ops (output allocated in the graph), outputs rotating
        "tuner inputs, Ops (graph-pool outputs, window n)": GraphCalls(
            lambda i: ops.rms_norm(xs[i % n], w, EPS), calls, keep_outputs=n),
        # exactly the sweep: its inputs, the Ops, outputs rotating over n graph-pool buffers
        "sweep: Ops, graph-pool outputs (window n)": GraphCalls(
            lambda i: oc.run(ops, sweep_sets[i % n]), calls, keep_outputs=n),
        # the sweep before outputs rotated: every call's output kept (a fresh buffer per call)
        "sweep: Ops, every output kept": GraphCalls(lambda i: oc.run(ops, sweep_sets[i % n]), calls),
        "copy: preallocated outputs": GraphCalls(lambda i: outs[i % n].copy_(xs[i % n]), calls),
        "copy: clone in the graph (window n)": GraphCalls(lambda i: xs[i % n].clone(), calls, keep_outputs=n),
    }, n, nbytes, {"sweep": [d["w"].data_ptr() for d in sweep_sets], "tuner": [t.data_ptr() for t in ws],
                   "sweep_x": [d["x"].data_ptr() for d in sweep_sets],
                   "tuner_x": [t.data_ptr() for t in xs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-dir", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("diagnose_approx_harness.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    run = RunDir.create("approx-harness", args.result_dir, argv=sys.argv)
    copy = measure_copy_bandwidth(dev)
    graphs, n_sets, nbytes, addresses = variants(args.tokens, args.width, args.calls, dev)
    samples = time_interleaved({k: g.replay for k, g in graphs.items()}, calls=args.calls, rounds=args.rounds,
                               reps=args.reps)
    rows: list[dict[str, Any]] = []
    lines = [f"# approx RMSNorm T={args.tokens} W={args.width} bf16: harness variants",
             "", f"Copy: {copy['gbps']:.0f} GB/s; {n_sets} input sets, {args.calls} calls per graph.", "",
             "| variant | median us | p10 | p90 | % copy |", "|---|---|---|---|---|"]
    for name, s in samples.items():
        st = summarize(s)
        moved = nbytes if not name.startswith("copy") else 2 * args.tokens * args.width * 2
        pct = 100 * moved / (st.median * 1e-6) / 1e9 / copy["gbps"]
        rows.append({"variant": name, "median_us": st.median, "p10_us": st.p10, "p90_us": st.p90,
                     "pct_copy": pct, "samples_us": s})
        lines.append(f"| {name} | {st.median:.2f} | {st.p10:.2f} | {st.p90:.2f} | {pct:.1f} |")
    run.write_json("variants.json", {"copy": copy, "sets": n_sets, "calls": args.calls, "rows": rows,
                                     "weight_addresses": addresses})
    text = "\n".join(lines) + "\n"
    run.write_markdown("table.md", text)
    run.update_manifest(status="complete")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
