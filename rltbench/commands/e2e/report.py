"""Analysis and rendering of an e2e run from its raw files only (requests.jsonl, cell_meta.jsonl,
replay.jsonl, manifest).

`render(run_dir)` (called at the end of a run and by `rltbench report DIR`) recomputes cells,
identity (under schedule replay: the verdict; free-running: information) and paired statistics,
then writes cells.csv/json, identity.csv/json, replay_identity.csv/json, comparison.csv/json,
summary.json, table.md and the plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from rltbench.arms import NOT_EXERCISED, unexercised_arms
from rltbench.backends.engine import STOP_SUFFIX
from rltbench.commands.e2e.rate_report import analyse_rate, make_rate_plots, rate_section
from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.plotting import arm_color, caveat, figure, log_axis
from rltbench.results.serving import (
    CELL_KEYS,
    Percentiles,
    PooledMetrics,
    compute_cells,
    fmt_ms,
    pooled_metrics,
)
from rltbench.results.serving_stats import (
    INTERVAL_METHOD,
    REPLAY_FILE,
    ROW_INVARIANT_FILE,
    aa_spreads,
    delta_table,
    fmt_pct,
    identity,
    mismatch_text,
    no_verdict_reason,
    paired_deltas,
    replay_identity,
    row_invariant_identity,
)
from rltbench.results.stats import is_aa
from rltbench.results.tables import table


def analyse(run: RunDir) -> dict[str, Any]:
    """Everything the report shows, from the raw files."""
    cfg = run.manifest.get("config", {})
    records = run.read_jsonl("requests.jsonl")
    meta = run.read_jsonl("cell_meta.jsonl")
    arms = cfg.get("arm_names") or list(dict.fromkeys(r["arm"] for r in records))
    ref = cfg.get("reference_arm") or (arms[0] if arms else "torch")
    exact_arms = set(cfg.get("exact_arms") or [])
    refs = cfg.get("identity_references") or {}
    cells = compute_cells(records, meta)
    batches_deterministic = cfg.get("workload", "burst") == "burst"
    ident = identity(records, ref, exact_arms, batches_deterministic, refs)
    cell_order = list(dict.fromkeys(c["cell"] for c in cells))
    ident.sort(
        key=lambda r: (
            arms.index(r["arm"]) if r["arm"] in arms else len(arms),
            cell_order.index(r["cell"]) if r["cell"] in cell_order else len(cell_order),
        )
    )
    replays = replay_identity(run.read_jsonl(REPLAY_FILE), exact_arms)
    replays.sort(key=lambda r: (arms.index(r["arm"]) if r["arm"] in arms else len(arms)))
    replay_on = cfg.get("backend", "engine") == "engine"
    if replay_on:  # the verdict comes from the replays; free-running identity is information
        for r in ident:
            r["exact_mismatch"] = r["exact_unverified"] = False
    row_inv = row_invariant_identity(run.read_jsonl(ROW_INVARIANT_FILE))
    _demote_cache_off_replays(replays, row_inv, cfg.get("arm_specs") or {})
    unexercised = not_exercised(cfg)
    for r in replays:
        r["not_exercised"] = r["arm"] in unexercised
    no_verdict = no_verdict_reason(cfg)
    comp = (
        paired_deltas(records, cells, ref, seed=int(cfg.get("seed") or 0), no_verdict=no_verdict)
        if ref in arms
        else []
    )
    for r in comp:  # torch's ops against torch's: whatever the numbers, they say nothing of the kernels
        if r["arm"] in unexercised:
            r["verdict"] = NOT_EXERCISED
    modes = _mode_deltas(records, cells, comp, arms, ref, int(cfg.get("seed") or 0), no_verdict)
    pooled = pooled_metrics(records, cells, arms)
    if replay_on:
        missing = sorted(exact_arms - {r["arm"] for r in replays} - {ref} - set(refs.values()))
        mismatch = [_mismatch_row(r) for r in replays if r["exact_mismatch"]]
        mismatch += [{"arm": f"{r['arm_off']} vs {r['arm_on']} (row-invariant)", "cell": r["cell"],
                      "compared": r["compared"], "identical": r["identical"],
                      "first_divergence": r["first_divergence"]} for r in row_inv if r["mismatch"]]
        unverified = [_mismatch_row(r) for r in replays if r["exact_unverified"]]
        unverified += [{"arm": a, "cell": "-", "compared": 0, "identical": 0} for a in missing]
    else:
        mismatch = [_mismatch_row(r) for r in ident if r["exact_mismatch"]]
        unverified = [_mismatch_row(r) for r in ident if r.get("exact_unverified")]
    cold = [{k: c[k] for k in (*CELL_KEYS, "cold_work")} for c in cells if c.get("cold")]
    summary = {
        "status": run.manifest.get("status"),
        "interrupted_by": run.manifest.get("interrupted_by"),
        "skipped_cells": run.manifest.get("skipped_cells"),
        "reference_arm": ref,
        "arms": arms,
        "cells_total": len(cells),
        "cells_invalid": sum(1 for c in cells if not c["valid"]),
        "identity_method": "schedule replay" if replay_on else "free-running (replay needs the engine)",
        "exact_arm_mismatch": bool(mismatch),
        "exact_arm_mismatches": mismatch,
        "exact_arm_unverified": unverified,
        "identity": ident,
        "replay_identity": replays,
        "row_invariant_identity": row_inv,
        "cold_cells": cold,
        "no_verdict": no_verdict,
        "not_exercised": unexercised,
        "interval_method": INTERVAL_METHOD,
        "random_weights": bool(cfg.get("random_weights")),
    }
    rate = analyse_rate(cfg, records, meta, arms, ref) if cfg.get("workload") == "rate" else {}
    if rate:
        summary.update(slo_capacity=rate["slo_capacity"], slo_headlines=rate["slo_headlines"],
                       sweep=run.manifest.get("sweep"))
    summary["exit_code"] = exit_code(summary)
    return {
        **rate,
        "sweep": run.manifest.get("sweep"),
        "cells": cells,
        "identity": ident,
        "replay_identity": replays,
        "row_invariant_identity": row_inv,
        "comparison": comp,
        "mode_comparison": modes,
        "pooled": pooled,
        "summary": summary,
        "config": cfg,
        "arms": arms,
        "ref": ref,
    }


def not_exercised(cfg: dict[str, Any]) -> list[str]:
    """The engine arms whose kernels never ran: scope graph in a run without CUDA graphs (the CPU,
    --enforce-eager), so they ran torch's ops and their identity compares torch with torch. Runs
    stored before the manifest said whether graphs ran: none."""
    graphs = (cfg.get("engine") or {}).get("cuda_graphs")
    if cfg.get("backend", "engine") != "engine" or graphs is None:
        return []
    return unexercised_arms(cfg.get("arm_specs") or {}, bool(graphs))


def exit_code(summary: dict[str, Any]) -> int:
    """The command's exit code: 1 when an exact arm changed tokens, else 3 when an arm's kernels were
    not exercised (its identity is no verdict), else 0."""
    if summary["exact_arm_mismatch"]:
        return 1
    return 3 if summary.get("not_exercised") else 0


def stop_pairs(arms: list[str]) -> list[tuple[str, str]]:
    """(arm, its compute-saving run) for every arm run in both exit modes (`e2e --exit-mode all,stop`)."""
    return [(a, a + STOP_SUFFIX) for a in arms if a + STOP_SUFFIX in arms]


def _mode_deltas(records: list[dict[str, Any]], cells: list[dict[str, Any]], comp: list[dict[str, Any]],
                 arms: list[str], ref: str, seed: int, no_verdict: str | None) -> list[dict[str, Any]]:
    """Each arm's compute-saving run against its every-loop run (paired like arms, same repetitions),
    judged against the reference's A/A spread: what the mode buys with one arm's kernels."""
    spread = aa_spreads(comp, ref)
    out = []
    for base, stop in stop_pairs(arms):
        rows = paired_deltas(records, cells, base, seed=seed, no_verdict=no_verdict, aa_spread=spread)
        out += [dict(r, against=base) for r in rows if r["arm"] == stop]
    return out


def _demote_cache_off_replays(
    replays: list[dict[str, Any]], row_inv: list[dict[str, Any]], arm_specs: dict[str, Any]
) -> None:
    """Where a row-invariant pair replayed a cell, the plain replay of a cache-off arm on the cache-on
    schedule is information, not the verdict: its recomputed prefixes ran in steps of other shapes
    than the cached ones, so it mixes the prefix cache with kernels that are not batch-invariant.
    Such rows keep their counts and get `information` set instead of an exact-arm flag."""
    decided = {r["cell"] for r in row_inv if r["compared"]}
    for r in replays:
        spec = arm_specs.get(r["arm"])
        if r["cell"] in decided and isinstance(spec, dict) and spec.get("prefix_cache") == "off":
            r["information"] = True
            r["exact_mismatch"] = r["exact_unverified"] = False


def _mismatch_row(r: dict[str, Any]) -> dict[str, Any]:
    """The fields of an identity row that name a mismatch (replay rows carry request/step/token)."""
    keys = ("arm", "cell", "compared", "identical", "first_divergence", "first_divergence_min")
    return {k: r[k] for k in keys if k in r}


def status_text(s: dict[str, Any]) -> str:
    """'complete', or 'interrupted (global deadline (--deadline); 4 cells skipped)'."""
    skipped = s.get("skipped_cells")
    why = [w for w in (s.get("interrupted_by"), skipped and f"{skipped} cells skipped") if w]
    return f"{s.get('status')} ({'; '.join(why)})" if why else str(s.get("status"))


def _p3(q: Percentiles) -> str:
    """'p50 / p90 / p99' in ms of one metric, the p99 starred when it comes from < 100 samples."""
    return f"{fmt_ms(q.p50)} / {fmt_ms(q.p90)} / {fmt_ms(q.p99, q.p99_low_n)}"


def _spec(s: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.items()) if isinstance(s, dict) else str(s)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _speed(v: float | None) -> str:
    return "-" if v is None else f"{1 + v:.3f}x"


def _header(a: dict[str, Any]) -> list[str]:
    cfg = a["config"]
    return [*rs.title(f"rltbench e2e: {cfg.get('model', '?')} ({cfg.get('workload', '?')})"),
            *rs.random_weights(bool(cfg.get("random_weights")), a["summary"].get("no_verdict"))]


def _notes(a: dict[str, Any]) -> list[str]:
    """The manifest's notes and what this run cannot say (no A/A arm, no speed verdicts, exit modes)."""
    cfg, ref, arms, summ = a["config"], a["ref"], a["arms"], a["summary"]
    notes = list(cfg.get("notes") or [])
    if len(arms) > 1 and not any(is_aa(arm, ref) for arm in arms):
        notes.append(
            f"no A/A arm ({ref} run twice, e.g. --arms {','.join(arms)},{ref}): identity has no "
            "batch-invariance baseline and the verdicts no noise floor"
        )
    if summ.get("no_verdict"):
        notes.append(f"no speed verdicts: {summ['no_verdict']} cannot say which arm is faster")
    if cfg.get("exit_mode") == "stop":
        notes.append("compute-saving exit (--exit-mode stop): decode steps stop their loops once every row "
                     "has exited, a special mode with other semantics than the reference (see 'Exit depths')")
    elif "stop" in str(cfg.get("exit_mode") or ""):
        notes.append(f"both exit modes, interleaved: the arms named *{STOP_SUFFIX} run the compute-saving "
                     "exit (decode steps stop their loops once every row has exited), a special mode with "
                     "other semantics than the reference; their tokens are compared with "
                     f"{_stop_reference(cfg) or 'the reference'}'s (see 'Exit depths')")
    return rs.notes(notes)


