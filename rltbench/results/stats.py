"""Interleaved repetitions and what a difference between two arms means: ABBA order, paired ratio
intervals, the A/A noise floor and the label a speedup earns.

Why each piece exists:
- `abba_order`: arms timed one after another drift with clocks, temperature and allocator state, so
  the first arm pays for warming the device. Reversing the order every repetition (A B C, C B A, ...)
  gives every arm the same mean position.
- `paired_ratio_interval`: repetition i of arm A and of arm B ran side by side, so their ratio
  cancels what drifted between repetitions. The estimate is the median of the per-repetition ratios;
  the interval is the distribution-free interval of that median (binomial order statistics): no
  resampling, no normality, and its actual coverage is reported (few repetitions cannot reach 95%).
- `noise_label`: the same arm measured twice (the A/A arm, `torch#2`) shows how far two identical
  computations land apart in this very run. A speedup whose interval reaches into that spread is
  "within noise", never "faster".

Pure logic (no torch): the prefill and decode benchmarks use it, and so can any other command.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")

LEVEL = 0.95
WITHIN_NOISE = "within noise"
NO_AA = "no A/A arm"
NO_INTERVAL = "n/a (too few repetitions)"


def abba_order(arms: Sequence[T], reps: int) -> list[T]:
    """Arm order for `reps` repetitions, every other one reversed: A B C, C B A, A B C, ..."""
    if reps < 0:
        raise ValueError("reps must be >= 0")
    arms = list(arms)
    out: list[T] = []
    for r in range(reps):
        out.extend(arms if r % 2 == 0 else arms[::-1])
    return out


def aa_name(ref: str) -> str:
    """The name of the reference arm's second copy (the A/A arm), as `--arms torch,torch` names it."""
    return f"{ref}#2"


def base_arm(arm: str) -> str:
    """`torch#2` -> `torch`: the arm an A/A copy repeats (an arm's own name otherwise)."""
    return arm.split("#", 1)[0]


def is_aa(arm: str, ref: str) -> bool:
    """`torch#2`, `torch#3`, ... are the reference run again."""
    return arm != ref and base_arm(arm) == ref


def median_interval_ranks(n: int, level: float = LEVEL) -> tuple[int, float]:
    """(k, coverage): the interval [x_(k), x_(n+1-k)] of n sorted values covers the median with
    probability `coverage` = 1 - 2 P(Binomial(n, 1/2) < k), the largest k whose coverage >= level;
    k = 1 (min to max) when even that falls short (n < 6 at 95%), with its smaller coverage."""
    if n < 1:
        raise ValueError("n must be >= 1")
    best, best_cov = 1, 1.0 - 2.0 * 0.5**n
    cdf = 0.0
    for k in range(1, n // 2 + 1):
        cdf += math.comb(n, k - 1) * 0.5**n  # P(X <= k - 1)
        cov = 1.0 - 2.0 * cdf
        if cov >= level:
            best, best_cov = k, cov
        else:
            break
    return best, best_cov


@dataclass(frozen=True)
class RatioInterval:
    """Median of paired ratios a_i / b_i with its order-statistic interval (`coverage` is the
    interval's exact coverage of the median, `n` the pairs)."""

    estimate: float
    lo: float
    hi: float
    n: int
    coverage: float

    @property
    def spread(self) -> float:
        """How far from 1 the ratio reaches, as |log|: the noise band of an A/A ratio is
        [exp(-spread), exp(spread)]."""
        return max(abs(math.log(v)) for v in (self.estimate, self.lo, self.hi))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> RatioInterval | None:
        return None if not d else cls(**{k: d[k] for k in ("estimate", "lo", "hi", "n", "coverage")})


def paired_ratio_interval(
    a_samples: Sequence[float], b_samples: Sequence[float], level: float = LEVEL
) -> RatioInterval | None:
    """a_i / b_i for each repetition i (e.g. per-repetition median times: reference / arm is the
    arm's speedup); None with fewer than 2 usable pairs (one ratio is no evidence of a spread).
    Pairs with a non-finite or non-positive value are dropped (not measurements)."""
    if len(a_samples) != len(b_samples):
        raise ValueError(f"paired samples differ in length: {len(a_samples)} vs {len(b_samples)}")
    ratios = sorted(
        a / b
        for a, b in zip(a_samples, b_samples, strict=True)
        if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
    )
    n = len(ratios)
    if n < 2:
        return None
    k, cov = median_interval_ranks(n, level)
    return RatioInterval(statistics.median(ratios), ratios[k - 1], ratios[n - k], n, cov)


def noise_label(
    ratio: RatioInterval | None,
    aa: RatioInterval | None,
    higher: str = "faster",
    lower: str = "slower",
) -> str:
    """"within noise" when the ratio's interval overlaps the A/A band [exp(-s), exp(s)] (s = the A/A
    spread), else `higher` / `lower`; no claim without an interval or without an A/A arm."""
    if ratio is None:
        return NO_INTERVAL
    if aa is None:
        return NO_AA
    band = math.exp(aa.spread)
    if ratio.lo > band:
        return higher
    if ratio.hi < 1.0 / band:
        return lower
    return WITHIN_NOISE


def rep_medians(samples_by_rep: Sequence[Sequence[float]]) -> list[float]:
    """One value per repetition: the median of that repetition's samples (NaN for an empty one)."""
    return [statistics.median(s) if len(s) else float("nan") for s in samples_by_rep]


def compare_to_reference(
    per_rep: Mapping[str, Sequence[float]], ref: str, aa: str | None = None, level: float = LEVEL
) -> list[dict[str, Any]]:
    """For every arm but the reference: speedup = ref / arm per repetition (per_rep holds times, one
    value per repetition, in the same repetition order for every arm), its interval, the A/A spread
    (ref / aa) and the label. The A/A arm's own row is labelled "A/A"."""
    aa_iv = paired_ratio_interval(per_rep[ref], per_rep[aa], level) if aa and aa in per_rep else None
    rows = []
    for arm, times in per_rep.items():
        if arm == ref:
            continue
        iv = paired_ratio_interval(per_rep[ref], times, level)
        rows.append(
            {
                "arm": arm,
                "ref": ref,
                "speedup": iv.to_dict() if iv else None,
                "aa_spread": aa_iv.spread if aa_iv else None,
                "label": "A/A" if arm == aa else noise_label(iv, aa_iv),
            }
        )
    return rows


def format_interval(iv: Mapping[str, Any] | RatioInterval | None, digits: int = 3) -> str:
    """'1.234x (1.200-1.250)' for tables; '-' without an interval."""
    if iv is None:
        return "-"
    d = iv.to_dict() if isinstance(iv, RatioInterval) else iv
    return f"{d['estimate']:.{digits}f}x ({d['lo']:.{digits}f}-{d['hi']:.{digits}f})"


def format_spread(spread: float | None) -> str:
    """The A/A spread as a +-percentage (exp(s) - 1), '-' without an A/A arm."""
    return "-" if spread is None else f"+-{100 * math.expm1(spread):.1f}%"
