"""scripts/carryover.py without a GPU: bad input refused with exit 2 before any work, and the summary
(positions 1-2 against the twin) and table from synthetic samples."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "carryover.py"


@pytest.fixture(scope="module")
def co() -> dict:
    return runpy.run_path(str(SCRIPT))


@pytest.mark.parametrize("args, message", [
    (["--op", "nope"], "unknown op 'nope'"),
    (["--dtype", "int8"], "--dtype 'int8'"),
    (["--positions", "2"], "--positions must be at least 3"),
    (["--trials", "1"], "--trials must be at least 2"),
    (["--tokens", "0"], "--tokens and --width must be positive"),
])
def test_bad_input_exits_2_before_any_work(co, tmp_path, capsys, args, message) -> None:
    rc = co["main"](["--result-dir", str(tmp_path / "run"), *args])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


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
