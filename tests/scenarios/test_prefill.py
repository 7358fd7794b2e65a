"""`rltbench prefill` on the CPU with a tiny preset: both policies run interleaved with the A/A copy,
one-per-step really runs one request per prefill step, tokens agree, no verdict on the CPU."""

from __future__ import annotations

import json

from rltbench.cli import main


def test_prefill_policies_cells_identity_and_no_cpu_verdict(tmp_path):
    out = tmp_path / "run"
    assert main(["prefill", "--models", "huginn-tiny", "--input-lens", "12", "--concurrency", "3",
                 "--output-len", "2", "--max-num-batched-tokens", "64", "--device", "cpu",
                 "--result-dir", str(out)]) == 0
    cells = json.loads((out / "cells.json").read_text())
    assert [(c["arm"], c["rep"]) for c in cells] == [
        ("packed", 0), ("one-per-step", 0), ("packed#2", 0),
        ("packed#2", 1), ("one-per-step", 1), ("packed", 1)]
    for c in cells:
        assert c["valid"] and not c["cold"]
        assert c["prefill_rows_max"] == (1 if c["arm"] == "one-per-step" else 3)
        assert c["prefill_steps"] == (3 if c["arm"] == "one-per-step" else 1)
    ident = json.loads((out / "identity.json").read_text())
    assert {r["policy"] for r in ident} == {"one-per-step", "packed#2"}
    assert all(r["identical"] == r["compared"] == 6 for r in ident)
    comp = json.loads((out / "comparison.json").read_text())
    assert comp and all(r["verdict"].startswith("no verdict") for r in comp)
    table = (out / "table.md").read_text()
    assert "2.0-2.4x" in table and (out / "prefill.png").is_file()
    (out / "table.md").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "table.md").read_text() == table


def test_length_beyond_context_exits_2_before_any_run(tmp_path):
    out = tmp_path / "run"
    assert main(["prefill", "--models", "huginn-tiny", "--input-lens", "600", "--device", "cpu",
                 "--result-dir", str(out)]) == 2
    assert not out.exists()
