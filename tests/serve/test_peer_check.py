"""The open-loop cross-check against guidellm on recorded figures: a guidellm 0.8 JSON report
(fixtures/guidellm_rates.json: constant rates 2 and 4 requests/s, 11 requests each, every figure it
reports computed from its request timings by guidellm's definitions) read into rltbench records,
and compared with an rltbench rate run by rltbench's and by guidellm's definitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from rltbench.results import RunDir
from rltbench.results.guidellm import read_report
from rltbench.results.peer_check import (
    AGREES,
    DIFFERS,
    INFO,
    MISSING,
    NOISE,
    check_lines,
    check_rate,
    cross_check,
    peer_definitions,
    run_rate_records,
    verdict_counts,
    verdict_tally,
)
from rltbench.server import bench

REPORT = Path(__file__).parent / "fixtures" / "guidellm_rates.json"
ONE_RUN_CHECK = Path(__file__).parent / "fixtures" / "rate_check_one_run.md"  # rate-compare without --rlt-aa
OUT = 8


def _records(rate: float, n: int = 11, ttft_scale: float = 1.0, jitter: float = 0.0) -> list[dict]:
    """rltbench records of a constant-rate cell on the same server as the fixture's guidellm run."""
    recs = []
    for i in range(n):
        send = 50.0 + i / rate + (jitter if i % 2 else 0.0)
        first = send + (0.050 + 0.002 * (i % 3)) * ttft_scale
        itl = 0.010 + 0.0005 * (i % 2)
        times = [first + k * itl for k in range(OUT)]
        recs.append({"request": i, "scheduled": 50.0 + i / rate, "send": send, "first": first,
                     "last": times[-1], "token_ids": list(range(OUT)), "event_times": times,
                     "event_tokens": [1] * OUT, "status": "ok", "expected_len": OUT})
    return recs


def test_report_read_into_records_in_arrival_order():
    benches = read_report(REPORT)
    assert [(b.strategy, b.load, len(b.records)) for b in benches] == [
        ("constant", 2.0, 11), ("constant", 4.0, 11), ("concurrent", 2.0, 2)]
    recs = benches[0].records
    assert [r["request"] for r in recs] == list(range(11)) and all(r["status"] == "ok" for r in recs)
    assert recs[1]["scheduled"] - recs[0]["scheduled"] == pytest.approx(0.5)  # constant: gaps of 1 / rate
    assert recs[0]["n_tokens"] == OUT and recs[0]["token_ids"] is None


def test_guidellm_definitions_on_its_records_reproduce_its_own_figures():
    """What rltbench computes as guidellm's figures, from guidellm's timestamps, is what guidellm
    reported: its request rate, TTFT median and ITL median (rltbench's TPOT)."""
    for b in read_report(REPORT)[:2]:
        mine = peer_definitions(b.records)
        assert mine["rate"] == pytest.approx(b.own["request_rate"], rel=1e-3)
        assert 1e3 * mine["ttft"] == pytest.approx(b.own["ttft_ms"], rel=1e-6)
        assert 1e3 * mine["itl"] == pytest.approx(b.own["itl_ms"], rel=1e-6)


def test_same_load_agrees_on_every_figure():
    rows = cross_check({2.0: [_records(2.0)], 4.0: [_records(4.0)]}, read_report(REPORT), 0.1, 0.1)
    assert {r["rate"] for r in rows} == {2.0, 4.0}  # the concurrent benchmark is not a rate
    assert [r["figure"] for r in rows if r["rate"] == 2.0] == [
        "offered rate /s", "achieved rate /s", "TTFT p50 ms", "TPOT p50 ms", "request rate /s",
        "TTFT median ms", "ITL median ms"]
    assert [r["verdict"] for r in rows if r["tolerance"] is None] == [INFO, INFO]
    assert verdict_counts(rows) == (12, 12)


def test_a_slower_client_differs_on_ttft_only():
    peer = read_report(REPORT)[0]
    rows = {r["figure"]: r for r in check_rate(2.0, [_records(2.0, ttft_scale=1.1)], peer, 0.1, 0.1)}
    assert rows["TTFT p50 ms"]["verdict"] == DIFFERS and rows["TTFT p50 ms"]["diff"] == pytest.approx(
        1 / 1.1 - 1, rel=1e-3)
    assert rows["TTFT median ms"]["verdict"] == DIFFERS
    assert rows["achieved rate /s"]["verdict"] == AGREES and rows["TPOT p50 ms"]["verdict"] == AGREES


