"""The rate workload's part of the e2e report, from the raw files only: per cell the open-loop figures
(rltbench.results.rate) and the SLO share (rltbench.results.slo), per arm and rate those pooled over
repetitions, per arm the SLO capacity with its interval and its ratio to the reference beside the A/A
arm's, the headline, and three plots: TTFT and TPOT p50/p90/p99 against the achieved rate, goodput
against the offered rate, and tokens/s per user against tokens/s in total.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from rltbench.results import RunDir
from rltbench.results.plotting import arm_color, caveat, figure
from rltbench.results.rate import measured_records, rate_figures, saturation
from rltbench.results.serving import fmt_ms, percentiles, request_metrics
from rltbench.results.slo import AT_LEAST, BELOW, SATURATED, arm_capacities, cell_slo, headlines, parse_slo
from rltbench.results.tables import table

POOLED_MEDIANS = ("arrival_s", "offered_rate", "sent_rate", "achieved_rate", "queue_delay_p90", "slo_share",
                  "goodput", "window_tok_s", "tok_s_per_user")


def analyse_rate(cfg: dict[str, Any], records: list[dict[str, Any]], meta: list[dict[str, Any]],
                 arms: list[str], ref: str) -> dict[str, Any]:
    """The rate figures of a run: `rate_cells` (one row per arm, rate and repetition), `rate_pooled`
    (per arm and rate), `slo_capacity` and `slo_headlines` (with --slo)."""
    rs = cfg.get("rate") or {}
    head, tail = float(rs.get("exclude_head", 0.1)), float(rs.get("exclude_tail", 0.1))
    terms = parse_slo(rs["slo"], float(rs.get("attainment", 0.9))) if rs.get("slo") else ()
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["arm"], r["cell"], r["rep"])].append(r)
    cells, measured = [], {}
    for m in meta:
        key = (m["arm"], m["cell"], m["rep"])
        if m.get("rate") is None or m.get("interrupted") or not groups.get(key):
            continue
        recs = groups[key]
        fig = rate_figures(recs, head, tail)
        fig["saturated"] = saturation(fig, float(rs.get("saturation_margin", 0.1)))
        measured[key] = measured_records(recs, head, tail)
        row = {"arm": m["arm"], "cell": m["cell"], "rep": m["rep"], "rate": m["rate"], **fig,
               **cell_slo(measured[key], terms)}
        if terms and row["achieved_rate"] is not None:
            row["goodput"] = row["achieved_rate"] * row["slo_share"]
        cells.append(row)
    capacity = arm_capacities(cells, ref, arms) if terms else []
    return {"rate_cells": cells, "rate_pooled": _pooled(cells, measured, arms), "slo_capacity": capacity,
            "slo_headlines": headlines(capacity, terms) if terms else [],
            "slo_label": ", ".join(t.label for t in terms)}


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _pooled(cells: list[dict[str, Any]], measured: dict[tuple, list[dict[str, Any]]],
            arms: list[str]) -> list[dict[str, Any]]:
    """Per arm and rate: medians over repetitions of the cell figures, latency quantiles over the
    measured requests of every repetition, and how many repetitions saturated."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        by[(c["arm"], c["cell"])].append(c)
    out = []
    for (arm, cell), rows in sorted(by.items(), key=lambda kv: (arms.index(kv[0][0]) if kv[0][0] in arms
                                                                 else len(arms), kv[1][0]["rate"])):
        per = [request_metrics(r) for c in rows for r in measured[(arm, cell, c["rep"])]
               if r.get("status") == "ok"]
        row: dict[str, Any] = {"arm": arm, "cell": cell, "rate": rows[0]["rate"], "reps": len(rows),
                               "saturated_reps": sum(bool(c["saturated"]) for c in rows)}
        row.update({k: _median([c.get(k) for c in rows]) for k in POOLED_MEDIANS})
        for name in ("ttft", "tpot"):
            row.update({f"{name}_{k}": v for k, v in percentiles([p[name] for p in per]).items()})
        out.append(row)
    return out


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def rate_section(a: dict[str, Any]) -> list[str]:
    """The markdown of the rate figures: headline, sweep, per-rate table, SLO capacity."""
    cfg, pooled = a["config"], a.get("rate_pooled") or []
    rs = cfg.get("rate") or {}
    L = [f"## Open-loop rates ({rs.get('arrivals', '?')} arrivals; the first {rs.get('exclude_head', 0):.0%} "
         f"and last {rs.get('exclude_tail', 0):.0%} of each cell's requests left out)", ""]
    L += [f"**{line}**" for line in a.get("slo_headlines") or []]
    L += [""] if a.get("slo_headlines") else []
    L += _sweep_lines(a.get("sweep") or {})
    slo = bool(a.get("slo_label"))
    rows = []
    for p in pooled:
        sat = f"{p['saturated_reps']}/{p['reps']}" if p["saturated_reps"] else "-"
        rows.append([p["cell"], p["arm"], p["reps"], _rate(p["arrival_s"]), _rate(p["offered_rate"]),
                     _rate(p["sent_rate"]),
                     _rate(p["achieved_rate"]), fmt_ms(p["queue_delay_p90"]),
                     " / ".join(fmt_ms(p[f"ttft_{q}"]) for q in ("p50", "p90", "p99")),
                     " / ".join(fmt_ms(p[f"tpot_{q}"]) for q in ("p50", "p90", "p99")),
                     *([_pct(p["slo_share"]), _rate(p["goodput"])] if slo else []),
                     _rate(p["window_tok_s"]), _rate(p["tok_s_per_user"]), sat])
    head = ["rate (target)", "arm", "reps", "arrivals s", "offered/s", "sent/s", "achieved/s",
            "queue delay p90 ms",
            "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", *(["SLO share", "goodput/s"] if slo else []),
            "tok/s", "tok/s per user", "saturated reps"]
    L += ["Medians over repetitions; latency quantiles pooled over the measured requests of every "
          "repetition. The tables above pool every request of a cell. arrivals s: the span of the measured "
          "requests' arrivals; achieved/s: measured requests finished ok - 1 over the longer of that span "
          "and the span of their finishes (never above offered/s; below it where the server fell "
          "behind).", "", *table(head, rows)]
    return L + _capacity_lines(a)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """What the sweep decided: the probes, the rates, which arm saturated where, why it stopped."""
    L = []
    probes = sweep.get("probes") or {}
    if probes:
        L.append("- probes (not measurements): " + ", ".join(
            f"{name} {_rate(p.get('rate'))} requests/s ({p.get('requests')} requests"
            + (f", request latency {p['latency_s']:.3g} s" if p.get("latency_s") else "") + ")"
            for name, p in probes.items()))
        if sweep.get("top_factor"):
            L.append(f"- rates: in even ratios above the synchronous rate up to {sweep['top_factor']:g}x the "
                     "fastest arm's saturated probe (a burst understates what an open loop sustains)")
    if sweep.get("cell_s"):
        L.append(f"- cells: {sweep['cell_s']:.3g} s of arrivals each ({sweep.get('cell_why')}), so that a "
                 "queue can build where a rate exceeds what the server holds")
    for arm, s in (sweep.get("saturated") or {}).items():
        L.append(f"- {arm} saturated at {s['rate']:g}/s in {s['reps']} repetitions ({s['reason']}): "
                 "no higher rate")
    if sweep.get("stopped"):
        L.append(f"- stopped: {sweep['stopped']}")
    return L + [""] if L else L


