#!/usr/bin/env bash
# Download, into .whl/, the wheels a GPU box without network needs for `rltbench gsm8k` (lm-eval
# and the dependencies its image lacks), for the Liger peer column of `rltbench kernels`
# (liger-kernel, pure Python) and for the parallel GPU test stage (pytest-xdist); Python
# 3.12, x86-64. scripts/gpu_suite.py installs them into a scratch directory when lm_eval is not
# importable there. Run on a machine with PyPI access.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
for pkg in lm-eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 evaluate==0.4.6 \
           more-itertools==11.2.1 pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5 \
           pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1 \
           nltk==3.10.4 pytest-xdist==3.8.0 execnet==2.1.2 liger-kernel==0.8.5; do
  python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl "$pkg"
done
# pure-Python packages published as sources only: build their wheels here
python3 -m pip wheel -q --no-deps -w .whl rouge_score==0.1.2 sqlitedict==2.1.0 word2number==1.1
ls .whl
