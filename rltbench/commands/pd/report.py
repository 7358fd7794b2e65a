"""Analysis and rendering of a pd run from its raw files only (requests.jsonl, cell_meta.jsonl,
replay.jsonl, link_probe.json, manifest): what `rltbench report DIR` re-runs.

Per concurrency: KV bytes moved per request and per prompt token, the transfer's share of TTFT and
its parts, TTFT and TPOT of pd against the colocated engine (paired deltas with the A/A spread of the
colocated engine run twice), token identity (the verdict: the colocated engine replaying the pd
cell's batches; free-running colocated tokens for information), and the idle-link probe.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.plotting import caveat, figure, log_axis
from rltbench.results.serving import compute_cells, fmt_ms, percentiles, request_metrics
from rltbench.results.serving_stats import (
    INTERVAL_METHOD,
    REPLAY_FILE,
    delta_table,
    identity,
    no_verdict_caption,
    no_verdict_reason,
    paired_deltas,
    replay_identity,
)
from rltbench.results.tables import table

REF, PD = "colocated", "pd"
# (name, start, end) of the parts of a pd request's TTFT, from its `pd` timestamps
PARTS = (
    ("prefill", "send", "prefill_first"),
    ("link_wait", "prefill_first", "header_sent"),
    ("handshake", "header_sent", "accepted"),
    ("payload", "accepted", "imported"),
    ("transfer", "prefill_first", "imported"),
)
TRANSFER_NOTES = """\
- bytes: whole KV blocks of the prompt in every plane (K and V), the payload of one message per
  request (plus a 16-byte trailer); per prompt token = bytes / prompt length (the last block may be
  partly filled).
- prefill: request sent -> first token sampled on the prefill engine (queueing and prefill compute).
- link_wait: -> header sent (waiting for the transfer budget); handshake: -> decode side accepted
  (header, room promised, receive posted, reply); payload: -> imported into the decode engine
  (pack, wire, unpack, import). transfer = link_wait + handshake + payload; TTFT (pd) = prefill +
  transfer: the first token reaches the client from the decode engine.
- Each side notices a completion between its engine steps, so the parts carry up to one step of
  polling delay; the idle-link probe below times pack, wire and unpack alone.
- Times of both ranks come from one host's monotonic clock (both processes run on one machine)."""


def _part_seconds(rec: dict[str, Any]) -> dict[str, float | None]:
    t = dict(rec.get("pd") or {}, send=rec.get("send"))
    return {
        name: (t[b] - t[a] if t.get(a) is not None and t.get(b) is not None else None) for name, a, b in PARTS
    }


def transfer_rows(records: list[dict[str, Any]], valid: set[tuple]) -> list[dict[str, Any]]:
    """One row per pd cell (concurrency): bytes, messages and the TTFT parts over valid repetitions."""
    by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["arm"] == PD and (r["arm"], r["cell"], r["rep"]) in valid:
            by_cell[r["cell"]].append(r)
    rows = []
    for cell, recs in by_cell.items():
        parts = [_part_seconds(r) for r in recs]
        ttft = [request_metrics(r)["ttft"] for r in recs]
        share = [
            p["transfer"] / t for p, t in zip(parts, ttft, strict=True) if p["transfer"] is not None and t
        ]
        nbytes = [int(r["pd"]["bytes"]) for r in recs if r.get("pd", {}).get("bytes")]
        per_tok = [int(r["pd"]["bytes"]) / r["prompt_len"] for r in recs if r.get("pd", {}).get("bytes")]
        msgs = [int(r["pd"].get("payload_messages", 0)) for r in recs]
        row: dict[str, Any] = {
            "cell": cell,
            "C": recs[0]["C"],
            "requests": len(recs),
            "bytes_per_request": float(np.median(nbytes)) if nbytes else None,
            "bytes_per_prompt_token": float(np.median(per_tok)) if per_tok else None,
            "payload_messages_per_request": max(msgs) if msgs else None,
            "transfer_share_of_ttft_p50": float(np.median(share)) if share else None,
        }
        for name, _a, _b in PARTS:
            pc = percentiles([p[name] for p in parts])
            row.update({f"{name}_p50": pc["p50"], f"{name}_p90": pc["p90"], f"{name}_n": pc["n"]})
        pc = percentiles(ttft)
        row.update(ttft_p50=pc["p50"], ttft_p90=pc["p90"])
        rows.append(row)
    return sorted(rows, key=lambda r: r["C"])


