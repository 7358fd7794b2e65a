"""The GPU timing path of the benchmark, run on CPU with the CUDA pieces faked.

Real CUDA timing needs a GPU (see test_bench_gpu.py); this checks everything around it: rotation
sets really feed different inputs to each call, samples become medians/spreads, GB/s, % copy,
speedup over torch, counted kernels, the graph-output check, and the plots of a timed run.
"""

from __future__ import annotations

import pytest
import torch

from rltbench.bench import kernel_sweep as bench
from rltbench.bench import timing, warmth
from rltbench.commands.kernels import report
from rltbench.results import RunDir

ARM_MEDIANS = {"torch": 10.0, "exact": 5.0, "approx": 4.0}
MEDIANS = {**ARM_MEDIANS, bench.SIZE_COPY: 4.5}


class FakeGraph:
    instances: list[FakeGraph] = []

    def __init__(self, call, k, warmup=2, keep_graph=True, keep_outputs=None):
        self.k = k
        self.keep_outputs = keep_outputs
        self.call = call
        self.outputs = [call(i) for i in range(k)]
        self.kernel_nodes = 3 * k
        FakeGraph.instances.append(self)

    def replay(self):
        self.outputs = [self.call(i) for i in range(self.k)]


COLD_INSIDE: list[int] = []  # compiles to pretend happened inside the next timed window
TIMED: list[dict] = []   # per time_interleaved call: its runners and hooks


def fake_time_interleaved(runners, calls=1, rounds=10, reps=10, warmup=3, before_sample=None, window=None,
                          before_slot=None):
    TIMED.append({"runners": list(runners), "before_sample": before_sample, "before_slot": before_slot})
    order = timing.interleave_order(list(runners), rounds)
    assert all(order.count(n) == rounds for n in runners)
    out = {}
    for name in runners:
        runners[name]()  # the runner must be callable as the timer would call it
        base = MEDIANS.get(name, MEDIANS.get(name.split("#")[0]))   # an A/A copy times as its arm
        out[name] = [base * (0.9 + 0.2 * i / (rounds * reps - 1)) for i in range(rounds * reps)]
    assert window is not None  # every timed mode is checked for cold work
    with window:
        warmth.TRITON_COMPILES.count += COLD_INSIDE.pop() if COLD_INSIDE else 0
    return out


