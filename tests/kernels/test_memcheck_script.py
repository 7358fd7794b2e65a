"""The compute-sanitizer workload script runs (through the interpreter here) and checks exactness,
so the GPU suite's memcheck stage cannot rot unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # about 35 s: every kernel of the memcheck workload, interpreted
def test_memcheck_workload_runs_on_cpu() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "memcheck_kernels.py")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exact outputs equal to torch" in out.stdout
