"""`rltbench kernels --diagnose carryover` without a GPU: the summary (positions 1-2 against the twin)
and table from synthetic samples (its bad input: tests/test_bad_input.py)."""

from __future__ import annotations

import pytest

from rltbench.commands.kernels import carryover as co_module


@pytest.fixture(scope="module")
def co() -> dict:
    return vars(co_module)


def test_summary_compares_a_slots_positions_with_the_twin(co) -> None:
    def curve(level: float, first: float) -> list[list[float]]:
        return [[first, first], [level, level], [level, level], [9.0, 9.0]]

    samples = {"exact": {"twin": curve(10.0, 12.0), "torch": curve(10.2, 12.0)}}
    summary = co["summarize"](samples)
    assert summary["exact"]["twin"]["median_us"] == [12.0, 10.0, 10.0, 9.0]
    assert summary["exact"]["torch"]["slot_median_us"] == pytest.approx(10.2)
    assert summary["exact"]["torch"]["slot_vs_twin"] == pytest.approx(1.02)
    text = co["table"](summary, {"op": "rmsnorm", "tokens": 4096, "width": 2048, "dtype": "bf16",
                                 "graph_calls": 32, "rotation_sets": 6, "trials": 2})
    assert "| exact | torch | 12.000 | 10.200 | 10.200 | 9.000 | 10.200 | 1.0200 |" in text
