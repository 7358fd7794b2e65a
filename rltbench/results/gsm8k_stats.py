"""Paired statistics and the gate verdict: a pass needs evidence, never a standard error of zero.

Both arms answer the *same* questions, so everything depends on n and the discordant counts n10
(reference right, variant wrong) and n01 (reference wrong, variant right). With m = n10 + n01:

    drop = (n10 - n01) / n = (m / n) * (2 p - 1),   p = n10 / m

The true drop is D = pi_d (2 P - 1), with pi_d the discordance rate (m ~ Bin(n, pi_d)) and P the
share of discordant questions the variant gets wrong (n10 | m ~ Bin(m, P)). All public numbers
are in *points* (x100), like the gate g.

Bounds: exact Clopper-Pearson (CP), one-sided 95% each. The 5% is split in two halves: a CP bound
on pi_d (from m out of n) and a CP bound on P (from n10 out of m, valid conditionally on every m and
so unconditionally). On the event that both hold (probability >= 95% by Bonferroni),

    UCB = U_d (2 U_p - 1)  when U_p >= 1/2,  else  L_d (2 U_p - 1)
    LCB = L_d (2 L_p - 1)  when L_p >  1/2,  else  U_d (2 L_p - 1)

bound D from above / below (D is monotone in pi_d once the sign of 2P - 1 is fixed). Why this
and not the alternatives:
- the normal bound drop + 1.645 SE has SE = 0 at zero discordance and passed anything there;
- Newcombe's paired interval (method 10) has the correlation phi = 1 at zero discordance and its
  width |dl - du| collapses to 0 at 50% accuracy, so it too passes with no evidence;
- bounding only P with m / n taken as known gives 0 at m = 0: with 0 discordant questions out of
  87 the discordance rate may still be 4%, and so may the drop. Here m = 0 gives U_p = 1 and
  UCB = U_d = 1 - 0.025^(1/n) (4.15 points at n = 87, 0.28 at n = 1319).
The price of exactness and of the split is width: about 1.5x the normal bound at 10% discordance.
Pure Python (regularized incomplete beta by continued fraction): scipy is not a dependency.

Verdict per variant arm (the gate g >= 0 points):
- an arm whose kernels never ran (scope graph without CUDA graphs: it ran torch's ops) is
  "inconclusive: not exercised: ..." (exit 3) whatever its outputs: identical sequences there
  compare torch with itself.
- **identical**: every generated sequence equals the reference's (token ids where the backend has
  them, else text). Exit 0, and no statistics are needed: equal outputs score equally.
- otherwise, with **random weights**: "inconclusive: random weights" (exit 3) whatever the
  numbers, because random weights score near 0% in every arm and agree on being wrong.
- **pass** iff UCB <= g (exit 0); **fail** iff LCB > g (exit 1): a fail also needs evidence, a
  point estimate above the gate with a bound below it is not one; else **inconclusive** (exit 3).
The looser point rule (fail iff drop > g, else pass) is gone: it passed without evidence.

Questions needed (`needed_n`, inconclusive arms): the smallest N for which the same bounds decide
the gate when the observed rates n10 / n and n01 / n stay as they are (counts scaled to N; CP bounds
take real counts through the incomplete beta). A pass is sought when drop < g, a fail when
drop > g; drop == g (including g = 0 with no discordance) can never be decided: None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

ALPHA = 0.05
"""One-sided level of each drop bound (a 95% bound), split evenly between the two CP bounds."""

NEEDED_N_CAP = 1_000_000
"""Largest question count `needed_n` looks at; beyond it the gate is undecidable in practice."""

VERDICT_EXIT_CODES = {"identical": 0, "pass": 0, "fail": 1, "inconclusive": 3}
"""Exit codes of `rltbench gsm8k` (2 stays reserved for usage errors)."""

RANDOM_WEIGHTS_REASON = "random weights"

_SEVERITY = {"identical": 0, "pass": 1, "inconclusive": 2, "fail": 3}


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
    se: float  # points, normal-approximation SE (information only: it decides nothing); nan if n < 2
    lcb95: float  # points, exact one-sided 95% lower bound of the drop
    ucb95: float  # points, exact one-sided 95% upper bound of the drop
    mcnemar_p: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- exact binomial bounds --------------------------------------------------------------------
def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for k in range(1, 100_000):
        k2 = 2 * k
        for num in (
            k * (b - k) * x / ((a - 1.0 + k2) * (a + k2)),
            -(a + k) * (a + b + k) * x / ((a + k2) * (a + 1.0 + k2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            step = c * d
            h *= step
        if abs(step - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for real a, b > 0 (the binomial tail for real counts)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def _solve_increasing(f: Any, target: float) -> float:
    """p in [0, 1] with f(p) = target for an increasing f (bisection to double precision)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _check_counts(x: float, m: float, alpha: float) -> None:
    if not (0.0 <= x <= m) or not 0.0 < alpha < 1.0:
        raise ValueError(f"need 0 <= x <= m and 0 < alpha < 1, got x={x}, m={m}, alpha={alpha}")


def cp_upper(x: float, m: float, alpha: float) -> float:
    """Clopper-Pearson one-sided upper bound of a proportion after x successes in m trials:
    the p at which P[X <= x] = alpha (I_p(x + 1, m - x) = 1 - alpha). 1 when x == m (or m == 0)."""
    _check_counts(x, m, alpha)
    if x >= m:
        return 1.0
    if x == 0:
        return 1.0 - alpha ** (1.0 / m)
    return _solve_increasing(lambda p: betainc(x + 1.0, m - x, p), 1.0 - alpha)


