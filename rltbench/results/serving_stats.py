"""Arm-vs-reference comparisons of serving records (the rows of requests.jsonl): token identity,
identity under schedule replay, paired statistics with the A/A noise floor, and their verdicts.

Shared by every command that serves one load on several arms or modes (e2e arms, pd against the
colocated engine); the records and cells are those of rltbench.results.serving.

Requests are paired by (C, repetition, request index): the same prompt went to every arm.
Identity compares stored generated token ids and, where the model has an exit gate, each token's exit
depth: an adaptive-exit model computed a different thing when a token left at another loop, even if
the id came out the same, so a depth difference is a divergence like a token difference.
Statistics (relative deltas, arm / reference - 1):
- request metrics (TTFT, TPOT, E2E): per repetition the median of paired per-request deltas; the
  estimate is the median over repetitions; the 95% interval is a two-stage (cluster) percentile
  bootstrap: resample repetitions, then requests within each (2000 resamples, fixed seed).
- cell throughput (output tok/s, steady tok/s): one paired ratio per repetition; estimate = median,
  95% interval = percentile bootstrap over repetitions (none with a single repetition).
Verdicts: a difference whose interval overlaps the A/A spread (the largest |bound| of the
reference measured twice) is "within noise"; without an A/A arm, one whose interval contains 0 is
a "tie"; without an interval (one repetition of a cell metric) the verdict is "n/a": one ratio is
no evidence of a difference. Where the timings cannot mean anything (CPU, the Triton interpreter)
there is no verdict at all ("no verdict: ..." with the reason).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from rltbench.engine.schedule import first_divergence
from rltbench.results.serving import request_metrics
from rltbench.results.stats import is_aa

REPLAY_FILE = "replay.jsonl"  # one identity row per (arm, cell, repetition) under schedule replay
# one row per (cache-on arm, cache-off arm) pair and cell: both replayed with row-invariant prefill
ROW_INVARIANT_FILE = "replay_row_invariant.jsonl"

BOOTSTRAP = 2000
INTERVAL_METHOD = "95% two-stage percentile bootstrap (repetitions, then requests), 2000 resamples"
REQUEST_METRICS = ("ttft", "tpot", "e2e")
CELL_METRICS = ("output_tok_s", "steady_tok_s")
HIGHER_IS_BETTER = {"output_tok_s", "steady_tok_s"}


def generation_divergence(
    tokens: list[int],
    ref_tokens: list[int],
    depths: list[int] | None = None,
    ref_depths: list[int] | None = None,
) -> tuple[int | None, str | None]:
    """(index, "token" or "depth") of the first generated token where two generations differ, in the
    id or (both sides with exit depths) the exit depth; (None, None) when identical. A token
    difference wins at the same index."""
    d_tok = first_divergence(tokens, ref_tokens)
    d_dep = None if depths is None or ref_depths is None else first_divergence(depths, ref_depths)
    if d_tok is None and d_dep is None:
        return None, None
    if d_dep is None or (d_tok is not None and d_tok <= d_dep):
        return d_tok, "token"
    return d_dep, "depth"


def replay_divergences(
    ref_records: list[dict[str, Any]],
    tokens: dict[int, list[int]],
    depths: dict[int, list[int]],
    step_of: Any,
) -> list[dict[str, Any]]:
    """The first divergence of every replayed request (request index -> generated ids, and exit depths
    where the model has an exit gate) from the reference's record of it: request, token index, kind,
    the step (`step_of(request index, token index)`), both tokens and, with depths, both depths."""
    out = []
    for rec in sorted(ref_records, key=lambda r: r["request"]):
        idx = rec["request"]
        want, want_d = rec.get("token_ids") or [], rec.get("exit_depths")
        have, have_d = tokens.get(idx, []), depths.get(idx) if want_d is not None else None
        d, kind = generation_divergence(have, want, have_d if want_d is not None else None, want_d)
        if d is None:
            continue
        row = {
            "request": idx,
            "token_index": d,
            "kind": kind,
            "step": step_of(idx, d),
            "ref_token": want[d] if d < len(want) else None,
            "arm_token": have[d] if d < len(have) else None,
        }
        if want_d is not None:
            row["ref_depth"] = want_d[d] if d < len(want_d) else None
            row["arm_depth"] = have_d[d] if have_d is not None and d < len(have_d) else None
        out.append(row)
    return out


def _head(values: list[int] | None, n: int) -> list[int] | None:
    return None if values is None else values[:n]


def compare_pair(rec: dict[str, Any], base: dict[str, Any]) -> tuple[bool, int | None]:
    """(compared, first divergence) of one request against the reference's same request.

    Both finished ok: the whole sequences are compared. Otherwise (a timeout, an error, a cell cut
    by the global deadline) only the tokens both produced are: a difference there is a real
    divergence, while a shorter, merely unfinished sequence is not compared (it is no evidence of a
    kernel difference and must never raise the exact-arm alarm). No token ids: not compared. Exit
    depths, where both records have them, are compared like the ids (`generation_divergence`)."""
    a, b = rec.get("token_ids"), base.get("token_ids")
    if a is None or b is None:
        return False, None
    da, db = rec.get("exit_depths"), base.get("exit_depths")
    if rec.get("status", "ok") == "ok" and base.get("status", "ok") == "ok":
        return True, generation_divergence(a, b, da, db)[0]
    n = min(len(a), len(b))
    d, _kind = generation_divergence(a[:n], b[:n], _head(da, n), _head(db, n))
    return (True, d) if d is not None else (False, None)


def _by_key(records: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {(r["arm"], r["cell"], r["rep"], r["request"]): r for r in records}


def identity(
    records: list[dict[str, Any]],
    ref: str,
    exact_arms: set[str] = frozenset(),
    batches_deterministic: bool = True,
    refs: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Per arm and cell: identical / compared requests, first divergences, a loud flag for exact arms.
    `refs`: arms compared with another arm than `ref` (a reference of its own maps to itself).

    Greedy outputs are not batch-invariant (GEMM and attention kernels are chosen per batch
    shape). In a burst every arm sees the same batches, so any exact-arm divergence is a bug
    (`exact_mismatch`). In a session replay requests arrive on the wall clock, so batch
    composition depends on each arm's speed: there an exact-arm divergence is a bug only when the
    exact arm matches torch less often than torch matches itself (the A/A arm of the same cell);
    without an A/A arm it is reported as unverified (`exact_unverified`), never silently passed."""
    idx = _by_key(records)
    groups: dict[tuple, list[int | None]] = defaultdict(list)
    missing: dict[tuple, int] = defaultdict(int)
    refs = refs or {}
    for (arm, cell, rep, req), r in idx.items():
        arm_ref = refs.get(arm, ref)
        if arm == arm_ref:
            continue
        base = idx.get((arm_ref, cell, rep, req))
        compared, div = compare_pair(r, base) if base is not None else (False, None)
        if not compared:
            missing[(arm, cell)] += 1
            continue
        groups[(arm, cell)].append(div)
    rows = []
    for arm, cell in sorted(set(groups) | set(missing)):
        divs = groups.get((arm, cell), [])
        diff = [d for d in divs if d is not None]
        row = {
            "arm": arm,
            "cell": cell,
            "compared": len(divs),
            "identical": len(divs) - len(diff),
            "not_compared": missing.get((arm, cell), 0),
            "first_divergence_min": min(diff) if diff else None,
            "first_divergence_median": float(np.median(diff)) if diff else None,
            "aa": is_aa(arm, ref),
            "exact_arm": arm in exact_arms,
            "ref": refs.get(arm, ref),
        }
        row["identity"] = row["identical"] / row["compared"] if row["compared"] else None
        row["exact_mismatch"] = bool(arm in exact_arms and diff)
        row["exact_unverified"] = False
        row["batches_deterministic"] = batches_deterministic
        rows.append(row)
    if not batches_deterministic:
        aa = {r["cell"]: r["identity"] for r in rows if r["aa"] and r["identity"] is not None}
        for row in rows:
            if row["exact_mismatch"]:
                base = aa.get(row["cell"])
                row["aa_identity"] = base
                row["exact_mismatch"] = base is not None and row["identity"] < base
                row["exact_unverified"] = base is None
    return rows


