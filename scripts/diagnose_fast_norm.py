#!/usr/bin/env python3
"""Why does the start-up validation refuse the fast one-launch norm on a GPU?

The fast kernel (rltbench/kernels/norm_onelaunch_fast.py) was bitwise equal to torch in
scripts/kernel_tune.py's checks (width 2048, T 1/8/128, contiguous rows) but the full validation
(norm_onelaunch.validate: 18 token counts, strided rows, five forms and the variance) took it off.
This script runs the validation's cases one (token count, layout) at a time on the fast kernel,
with Triton's warp reduction (TREE_SUM) on and off, records every mismatch or exception with the
reduction plan (lanes) that served it, then runs the real validate() per dtype/width and keeps its
report. Results are written as they come (an interrupted run keeps what it finished).

    python scripts/diagnose_fast_norm.py --result-dir results/gpu/fastnorm
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

os.environ["RLTBENCH_NORM_FAST"] = "1"

import torch  # noqa: E402

from rltbench.kernels import norm_onelaunch as nol  # noqa: E402
from rltbench.results import RunDir  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def one_case(
    dev: torch.device, dtype: torch.dtype, W: int, T: int, strided: bool, seed: int
) -> dict[str, Any]:
    """Every form of the validation for one token count and layout, on whatever kernel_path picks."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    plan = nol.plan_for(T, W, dev)
    row: dict[str, Any] = {
        "width": W,
        "tokens": T,
        "strided": strided,
        "lanes": plan.lanes,
        "unsupported": plan.unsupported_reason,
        "path": nol.kernel_path(W, T, dev, "down"),
        "mismatches": [],
        "error": None,
    }
    if plan.unsupported_reason is not None:
        return row
    bad: list[dict[str, Any]] = []
    try:
        nol.validation_case(dev, dtype, W, T, gen, strided, "down", bad)
        torch.cuda.synchronize(dev)
    except Exception as exc:  # record and go on: the point is to see every failure
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        row["traceback"] = traceback.format_exc()[-1500:]
    row["mismatches"] = bad
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result-dir", required=True)
    ap.add_argument("--widths", default="2048,5280")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--tree-sums", default="0", help="TREE_SUM settings to run case by case (0,1)")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds; stops starting new work after it")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("diagnose_fast_norm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    widths = [int(w) for w in args.widths.split(",")]
    run = RunDir.create("fastnorm", args.result_dir, argv=sys.argv)
    t0 = time.perf_counter()
    report: dict[str, Any] = {"cases": [], "validate": {}, "seconds": {}}
    # 1. the real start-up validation, fast kernel enabled, default TREE_SUM
    for name in args.dtypes.split(","):
        for W in widths:
            if time.perf_counter() - t0 > args.deadline:
                break
            nol.reset_validation()
            res = nol.validate(dev, DTYPES[name], W)
            d = res.to_dict()
            report["validate"][f"{name} w{W}"] = d
            print(
                f"validate {name} w{W}: passed={d['passed']} fast_path={d['fast_path'] or 'ok'} "
                f"reason={d['reason']} {d['seconds']:.1f}s",
                flush=True,
            )
            run.write_json("diagnosis.json", report)

    def refused(w: int) -> bool:
        rows = report["validate"].values()
        return any(v["width"] == w and (v["fast_path"] or not v["passed"]) for v in rows)

    # 2. case by case on bf16 for the widths whose validation refused the fast kernel
    todo = [w for w in widths if refused(w)]
    nol.reset_validation()   # forget the refusals, so the cases below run on the fast kernel
    for tree in args.tree_sums.split(","):
        os.environ["RLTBENCH_NORM_TREE_SUM"] = tree
        for W in todo:
            t1 = time.perf_counter()
            for i, T in enumerate(nol.VALIDATION_TOKENS):
                for strided in (False, True):
                    if time.perf_counter() - t0 > args.deadline:
                        break
                    row = one_case(dev, torch.bfloat16, W, T, strided, seed=1000 * i + strided)
                    row["tree_sum"] = tree == "1"
                    report["cases"].append(row)
                    if row["mismatches"] or row["error"]:
                        print(
                            f"tree{tree} w{W} T{T} strided={strided} lanes={row['lanes']} {row['path']}: "
                            f"{row['error'] or row['mismatches'][:3]}",
                            flush=True,
                        )
            report["seconds"][f"cases tree{tree} w{W}"] = round(time.perf_counter() - t1, 1)
            print(f"tree{tree} w{W}: {report['seconds'][f'cases tree{tree} w{W}']} s", flush=True)
            run.write_json("diagnosis.json", report)
    failing = [c for c in report["cases"] if c["mismatches"] or c["error"]]
    summary = {
        "cases": len(report["cases"]),
        "failing": len(failing),
        "failing_by_tree_sum": {t: sum(1 for c in failing if c["tree_sum"] == t) for t in (True, False)},
        "failing_lanes": sorted({c["lanes"] for c in failing}),
        "failing_forms": sorted({m["form"] for c in failing for m in c["mismatches"]}),
        "errors": sorted({c["error"] for c in failing if c["error"]})[:5],
    }
    report["summary"] = summary
    run.write_json("diagnosis.json", report)
    print(summary, flush=True)
    run.update_manifest(status="complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
