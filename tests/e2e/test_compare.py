"""Token identity and paired statistics on crafted records."""

from __future__ import annotations

import pytest

from rltbench.engine.schedule import first_divergence
from rltbench.results.serving import compute_cells
from rltbench.results.serving_stats import identity, paired_deltas


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def _rec(arm, rep, req, ttft, tpot, toks, n=4, status="ok"):
    send = 100.0 * rep + req
    first = send + ttft
    times = [first + i * tpot for i in range(n)]
    return {
        "arm": arm,
        "cell": "C=2",
        "C": 2,
        "rep": rep,
        "request": req,
        "send": send,
        "first": first,
        "last": times[-1],
        "event_times": times,
        "event_tokens": [1] * n,
        "token_ids": toks,
        "status": status,
        "expected_len": n,
    }


def _records(speed=0.5, diverge_exact=False, aa_noise=0.01):
    recs = []
    for rep in range(3):
        for req in range(2):
            toks = [rep, req, 7, 9]
            recs.append(_rec("torch", rep, req, 0.2, 0.1, toks))
            recs.append(_rec("torch#2", rep, req, 0.2 * (1 + aa_noise), 0.1 * (1 + aa_noise), toks))
            etoks = [rep, req, 8, 9] if diverge_exact and req == 1 else toks
            recs.append(_rec("exact", rep, req, 0.2 * speed, 0.1 * speed, etoks))
    return recs


def test_identity_flags_exact_mismatch_with_first_divergence():
    rows = {r["arm"]: r for r in identity(_records(diverge_exact=True), "torch", {"exact"})}
    assert rows["exact"]["identical"] == 3 and rows["exact"]["compared"] == 6
    assert rows["exact"]["first_divergence_min"] == 2 and rows["exact"]["exact_mismatch"] is True
    assert (
        rows["torch#2"]["aa"] and rows["torch#2"]["identity"] == 1.0 and not rows["torch#2"]["exact_mismatch"]
    )
    clean = {r["arm"]: r for r in identity(_records(), "torch", {"exact"})}
    assert clean["exact"]["identity"] == 1.0 and not clean["exact"]["exact_mismatch"]


def test_session_identity_is_judged_against_the_aa_baseline():
    """Sessions batch by arrival time, so batches differ per arm: an exact divergence is a bug only
    beyond the A/A divergence of the same cell, and unverified without an A/A arm."""
    recs = _records(diverge_exact=True)  # exact: 3/6 identical
    for r in recs:  # the A/A arm diverges on one request
        if r["arm"] == "torch#2" and r["rep"] == 0 and r["request"] == 0:
            r["token_ids"] = [0, 0, 5, 9]
    rows = {r["arm"]: r for r in identity(recs, "torch", {"exact"}, batches_deterministic=False)}
    assert rows["torch#2"]["identity"] == pytest.approx(5 / 6)
    assert rows["exact"]["exact_mismatch"] is True  # 3/6 < 5/6: worse than batch effects explain
    for r in recs:
        if r["arm"] == "torch#2":
            r["token_ids"] = [9, 9, 9, 9]  # A/A never identical: batch effects dominate
    rows = {r["arm"]: r for r in identity(recs, "torch", {"exact"}, batches_deterministic=False)}
    assert rows["exact"]["exact_mismatch"] is False and rows["exact"]["aa_identity"] == 0.0
    no_aa = [r for r in recs if r["arm"] != "torch#2"]
    rows = {r["arm"]: r for r in identity(no_aa, "torch", {"exact"}, batches_deterministic=False)}
    assert rows["exact"]["exact_mismatch"] is False and rows["exact"]["exact_unverified"] is True
    burst = {r["arm"]: r for r in identity(no_aa, "torch", {"exact"})}
    assert burst["exact"]["exact_mismatch"] is True and not burst["exact"]["exact_unverified"]


def test_paired_deltas_exact_speedup_and_aa_tie():
    recs = _records(speed=0.5)
    cells = compute_cells(recs)
    rows = {(r["arm"], r["metric"]): r for r in paired_deltas(recs, cells, "torch")}
    r = rows[("exact", "ttft")]
    assert r["delta"] == pytest.approx(-0.5) and r["ci_lo"] == pytest.approx(-0.5) and r["reps"] == 3
    assert r["pairs"] == 6 and r["verdict"] == "better"
    assert rows[("exact", "tpot")]["delta"] == pytest.approx(-0.5)
    # cell span: sends 1 s apart, torch last token at 1 + 0.2 + 0.3, exact at 1 + 0.1 + 0.15 -> 1.5 / 1.25
    tps = rows[("exact", "output_tok_s")]
    assert tps["verdict"] == "better" and tps["delta"] == pytest.approx(1.5 / 1.25 - 1)
    aa = rows[("torch#2", "ttft")]
    assert aa["verdict"] == "A/A" and aa["delta"] == pytest.approx(0.01)
    assert r["aa_spread"] == pytest.approx(0.01)
    # an arm 0.5% slower sits inside the 1% A/A spread: within noise, never "worse"
    tiny = _records(speed=1.005)
    rows2 = {(r["arm"], r["metric"]): r for r in paired_deltas(tiny, compute_cells(tiny), "torch")}
    assert rows2[("exact", "ttft")]["verdict"] == "within noise"
    # an arm 1.5% slower whose interval still reaches into the 1% spread: within noise too
    near = _records(speed=1.015)
    rows3 = {(r["arm"], r["metric"]): r for r in paired_deltas(near, compute_cells(near), "torch")}
    r3 = rows3[("exact", "ttft")]
    if r3["ci_lo"] <= r3["aa_spread"]:
        assert r3["verdict"] == "within noise"
    else:
        assert r3["verdict"] == "worse"


