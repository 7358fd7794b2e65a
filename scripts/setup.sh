#!/usr/bin/env bash
# Create ./.venv and install rltbench with its test extras. Idempotent: a second run only checks.
# On a machine without an NVIDIA GPU, torch is pinned to the CPU build (2.13.0) first, so pip does
# not pull gigabytes of CUDA wheels; on a GPU machine the default (CUDA) torch wheel is used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==2.13.0"
fi
"$VPY" -m pip install -q -e ".[test]"
echo "rltbench installed in $(pwd)/.venv"
# The native CUDA C++ arm builds itself at first use; say now whether it can on this machine.
"$VPY" -m rltbench.native --status || true
