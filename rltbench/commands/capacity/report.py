"""table.md and capacity.png of a `rltbench capacity` run, from its raw files only (capacity.json,
requests.jsonl, cell_meta.jsonl, manifest), so `rltbench report DIR` re-renders the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.plotting import figure
from rltbench.results.serving import compute_cells, fmt_ms
from rltbench.results.tables import table

STUDY_FIGURE = "1.88x Huginn KV capacity from packing the recurrent depth planes, bitwise"
KIB = 1024


def _fmt(v: Any, spec: str = ",") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


def _burst_text(cells: list[dict[str, Any]], row: dict[str, Any]) -> list[str]:
    """The measured burst of one engine row: C, validity, max decode batch, tok/s, TTFT, warmth."""
    label = f"{row['model']} / {row['layout']}"
    mine = [c for c in cells if c["arm"] == label]
    if not mine:
        return ["not run"] * 6
    c = mine[0]
    ok = all(x.get("valid") for x in mine)
    warm = not any(x.get("cold") for x in mine)
    batches = [x.get("max_decode_batch") for x in mine if x.get("max_decode_batch") is not None]
    tok_s = [x["output_tok_s"] for x in mine if x.get("output_tok_s")]
    return [
        f"{c['C']}",
        "all ok" if ok else "INVALID",
        f"{min(batches)}" if batches else "-",
        f"{sorted(tok_s)[len(tok_s) // 2]:,.0f}" if tok_s else "-",
        fmt_ms(c.get("ttft_p50")),
        "warm" if warm else "COLD",
    ]


class CapacityReport(NamedTuple):
    """What table.md is rendered from: the run's configuration, the capacity rows, the burst cells."""

    config: dict[str, Any]
    rows: list[dict[str, Any]]
    cells: list[dict[str, Any]]


def _intro(r: CapacityReport) -> list[str]:
    cfg, first = r.config, (r.rows[0] if r.rows else {})
    return [
        *rs.title("KV capacity per model and layout"),
        f"Requests of {first.get('input_len')} prompt + {first.get('output_len')} generated tokens, KV "
        f"blocks of {cfg.get('block_size')} tokens, dtype {first.get('dtype')}. Every request reserves all "
        "of its blocks at admission (the engine never preempts), so 'max C' is whole requests. "
        "Predictions use the engine's own sizing (rltbench.engine.kv_capacity); the measured burst "
        "checks them on the engine.",
        "",
        f"Study's figure (reference, not measured here): {STUDY_FIGURE}. The 'per-application' rows are "
        "the unpacked baseline, derived: one KV plane per layer application. The engine's Huginn 'full' "
        "layout already allocates exactly that (132 planes at r=32), so full/baseline is 1.00x by "
        "construction; 'compress' keeps one plane per physical layer and is NOT bitwise equal to full "
        "(decode reads the last iteration's K/V of earlier tokens).",
        "",
    ]


def _capacity(r: CapacityReport) -> list[str]:
    """One row per model and layout: planes, bytes per token, pool, max C, and the measured burst."""
    header = ["model", "layout", "kind", "planes", "KiB/token (per plane)", "budget GiB", "pool tokens",
              "blocks/request", "max C", "C vs baseline", "burst C", "requests", "max decode batch",
              "output tok/s", "TTFT p50 ms", "timed window"]
    body = []
    for row in r.rows:
        measured = _burst_text(r.cells, row) if row["kind"] == "engine" else ["(derived)"] + ["-"] * 5
        body.append([
            row["model"], row["layout"], row["kind"], row["planes"],
            f"{row['bytes_per_token'] / KIB:,.1f} ({row['bytes_per_token_plane'] / KIB:,.2f})",
            f"{row['budget_gib']:,.4g}", _fmt(row["pool_tokens"]), row["blocks_per_seq"],
            _fmt(row["max_seqs"]),
            "-" if row.get("seqs_vs_baseline") is None else f"{row['seqs_vs_baseline']:.2f}x",
            *measured,
        ])
    return [*table(header, body, ["", "", "", "r", "r", "r", "r", "r", "r", "r", "r", "", "r", "r", "r", ""]),
            "", "Budget per model: " + "; ".join(
                dict.fromkeys(f"{row['model']}: {row['budget_source']}" for row in r.rows)), ""]