def _warnings(a: dict[str, Any]) -> list[str]:
    """Arms whose kernels did not run, exact-arm mismatches and timed cold work, in bold."""
    summ, L = a["summary"], []
    if summ.get("not_exercised"):
        L += rs.bold(f"{', '.join(summ['not_exercised'])}: {NOT_EXERCISED}. Their identity below compares "
                     "torch's ops with torch's and is no verdict (exit 3)")
    if summ["exact_arm_mismatch"]:
        L += [
            f"**EXACT ARM MISMATCH ({summ.get('identity_method', 'free-running')}): an exact arm "
            "generated tokens different from the reference on the same batches "
            f"({mismatch_cause(a['config'])}):** "
            + "; ".join(mismatch_text(m) for m in summ["exact_arm_mismatches"]),
            "",
        ]
    if summ.get("cold_cells"):
        L += rs.bold(f"{len(summ['cold_cells'])} timed cell(s) did cold work (graph capture, compile or "
                     "device malloc inside the timed window): their timings include it; "
                     "see 'Cold work' below")
    return L


def _run_header(a: dict[str, Any]) -> list[str]:
    cfg, ref = a["config"], a["ref"]
    return rs.bullets([
        f"backend: {cfg.get('backend')}; hosting: {cfg.get('hosting', '-')}",
        "arms: " + "; ".join(f"{n} ({_spec(s)})" for n, s in (cfg.get("arm_specs") or {}).items()),
        f"reference: {ref}; repetitions: {cfg.get('repeats')}; schedule: {cfg.get('schedule_note', '-')}",
        f"device: {cfg.get('device')}, dtype: {cfg.get('dtype')}, weights: {cfg.get('weights')}",
        f"workload: {cfg.get('workload_note', '-')}",
        f"status: {status_text(a['summary'])}",
    ])