def cp_lower(x: float, m: float, alpha: float) -> float:
    """Clopper-Pearson one-sided lower bound: the p at which P[X >= x] = alpha
    (I_p(x, m - x + 1) = alpha). 0 when x == 0."""
    _check_counts(x, m, alpha)
    if x <= 0:
        return 0.0
    if x >= m:
        return alpha ** (1.0 / m)
    return _solve_increasing(lambda p: betainc(x, m - x + 1.0, p), alpha)


def drop_bounds(n: float, n10: float, n01: float, alpha: float = ALPHA) -> tuple[float, float]:
    """(LCB, UCB) of the drop as fractions, each one-sided at level 1 - alpha (see module doc).

    Counts may be real (for `needed_n`); m = 0 leaves P unbounded (U_p = 1, L_p = 0), so the bounds
    are then +-U_d, the discordance rate's bound.
    """
    m = n10 + n01
    half = alpha / 2.0
    d_lo, d_hi = cp_lower(m, n, half), cp_upper(m, n, half)
    p_lo = cp_lower(n10, m, half) if m > 0 else 0.0
    p_hi = cp_upper(n10, m, half) if m > 0 else 1.0
    ucb = (d_hi if p_hi >= 0.5 else d_lo) * (2.0 * p_hi - 1.0)
    lcb = (d_lo if p_lo > 0.5 else d_hi) * (2.0 * p_lo - 1.0)
    return lcb, ucb


# ---- paired statistics --------------------------------------------------------------------------
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
    return min(1.0, 2 * tail / 2**m)  # integer true division: 2.0**m overflows from m = 1024


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
    if n10 < 0 or n01 < 0 or n10 + n01 > n:
        raise ValueError(f"discordant counts n10={n10}, n01={n01} do not fit in n={n}")
    if ref_correct - var_correct != n10 - n01:
        raise ValueError("inconsistent counts: ref_correct - var_correct must equal n10 - n01")
    drop = (n10 - n01) / n
    se = math.sqrt(max(((n10 + n01) / n - drop * drop) / (n - 1), 0.0)) if n >= 2 else math.nan
    lcb, ucb = drop_bounds(n, n10, n01)
    return PairedStats(
        n=n,
        ref_correct=ref_correct,
        var_correct=var_correct,
        n10=n10,
        n01=n01,
        ref_acc=100.0 * ref_correct / n,
        var_acc=100.0 * var_correct / n,
        drop=100.0 * drop,
        se=100.0 * se,
        lcb95=100.0 * lcb,
        ucb95=100.0 * ucb,
        mcnemar_p=mcnemar_exact_p(n10, n01),
    )


# ---- verdicts -----------------------------------------------------------------------------------
def check_gate(gate: float) -> None:
    """A gate is a finite number of points in [0, 100]; anything else decides nothing."""
    if not isinstance(gate, (int, float)) or not math.isfinite(gate) or not 0.0 <= gate <= 100.0:
        raise ValueError(f"the gate must be a finite number of points in [0, 100], got {gate}")


def bound_verdict(stats: PairedStats, gate: float) -> str:
    """'pass' | 'fail' | 'inconclusive' from the exact bounds alone (gate in points)."""
    check_gate(gate)
    if stats.ucb95 <= gate:
        return "pass"
    if stats.lcb95 > gate:
        return "fail"
    return "inconclusive"


def gate_verdict(
    stats: PairedStats, gate: float, sequences_differ: int, random_weights: bool,
    not_exercised: str | None = None,
) -> tuple[str, str | None]:
    """(verdict, reason) of one variant arm; reason is None unless the numbers were overruled.
    `not_exercised`: why the arm's kernels never ran, if they did not (its outputs are then torch's
    and decide nothing)."""
    check_gate(gate)
    if not_exercised:
        return "inconclusive", not_exercised
    if sequences_differ == 0:
        return "identical", None
    if random_weights:
        return "inconclusive", RANDOM_WEIGHTS_REASON
    return bound_verdict(stats, gate), None


def verdict_label(verdict: str, reason: str | None = None) -> str:
    """How a verdict is printed: 'inconclusive: random weights', 'pass', ..."""
    return f"{verdict}: {reason}" if reason else verdict


def needed_n(stats: PairedStats, gate: float, cap: int = NEEDED_N_CAP) -> int | None:
    """Questions the same bounds need to decide the gate at the observed rates; see module doc.

    None when no size decides it (drop == gate) or more than `cap` questions would be needed.
    """
    check_gate(gate)
    g = gate / 100.0
    r10, r01 = stats.n10 / stats.n, stats.n01 / stats.n
    drop = r10 - r01
    if drop == g:
        return None

    def decided(size: int) -> bool:
        lcb, ucb = drop_bounds(size, size * r10, size * r01)
        return ucb <= g if drop < g else lcb > g

    if decided(stats.n):
        return stats.n
    lo, hi = stats.n, stats.n
    while not decided(hi):  # the bounds tighten towards the observed drop as the size grows
        if hi >= cap:
            return None
        lo, hi = hi, min(cap, 2 * hi)
    while hi - lo > 1:  # invariant: not decided at lo, decided at hi
        mid = (lo + hi) // 2
        if decided(mid):
            hi = mid
        else:
            lo = mid
    return hi


def overall_verdict(verdicts: list[tuple[str, str | None]]) -> tuple[str, str | None]:
    """The worst (verdict, reason) of the arms (fail > inconclusive > pass > identical)."""
    if not verdicts:
        return "identical", None
    worst = max(_SEVERITY[v] for v, _ in verdicts)
    same = [(v, r) for v, r in verdicts if _SEVERITY[v] == worst]
    return next(((v, r) for v, r in same if r), same[0])


def exit_code(overall: str) -> int:
    return VERDICT_EXIT_CODES[overall]