def _burst(r: CapacityReport) -> list[str]:
    cfg = r.config
    if not cfg.get("burst"):
        return ["No burst was run (pass --burst): the rows are predictions only.", ""]
    lines = [
        "Burst: C = the row's max C requests at once, random token ids, arm "
        f"{cfg.get('arm')}, {cfg.get('repeats')} timed repetition(s) after a warm-up; 'max decode batch' "
        "is the largest decode step of the timed cell (C when the engine held every request at "
        "once). Layouts compute different things (compress is not bitwise), so throughput across "
        "layouts is information, not a verdict.",
        "",
    ]
    if str(cfg.get("device", "")).startswith("cpu"):
        lines += ["CPU run: timings mean nothing here (no verdict); the admission figures hold.", ""]
    return lines


def _random_weights(r: CapacityReport) -> list[str]:
    if not r.config.get("random_weights"):
        return []
    return ["Random weights: capacity does not depend on them; generated text is meaningless.", ""]


def _notes(r: CapacityReport) -> list[str]:
    """What the command chose for the user (e.g. request lengths shrunk to a tiny preset's context)."""
    return rs.notes(r.config.get("notes") or [])


def _definitions(r: CapacityReport) -> list[str]:
    return rs.metric_definitions()


SECTIONS: list[rs.Section] = [_intro, _capacity, _burst, _random_weights, _notes, _definitions]
"""The capacity report, top to bottom."""


def table_markdown(run: RunDir, rows: list[dict[str, Any]], cells: list[dict[str, Any]]) -> str:
    return rs.render_sections(SECTIONS, CapacityReport(run.manifest.get("config", {}), rows, cells))


def make_plot(run: RunDir, rows: list[dict[str, Any]]) -> None:
    """Max concurrent requests per (model, layout), log scale, baseline rows hatched."""
    if not rows:
        return
    fig, ax = figure(8.0, 4.0)
    labels = [f"{r['model']}\n{r['layout']}" for r in rows]
    values = [max(r["max_seqs"], 0.5) for r in rows]
    bars = ax.bar(range(len(rows)), values, color=["#55A868" if r["kind"] == "engine" else "#BBBBBB"
                                                  for r in rows])
    for bar, r in zip(bars, rows, strict=True):
        if r["kind"] != "engine":
            bar.set_hatch("//")
        ax.annotate(f"{r['max_seqs']:,}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("max concurrent requests")
    first = rows[0]
    ax.set_title(f"KV capacity at {first['input_len']}+{first['output_len']} tokens "
                 "(grey hatched: per-application baseline, derived)", fontsize=9)
    run.save_plot("capacity.png", fig)


def render(run_dir: str | Path) -> dict[str, Any]:
    """Recompute the cells from the raw files and (re)write cells.csv/json, table.md and the plot."""
    run = RunDir.open(run_dir)
    rows = run.read_json("capacity.json")
    meta = run.read_jsonl("cell_meta.jsonl")
    cells = compute_cells(run.read_jsonl("requests.jsonl"), meta)
    extra = {(m["arm"], m["rep"]): m for m in meta}
    for c in cells:  # the engine facts of each burst, beside its serving metrics
        m = extra.get((c["arm"], c["rep"]), {})
        keys = ("max_decode_batch", "predicted_num_blocks", "engine_num_blocks")
        c.update({k: m[k] for k in keys if k in m})
    if cells:
        run.write_table("cells", pd.DataFrame(cells))
    run.write_markdown("table.md", table_markdown(run, rows, cells))
    make_plot(run, rows)
    return {"rows": rows, "cells": cells}
