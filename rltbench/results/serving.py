"""Serving metrics (TTFT, TPOT, ITL, E2E, throughput) of request records, as docs/contracts/e2e.md
defines them.

Inputs are per-request records (dicts, the rows of requests.jsonl): `send`, `first`, `last`
(time.perf_counter seconds), `event_times` / `event_tokens` (one entry per streamed event and how
many tokens it carried), `token_ids`, `status`, `expected_len`. Everything is recomputable from
requests.jsonl alone, which is what `rltbench report` does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from rltbench.bench.warmth import is_cold
from rltbench.results.quantiles import summarize

METRIC_DEFINITIONS = """\
- TTFT = first generated token - request sent.
- E2E = last token - request sent.
- TPOT = (E2E - TTFT) / (N - 1) (vLLM/SGLang convention; AIPerf calls it ITL).
- ITL = per-token gaps; when one event carries k tokens, its gap is split over the k tokens.
- Output throughput = sum of generated tokens / (last finish - first send) per cell; steady tok/s =
  tokens generated while all of a burst's requests are in decode (last first token .. first finish)
  divided by that window.
- p50/p90/p99 with the sample count n; a p99 from fewer than 100 samples is marked `*` (it is near the max).
- N is the engine's count of generated token ids (never re-tokenized text); a cell is valid only if
  every request finished with status ok and exactly the expected number of tokens.
- Request statuses: ok / error / timeout / length_mismatch; a failed request invalidates its cell."""

P99_MIN_SAMPLES = 100
STATUSES = ("ok", "error", "timeout", "length_mismatch")
CELL_KEYS = ("arm", "cell", "C", "rep")  # what names one cell: arm (or mode), cell, concurrency, repetition


def request_metrics(rec: dict[str, Any]) -> dict[str, Any]:
    """TTFT, E2E, TPOT (seconds) and the ITL samples of one request; None where undefined."""
    ids = rec.get("token_ids")
    n = len(ids) if ids is not None else int(rec.get("n_tokens") or sum(rec.get("event_tokens") or []))
    send, first, last = rec.get("send"), rec.get("first"), rec.get("last")
    ttft = first - send if first is not None and send is not None else None
    e2e = last - send if last is not None and send is not None else None
    tpot = (e2e - ttft) / (n - 1) if ttft is not None and e2e is not None and n > 1 else None
    return {"n": n, "ttft": ttft, "e2e": e2e, "tpot": tpot, "itl": itl_samples(rec)}


def itl_samples(rec: dict[str, Any]) -> list[float]:
    """Per-token gaps after the first event; an event of k tokens contributes k samples of gap/k."""
    times = rec.get("event_times") or []
    counts = rec.get("event_tokens") or [1] * len(times)
    out: list[float] = []
    for i in range(1, len(times)):
        k = max(1, int(counts[i]))
        out.extend([(times[i] - times[i - 1]) / k] * k)
    return out


def percentiles(values: list[float | None]) -> dict[str, Any]:
    """p50/p90/p99 (rltbench.results.quantiles) with the sample count and a low-count flag for p99."""
    q = summarize(values)
    if q.n == 0:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None, "p99_low_n": True}
    return {"n": q.n, "p50": q.median, "p90": q.p90, "p99": q.p99, "mean": q.mean,
            "p99_low_n": bool(q.n < P99_MIN_SAMPLES)}


def steady_window(recs: list[dict[str, Any]]) -> tuple[float, float, int] | None:
    """(start, end, tokens) of the window where every request of the cell is decoding."""
    firsts = [r["first"] for r in recs if r.get("first") is not None]
    lasts = [r["last"] for r in recs if r.get("last") is not None]
    if not recs or len(firsts) != len(recs) or len(lasts) != len(recs):
        return None
    start, end = max(firsts), min(lasts)
    if end <= start:
        return None
    return start, end, tokens_between(recs, start, end)


def tokens_between(recs: list[dict[str, Any]], start: float, end: float) -> int:
    """Tokens the requests received in streamed events at times in (start, end]."""
    tokens = 0
    for r in recs:
        counts = r.get("event_tokens") or [1] * len(r.get("event_times") or [])
        tokens += sum(
            int(k) for t, k in zip(r.get("event_times") or [], counts, strict=False) if start < t <= end
        )
    return tokens


def cell_summary(recs: list[dict[str, Any]], burst: bool = True) -> dict[str, Any]:
    """One cell's (arm, C, repetition) numbers: validity, throughput, latency percentiles."""
    per = [request_metrics(r) for r in recs]
    statuses = {s: sum(1 for r in recs if r.get("status") == s) for s in STATUSES}
    tokens = sum(p["n"] for p in per)
    sends = [r["send"] for r in recs if r.get("send") is not None]
    lasts = [r["last"] for r in recs if r.get("last") is not None]
    dur = (max(lasts) - min(sends)) if sends and lasts else None
    out: dict[str, Any] = {
        "requests": len(recs),
        **{f"n_{s}": c for s, c in statuses.items()},
        "valid": bool(recs) and statuses["ok"] == len(recs),
        "output_tokens": tokens,
        "duration_s": dur,
        "output_tok_s": tokens / dur if dur and dur > 0 else None,
        "steady_tok_s": None,
    }
    if burst:
        win = steady_window(recs)
        if win is not None:
            out["steady_tok_s"] = win[2] / (win[1] - win[0])
    for name in ("ttft", "tpot", "e2e"):
        pc = percentiles([p[name] for p in per])
        out.update({f"{name}_{k}": v for k, v in pc.items()})
    pc = percentiles([x for p in per for x in p["itl"]])
    out.update({f"itl_{k}": v for k, v in pc.items()})
    hits = [r.get("prefix_hit_tokens") for r in recs]
    if any(h is not None for h in hits):
        prompt = sum(int(r.get("prompt_len") or 0) for r in recs)
        out["prefix_hit_tokens"] = int(sum(h or 0 for h in hits))
        out["measured_prefix_hit_rate"] = out["prefix_hit_tokens"] / prompt if prompt else None
    depths = [d for r in recs for d in (r.get("exit_depths") or ())]
    if depths:  # a model with an exit gate: the loops its tokens used, on average
        out["mean_exit_depth"] = sum(depths) / len(depths)
    return out



