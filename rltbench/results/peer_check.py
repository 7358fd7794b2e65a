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

**The A/A leg** (optional): rltbench's client runs the same load a second time after guidellm (A,
peer, A'). A difference inside the spread of two runs of one client is noise: per figure the A/A diff
(A' / A - 1) is shown, the peer is compared with the mean of A and A' (the peer ran between them, so
the mean is rltbench's best estimate at the peer's time; the first run alone would credit any drift
of the server to the peer), and a figure beyond the tolerance whose |diff| <= |A/A diff| reads
**noise**: rltbench's own client moved as much between two runs, so the peer's difference is no
evidence that the clients measure differently. The rule reads off the two printed columns. It is
lenient, not strict: with the three values drawn alike, |peer - mean| has a smaller spread than
|A' - A| (sqrt(3/2) against sqrt(2) of one run's), so most same-client differences pass; one A/A pair
is a coarse estimate, which is why noise is counted apart from agrees, never added to it.
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
AGREES, NOISE, DIFFERS, INFO, MISSING = "agrees", "noise", "differs", "information", "missing"
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


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def figure_row(rate: float, basis: str, name: str, ours: list[float | None], theirs: float | None,
               tolerance: float | None) -> dict[str, Any]:
    """One compared figure. `ours` holds rltbench's value of each run: one run, or the A/A leg's two
    (A before the peer, A' after it). rltbench's value is their mean; diff = guidellm / rltbench - 1;
    with two runs aa_diff = A' / A - 1. The verdict is `agrees` within the tolerance, `noise` beyond it
    where |diff| <= |aa_diff|, `differs` otherwise, `information` without a tolerance, `missing`
    without a value."""
    mean = _mean(ours)
    diff = None if mean is None or theirs is None or mean == 0 else theirs / mean - 1
    first, second = (ours + [None])[:2]
    aa_diff = None if first is None or second is None or first == 0 else second / first - 1
    if diff is None:
        verdict = MISSING
    elif tolerance is None:
        verdict = INFO
    elif abs(diff) <= tolerance:
        verdict = AGREES
    elif aa_diff is not None and abs(diff) <= abs(aa_diff):
        verdict = NOISE
    else:
        verdict = DIFFERS
    return {"rate": rate, "basis": basis, "figure": name, "rltbench": mean, "guidellm": theirs, "diff": diff,
            "runs": len(ours), "aa_diff": aa_diff, "tolerance": tolerance, "verdict": verdict}


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _share(achieved: float | None, offered: float | None) -> float | None:
    return None if achieved is None or not offered else achieved / offered


