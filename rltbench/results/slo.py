"""Service-level objectives of a serving load: the `--slo` grammar, each cell's share of requests that
meet it (goodput), and an arm's SLO capacity: the highest request rate at which it is met.

An SLO is a set of terms `metric:ms` or `metric:pNN:ms` (ttft, tpot, e2el as vLLM names them;
milliseconds): "at least NN% of the measured requests have this metric within ms". A term without its
own quantile takes the attainment (`--slo-attainment`, default 90%, written p90). A request that did
not finish ok meets no term; a one-token output has no TPOT and cannot miss a TPOT term.

Per cell (over its measured requests, rltbench.results.rate):
- share of a term: the fraction of requests within its threshold; the term is met when that share
  reaches its quantile (its p-quantile is then within the threshold);
- slack: the smallest (share - quantile) over the terms; the cell meets the SLO when slack >= 0;
- SLO share: the fraction of requests within every threshold at once; goodput = SLO share x the
  achieved rate (requests per second that met every threshold, vLLM's goodput).

SLO capacity of one repetition of an arm: over its cells in rising rate, the highest rate whose cell
meets the SLO without saturating, moved up to where the slack, interpolated linearly to the next
(failing) rate, crosses 0 ("interpolated"); where that next rate failed only by saturating (its
slack still >= 0), half-way between the two ("saturated": a building queue breaks any latency target
given time). Where every measured rate meets it the capacity is the highest rate, a lower bound
("at least"); where none does, it is below the lowest measured rate (no value). Per arm: the median
over repetitions with the order-statistic interval of that median (rltbench.results.stats), and the
ratio to the reference arm's capacity, paired by repetition (the arms ran side by side), beside the
A/A arm's ratio.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rltbench.errors import UsageError
from rltbench.results.serving import request_metrics
from rltbench.results.stats import is_aa, median_interval_ranks, paired_ratio_interval

# --slo metric -> (label, key of rltbench.results.serving.request_metrics)
METRICS = {"ttft": ("TTFT", "ttft"), "tpot": ("TPOT", "tpot"), "e2el": ("E2EL", "e2e")}
DEFAULT_ATTAINMENT = 0.9
INTERPOLATED, AT_LEAST, SATURATED, BELOW = "interpolated", "at least", "saturated", "below"


@dataclass(frozen=True)
class SloTerm:
    """One objective: at least `quantile` of the requests have `metric` within `threshold_ms`."""

    metric: str
    quantile: float
    threshold_ms: float

    @property
    def label(self) -> str:
        """'TTFT p90 <= 500 ms'."""
        return f"{METRICS[self.metric][0]} p{self.quantile * 100:g} <= {self.threshold_ms:g} ms"

    @property
    def spec(self) -> str:
        """'ttft:p90:500': the term as --slo takes it (parses back to itself)."""
        return f"{self.metric}:p{self.quantile * 100:g}:{self.threshold_ms:g}"

    def within(self, metrics: dict[str, Any]) -> bool:
        """Whether one finished request's metrics (request_metrics) are within the threshold."""
        value = metrics[METRICS[self.metric][1]]
        if value is None:
            return self.metric == "tpot" and metrics["ttft"] is not None  # one token: no TPOT to miss
        return value * 1e3 <= self.threshold_ms


def _finite(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"--slo {spec!r}: {what} {text!r} is not a finite number")
    return value


def check_attainment(value: float) -> float:
    """`--slo-attainment` must be a share in (0, 1)."""
    if not (math.isfinite(value) and 0 < value < 1):
        raise UsageError(f"--slo-attainment must be a share between 0 and 1 (e.g. 0.9), not {value}")
    return value