def latency_rows(records: list[dict[str, Any]], valid: set[tuple], modes: list[str]) -> list[dict[str, Any]]:
    """TTFT / TPOT percentiles per (mode, cell), pooled over valid repetitions."""
    rows = []
    cells = sorted({(r["cell"], r["C"]) for r in records}, key=lambda x: x[1])
    for cell, c in cells:
        for mode in modes:
            recs = [
                r
                for r in records
                if r["arm"] == mode and r["cell"] == cell and (mode, cell, r["rep"]) in valid
            ]
            if not recs:
                continue
            per = [request_metrics(r) for r in recs]
            row = {"cell": cell, "C": c, "mode": mode}
            for m in ("ttft", "tpot", "e2e"):
                pc = percentiles([p[m] for p in per])
                row.update({f"{m}_{k}": pc[k] for k in ("p50", "p90", "n")})
            rows.append(row)
    return rows


def analyse(run: RunDir) -> dict[str, Any]:
    cfg = run.manifest.get("config", {})
    records = run.read_jsonl("requests.jsonl")
    meta = run.read_jsonl("cell_meta.jsonl")
    modes = [
        m
        for m in ([REF, PD, f"{REF}#2"] if cfg.get("aa", True) else [REF, PD])
        if any(r["arm"] == m for r in records)
    ] or [REF, PD]
    cells = compute_cells(records, meta)
    valid = {(c["arm"], c["cell"], c["rep"]) for c in cells if c["valid"]}
    exact = {PD} if cfg.get("exact_arm") else set()
    no_verdict = no_verdict_reason(cfg)
    comparison = (
        paired_deltas(records, cells, REF, seed=int(cfg.get("seed") or 0), no_verdict=no_verdict)
        if any(r["arm"] == REF for r in records)
        else []
    )
    comparison = [r for r in comparison if r["metric"] in ("ttft", "tpot", "e2e")]
    free = identity(records, REF, exact, batches_deterministic=False)
    for r in free:  # pd batches differ from colocated ones by design: information, not a verdict
        r["exact_mismatch"] = r["exact_unverified"] = False
    replays = replay_identity(run.read_jsonl(REPLAY_FILE), exact)
    probe = run.read_json("link_probe.json") if (run.path / "link_probe.json").is_file() else None
    failures = [
        {k: r.get(k) for k in ("arm", "cell", "rep", "request", "status", "error")}
        for r in records
        if r.get("status") != "ok"
    ]
    summary = {
        "status": run.manifest.get("status"),
        "interrupted_by": run.manifest.get("interrupted_by"),
        "cells_total": len(cells),
        "cells_invalid": sum(1 for c in cells if not c["valid"]),
        "identity_method": "colocated replay of the pd batches",
        "exact_arm_mismatch": any(r["exact_mismatch"] for r in replays),
        "exact_arm_unverified": [r["cell"] for r in replays if r["exact_unverified"]],
        "replay_identity": replays,
        "failed_requests": len(failures),
        "cold_cells": [
            {k: c.get(k) for k in ("arm", "cell", "rep", "cold_work")} for c in cells if c.get("cold")
        ],
        "no_verdict": no_verdict,
        "random_weights": bool(cfg.get("random_weights")),
        "all_blocks_free": run.manifest.get("all_blocks_free"),
    }
    return {
        "config": cfg,
        "modes": modes,
        "cells": cells,
        "transfer": transfer_rows(records, valid),
        "latency": latency_rows(records, valid, modes),
        "comparison": comparison,
        "identity": free,
        "replay_identity": replays,
        "probe": probe,
        "failures": failures,
        "summary": summary,
        "manifest": run.manifest,
    }