def replay_identity(replays: list[dict[str, Any]], exact_arms: set[str]) -> list[dict[str, Any]]:
    """Per arm and cell: identical / compared under schedule replay over all repetitions, the first
    divergence (request, step, token) and whether it is an exact-arm mismatch (a kernel bug)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in replays:
        groups[(r["arm"], r["cell"])].append(r)
    rows = []
    for (arm, cell), rs in groups.items():
        done = [r for r in rs if "compared" in r]
        divs = [dict(d, rep=r["rep"]) for r in done for d in r.get("divergences", [])]
        first = min(divs, key=lambda d: (d["token_index"], d["rep"], d["request"])) if divs else None
        row = {
            "arm": arm,
            "cell": cell,
            "reps": len(done),
            "compared": sum(r["compared"] for r in done),
            "identical": sum(r["identical"] for r in done),
            "skipped": [f"rep {r['rep']}: {r['skipped']}" for r in rs if "skipped" in r],
            "first_divergence": first,
            "same_schedule_free_running": sum(bool(r.get("same_schedule_free_running")) for r in rs),
            "exact_arm": arm in exact_arms,
            "ref": rs[0].get("ref"),
        }
        row["exact_mismatch"] = bool(row["exact_arm"] and row["identical"] < row["compared"])
        row["exact_unverified"] = bool(row["exact_arm"] and (row["skipped"] or not done))
        rows.append(row)
    return rows


def row_invariant_identity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pair and cell (ROW_INVARIANT_FILE rows): identical / compared of the cache-off replay
    against the cache-on one, both with row-invariant prefill; any difference is a mismatch, since the
    two replays ran the same kernels on the same batches with every token's values independent of its
    step (rltbench.engine.row_invariant)."""
    out = []
    for r in rows:
        done = "compared" in r
        divs = r.get("divergences") or []
        first = min(divs, key=lambda d: (d["token_index"], d["request"])) if divs else None
        out.append({
            "cell": r["cell"], "rep": r["rep"], "arm_on": r["arm_on"], "arm_off": r["arm_off"],
            "tile_tokens": r.get("tile_tokens"), "compared": r.get("compared", 0),
            "identical": r.get("identical", 0), "first_divergence": first and dict(first, rep=r["rep"]),
            "seconds": r.get("seconds"), "skipped": [r["skipped"]] if "skipped" in r else [],
            "mismatch": bool(done and r["identical"] < r["compared"]),
        })
    return out