def _capacity_lines(a: dict[str, Any]) -> list[str]:
    rows = a.get("slo_capacity") or []
    if not a.get("slo_label"):
        return ["", "No SLO given (--slo ttft:500,tpot:50): no SLO share, goodput or capacity."]
    L = ["", f"## SLO capacity at {a['slo_label']} (highest rate meeting every term, interpolated)", ""]
    out = []
    for r in rows:
        iv = "-" if r["lo"] is None else f"{r['lo']:.3g}-{r['hi']:.3g} ({r['coverage']:.0%})"
        per = ", ".join("<lowest" if v is None else f"{v:.3g}" for v in r["per_rep"].values())
        ratio = "(ref)" if r["arm"] == r["ref"] else _ratio(r)
        how = ", ".join(r["bounds"]) + ("" if r["monotone"] else "; not monotone")
        out.append([r["arm"], _rate(r["capacity"]), iv, per, how, ratio + (" (A/A)" if r["aa"] else "")])
    L += table(["arm", "capacity req/s", "interval (coverage)", "per repetition", "found as",
                f"ratio to {a['ref']} (interval)"], out)
    return L + ["", "Found as: interpolated (between the last rate meeting the SLO and the next); "
                f"{AT_LEAST} (every measured rate met it: a lower bound); "
                f"{SATURATED} (half-way between the last rate meeting it and the next, which met the latency "
                f"shares but saturated: a building queue breaks any target given time); {BELOW} (no "
                "measured rate met "
                "it). The interval is the order-statistic interval of the median over repetitions (its "
                "coverage below 95% with few repetitions); the ratio pairs repetitions (the arms ran "
                "side by side). A ratio whose interval reaches the A/A arm's is within noise."]


