"""`rltbench kernels --diagnose carryover` without a GPU: bad input refused with exit 2 before any
work, and the summary (positions 1-2 against the twin) and table from synthetic samples."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rltbench.commands.kernels import carryover as co_module


@pytest.fixture(scope="module")
def co() -> dict:
    return vars(co_module)


@pytest.mark.parametrize("args, message", [
    (["--diagnose", "nope"], "--diagnose: unknown value 'nope'"),
    (["--ops", "nope"], "unknown op 'nope'"),
    (["--dtypes", "int8"], "--dtypes 'int8'"),
    (["--positions", "2"], "--positions"),
    (["--trials", "1"], "--trials"),
    (["--tokens", "0"], "--tokens and --widths must be positive"),
    (["--tokens", "1,8"], "--tokens: --diagnose takes one value"),
])
def test_bad_input_exits_2_before_any_work(tmp_path, monkeypatch, args, message) -> None:
    from rltbench.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    args = ["--diagnose", "carryover", *args] if args[0] != "--diagnose" else args
    res = CliRunner().invoke(app, ["kernels", *args, "--result-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and message in res.output
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
