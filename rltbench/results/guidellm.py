"""guidellm's JSON report (`guidellm run ... --output kind=json,path=FILE`, version 0.8) read into
rltbench's request records, so the peer client's own timestamps go through rltbench's definitions
(rltbench.results.serving, rltbench.results.rate) beside the figures guidellm reports itself.

One benchmark of the report is one strategy run: `concurrent` (C streams; limited to C requests, one
burst of C), `constant` or `poisson` (an open loop at `rate` requests/s), and others rltbench does not
compare. Per request guidellm records `targeted_start` (when its strategy meant to send it),
`request_start` (sent), `first_token_iteration` (the first streamed chunk with output),
`last_token_iteration`, and the server's usage count of output tokens; these become a record's
`scheduled`, `send`, `first`, `last` and `n_tokens`. Its timestamps are wall-clock seconds (rltbench's
are perf_counter seconds): only differences are used.

guidellm's own figures, as its metrics define them: TTFT = first token - request start;
ITL = (last - first token) / (N - 1), which is rltbench's TPOT; its TPOT = (last token - request
start) / N includes the first token; its request rate is the successful requests over the
measurement window (first request start to last request end, the duration-weighted mean of its
rate series). Medians are over every successful request of the benchmark (no warm-up or cool-down
left out unless the scenario asked for one).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPEN_LOOP = ("constant", "poisson")  # guidellm strategies that send at a rate
STATUS_OF = {"successful": "ok", "errored": "error", "incomplete": "error"}


@dataclass(frozen=True)
class PeerBenchmark:
    """One benchmark of a guidellm report: its strategy (`concurrent`, `constant`, `poisson`, ...),
    its load (streams, or requests/s), one rltbench record per request in arrival order, and the
    figures guidellm reports (`own`)."""

    strategy: str
    load: float | None
    records: list[dict[str, Any]]
    own: dict[str, Any] = field(default_factory=dict)

    @property
    def successful(self) -> int:
        return sum(r["status"] == "ok" for r in self.records)


def _output_tokens(req: dict[str, Any]) -> int:
    """The request's output tokens as guidellm counts them: the server's usage, else its iterations."""
    for value in (req.get("output_tokens"), (req.get("output_metrics") or {}).get("total_tokens"),
                  (req.get("output_metrics") or {}).get("text_tokens"),
                  ((req.get("info") or {}).get("timings") or {}).get("token_iterations")):
        if value is not None:
            return int(value)
    return 0


def record_of(req: dict[str, Any], status: str) -> dict[str, Any]:
    """One guidellm request (a row of `requests.successful|errored|incomplete`) as an rltbench record
    (rltbench.backends.base); `request` is set by the caller (arrival order)."""
    t = (req.get("info") or {}).get("timings") or {}
    n = _output_tokens(req)
    send = t.get("request_start")
    return {
        "scheduled": t.get("targeted_start") if t.get("targeted_start") is not None else send,
        "send": send,
        "first": t.get("first_token_iteration"),
        "last": t.get("last_token_iteration"),
        "token_ids": None,
        "n_tokens": n,
        "event_times": [],
        "event_tokens": [],
        "status": status if send is not None else "error",
        "expected_len": n,
        "prompt_len": req.get("prompt_tokens"),
        "prefix_hit_tokens": req.get("cached_tokens"),
    }


def _stat(metrics: dict[str, Any], name: str, statistic: str) -> float | None:
    """One statistic of a metric over guidellm's successful requests (None where absent)."""
    return ((metrics.get(name) or {}).get("successful") or {}).get(statistic)


def own_figures(bench: dict[str, Any]) -> dict[str, Any]:
    """The figures guidellm reports for one benchmark (module docstring)."""
    m, reqs = bench.get("metrics") or {}, bench.get("requests") or {}
    return {
        "ttft_ms": _stat(m, "time_to_first_token_ms", "median"),
        "itl_ms": _stat(m, "inter_token_latency_ms", "median"),
        "tpot_ms": _stat(m, "time_per_output_token_ms", "median"),
        "output_tok_s": _stat(m, "output_tokens_per_second", "mean"),
        "request_rate": _stat(m, "requests_per_second", "mean"),
        "successful": len(reqs.get("successful") or []),
        "errored": len(reqs.get("errored") or []),
        "incomplete": len(reqs.get("incomplete") or []),
    }


def _load(strategy: dict[str, Any]) -> float | None:
    for key in ("rate", "streams"):
        if strategy.get(key) is not None:
            return float(strategy[key])
    return None


def read_benchmark(bench: dict[str, Any]) -> PeerBenchmark:
    """One benchmark of a report: its strategy, load, records (arrival order) and own figures."""
    strategy = (bench.get("config") or {}).get("strategy") or {}
    kind = str(strategy.get("type_") or ("concurrent" if "streams" in strategy else "?"))
    recs = [record_of(r, STATUS_OF[group]) for group in STATUS_OF
            for r in (bench.get("requests") or {}).get(group) or []]
    recs.sort(key=lambda r: (r["scheduled"] is None, r["scheduled"] or 0.0))
    for i, r in enumerate(recs):
        r["request"] = i
    return PeerBenchmark(kind, _load(strategy), recs, own_figures(bench))


def read_report(path: Path | str) -> list[PeerBenchmark]:
    """Every benchmark of a guidellm JSON report, in the order it ran. A report of a committed run
    is kept gzipped (`guidellm.json.gz`: a few MB of per-request records as text)."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data = json.loads(raw)
    return [read_benchmark(b) for b in data.get("benchmarks") or []]
