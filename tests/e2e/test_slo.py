"""SLO grammar, per-cell shares, capacity interpolation and saturation on synthetic cells and records."""

from __future__ import annotations

import math

import pytest

from rltbench.errors import UsageError
from rltbench.results.rate import measured_records, rate_figures, saturation, ttft_growth
from rltbench.results.slo import (
    AT_LEAST,
    BELOW,
    INTERPOLATED,
    SATURATED,
    SloTerm,
    arm_capacities,
    cell_slo,
    headlines,
    parse_slo,
    slo_capacity,
)


def test_parse_slo_defaults_quantiles_and_round_trips():
    terms = parse_slo("ttft:500, tpot:p99:50,e2el:p50.5:2000")
    assert terms == (SloTerm("ttft", 0.9, 500.0), SloTerm("tpot", 0.99, 50.0), SloTerm("e2el", 0.505, 2000.0))
    assert [t.label for t in terms] == ["TTFT p90 <= 500 ms", "TPOT p99 <= 50 ms", "E2EL p50.5 <= 2000 ms"]
    assert parse_slo(",".join(t.spec for t in terms)) == terms
    assert parse_slo("ttft:500", attainment=0.95)[0].quantile == 0.95


@pytest.mark.parametrize("text", ["ttft", "itl:50", "ttft:nan", "ttft:inf", "ttft:-5", "ttft:0", "ttft:p0:5",
                                  "ttft:p100:5", "ttft:90:5", "ttft:pnan:5", "ttft:5,ttft:6", "",
                                  "ttft:1:2:3"])
def test_bad_slo_is_one_usage_line(text):
    with pytest.raises(UsageError, match="--slo") as exc:
        parse_slo(text)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("bad", [0.0, 1.0, math.nan, math.inf, -0.5])
def test_bad_attainment(bad):
    with pytest.raises(UsageError, match="--slo-attainment"):
        parse_slo("ttft:500", attainment=bad)


def _rec(i, sched, ttft, tpot, n=5, status="ok", send=None):
    send = sched if send is None else send
    first = send + ttft
    last = first + tpot * (n - 1)
    times = [first + tpot * k for k in range(n)]
    return {"request": i, "scheduled": sched, "send": send, "first": first, "last": last, "status": status,
            "token_ids": list(range(n)), "event_times": times, "event_tokens": [1] * n}


def test_cell_slo_shares_slack_and_joint_share():
    # 10 requests: TTFT 0.1 s except 2 slow (0.9 s); TPOT 0.02 s except 1 slow (0.08 s) and one failure
    recs = [_rec(i, i * 0.1, 0.9 if i in (0, 1) else 0.1, 0.08 if i == 2 else 0.02) for i in range(9)]
    recs.append(_rec(9, 0.9, 0.1, 0.02, status="timeout"))
    terms = parse_slo("ttft:500,tpot:p70:50")
    out = cell_slo(recs, terms)
    assert out["slo_share_ttft"] == pytest.approx(0.7) and out["slo_share_tpot"] == pytest.approx(0.8)
    assert out["slo_share"] == pytest.approx(0.6)  # within both at once: not 0, 1, 2 nor the failed one
    assert out["slo_slack"] == pytest.approx(-0.2) and out["slo_met"] is False
    one_token = [_rec(0, 0.0, 0.1, 0.02, n=1)]
    assert cell_slo(one_token, terms)["slo_met"] is True  # no TPOT to miss


def test_capacity_interpolates_between_the_last_meeting_and_the_next_rate():
    cap = slo_capacity([(4.0, 0.1), (2.0, 0.1), (6.0, 0.05), (8.0, -0.15)])
    assert cap.bound == INTERPOLATED and cap.monotone
    assert cap.value == pytest.approx(6.0 + 2.0 * 0.05 / 0.2)  # slack crosses 0 a quarter of the way
    assert slo_capacity([(2.0, 0.1), (4.0, 0.0), (6.0, -0.1)]).value == pytest.approx(4.0)
    wobbly = slo_capacity([(2.0, 0.1), (4.0, -0.01), (6.0, 0.02), (8.0, -0.1)])
    assert not wobbly.monotone and wobbly.value == pytest.approx(6.0 + 2.0 * 0.02 / 0.12)
    assert slo_capacity([(2.0, 0.1), (4.0, 0.1)]) == slo_capacity([(2.0, 0.1), (4.0, 0.1)], 5.0)
    assert slo_capacity([(2.0, 0.1), (4.0, 0.1)]).bound == AT_LEAST
    # a saturated cell fails whatever its slack: half-way where its shares still met the SLO, else the
    # slack's crossing; saturated at the lowest rate: below it
    sat = slo_capacity([(2.0, 0.1), (4.0, 0.1)], saturated_at=4.0)
    assert sat.bound == SATURATED and sat.value == pytest.approx(3.0)
    crossing = slo_capacity([(2.0, 0.1), (4.0, -0.1)], saturated_at=4.0)
    assert crossing.bound == INTERPOLATED and crossing.value == pytest.approx(3.0)
    assert slo_capacity([(2.0, 0.1), (4.0, 0.1)], saturated_at=2.0).bound == BELOW
    below = slo_capacity([(2.0, -0.1), (4.0, -0.3)])
    assert below.value is None and below.bound == BELOW
    assert slo_capacity([]) is None


