"""The one sample summary (results/quantiles.py) and the one Markdown table writer (results/tables.py)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rltbench.results.quantiles import summarize
from rltbench.results.serving import percentiles
from rltbench.results.tables import row, table


def test_summarize_matches_numpy_quantiles() -> None:
    rng = random.Random(5)
    xs = [rng.lognormvariate(1.0, 0.5) for _ in range(101)]
    s = summarize(xs)
    assert s.n == 101
    assert s.median == pytest.approx(float(np.median(xs)))
    for q, v in ((0.1, s.p10), (0.25, s.q1), (0.9, s.p90), (0.99, s.p99)):
        assert v == pytest.approx(float(np.quantile(xs, q)))
    assert s.iqr == pytest.approx(float(np.quantile(xs, 0.75) - np.quantile(xs, 0.25)))
    assert s.min == min(xs) and s.max == max(xs) and s.mean == pytest.approx(sum(xs) / len(xs))


def test_summarize_small_and_invalid_samples() -> None:
    s = summarize([3.0])
    assert (s.median, s.p10, s.p90, s.n) == (3.0, 3.0, 3.0, 1)
    s = summarize([1.0, float("nan"), 3.0, float("inf"), None])
    assert s.n == 2 and s.median == 2.0
    e = summarize([])
    assert e.n == 0 and math.isnan(e.median) and math.isnan(e.p90)
    d = e.to_dict("graph_us_")
    assert set(d) >= {"graph_us_median", "graph_us_p10", "graph_us_p90", "graph_us_n"}


def test_serving_percentiles_are_the_same_summary() -> None:
    vals = [float(i) for i in range(1, 9)]
    p, s = percentiles(vals), summarize(vals)
    assert (p["n"], p["p50"], p["p90"], p["p99"], p["mean"]) == (s.n, s.median, s.p90, s.p99, s.mean)


def test_table_lines_and_alignment() -> None:
    assert row(["a", 1, 2.5]) == "| a | 1 | 2.5 |"
    assert table(["x", "y"], [[1, 2], [3, 4]]) == ["| x | y |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]
    assert table(["x", "y", "z"], [], ["", "r", "r"])[1] == "|---|---:|---:|"
    assert table(["x", "y"], [], "r")[1] == "|---:|---:|"
    # an empty cell keeps its two spaces, as every report wrote them (re-rendered tables stay byte-equal)
    assert row(["a", ""]) == "| a |  |"
