"""The root conftest's switch between the Triton interpreter (CPU runs) and the GPU (`--run-gpu`)
must hold in pytest-xdist workers too, whose sys.argv does not carry the command line: `-n 8
--run-gpu` once ran every GPU test interpreted (bitwise checks against torch CUDA then fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("workers", [None, "2"])
@pytest.mark.parametrize("run_gpu", [False, True])
def test_interpreter_only_without_run_gpu(run_gpu: bool, workers: str | None) -> None:
    if workers:
        pytest.importorskip("xdist")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RLTBENCH_PYTEST_RUN_GPU")}
    env["RLTBENCH_EXPECT_INTERPRET"] = "0" if run_gpu else "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/_probe_interpreter.py"]
    cmd += ["--run-gpu"] if run_gpu else []
    cmd += ["-n", workers] if workers else []
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


@pytest.mark.parametrize("slow", [False, True])
def test_slow_tests_run_only_with_the_slow_flag(slow: bool) -> None:
    """The default run skips tests marked slow (quick on two cores); --slow, which CI passes, runs
    them."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/_probe_slow.py", "-rs"]
    cmd += ["--slow"] if slow else []
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("1 passed" if slow else "1 skipped") in proc.stdout
    assert slow or "run with --slow" in proc.stdout
