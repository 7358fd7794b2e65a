#!/usr/bin/env bash
# One call on a lent GPU box (no network, results fetched from $OUT): run the given gpu_suite.py
# stages under an overall time budget, then pack what they wrote so it comes back.
#
#   RLTBENCH_GIT_SHA=<sha> bash scripts/device_call.sh BUDGET_S stage [stage ...]
#
# <sha>: the local checkout's `git rev-parse HEAD`, written into the command as a literal. The lent
# box's copy of the tree can carry stale git metadata (session 5: one commit behind its files), so
# $(git rev-parse HEAD) evaluated there names the wrong commit in every manifest.
#
# Triton's compile cache lives in .tcache/ (TRITON_CACHE_DIR) and is packed too: copied to
# .tcache.tgz and carried into the next call, it saves the fast exact norm's start-up compiles
# (about a minute per dtype and width on a cold cache). Results: $OUT/gpu.tgz (results/gpu/<stage>, suite.json, the tuned files),
# $OUT/tcache.tgz when it fits the 16 MiB a returned file may have.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=$1; shift
export TRITON_CACHE_DIR="$PWD/.tcache" PYTHONUNBUFFERED=1
mkdir -p "$TRITON_CACHE_DIR"
# a cache packed by an earlier call (carry .tcache.tgz): same GPU kind, same Triton, so it hits
if [ -f .tcache.tgz ]; then tar xzf .tcache.tgz && echo "triton cache: $(du -sh .tcache | cut -f1) from .tcache.tgz"; fi
timeout --signal=INT --kill-after=20 "$budget" python3 scripts/gpu_suite.py "$@"
echo "suite rc=$?"
dirs=()
for s in "$@"; do [ -d "results/gpu/$s" ] && dirs+=("results/gpu/$s"); done
tar czf "$OUT/gpu.tgz" "${dirs[@]}" results/gpu/suite.json rltbench/tuned_configs
python3 scripts/slim_triton_cache.py .tcache   # metadata + cubins only: a few MB
tar czf "$OUT/tcache.tgz" .tcache
size=$(stat -c %s "$OUT/tcache.tgz")
if [ "$size" -gt 16000000 ]; then echo "tcache.tgz $size bytes: too big to return"; rm -f "$OUT/tcache.tgz"; fi
ls -l "$OUT"