def test_repetitions_are_pooled_by_their_median():
    peer = read_report(REPORT)[0]
    reps = [_records(2.0, ttft_scale=s) for s in (0.5, 1.0, 1.01)]
    rows = {r["figure"]: r for r in check_rate(2.0, reps, peer, 0.1, 0.1)}
    assert rows["TTFT p50 ms"]["verdict"] == AGREES


def test_poisson_draws_apart_compare_the_achieved_share():
    """Each client's own Poisson schedule offers another rate: the achieved rate is compared as a
    share of each one's offered rate."""
    peer = read_report(REPORT)[0]
    rows = {r["figure"]: r for r in check_rate(2.0, [_records(2.4)], peer, 0.1, 0.1)}
    assert rows["offered rate /s"]["diff"] == pytest.approx(2.0 / 2.4 - 1, rel=1e-6)
    assert "achieved rate /s" not in rows and rows["achieved / offered"]["verdict"] == AGREES


def test_a_rate_only_one_client_ran_is_missing():
    rows = cross_check({2.0: [_records(2.0)], 8.0: [_records(8.0)]}, read_report(REPORT), 0.1, 0.1)
    missing = [r for r in rows if r["verdict"] == MISSING]
    assert {(r["rate"], r["figure"]) for r in missing} == {(4.0, "not run by rltbench"),
                                                          (8.0, "not run by guidellm")}
    assert verdict_counts(rows) == (6, 8)


def _rate_run(path: Path, ttft_scale: float = 1.0, rates: tuple[float, ...] = (2.0, 4.0)) -> Path:
    cfg = {"arm_names": ["exact"], "arm_specs": {"exact": "http://127.0.0.1:8199"}, "model": "ouro-tiny",
           "rate": {"rates": list(rates), "arrivals": "constant", "num_prompts": 11, "exclude_head": 0.1,
                    "exclude_tail": 0.1}, "lengths": {"label": "fixed: 16 in / 8 out"}}
    run = RunDir.create("e2e", path, argv=["rltbench", "e2e"], config=cfg)
    for rate in rates:
        cell = f"{rate:g}/s"
        for r in _records(rate, jitter=0.001, ttft_scale=ttft_scale):
            run.append_jsonl("requests.jsonl", {**r, "arm": "exact", "cell": cell, "C": 0, "rep": 0})
        run.append_jsonl("cell_meta.jsonl", {"arm": "exact", "cell": cell, "C": 0, "rep": 0, "rate": rate})
    run.update_manifest(status="complete")
    return path


def test_rate_compare_command_writes_the_table(tmp_path):
    run = _rate_run(tmp_path / "e2e-rate")
    ours, cfg = run_rate_records(run)
    assert sorted(ours) == [2.0, 4.0] and len(ours[2.0]) == 1 and cfg["model"] == "ouro-tiny"
    out = tmp_path / "rate_check.md"
    assert bench.main(["rate-compare", "--rlt", str(run), "--peer", str(REPORT), "--out", str(out)]) == 0
    text = out.read_text()
    assert "**Cross-check: 12/12 figures agree**" in text
    assert "| 4/s | TPOT p50 ms |" in text and "agrees (±5%)" in text
    assert max(len(line) for line in text.splitlines() if line.startswith("|")) <= 80


def _compare_argv(run: Path, out: Path, again: Path | None = None) -> list[str]:
    aa = [] if again is None else ["--rlt-aa", str(again)]
    return ["rate-compare", "--rlt", str(run), "--peer", str(REPORT), *aa, "--out", str(out)]


def test_rate_compare_without_the_aa_leg_is_unchanged(tmp_path):
    """No --rlt-aa: the report is byte for byte the one-run report (the committed fixture)."""
    out = tmp_path / "rate_check.md"
    assert bench.main(_compare_argv(_rate_run(tmp_path / "e2e-rate"), out)) == 0
    assert out.read_bytes() == ONE_RUN_CHECK.read_bytes()


# ---- the A/A leg: rltbench's client again after guidellm ------------------------------------------
PEER_TTFT_MS = 52.0  # about the fixture's TTFT p50 at 2/s (rltbench's definitions)


def _aa_scales(peer_diff: float, aa_diff: float) -> tuple[float, float]:
    """TTFT scales of rltbench's runs A and A' such that guidellm / mean(A, A') - 1 = peer_diff and
    A' / A - 1 = aa_diff (the records' TTFT p50 is 52 ms times the scale, as guidellm's)."""
    mean = 1.0 / (1.0 + peer_diff)
    first = 2.0 * mean / (2.0 + aa_diff)
    return first, first * (1.0 + aa_diff)


