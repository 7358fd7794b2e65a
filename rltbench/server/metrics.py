"""`GET /metrics` of `rltbench serve`: server counters and histograms in Prometheus text format 0.0.4.

Written by hand (a few counters, three histograms, gauges) rather than with prometheus-client, which is
not a dependency. Request-level figures are measured by the server itself (TTFT from the arrival of
the HTTP request to the step that produced the first token, ITL between the steps that produced two
consecutive tokens of a request); KV, prefix-cache and step figures are the engine's own `stats()`.
docs/serve.md lists every series.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "rltbench_"
# Seconds. Finer than vLLM's at the low end: an H200 decode step of a 1.4B model is a few ms.
TTFT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
ITL_BUCKETS = (
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)
REQUEST_STATUSES = ("ok", "aborted", "rejected", "overloaded", "error")
FINISH_REASONS = ("stop", "length")

# engine.stats() key -> (metric name, type, help, labels). Keys missing from a stats dict are skipped,
# so an engine that gains or loses a counter never breaks the endpoint.
ENGINE_SERIES: tuple[tuple[str, str, str, str, dict[str, str]], ...] = (
    ("total_blocks", "kv_blocks_total", "gauge", "KV blocks in the pool.", {}),
    (
        "free_blocks",
        "kv_blocks_free",
        "gauge",
        "KV blocks free (evictable prefix-cache blocks included).",
        {},
    ),
    ("cached_blocks", "kv_blocks_cached", "gauge", "KV blocks holding a cached prompt prefix.", {}),
    (
        "prefix_hit_tokens",
        "prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        {},
    ),
    (
        "prefix_query_tokens",
        "prefix_cache_query_tokens_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        {},
    ),
    (
        "prefix_hit_requests",
        "prefix_cache_hit_requests_total",
        "counter",
        "Requests with at least one prompt block from the prefix cache.",
        {},
    ),
    ("prefill_steps", "engine_steps_total", "counter", "Engine steps by kind.", {"kind": "prefill"}),
    ("decode_steps", "engine_steps_total", "counter", "Engine steps by kind.", {"kind": "decode"}),
    (
        "graph_replays",
        "cuda_graph_replays_total",
        "counter",
        "CUDA-graph replays by step kind.",
        {"kind": "decode"},
    ),
    (
        "prefill_graph_replays",
        "cuda_graph_replays_total",
        "counter",
        "CUDA-graph replays by step kind.",
        {"kind": "prefill"},
    ),
    (
        "graph_captures",
        "cuda_graph_captures_total",
        "counter",
        "CUDA graphs captured, warm-up included: growth while serving means a step paid for a capture.",
        {"kind": "decode"},
    ),
    (
        "prefill_graph_captures",
        "cuda_graph_captures_total",
        "counter",
        "CUDA graphs captured, warm-up included: growth while serving means a step paid for a capture.",
        {"kind": "prefill"},
    ),
    (
        "eager_fallbacks",
        "eager_decode_steps_total",
        "counter",
        "Decode steps run eagerly although CUDA graphs are on (no bucket fits).",
        {},
    ),
)


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: `le` is an inclusive upper bound)."""

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: Mapping[str, str]) -> list[str]:
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += n
            out.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(bound))})} {acc}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class ServerMetrics:
    """What the HTTP side counts; `render` adds the engine's and the loop's gauges."""

    def __init__(self, model_name: str) -> None:
        self.labels = {"model_name": model_name}
        self.requests = dict.fromkeys(REQUEST_STATUSES, 0)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def count_request(self, status: str) -> None:
        self.requests[status] += 1

    def finish(
        self, status: str, finish_reason: str | None, prompt_tokens: int, generated: int, e2e_s: float | None
    ) -> None:
        """One request that reached the engine ended (ok, aborted or error)."""
        self.requests[status] += 1
        if finish_reason in self.finished:
            self.finished[finish_reason] += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        if e2e_s is not None and status == "ok":
            self.e2e.observe(e2e_s)

    def render(
        self, engine_stats: Mapping[str, Any], running: int, waiting: int, info: Mapping[str, str]
    ) -> str:
        lab = self.labels
        out: list[str] = []

        def series(name: str, kind: str, help_text: str, rows: list[tuple[dict[str, str], float]]) -> None:
            full = PREFIX + name
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} {kind}")
            out.extend(f"{full}{_labels({**lab, **extra})} {_num(v)}" for extra, v in rows)

        series("server_info", "gauge", "Served model, arm, device and weights (value 1).", [(dict(info), 1)])
        series(
            "requests_total",
            "counter",
            "HTTP generation requests by outcome: ok (finished), aborted (client gone), rejected (4xx), "
            "overloaded (503, queue full), error (engine failure or shutdown).",
            [({"status": s}, n) for s, n in self.requests.items()],
        )
        series(
            "requests_finished_total",
            "counter",
            "Requests that finished, by finish_reason.",
            [({"finish_reason": r}, n) for r, n in self.finished.items()],
        )
        series(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of requests that reached the engine.",
            [({}, self.prompt_tokens)],
        )
        series(
            "generation_tokens_total",
            "counter",
            "Tokens generated (aborted requests included).",
            [({}, self.generation_tokens)],
        )
        series("requests_running", "gauge", "Live requests that have produced a token.", [({}, running)])
        series(
            "requests_waiting",
            "gauge",
            "Live requests without a token yet (queued or in prefill).",
            [({}, waiting)],
        )
        for name, hist, help_text in (
            (
                "time_to_first_token_seconds",
                self.ttft,
                "HTTP request arrival to the step that produced the first token.",
            ),
            (
                "inter_token_latency_seconds",
                self.itl,
                "Time between the steps that produced consecutive tokens of a request.",
            ),
            (
                "e2e_request_latency_seconds",
                self.e2e,
                "HTTP request arrival to the last token (ok requests).",
            ),
        ):
            full = PREFIX + name
            out.append(f"# HELP {full} {help_text}")
            out.append(f"# TYPE {full} histogram")
            out.extend(hist.lines(full, lab))
        grouped: dict[str, list[tuple[str, str, dict[str, str], Any]]] = {}
        for key, name, kind, help_text, extra in ENGINE_SERIES:
            if isinstance(engine_stats.get(key), (int, float)):
                grouped.setdefault(name, []).append((kind, help_text, extra, engine_stats[key]))
        for name, rows in grouped.items():
            series(name, rows[0][0], rows[0][1], [(extra, v) for _, _, extra, v in rows])
        total, free = engine_stats.get("total_blocks"), engine_stats.get("free_blocks")
        if isinstance(total, int) and isinstance(free, int):
            series(
                "kv_blocks_used",
                "gauge",
                "KV blocks held by live requests (total - free).",
                [({}, total - free)],
            )
        return "\n".join(out) + "\n"


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)")
_MODEL_LABEL = re.compile(r'model_name="(?:[^"\\]|\\.)*",?')


def parse_text(text: str) -> dict[str, float]:
    """Prometheus text (as this server writes it) -> {'name{labels}': value}, the model_name label
    dropped so keys read like `rltbench_requests_total{status="ok"}`. For clients and checks."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise ValueError(f"not Prometheus text: {line!r}")
        labels = _MODEL_LABEL.sub("", m.group(2) or "").replace(",}", "}").replace("{}", "")
        out[m.group(1) + labels] = float(m.group(3))
    return out