def test_no_speed_verdict_where_timings_cannot_carry_one():
    recs = _records(speed=0.5)
    rows = paired_deltas(recs, compute_cells(recs), "torch", no_verdict="CPU timings")
    assert {r["verdict"] for r in rows if r["arm"] == "exact"} == {"no verdict: CPU timings"}
    assert {r["verdict"] for r in rows if r["arm"] == "torch#2"} == {"A/A"}


def test_invalid_cell_is_excluded_from_pairs():
    recs = _records()
    for r in recs:
        if r["arm"] == "exact" and r["rep"] == 1 and r["request"] == 0:
            r["status"] = "timeout"
    cells = compute_cells(recs)
    assert sum(not c["valid"] for c in cells) == 1
    rows = {(r["arm"], r["metric"]): r for r in paired_deltas(recs, cells, "torch")}
    assert rows[("exact", "ttft")]["reps"] == 2 and rows[("exact", "ttft")]["pairs"] == 4
    assert rows[("exact", "ttft")]["excluded_reps"] == [1]


def test_unfinished_requests_never_raise_the_exact_alarm():
    """A request cut short (deadline, timeout) stops early: its shorter sequence is not a divergence.
    Old code compared partial ids to full ones and shouted EXACT ARM MISMATCH on every deadline."""
    recs = _records()
    for r in recs:
        if r["arm"] == "exact" and r["rep"] == 2:  # the global deadline cut the exact cell
            r.update(status="timeout", token_ids=r["token_ids"][:2])
        if r["arm"] == "torch" and r["rep"] == 1 and r["request"] == 0:
            r.update(status="error", token_ids=r["token_ids"][:1])
    rows = {r["arm"]: r for r in identity(recs, "torch", {"exact"})}
    assert rows["exact"]["exact_mismatch"] is False
    assert rows["exact"]["compared"] == 3 and rows["exact"]["identical"] == 3
    assert rows["exact"]["not_compared"] == 3
    # a divergence inside the tokens both produced is still a divergence (and still a bug)
    for r in recs:
        if r["arm"] == "exact" and r["rep"] == 2 and r["request"] == 1:
            r["token_ids"] = [2, 9]
    rows = {r["arm"]: r for r in identity(recs, "torch", {"exact"})}
    assert rows["exact"]["exact_mismatch"] is True and rows["exact"]["first_divergence_min"] == 1
    assert rows["exact"]["compared"] == 4


def test_one_repetition_throughput_has_no_verdict():
    """One repetition gives one throughput ratio and no interval: 'better'/'worse' would be a claim
    without evidence (old code said 'better' for +0.7% on one CPU run)."""
    recs = [r for r in _records(speed=0.5) if r["rep"] == 0]
    rows = {(r["arm"], r["metric"]): r for r in paired_deltas(recs, compute_cells(recs), "torch")}
    tps = rows[("exact", "output_tok_s")]
    assert tps["ci_lo"] is None and tps["delta"] == pytest.approx(1.5 / 1.25 - 1)
    assert tps["verdict"] == "n/a"
    assert rows[("exact", "ttft")]["verdict"] == "better"  # requests still give an interval


def test_latency_table_gives_each_metric_p50_p90_p99_and_its_own_count(tmp_path):
    """Spec: p50/p90/p99 with the sample count (old table: no p90 beyond TTFT, one n for all).
    One-token requests have a TTFT but no TPOT: the TPOT percentiles must show their own n."""
    from rltbench.commands.e2e.report import render
    from rltbench.results import RunDir

    run = RunDir.create("e2e", result_dir=tmp_path / "run", config={"arm_names": ["torch"], "repeats": 1})
    for req, n in enumerate((1, 4)):
        rec = _rec("torch", 0, req, 0.2, 0.1, list(range(n)), n=n)
        run.append_jsonl("requests.jsonl", rec)
    run.update_manifest(status="complete")
    render(run.path)
    latency = (run.path / "table.md").read_text().split("## Latency", 1)[1]
    row = next(line for line in latency.splitlines() if line.startswith("| C=2 |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[3] == "2" and cols[5] == "1"  # n TTFT = 2 requests, n TPOT = 1 (the 1-token one has none)
    assert cols[2] == "200.00 / 200.00 / 200.00*"  # p50 / p90 / p99, the p99 from < 100 samples marked
    assert cols[4] == "100.00 / 100.00 / 100.00*" and cols[7] == "3" and cols[9] == "2"


def test_report_of_one_token_outputs_warns_nothing(tmp_path):
    """--output-len 1 has no TPOT: the empty latency panel made matplotlib warn on the console."""
    import warnings

    from rltbench.commands.e2e.report import render
    from rltbench.results import RunDir

    run = RunDir.create("e2e", result_dir=tmp_path / "run", config={"arm_names": ["torch"], "repeats": 1})
    for req in range(2):
        run.append_jsonl("requests.jsonl", _rec("torch", 0, req, 0.2, 0.1, [5], n=1))
    run.update_manifest(status="complete")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render(run.path)
    assert (run.path / "latency.png").is_file()
