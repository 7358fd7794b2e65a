#!/usr/bin/env bash
# `rltbench serve` measured on a GPU, all into OUT (default results/gpu/serve):
#   1. start `rltbench serve` (Ouro-1.4B, random weights, exact arm, warm before listening)
#   2. rltbench's own client over HTTP: `rltbench e2e --backend openai`, bursts C=1,8,32,128
#   3. soak: 10 consecutive C=128 bursts, 0 failed requests and every KV block free after each (/metrics)
#   4. the peer client (guidellm, wheels from .whl/peer: scripts/fetch_peer_wheels.sh) on the same load
#   5. SIGTERM: the server must exit 0 with every KV block returned
#   6. the same bursts in-process (`rltbench e2e --backend engine`), after the server freed the GPU
#   7. table.md: HTTP vs in-process overhead, guidellm vs rltbench
# Each step runs even if an earlier one failed; the exit status says whether all succeeded.
# Knobs (environment): PY MODEL ARM CONC IN_LEN OUT_LEN REPEATS SOAK SOAK_C PORT DEVICE_ARGS PEER_PY.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu/serve}
PY=${PY:-python3}
MODEL=${MODEL:-ouro-1.4b}
ARM=${ARM:-exact}
CONC=${CONC:-1,8,32,128}
IN_LEN=${IN_LEN:-512}
OUT_LEN=${OUT_LEN:-128}
REPEATS=${REPEATS:-2}
SOAK=${SOAK:-10}
SOAK_C=${SOAK_C:-128}
PORT=${PORT:-8199}
DEVICE_ARGS=${DEVICE_ARGS:---dtype bfloat16 --device cuda}
MAX_SEQS=$(echo "$CONC,$SOAK_C" | tr ',' '\n' | sort -n | tail -1)
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
failed=()
step() { echo "=== $1 ($(date +%T))"; }

step "serve"
tok_dir=$(mktemp -d)  # the id-word tokenizer, shared with the peer client (not a result)
# shellcheck disable=SC2086
$PY -m rltbench.cli serve --model "$MODEL" --weights random --arm "$ARM" $DEVICE_ARGS --port "$PORT" \
  --max-model-len $((IN_LEN + OUT_LEN)) --warmup-prefill-len "$IN_LEN" --no-prefix-caching \
  --max-num-seqs "$MAX_SEQS" --tokenizer ids --export-tokenizer "$tok_dir" >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null' EXIT
if ! $PY -m rltbench.commands.serve.bench wait "$URL" --timeout 400; then
  tail -20 "$OUT/server.log"
  exit 1
fi
grep -m2 -E "warming up|ready on" "$OUT/server.log"

step "rltbench e2e over HTTP"
$PY -m rltbench.commands.serve.bench scrape "$URL" "$OUT/metrics_http_before.json"
$PY -m rltbench.cli e2e --backend openai --arm "$ARM=$URL" --model "$MODEL" --concurrency "$CONC" \
  --input-len "$IN_LEN" --output-len "$OUT_LEN" --repeats "$REPEATS" --no-live \
  --result-dir "$OUT/e2e-http" || failed+=(e2e-http)
$PY -m rltbench.commands.serve.bench scrape "$URL" "$OUT/metrics_http_after.json"

step "soak: $SOAK bursts of C=$SOAK_C"
$PY -m rltbench.commands.serve.bench soak "$URL" --model "$MODEL" --bursts "$SOAK" --concurrency "$SOAK_C" \
  --input-len "$IN_LEN" --output-len "$OUT_LEN" --out "$OUT/soak" || failed+=(soak)

step "peer client: guidellm"
PEER_PY=${PEER_PY:-}
if [ -z "$PEER_PY" ] && ls .whl/peer/*.whl >/dev/null 2>&1; then
  peer_site=$(mktemp -d)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$peer_site" \
    .whl/peer/*.whl && PEER_PY="env PYTHONPATH=$peer_site:${PYTHONPATH:-} $PY"
fi
if [ -n "$PEER_PY" ]; then
  cat >"$OUT/guidellm_scenario.json" <<EOF
{"metadata": {"name": "rltbench-burst", "description": "bursts of C requests, as rltbench e2e --workload burst"},
 "spec": {"backend": {"kind": "openai_http", "target": "$URL", "request_format": "/v1/completions"},
          "profile": {"kind": "concurrent", "streams": [$CONC]},
          "constraints": [{"kind": "max_requests", "count": [$CONC]}],
          "tokenizer": {"kind": "huggingface_auto", "model": "$tok_dir"},
          "data": [{"kind": "synthetic_text", "prompt_tokens": $IN_LEN, "output_tokens": $OUT_LEN}]}}
EOF
  $PY -m rltbench.commands.serve.bench scrape "$URL" "$OUT/metrics_peer_before.json"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $PEER_PY -m guidellm run -c "$OUT/guidellm_scenario.json" \
    --output "kind=json,path=$OUT/guidellm.json" --disable-console-interactive >"$OUT/guidellm.log" 2>&1 \
    || { tail -30 "$OUT/guidellm.log"; failed+=(guidellm); }
  $PY -m rltbench.commands.serve.bench scrape "$URL" "$OUT/metrics_peer_after.json"
  grep -A14 "Request Latency Statistics" "$OUT/guidellm.log" || true
  $PY -m rltbench.commands.serve.bench check "$URL" || failed+=(blocks-after-peer)
else
  echo "no .whl/peer wheels (scripts/fetch_peer_wheels.sh) and no PEER_PY: peer client skipped"
  failed+=(guidellm-missing)
fi

step "SIGTERM"
kill -TERM "$server"
wait "$server"
rc=$?
trap - EXIT
tail -3 "$OUT/server.log"
if [ "$rc" -ne 0 ] || ! grep -qE "KV blocks at shutdown: ([0-9]+)/\1 free, 0 in use" "$OUT/server.log"; then
  echo "server exit $rc or blocks not all returned"
  failed+=(shutdown)
fi

step "rltbench e2e in-process"
# shellcheck disable=SC2086
$PY -m rltbench.cli e2e --backend engine --arms "$ARM" --model "$MODEL" $DEVICE_ARGS --concurrency "$CONC" \
  --input-len "$IN_LEN" --output-len "$OUT_LEN" --repeats "$REPEATS" --no-live \
  --result-dir "$OUT/e2e-inproc" || failed+=(e2e-inproc)

step "tables"
peer_arg=()
[ -f "$OUT/guidellm.json" ] && peer_arg=(--peer "$OUT/guidellm.json")
$PY -m rltbench.commands.serve.bench compare --http "$OUT/e2e-http" --inproc "$OUT/e2e-inproc" "${peer_arg[@]}" \
  --scrapes "$OUT" --out "$OUT/table.md" || failed+=(tables)
[ -f "$OUT/soak/soak.md" ] && head -3 "$OUT/soak/soak.md"

rm -rf "$tok_dir" "${peer_site:-}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all steps succeeded: $OUT/table.md"