class FakeFlusher:
    def flush(self):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeGraph.instances = []
    TIMED.clear()
    monkeypatch.setattr(timing, "GraphCalls", FakeGraph)
    monkeypatch.setattr(timing, "time_interleaved", fake_time_interleaved)
    monkeypatch.setattr(timing, "count_kernels_profiler", lambda run, calls=1: 2.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    return timing.l2_cache_bytes


def _ctx(l2: int) -> bench.TimingContext:
    return bench.TimingContext(torch.device("cpu"), l2, {"gbps": 100.0, "bytes": 1}, FakeFlusher())


def test_case_rows_with_timings(fake_cuda, tmp_path):
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact", "approx"], modes=["graph", "eager"], repeats=20)
    case = bench.Case("silu_mul", "bf16", 16, 2)
    rows, samples = bench.case_rows(case, cfg.arms, torch.device("cpu"), cfg, _ctx(1024))
    by_arm = {r["arm"]: r for r in rows}
    nbytes = 3 * 2 * 16 * 2
    # sets: smallest count over 3 x 1024 bytes
    assert by_arm["exact"]["rotation_sets"] == 3 * 1024 // nbytes + 1
    assert not by_arm["exact"]["l2_flush"] and by_arm["exact"]["l2_flush_per_slot"]
    # rotation keeps the data cold; each slot of the graph and eager timings starts from a flushed L2
    assert [(t["before_sample"], t["before_slot"] is not None) for t in TIMED] == [(None, True), (None, True)]
    graph = FakeGraph.instances[0]
    sets = by_arm["exact"]["rotation_sets"]
    assert graph.k == by_arm["exact"]["graph_calls"] == max(sets, cfg.min_graph_calls)
    assert graph.keep_outputs == sets   # outputs rotate over as many buffers as the inputs
    firsts = [tuple(o[0].flatten().tolist()) for o in graph.outputs]
    assert len(set(firsts)) == sets  # every set is read, call i reads set i % sets
    assert all(firsts[i] == firsts[i % sets] for i in range(graph.k))
    assert len(set(firsts[:sets])) == sets
    for arm, r in by_arm.items():
        assert r["status"] == "ok", r
        assert r["nbytes"] == nbytes
        # the same-size copy: timed in the interleaving, as the arm's share of its speed
        assert r["graph_size_copy_us"] == pytest.approx(4.5)
        assert r["graph_pct_size_copy"] == pytest.approx(100 * 4.5 / MEDIANS[arm])
        for mode in ("graph", "eager"):
            assert r[f"{mode}_us_median"] == pytest.approx(MEDIANS[arm], rel=1e-6)
            assert r[f"{mode}_us_p10"] < r[f"{mode}_us_median"] < r[f"{mode}_us_p90"]
            assert r[f"{mode}_us_n"] == 20
            assert r[f"{mode}_speedup"] == pytest.approx(10.0 / MEDIANS[arm])
            gb = nbytes / (MEDIANS[arm] * 1e-6) / 1e9
            assert r[f"{mode}_gbps"] == pytest.approx(gb)
            assert r[f"{mode}_pct_copy"] == pytest.approx(gb)  # copy = 100 GB/s
        assert r["graph_kernels_per_call"] == 3.0 and r["eager_kernels_per_call"] == 2.0
    assert by_arm["exact"]["graph_mismatches"] == 0 and by_arm["torch"]["graph_mismatches"] == 0
    timed = {(a, m) for a in ARM_MEDIANS for m in ("graph", "eager")} | {(bench.SIZE_COPY, "graph")}
    assert {(s["arm"], s["mode"]) for s in samples} == timed
    copy_graph = FakeGraph.instances[len(ARM_MEDIANS)]   # captured after the arms, same calls and outputs
    assert copy_graph.k == graph.k and copy_graph.keep_outputs == sets
    assert copy_graph.outputs[0].numel() * 4 * 2 == nbytes   # half the bytes read, as many written
    assert all(r["graph_warm"] and r["eager_warm"] for r in rows)
    assert report.cold_rows(report.pd.DataFrame(rows)) == 0

    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    for r in rows:
        run.append_jsonl(report.ROWS, r)
    written = report.write_outputs(run, report.load_rows(run), {"device": "cuda", "copy": {"gbps": 100.0}})
    for name in ("latency_graph_bf16.png", "speedup_graph_bf16.png", "latency_eager_bf16.png", "table.md"):
        assert name in written and (tmp_path / "run" / name).stat().st_size > 0
    table = (tmp_path / "run" / "table.md").read_text()
    assert "5.00 (4.50-5.50)" in table or "5.00 (" in table
    assert "| % same-size copy |" in table and "| 90.0 |" in table   # exact: 4.5 / 5.0
    assert report.rich_table(report.load_rows(run)).columns[-1].header == "x torch"


def test_tiny_inputs_flush_l2(fake_cuda):
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[1], dtypes=["fp32"], widths=[8],
                            arms=["torch", "exact"], modes=["graph"], repeats=5, max_sets=6)
    rows, _ = bench.case_rows(bench.Case("silu_mul", "fp32", 8, 1), cfg.arms, torch.device("cpu"), cfg,
                              _ctx(50 * 2**20))
    r = rows[1]
    assert r["rotation_sets"] == 6 and r["l2_flush"] is True and r["l2_flush_per_slot"] is False
    assert r["graph_calls"] == 6   # flushed before each sample: each set read once per replay
    assert TIMED[0]["before_sample"] is not None and TIMED[0]["before_slot"] is None
    assert r["eager_us_median"] != r["eager_us_median"]  # NaN: eager mode was not asked for


def test_output_window_rotates_buffers() -> None:
    """Call 0's output is kept for the check; of the rest only the last window - 1 stay alive, so
    call i can reuse the memory of call i - window (freed just before it runs)."""
    import gc
    import weakref

    class Out:
        pass

    win = timing.OutputWindow(3)
    refs = []
    for i in range(8):
        o = Out()
        refs.append(weakref.ref(o))
        win.add(i, o)
        del o
        gc.collect()
        alive = [j for j, r in enumerate(refs) if r() is not None]
        assert alive == [0] + list(range(max(1, i - 1), i + 1)), (i, alive)
    assert len(win.kept) == 1
    keep_all = timing.OutputWindow(None)
    for i in range(4):
        keep_all.add(i, i)
    assert keep_all.kept == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        timing.OutputWindow(0)