def _ms(v: float | None) -> str:
    return fmt_ms(v)


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def _probe_lines(probe: dict[str, Any] | None, latency: list[dict[str, Any]]) -> list[str]:
    if not probe:
        return ["", "## Idle link", "", "No link probe was recorded."]
    med = {k: float(np.median(probe[k])) if probe[k] else None for k in ("pack_s", "wire_s", "unpack_s")}
    gbs = probe["bytes"] / med["wire_s"] / 1e9 if med["wire_s"] else None
    ref1 = next((r for r in latency if r["mode"] == REF and r["C"] == min(x["C"] for x in latency)), None)
    L = [
        "",
        f"## Idle link: one request's KV ({probe['tokens']} tokens, {_bytes(probe['bytes'])}, "
        f"{probe['blocks']} blocks) over {probe['transport']}",
        "",
        *table(["part", "median ms", "n", "first transfer ms (connection setup)"],
               [[k[:-2], _ms(med[k]), len(probe[k]), _ms(probe["first"][k])]
                for k in ("pack_s", "wire_s", "unpack_s")]),
    ]
    if gbs is not None:
        L += ["", f"Wire rate {gbs:.2f} GB/s (payload bytes / median wire time)."]
    if ref1 is not None and med["wire_s"] is not None:
        total = sum(v for v in med.values() if v is not None)
        L.append(
            f"Pack + wire + unpack {_ms(total)} ms against the colocated TTFT of one request at "
            f"{ref1['cell']} ({_ms(ref1['ttft_p50'])} ms p50, prefill compute plus queueing)."
        )
    return L


def _header(a: dict[str, Any]) -> list[str]:
    cfg, s = a["config"], a["summary"]
    layout = f", KV layout {cfg['kv_layout']}" if cfg.get("kv_layout") else ""
    return [*rs.title(f"rltbench pd: {cfg.get('model')}{layout}, {cfg.get('num_kv_planes')} KV planes"),
            *rs.random_weights(s["random_weights"], s["no_verdict"])]


def _notes(a: dict[str, Any]) -> list[str]:
    s = a["summary"]
    notes = list(a["config"].get("notes") or [])
    if s["no_verdict"]:
        notes.append(f"no speed verdicts: {s['no_verdict']} cannot say whether pd is faster")
    return rs.notes(notes)


def _warnings(a: dict[str, Any]) -> list[str]:
    """Token mismatches, failed requests and timed cold work, in bold."""
    s, L = a["summary"], []
    if s["exact_arm_mismatch"]:
        L += rs.bold("TOKEN MISMATCH: the pd tokens differ from the colocated engine on the same batches (a "
                     "transfer or engine bug); see the identity table")
    if s["failed_requests"]:
        L += rs.bold(f"{s['failed_requests']} request(s) failed; see 'Failed requests'")
    if s["cold_cells"]:
        L += rs.bold(f"{len(s['cold_cells'])} timed cell(s) did cold work (capture, compile or device malloc "
                     "inside the timed window); see 'Cold work'")
    return L


def _run_header(a: dict[str, Any]) -> list[str]:
    cfg, s = a["config"], a["summary"]
    devices = cfg.get("devices") or ["?", "?"]
    arm_spec = ", ".join(f"{k}={v}" for k, v in (cfg.get("arm_spec") or {}).items())
    return rs.bullets([
        f"prefill rank on {devices[0]}, decode rank on {devices[1]}, payloads over {cfg.get('backend')}; "
        f"colocated engine (prefill and decode in one engine) on {devices[0]}",
        f"arm: {cfg.get('kernel_arm')} ({arm_spec}) on both engines",
        f"KV: {cfg.get('num_kv_planes')} planes, {_bytes(cfg.get('kv_bytes_per_token'))} per token, "
        f"{_bytes(cfg.get('kv_bytes_per_block'))} per block of {cfg.get('block_size')} tokens; dtype "
        f"{cfg.get('dtype')}; transfer budget {_bytes(cfg.get('budget_bytes'))} in flight",
        f"burst: C in {cfg.get('concurrency')}, {cfg.get('input_len')} in / {cfg.get('output_len')} out, "
        f"{cfg.get('repeats')} repetitions, modes {', '.join(a['modes'])} interleaved A B C, C B A",
        f"status: {s['status']}" + (f" ({s['interrupted_by']})" if s.get("interrupted_by") else ""),
        f"every KV block returned at the end: {s.get('all_blocks_free')}",
    ])


def _p50_p90(r: dict[str, Any], name: str) -> str:
    """'p50 / p90' in ms of the figure `name` of a transfer or latency row."""
    return f"{_ms(r[name + '_p50'])} / {_ms(r[name + '_p90'])}"


def _share(r: dict[str, Any]) -> str:
    """The transfer's share of the TTFT p50 of a transfer row, '-' when unknown."""
    return "-" if r["transfer_share_of_ttft_p50"] is None else f"{r['transfer_share_of_ttft_p50']:.1%}"


