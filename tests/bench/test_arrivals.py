"""Open-loop arrivals and request lengths: the distributions the generators claim (KS goodness of fit),
the pinned span, determinism, and the length sources."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rltbench.bench.arrivals import ArrivalProcess, arrival_times, offered_rate
from rltbench.bench.lengths import LengthSource, recorded_lengths
from rltbench.bench.workload import open_loop_prompts, special_ids
from rltbench.errors import UsageError
from rltbench.models import get_config

stats = pytest.importorskip("scipy.stats")

RATES = (0.5, 4.0, 60.0)
N = 2000


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("rate", RATES)
def test_poisson_gaps_are_exponential_at_the_rate(rate):
    gaps = np.diff(arrival_times(N, rate, ArrivalProcess("poisson"), _rng(1), pin_span=False))
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    # pinned to the target rate, the gaps are those of the process conditioned on its span
    pinned = np.diff(arrival_times(N, rate, ArrivalProcess("poisson"), _rng(1)))
    assert stats.kstest(pinned, "expon", args=(0, 1 / rate)).pvalue > 0.01


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("burstiness", [0.5, 3.0])
def test_gamma_gaps_have_shape_burstiness_and_mean_one_over_rate(rate, burstiness):
    proc = ArrivalProcess("gamma", burstiness)
    for pin in (False, True):
        gaps = np.diff(arrival_times(N, rate, proc, _rng(2), pin_span=pin))
        assert stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness))).pvalue > 0.01
    # a wrong shape is told apart (the test has power)
    gaps = np.diff(arrival_times(N, rate, proc, _rng(2)))
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue < 0.01


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_pinned_span_offers_exactly_the_rate_and_is_deterministic(kind):
    proc = ArrivalProcess(kind, 0.7 if kind == "gamma" else 1.0)
    times = arrival_times(50, 8.0, proc, _rng(5))
    assert times[0] == 0 and np.all(np.diff(times) >= 0)
    assert offered_rate(times) == pytest.approx(8.0, rel=1e-12)
    assert np.array_equal(times, arrival_times(50, 8.0, proc, _rng(5)))
    if kind != "constant":
        assert not np.array_equal(times, arrival_times(50, 8.0, proc, _rng(6)))


def test_infinite_rate_sends_everything_at_once_and_bad_processes_are_refused():
    assert list(arrival_times(4, math.inf, ArrivalProcess(), _rng())) == [0.0] * 4
    assert offered_rate([0.0, 0.0]) is None and offered_rate([1.0]) is None
    for bad in (("uniform", 1.0), ("gamma", 0.0), ("gamma", math.nan), ("gamma", math.inf)):
        with pytest.raises(ValueError):
            ArrivalProcess(*bad)


def test_fixed_and_random_lengths():
    fixed = LengthSource(100, 20)
    assert fixed.fixed and fixed.draw(3, _rng()) == [(100, 20)] * 3 and fixed.longest() == 120
    rand = LengthSource(100, 20, range_ratio=0.5)
    pairs = rand.draw(4000, _rng(3))
    ins, outs = [p[0] for p in pairs], [p[1] for p in pairs]
    assert min(ins) == 50 and max(ins) == 150 and min(outs) == 10 and max(outs) == 30
    assert abs(np.mean(ins) - 100) < 2 and rand.longest() == 180 and not rand.fixed
    assert rand.draw(5, _rng(3)) == rand.draw(5, _rng(3))


def test_recorded_lengths_from_a_file_a_preset_and_the_shipped_distribution(tmp_path):
    path = tmp_path / "lens.jsonl"
    path.write_text("".join(json.dumps({"input_length": i, "output_length": 10, "x": 1}) + "\n"
                            for i in (100, 200, 5000)))
    src = recorded_lengths(str(path), 0.5, context=1000)
    assert src.pairs == ((50, 5), (100, 5)) and src.info["dropped_too_long"] == 1
    assert set(src.draw(50, _rng())) == {(50, 5), (100, 5)} and src.longest() == 105
    shipped = recorded_lengths("mooncake-conversation", 0.125, context=65536)
    assert len(shipped.pairs) > 400 and "mooncake-conversation" in shipped.label
    preset = recorded_lengths("mooncake-tiny", None, context=512)  # the preset's own length scale
    assert preset.info["length_scale"] == 0.03125 and preset.longest() <= 512
    with pytest.raises(UsageError, match="--lengths nope"):
        recorded_lengths("nope", None, 512)
    with pytest.raises(UsageError, match="no pair fits"):
        recorded_lengths(str(path), 1.0, context=20)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 3}\n')
    with pytest.raises(UsageError, match="bad.jsonl:1"):
        recorded_lengths(str(bad), 1.0, 512)


def test_open_loop_prompts_lengths_times_and_no_special_ids():
    tiny = get_config("ouro-tiny")
    times = arrival_times(6, 10.0, ArrivalProcess(), _rng())
    lens = LengthSource(30, 5, range_ratio=0.5).draw(6, _rng())
    reqs = open_loop_prompts(tiny, times, lens, seed=1, key=(0, 10000))
    assert [(len(r.prompt), r.output_len) for r in reqs] == lens
    assert [r.arrival for r in reqs] == list(times) and all(r.ignore_eos for r in reqs)
    bad = special_ids(tiny)
    assert all(t not in bad for r in reqs for t in r.prompt)
    again = open_loop_prompts(tiny, times, lens, seed=1, key=(0, 10000))
    other = open_loop_prompts(tiny, times, lens, seed=1, key=(1, 10000), ignore_eos=False)
    assert [r.prompt for r in reqs] == [r.prompt for r in again]
    assert [r.prompt for r in reqs] != [r.prompt for r in other] and not other[0].ignore_eos