def parse_slo(text: str, attainment: float = DEFAULT_ATTAINMENT) -> tuple[SloTerm, ...]:
    """`ttft:500,tpot:p99:50` -> terms; a term without a quantile takes `attainment`."""
    check_attainment(attainment)
    terms: dict[str, SloTerm] = {}
    for part in (p.strip() for p in text.split(",")):
        fields = [f.strip() for f in part.split(":")]
        if len(fields) not in (2, 3) or fields[0] not in METRICS:
            raise UsageError(f"--slo {part!r}: expected METRIC:MS or METRIC:pNN:MS with METRIC one of "
                             f"{', '.join(METRICS)} (e.g. ttft:500,tpot:p90:50)")
        quantile = attainment
        if len(fields) == 3:
            if not fields[1].startswith("p"):
                raise UsageError(f"--slo {part!r}: the quantile is written pNN (e.g. p90)")
            quantile = _finite(fields[1][1:], "quantile", part) / 100
            if not 0 < quantile < 1:
                raise UsageError(f"--slo {part!r}: the quantile must be between p0 and p100")
        ms = _finite(fields[-1], "threshold (ms)", part)
        if ms <= 0:
            raise UsageError(f"--slo {part!r}: the threshold must be > 0 ms")
        if fields[0] in terms:
            raise UsageError(f"--slo names {fields[0]} twice")
        terms[fields[0]] = SloTerm(fields[0], quantile, ms)
    return tuple(terms.values())


def slo_label(terms: Iterable[SloTerm]) -> str:
    """'TTFT p90 <= 500 ms, TPOT p90 <= 50 ms'."""
    return ", ".join(t.label for t in terms)


def cell_slo(recs: list[dict[str, Any]], terms: tuple[SloTerm, ...]) -> dict[str, Any]:
    """One cell's SLO figures over `recs` (its measured requests): each term's share, the slack, the
    SLO share and whether the cell meets the SLO (module docstring)."""
    if not recs or not terms:
        return {}
    finished = [request_metrics(r) if r.get("status") == "ok" else None for r in recs]
    within = [[m is not None and t.within(m) for m in finished] for t in terms]
    shares = [sum(col) / len(recs) for col in within]
    slack = min(s - t.quantile for s, t in zip(shares, terms, strict=True))
    out: dict[str, Any] = {f"slo_share_{t.metric}": s for t, s in zip(terms, shares, strict=True)}
    out.update(slo_share=sum(all(req) for req in zip(*within, strict=True)) / len(recs), slo_slack=slack,
               slo_met=slack >= 0)
    return out


@dataclass(frozen=True)
class Capacity:
    """The SLO capacity of one curve (requests/s), how it was found, and whether the curve was
    monotone (no failing rate below a meeting one)."""

    value: float | None
    bound: str
    monotone: bool = True


def slo_capacity(points: list[tuple[float, float]], saturated_at: float | None = None) -> Capacity | None:
    """The capacity of one repetition's curve: `points` are (rate, slack) of its cells; `saturated_at`
    the lowest rate where the arm saturated. A saturated cell fails the SLO whatever its slack (a queue
    that builds breaks any latency target given time); where its slack was still >= 0 the capacity is
    taken half-way between it and the last meeting rate. None without points."""
    pts = sorted(points)
    if not pts:
        return None
    limit = math.inf if saturated_at is None else saturated_at
    passing = [i for i, (r, s) in enumerate(pts) if s >= 0 and r < limit]
    if not passing:
        return Capacity(None, BELOW)
    k = passing[-1]
    monotone = all(s >= 0 for _, s in pts[:k])
    if k == len(pts) - 1:
        return Capacity(pts[k][0], AT_LEAST, monotone)
    (r0, s0), (r1, s1) = pts[k], pts[k + 1]
    if s1 >= 0:  # failed by saturating, not by its latency shares
        return Capacity((r0 + r1) / 2, SATURATED, monotone)
    return Capacity(r0 + (r1 - r0) * s0 / (s0 - s1), INTERPOLATED, monotone)


