"""`rltbench capacity` on the CPU with tiny presets: the run directory, the burst at the largest C (the
engine holds all C at once), re-rendering, and a budget that admits nothing failing before any run."""

from __future__ import annotations

import json

from rltbench.backends.engine import EngineBackend
from rltbench.cli import main

TINY = ["capacity", "--models", "ouro-tiny,huginn-tiny", "--input-len", "16", "--output-len", "4",
        "--device", "cpu"]


def test_capacity_rows_burst_and_rerender(tmp_path, monkeypatch):
    out = tmp_path / "run"
    warmups: list[int] = []
    original = EngineBackend.warmup

    def counted(self, arm, prompts, *args, **kwargs):
        warmups.append(len(prompts))
        return original(self, arm, prompts, *args, **kwargs)

    monkeypatch.setattr(EngineBackend, "warmup", counted)
    assert main([*TINY, "--memory-gib", "0.0005", "--burst", "--result-dir", str(out)]) == 0
    rows = json.loads((out / "capacity.json").read_text())
    assert [(r["model"], r["layout"], r["kind"]) for r in rows] == [
        ("ouro-tiny", "3 loops x 2 layers", "engine"), ("ouro-tiny", "per-application", "baseline"),
        ("huginn-tiny", "full", "engine"), ("huginn-tiny", "compress", "engine"),
        ("huginn-tiny", "per-application", "baseline")]
    by = {(r["model"], r["layout"]): r for r in rows}
    assert by[("huginn-tiny", "compress")]["max_seqs"] >= 2 * by[("huginn-tiny", "full")]["max_seqs"]
    cells = json.loads((out / "cells.json").read_text())
    assert len(cells) == 3
    assert warmups == [c["C"] for c in cells]   # every burst size is warmed up before it is timed
    for c in cells:
        assert c["valid"] and not c["cold"]
        assert c["max_decode_batch"] == c["C"] == c["requests"]
        assert c["engine_num_blocks"] == c["predicted_num_blocks"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert (out / "capacity.png").is_file()
    table = (out / "table.md").read_text()
    assert "1.88x" in table and "timings mean nothing" in table
    (out / "table.md").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "table.md").read_text() == table


def test_capacity_without_burst_on_cpu_is_prediction_only(tmp_path):
    out = tmp_path / "run"
    assert main([*TINY, "--result-dir", str(out)]) == 0
    assert not (out / "requests.jsonl").exists()
    assert "CPU default 16 GiB" in (out / "table.md").read_text()


def test_budget_that_admits_nothing_exits_2_before_any_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--memory-gib", "0.00001", "--result-dir", str(out)]) == 2
    assert not out.exists()
    assert "raise --memory-gib" in capsys.readouterr().err
