"""Every command's table.md is rebuilt from the raw files of a run (`rltbench report DIR`); for one
committed run per command, re-rendering must give the committed table.md byte for byte, so a change
to a report's sections that changes what a committed run says shows up here.

(pd has no committed run: tests/pd/test_pd_processes.py re-renders a CPU pd run instead.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rltbench.cli import main

RESULTS = Path(__file__).resolve().parent.parent / "results" / "gpu"

RUNS = [
    "exit-stop",            # e2e
    "gsm8k",                # gsm8k
    "profile-b128",         # profile
    "capacity",             # capacity
    "prefill-long",         # prefill
    pytest.param("kernels-verdicts", marks=pytest.mark.slow),  # kernels: a dozen plots
]


@pytest.mark.parametrize("name", RUNS)
def test_committed_table_md_re_renders_byte_for_byte(tmp_path: Path, name: str) -> None:
    committed = RESULTS / name
    run = tmp_path / name
    shutil.copytree(committed, run)
    (run / "table.md").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "table.md").read_bytes() == (committed / "table.md").read_bytes()
