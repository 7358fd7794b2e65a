"""Serving metrics (TTFT, TPOT, ITL, E2E, throughput) of request records, as docs/contracts/e2e.md
defines them.

Inputs are per-request records (dicts, the rows of requests.jsonl): `send`, `first`, `last`
(time.perf_counter seconds), `event_times` / `event_tokens` (one entry per streamed event and how
many tokens it carried), `token_ids`, `status`, `expected_len`. Everything is recomputable from
requests.jsonl alone, which is what `rltbench report` does.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
class Percentiles:
    """p50/p90/p99 and mean of one metric's samples, with the sample count; `p99_low_n`: the p99
    comes from fewer than P99_MIN_SAMPLES samples (it is near the max)."""

    n: int
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    p99_low_n: bool

    @classmethod
    def of(cls, values: list[float | None]) -> Percentiles:
        """The quantiles of `values` (rltbench.results.quantiles; None values are left out)."""
        q = summarize(values)
        if q.n == 0:
            return cls(0, None, None, None, None, True)
        return cls(q.n, q.median, q.p90, q.p99, q.mean, bool(q.n < P99_MIN_SAMPLES))

    def row(self, metric: str) -> dict[str, Any]:
        """The flat columns of cells.csv/json: `{metric}_n`, `{metric}_p50`, ... in the files' order."""
        return {f"{metric}_{k}": v for k, v in asdict(self).items()}


def percentiles(values: list[float | None]) -> dict[str, Any]:
    """p50/p90/p99 (rltbench.results.quantiles) with the sample count and a low-count flag for p99."""
    return asdict(Percentiles.of(values))


LATENCY_METRICS = ("ttft", "tpot", "e2e", "itl")  # LatencyMetrics' fields, in the files' column order


@dataclass(frozen=True)
class LatencyMetrics:
    """TTFT, TPOT, E2E (one sample per request) and ITL (every token gap) quantiles, pooled over a
    set of requests (one cell, or the valid repetitions of one arm and cell)."""

    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles
    itl: Percentiles

    @classmethod
    def of(cls, per: list[dict[str, Any]]) -> LatencyMetrics:
        """The quantiles of the requests' metrics `per` (request_metrics of each)."""
        return cls(*(Percentiles.of([p[name] for p in per]) for name in LATENCY_METRICS[:3]),
                   Percentiles.of([x for p in per for x in p["itl"]]))

    def row(self) -> dict[str, Any]:
        """The flat columns (ttft_*, tpot_*, e2e_*, itl_*), in the files' order."""
        return {k: v for name in LATENCY_METRICS for k, v in getattr(self, name).row(name).items()}


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


@dataclass(frozen=True)
class CellMetrics:
    """One cell's (arm, C, repetition) numbers: statuses and validity, throughput, latency
    quantiles; the prefix-cache hits where the engine or server reports them (None: not reported)
    and the mean exit depth where the model has an exit gate (None: no gate)."""

    requests: int
    statuses: dict[str, int]  # status -> requests, for every status of STATUSES
    valid: bool  # every request finished ok with exactly its expected tokens
    output_tokens: int
    duration_s: float | None  # last finish - first send
    output_tok_s: float | None
    steady_tok_s: float | None  # bursts: tokens / window where every request is decoding
    latency: LatencyMetrics
    prefix_hit_tokens: int | None = None
    measured_prefix_hit_rate: float | None = None
    mean_exit_depth: float | None = None

    def row(self) -> dict[str, Any]:
        """The cell's columns of cells.csv/json (names and order as the files have always had them)."""
        out: dict[str, Any] = {
            "requests": self.requests,
            **{f"n_{s}": c for s, c in self.statuses.items()},
            "valid": self.valid,
            "output_tokens": self.output_tokens,
            "duration_s": self.duration_s,
            "output_tok_s": self.output_tok_s,
            "steady_tok_s": self.steady_tok_s,
            **self.latency.row(),
        }
        if self.prefix_hit_tokens is not None:
            out["prefix_hit_tokens"] = self.prefix_hit_tokens
            out["measured_prefix_hit_rate"] = self.measured_prefix_hit_rate
        if self.mean_exit_depth is not None:
            out["mean_exit_depth"] = self.mean_exit_depth
        return out