def _rate(a: dict[str, Any]) -> list[str]:
    return [*rate_section(a), ""] if a["config"].get("workload") == "rate" else []


def _cell_names(a: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(c["cell"] for c in a["cells"]))


def _pooled(a: dict[str, Any]) -> dict[tuple[str, str], PooledMetrics]:
    """Each (arm, cell)'s metrics pooled over its valid repetitions (results.serving.pooled_metrics)."""
    return {(p.arm, p.cell): p for p in a["pooled"]}


def _ci(row: dict[str, Any]) -> str:
    """'1.023x [0.998x, 1.050x]': a speedup and its interval, '-' without a delta."""
    if not row or row.get("delta") is None:
        return "-"
    s = _speed(row["delta"])
    if row.get("ci_lo") is not None:
        s += f" [{_speed(row['ci_lo'])}, {_speed(row['ci_hi'])}]"
    return s


def speed_rows(a: dict[str, Any]) -> list[list[str]]:
    """One row per cell and arm: median tok/s, steady tok/s, their speedups vs the reference, verdict."""
    ref, pooled = a["ref"], _pooled(a)
    comp = {(r["arm"], r["cell"], r["metric"]): r for r in a["comparison"]}
    rows = []
    for cell in _cell_names(a):
        for arm in a["arms"]:
            p = pooled.get((arm, cell))
            tok_s, steady_tok_s = (p.output_tok_s_median, p.steady_tok_s_median) if p else (None, None)
            r, steady = comp.get((arm, cell, "output_tok_s"), {}), comp.get((arm, cell, "steady_tok_s"), {})
            rows.append([
                cell, arm, _num(tok_s), _num(steady_tok_s),
                "(ref)" if arm == ref else _ci(r), "(ref)" if arm == ref else _ci(steady),
                fmt_pct(r.get("aa_spread")),
                r.get("verdict") or "-",
            ])
    return rows


