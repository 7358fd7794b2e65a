"""Cross-check of rltbench's load client against a peer client (guidellm) on one server: the same
open-loop load (lengths, arrivals, rates, number of requests) sent by each client, and per rate a
verdict on each figure: achieved rate within 2%, TTFT p50 and TPOT p50 within 5%.

Every figure is computed twice, so a difference can be placed:

- **rltbench's definitions** (docs/contracts/e2e.md) on each client's own timestamps, over the same
  measured requests (the first and last shares of each cell's requests by arrival left out): offered
  rate, achieved rate, TTFT p50, TPOT p50. A difference here is in what the clients measured (when
  they sent, when they saw tokens), not in how they define a figure.
- **guidellm's definitions** (rltbench.results.guidellm) over every request: its request rate
  (successful requests over the window from the first send to the last finish), its TTFT median and
  its ITL median (which is rltbench's TPOT); rltbench's column computes them from rltbench's records,
  guidellm's column is what guidellm reported.

With Poisson arrivals each client draws its own schedule (guidellm from its seed, without rltbench's
pinned span), so their offered rates differ by the draw; where they differ by more than the rate
tolerance, the achieved rate is compared as a share of each client's own offered rate.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from rltbench.results.guidellm import OPEN_LOOP, PeerBenchmark
from rltbench.results.rate import DEFAULT_EXCLUDE, completed_rate, measured_records, rate_figures
from rltbench.results.rundir import RunDir
from rltbench.results.serving import percentiles, request_metrics
from rltbench.results.tables import table

RATE_TOLERANCE = 0.02
LATENCY_TOLERANCE = 0.05
AGREES, DIFFERS, INFO, MISSING = "agrees", "differs", "information", "missing"
RLT_BASIS, PEER_BASIS = "rltbench", "guidellm"


def _p50(values: list[float | None]) -> float | None:
    return percentiles(values)["p50"]


def rlt_definitions(records: list[dict[str, Any]], head: float, tail: float) -> dict[str, float | None]:
    """rltbench's figures of one cell's records: offered and achieved rate (requests/s), TTFT and TPOT
    p50 (seconds) over its measured requests."""
    fig = rate_figures(records, head, tail)
    per = [request_metrics(r) for r in measured_records(records, head, tail) if r.get("status") == "ok"]
    return {"offered": fig["offered_rate"], "achieved": fig["achieved_rate"],
            "ttft": _p50([p["ttft"] for p in per]), "tpot": _p50([p["tpot"] for p in per])}


def peer_definitions(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """guidellm's figures of one cell's records, over every request: request rate (ok requests over
    the first send .. last finish window), TTFT median and ITL median (rltbench's TPOT), seconds."""
    per = [request_metrics(r) for r in records if r.get("status") == "ok"]
    return {"rate": completed_rate(records), "ttft": _p50([p["ttft"] for p in per]),
            "itl": _p50([p["tpot"] for p in per])}


def _medians(dicts: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Per key the median over repetitions (None where no repetition has it)."""
    out: dict[str, float | None] = {}
    for key in dicts[0] if dicts else ():
        vals = [d[key] for d in dicts if d.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def figure_row(rate: float, basis: str, name: str, ours: float | None, theirs: float | None,
               tolerance: float | None) -> dict[str, Any]:
    """One compared figure: diff = guidellm / rltbench - 1; the verdict is `agrees` within the
    tolerance, `differs` beyond it, `information` without a tolerance, `missing` without a value."""
    diff = None if ours is None or theirs is None or ours == 0 else theirs / ours - 1
    if diff is None:
        verdict = MISSING
    elif tolerance is None:
        verdict = INFO
    else:
        verdict = AGREES if abs(diff) <= tolerance else DIFFERS
    return {"rate": rate, "basis": basis, "figure": name, "rltbench": ours, "guidellm": theirs, "diff": diff,
            "tolerance": tolerance, "verdict": verdict}


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _share(achieved: float | None, offered: float | None) -> float | None:
    return None if achieved is None or not offered else achieved / offered


def check_rate(rate: float, ours: list[list[dict[str, Any]]], peer: PeerBenchmark,
               head: float = DEFAULT_EXCLUDE, tail: float = DEFAULT_EXCLUDE) -> list[dict[str, Any]]:
    """The compared figures of one rate: rltbench's cells (one record list per repetition, figures
    the median over repetitions) against guidellm's benchmark at that rate."""
    mine = _medians([rlt_definitions(recs, head, tail) for recs in ours])
    theirs = rlt_definitions(peer.records, head, tail)
    offered = figure_row(rate, RLT_BASIS, "offered rate /s", mine["offered"], theirs["offered"], None)
    if offered["diff"] is not None and abs(offered["diff"]) > RATE_TOLERANCE:
        # each client's own Poisson draw: the share of its own offered rate that it achieved
        achieved = ("achieved / offered", _share(mine["achieved"], mine["offered"]),
                    _share(theirs["achieved"], theirs["offered"]))
    else:
        achieved = ("achieved rate /s", mine["achieved"], theirs["achieved"])
    as_peer, own = _medians([peer_definitions(recs) for recs in ours]), peer.own
    compared = [
        (RLT_BASIS, *achieved, RATE_TOLERANCE),
        (RLT_BASIS, "TTFT p50 ms", _ms(mine["ttft"]), _ms(theirs["ttft"]), LATENCY_TOLERANCE),
        (RLT_BASIS, "TPOT p50 ms", _ms(mine["tpot"]), _ms(theirs["tpot"]), LATENCY_TOLERANCE),
        (PEER_BASIS, "request rate /s", as_peer["rate"], own.get("request_rate"), RATE_TOLERANCE),
        (PEER_BASIS, "TTFT median ms", _ms(as_peer["ttft"]), own.get("ttft_ms"), LATENCY_TOLERANCE),
        (PEER_BASIS, "ITL median ms", _ms(as_peer["itl"]), own.get("itl_ms"), LATENCY_TOLERANCE),
    ]
    return [offered, *(figure_row(rate, *c) for c in compared)]


def _same_rate(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)


def cross_check(ours: dict[float, list[list[dict[str, Any]]]], peer: list[PeerBenchmark],
                head: float = DEFAULT_EXCLUDE, tail: float = DEFAULT_EXCLUDE) -> list[dict[str, Any]]:
    """Every rate of either client: its compared figures, or one `missing` row where only one client
    ran it. guidellm benchmarks of other strategies than constant or Poisson are not rates."""
    rated = [b for b in peer if b.strategy in OPEN_LOOP and b.load is not None]
    rows: list[dict[str, Any]] = []
    for rate in sorted({*ours, *(b.load for b in rated)}):
        mine = next((v for k, v in ours.items() if _same_rate(k, rate)), None)
        theirs = next((b for b in rated if _same_rate(b.load, rate)), None)
        if mine is None or theirs is None:
            who = "guidellm" if theirs is None else "rltbench"
            rows.append(figure_row(rate, RLT_BASIS, f"not run by {who}", None, None, None))
            continue
        rows += check_rate(rate, mine, theirs, head, tail)
    return rows


def verdict_counts(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(figures that agree, figures with a tolerance): what the summary line says."""
    judged = [r for r in rows if r["tolerance"] is not None or r["verdict"] == MISSING]
    return sum(r["verdict"] == AGREES for r in judged), len(judged)


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    out = [[f"{r['rate']:g}/s", r["figure"], _fmt(r["rltbench"], 3), _fmt(r["guidellm"], 3),
            "-" if r["diff"] is None else f"{100 * r['diff']:+.1f}%",
            r["verdict"] if r["tolerance"] is None else f"{r['verdict']} (±{r['tolerance']:.0%})"]
           for r in rows]
    head = ["rate", "figure", "rltbench", "guidellm", "diff", "verdict"]
    return table(head, out, ["r", "", "r", "r", "r", ""])


def check_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of a cross-check: the summary, then one table per definition."""
    agree, judged = verdict_counts(rows)
    lines = [f"**Cross-check: {agree}/{judged} figures agree** (achieved rate within "
             f"{RATE_TOLERANCE:.0%}, TTFT and TPOT p50 within {LATENCY_TOLERANCE:.0%}).", "",
             "### rltbench's definitions on each client's timestamps (measured requests)", ""]
    lines += _table([r for r in rows if r["basis"] == RLT_BASIS])
    lines += ["", "### guidellm's definitions (rltbench: computed from its records; guidellm: as reported)",
              ""]
    return lines + _table([r for r in rows if r["basis"] == PEER_BASIS])


def run_rate_records(run_dir: Path | str) -> tuple[dict[float, list[list[dict[str, Any]]]], dict[str, Any]]:
    """An `rltbench e2e --workload rate` run -> ({target rate: [records of each repetition]}, its config),
    for the run's first arm (the cross-check runs one)."""
    run = RunDir.open(run_dir)
    cfg = run.manifest.get("config") or {}
    arm = (cfg.get("arm_names") or [None])[0]
    rate_of = {(m["cell"], m["rep"]): m["rate"] for m in run.read_jsonl("cell_meta.jsonl")
               if m.get("rate") is not None and m.get("arm") == arm and not m.get("interrupted")}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in run.read_jsonl("requests.jsonl"):
        if r.get("arm") == arm and (r["cell"], r["rep"]) in rate_of:
            groups[(r["cell"], r["rep"])].append(r)
    out: dict[float, list[list[dict[str, Any]]]] = defaultdict(list)
    for (cell, rep), recs in sorted(groups.items(), key=lambda kv: (rate_of[kv[0]], kv[0][1])):
        out[float(rate_of[(cell, rep)])].append(recs)
    return dict(out), cfg
