"""What every backend shares: the request, the per-request record, timeouts, live progress, and the one
NAME=URL parser for servers.

A backend (backends.engine.EngineBackend, backends.openai.OpenAIBackend) follows `Backend`: it has
`name`, `hosting` (one line for the report), `arms` and `supports_replay`; `warmup(arm, requests,
timeouts)` makes `arm` ready; `run_cell(arm, tag, requests, timeouts, progress=..., max_concurrency=None,
...)` serves `requests`, each sent when `SendOrder` says it is due (cell start + its arrival; a later
turn of a conversation, think time after its previous turn's response) or later while
`max_concurrency` requests are in flight, and returns a `CellResult`: one finalized record per request
and, for a timed engine cell, its schedule and cold work; `stats(arm)` gives its counters (empty for
servers). A backend with `supports_replay` is also a `ReplayBackend`.

A record is a plain dict (a row of the e2e requests.jsonl): `scheduled` (cell start + arrival),
`send` (when it was sent: `scheduled`, or later where the concurrency limit held it back or the
client fell behind), `first`, `last` (perf_counter seconds), `token_ids` (None where a server does
not return ids; then `n_tokens`), `event_times` / `event_tokens` (one entry per streamed event and
how many tokens it carried), `status` (ok, error, timeout, length_mismatch), `error`,
`finish_reason`, `prefix_hit_tokens` (prompt tokens served from a prefix cache, where the engine or
server says), `text` for text prompts, and `exit_depths` (one per token id) where the model has an
exit gate.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rltbench.errors import UsageError

if TYPE_CHECKING:  # the engine's schedule type only: the backends' shared part stays free of the engine
    from rltbench.engine.schedule import Schedule


@dataclass(frozen=True)
class Request:
    """One request. `index` pairs it across arms (same index, same prompt). Load benchmarks send token
    ids and ignore EOS (exactly `output_len` tokens); the quality gate sends text or ids that stop at
    EOS, at `stop_token_ids` or at the first `stop` string."""

    index: int
    prompt: list[int] | str
    output_len: int
    arrival: float = 0.0  # seconds after the cell starts (0 for bursts)
    hash_ids: tuple[int, ...] = ()
    ignore_eos: bool = True
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # a later turn of a conversation: sent `think` seconds after request `after` (its previous turn,
    # same cell) ended, whatever its arrival (None: sent at its arrival)
    after: int | None = None
    think: float = 0.0


@dataclass
class Timeouts:
    """Per-request limits (seconds) and the run's absolute deadline (perf_counter time, None = none)."""

    first_token: float = 300.0
    stall: float = 120.0
    deadline: float | None = None

    def deadline_passed(self, now: float | None = None) -> bool:
        return (
            self.deadline is not None and (now if now is not None else time.perf_counter()) >= self.deadline
        )

    def without_deadline(self) -> Timeouts:
        """The same per-request limits for untimed work (warm-ups), which the deadline must not cut."""
        return Timeouts(self.first_token, self.stall, None)


@dataclass
class CellProgress:
    """Live counters of the running cell, read by the display (cheap to update in the step loop)."""

    total: int = 0
    done: int = 0
    errors: int = 0
    tokens: int = 0
    start: float = 0.0
    ttfts: list[float] = field(default_factory=list)


class SendOrder:
    """When each request of a cell is due (perf_counter seconds): a request without `after` at cell
    start `t0` + its arrival; a later turn `think` seconds after its previous turn ended (its last
    token, or its failure), a time known only then (`ended`). A turn whose previous one is not in the
    cell is due at its arrival. Due requests come out earliest first, ties by index."""

    def __init__(self, requests: Sequence[Request], t0: float):
        present = {r.index for r in requests}
        self._seq = itertools.count()
        self._due: list[tuple[float, int, int, Request]] = []
        self._waiting: dict[int, list[Request]] = defaultdict(list)
        for r in requests:
            if r.after is not None and r.after in present and r.after != r.index:
                self._waiting[r.after].append(r)
            else:
                self._push(t0 + r.arrival, r)
        self.unsent = len(requests)

    def _push(self, at: float, req: Request) -> None:
        heapq.heappush(self._due, (at, req.index, next(self._seq), req))

    def next_time(self) -> float | None:
        """When the next request is due; None while every unsent one waits for a previous turn."""
        return self._due[0][0] if self._due else None

    def pop(self, now: float) -> tuple[Request, float] | None:
        """The earliest request due by `now` and its due time (None if none is due yet)."""
        if not self._due or self._due[0][0] > now:
            return None
        at, _i, _s, req = heapq.heappop(self._due)
        self.unsent -= 1
        return req, at

    def ended(self, index: int, at: float) -> None:
        """Request `index` ended at `at`: the turns that wait for it become due after their think time."""
        for req in self._waiting.pop(index, []):
            self._push(at + req.think, req)

    def unsent_requests(self) -> list[Request]:
        """Every request not yet sent (due or waiting for a previous turn), by index."""
        reqs = [e[3] for e in self._due] + [r for group in self._waiting.values() for r in group]
        return sorted(reqs, key=lambda r: r.index)