def _ratio(r: dict[str, Any]) -> str:
    iv = r.get("ratio")
    if iv:
        return f"{iv['estimate']:.3f}x ({iv['lo']:.3f}-{iv['hi']:.3f})"
    return "-" if r.get("ratio_estimate") is None else f"{r['ratio_estimate']:.3f}x (one repetition)"


def make_rate_plots(run: RunDir, a: dict[str, Any], caveats: list[str | None]) -> None:
    """latency_vs_rate.png, goodput.png (with --slo), pareto.png."""
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in a.get("rate_pooled") or []:
        by_arm[p["arm"]].append(p)
    if not by_arm:
        return
    fig, axes = figure(12, 4.5, 1, 2)
    for ax, (name, label) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT")), strict=True):
        for arm, rows in by_arm.items():
            pts = [p for p in rows if p["achieved_rate"] is not None]
            for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
                ys = [p[f"{name}_{q}"] for p in pts]
                if any(y is not None for y in ys):
                    ax.plot([p["achieved_rate"] for p in pts], [None if y is None else y * 1e3 for y in ys],
                            style, color=arm_color(arm), label=f"{arm} {q}", alpha=0.6 if "#" in arm else 1)
        ax.set(xlabel="achieved rate (requests/s)", ylabel=f"{label} (ms)", title=f"{label} vs achieved rate")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    caveat(fig, caveats)
    run.save_plot("latency_vs_rate.png", fig)
    if a.get("slo_label"):
        fig, ax = figure()
        top = max(p["rate"] for rows in by_arm.values() for p in rows)
        ax.plot([0, top], [0, top], color="gray", lw=0.8, label="offered")
        for arm, rows in by_arm.items():
            ax.plot([p["rate"] for p in rows], [p["goodput"] for p in rows], "o--" if "#" in arm else "o-",
                    color=arm_color(arm), label=arm)
        ax.set(xlabel="target rate (requests/s)", ylabel="goodput (requests/s meeting the SLO)",
               title=f"Goodput at {a['slo_label']}")
        ax.legend()
        caveat(fig, caveats)
        run.save_plot("goodput.png", fig)
    fig, ax = figure()
    for arm, rows in by_arm.items():
        pts = [p for p in rows if p["tok_s_per_user"] and p["window_tok_s"]]
        ax.plot([p["tok_s_per_user"] for p in pts], [p["window_tok_s"] for p in pts],
                "o--" if "#" in arm else "o-", color=arm_color(arm), label=arm)
        for p in pts:
            ax.annotate(p["cell"], (p["tok_s_per_user"], p["window_tok_s"]), fontsize=6)
    ax.set(xlabel="tokens/s per user (median 1 / TPOT)", ylabel="tokens/s in total",
           title="Throughput against interactivity (one point per rate)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    caveat(fig, caveats)
    run.save_plot("pareto.png", fig)