def cell_metrics(recs: list[dict[str, Any]], burst: bool = True) -> CellMetrics:
    """The one place a cell's metrics are computed from its records (`burst`: the steady window
    applies, every request sent at once)."""
    per = [request_metrics(r) for r in recs]
    statuses = {s: sum(1 for r in recs if r.get("status") == s) for s in STATUSES}
    tokens = sum(p["n"] for p in per)
    sends = [r["send"] for r in recs if r.get("send") is not None]
    lasts = [r["last"] for r in recs if r.get("last") is not None]
    dur = (max(lasts) - min(sends)) if sends and lasts else None
    steady = None
    if burst:
        win = steady_window(recs)
        if win is not None:
            steady = win[2] / (win[1] - win[0])
    hit_tokens = hit_rate = None
    hits = [r.get("prefix_hit_tokens") for r in recs]
    if any(h is not None for h in hits):
        prompt = sum(int(r.get("prompt_len") or 0) for r in recs)
        hit_tokens = int(sum(h or 0 for h in hits))
        hit_rate = hit_tokens / prompt if prompt else None
    depths = [d for r in recs for d in (r.get("exit_depths") or ())]
    return CellMetrics(
        requests=len(recs),
        statuses=statuses,
        valid=bool(recs) and statuses["ok"] == len(recs),
        output_tokens=tokens,
        duration_s=dur,
        output_tok_s=tokens / dur if dur and dur > 0 else None,
        steady_tok_s=steady,
        latency=LatencyMetrics.of(per),
        prefix_hit_tokens=hit_tokens,
        measured_prefix_hit_rate=hit_rate,
        mean_exit_depth=sum(depths) / len(depths) if depths else None,  # the loops its tokens used
    )


def cell_summary(recs: list[dict[str, Any]], burst: bool = True) -> dict[str, Any]:
    """`cell_metrics` as the flat row of cells.csv/json (what the files and live tables read)."""
    return cell_metrics(recs, burst).row()


@dataclass(frozen=True)
class PooledMetrics:
    """One arm and cell over its valid repetitions: latency quantiles pooled over their requests and
    the median of their cell throughputs (what the e2e throughput and latency tables print)."""

    arm: str
    cell: str
    C: int | None
    valid_reps: int
    latency: LatencyMetrics
    output_tok_s_median: float | None
    steady_tok_s_median: float | None

    def row(self) -> dict[str, Any]:
        """Flat columns (arm, cell, C, valid_reps, latency quantiles, medians), e.g. for plots."""
        return {"arm": self.arm, "cell": self.cell, "C": self.C, "valid_reps": self.valid_reps,
                **self.latency.row(), "output_tok_s_median": self.output_tok_s_median,
                "steady_tok_s_median": self.steady_tok_s_median}


def pooled_metrics(records: list[dict[str, Any]], cells: list[dict[str, Any]],
                   arms: list[str]) -> list[PooledMetrics]:
    """Per arm (in `arms` order) and cell (in run order), pooled over the valid repetitions of
    `cells` (compute_cells rows, whose throughputs `cell_metrics` computed): invalid repetitions
    count for nothing."""
    out = []
    for arm in arms:
        for cell in dict.fromkeys(c["cell"] for c in cells):
            mine = [c for c in cells if c["arm"] == arm and c["cell"] == cell and c["valid"]]
            valid_reps = {c["rep"] for c in mine}
            recs = [r for r in records if r["arm"] == arm and r["cell"] == cell and r["rep"] in valid_reps]
            tps = [c["output_tok_s"] for c in mine if c["output_tok_s"]]
            steady = [c["steady_tok_s"] for c in mine if c["steady_tok_s"]]
            out.append(PooledMetrics(
                arm=arm,
                cell=cell,
                C=next((c["C"] for c in cells if c["cell"] == cell), None),
                valid_reps=len(valid_reps),
                latency=LatencyMetrics.of([request_metrics(r) for r in recs]),
                output_tok_s_median=float(statistics.median(tps)) if tps else None,
                steady_tok_s_median=float(statistics.median(steady)) if steady else None,
            ))
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