@dataclass
class CellResult:
    """What one cell of `Backend.run_cell` gives back. `records`: one finalized record per request.
    A timed cell on the in-process engine also has the `schedule` it ran (replayed on other arms),
    the `cold_work` counted in its timed window (`bench.warmth.ColdWork`) and `requests` by request id
    (what a replay of `schedule` serves); a server's cell has only records."""

    records: list[dict[str, Any]]
    schedule: Schedule | None = None
    cold_work: dict[str, int | None] = field(default_factory=dict)
    requests: dict[str, Request] = field(default_factory=dict)


class DeadlineReached(Exception):
    """The global deadline ended the run; the cell's result is attached (unfinished -> timeout), with
    the schedule and cold work of its timed window where the backend has them."""

    def __init__(self, records: list[dict[str, Any]]):
        super().__init__("global deadline reached")
        self.result = CellResult(records)

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.result.records


@runtime_checkable
class Backend(Protocol):
    """What the e2e load, the GSM8K gate and the serve soak run on: one model under test, several arms.
    Engine-only options of `run_cell` (prefix-cache reset, timed window, step hook) go in
    `engine_only`; a server backend accepts and ignores them."""

    name: str
    hosting: str
    supports_replay: bool
    arms: list[str]

    def warmup(self, arm: str, requests: Sequence[Request], timeouts: Timeouts) -> None: ...

    def run_cell(self, arm: str, tag: str, requests: Sequence[Request], timeouts: Timeouts, *,
                 progress: CellProgress | None = None, max_concurrency: int | None = None,
                 **engine_only: Any) -> CellResult: ...

    def stats(self, arm: str | None = None) -> dict[str, Any]: ...


@runtime_checkable
class ReplayBackend(Backend, Protocol):
    """A backend that can replay a recorded schedule on another arm (`supports_replay`): the identity
    verdict. `last_replay_depths`: request index -> exit depths of the last replay (exit gate)."""

    last_replay_depths: dict[int, list[int]]

    def replay(self, arm: str, schedule: Schedule, requests: dict[str, Request],
               row_invariant_tile: int | None = None) -> dict[int, list[int]]: ...


def new_record(req: Request, rid: str, send: float) -> dict[str, Any]:
    return {
        "request": req.index,
        "request_id": rid,
        "prompt_len": None if isinstance(req.prompt, str) else len(req.prompt),
        "expected_len": req.output_len if req.ignore_eos else None,
        "scheduled": send,
        "send": send,
        "first": None,
        "last": None,
        "token_ids": [],
        "event_times": [],
        "event_tokens": [],
        "status": None,
        "error": None,
        "finish_reason": None,
        "prefix_hit_tokens": None,
    }


def finalize(rec: dict[str, Any]) -> dict[str, Any]:
    """Set the final status of a request that ended without error: ok, or length_mismatch where it had
    to generate exactly `expected_len` tokens and did not."""
    if rec["status"] is None:
        n = len(rec["token_ids"]) if rec["token_ids"] is not None else int(rec.get("n_tokens") or 0)
        expected = rec.get("expected_len")
        rec["status"] = "ok" if expected is None or n == expected else "length_mismatch"
        if rec["status"] != "ok":
            rec["error"] = f"{n} tokens, expected {expected}"
    return rec


def parse_servers(items: Sequence[str]) -> dict[str, str]:
    """`--arm NAME=URL` (repeatable) -> {name: server root}. The URL may be the server root, its `/v1`
    base or its `/v1/completions` endpoint; it must start with http:// or https://."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, url = (s.strip() for s in item.partition("="))
        url = url.rstrip("/")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise UsageError(f"--arm {item!r}: expected NAME=http://host:port")
        if name in out:
            raise UsageError(f"--arm {name} given twice")
        for suffix in ("/completions", "/v1"):
            url = url.removesuffix(suffix)
        out[name] = url
    return out