def _transfer(a: dict[str, Any]) -> list[str]:
    header = ["cell", "bytes / request", "bytes / prompt token", "payload messages / request", "prefill",
              "link wait", "handshake", "payload", "transfer", "TTFT (pd)", "transfer share of TTFT (p50)"]
    rows = [[r["cell"], _bytes(r["bytes_per_request"]), _bytes(r["bytes_per_prompt_token"]),
             r["payload_messages_per_request"],
             *(_p50_p90(r, n) for n in ("prefill", "link_wait", "handshake", "payload", "transfer", "ttft")),
             _share(r)] for r in a["transfer"]]
    return ["## KV transfer per request (pd cells, pooled over valid repetitions; ms p50 / p90)", "",
            *table(header, rows), "", TRANSFER_NOTES]


def _probe(a: dict[str, Any]) -> list[str]:
    return _probe_lines(a["probe"], a["latency"])


def _latency(a: dict[str, Any]) -> list[str]:
    rows = [[r["cell"], r["mode"], *(_p50_p90(r, n) for n in ("ttft", "tpot", "e2e")), r["ttft_n"]]
            for r in a["latency"]]
    return [*rs.heading("TTFT and TPOT (ms p50 / p90, n requests)"),
            *table(["cell", "mode", "TTFT", "TPOT", "E2E", "n"], rows)]


def _comparison(a: dict[str, Any]) -> list[str]:
    if not a["comparison"]:
        return []
    return [
        *rs.heading(f"pd against colocated (mode / colocated - 1; {INTERVAL_METHOD}; arm = mode)"),
        *delta_table(a["comparison"]),
        "",
        "A difference whose interval reaches into the A/A spread (the colocated engine measured "
        "twice) is `within noise`; lower is better.",
    ]


def _replay_identity(a: dict[str, Any]) -> list[str]:
    rows = []
    for r in a["replay_identity"]:
        fd = r["first_divergence"]
        fdt = "-" if fd is None else f"{fd['rep']}, {fd['request']}, {fd['step']}, {fd['token_index']}"
        note = "**MISMATCH**" if r["exact_mismatch"] else ("exact arm" if r["exact_arm"] else "")
        if r["skipped"]:
            note += ("; " if note else "") + "; ".join(r["skipped"])
        rows.append([r["cell"], f"{r['identical']} / {r['compared']}", r["reps"], fdt, note])
    header = ["cell", "identical / compared", "reps", "first divergence (rep, request, step, token)", "note"]
    return rs.explained_table(
        "Token identity (the verdict: the colocated engine replays each pd cell's batches)",
        "After every pd cell the colocated engine ran, untimed, exactly the batches of that cell (the "
        "prefill engine's prefill steps, then the decode engine's decode steps). Its tokens must equal "
        "the pd tokens for every request: any difference is KV that changed on the way or an engine bug.",
        table(header, rows or [["-", "no pd cell finished", "-", "-", "-"]]))


def _free_identity(a: dict[str, Any]) -> list[str]:
    rows = [[r["cell"], r["arm"], f"{r['identical']} / {r['compared']}",
             "-" if r["first_divergence_min"] is None else r["first_divergence_min"]] for r in a["identity"]]
    return rs.explained_table(
        "Free-running tokens against the colocated cells (information)",
        "The colocated engine decodes a burst in batches formed as prefills finish there; the decode "
        "engine forms its batches as KV arrives. Greedy outputs are not batch-invariant, so these may "
        "differ without any error; the A/A row is the colocated engine against itself.",
        table(["cell", "mode", "identical / compared", "first divergence (min)"], rows))


def _cold(a: dict[str, Any]) -> list[str]:
    cold = a["summary"]["cold_cells"]
    if not cold:
        return []
    rows = [[c["cell"], c["arm"], c["rep"],
             ", ".join(f"{k} {v}" for k, v in (c["cold_work"] or {}).items() if v)] for c in cold]
    return [*rs.heading("Cold work"), *table(["cell", "mode", "rep", "counts"], rows)]


def _failures(a: dict[str, Any]) -> list[str]:
    if not a["failures"]:
        return []
    rows = [[f["cell"], f["arm"], f["rep"], f["request"], f["status"],
             (f["error"] or "").replace("|", "/")[:200]] for f in a["failures"][:50]]
    header = ["cell", "mode", "rep", "request", "status", "error"]
    return [*rs.heading("Failed requests"), *table(header, rows)]