def _throughput(a: dict[str, Any]) -> list[str]:
    return [
        "## Output throughput (median over valid repetitions) and speedup vs " + a["ref"], "",
        *table(["cell", "arm", "tok/s", "steady tok/s", "speedup (95% CI)", "steady speedup (95% CI)",
                "A/A spread", "verdict"], speed_rows(a)),
    ]



def _latency(a: dict[str, Any]) -> list[str]:
    pooled = _pooled(a)
    rows = [
        [cell, arm, *(v for q in (p.latency.ttft, p.latency.tpot, p.latency.itl, p.latency.e2e)
                      for v in (_p3(q), q.n))]
        for cell in _cell_names(a) for arm in a["arms"] if (p := pooled.get((arm, cell)))
    ]
    return [
        *rs.heading("Latency (ms, pooled over valid repetitions: p50 / p90 / p99, n = samples; * = p99 "
                    "from < 100 samples)"),
        *table(["cell", "arm", "TTFT", "n", "TPOT", "n", "ITL", "n", "E2E", "n"], rows),
    ]


def _identity_note(r: dict[str, Any]) -> str:
    """What a free-running identity row means: A/A, an exact arm's bug or its timing-bound divergence."""
    if r["aa"]:
        note = "A/A"
    elif r["exact_mismatch"]:
        note = "**MISMATCH: exact arm must match (bug)**"
    elif r.get("exact_unverified"):
        note = "exact arm: unverified (session batches depend on timing; add an A/A arm)"
    elif r["exact_arm"] and r["identical"] < r["compared"]:
        note = "exact arm (divergence within A/A: timing-dependent batches)"
    else:
        note = "exact arm" if r["exact_arm"] else ""
    if r["not_compared"]:
        note += f" ({r['not_compared']} not compared: unfinished or without token ids)"
    return note


def _free_identity(a: dict[str, Any]) -> list[str]:
    ref = a["ref"]
    replayed = a["summary"].get("identity_method") == "schedule replay"
    rows = []
    for r in a["identity"]:
        fd = (
            "-"
            if r["first_divergence_min"] is None
            else f"{r['first_divergence_min']}, {r['first_divergence_median']:.0f}"
        )
        rows.append([r["cell"], r["arm"], f"{r['identical']} / {r['compared']}", fd, _identity_note(r)])
    return [
        *rs.heading(f"Free-running token identity vs {ref} ({'information' if replayed else 'the verdict'}; "
                    f"A/A = {ref} run twice)"),
        "The tokens of the timed cells. Bursts give every arm the same batches; session loads admit "
        "requests on the wall clock, so batch composition depends on each arm's speed and greedy "
        "outputs are not batch-invariant: free-running divergences there mix kernels and timing. "
        + (
            "The verdict is the replay above."
            if replayed
            else "Without replay an exact-arm divergence is flagged only when it exceeds the A/A one."
        )
        + _stop_reference_sentence(a["config"], "are compared with the tokens of"),
        "",
        *table(["cell", "arm", "identical / compared", "first divergence (min, median)", "note"], rows),
    ]