def _aa_rows(peer_diff: float, aa_diff: float) -> dict[str, dict]:
    first, second = _aa_scales(peer_diff, aa_diff)
    peer = read_report(REPORT)[0]
    rows = check_rate(2.0, [_records(2.0, ttft_scale=first)], peer, 0.1, 0.1,
                      [_records(2.0, ttft_scale=second)])
    return {r["figure"]: r for r in rows}


def test_a_peer_difference_inside_the_aa_spread_is_noise():
    row = _aa_rows(0.07, 0.08)["TTFT p50 ms"]
    assert row["diff"] == pytest.approx(0.07, abs=1e-4) and row["aa_diff"] == pytest.approx(0.08, rel=1e-6)
    assert row["rltbench"] == pytest.approx(PEER_TTFT_MS / 1.07, rel=1e-4)  # the mean of A and A'
    assert row["verdict"] == NOISE and row["runs"] == 2


def test_a_peer_difference_beyond_the_aa_spread_differs():
    rows = _aa_rows(0.07, 0.01)
    assert rows["TTFT p50 ms"]["verdict"] == DIFFERS
    assert rows["TTFT p50 ms"]["aa_diff"] == pytest.approx(0.01, rel=1e-6)
    assert rows["TPOT p50 ms"]["verdict"] == AGREES and rows["TPOT p50 ms"]["aa_diff"] == pytest.approx(0.0)


def test_within_the_tolerance_agrees_whatever_the_aa_spread():
    assert _aa_rows(0.03, 0.08)["TTFT p50 ms"]["verdict"] == AGREES


def test_a_rate_the_aa_run_lacks_is_judged_on_the_first_run_alone():
    first, second = _aa_scales(0.07, 0.08)
    rows = cross_check({2.0: [_records(2.0, ttft_scale=first)], 4.0: [_records(4.0)]}, read_report(REPORT),
                       0.1, 0.1, {2.0: [_records(2.0, ttft_scale=second)]})
    at4 = {r["figure"]: r for r in rows if r["rate"] == 4.0}
    assert at4["TTFT p50 ms"]["aa_diff"] is None and at4["TTFT p50 ms"]["verdict"] == AGREES
    assert verdict_tally(rows) == {AGREES: 10, NOISE: 2, DIFFERS: 0, MISSING: 0}
    headline = check_lines(rows)[0]
    assert headline.startswith("**Cross-check of 12 figures: 10 agree, 2 noise, 0 differ**")


def test_rate_compare_with_the_aa_leg_writes_the_aa_column(tmp_path):
    first, second = _aa_scales(0.07, 0.08)
    run = _rate_run(tmp_path / "e2e-rate", ttft_scale=first)
    again = _rate_run(tmp_path / "e2e-rate-aa", ttft_scale=second)
    out = tmp_path / "rate_check.md"
    assert bench.main(_compare_argv(run, out, again)) == 0
    text = out.read_text()
    assert "A/A leg: rltbench's client ran the load twice" in text
    assert "| rate | figure | rltbench (mean) | guidellm | diff | A/A | verdict |" in text
    assert "| 2/s | TTFT p50 ms | 48.598 | 52.000 | +7.0% | +8.0% | noise (±5%) |" in text
    assert "**Cross-check of 12 figures: 8 agree, 4 noise, 0 differ**" in text
    lines, none_differ = bench.rate_check(run, REPORT, again)
    assert none_differ and lines[-1].startswith("| 4/s | ITL median ms |")


def test_an_aa_run_of_another_load_is_refused(tmp_path, capsys):
    run = _rate_run(tmp_path / "e2e-rate")
    other = _rate_run(tmp_path / "e2e-other", rates=(2.0, 8.0))
    out = tmp_path / "rate_check.md"
    assert bench.main(_compare_argv(run, out, other)) == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("--rlt-aa: the run's rate")


def test_a_missing_peer_report_is_one_line_and_exit_2(tmp_path, capsys):
    argv = _compare_argv(_rate_run(tmp_path / "e2e-rate"), tmp_path / "rate_check.md")
    argv[argv.index("--peer") + 1] = str(tmp_path / "absent.json")
    assert bench.main(argv) == 2
    assert capsys.readouterr().err.strip().startswith("--peer: ")