def test_hot_mode_replays_one_input_set(fake_cuda, tmp_path):
    """--mode hot: a graph of min_graph_calls calls on input set 0 with one reused output (L2-hot),
    reported in hot_* fields beside the cold graph figure, with its own column and plots."""
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph", "hot"], repeats=20)
    case = bench.Case("silu_mul", "bf16", 16, 2)
    rows, samples = bench.case_rows(case, cfg.arms, torch.device("cpu"), cfg, _ctx(1024))
    cold, hot = FakeGraph.instances[0], FakeGraph.instances[-1]
    assert hot.k == cfg.min_graph_calls and hot.keep_outputs == 1
    assert TIMED[-1]["before_slot"] is None     # L2-hot: each arm's own data stays where it is
    firsts = {tuple(o[0].flatten().tolist()) for o in hot.outputs}
    assert len(firsts) == 1                                        # every call reads set 0
    assert len({tuple(o[0].flatten().tolist()) for o in cold.outputs}) > 1
    by_arm = {r["arm"]: r for r in rows}
    for arm, r in by_arm.items():
        assert r["hot_us_median"] == pytest.approx(MEDIANS[arm], rel=1e-6)
        assert r["hot_speedup"] == pytest.approx(10.0 / MEDIANS[arm])
        assert r["hot_kernels_per_call"] == 3.0
        assert r["eager_us_median"] != r["eager_us_median"]       # not asked for
    assert {s["mode"] for s in samples} == {"graph", "hot"}
    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    for r in rows:
        run.append_jsonl(report.ROWS, r)
    written = report.write_outputs(run, report.load_rows(run), {"device": "cuda", "copy": {"gbps": 100.0}})
    assert "latency_hot_bf16.png" in written
    table = (tmp_path / "run" / "table.md").read_text()
    assert "hot us (p10-p90)" in table
    headers = [c.header for c in report.rich_table(report.load_rows(run)).columns]
    assert "hot us" in headers


def test_hot_column_hidden_when_not_timed(fake_cuda):
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph"], repeats=5)
    rows, _ = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                              _ctx(1024))
    import pandas as pd

    headers = [c.header for c in report.rich_table(pd.DataFrame(rows)).columns]
    assert "graph us" in headers and "hot us" not in headers


