"""Paired statistics, exact bounds and the verdict table against hand-computed values.

The verdict rule is in rltbench/results/gsm8k_stats.py's docstring. The old rule passed with SE = 0 (no
discordant question, whatever the sequences) and failed on one question; these tests pin the
evidence-based rule.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from rltbench.results.gsm8k_stats import (
    NEEDED_N_CAP,
    RANDOM_WEIGHTS_REASON,
    VERDICT_EXIT_CODES,
    bound_verdict,
    check_gate,
    cp_lower,
    cp_upper,
    drop_bounds,
    exit_code,
    gate_verdict,
    mcnemar_exact_p,
    needed_n,
    overall_verdict,
    paired_stats,
    stats_from_counts,
    verdict_label,
)


def _counts(n: int, n10: int, n01: int, both: int = 0):
    """Stats of n questions: `both` right in both arms, n10 / n01 discordant, the rest wrong in both."""
    return stats_from_counts(n=n, ref_correct=both + n10, var_correct=both + n01, n10=n10, n01=n01)


def _binom_cdf(x: int, m: int, p: float) -> float:
    return sum(math.comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(x + 1))


# ---- Clopper-Pearson ------------------------------------------------------------------------------
def test_clopper_pearson_closed_forms() -> None:
    """x = 0 and x = m: P[X = 0] = (1 - p)^m = alpha; x = 1 of 2: 1 - U^2 = alpha, (1 - L)^2 = 1 - alpha."""
    for m in (1, 2, 5, 87, 1319):
        for alpha in (0.025, 0.05):
            assert cp_upper(0, m, alpha) == pytest.approx(1 - alpha ** (1 / m), rel=1e-12)
            assert cp_lower(m, m, alpha) == pytest.approx(alpha ** (1 / m), rel=1e-12)
            assert (cp_lower(0, m, alpha), cp_upper(m, m, alpha)) == (0.0, 1.0)
    assert cp_upper(1, 2, 0.05) == pytest.approx(math.sqrt(0.95), abs=1e-12)
    assert cp_lower(1, 2, 0.05) == pytest.approx(1 - math.sqrt(0.95), abs=1e-12)
    assert (cp_lower(0, 0, 0.05), cp_upper(0, 0, 0.05)) == (0.0, 1.0)  # no trials: no information


def test_clopper_pearson_matches_published_tables() -> None:
    """Two-sided 95% exact intervals (each side 2.5%): 1/10 -> [0.0025, 0.4450], 5/10 -> [0.1871, 0.8129]."""
    assert (cp_lower(1, 10, 0.025), cp_upper(1, 10, 0.025)) == (
        pytest.approx(0.002529, abs=5e-6),
        pytest.approx(0.445016, abs=5e-6),
    )
    assert (cp_lower(5, 10, 0.025), cp_upper(5, 10, 0.025)) == (
        pytest.approx(0.187086, abs=5e-6),
        pytest.approx(0.812914, abs=5e-6),
    )


@pytest.mark.parametrize(("x", "m"), [(1, 3), (3, 10), (4, 5), (17, 87), (60, 70), (132, 1319)])
def test_clopper_pearson_solves_its_defining_binomial_tails(x: int, m: int) -> None:
    for alpha in (0.025, 0.05):
        assert _binom_cdf(x, m, cp_upper(x, m, alpha)) == pytest.approx(alpha, abs=1e-10)
        assert 1 - _binom_cdf(x - 1, m, cp_lower(x, m, alpha)) == pytest.approx(alpha, abs=1e-10)


def test_clopper_pearson_agrees_with_scipy_on_real_counts() -> None:
    beta = pytest.importorskip("scipy.stats").beta  # not a dependency; a cross-check where present
    rng = random.Random(3)
    for _ in range(200):
        m = rng.choice([1.5, 7.0, 87.0, 1319.0, 25000.5])
        x = rng.uniform(0.01, m - 0.01)
        assert cp_upper(x, m, 0.025) == pytest.approx(beta.ppf(0.975, x + 1, m - x), abs=1e-11)
        assert cp_lower(x, m, 0.025) == pytest.approx(beta.ppf(0.025, x, m - x + 1), abs=1e-11)


def test_clopper_pearson_rejects_impossible_counts() -> None:
    for args in ((-1, 5, 0.05), (6, 5, 0.05), (1, 5, 0.0), (1, 5, 1.0)):
        with pytest.raises(ValueError):
            cp_upper(*args)


# ---- drop bounds ------------------------------------------------------------------------------------
def test_zero_discordance_bound_is_the_discordance_rate_bound_not_zero() -> None:
    """m = 0: the share P is unbounded, so UCB = U_d = 1 - 0.025^(1/n): 4.15 points at n = 87."""
    st = _counts(87, 0, 0, both=62)
    assert (st.drop, st.se) == (0.0, 0.0)  # the old rule's UCB: 0 + 1.645 * 0
    assert st.ucb95 == pytest.approx(100 * (1 - 0.025 ** (1 / 87)), rel=1e-12)
    assert st.ucb95 == pytest.approx(4.151, abs=1e-3) and st.lcb95 == -st.ucb95
    assert _counts(1319, 0, 0).ucb95 == pytest.approx(100 * (1 - 0.025 ** (1 / 1319)), rel=1e-12)


def test_drop_bounds_hand_computed() -> None:
    # n = 2, one discordant each way: U_d = 1, U_p = sqrt(0.975) (1 - U^2 = 0.025)
    lcb, ucb = drop_bounds(2, 1, 1)
    assert ucb == pytest.approx(2 * math.sqrt(0.975) - 1, abs=1e-12) and lcb == pytest.approx(-ucb)
    # 6 of 6 wrong in the variant: L_d = L_p = 0.025^(1/6) > 1/2, LCB = L_d (2 L_p - 1)
    low = 0.025 ** (1 / 6)
    assert drop_bounds(6, 6, 0)[0] == pytest.approx(low * (2 * low - 1), abs=1e-12)
    # 5 of 5: L_p = 0.025^(1/5) < 1/2, the lower bound is U_d (2 L_p - 1) = 2 * 0.025^(1/5) - 1 < 0
    assert drop_bounds(5, 5, 0) == (pytest.approx(2 * 0.025 ** 0.2 - 1, abs=1e-12), 1.0)
    # general case from its parts: 60 / 10 discordant of 1319
    d_lo, p_lo = cp_lower(70, 1319, 0.025), cp_lower(60, 70, 0.025)
    d_hi, p_hi = cp_upper(70, 1319, 0.025), cp_upper(60, 70, 0.025)
    assert drop_bounds(1319, 60, 10) == (
        pytest.approx(d_lo * (2 * p_lo - 1), abs=1e-14),
        pytest.approx(d_hi * (2 * p_hi - 1), abs=1e-14),
    )


def test_bounds_are_mirror_images_and_bracket_the_drop() -> None:
    rng = random.Random(5)
    for _ in range(100):
        n = rng.randint(1, 400)
        n10 = rng.randint(0, n)
        n01 = rng.randint(0, n - n10)
        st, mirror = _counts(n, n10, n01), _counts(n, n01, n10)
        assert st.lcb95 <= st.drop <= st.ucb95
        assert mirror.ucb95 == pytest.approx(-st.lcb95, abs=1e-9)


def test_bound_coverage_by_simulation() -> None:
    """The UCB covers the true drop in >= 95% of draws, also where discordance is rare (the m = 0 case)."""
    rng = random.Random(11)
    for n, p10, p01 in ((87, 0.01, 0.0), (87, 0.03, 0.01), (200, 0.006, 0.004)):
        true = 100 * (p10 - p01)
        covered = 0
        for _ in range(400):
            draws = [rng.random() for _ in range(n)]
            n10 = sum(1 for u in draws if u < p10)
            n01 = sum(1 for u in draws if p10 <= u < p10 + p01)
            covered += _counts(n, n10, n01).ucb95 >= true
        assert covered / 400 >= 0.95, (n, p10, p01, covered)


# ---- paired statistics ---------------------------------------------------------------------------
def test_hand_computed_case() -> None:
    st = paired_stats([1] * 5 + [1] * 3 + [0] + [0], [1] * 5 + [0] * 3 + [1] + [0])
    assert (st.n10, st.n01, st.ref_correct, st.var_correct) == (3, 1, 8, 6)
    assert st.drop == pytest.approx(20.0)  # (3 - 1) / 10
    assert st.se == pytest.approx(20.0)  # sqrt((0.4 - 0.04) / 9) = 0.2, information only
    assert st.mcnemar_p == pytest.approx(2 * (1 + 4) / 16)  # X ~ Bin(4, 1/2), P[X <= 1] doubled
    assert (st.lcb95, st.ucb95) == tuple(pytest.approx(100 * b) for b in drop_bounds(10, 3, 1))


def test_se_equals_sample_sd_definition_on_random_vectors() -> None:
    rng = random.Random(7)
    for _ in range(20):
        n = rng.randint(2, 200)
        ref = [rng.random() < 0.6 for _ in range(n)]
        var = [r if rng.random() < 0.8 else not r for r in ref]
        d = [int(a) - int(b) for a, b in zip(ref, var, strict=True)]
        st = paired_stats(ref, var)
        assert st.drop == pytest.approx(100 * statistics.mean(d))
        assert st.se == pytest.approx(100 * statistics.stdev(d) / math.sqrt(n), abs=1e-9)


def test_bad_vectors_and_counts() -> None:
    for ref, var in (([], []), ([1], [1, 0])):
        with pytest.raises(ValueError):
            paired_stats(ref, var)
    with pytest.raises(ValueError):
        stats_from_counts(n=3, ref_correct=3, var_correct=0, n10=3, n01=1)  # 4 discordant of 3


def test_mcnemar() -> None:
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(3, 9) == mcnemar_exact_p(9, 3)
    assert mcnemar_exact_p(0, 10) == pytest.approx(2 / 1024)
    # over 1023 discordant questions 2.0**m overflowed a float (possible on the full 1319)
    assert mcnemar_exact_p(600, 588) == pytest.approx(0.7496, abs=1e-3)
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 0)


# ---- the verdict table -------------------------------------------------------------------------------
@pytest.mark.parametrize("random_weights", [False, True])
@pytest.mark.parametrize("n", [1, 2, 5, 87])
def test_all_sequences_identical_is_identical_at_any_n(n: int, random_weights: bool) -> None:
    st = _counts(n, 0, 0)
    assert gate_verdict(st, 1.0, sequences_differ=0, random_weights=random_weights) == ("identical", None)
    assert gate_verdict(st, 0.0, sequences_differ=0, random_weights=random_weights) == ("identical", None)
    assert exit_code("identical") == 0


def test_zero_discordance_with_differing_sequences_needs_enough_questions() -> None:
    """The old rule passed here (SE = 0). At n = 87 the drop may still be 4.15 points: inconclusive
    until n >= ln(0.025) / ln(0.99) = 367.04; at n = 1319 the bound is 0.28 points: pass."""
    st87 = _counts(87, 0, 0, both=62)
    assert gate_verdict(st87, 1.0, sequences_differ=5, random_weights=False) == ("inconclusive", None)
    assert needed_n(st87, 1.0) == math.ceil(math.log(0.025) / math.log(0.99)) == 368
    assert gate_verdict(_counts(368, 0, 0), 1.0, 5, False) == ("pass", None)
    assert gate_verdict(_counts(367, 0, 0), 1.0, 5, False) == ("inconclusive", None)
    assert gate_verdict(_counts(1319, 0, 0), 1.0, 5, False) == ("pass", None)
    # a zero gate is never met without identical sequences: no size decides it
    assert gate_verdict(_counts(1319, 0, 0), 0.0, 5, False) == ("inconclusive", None)
    assert needed_n(_counts(1319, 0, 0), 0.0) is None


@pytest.mark.parametrize(
    ("n", "n10", "n01"),
    [(1, 0, 0), (1, 1, 0), (1, 0, 1), (2, 1, 0), (2, 2, 0), (2, 1, 1), (5, 0, 0), (5, 5, 0), (5, 0, 5)],
)
def test_small_n_never_decides_without_identical_sequences(n: int, n10: int, n01: int) -> None:
    """One question wrong used to be a fail and one agreeing question (SE undefined) could never
    pass; neither 1, 2 nor 5 questions carry 95% evidence for a 1-point gate either way."""
    st = _counts(n, n10, n01)
    assert gate_verdict(st, 1.0, sequences_differ=1, random_weights=False) == ("inconclusive", None)
    assert needed_n(st, 1.0) is None or needed_n(st, 1.0) > n


def test_six_of_six_wrong_is_the_smallest_all_wrong_fail() -> None:
    assert bound_verdict(_counts(5, 5, 0), 1.0) == "inconclusive"
    assert bound_verdict(_counts(6, 6, 0), 1.0) == "fail"
    assert needed_n(_counts(5, 5, 0), 1.0) == 6


@pytest.mark.parametrize(("n10", "n01"), [(0, 0), (2, 2), (60, 10), (0, 40)])
def test_random_weights_overrule_every_number(n10: int, n01: int) -> None:
    """Random weights score ~0% in every arm: 81/87 differing sequences 'passed' the old gate."""
    st = _counts(1319, n10, n01)
    v = gate_verdict(st, 1.0, sequences_differ=81, random_weights=True)
    assert v == ("inconclusive", RANDOM_WEIGHTS_REASON)
    assert verdict_label(*v) == "inconclusive: random weights" and exit_code(v[0]) == 3


def test_drop_above_the_gate() -> None:
    clear = _counts(1319, 60, 10)  # drop 3.79, LCB 2.10 > 1
    assert clear.drop == pytest.approx(100 * 50 / 1319)
    assert clear.lcb95 == pytest.approx(2.104, abs=1e-3) and bound_verdict(clear, 1.0) == "fail"
    assert exit_code("fail") == 1
    # the study's approx RMSNorm (4 / 1 of 87, drop 3.45) was a 'fail' on its point estimate alone;
    # its lower bound is negative: inconclusive, with the size that would decide it
    rms = stats_from_counts(n=87, ref_correct=62, var_correct=59, n10=4, n01=1)
    assert rms.drop == pytest.approx(3.45, abs=0.005) and rms.lcb95 < 0 < 1.0 < rms.ucb95
    assert bound_verdict(rms, 1.0) == "inconclusive"
    assert needed_n(rms, 1.0) == 578


def test_verdict_boundaries() -> None:
    st = _counts(1319, 66, 66)
    assert bound_verdict(st, st.ucb95) == "pass"  # the bound exactly at the gate passes
    assert bound_verdict(st, math.nextafter(st.ucb95, 0)) == "inconclusive"
    fail = _counts(1319, 60, 10)
    assert bound_verdict(fail, fail.lcb95) == "inconclusive"  # a fail needs LCB strictly above the gate


@pytest.mark.parametrize("gate", [math.nan, math.inf, -math.inf, -0.5, 100.5])
def test_meaningless_gates_are_rejected(gate: float) -> None:
    with pytest.raises(ValueError):
        check_gate(gate)
    with pytest.raises(ValueError):
        needed_n(_counts(87, 1, 1), gate)


# ---- questions needed ----------------------------------------------------------------------------------
def _decides(n10_rate: float, n01_rate: float, size: int, gate: float) -> bool:
    lcb, ucb = drop_bounds(size, size * n10_rate, size * n01_rate)
    drop = n10_rate - n01_rate
    return ucb <= gate / 100 if drop < gate / 100 else lcb > gate / 100


@pytest.mark.parametrize(("n", "n10", "n01", "gate"), [(87, 4, 1, 1.0), (87, 1, 1, 1.0), (1319, 66, 66, 1.0),
                                                       (87, 0, 2, 0.5), (200, 3, 0, 0.2)])
def test_needed_n_is_the_smallest_deciding_size(n: int, n10: int, n01: int, gate: float) -> None:
    got = needed_n(_counts(n, n10, n01), gate)
    assert got is not None and got > n
    assert _decides(n10 / n, n01 / n, got, gate) and not _decides(n10 / n, n01 / n, got - 1, gate)


def test_needed_n_monotonicity() -> None:
    # the further the drop below the gate, the fewer questions (discordance fixed at 20 of 1000)
    sizes = [needed_n(_counts(1000, 10 - k, 10 + k), 1.0) for k in range(0, 10)]
    assert all(a >= b for a, b in zip(sizes, sizes[1:], strict=False)) and sizes[0] > sizes[-1]
    # the more discordance at the same (zero) drop, the more questions (0 and 1 pair: 1000 suffice)
    sizes = [needed_n(_counts(1000, k, k), 1.0) for k in (0, 1, 5, 20, 50)]
    assert sizes[:2] == [1000, 1000] and all(a < b for a, b in zip(sizes[1:], sizes[2:], strict=False))
    # the looser the gate, the fewer questions (down to the 1000 observed, which decide a 2-point gate)
    sizes = [needed_n(_counts(1000, 20, 20), g) for g in (0.5, 1.0, 1.5, 2.0)]
    assert sizes[0] > sizes[1] > sizes[2] > sizes[3] == 1000
    # and the bound itself only tightens as the same rates are seen over more questions
    ucbs = [drop_bounds(size, size * 0.02, size * 0.01)[1] for size in range(50, 5000, 50)]
    assert all(a >= b for a, b in zip(ucbs, ucbs[1:], strict=False))


def test_needed_n_unknown_when_nothing_decides() -> None:
    assert needed_n(_counts(100, 2, 1), 1.0) is None  # drop == gate
    assert needed_n(_counts(1319, 600, 588), 1.0) is None  # drop 0.91: beyond NEEDED_N_CAP questions
    assert NEEDED_N_CAP >= 1_000_000


def test_overall_and_exit_codes() -> None:
    rw = ("inconclusive", RANDOM_WEIGHTS_REASON)
    assert overall_verdict([("identical", None), ("identical", None)]) == ("identical", None)
    assert overall_verdict([("identical", None), ("pass", None)]) == ("pass", None)
    assert overall_verdict([("identical", None), rw]) == rw
    assert overall_verdict([("pass", None), ("inconclusive", None), rw]) == rw
    assert overall_verdict([("fail", None), ("inconclusive", None)]) == ("fail", None)
    assert [exit_code(v) for v in ("identical", "pass", "fail", "inconclusive")] == [0, 0, 1, 3]
    assert 2 not in VERDICT_EXIT_CODES.values()
