"""Paired statistics and the gate verdict (spec: /work/shared/specs/gsm8k-gate.md).

Why paired: both arms answer the *same* questions, so most of the per-question noise cancels. With
a_i, b_i in {0, 1} (reference / variant correct) and d_i = a_i - b_i, everything depends only on
n, n10 (ref right, variant wrong) and n01 (ref wrong, variant right):

    drop = (n10 - n01) / n
    SE   = sd(d) / sqrt(n), sample sd (n - 1)  ==  sqrt(((n10 + n01)/n - drop^2) / (n - 1))

All public numbers are in *points* (x100) so they compare directly with the gate `g` (points).

Verdict (mode "ucb", the default): pass if drop + 1.645 SE <= g; fail if drop > g; else inconclusive.
Mode "point": fail iff drop > g, else pass (the looser rule; never inconclusive).

Questions needed when inconclusive (``needed_n``): keep the observed per-question sd
s = SE * sqrt(n) and the observed drop (drop <= g when inconclusive); a pass needs
1.645 * s / sqrt(N) <= g - drop, so N = ceil((1.645 * s / (g - drop))^2). Under that assumption
more questions can never turn the result into a fail (drop <= g), so N is the size at which the
same outcome would pass. When drop == g exactly no N suffices (None). With n < 2 there is no sd
estimate and N is unknown (None).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

Z_ONE_SIDED_95 = 1.645
Z_TWO_SIDED_95 = 1.96

VERDICT_EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 3}
"""Exit codes of `rltbench gsm8k` (2 stays reserved for usage errors)."""

_SEVERITY = {"pass": 0, "inconclusive": 1, "fail": 2}


@dataclass(frozen=True)
class PairedStats:
    """Paired comparison of one variant arm against the reference over the same n questions."""

    n: int
    ref_correct: int
    var_correct: int
    n10: int
    n01: int
    ref_acc: float  # points
    var_acc: float  # points
    drop: float  # points, ref - variant (positive = variant worse)
    se: float  # points; nan when n < 2
    ci95_low: float  # points, two-sided 95% interval of the drop
    ci95_high: float
    ucb95: float  # points, one-sided 95% upper bound drop + 1.645 SE
    mcnemar_p: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mcnemar_exact_p(n10: int, n01: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of min(n10, n01) out of n10 + n01 at p = 1/2.

    p = min(1, 2 * P[X <= min(n10, n01)]), X ~ Bin(n10 + n01, 1/2); 1.0 when there is no discordant pair.
    """
    if n10 < 0 or n01 < 0:
        raise ValueError("discordant counts must be >= 0")
    m = n10 + n01
    if m == 0:
        return 1.0
    k = min(n10, n01)
    tail = sum(math.comb(m, i) for i in range(k + 1))
    return min(1.0, 2.0 * tail / 2.0**m)


def paired_stats(ref: list[int] | list[bool], var: list[int] | list[bool]) -> PairedStats:
    """Paired statistics of two per-question correctness vectors (same order, same questions)."""
    if len(ref) != len(var):
        raise ValueError(f"paired vectors differ in length: {len(ref)} vs {len(var)}")
    n = len(ref)
    if n == 0:
        raise ValueError("no questions to compare")
    a = [int(bool(x)) for x in ref]
    b = [int(bool(x)) for x in var]
    n10 = sum(1 for x, y in zip(a, b, strict=True) if x == 1 and y == 0)
    n01 = sum(1 for x, y in zip(a, b, strict=True) if x == 0 and y == 1)
    return stats_from_counts(n=n, ref_correct=sum(a), var_correct=sum(b), n10=n10, n01=n01)


def stats_from_counts(n: int, ref_correct: int, var_correct: int, n10: int, n01: int) -> PairedStats:
    """The same statistics from counts (used by tests and by `render` from stored rows)."""
    if n <= 0:
        raise ValueError("no questions to compare")
    if ref_correct - var_correct != n10 - n01:
        raise ValueError("inconsistent counts: ref_correct - var_correct must equal n10 - n01")
    drop = (n10 - n01) / n
    if n >= 2:
        var_d = ((n10 + n01) / n - drop * drop) / (n - 1) * 1.0
        se = math.sqrt(max(var_d, 0.0))
    else:
        se = math.nan
    d, s = 100.0 * drop, 100.0 * se
    return PairedStats(
        n=n,
        ref_correct=ref_correct,
        var_correct=var_correct,
        n10=n10,
        n01=n01,
        ref_acc=100.0 * ref_correct / n,
        var_acc=100.0 * var_correct / n,
        drop=d,
        se=s,
        ci95_low=d - Z_TWO_SIDED_95 * s,
        ci95_high=d + Z_TWO_SIDED_95 * s,
        ucb95=d + Z_ONE_SIDED_95 * s,
        mcnemar_p=mcnemar_exact_p(n10, n01),
    )


def needed_n(stats: PairedStats, gate: float) -> int | None:
    """Questions a conclusive (pass) verdict would need at the observed drop and sd; see module doc."""
    if stats.n < 2 or not math.isfinite(stats.se):
        return None
    margin = gate - stats.drop
    if margin <= 0:
        return None
    sd = stats.se * math.sqrt(stats.n)
    return max(stats.n, math.ceil((Z_ONE_SIDED_95 * sd / margin) ** 2 - 1e-9))


def verdict(stats: PairedStats, gate: float, mode: str = "ucb") -> str:
    """'pass' | 'fail' | 'inconclusive' for one variant arm (gate in points)."""
    if mode not in ("ucb", "point"):
        raise ValueError(f"unknown gate mode {mode!r}")
    if stats.drop > gate:
        return "fail"
    if mode == "point":
        return "pass"
    if math.isfinite(stats.ucb95) and stats.ucb95 <= gate:
        return "pass"
    return "inconclusive"


def overall_verdict(verdicts: list[str]) -> str:
    """The worst of the per-arm verdicts (fail > inconclusive > pass); 'pass' when there is none."""
    if not verdicts:
        return "pass"
    return max(verdicts, key=lambda v: _SEVERITY[v])


def exit_code(overall: str) -> int:
    return VERDICT_EXIT_CODES[overall]