def test_headline_is_the_plain_launch_and_pdl_is_beside_it(fake_cuda, monkeypatch, tmp_path):
    """Every headline graph is captured with PDL off (pdl.plain_launches); an arm whose tuned launch
    mode for the case is PDL (here approx, as the tuned approx norm at T >= 1024) is captured again
    with it and timed in the same interleaving, into graph_pdl_* fields, shown labelled PDL."""
    from rltbench.kernels import pdl

    plain_at_capture = []

    class RecordingGraph(FakeGraph):
        def __init__(self, *a, **k):
            plain_at_capture.append(pdl._plain_depth > 0)
            super().__init__(*a, **k)

    monkeypatch.setattr(timing, "GraphCalls", RecordingGraph)
    modes = {"torch": 0, "exact": 0, "approx": 2}
    seen = []

    def fake_mode(run):
        run()
        seen.append(len(seen))
        return list(modes.values())[len(seen) - 1]

    monkeypatch.setattr(bench, "tuned_pdl_mode", fake_mode)
    monkeypatch.setitem(MEDIANS, "approx+pdl", 3.5)
    cfg = bench.BenchConfig(ops=["rmsnorm"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact", "approx"], modes=["graph"], repeats=20)
    rows, samples = bench.case_rows(bench.Case("rmsnorm", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                                    _ctx(1024))
    # three plain headline graphs, one PDL graph, then the plain same-size copy
    assert plain_at_capture == [True, True, True, False, True]
    by_arm = {r["arm"]: r for r in rows}
    a = by_arm["approx"]
    assert a["graph_us_median"] == pytest.approx(4.0) and a["graph_pct_copy"] == pytest.approx(
        a["nbytes"] / 4e-6 / 1e9)                           # headline: the plain launch
    assert a["graph_pdl_us_median"] == pytest.approx(3.5) and a["graph_pdl_mode"] == 2
    assert a["graph_pdl_pct_copy"] == pytest.approx(a["nbytes"] / 3.5e-6 / 1e9)
    assert a["graph_pdl_speedup"] == pytest.approx(10.0 / 3.5)
    assert a["graph_pdl_mismatches"] == a["graph_mismatches"]  # same kernels, same bits
    assert "graph_pdl_us_median" not in by_arm["exact"] and "graph_pdl_us_median" not in by_arm["torch"]
    assert {(s["arm"], s["mode"]) for s in samples} >= {("approx", "graph"), ("approx", "graph-pdl")}

    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    for r in rows:
        run.append_jsonl(report.ROWS, r)
    report.write_outputs(run, report.load_rows(run), {"device": "cuda", "copy": {"gbps": 100.0}})
    table = (tmp_path / "run" / "table.md").read_text()
    assert "PDL us (p10-p90)" in table and "PDL % copy" in table and report.PDL_NOTE in table
    approx_line = next(ln for ln in table.splitlines() if ln.startswith("| rmsnorm | bf16 | 16 | 2 | approx"))
    assert "3.50 (" in approx_line
    headers = [c.header for c in report.rich_table(report.load_rows(run)).columns]
    assert headers[-2:] == ["PDL us", "PDL %copy"]


def test_pdl_columns_hidden_without_pdl_timings(fake_cuda):
    import pandas as pd

    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph"], repeats=5)
    rows, _ = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                              _ctx(1024))
    df = pd.DataFrame(rows)
    assert "PDL" not in report.markdown_table(df, {}, {})
    assert "PDL us" not in [c.header for c in report.rich_table(df).columns]


def test_cold_work_inside_a_timed_mode_is_flagged(fake_cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(warmth.TRITON_COMPILES, "available", True)
    COLD_INSIDE[:] = [0, 1]  # popped from the end: the graph window compiles once, eager does not
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph", "eager"], repeats=4)
    rows, samples = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                                    _ctx(1024))
    assert all(not r["graph_warm"] and r["eager_warm"] for r in rows)
    assert {s["mode"]: s["cold_work"]["compiles"] for s in samples} == {"graph": 1, "eager": 0}
    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    run.extend_jsonl(report.ROWS, rows)
    report.write_outputs(run, report.load_rows(run), {"device": "cuda", "copy": {"gbps": 100.0}})
    assert "**2 row(s) timed with cold work" in (tmp_path / "run" / "table.md").read_text()


def test_verdicts_need_an_aa_arm_and_come_from_the_samples(fake_cuda, tmp_path):
    """With the A/A arm torch#2 every pair gets a direction: exact (5 us) and approx (4 us) are
    faster than torch (10 us), approx is faster than exact, a copy of exact is within noise of it;
    the verdicts are re-computed from samples.jsonl (rounds stored with every sample)."""
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact", "approx", "exact#2", "torch#2"], modes=["graph", "hot"],
                            repeats=40)
    rows, samples = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                                    _ctx(1024))
    assert all(s["rounds"] == bench.MAX_ROUNDS for s in samples)
    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    run.extend_jsonl(report.ROWS, rows)
    run.extend_jsonl(report.SAMPLES, samples)
    written = report.write_outputs(run, report.load_rows(run), {"device": "cuda", "copy": {"gbps": 100.0}})
    assert "verdicts.csv" in written
    df, vrows = report.load_run(run)
    by = {(r["mode"], r["arm"], r["ref"]): r for r in vrows}
    for mode in ("graph", "hot"):
        assert by[(mode, "exact", "torch")]["verdict"] == "faster"
        assert by[(mode, "exact", "torch")]["ratio"] == pytest.approx(2.0)
        assert by[(mode, "approx", "exact")]["verdict"] == "faster"
        assert by[(mode, "exact#2", "exact")]["verdict"] == "A/A"
        assert by[(mode, "torch#2", "torch")]["verdict"] == "A/A"
        assert by[(mode, "exact", "torch")]["aa_spread"] == pytest.approx(0.0)
    assert not any(r["arm"] == bench.SIZE_COPY for r in vrows)   # a reference, not an arm
    assert dict(zip(df["arm"], df["verdict"], strict=True)) == {
        "torch": "", "exact": "faster", "approx": "faster", "exact#2": "A/A", "torch#2": "A/A"}
    table = (tmp_path / "run" / "table.md").read_text()
    assert "## Verdicts" in table and "| approx vs exact |" in table and "| vs torch |" in table
    arms_in_order = [ln.split("|")[5].strip() for ln in table.splitlines() if ln.startswith("| silu_mul")][:5]
    assert arms_in_order == ["torch", "torch#2", "exact", "exact#2", "approx"]   # copies beside their arm
    assert "verdict" in [c.header for c in report.rich_table(df).columns]
    assert report.rich_verdicts(vrows).row_count == 2 * 1   # approx vs exact per mode (exact#2 is its A/A)


def test_without_an_aa_arm_no_pair_gets_a_direction(fake_cuda, tmp_path):
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph"], repeats=20)
    rows, samples = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                                    _ctx(1024))
    run = RunDir.create("kernels", result_dir=tmp_path / "run", argv=["test"], config={})
    run.extend_jsonl(report.ROWS, rows)
    run.extend_jsonl(report.SAMPLES, samples)
    df, vrows = report.load_run(run)
    assert [r["verdict"] for r in vrows] == ["no A/A arm"]
    assert vrows[0]["ratio"] == pytest.approx(2.0)   # the estimate is still there, without a direction