def _session_cache(a: dict[str, Any]) -> list[str]:
    sess = [c for c in a["cells"] if c.get("theoretical_prefix_hit_rate") is not None]
    if not sess:
        return []
    hit_rows = []
    for c in sess:
        mh = c.get("measured_prefix_hit_rate", c.get("engine_prefix_hit_rate"))
        hit_rows.append([c["arm"], c["rep"], f"{c['theoretical_prefix_hit_rate']:.1%}",
                         "n/a" if mh is None else f"{mh:.1%}"])
    L = [*rs.heading("Session prefix cache"),
         *table(["arm", "rep", "theoretical hit rate", "measured hit rate"], hit_rows)]
    L += [
        "",
        "Theoretical: infinite cache at trace-block granularity (leading hash ids seen before). "
        "Measured: prompt tokens the engine (or the server, in its usage's cached_tokens) served from "
        "its prefix cache; n/a: not reported (a server without cached_tokens).",
    ]
    bust = (a["config"].get("session") or {}).get("cache_bust")
    if bust not in (None, "off"):
        L += ["", f"Cache busting per {bust}: each prompt's first tokens are unique per repetition and "
              f"{bust}, so a hit beyond the theoretical rate is unintended."]
    return L


def _invalid(a: dict[str, Any]) -> list[str]:
    bad = [c for c in a["cells"] if not c["valid"]]
    if not bad:
        return []
    return [*rs.heading("Invalid cells (excluded from paired statistics)"),
            *table(["cell", "arm", "rep", "ok", "error", "timeout", "length_mismatch", "note"], [
                [c["cell"], c["arm"], c["rep"], c["n_ok"], c["n_error"], c["n_timeout"],
                 c["n_length_mismatch"], "interrupted" if c.get("interrupted") else c.get("note", "")]
                for c in bad])]


def _deltas(a: dict[str, Any]) -> list[str]:
    if not a["comparison"]:
        return []
    ref = a["ref"]
    L = [
        *rs.heading(f"Paired deltas vs {ref} (arm / {ref} - 1; {INTERVAL_METHOD}; "
                    "cell throughput: bootstrap over repetitions)"),
        *delta_table(a["comparison"]),
        "",
        "Verdict: `within noise` when the 95% interval reaches into the A/A spread (largest |bound| "
        "of the A/A arm's delta); `tie` when it contains 0 and there is no A/A spread; `n/a` when "
        "there is no interval (cell throughput from one repetition); `no verdict` where timings "
        "cannot mean "
        "anything (CPU); latency: lower is better, throughput: higher.",
    ]
    reps = int(a["config"].get("repeats") or 0)
    if reps == 1:
        L.append(
            "With 1 repetition there is no interval over repetitions: request-metric intervals "
            "resample requests only, and cell throughput has none (use --repeats 5+ for intervals)."
        )
    elif reps < 5:
        L.append(
            f"With {reps} repetitions the interval over repetitions is little more than their "
            "range: read it as a spread, not a calibrated 95% interval (use --repeats 5+ for that)."
        )
    return L


def _definitions(a: dict[str, Any]) -> list[str]:
    return ["", *rs.metric_definitions()]


def table_markdown(a: dict[str, Any]) -> str:
    """The human summary: configuration, speedup, latency, identity, statistics, definitions."""
    return rs.render_sections(SECTIONS, a)


def _stop_reference(cfg: dict[str, Any]) -> str | None:
    """The compute-saving runs' identity reference (e.g. torch+stop), when the exit mode is varied."""
    refs = cfg.get("identity_references") or {}
    return next(iter(set(refs.values())), None)


def _stop_reference_sentence(cfg: dict[str, Any], verb: str) -> str:
    stop_ref = _stop_reference(cfg)
    if stop_ref is None:
        return ""
    return (f" The compute-saving arms (*{STOP_SUFFIX}) {verb} {stop_ref}, the reference's own "
            "compute-saving run: their semantics differ from every loop's.")