def check_rate(rate: float, ours: list[list[dict[str, Any]]], peer: PeerBenchmark,
               head: float = DEFAULT_EXCLUDE, tail: float = DEFAULT_EXCLUDE,
               ours_aa: list[list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """The compared figures of one rate: rltbench's cells (one record list per repetition, figures
    the median over repetitions) against guidellm's benchmark at that rate; with the A/A leg
    (`ours_aa`, the second run's cells, maybe none at this rate) each figure carries both runs."""
    runs = [ours] if ours_aa is None else [ours, ours_aa]
    mine = [_medians([rlt_definitions(recs, head, tail) for recs in run]) for run in runs]
    as_peer = [_medians([peer_definitions(recs) for recs in run]) for run in runs]
    theirs, own = rlt_definitions(peer.records, head, tail), peer.own

    def each(figures: list[dict[str, float | None]], key: str, scale: float = 1.0) -> list[float | None]:
        return [None if f.get(key) is None else f[key] * scale for f in figures]

    offered = figure_row(rate, RLT_BASIS, "offered rate /s", each(mine, "offered"), theirs["offered"], None)
    if offered["diff"] is not None and abs(offered["diff"]) > RATE_TOLERANCE:
        # each client's own Poisson draw: the share of its own offered rate that it achieved
        achieved = ("achieved / offered", [_share(m.get("achieved"), m.get("offered")) for m in mine],
                    _share(theirs["achieved"], theirs["offered"]))
    else:
        achieved = ("achieved rate /s", each(mine, "achieved"), theirs["achieved"])
    compared = [
        (RLT_BASIS, *achieved, RATE_TOLERANCE),
        (RLT_BASIS, "TTFT p50 ms", each(mine, "ttft", 1e3), _ms(theirs["ttft"]), LATENCY_TOLERANCE),
        (RLT_BASIS, "TPOT p50 ms", each(mine, "tpot", 1e3), _ms(theirs["tpot"]), LATENCY_TOLERANCE),
        (PEER_BASIS, "request rate /s", each(as_peer, "rate"), own.get("request_rate"), RATE_TOLERANCE),
        (PEER_BASIS, "TTFT median ms", each(as_peer, "ttft", 1e3), own.get("ttft_ms"), LATENCY_TOLERANCE),
        (PEER_BASIS, "ITL median ms", each(as_peer, "itl", 1e3), own.get("itl_ms"), LATENCY_TOLERANCE),
    ]
    return [offered, *(figure_row(rate, *c) for c in compared)]


def _same_rate(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)


def _at_rate(runs: dict[float, list[list[dict[str, Any]]]], rate: float) -> list[list[dict[str, Any]]] | None:
    return next((v for k, v in runs.items() if _same_rate(k, rate)), None)


def cross_check(ours: dict[float, list[list[dict[str, Any]]]], peer: list[PeerBenchmark],
                head: float = DEFAULT_EXCLUDE, tail: float = DEFAULT_EXCLUDE,
                ours_aa: dict[float, list[list[dict[str, Any]]]] | None = None) -> list[dict[str, Any]]:
    """Every rate of either client: its compared figures, or one `missing` row where only one client
    ran it. guidellm benchmarks of other strategies than constant or Poisson are not rates. With the
    A/A leg (`ours_aa`: rltbench's second run of the same load, after the peer) every row carries both
    runs; a rate the second run lacks is compared with the first alone (no A/A diff)."""
    rated = [b for b in peer if b.strategy in OPEN_LOOP and b.load is not None]
    n_runs = 1 if ours_aa is None else 2
    rows: list[dict[str, Any]] = []
    for rate in sorted({*ours, *(b.load for b in rated)}):
        mine = _at_rate(ours, rate)
        theirs = next((b for b in rated if _same_rate(b.load, rate)), None)
        if mine is None or theirs is None:
            who = "guidellm" if theirs is None else "rltbench"
            rows.append(figure_row(rate, RLT_BASIS, f"not run by {who}", [None] * n_runs, None, None))
            continue
        again = None if ours_aa is None else _at_rate(ours_aa, rate) or []
        rows += check_rate(rate, mine, theirs, head, tail, again)
    return rows


def verdict_tally(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Per verdict the number of judged figures (those with a tolerance, and missing ones)."""
    judged = [r for r in rows if r["tolerance"] is not None or r["verdict"] == MISSING]
    return {v: sum(r["verdict"] == v for r in judged) for v in (AGREES, NOISE, DIFFERS, MISSING)}


def verdict_counts(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(figures that agree, figures with a tolerance): what the one-run summary line says."""
    tally = verdict_tally(rows)
    return tally[AGREES], sum(tally.values())


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%"


def _table(rows: list[dict[str, Any]], with_aa: bool) -> list[str]:
    """One row per figure; with the A/A leg rltbench's column is the mean of its two runs and the A/A
    column their difference, beside the verdict it decides."""
    out = []
    for r in rows:
        verdict = r["verdict"] if r["tolerance"] is None else f"{r['verdict']} (±{r['tolerance']:.0%})"
        aa = [_pct(r["aa_diff"])] if with_aa else []
        out.append([f"{r['rate']:g}/s", r["figure"], _fmt(r["rltbench"], 3), _fmt(r["guidellm"], 3),
                    _pct(r["diff"]), *aa, verdict])
    if with_aa:
        return table(["rate", "figure", "rltbench (mean)", "guidellm", "diff", "A/A", "verdict"], out,
                     ["r", "", "r", "r", "r", "r", ""])
    return table(["rate", "figure", "rltbench", "guidellm", "diff", "verdict"], out,
                 ["r", "", "r", "r", "r", ""])


def _headline(rows: list[dict[str, Any]], with_aa: bool) -> str:
    tolerances = (f"achieved rate within {RATE_TOLERANCE:.0%}, TTFT and TPOT p50 within "
                  f"{LATENCY_TOLERANCE:.0%}")
    if not with_aa:
        agree, judged = verdict_counts(rows)
        return f"**Cross-check: {agree}/{judged} figures agree** ({tolerances})."
    tally = verdict_tally(rows)
    missing = f", {tally[MISSING]} missing" if tally[MISSING] else ""
    return (f"**Cross-check of {sum(tally.values())} figures: {tally[AGREES]} agree, {tally[NOISE]} noise, "
            f"{tally[DIFFERS]} differ{missing}** ({tolerances}; noise: beyond the tolerance, but |diff| <= "
            "|A/A|, rltbench's second run against its first).")


def check_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown of a cross-check: the summary, then one table per definition; the A/A column and
    the noise count where the rows carry rltbench's two runs."""
    with_aa = any(r["runs"] > 1 for r in rows)
    lines = [_headline(rows, with_aa), "",
             "### rltbench's definitions on each client's timestamps (measured requests)", ""]
    lines += _table([r for r in rows if r["basis"] == RLT_BASIS], with_aa)
    lines += ["", "### guidellm's definitions (rltbench: computed from its records; guidellm: as reported)",
              ""]
    return lines + _table([r for r in rows if r["basis"] == PEER_BASIS], with_aa)


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