def _definitions(a: dict[str, Any]) -> list[str]:
    return ["", *rs.metric_definitions()]


SECTIONS: list[rs.Section] = [
    _header, _notes, _warnings, _run_header, _transfer, _probe, _latency, _comparison, _replay_identity,
    _free_identity, _cold, _failures, _definitions,
]
"""The pd report, top to bottom."""


def table_markdown(a: dict[str, Any]) -> str:
    return rs.render_sections(SECTIONS, a)


MODE_STYLE = {REF: ("#4C72B0", "o-"), f"{REF}#2": ("#4C72B0", "o--"), PD: ("#DD8452", "s-")}


def latency_figure(a: dict[str, Any]) -> Any:
    """pd.png: TTFT p50 and TPOT p50 against C, pd beside the colocated engine (and its A/A run), with
    pd's transfer p50 under its TTFT; None when no cell finished. CPU runs say on the figure that
    their times carry no speed verdict."""
    lat = [r for r in a["latency"] if isinstance(r.get("C"), int) and r["C"] > 0]
    if not lat:
        return None
    cs = sorted({r["C"] for r in lat})
    fig, (ax1, ax2) = figure(10.0, 4.0, 1, 2)
    for ax, metric, title in ((ax1, "ttft", "TTFT p50"), (ax2, "tpot", "TPOT p50")):
        for mode in a["modes"]:
            pts = sorted((r["C"], r[f"{metric}_p50"]) for r in lat
                         if r["mode"] == mode and r.get(f"{metric}_p50") is not None)
            if pts:
                color, style = MODE_STYLE.get(mode, ("#8172B2", "o-"))
                ax.plot([c for c, _ in pts], [1e3 * v for _, v in pts], style, color=color, label=mode)
        if metric == "ttft":
            pts = sorted((r["C"], r["transfer_p50"]) for r in a["transfer"]
                         if r.get("transfer_p50") is not None)
            if pts:
                ax.plot([c for c, _ in pts], [1e3 * v for _, v in pts], "s:", color=MODE_STYLE[PD][0],
                        label="pd transfer")
        log_axis(ax, cs, "concurrency C")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{a['config'].get('model', '')}: prefill / decode split against the colocated engine",
                 fontsize=10)
    caveat(fig, [no_verdict_caption(a["config"])])
    return fig


def render(run_dir: str | Path) -> dict[str, Any]:
    """Recompute everything from the raw files; write the tables, summary.json, table.md and pd.png."""
    run = RunDir.open(run_dir)
    a = analyse(run)
    for name in ("cells", "transfer", "latency", "comparison", "identity"):
        if a[name]:
            run.write_table(name, pd.DataFrame(a[name]))
    run.write_json("summary.json", a["summary"])
    run.write_markdown("table.md", table_markdown(a))
    fig = latency_figure(a)
    if fig is not None:
        run.save_plot("pd.png", fig)
    return a


def print_summary(con: Any, a: dict[str, Any], path: Path) -> None:
    """The few lines a user reads at the end of a run."""
    s = a["summary"]
    caption = f" ({no_verdict_caption(a['config'])})" if s["no_verdict"] else ""
    for r in a["transfer"]:
        share = _share(r)
        con.print(
            f"{r['cell']:>6}: {_bytes(r['bytes_per_request'])} per request "
            f"({_bytes(r['bytes_per_prompt_token'])} per prompt token), transfer p50 "
            f"{_ms(r['transfer_p50'])} ms = {share} of TTFT{caption}",
            highlight=False,
        )
    for r in a["replay_identity"]:
        con.print(
            f"identity {r['cell']:>6}: {r['identical']}/{r['compared']} pd tokens equal to the colocated "
            "replay" + (f" ({'; '.join(r['skipped'])})" if r["skipped"] else ""),
            highlight=False,
            soft_wrap=True,
        )
    if s["exact_arm_mismatch"]:
        con.print("[bold red]TOKEN MISMATCH between pd and the colocated replay: see table.md[/]")
    if s["random_weights"]:
        con.print("[yellow]random weights: text is not meaningful[/]")
    con.print(
        f"{s['cells_total']} cells ({s['cells_invalid']} invalid, {s['failed_requests']} failed requests), "
        f"status {s['status']}: {path}/table.md",
        highlight=False,
        soft_wrap=True,
    )
