#!/usr/bin/env bash
# Create ./.venv and install rltbench with its test extras, showing what it does. A second run
# checks a stamp (pyproject.toml and this script) and returns at once when nothing changed, so
# `./scripts/run.sh --help` does not reinstall. On a machine without an NVIDIA GPU, torch is pinned
# to the CPU build (2.13.0) first, so pip does not pull gigabytes of CUDA wheels; on a GPU machine
# the default (CUDA) torch wheel is used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
STAMP=.venv/.rltbench-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -x "$VPY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0  # installed from this pyproject.toml already
fi
step() { printf '\033[1msetup [%s/4]\033[0m %s\n' "$1" "$2"; }
if [ ! -x "$VPY" ]; then
  step 1 "creating ./.venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
else
  step 1 "updating ./.venv (pyproject.toml or this script changed since the last install)"
fi
step 2 "upgrading pip"
"$VPY" -m pip install --disable-pip-version-check -q --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
  step 3 "installing torch 2.13.0, the CPU build (no NVIDIA GPU here; ~200 MB)"
  "$VPY" -m pip install --disable-pip-version-check "torch==2.13.0"
else
  step 3 "NVIDIA GPU found: torch comes with rltbench's requirements (CUDA build)"
fi
step 4 "installing rltbench (editable) and its test tools (pytest, ruff, lm-eval; ~1-2 min the first time)"
"$VPY" -m pip install --disable-pip-version-check -e ".[test]"
"$VPY" -c "import rltbench, torch, triton" || { echo "setup: rltbench did not import" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "rltbench installed in $(pwd)/.venv (torch $("$VPY" -c 'import torch; print(torch.__version__)'))"
# The native CUDA C++ arm builds itself at first use; say now whether it can on this machine.
"$VPY" -m rltbench.native --status || true