def compute_cells(
    records: list[dict[str, Any]], meta: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One summary row per (arm, cell, rep), in the order cells ran; metadata rows (cell_meta.jsonl)
    merged in, and `cold` set where the cell's timed window did cold work."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["arm"], r["cell"], r["C"], r["rep"])].append(r)
    extra = {(m["arm"], m["cell"], m["C"], m["rep"]): m for m in meta or []}
    keys = list(dict.fromkeys([*(tuple(m[k] for k in CELL_KEYS) for m in meta or []), *groups]))
    rows = []
    for key in keys:
        recs = groups.get(key, [])
        m = extra.get(key, {})
        row = dict(zip(CELL_KEYS, key, strict=False))
        row.update(cell_summary(recs, burst=m.get("workload", "burst") == "burst"))
        for k in (
            "order",
            "started",
            "wall_s",
            "theoretical_prefix_hit_rate",
            "engine_prefix_hit_rate",
            "interrupted",
            "note",
            "cold_work",
            "decode_loops_hist",
        ):
            if k in m:
                row[k] = m[k]
        if m.get("interrupted"):
            row["valid"] = False
        row["cold"] = is_cold(m.get("cold_work"))
        rows.append(row)
    return rows

def fmt_ms(v: float | None, low_n: bool = False) -> str:
    """Seconds -> 'x.xx' ms for tables ('-' for missing, '*' for a p99 from few samples)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v * 1e3:.2f}{'*' if low_n else ''}"
