"""scripts/serve_bench.sh's rate step, run with stand-ins for python and guidellm that only record
their command lines: the order of the clients (rltbench, guidellm, rltbench again: the A/A leg), the
same options for both rltbench runs, a KV check after each client, and the A/A run handed to
rate-compare. No server, no GPU: what is checked is the script's plumbing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "serve_bench.sh"

# Records "$*" per call; `--result-dir D` leaves D/manifest.json (unless D is $FAIL_DIR: exit 1, nothing
# written); `serve` prints the shutdown line the script checks for.
STAND_IN = r"""#!/usr/bin/env bash
echo "$*" >>"$CALLS"
prev=""
for a in "$@"; do
  if [ "$prev" = --result-dir ]; then
    [ "$(basename "$a")" = "${FAIL_DIR:-}" ] && exit 1
    mkdir -p "$a" && echo '{}' >"$a/manifest.json"
  fi
  prev=$a
done
[[ " $* " == *" serve "* ]] && echo "KV blocks at shutdown: 8/8 free, 0 in use"
exit 0
"""


def _run_rate_step(tmp_path: Path, fail_dir: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    stand_in = tmp_path / "py"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PY": str(stand_in), "PEER_PY": str(stand_in), "STEPS": "rate", "RATES": "2,4,8",
           "RATE_REQUESTS": "80", "CALLS": str(calls), "FAIL_DIR": fail_dir}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc, calls.read_text().splitlines()


def _index(calls: list[str], *parts: str) -> list[int]:
    return [i for i, c in enumerate(calls) if all(p in c for p in parts)]


pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_rate_step_runs_rltbench_guidellm_rltbench_and_compares_all_three(tmp_path):
    proc, calls = _run_rate_step(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    first, again = _index(calls, "rltbench.cli e2e", "--workload rate")
    [peer] = _index(calls, "-m guidellm run")
    [compare] = _index(calls, "rate-compare")
    assert first < peer < again < compare
    assert calls[first].endswith(f"--result-dir {out}/e2e-rate")
    assert calls[again] == calls[first] + "-aa"  # the same options, another directory
    checks = _index(calls, "rltbench.server.bench check")
    assert [c for c in checks if c > first][:3] == [first + 1, peer + 1, again + 1]
    legs = f"--rlt {out}/e2e-rate --peer {out}/guidellm_rate.json --rlt-aa {out}/e2e-rate-aa"
    assert legs in calls[compare]


def test_a_failed_aa_run_is_counted_and_the_check_runs_without_it(tmp_path):
    proc, calls = _run_rate_step(tmp_path, fail_dir="e2e-rate-aa")
    assert proc.returncode == 1 and "FAILED steps: e2e-rate-aa" in proc.stdout
    [compare] = _index(calls, "rate-compare")
    assert "--rlt-aa" not in calls[compare]
