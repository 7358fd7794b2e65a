"""The one summary of a sample: count, mean, extremes and quantiles (linear interpolation, numpy's
default method), NaN/inf/None dropped (they are not measurements).

Why one: kernel timings, decode steps, profiles and serving latencies each had their own summariser,
with different key names and, in one, another quantile rule; the same samples must give the same
median in every table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

_LEVELS = (10, 25, 50, 75, 90, 99)  # p10, q1, median, q3, p90, p99


@dataclass(frozen=True)
class Quantiles:
    """Summary of samples (same unit as the samples). Empty: n = 0 and every value NaN."""

    n: int
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float
    mean: float
    p99: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}

    @classmethod
    def empty(cls) -> Quantiles:
        """No measurement (e.g. no GPU): every value NaN, never a made-up number."""
        nan = float("nan")
        return cls(0, nan, nan, nan, nan, nan, nan, nan, nan, nan)


def summarize(samples: Iterable[float | None]) -> Quantiles:
    """Count, median, p10/p90, quartiles, min/max, mean and p99 of the finite samples."""
    vals = [float(s) for s in samples if s is not None and math.isfinite(float(s))]
    if not vals:
        return Quantiles.empty()
    arr = np.asarray(vals, dtype=np.float64)
    p10, q1, median, q3, p90, p99 = (float(v) for v in np.percentile(arr, _LEVELS))
    return Quantiles(n=int(arr.size), median=median, p10=p10, p90=p90, q1=q1, q3=q3, min=float(arr.min()),
                     max=float(arr.max()), mean=float(arr.mean()), p99=p99)