def no_verdict_reason(cfg: dict[str, Any]) -> str | None:
    """Why the run's timings cannot carry a speed verdict, or None where they can."""
    if str(cfg.get("device") or "").startswith("cpu"):
        return "CPU timings (fused arms run torch ops or the Triton interpreter)"
    return None


def no_verdict_caption(cfg: dict[str, Any]) -> str | None:
    """The caption every speed figure of such a run carries, on the console and on its plots."""
    reason = no_verdict_reason(cfg)
    return reason and f"no speed verdict: {reason}"


def random_weights_line(no_verdict: str | None) -> str:
    """The table's line for a run on random weights: its text means nothing, its token ids do, and its
    timings do only where a speed verdict is possible (`no_verdict` None)."""
    valid = "token ids and timings are" if not no_verdict else "token ids are; timings carry no verdict here"
    return f"**random weights: text is not meaningful** ({valid})"


def _boot_two_stage(per_rep: list[np.ndarray], rng: np.random.Generator) -> tuple[float, float]:
    reps = [v for v in per_rep if v.size]
    meds = np.empty((len(reps), BOOTSTRAP))
    for i, v in enumerate(reps):
        meds[i] = np.median(v[rng.integers(0, v.size, size=(BOOTSTRAP, v.size))], axis=1)
    if len(reps) > 1:
        pick = rng.integers(0, len(reps), size=(BOOTSTRAP, len(reps)))
        stat = np.median(meds[pick, np.arange(BOOTSTRAP)[:, None]], axis=1)
    else:
        stat = meds[0]
    lo, hi = np.percentile(stat, [2.5, 97.5])
    return float(lo), float(hi)


