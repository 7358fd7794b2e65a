#!/usr/bin/env bash
# One command on a remote GPU machine without network access whose files come back through $OUT:
# run the given gpu_suite.py stages under an overall time budget, then pack what they wrote.
#
#   RLTBENCH_GIT_SHA=<sha> bash scripts/device_call.sh BUDGET_S stage [stage ...]
#
# <sha>: the local checkout's `git rev-parse HEAD`, written into the command as a literal. A copied
# tree can carry stale git metadata (seen: one commit behind its files), so $(git rev-parse HEAD)
# evaluated on the remote machine names the wrong commit in every manifest.
#
# Triton's compile cache lives in .tcache/ (TRITON_CACHE_DIR) and is packed too: copied to
# .tcache.txz and carried into the next call, it saves the fast exact norm's start-up compiles
# (about a minute per dtype and width on a cold cache). xz, not gzip: the carried tree has a 64 MiB
# limit and the gzip pack had grown to 11.7 MB (xz preset 1: 7.3 MB in 3 s; python's tarfile, so no
# xz binary is needed). Results: $OUT/gpu.tgz (results/gpu/<stage>, suite.json, the tuned files),
# $OUT/tcache.txz when it fits the 16 MiB a returned file may have.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=$1; shift
export TRITON_CACHE_DIR="$PWD/.tcache" PYTHONUNBUFFERED=1
mkdir -p "$TRITON_CACHE_DIR"
# a cache packed by an earlier call (carry .tcache.txz): same GPU kind, same Triton, so it hits
if [ -f .tcache.txz ]; then
  python3 -c "import tarfile; tarfile.open('.tcache.txz', 'r:xz').extractall(filter='data')" \
    && echo "triton cache: $(du -sh .tcache | cut -f1) from .tcache.txz"
fi
timeout --signal=INT --kill-after=20 "$budget" python3 scripts/gpu_suite.py "$@"
echo "suite rc=$?"
dirs=()
for s in "$@"; do s=${s/@base/-base}; [ -d "results/gpu/$s" ] && dirs+=("results/gpu/$s"); done
tar czf "$OUT/gpu.tgz" "${dirs[@]}" results/gpu/suite.json rltbench/tuned_configs
python3 scripts/slim_triton_cache.py .tcache   # metadata + cubins only: a few MB
python3 -c "import sys, tarfile; t = tarfile.open(sys.argv[1], 'w:xz', preset=1); t.add('.tcache'); t.close()" \
  "$OUT/tcache.txz"
size=$(stat -c %s "$OUT/tcache.txz")
if [ "$size" -gt 16000000 ]; then echo "tcache.txz $size bytes: too big to return"; rm -f "$OUT/tcache.txz"; fi
ls -l "$OUT"
