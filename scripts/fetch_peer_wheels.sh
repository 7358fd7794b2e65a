#!/usr/bin/env bash
# Download, into .whl/peer/, the peer benchmark client (guidellm) and the dependencies the GPU box
# lacks, as CPython 3.12 x86-64 wheels (the box has no network). scripts/serve_bench.sh installs them
# into a private directory used by the guidellm process only. Run on a machine with PyPI access.
# Left out on purpose: sanic, sanic-routing, httptools, ujson, tracerite, html5tagger (guidellm's mock
# server only); everything else guidellm imports that is not listed here is in the box's image
# (aiohttp, httpx, msgpack, uvloop, numpy, pandas, pyarrow, transformers, torch, rich, pyyaml, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/peer
plat=(--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
for pkg in guidellm==0.8.1 aiologic==0.17.1 annotated-types==0.8.0 culsans==0.10.0 datasets==5.2.0 \
           dill==0.4.1 eval-type-backport==0.4.0 faker==40.63.0 ftfy==6.3.1 loguru==0.7.3 \
           more-itertools==11.2.1 multiprocess==0.70.19 pydantic==2.14.4 pydantic-core==2.50.5 \
           pydantic-settings==2.16.3 python-dotenv==1.2.4 sniffio==1.3.1 typing-inspection==0.4.5 \
           wcwidth==0.9.4 websockets==17.4 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 click==8.4.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl/peer "$pkg"
done
du -ch .whl/peer/*.whl | tail -1