def _mode_section(a: dict[str, Any]) -> list[str]:
    """Compute-saving exit against every loop, per arm: output throughput and latency deltas."""
    rows = [r for r in a.get("mode_comparison") or []
            if r["metric"] in ("output_tok_s", "steady_tok_s", "tpot", "ttft")]
    if not rows:
        return []
    rows = [dict(r, arm=f"{r['arm']} / {r['against']}") for r in rows]
    L = ["", "## Compute-saving exit against every loop, per arm (arm+stop / arm - 1; interleaved in this "
         "run)", "", *delta_table(rows)]
    return L + ["", "The A/A spread is the reference's (its A/A arm); a verdict compares two modes of one "
                "arm's kernels, with other semantics (the stop mode's tokens are its own)."]


def decode_loops_by_arm(a: dict[str, Any]) -> dict[str, float]:
    """Loops run per decode step, per arm, over its timed cells (the compute-saving exit only)."""
    out: dict[str, float] = {}
    for arm in a["arms"]:
        steps = loops = 0
        for c in a["cells"]:
            if c["arm"] == arm:
                for k, v in (c.get("decode_loops_hist") or {}).items():
                    steps, loops = steps + int(v), loops + int(k) * int(v)
        if steps:
            out[arm] = loops / steps
    return out


def _depth_section(a: dict[str, Any]) -> list[str]:
    """Mean exit depth per arm (a model with an exit gate): the loops its tokens used; with the
    compute-saving exit also the loops its decode steps ran (a step runs until its last row exits)."""
    stop = "stop" in str(a["config"].get("exit_mode") or "")
    loops = decode_loops_by_arm(a)
    rows = []
    for arm in a["arms"]:
        vals = [c["mean_exit_depth"] for c in a["cells"] if c["arm"] == arm and c.get("mean_exit_depth")]
        if vals:
            row = [arm, f"{sum(vals) / len(vals):.3f}", len(vals)]
            rows.append(row + ([f"{loops[arm]:.3f}" if arm in loops else "-"] if stop else []))
    if not rows:
        return []
    varied = bool(a["config"].get("identity_references"))
    mode = (f", the *{STOP_SUFFIX} arms with the compute-saving exit" if varied
            else ", compute-saving exit: loops stop at the exit" if stop else "")
    L = ["", f"## Exit depths (threshold {a['config'].get('exit_threshold')}{mode})", ""]
    head = ["arm", "mean exit depth (loops)", "cells"] + (["loops run per decode step"] if stop else [])
    L += table(head, rows)
    L += ["", "Each token's exit depth is part of identity: a depth difference is a divergence."]
    if stop:
        L += ["With the compute-saving exit a decode step runs its loops until every row has exited, and "
              "a token's K/V in the loops after its exit are its exit loop's: not the reference semantics "
              "(which run every loop), so its tokens are compared between arms of this mode only."]
    return L


def mismatch_cause(config: dict[str, Any]) -> str:
    """What an exact-arm mismatch means in this run. With the prefix cache varied, the reference's
    hit prefixes hold K/V computed in earlier steps of other shapes, which the cache-off replay
    recomputes in a step of its own: GEMM results that depend on a step's rows (no batch
    invariance) differ there without any kernel being wrong, so the cause is left open."""
    if len(config.get("prefix_cache") or []) > 1 and not config.get("row_invariant_pairs"):
        return ("a kernel bug, or cached prefix K/V computed in steps of other shapes than the "
                "cache-off recomputation (GEMMs that are not batch-invariant)")
    return "a kernel bug"


def _replay_section(a: dict[str, Any]) -> list[str]:
    """The identity verdict: every other arm run untimed on the reference's recorded batches."""
    ref, rows = a["config"].get("replay_reference_arm") or a["ref"], a.get("replay_identity") or []
    L = ["", f"## Token identity vs {ref} under schedule replay (the verdict)", ""]
    if a["config"].get("backend", "engine") != "engine":
        return L + ["Replay needs the in-process engine: with servers only free-running identity exists."]
    if not rows:
        return L + ["No replay ran (no finished block of cells with more than one arm)."]
    L += [
        f"Each arm ran, untimed, the exact batches {ref} ran in its timed cell (same requests, prompt "
        "chunks and decode rows per step; eager steps with the arm's kernels on), so a divergence is a "
        "property of the kernels, not of timing. Exact arms must be 100% identical."
        + _stop_reference_sentence(a["config"], "replayed, untimed, the batches of"),
        "",
    ]
    replay_rows = []
    for r in rows:
        fd = r["first_divergence"]
        fdt = "-" if fd is None else f"{fd['rep']}, {fd['request']}, {fd['step']}, {fd['token_index']}"
        note = (
            f"**MISMATCH: exact arm must match ({mismatch_cause(a['config'])})**"
            if r["exact_mismatch"]
            else (
                "information: prefixes recomputed in steps of other shapes (the cache verdict is the "
                "row-invariant replay below)"
                if r.get("information")
                else ("exact arm" if r["exact_arm"] else "")
            )
        )
        if r.get("not_exercised"):
            note = f"**{NOT_EXERCISED}**" + (f"; {note}" if note else "")
        if r["skipped"]:
            note += ("; " if note else "") + "; ".join(r["skipped"])
        replay_rows.append([r["cell"], r["arm"], f"{r['identical']} / {r['compared']}", r["reps"], fdt,
                            f"{r['same_schedule_free_running']}/{r['reps'] + len(r['skipped'])}", note])
    L += table(["cell", "arm", "identical / compared", "reps",
                "first divergence (rep, request, step, token)", "free-running batches equal", "note"],
               replay_rows)
    return L + _row_invariant_section(a)


