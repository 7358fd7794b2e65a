"""Metrics against hand-computed timestamps (definitions: docs/contracts/e2e.md)."""

from __future__ import annotations

import pytest

from rltbench.results.serving import (
    cell_metrics,
    cell_summary,
    compute_cells,
    itl_samples,
    percentiles,
    pooled_metrics,
    request_metrics,
    steady_window,
)


def rec(send, times, counts=None, status="ok", expected=None, **kw):
    counts = counts or [1] * len(times)
    n = sum(counts)
    return {
        "send": send,
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
        "event_times": times,
        "event_tokens": counts,
        "token_ids": list(range(n)),
        "status": status,
        "expected_len": expected or n,
        **kw,
    }


def test_request_metrics_hand_computed():
    r = rec(10.0, [10.5, 10.7, 11.0, 11.1])
    m = request_metrics(r)
    assert m["n"] == 4
    assert m["ttft"] == pytest.approx(0.5)
    assert m["e2e"] == pytest.approx(1.1)
    assert m["tpot"] == pytest.approx((1.1 - 0.5) / 3)
    assert m["itl"] == pytest.approx([0.2, 0.3, 0.1])


def test_itl_splits_multi_token_events():
    # second event carries 3 tokens after 0.6 s -> three gaps of 0.2 s
    r = rec(0.0, [1.0, 1.6, 1.7], counts=[1, 3, 1])
    assert itl_samples(r) == pytest.approx([0.2, 0.2, 0.2, 0.1])
    m = request_metrics(r)
    assert m["n"] == 5 and m["tpot"] == pytest.approx(0.7 / 4)
    assert sum(m["itl"]) == pytest.approx(m["e2e"] - m["ttft"])


def test_single_token_request_has_no_tpot():
    m = request_metrics(rec(0.0, [0.25]))
    assert m["tpot"] is None and m["itl"] == [] and m["ttft"] == pytest.approx(0.25)


def test_percentiles_counts_and_low_n_flag():
    p = percentiles([float(i) for i in range(1, 9)])
    assert p["n"] == 8 and p["p50"] == pytest.approx(4.5) and p["p99_low_n"] is True
    assert p["p99"] == pytest.approx(7.93)
    big = percentiles([float(i) for i in range(200)] + [None])
    assert big["n"] == 200 and big["p99_low_n"] is False
    assert percentiles([])["p50"] is None


def test_cell_summary_throughput_steady_window_validity():
    # two requests sent at 0; first tokens at 1.0 and 2.0; finishes at 4.0 and 5.0
    a = rec(0.0, [1.0, 2.0, 3.0, 4.0])
    b = rec(0.0, [2.0, 3.0, 4.0, 4.5, 5.0])
    s = cell_summary([a, b])
    assert s["valid"] and s["n_ok"] == 2 and s["output_tokens"] == 9
    assert s["output_tok_s"] == pytest.approx(9 / 5.0)
    # window (2.0, 4.0]: a has 3.0, 4.0; b has 3.0, 4.0 -> 4 tokens / 2 s
    assert steady_window([a, b]) == (2.0, 4.0, 4)
    assert s["steady_tok_s"] == pytest.approx(2.0)
    assert s["ttft_n"] == 2 and s["ttft_p50"] == pytest.approx(1.5)
    bad = cell_summary([a, rec(0.0, [1.0, 2.0], status="length_mismatch", expected=4)])
    assert not bad["valid"] and bad["n_length_mismatch"] == 1
    assert cell_summary([])["valid"] is False


def test_prefix_hit_rate_from_requests():
    a = rec(0.0, [1.0, 2.0], prefix_hit_tokens=32, prompt_len=64)
    b = rec(0.0, [1.0, 2.0], prefix_hit_tokens=0, prompt_len=64)
    s = cell_summary([a, b], burst=False)
    assert s["measured_prefix_hit_rate"] == pytest.approx(0.25) and s["steady_tok_s"] is None


def test_cell_metrics_named_fields_are_the_files_columns():
    """cell_metrics computes a cell once; its named fields and the flat cells.csv row agree, and the
    pooled figures of the e2e tables come from valid repetitions only."""
    a, b = rec(0.0, [1.0, 2.0, 3.0, 4.0]), rec(0.0, [2.0, 3.0, 4.0, 4.5, 5.0])
    m = cell_metrics([a, b])
    row = m.row()
    assert row == cell_summary([a, b])
    assert m.output_tok_s == row["output_tok_s"] and m.latency.ttft.p50 == row["ttft_p50"]
    assert list(row)[:10] == ["requests", "n_ok", "n_error", "n_timeout", "n_length_mismatch", "valid",
                              "output_tokens", "duration_s", "output_tok_s", "steady_tok_s"]
    assert "prefix_hit_tokens" not in row and "mean_exit_depth" not in row
    records = [{**r, "arm": "A", "cell": "C=2", "C": 2, "rep": rep} for rep in (0, 1) for r in (a, b)]
    records[2]["status"] = "error"  # repetition 1 is invalid
    (p,) = pooled_metrics(records, compute_cells(records), ["A"])
    assert (p.arm, p.cell, p.C, p.valid_reps) == ("A", "C=2", 2, 1)
    assert p.output_tok_s_median == pytest.approx(9 / 5.0) and p.latency.ttft.n == 2
