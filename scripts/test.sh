#!/usr/bin/env bash
# The test command of the README: install into ./.venv, lint, then run the CPU test suite
# (Triton kernels run through the interpreter). Extra arguments go to pytest, e.g. --run-gpu.
# Exit status is pytest's, except that "no tests collected" (5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/ruff check rltbench tests || exit 1
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
exit "$rc"