def _row_invariant_section(a: dict[str, Any]) -> list[str]:
    """Prefix cache on vs off with row-invariant prefill: the verdict on the cache's identity."""
    rows = a.get("row_invariant_identity") or []
    cfg = a["config"]
    if not cfg.get("row_invariant_pairs"):
        return []
    ref = cfg.get("replay_reference_arm") or a["ref"]
    L = [
        "",
        "## Prefix cache on vs off under row-invariant replay (the verdict on the cache)",
        "",
        f"Each pair replayed, untimed, one timed schedule of {ref} twice: with the prefix cache on as "
        "recorded, and with it off, each hit prefix recomputed in a step of its own. Both replays ran "
        f"every prefill step in identity mode (row-invariant prefill, {cfg.get('row_invariant_tile')} "
        "tokens per forward): the step's tokens in fixed-size tiles, each token attending as a one-query "
        "row over its own prefix, so every GEMM, norm and attention call has one shape and a token's "
        "K/V do not depend on the step it was computed in. Decode steps are the recorded ones on both "
        "sides. The timed cells do not run this mode; it changes the prefill kernels' shapes only "
        "to take step composition out of the comparison, so that a difference here is the prefix "
        "cache's (or a kernel's), and must be 0. The plain replay above stays as information.",
        "",
    ]
    if not rows:
        return L + ["Not run (no block whose cache-on reference cell finished cleanly)."]
    out = []
    for r in rows:
        fd = r["first_divergence"]
        fdt = "-" if fd is None else f"{fd['request']}, {fd['step']}, {fd['token_index']}"
        note = ("**MISMATCH: cache on and off differ under row-invariant prefill (the prefix cache, or a "
                "kernel that is not row-invariant)**" if r["mismatch"] else "")
        if r["skipped"]:
            note += ("; " if note else "") + "; ".join(r["skipped"])
        secs = "-" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        pair, counts = f"{r['arm_off']} vs {r['arm_on']}", f"{r['identical']} / {r['compared']}"
        out.append([r["cell"], r["rep"], pair, counts, fdt, secs, note])
    return L + table(["cell", "rep", "cache off vs on", "identical / compared",
                      "first divergence (request, step, token)", "seconds (both replays)", "note"], out)


def _cold(a: dict[str, Any]) -> list[str]:
    return _cold_section(a["cells"])


def _cold_section(cells: list[dict[str, Any]]) -> list[str]:
    """Cold work per timed cell: graph captures, compiles and device mallocs inside the window."""
    counted = [c for c in cells if c.get("cold_work")]
    if not counted:
        return []
    L = ["", "## Cold work in timed cells", ""]
    cold = [c for c in counted if c.get("cold")]
    keys = sorted({k for c in counted for k in c["cold_work"]})
    unobserved = [k for k in keys if all(c["cold_work"].get(k) is None for c in counted)]
    if not cold:
        L.append(
            f"None: all {len(counted)} timed cells ran warm ("
            + ", ".join(f"0 {k}" for k in keys if k not in unobserved)
            + (f"; not observable here: {', '.join(unobserved)}" if unobserved else "")
            + ")."
        )
        return L
    def count(v: Any) -> Any:
        return "n/a" if v is None else v

    rows = [[c["cell"], c["arm"], c["rep"], *(count(c["cold_work"].get(k)) for k in keys)] for c in cold]
    return L + table(["cell", "arm", "rep", *keys], rows)


SECTIONS: list[rs.Section] = [
    _header, _notes, _warnings, _run_header, _rate, _throughput, _latency, _replay_section,
    _free_identity, _session_cache, _depth_section, _mode_section, _cold,
    _invalid, _deltas, _definitions,
]
"""The e2e report, top to bottom."""