def arm_capacities(cells: list[dict[str, Any]], ref: str, arms: list[str]) -> list[dict[str, Any]]:
    """Per arm: its capacity per repetition, their median with its interval, and the ratio to `ref`'s
    (paired by repetition). `cells`: rate cells with arm, rep, rate, slo_slack and saturated (the
    reason, or None)."""
    curves: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    sat: dict[tuple[str, int], float] = {}
    for c in cells:
        if c.get("slo_slack") is None:
            continue
        key = (c["arm"], c["rep"])
        curves[key].append((float(c["rate"]), float(c["slo_slack"])))
        if c.get("saturated"):
            sat[key] = min(sat.get(key, math.inf), float(c["rate"]))
    reps = sorted({rep for _, rep in curves})
    per_arm: dict[str, dict[int, Capacity]] = {}
    for arm in arms:
        caps = {rep: slo_capacity(curves[(arm, rep)], sat.get((arm, rep))) for rep in reps
                if (arm, rep) in curves}
        per_arm[arm] = {rep: c for rep, c in caps.items() if c is not None}
    rows = [_capacity_row(arm, per_arm[arm]) for arm in arms if per_arm.get(arm)]
    ref_caps = per_arm.get(ref, {})
    for row in rows:
        caps = per_arm[row["arm"]]
        both = [rep for rep in caps if rep in ref_caps and caps[rep].value and ref_caps[rep].value]
        ratio = paired_ratio_interval([caps[r].value for r in both], [ref_caps[r].value for r in both])
        single = caps[both[0]].value / ref_caps[both[0]].value if len(both) == 1 else None
        row.update(ratio=ratio.to_dict() if ratio else None, aa=is_aa(row["arm"], ref), ref=ref,
                   ratio_estimate=ratio.estimate if ratio else single)
    return rows


def _capacity_row(arm: str, caps: dict[int, Capacity]) -> dict[str, Any]:
    values = sorted(c.value for c in caps.values() if c.value is not None)
    row: dict[str, Any] = {"arm": arm, "reps": len(caps), "per_rep": {r: c.value for r, c in caps.items()},
                           "bounds": sorted({c.bound for c in caps.values()}),
                           "monotone": all(c.monotone for c in caps.values()),
                           "capacity": statistics.median(values) if values else None,
                           "lo": None, "hi": None, "coverage": None}
    if len(values) >= 2:
        k, cov = median_interval_ranks(len(values))
        row.update(lo=values[k - 1], hi=values[len(values) - k], coverage=cov)
    return row


def headlines(rows: list[dict[str, Any]], terms: tuple[SloTerm, ...]) -> list[str]:
    """'exact serves 1.70x (1.62x-1.75x) the rate of torch at TTFT p90 <= 500 ms, TPOT p90 <= 50 ms
    (A/A 1.02x)' per arm other than the reference and its A/A copies."""
    aa = next((r["ratio_estimate"] for r in rows if r["aa"] and r["ratio_estimate"] is not None), None)
    aa_text = f"A/A {aa:.2f}x" if aa is not None else "no A/A arm"
    ref_bounds = set(next((r["bounds"] for r in rows if r["arm"] == r["ref"]), []))
    out = []
    for r in rows:
        if r["aa"] or r["arm"] == r["ref"]:
            continue
        if r["ratio_estimate"] is None:
            out.append(f"{r['arm']}: no SLO capacity ratio to {r['ref']} at {slo_label(terms)} (a capacity "
                       "below the lowest measured rate, or too few repetitions)")
            continue
        iv = r["ratio"]
        interval = f" ({iv['lo']:.2f}x-{iv['hi']:.2f}x)" if iv else ""
        censored = AT_LEAST in set(r["bounds"]) | ref_bounds
        bound = "; a capacity is only bounded (every measured rate met the SLO)" if censored else ""
        out.append(f"{r['arm']} serves {r['ratio_estimate']:.2f}x{interval} the rate of {r['ref']} at "
                   f"{slo_label(terms)} ({aa_text}{bound})")
    return out