def test_each_slot_starts_with_an_untimed_run(monkeypatch):
    """After a slot's sync the device is idle: the next slot's first timed sample would include the
    host's launch of its runner. One untimed run opens each slot, so every timed run is queued
    behind another."""
    log = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("event")

        def elapsed_time(self, end):
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: log.append("sync"))
    runners = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    out = timing.time_interleaved(runners, rounds=2, reps=3, warmup=1)
    assert {k: len(v) for k, v in out.items()} == {"a": 6, "b": 6}
    slot = lambda n: [n, *(["event", n, "event"] * 3), "sync"]   # noqa: E731
    assert log == ["a", "b", "sync", *slot("a"), *slot("b"), *slot("b"), *slot("a")]
    log.clear()
    timing.time_interleaved(runners, rounds=2, reps=1, warmup=0, before_slot=lambda: log.append("flush"))
    slot = lambda n: ["flush", n, "event", n, "event", "sync"]   # noqa: E731
    assert log == ["sync", *slot("a"), *slot("b"), *slot("b"), *slot("a")]   # before the primer, untimed


def test_placements_pool_rounds_over_newly_allocated_inputs(fake_cuda, monkeypatch, tmp_path):
    """--placements 3: graph mode captures and times every arm three times, each on input sets
    allocated anew (the earlier sets kept alive, so no buffer is handed out twice) with the same
    values; the samples pool round after round (60 rounds of the verdicts), the figures are the
    pooled medians, and each placement's median and % copy stand beside them (table.md's
    Placements section). The graph-output check takes the worst placement."""
    seen: list[list[dict]] = []
    real = bench._time_graph_placement

    def spy(*args):
        seen.append(args[-1])   # the sets this placement's graphs read
        return real(*args)

    monkeypatch.setattr(bench, "_time_graph_placement", spy)
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact", "exact#2"], modes=["graph"], repeats=20, placements=3)
    case = bench.Case("silu_mul", "bf16", 16, 2)
    rows, samples = bench.case_rows(case, cfg.arms, torch.device("cpu"), cfg, _ctx(1024))
    by_arm = {r["arm"]: r for r in rows}
    sets = by_arm["exact"]["rotation_sets"]
    assert len(seen) == 3 and all(len(ps) == sets for ps in seen)
    ptrs = [{t.data_ptr() for d in ps for t in d.values()} for ps in seen]
    assert not (ptrs[0] & ptrs[1]) and not (ptrs[0] & ptrs[2]) and not (ptrs[1] & ptrs[2])
    assert all(torch.equal(seen[0][i]["gate"], seen[p][i]["gate"]) for p in (1, 2) for i in range(sets))
    per_placement = len(cfg.arms) + 1    # the arms' graphs and the same-size copy's
    assert len(FakeGraph.instances) == 3 * per_placement
    for r in rows:
        assert r["graph_placements"] == 3 and len(r["graph_placement_us"]) == 3
        assert r["graph_us_n"] == 3 * 20 and r["graph_mismatches"] == 0
        assert len(r["graph_placement_pct_copy"]) == 3
        assert r["graph_placement_pct_copy_min"] <= r["graph_pct_copy"] <= r["graph_placement_pct_copy_max"]
    rec = next(s for s in samples if s["arm"] == "exact")
    assert rec["rounds"] == 3 * 20 and rec["placements"] == 3 and len(rec["samples_us"]) == 3 * 20
    from rltbench.results import kernel_verdicts as vd
    aa = [v for v in vd.verdicts(samples, skip=(bench.SIZE_COPY,)) if v["arm"] == "exact#2"]
    assert aa and aa[0]["rounds"] == 60
    df = report.pd.DataFrame(rows)
    text = report.markdown_table(df, {"device": "cuda"}, {"status": "complete"})
    assert "## Placements" in text and "% copy per placement" in text


def test_one_placement_keeps_the_records_as_before(fake_cuda):
    cfg = bench.BenchConfig(ops=["silu_mul"], tokens=[2], dtypes=["bf16"], widths=[16],
                            arms=["torch", "exact"], modes=["graph"], repeats=20)
    rows, samples = bench.case_rows(bench.Case("silu_mul", "bf16", 16, 2), cfg.arms, torch.device("cpu"), cfg,
                                    _ctx(1024))
    assert all("graph_placements" not in r and "placements" not in s for r in rows for s in samples)
    assert "## Placements" not in report.markdown_table(report.pd.DataFrame(rows), {}, {"status": "complete"})
