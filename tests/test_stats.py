"""Interleaving and noise labels (rltbench/results/stats.py): pure logic, CPU only."""

from __future__ import annotations

import math

import pytest

from rltbench.results import stats


def test_abba_order_reverses_every_repetition() -> None:
    assert stats.abba_order(["A", "B"], 4) == ["A", "B", "B", "A", "A", "B", "B", "A"]
    order = stats.abba_order(["t", "e", "a", "t#2"], 2)
    assert order == ["t", "e", "a", "t#2", "t#2", "a", "e", "t"]
    # every arm has the same mean position over an even number of repetitions
    pos = {a: [i % 4 for i, x in enumerate(order) if x == a] for a in ("t", "e", "a", "t#2")}
    assert len({sum(p) / len(p) for p in pos.values()}) == 1
    assert stats.abba_order(["A"], 0) == []
    with pytest.raises(ValueError):
        stats.abba_order(["A"], -1)


def test_aa_names() -> None:
    assert stats.aa_name("torch") == "torch#2"
    assert stats.is_aa("torch#2", "torch") and stats.is_aa("torch#3", "torch")
    assert not stats.is_aa("torch", "torch") and not stats.is_aa("exact", "torch")


@pytest.mark.parametrize(("n", "k", "coverage"), [(2, 1, 0.5), (5, 1, 0.9375), (6, 1, 0.96875),
                                                  (8, 1, 0.9921875), (10, 2, 0.978515625)])
def test_median_interval_ranks(n: int, k: int, coverage: float) -> None:
    assert stats.median_interval_ranks(n) == (k, pytest.approx(coverage))


def test_paired_ratio_interval_pairs_by_repetition() -> None:
    # a drifts upward by repetition; the per-repetition ratio is always 2 (pairing cancels the drift)
    a = [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    b = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    iv = stats.paired_ratio_interval(a, b)
    assert iv is not None
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (2.0, 2.0, 2.0, 6)
    assert iv.coverage == pytest.approx(0.96875)
    assert iv.spread == pytest.approx(math.log(2.0))
    assert stats.RatioInterval.from_dict(iv.to_dict()) == iv
    # unpaired-looking spread: min..max of the ratios for n = 6
    iv = stats.paired_ratio_interval([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [1.0] * 6)
    assert iv is not None and (iv.lo, iv.hi) == (0.9, 1.1)


def test_paired_ratio_interval_edge_cases() -> None:
    assert stats.paired_ratio_interval([1.0], [1.0]) is None  # one ratio: no interval
    assert stats.paired_ratio_interval([1.0, float("nan"), 2.0], [1.0, 1.0, 0.0]) is None
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired_ratio_interval([1.0, 2.0], [1.0])


def _iv(est: float, lo: float, hi: float) -> stats.RatioInterval:
    return stats.RatioInterval(est, lo, hi, 8, 0.99)


def test_noise_label() -> None:
    aa = _iv(1.0, 0.98, 1.03)  # spread log(1.03): band [0.971, 1.03]
    assert stats.noise_label(_iv(1.5, 1.4, 1.6), aa) == "faster"
    assert stats.noise_label(_iv(0.5, 0.4, 0.6), aa) == "slower"
    assert stats.noise_label(_iv(1.05, 1.02, 1.08), aa) == stats.WITHIN_NOISE  # lo inside the band
    assert stats.noise_label(_iv(1.05, 1.031, 1.08), aa) == "faster"
    assert stats.noise_label(_iv(0.96, 0.95, 0.975), aa) == stats.WITHIN_NOISE
    assert stats.noise_label(None, aa) == stats.NO_INTERVAL
    assert stats.noise_label(_iv(1.5, 1.4, 1.6), None) == stats.NO_AA
    assert stats.noise_label(_iv(2.0, 1.9, 2.1), aa, higher="better", lower="worse") == "better"


def test_compare_to_reference_labels_every_arm() -> None:
    per_rep = {
        "torch": [10.0, 10.2, 9.9, 10.1, 10.0, 10.05],
        "exact": [5.0, 5.1, 4.95, 5.05, 5.0, 5.0],
        "approx": [10.1, 10.0, 10.0, 10.2, 9.95, 10.1],
        "torch#2": [10.1, 10.0, 10.0, 10.0, 10.1, 10.0],
    }
    rows = {r["arm"]: r for r in stats.compare_to_reference(per_rep, "torch", "torch#2")}
    assert set(rows) == {"exact", "approx", "torch#2"}
    assert rows["exact"]["label"] == "faster"
    assert rows["exact"]["speedup"]["estimate"] == pytest.approx(2.0, 0.01)
    assert rows["approx"]["label"] == stats.WITHIN_NOISE
    assert rows["torch#2"]["label"] == "A/A"
    assert rows["exact"]["aa_spread"] == pytest.approx(rows["approx"]["aa_spread"])
    assert rows["exact"]["aa_spread"] > 0
    no_aa = stats.compare_to_reference({k: v for k, v in per_rep.items() if k != "torch#2"}, "torch")
    assert {r["label"] for r in no_aa} == {stats.NO_AA}


def test_rep_medians_and_formatting() -> None:
    assert stats.rep_medians([[1.0, 3.0, 2.0], [4.0]]) == [2.0, 4.0]
    assert math.isnan(stats.rep_medians([[]])[0])
    assert stats.format_interval(_iv(1.2344, 1.2, 1.25)) == "1.234x (1.200-1.250)"
    assert stats.format_interval(None) == "-"
    assert stats.format_spread(math.log(1.03)) == "+-3.0%"
    assert stats.format_spread(None) == "-"
