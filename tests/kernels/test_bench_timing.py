"""Pure logic of rltbench.bench.timing (interleave order, statistics, rotation sizing) + GPU smoke."""

from __future__ import annotations

import math

import pytest
import torch

from rltbench.bench import timing


def test_interleave_order_alternates_forward_and_reverse():
    assert timing.interleave_order(["A", "B", "C"], 4) == list("ABCCBAABCCBA")
    assert timing.interleave_order(["A"], 3) == ["A", "A", "A"]
    assert timing.interleave_order(["A", "B"], 0) == []
    with pytest.raises(ValueError):
        timing.interleave_order(["A"], -1)


def test_interleave_order_balances_slots_and_mean_position():
    names = ["torch", "exact", "approx", "liger"]
    order = timing.interleave_order(names, 6)
    for n in names:
        assert order.count(n) == 6
    # over an even number of rounds every arm has the same mean position inside a round
    k = len(names)
    means = {n: sum(i % k for i, x in enumerate(order) if x == n) / 6 for n in names}
    assert len({round(v, 9) for v in means.values()}) == 1


def test_is_tie_uses_spread():
    a = timing.summarize([10, 11, 12, 13, 14])
    b = timing.summarize([12, 12.5, 13, 13.5, 14])
    c = timing.summarize([30, 30.5, 31, 31.5, 32])
    assert timing.is_tie(a, b)
    assert not timing.is_tie(a, c)


def test_rotation_sets_exceed_factor_times_l2():
    l2 = 50 * 2**20
    for per_set in (33_554_432, 10_000_000, 1_000_000, 123_457):
        plan = timing.rotation_sets(per_set, l2, factor=3.0, min_sets=2, max_sets=10_000)
        assert plan.rotated_bytes > 3 * l2
        assert (plan.sets - 1) * per_set <= 3 * l2 or plan.sets == 2  # smallest such count
        assert plan.covers_l2 and not plan.needs_flush


def test_rotation_sets_clamps_and_flags_flush():
    l2 = 50 * 2**20
    tiny = timing.rotation_sets(8192, l2, max_sets=64)
    assert tiny.sets == 64 and tiny.needs_flush
    huge = timing.rotation_sets(10 * l2, l2, min_sets=2)
    assert huge.sets == 2 and huge.covers_l2
    with pytest.raises(ValueError):
        timing.rotation_sets(0, l2)
    with pytest.raises(ValueError):
        timing.rotation_sets(10, l2, min_sets=5, max_sets=4)


def test_gbps():
    assert timing.gbps(2e9, 1.0) == pytest.approx(2.0)
    assert math.isnan(timing.gbps(1e9, float("nan")))
    assert math.isnan(timing.gbps(1e9, 0.0))


def test_profiler_count_is_none_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    assert timing.count_kernels_profiler(lambda: None) is None


def _graph(k: int):
    xs = [torch.randn(1024, 1024, device="cuda") for _ in range(k)]
    return xs, timing.GraphCalls(lambda i: (xs[i] * 2.0 + 1.0,), k)  # 2 kernels per call (mul, add)


@pytest.mark.gpu
def test_graph_calls_rotate_count_nodes_and_time():
    """Graph of K calls on distinct sets: outputs per set, kernel nodes, positive timings, copy GB/s."""
    k = 4
    xs, g = _graph(k)
    for x in xs:
        x.add_(1.0)  # new contents: the replay must read them
    g.replay()
    torch.cuda.synchronize()
    for i in range(k):
        assert torch.equal(g.outputs[i][0], xs[i] * 2.0 + 1.0)  # every call read its own set
    assert g.kernel_nodes in (None, 2 * k)
    times = timing.time_interleaved({"a": g.replay, "b": g.replay}, calls=k, rounds=4, reps=5)
    assert len(times["a"]) == 20 and all(t > 0 for t in times["a"])
    flusher = timing.L2Flusher("cuda")
    assert flusher.buffer.numel() * 4 > 2 * timing.l2_cache_bytes()
    copy = timing.measure_copy_bandwidth("cuda", nbytes=64 * 2**20, samples=5)
    assert copy["gbps"] > 50


@pytest.mark.gpu
def test_profiler_counts_eager_and_graph_kernels():
    k = 3
    xs, g = _graph(k)
    eager = timing.count_kernels_profiler(lambda: [xs[i] * 2.0 + 1.0 for i in range(k)], k)
    assert eager == pytest.approx(2.0)
    assert timing.count_kernels_profiler(g.replay, k) == pytest.approx(2.0)  # kernels inside a graph replay




@pytest.mark.gpu
def test_plain_loops_count_their_samples_and_calls():
    """The single-runner loops: one sample per call / per window, every call made, results handed back."""
    calls = []
    x = torch.randn(256, 256, device="cuda")

    def run():
        calls.append(1)
        return x @ x

    assert len(timing.time_calls(run, iters=5, warmup=2)) == 5 and len(calls) == 7
    assert len(timing.time_consecutive(run, 4)) == 4 and len(calls) == 11
    windows = timing.time_windows(run, windows=3, calls_per_window=2)
    assert len(windows) == 3 and len(calls) == 17 and all(t > 0 for t in windows)
    gpu_ms, wall_ms, out = timing.time_synced_call(run)
    assert out.shape == (256, 256) and gpu_ms > 0 and wall_ms > 0
