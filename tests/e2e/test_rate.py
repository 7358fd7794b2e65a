"""The open-loop rate workload: achieved rate on an unloaded fake, the client-side concurrency limit on
both backends, the sweep's order and its stop at saturation, and the command end to end on ouro-tiny."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from e2e_fakes import FakeEngine
from test_openai_backend import fake_server

from rltbench.backends.base import Timeouts, parse_servers
from rltbench.backends.engine import EngineBackend
from rltbench.backends.openai import OpenAIBackend
from rltbench.bench.arrivals import ArrivalProcess, arrival_times
from rltbench.bench.lengths import LengthSource
from rltbench.bench.workload import open_loop_prompts
from rltbench.cli import main
from rltbench.commands.e2e.defaults import DEFAULT_CELL_LATENCIES, MIN_CELL_REQUESTS
from rltbench.commands.e2e.rate import SATURATED, SYNC, RateSweep, rate_cell, rate_spec, sweep_rates
from rltbench.models import get_config
from rltbench.results import RunDir
from rltbench.results.rate import rate_figures

TINY = get_config("ouro-tiny")


def _requests(n, rate, kind="constant", out=3, seed=0):
    times = arrival_times(n, rate, ArrivalProcess(kind), np.random.default_rng(seed))
    lengths = LengthSource(6, out).draw(n, np.random.default_rng(seed))
    return open_loop_prompts(TINY, times, lengths, seed, (0, 1))


@pytest.mark.parametrize("kind", ["constant", "poisson"])
def test_achieved_rate_within_2pct_of_the_target_on_an_unloaded_fake(kind):
    be = EngineBackend(FakeEngine(), ["torch"])
    recs = be.run_cell("torch", "r", _requests(101, 40.0, kind), Timeouts()).records
    fig = rate_figures(recs)
    assert all(r["status"] == "ok" for r in recs) and fig["measured"] == 81
    if kind == "constant":  # the measured window offers exactly the target
        assert fig["offered_rate"] == pytest.approx(40.0)
    assert fig["achieved_rate"] == pytest.approx(fig["offered_rate"], rel=0.02)
    assert fig["sent_rate"] == pytest.approx(fig["offered_rate"], rel=0.02)
    assert fig["queue_delay_max"] == 0.0


def test_max_concurrency_holds_requests_back_on_the_engine():
    eng = FakeEngine(step_sleep=0.01)
    be = EngineBackend(eng, ["torch"])
    recs = be.run_cell("torch", "r", _requests(12, 200.0, out=4), Timeouts(), max_concurrency=2).records
    assert max(eng.hist) <= 2 and all(r["status"] == "ok" for r in recs)
    delays = [r["send"] - r["scheduled"] for r in recs]
    assert delays[0] == 0 and delays[-1] > 0.1  # the last one waited for five pairs before it
    fig = rate_figures(recs)
    assert fig["sent_rate"] < 0.5 * fig["offered_rate"] and fig["queue_delay_p90"] > 0.05


def test_openai_backend_open_loop_and_max_concurrency():
    with fake_server(gap=0.01) as (url, _seen):
        be = OpenAIBackend(parse_servers([f"A={url}"]))
        be.warmup("A", _requests(1, 1.0), Timeouts())
        free = be.run_cell("A", "r", _requests(21, 20.0), Timeouts()).records
        held = be.run_cell("A", "h", _requests(8, 200.0, out=4), Timeouts(), max_concurrency=1).records
    assert all(r["status"] == "ok" for r in free + held)
    fig = rate_figures(free)
    assert fig["offered_rate"] == pytest.approx(20.0) and fig["achieved_rate"] == pytest.approx(20.0, rel=0.1)
    spans = sorted((r["send"], r["last"]) for r in held)
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:], strict=False))  # one at a time
    assert held[-1]["send"] - held[-1]["scheduled"] > 0.1


def test_rate_command_against_two_servers(tmp_path):
    with fake_server() as (url_a, _), fake_server() as (url_b, _):
        args = f"e2e --backend openai --arm torch={url_a} --arm exact={url_b} --model ouro-tiny"
        args += " --workload rate --request-rate 20 --num-prompts 10 --max-concurrency 4 --input-len 8"
        args += " --output-len 3 --repeats 2 --slo ttft:1000 --no-live"
        rc = main([*args.split(), "--result-dir", str(tmp_path / "run")])
    assert rc == 0
    run = RunDir.open(tmp_path / "run")
    assert run.manifest["config"]["rate"]["max_concurrency"] == 4
    assert len(run.read_jsonl("requests.jsonl")) == 2 * 2 * 10 and not run.read_jsonl("replay.jsonl")
    summary = run.read_json("summary.json")
    assert {r["arm"] for r in summary["slo_capacity"]} == {"torch", "exact"}
    assert all(r["identical"] == r["compared"] for r in summary["identity"])


def _fake_records(rate: float, capacity: float, n: int = 30) -> list[dict]:
    """A cell at `rate` on a server finishing at most `capacity` requests/s (latency 0.05 s unloaded)."""
    recs, free = [], 0.0
    for i in range(n):
        sched = i / rate
        first = max(sched, free) + 0.05
        free = max(sched, free) + 1 / capacity
        recs.append({"request": i, "scheduled": sched, "send": sched, "first": first, "last": first + 0.01,
                     "status": "ok", "token_ids": [1, 2], "event_times": [first, first + 0.01],
                     "event_tokens": [1, 1]})
    return recs


def _drive(sweep, capacity, sync_rate=2.0, saturated=None):
    """Run `sweep` on synthetic cells; the probes: the synchronous one serves `sync_rate`/s (request
    latency 1 / that), the saturated ones `saturated[arm]`/s. Returns the (rep, cell, arm) order."""
    order = []
    for rep, cell, arm in sweep:
        order.append((rep, cell.name, arm))
        if cell.probe:
            rate = sync_rate if cell.name == SYNC else saturated[arm]
            sweep.record(arm, cell, rep, [{"request": 0, "send": 0.0, "last": 1 / rate, "status": "ok"}])
        else:
            line = sweep.record(arm, cell, rep, _fake_records(cell.rate, capacity[arm]))
            assert line.startswith("achieved ")
    return order


def test_sweep_probes_place_rates_arms_alternate_and_stop_at_saturation():
    spec = rate_spec("sweep", sweep_rates=3, duration=2.0, slo="ttft:200")
    capacity = {"torch": 10.0, "exact": 16.0, "torch#2": 10.0}
    sweep = RateSweep(["torch", "exact", "torch#2"], "torch", 2, spec, limit=8)
    order = _drive(sweep, capacity, saturated={"torch": 6.0, "exact": 8.0})
    # the synchronous probe by the reference, the saturated one by every arm but the A/A copy
    assert order[:3] == [(0, SYNC, "torch"), (0, SATURATED, "torch"), (0, SATURATED, "exact")]
    # even ratios from the synchronous rate (2/s) up to 1.5 x the fastest arm's probe (8/s)
    first, ratio = sweep_rates(2.0, 1.5 * 8.0, 3)
    assert first == [3.63, 6.6, 12.0] and ratio == pytest.approx(6 ** (1 / 3))
    # per rate: repetition 0 then 1, the arm order flipping from block to block
    assert order[3:9] == [(0, "3.63/s", "torch"), (0, "3.63/s", "exact"), (0, "3.63/s", "torch#2"),
                          (1, "3.63/s", "torch#2"), (1, "3.63/s", "exact"), (1, "3.63/s", "torch")]
    assert sweep.block_arms(1, rate_cell(3.63, None)) == ["torch#2", "exact", "torch"]
    # torch and its A/A copy saturate at 12/s and stop; exact runs on past the top to 21.8/s
    assert sweep.rates == [3.63, 6.6, 12.0, 21.8]
    assert sweep.saturated["torch"]["rate"] == sweep.saturated["torch#2"]["rate"] == 12.0
    assert sweep.saturated["exact"]["rate"] == 21.8 and sweep.saturated["torch"]["reps"] == "2/2"
    assert {arm for _, cell, arm in order if cell == "21.8/s"} == {"exact"}
    assert sweep.stopped == "every arm saturated by 21.8/s: no higher rate"
    summary = sweep.summary()
    assert summary["probes"][SYNC]["rate"] == pytest.approx(2.0)
    assert summary["probes"][f"{SATURATED} exact"]["rate"] == pytest.approx(8.0)
    assert (summary["cell_s"], summary["cell_why"]) == (2.0, "--duration")


def test_sweep_sizes_cells_from_the_synchronous_request_latency():
    spec = rate_spec("sweep", sweep_rates=2, cell_latencies=4)
    sweep = RateSweep(["torch"], "torch", 1, spec, limit=8)
    _drive(sweep, {"torch": 100.0}, sync_rate=2.0, saturated={"torch": 8.0})
    assert sweep.cell_s == pytest.approx(4 * 0.5) and "4 x the synchronous request latency" in sweep.cell_why
    assert sweep.requests_at(20.0) == 41 and sweep.requests_at(1.0) == MIN_CELL_REQUESTS
    assert rate_spec("sweep").cell_latencies == DEFAULT_CELL_LATENCIES
    exact = rate_spec("sweep", duration=2.0)  # --duration: exactly its arrivals, no floor
    assert exact.requests_at(1.0, exact.cell_seconds(0.5)[0]) == 3


def test_listed_rates_run_in_rising_order_without_probes():
    spec = rate_spec("6,2,4", num_prompts=20)
    assert spec.rates == (2.0, 4.0, 6.0)
    sweep = RateSweep(["torch"], "torch", 1, spec, limit=4)
    names = []
    for rep, cell, arm in sweep:
        names.append(cell.name)
        sweep.record(arm, cell, rep, _fake_records(cell.rate, 100.0))
    assert names == ["2/s", "4/s", "6/s"] and sweep.stopped == "the last rate (6/s) left torch unsaturated"


def _run(args, tmp_path, name):
    out = tmp_path / name
    rc = main(["e2e", "--model", "ouro-tiny", "--device", "cpu", "--no-live", "--result-dir", str(out),
               "--workload", "rate", "--input-len", "8", "--output-len", "3", "--warmup-requests", "1",
               *args])
    return rc, out


def test_rate_command_end_to_end_on_the_tiny_model(tmp_path, capsys):
    args = "--arms torch,torch --request-rate 2 --num-prompts 6 --repeats 2 --slo ttft:9000,tpot:9000"
    rc, out = _run(args.split(), tmp_path, "rate")
    assert rc == 0
    run = RunDir.open(out)
    cfg = run.manifest["config"]
    assert cfg["workload"] == "rate" and cfg["rate"]["rates"] == [2.0] and cfg["concurrency"] is None
    recs = run.read_jsonl("requests.jsonl")
    assert len(recs) == 2 * 2 * 6 and all(r["status"] == "ok" and r["scheduled"] <= r["send"] for r in recs)
    assert {m["rate"] for m in run.read_jsonl("cell_meta.jsonl")} == {2.0}
    replays = run.read_jsonl("replay.jsonl")  # one replay per rate, not per repetition
    got = [(r["cell"], r["arm"], r["identical"], r["compared"]) for r in replays]
    assert got == [("2/s", "torch#2", 6, 6)]
    summary = run.read_json("summary.json")
    caps = {r["arm"]: r for r in summary["slo_capacity"]}
    assert caps["torch#2"]["aa"]
    # The SLO (9 s) is met at the only rate; whether a cell saturated is the CPU's timing (its TTFT
    # growth), so each repetition's capacity is checked against the run's own saturation flags: a
    # lower bound of 2/s where the cell kept up, none where it saturated.
    with open(out / "rate_cells.csv", newline="") as fh:
        flags = {(row["arm"], row["rep"]): bool(row["saturated"]) for row in csv.DictReader(fh)}
    for arm in ("torch", "torch#2"):
        sat = {rep: flag for (a, rep), flag in flags.items() if a == arm}
        assert caps[arm]["per_rep"] == {rep: None if s else 2.0 for rep, s in sat.items()}, (arm, sat)
        assert caps[arm]["bounds"] == sorted({"below" if s else "at least" for s in sat.values()})
    assert summary["slo_headlines"] == []  # only the reference and its A/A copy: no arm to compare
    text = (out / "table.md").read_text()
    assert "## Open-loop rates" in text
    assert "## SLO capacity at TTFT p90 <= 9000 ms, TPOT p90 <= 9000 ms" in text
    for f in ("latency_vs_rate.png", "goodput.png", "pareto.png", "rate_cells.csv"):
        assert (out / f).is_file(), f
    assert "rate sweep: " in capsys.readouterr().out


@pytest.mark.slow  # about 20 s: probes, then rates until the sweep's end
def test_rate_sweep_end_to_end_on_the_tiny_model(tmp_path):
    args = "--arms torch --request-rate sweep --sweep-rates 2 --duration 1 --repeats 1 --max-num-seqs 4"
    rc, out = _run(args.split(), tmp_path, "sweep")
    assert rc == 0
    run = RunDir.open(out)
    sweep = run.manifest["sweep"]
    assert set(sweep["probes"]) == {SYNC, SATURATED} and sweep["stopped"]
    assert sweep["rates"] == sorted(sweep["rates"]) and len(sweep["rates"]) >= 1
    assert {m["cell"] for m in run.read_jsonl("probe_meta.jsonl")} == {SYNC, SATURATED}
    assert {r["cell"] for r in run.read_jsonl("requests.jsonl")} == {f"{r:g}/s" for r in sweep["rates"]}
    text = (out / "table.md").read_text()
    assert "probes (not measurements)" in text and "s of arrivals each (--duration)" in text


@pytest.mark.parametrize("args", [
    ["--request-rate", "nan"], ["--request-rate", "0"], ["--request-rate", "2,inf"], ["--burstiness", "inf"],
    ["--burstiness", "0"], ["--arrivals", "poisson", "--burstiness", "0.5"], ["--arrivals", "uniform"],
    ["--duration", "nan"], ["--num-prompts", "5", "--duration", "2"], ["--max-concurrency", "0"],
    ["--exclude-head", "0.6", "--exclude-tail", "0.5"], ["--exclude-head", "-0.1"], ["--slo", "ttft:abc"],
    ["--slo", "ttft:500", "--slo-attainment", "1"], ["--saturation-margin", "nan"], ["--concurrency", "2"],
    ["--request-rate", "2", "--sweep-rates", "3"], ["--random-range-ratio", "1.5"],
    ["--lengths", "nope"], ["--trace-length-scale", "0.5"], ["--cell-latencies", "3", "--duration", "2"],
    ["--request-rate", "2", "--cell-latencies", "3"], ["--cell-latencies", "0.5"],
    ["--random-range-ratio", "0.9", "--input-len", "300", "--output-len", "200"],
])
def test_bad_rate_flags_exit_2_in_one_line(args, tmp_path, capsys):
    rc, _ = _run(args, tmp_path, "bad")
    assert rc == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_rate_flags_belong_to_the_rate_workload(tmp_path, capsys):
    out = tmp_path / "burst"
    rc = main(["e2e", "--model", "ouro-tiny", "--device", "cpu", "--no-live", "--result-dir", str(out),
               "--request-rate", "5"])
    assert rc == 2 and "--request-rate is for --workload rate" in capsys.readouterr().err