def _arm_lines(ax: Any, df: pd.DataFrame, arms: list[str], ycol: str, scale: float = 1.0) -> None:
    """One line per arm in run order; A/A arms (torch#2) dashed in their base arm's colour."""
    for arm in arms:
        g = df[df["arm"] == arm].dropna(subset=[ycol])
        if not g.empty:
            ax.plot(
                g["C"],
                g[ycol].astype(float) * scale,
                "o--" if "#" in arm else "o-",
                label=arm,
                color=arm_color(arm),
            )


def _legend(ax: Any) -> None:
    """A legend only where something was drawn (a metric with no samples, e.g. TPOT of 1-token
    outputs, leaves an empty panel; matplotlib would warn on the console)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _c_axis(ax: Any, cs: list[int]) -> None:
    log_axis(ax, cs, "concurrency C")


def plot_caveats(a: dict[str, Any]) -> list[str | None]:
    """What every plot of the run says above itself: no speed verdict (CPU), random weights."""
    no_verdict = a["summary"].get("no_verdict")
    return [no_verdict and f"no speed verdict: {no_verdict}",
            "random weights (text not meaningful)" if a["config"].get("random_weights") else None]


def make_plots(run: RunDir, a: dict[str, Any]) -> None:
    """tok/s vs C per arm, TTFT/TPOT p50 vs C, speedup vs C (bursts only: session has no C axis)."""
    caveats = plot_caveats(a)
    pooled = [p.row() for p in a["pooled"] if isinstance(p.C, int) and p.C > 0]
    if not pooled:
        return
    df = pd.DataFrame(pooled).sort_values("C")
    cs = sorted(df["C"].unique().tolist())
    fig, ax = figure()
    _arm_lines(ax, df, a["arms"], "output_tok_s_median")
    _c_axis(ax, cs)
    ax.set(ylabel="output tok/s", title="Output throughput vs C (median over repetitions)")
    _legend(ax)
    caveat(fig, caveats)
    run.save_plot("throughput.png", fig)
    fig, _ = figure(11, 4.5)
    fig.clf()
    for i, (m, label) in enumerate((("ttft_p50", "TTFT p50 (ms)"), ("tpot_p50", "TPOT p50 (ms)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        _arm_lines(ax, df, a["arms"], m, 1e3)
        _c_axis(ax, cs)
        ax.set(ylabel=label, title=label + " vs C")
        _legend(ax)
    caveat(fig, caveats)
    run.save_plot("latency.png", fig)
    rows = [r for r in a["comparison"] if r["metric"] == "output_tok_s" and r["delta"] is not None]
    comp = pd.DataFrame(rows)
    if comp.empty:
        return
    comp = comp[comp["C"].apply(lambda c: isinstance(c, int) and c > 0)].sort_values("C")
    fig, ax = figure()
    for arm in a["arms"]:
        g = comp[comp["arm"] == arm]
        if g.empty:
            continue
        lo = g["ci_lo"].fillna(g["delta"]).astype(float)
        hi = g["ci_hi"].fillna(g["delta"]).astype(float)
        ax.errorbar(
            g["C"],
            1 + g["delta"],
            yerr=[g["delta"] - lo, hi - g["delta"]],
            fmt="o--" if "#" in arm else "o-",
            capsize=3,
            label=arm,
            color=arm_color(arm),
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    _c_axis(ax, cs)
    ax.set(ylabel=f"speedup vs {a['ref']} (output tok/s)", title="Speedup vs C (bars: interval)")
    _legend(ax)
    caveat(fig, caveats)
    run.save_plot("speedup.png", fig)


def render(run_dir: str | Path) -> dict[str, Any]:
    """Recompute everything from the raw files and (re)write tables, summary, table.md and plots."""
    run = RunDir.open(run_dir)
    a = analyse(run)
    if a["cells"]:
        run.write_table("cells", pd.DataFrame(a["cells"]))
    if a["identity"]:
        run.write_table("identity", pd.DataFrame(a["identity"]))
    if a["replay_identity"]:
        run.write_table("replay_identity", pd.DataFrame(a["replay_identity"]))
    if a["comparison"]:
        run.write_table("comparison", pd.DataFrame(a["comparison"]))
    if a["mode_comparison"]:
        run.write_table("mode_comparison", pd.DataFrame(a["mode_comparison"]))
    if a.get("rate_cells"):
        run.write_table("rate_cells", pd.DataFrame(a["rate_cells"]))
    run.write_json("summary.json", a["summary"])
    run.write_markdown("table.md", table_markdown(a))
    if a["config"].get("workload") == "rate":
        make_rate_plots(run, a, plot_caveats(a))
    else:
        make_plots(run, a)
    return a
