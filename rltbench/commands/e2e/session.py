"""The session workload's options of `rltbench e2e --workload session`: think time between turns and
cache busting (rltbench.bench.turns), validated from the flags, and the requests of each repetition.

Each repetition's requests are built from the materialized trace: think time (one draw per request
and repetition) and the busting prefixes keyed by the repetition, the same for every arm, so arms stay
paired. The warm-up requests and the untimed warm-up pass get busting keys of their own, so on a
server whose prefix cache outlives a cell they fill nothing a timed cell could hit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rltbench.backends.base import Request
from rltbench.bench.turns import (
    CACHE_BUST_MODES,
    CACHE_BUST_OFF,
    ThinkTime,
    cache_bust,
    previous_turns,
    with_think_time,
)
from rltbench.bench.workload import Cell, allowed_ids
from rltbench.commands.e2e.defaults import SESSION
from rltbench.errors import UsageError

WARMUP_REP, PASS_REP = -1, -2  # busting keys of the warm-up requests and of the warm-up pass


@dataclass(frozen=True)
class SessionSpec:
    """The session workload's own options: think time (None: every request at its trace arrival) and
    the cache-busting mode (off, session, request)."""

    think: ThinkTime | None = None
    cache_bust: str = CACHE_BUST_OFF

    def config(self) -> dict[str, Any]:
        """What the manifest keeps."""
        return {"think_time_ms": None if self.think is None else self.think.mean * 1e3,
                "think_time_stddev_ms": None if self.think is None else self.think.stddev * 1e3,
                "cache_bust": self.cache_bust}


def _ms(flag: str, value: float | None) -> float | None:
    """A millisecond flag as seconds, checked to be finite and >= 0."""
    if value is None:
        return None
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{flag} must be a finite number of milliseconds >= 0, not {value}")
    return value / 1e3


def session_spec_of(workload: str, think_time: float | None, think_time_stddev: float | None,
                    cache_bust: str | None) -> SessionSpec | None:
    """The SessionSpec of `--workload session` (None for the other workloads, which take none of
    these flags); one line naming the flag for a bad value."""
    given = [f for f, v in (("--think-time", think_time), ("--think-time-stddev", think_time_stddev),
                            ("--cache-bust", cache_bust)) if v is not None]
    if workload != SESSION:
        if given:
            raise UsageError(f"{given[0]} is for --workload session")
        return None
    mean, stddev = _ms("--think-time", think_time), _ms("--think-time-stddev", think_time_stddev)
    if stddev is not None and mean is None:
        raise UsageError("--think-time-stddev draws around --think-time: give --think-time too")
    if cache_bust is not None and cache_bust not in CACHE_BUST_MODES:
        raise UsageError(f"--cache-bust must be {', '.join(CACHE_BUST_MODES)}, not {cache_bust!r}")
    return SessionSpec(None if mean is None else ThinkTime(mean, stddev or 0.0), cache_bust or CACHE_BUST_OFF)


def _rng(seed: int, rep: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, 0x7417, rep + 8])


def session_requests(config: Any, trace: list[Request], spec: SessionSpec, seed: int,
                     rep: int) -> list[Request]:
    """The session's requests for repetition `rep` (WARMUP_REP, PASS_REP for the warm-ups)."""
    reqs = cache_bust(trace, spec.cache_bust, rep, allowed_ids(config))
    return reqs if spec.think is None else with_think_time(reqs, spec.think, _rng(seed, rep))


def warmup_burst(config: Any, trace: list[Request], spec: SessionSpec, seed: int, n: int) -> list[Request]:
    """The warm-up burst: the first `n` prompts (busted with their own key), 4 output tokens at most."""
    firsts = session_requests(config, trace[:n], spec, seed, WARMUP_REP)
    return [Request(index=i, prompt=r.prompt, output_len=min(r.output_len, 4)) for i, r in enumerate(firsts)]


def warmup_pass(config: Any, trace: list[Request], spec: SessionSpec, seed: int) -> list[Request] | None:
    """Plan.pass_prompts: the trace with busting keys of its own (None: the first repetition's)."""
    return None if spec == SessionSpec() else session_requests(config, trace, spec, seed, PASS_REP)


def session_prompts(config: Any, trace: list[Request], spec: SessionSpec,
                    seed: int) -> Callable[[Cell, int], list[Request]]:
    """Plan.prompts of a session: the requests of each repetition, built once per repetition."""
    if spec == SessionSpec():
        return lambda cell, rep: trace
    cache: dict[int, list[Request]] = {}

    def prompts(cell: Cell, rep: int) -> list[Request]:
        if rep not in cache:
            cache.clear()
            cache[rep] = session_requests(config, trace, spec, seed, rep)
        return cache[rep]

    return prompts


def turn_facts(trace: list[Request]) -> dict[str, int]:
    """How many requests continue an earlier one (the turns think time applies to), and how many
    conversations the trace holds."""
    previous = previous_turns(trace)
    later = sum(p is not None for p in previous)
    return {"later_turns": later, "conversations": len(trace) - later}
