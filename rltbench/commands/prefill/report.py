"""table.md and prefill.png of a `rltbench prefill` run from its raw files only (requests.jsonl,
cell_meta.jsonl, manifest): per model and prompt length the TTFT and prefill step time of each policy,
the packed policy's speedup paired by repetition beside the A/A spread, and token identity."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from rltbench.engine.schedule import first_divergence
from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.plotting import caveat, figure
from rltbench.results.serving import compute_cells, fmt_ms
from rltbench.results.serving_stats import no_verdict_caption
from rltbench.results.stats import format_interval, noise_label, paired_ratio_interval
from rltbench.results.tables import table

PACKED, ONE, PACKED_AA = "packed", "one-per-step", "packed#2"
STUDY_FIGURE = "2.0-2.4x (automatic packed prefill, Huginn included, 2048-token prompts)"
METRICS = (("ttft_p50", "TTFT p50"), ("ttft_p90", "TTFT p90"), ("prefill_s", "prefill phase"))


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _cells(run: RunDir) -> list[dict[str, Any]]:
    """compute_cells rows with the prefill facts of cell_meta.jsonl and the prefill phase (first send
    to the last first token: every prompt's prefill is done)."""
    recs, meta = run.read_jsonl("requests.jsonl"), run.read_jsonl("cell_meta.jsonl")
    cells = compute_cells(recs, meta)
    extra = {(m["arm"], m["cell"], m["rep"]): m for m in meta}
    phase: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        phase[(r["arm"], r["cell"], r["rep"])].append(r)
    for c in cells:
        key = (c["arm"], c["cell"], c["rep"])
        m, rs = extra.get(key, {}), phase.get(key, [])
        steps = m.get("prefill_step_s") or []
        firsts = [r["first"] for r in rs if r.get("first") is not None]
        done = bool(rs) and len(firsts) == len(rs)
        c.update(model=m.get("model"), input_len=m.get("input_len"), prefill_steps=len(steps) or None,
                 prefill_step_p50=_median(steps), prefill_rows_max=max(m.get("prefill_rows") or [0]) or None,
                 prefill_s=(max(firsts) - min(r["send"] for r in rs)) if done else None)
    return cells


def _identity(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and other policy: requests whose tokens equal the packed policy's of the same
    repetition (same prompts, same arm), with the first divergent token of the rest."""
    tokens: dict[tuple, dict[int, list[int]]] = defaultdict(dict)
    for r in recs:
        tokens[(r["arm"], r["cell"], r["rep"])][r["request"]] = r.get("token_ids") or []
    out: dict[tuple, dict[str, Any]] = {}
    for (arm, cell, rep), toks in tokens.items():
        ref = tokens.get((PACKED, cell, rep))
        if arm == PACKED or ref is None:
            continue
        row = out.setdefault((arm, cell), {"policy": arm, "cell": cell, "identical": 0, "compared": 0,
                                           "first_divergences": []})
        for i, want in ref.items():
            d = first_divergence(toks.get(i, []), want)
            row["compared"] += 1
            row["identical"] += d is None
            if d is not None:
                row["first_divergences"].append(d)
    return list(out.values())


def comparison(cells: list[dict[str, Any]], cpu: bool) -> list[dict[str, Any]]:
    """Per (cell, metric): one-per-step / packed paired by repetition (the packed speedup) and the A/A
    ratio packed#2 / packed; a verdict only off the CPU and outside the A/A band."""
    by = {(c["arm"], c["cell"], c["rep"]): c for c in cells if c.get("valid")}
    reps = sorted({c["rep"] for c in cells})
    out = []
    for cell in dict.fromkeys(c["cell"] for c in cells):
        for key, name in METRICS:
            def series(arm: str, _cell: str = cell, _key: str = key) -> list[float]:
                got = [by.get((arm, _cell, r), {}).get(_key) for r in reps]
                return [float(v) if v else float("nan") for v in got]
            packed = series(PACKED)
            ratio = paired_ratio_interval(series(ONE), packed)
            aa = paired_ratio_interval(series(PACKED_AA), packed)
            ones, pk = [v for v in series(ONE) if v == v], [v for v in packed if v == v]
            # the paired median where there are >= 2 pairs, else the ratio of the medians
            point = (ratio.estimate if ratio else
                     statistics.median(ones) / statistics.median(pk) if ones and pk else None)
            verdict = ("no verdict: CPU timings mean nothing" if cpu
                       else noise_label(ratio, aa, "packed faster", "packed slower"))
            out.append({"cell": cell, "metric": name, "speedup_of_packed": point,
                        "interval": ratio.to_dict() if ratio else None, "aa": aa.to_dict() if aa else None,
                        "verdict": verdict})
    return out


class PrefillReport(NamedTuple):
    """What table.md is rendered from: configuration, cells, the paired comparison, token identity."""

    config: dict[str, Any]
    cells: list[dict[str, Any]]
    comparison: list[dict[str, Any]]
    identity: list[dict[str, Any]]


def _intro(r: PrefillReport) -> list[str]:
    cfg = r.config
    lines = [
        *rs.title("Long-prompt prefill: packed against one request per step"),
        f"Bursts of C={cfg.get('concurrency')} prompts (random ids) per length, {cfg.get('output_len')} "
        f"generated tokens each, arm {cfg.get('arm')}, Huginn KV layout {cfg.get('kv_layout')}, token budget "
        f"{cfg.get('max_num_batched_tokens')} per step, {cfg.get('repeats')} repetitions. Policies: packed "
        "(the engine's default: a step packs prompts, and chunks, up to the token budget), one-per-step "
        "(max_prefill_seqs=1: one request per prefill step, the same budget), packed#2 (packed again: "
        "the A/A arm). Order per repetition A B A', then A' B A; every timed cell warm (frozen engine, "
        "cold work counted).",
        "",
        f"Study's figure (reference, not measured here): {STUDY_FIGURE}.",
        "",
    ]
    if str(cfg.get("device", "")).startswith("cpu"):
        lines += ["CPU run: timings mean nothing here (Triton interpreter, no GPU): no verdict.", ""]
    return lines + rs.notes(cfg.get("notes") or [])


def _policies(r: PrefillReport) -> list[str]:
    """One row per cell and policy: steps, prefill step and phase, TTFT, medians over repetitions."""
    header = ["cell", "policy", "steps (max rows)", "prefill step p50 ms", "prefill phase ms", "TTFT p50 ms",
              "TTFT p90 ms", "valid", "warm"]
    body = []
    for cell in dict.fromkeys(c["cell"] for c in r.cells):
        for arm in (PACKED, ONE, PACKED_AA):
            mine = [c for c in r.cells if c["cell"] == cell and c["arm"] == arm]
            if not mine:
                continue
            body.append([
                cell, arm,
                f"{_median([c.get('prefill_steps') for c in mine])} ({mine[0].get('prefill_rows_max')})",
                fmt_ms(_median([c.get("prefill_step_p50") for c in mine])),
                fmt_ms(_median([c.get("prefill_s") for c in mine])),
                fmt_ms(_median([c.get("ttft_p50") for c in mine])),
                fmt_ms(_median([c.get("ttft_p90") for c in mine])),
                "yes" if all(c.get("valid") for c in mine) else "NO",
                "warm" if not any(c.get("cold") for c in mine) else "COLD",
            ])
    align = ["", "", "r", "r", "r", "r", "r", "", ""]
    return ["Medians over repetitions.", "", *table(header, body, align), ""]


def _speedup(r: PrefillReport) -> list[str]:
    rows = [[c["cell"], c["metric"],
             "-" if c["speedup_of_packed"] is None else f"{c['speedup_of_packed']:.2f}x",
             format_interval(c["interval"]), format_interval(c["aa"]), c["verdict"]] for c in r.comparison]
    return ["## Speedup of packed prefill (one-per-step / packed, paired by repetition)", "",
            *table(["cell", "metric", "speedup", "interval", "A/A (packed#2 / packed)", "verdict"], rows,
                   ["", "", "r", "", "", ""])]


def _identity_table(r: PrefillReport) -> list[str]:
    rows = [[i["cell"], i["policy"], f"{i['identical']}/{i['compared']}",
             ", ".join(str(d) for d in sorted(set(i["first_divergences"]))[:8]) or "-"] for i in r.identity]
    return [*rs.heading("Token identity against the packed policy (same arm, same prompts)"),
            *table(["cell", "policy", "identical", "first divergent token index"], rows),
            "", "A packed step runs the GEMMs over more rows than a one-request step; where a kernel picks "
            "another tiling for that shape the bits may differ, so a difference here is reported, not "
            "hidden; the A/A row shows whether the packed policy repeats itself.", ""]


SECTIONS: list[rs.Section] = [_intro, _policies, _speedup, _identity_table]
"""The prefill report, top to bottom."""


def table_markdown(run: RunDir, cells: list[dict[str, Any]], comp: list[dict[str, Any]],
                   ident: list[dict[str, Any]]) -> str:
    return rs.render_sections(SECTIONS, PrefillReport(run.manifest.get("config", {}), cells, comp, ident))


def make_plot(run: RunDir, cells: list[dict[str, Any]]) -> None:
    """prefill.png: `ttft_figure`, when some cell finished."""
    fig = ttft_figure(cells, run.manifest.get("config", {}))
    if fig is not None:
        run.save_plot("prefill.png", fig)


def ttft_figure(cells: list[dict[str, Any]], cfg: dict[str, Any]) -> Any:
    """TTFT p50 (median over repetitions) per cell and policy; a CPU run's figure says its times carry
    no speed verdict. None without cells."""
    names = list(dict.fromkeys(c["cell"] for c in cells))
    if not names:
        return None
    fig, ax = figure(8.0, 4.0)
    width = 0.27
    for k, (arm, color) in enumerate(((PACKED, "#55A868"), (ONE, "#C44E52"), (PACKED_AA, "#8FD19E"))):
        vals = [_median([c.get("ttft_p50") for c in cells if c["cell"] == n and c["arm"] == arm])
                for n in names]
        ax.bar([i + (k - 1) * width for i in range(len(names))], [1e3 * (v or 0) for v in vals], width,
               label=arm, color=color)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("TTFT p50 (ms)")
    ax.legend(fontsize=8)
    ax.set_title("Long-prompt burst: TTFT by prefill policy", fontsize=9)
    caveat(fig, [no_verdict_caption(cfg)])
    return fig


def render(run_dir: str | Path) -> dict[str, Any]:
    """Recompute everything from the raw files and (re)write cells, comparison, identity, table.md, plot."""
    run = RunDir.open(run_dir)
    cells = _cells(run)
    cpu = str(run.manifest.get("config", {}).get("device", "")).startswith("cpu")
    comp = comparison(cells, cpu)
    ident = _identity(run.read_jsonl("requests.jsonl"))
    if cells:
        run.write_table("cells", pd.DataFrame(cells))
    run.write_json("comparison.json", comp)
    run.write_json("identity.json", ident)
    run.write_markdown("table.md", table_markdown(run, cells, comp, ident))
    make_plot(run, cells)
    return {"cells": cells, "comparison": comp, "identity": ident}