def _boot_reps(vals: np.ndarray, rng: np.random.Generator) -> tuple[float | None, float | None]:
    if vals.size < 2:
        return None, None
    stat = np.median(vals[rng.integers(0, vals.size, size=(BOOTSTRAP, vals.size))], axis=1)
    lo, hi = np.percentile(stat, [2.5, 97.5])
    return float(lo), float(hi)


def paired_deltas(
    records: list[dict[str, Any]],
    cells: list[dict[str, Any]],
    ref: str,
    seed: int = 0,
    no_verdict: str | None = None,
    aa_spread: Mapping[tuple[str, str], float] | None = None,
) -> list[dict[str, Any]]:
    """Rows (arm, cell, C, metric, delta, ci_lo, ci_hi, reps, pairs, aa_spread, verdict); invalid out.
    `aa_spread`: the noise floor per (cell, metric) where the run's A/A arm is not `ref`'s (e.g. the
    exit modes of one arm, judged against the reference's A/A spread); default: `ref`'s A/A arm."""
    rng = np.random.default_rng(seed)
    valid = {(c["arm"], c["cell"], c["rep"]): bool(c["valid"]) for c in cells}
    cellrow = {(c["arm"], c["cell"], c["rep"]): c for c in cells}
    conc = {c["cell"]: c.get("C") for c in cells}
    idx = _by_key(records)
    arms = sorted({c["arm"] for c in cells if c["arm"] != ref})
    cell_names = list(dict.fromkeys(c["cell"] for c in cells))
    reps = sorted({c["rep"] for c in cells})
    metrics_cache: dict[tuple, dict[str, Any]] = {}

    def m(key: tuple) -> dict[str, Any]:
        if key not in metrics_cache:
            metrics_cache[key] = request_metrics(idx[key])
        return metrics_cache[key]

    rows: list[dict[str, Any]] = []
    for arm in arms:
        for cell in cell_names:
            ok_reps = [r for r in reps if valid.get((arm, cell, r)) and valid.get((ref, cell, r))]
            excluded = [r for r in reps if (arm, cell, r) in valid and r not in ok_reps]
            for metric in REQUEST_METRICS:
                per_rep = []
                for rep in ok_reps:
                    d = []
                    for a, c, rp, req in idx:
                        if a != arm or c != cell or rp != rep or (ref, cell, rep, req) not in idx:
                            continue
                        x, y = m((arm, cell, rep, req))[metric], m((ref, cell, rep, req))[metric]
                        if x is not None and y is not None and y > 0:
                            d.append(x / y - 1.0)
                    per_rep.append(np.asarray(d, dtype=np.float64))
                pairs = int(sum(v.size for v in per_rep))
                if pairs:
                    est = float(np.median([np.median(v) for v in per_rep if v.size]))
                    lo, hi = _boot_two_stage(per_rep, rng)
                else:
                    est = lo = hi = None
                rows.append(
                    _row(arm, cell, conc.get(cell), metric, est, lo, hi, len(ok_reps), pairs, excluded)
                )
            for metric in CELL_METRICS:
                vals = []
                for rep in ok_reps:
                    x, y = cellrow[(arm, cell, rep)].get(metric), cellrow[(ref, cell, rep)].get(metric)
                    if x is not None and y:
                        vals.append(x / y - 1.0)
                arr = np.asarray(vals, dtype=np.float64)
                est = float(np.median(arr)) if arr.size else None
                lo, hi = _boot_reps(arr, rng)
                rows.append(
                    _row(
                        arm, cell, conc.get(cell), metric, est, lo, hi, len(ok_reps), int(arr.size), excluded
                    )
                )
    _apply_aa(rows, ref, no_verdict, aa_spread)
    return rows