def _cells(arm, crossings, rates=(1.0, 2.0, 3.0, 4.0)):
    """Rate cells of one arm whose slack falls linearly through 0 at `crossings[rep]`."""
    return [{"arm": arm, "rep": rep, "rate": r, "slo_slack": 0.1 * (x - r), "saturated": None}
            for rep, x in enumerate(crossings) for r in rates]


def test_arm_capacities_interval_ratio_aa_and_headline():
    cells = _cells("torch", [2.0, 2.1, 1.9]) + _cells("exact", [3.4, 3.5, 3.3])
    cells += _cells("torch#2", [2.0, 2.0, 2.0])
    rows = {r["arm"]: r for r in arm_capacities(cells, "torch", ["torch", "exact", "torch#2"])}
    t, e = rows["torch"], rows["exact"]
    assert t["capacity"] == pytest.approx(2.0) and (t["lo"], t["hi"]) == pytest.approx((1.9, 2.1))
    assert t["coverage"] == pytest.approx(0.75) and t["bounds"] == [INTERPOLATED]
    assert e["ratio"]["estimate"] == pytest.approx(1.7) and e["ratio"]["lo"] == pytest.approx(3.5 / 2.1)
    assert rows["torch#2"]["aa"] and rows["torch#2"]["ratio_estimate"] == pytest.approx(1.0)
    (line,) = headlines(list(rows.values()), parse_slo("ttft:500,tpot:50"))
    assert line == ("exact serves 1.70x (1.67x-1.74x) the rate of torch at TTFT p90 <= 500 ms, "
                    "TPOT p90 <= 50 ms (A/A 1.00x)")


def test_headline_says_when_a_capacity_is_only_bounded():
    cells = _cells("torch", [2.0, 2.0]) + _cells("exact", [9.0, 9.0])
    rows = arm_capacities(cells, "torch", ["torch", "exact"])
    exact = next(r for r in rows if r["arm"] == "exact")
    assert exact["bounds"] == [AT_LEAST] and exact["capacity"] == 4.0
    (line,) = headlines(rows, parse_slo("ttft:500"))
    assert "no A/A arm; a capacity is only bounded" in line


def test_measured_window_and_rate_figures_of_an_unloaded_cell():
    recs = [_rec(i, i * 0.5, 0.05, 0.01) for i in range(20)]
    assert [r["request"] for r in measured_records(recs, 0.1, 0.2)] == list(range(2, 16))
    fig = rate_figures(recs, 0.1, 0.1)
    assert fig["measured"] == 16 and fig["offered_rate"] == pytest.approx(2.0)
    assert fig["sent_rate"] == pytest.approx(2.0) and fig["achieved_rate"] == pytest.approx(2.0)
    assert fig["queue_delay_max"] == 0 and fig["ttft_growth"] == pytest.approx(0.0)
    assert fig["tok_s_per_user"] == pytest.approx(100.0)
    assert fig["window_tok_s"] == pytest.approx(5 * 2.0, rel=0.1)  # 5 tokens a request, 2 requests/s
    assert saturation(fig, 0.1) is None


def test_achieved_rate_never_exceeds_the_offered_one():
    # finishes bunched into one step (a batch that finishes together), or every request living longer
    # than the cell's arrivals: the server kept up, achieved = offered, no saturation
    bunched = [_rec(i, i * 0.1, 4.0 - i * 0.1, 0.0) for i in range(20)]
    fig = rate_figures(bunched)
    assert fig["offered_rate"] == pytest.approx(10.0) and fig["achieved_rate"] == pytest.approx(10.0)
    long_lived = [_rec(i, i * 0.1, 0.05, 1.0) for i in range(20)]
    fig = rate_figures(long_lived)
    assert fig["achieved_rate"] == pytest.approx(fig["offered_rate"]) and saturation(fig, 0.1) is None
    assert fig["arrival_s"] == pytest.approx(1.5)


def test_saturation_by_achieved_rate_queue_and_ttft_growth():
    # a server serving one request per second while 2 arrive: each waits for the previous one
    served = [_rec(i, i * 0.5, 0.05 + i * 0.5, 0.01) for i in range(20)]
    fig = rate_figures(served)
    assert fig["offered_rate"] == pytest.approx(2.0) and fig["achieved_rate"] == pytest.approx(1.0)
    assert ttft_growth(served) > 1 and "short of the offered" in saturation(fig, 0.1)
    # the client holds requests back (max concurrency): sends late, the server itself is fast
    held = [_rec(i, i * 0.5, 0.05, 0.01, send=i * 0.5 + i * 0.25) for i in range(20)]
    fig = rate_figures(held)
    assert fig["sent_rate"] == pytest.approx(4 / 3) and fig["queue_delay_max"] == pytest.approx(4.25)
    assert saturation(fig, 0.1) is not None
    # TTFT more than doubling across the cell while completions keep pace (decode speeding up as the
    # queue builds): saturated; a milder rise is not
    growing = [_rec(i, i * 0.5, 0.05 + 0.1 * i, (2.0 - 0.05 - 0.1 * i) / 4) for i in range(20)]
    fig = rate_figures(growing)
    assert fig["achieved_rate"] == pytest.approx(2.0) and fig["ttft_growth"] == pytest.approx(1.4 / 0.6 - 1)
    assert "TTFT grows across the cell" in saturation(fig, 0.1)
    mild = [_rec(i, i * 0.5, 0.05 + 0.01 * i, 0.01) for i in range(20)]
    assert saturation(rate_figures(mild), 0.1) is None
    failed = [dict(r, status="timeout") for r in served]
    assert saturation(rate_figures(failed), 0.1) == "no measured request finished"
