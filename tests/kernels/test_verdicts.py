"""The kernels verdicts as pure logic: rounds, which pairs are compared, what the A/A spread decides."""

from __future__ import annotations

import pytest

from rltbench.results import kernel_verdicts as vd


def test_round_medians_split_the_samples_in_stored_order() -> None:
    assert vd.round_medians([1, 2, 3, 10, 20, 30], 2) == [2, 20]
    with pytest.raises(ValueError, match="do not split"):
        vd.round_medians([1, 2, 3], 2)


def test_pairs_are_each_arm_against_torch_and_kernel_arms_against_exact() -> None:
    pairs = vd.compared_pairs(["torch", "exact", "approx", "cuda", "torch#2", "exact#2", "liger"])
    assert pairs == [("torch", "exact"), ("torch", "approx"), ("torch", "cuda"), ("torch", "torch#2"),
                     ("exact", "exact#2"), ("torch", "liger"),
                     ("exact", "approx"), ("exact", "cuda"), ("exact", "liger")]
    assert vd.compared_pairs(["torch", "approx"]) == [("torch", "approx")]


def _records(times: dict[str, list[float]], rounds: int) -> list[dict]:
    return [{"arm": a, "samples_us": t, "rounds": rounds} for a, t in times.items()]


def test_a_difference_inside_the_aa_spread_is_noise() -> None:
    rounds = 20
    jitter = [1.0 + 0.02 * ((i * 7) % 5 - 2) for i in range(rounds)]   # +-4% from round to round
    torch_t = [10.0 * j for j in jitter]
    aa_t = [10.0 * j * (1.03 if i % 2 else 0.97) for i, j in enumerate(jitter)]   # A/A lands 3% apart
    out = {r["arm"]: r for r in vd.case_verdicts(_records(
        {"torch": torch_t, "exact": [t / 1.01 for t in torch_t],     # 1% faster: inside the A/A spread
         "approx": [t / 2 for t in torch_t], "torch#2": aa_t}, rounds)) if r["ref"] == "torch"}
    assert out["exact"]["verdict"] == "within noise"
    assert out["exact"]["ratio"] == pytest.approx(1.01)
    assert out["approx"]["verdict"] == "faster" and out["torch#2"]["verdict"] == vd.AA
    assert out["approx"]["aa_spread"] > 0.02


def test_slower_is_said_when_the_interval_is_outside_the_spread() -> None:
    base = [5.0] * 10
    rows = vd.case_verdicts(_records({"torch": [10.0] * 10, "exact": base, "exact#2": base,
                                      "cuda": [5.5] * 10}, 10))
    cuda = next(r for r in rows if r["arm"] == "cuda" and r["ref"] == "exact")
    assert cuda["verdict"] == "slower" and cuda["ratio"] == pytest.approx(5.0 / 5.5)


def test_records_without_rounds_give_no_verdicts() -> None:
    samples = [{"op": "rmsnorm", "dtype": "bf16", "width": 8, "tokens": 1, "mode": "graph", "arm": a,
                "samples_us": [1.0, 2.0]} for a in ("torch", "exact", "torch#2")]
    assert vd.verdicts(samples) == []
    with_rounds = [{**s, "rounds": 2} for s in samples]
    assert {r["verdict"] for r in vd.verdicts(with_rounds)} == {"A/A", "within noise"}
    assert vd.verdicts([*with_rounds, {**with_rounds[0], "arm": "copy"}], skip=("copy",)) == \
        vd.verdicts(with_rounds)
