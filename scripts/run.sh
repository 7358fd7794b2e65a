#!/usr/bin/env bash
# The main job of the README: install into ./.venv, then run `rltbench` with the given arguments
# (default: `kernels`, the microbenchmarks with bitwise checks of every arm). On a machine with
# no GPU the kernels run through the Triton interpreter at small sizes and no timing is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRITON_INTERPRET=1
fi
if [ "$#" -eq 0 ]; then set -- kernels; fi
exec .venv/bin/rltbench "$@"
