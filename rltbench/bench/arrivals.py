"""Open-loop arrival times: when each request of a rate cell is sent, relative to the cell's start.

Names and meanings follow vLLM `bench serve`: `rate` is the mean request rate (requests per second);
`burstiness` is the shape of the gamma distribution of the gaps between arrivals (1 = Poisson,
below 1 burstier, above 1 more regular), its scale chosen so that the mean gap stays 1 / rate.
"constant" sends one request every 1 / rate seconds; an infinite rate sends everything at once.

Why the span is pinned: n arrivals of a Poisson process at rate r span (n - 1) / r seconds only on
average (with 100 requests the realised rate is off by about 10%, one standard deviation), so a cell
would offer another rate than its target and "achieved rate short of the target" would mostly
measure that draw. `arrival_times` rescales the gaps so that the last arrival falls at exactly
(n - 1) / r. For Poisson and gamma gaps this is the process conditioned on its (n-1)-th gap sum:
normalised gamma gaps are Dirichlet and independent of their sum, so the arrivals keep the shape
of the process (uniform order statistics for Poisson) and every cell offers exactly its rate.

Everything is deterministic given the generator: the same seed gives the same times in every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POISSON = "poisson"
GAMMA = "gamma"
CONSTANT = "constant"
ARRIVAL_PROCESSES = (POISSON, GAMMA, CONSTANT)


@dataclass(frozen=True)
class ArrivalProcess:
    """How gaps between arrivals are drawn: `kind` (poisson, gamma, constant) and, for gamma, its
    shape `burstiness`."""

    kind: str = POISSON
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_PROCESSES:
            raise ValueError(f"arrival process {self.kind!r}: expected one of {', '.join(ARRIVAL_PROCESSES)}")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise ValueError(f"burstiness must be finite and > 0, not {self.burstiness}")

    @property
    def label(self) -> str:
        """'poisson', 'gamma (burstiness 0.5)' or 'constant': how the report names it."""
        return f"gamma (burstiness {self.burstiness:g})" if self.kind == GAMMA else self.kind

    def gaps(self, n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
        """`n` gaps (seconds) between successive arrivals at mean `rate` requests per second."""
        if n < 0 or not rate > 0:
            raise ValueError(f"need n >= 0 and rate > 0, not n={n}, rate={rate}")
        if math.isinf(rate):
            return np.zeros(n)
        if self.kind == CONSTANT:
            return np.full(n, 1.0 / rate)
        if self.kind == POISSON:
            return rng.exponential(1.0 / rate, size=n)
        return rng.gamma(self.burstiness, 1.0 / (rate * self.burstiness), size=n)


def arrival_times(n: int, rate: float, process: ArrivalProcess, rng: np.random.Generator,
                  pin_span: bool = True) -> np.ndarray:
    """Send times (seconds after the cell starts) of `n` requests at `rate`: the first at 0, then the
    cumulative gaps. `pin_span`: the last arrival at exactly (n - 1) / rate (module docstring)."""
    if n <= 0:
        return np.zeros(0)
    gaps = process.gaps(n - 1, rate, rng)
    times = np.concatenate(([0.0], np.cumsum(gaps)))
    total = float(times[-1])
    if pin_span and n > 1 and math.isfinite(rate) and total > 0:
        times *= ((n - 1) / rate) / total
    return times


def offered_rate(times: np.ndarray | list[float]) -> float | None:
    """The rate a schedule offers: (n - 1) / (last - first arrival); None for fewer than 2 arrivals or
    all at once."""
    if len(times) < 2:
        return None
    span = float(max(times) - min(times))
    return (len(times) - 1) / span if span > 0 else None