def _row(arm, cell, c, metric, est, lo, hi, reps, pairs, excluded) -> dict[str, Any]:
    return {
        "arm": arm,
        "cell": cell,
        "C": c,
        "metric": metric,
        "delta": est,
        "ci_lo": lo,
        "ci_hi": hi,
        "reps": reps,
        "pairs": pairs,
        "excluded_reps": excluded,
        "aa_spread": None,
        "verdict": None,
    }


def aa_spreads(rows: list[dict[str, Any]], ref: str) -> dict[tuple[str, str], float]:
    """The A/A spread per (cell, metric): the largest |bound| of `ref`'s A/A arm's delta."""
    spread: dict[tuple[str, str], float] = {}
    for r in rows:
        if is_aa(r["arm"], ref) and r["delta"] is not None:
            bounds = [abs(v) for v in (r["delta"], r["ci_lo"], r["ci_hi"]) if v is not None]
            key = (r["cell"], r["metric"])
            spread[key] = max(spread.get(key, 0.0), max(bounds))
    return spread


def _apply_aa(rows: list[dict[str, Any]], ref: str, no_verdict: str | None = None,
              given: Mapping[tuple[str, str], float] | None = None) -> None:
    """Fill the A/A spread beside every row (`given`, else `ref`'s A/A arm's) and the verdict (better /
    worse / within noise / tie / n/a; `no_verdict` = why timings cannot carry one, e.g. "CPU timings")."""
    spread = aa_spreads(rows, ref) if given is None else given
    for r in rows:
        r["aa_spread"] = spread.get((r["cell"], r["metric"]))
        d = r["delta"]
        s = r["aa_spread"]
        if is_aa(r["arm"], ref):
            r["verdict"] = "A/A"
        elif no_verdict:
            r["verdict"] = f"no verdict: {no_verdict}"
        elif d is None or (isinstance(d, float) and math.isnan(d)) or r["ci_lo"] is None:
            r["verdict"] = "n/a"  # no interval (a cell metric from one repetition): no claim either way
        elif s is not None and r["ci_lo"] <= s and r["ci_hi"] >= -s:
            r["verdict"] = "within noise"  # the interval reaches into the A/A spread
        elif r["ci_lo"] <= 0.0 <= r["ci_hi"]:
            r["verdict"] = "tie"
        else:
            better = d > 0 if r["metric"] in HIGHER_IS_BETTER else d < 0
            r["verdict"] = "better" if better else "worse"


def fmt_pct(v: float | None) -> str:
    """A relative delta as '+1.2%' ('-' for missing)."""
    return "-" if v is None else f"{v * 100:+.1f}%"


def delta_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of paired-delta rows (`paired_deltas`), header included."""
    L = [
        "| cell | arm | metric | delta | 95% CI | reps | pairs | A/A spread | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = "-" if r["ci_lo"] is None else f"[{fmt_pct(r['ci_lo'])}, {fmt_pct(r['ci_hi'])}]"
        L.append(
            f"| {r['cell']} | {r['arm']} | {r['metric']} | {fmt_pct(r['delta'])} | {ci} | {r['reps']} | "
            f"{r['pairs']} | {fmt_pct(r['aa_spread'])} | {r['verdict']} |"
        )
    return L


def mismatch_text(m: dict[str, Any]) -> str:
    """'exact C=8 15/16 (first: request 3, step 41, token 7)'."""
    s = f"{m['arm']} {m['cell']} {m['identical']}/{m['compared']}"
    fd = m.get("first_divergence")
    if isinstance(fd, dict):
        s += f" (first: rep {fd['rep']} request {fd['request']}, step {fd['step']}, "
        s += f"token {fd['token_index']}"
        if fd.get("kind") == "depth":
            s += f", exit depth {fd.get('arm_depth')} vs {fd.get('ref_depth')}"
        s += ")"
    elif m.get("first_divergence_min") is not None:
        s += f" (first divergence at token {m['first_divergence_min']})"
    return s
