#!/usr/bin/env bash
# `rltbench serve` measured on a GPU, all into OUT (default results/gpu/serve):
#   1. start `rltbench serve` (Ouro-1.4B, random weights, exact arm, warm before listening)
#   2. http: rltbench's own client over HTTP: `rltbench e2e --backend openai`, bursts C=1,8,32,128
#   3. soak: 10 consecutive C=128 bursts, 0 failed requests and every KV block free after each (/metrics)
#   4. peer: the peer client (guidellm, wheels from .whl/peer: scripts/fetch_peer_wheels.sh), same bursts
#   5. rate: the open-loop cross-check at RATES requests/s: `rltbench e2e --workload rate`, guidellm's
#      constant (or poisson) profile, then rltbench's client again (the A/A leg, which tells noise from a
#      difference), same lengths, rates and number of requests; rate_check.md
#   6. SIGTERM: the server must exit 0 with every KV block returned
#   7. inproc: the same bursts in-process (`rltbench e2e --backend engine`), after the server freed the GPU
#   8. table.md: HTTP vs in-process overhead, guidellm vs rltbench (where the http step ran)
# STEPS names the steps of 2-5 and 7 that run (default http,soak,peer,inproc; STEPS=rate runs the
# cross-check alone). Each step runs even if an earlier one failed; the exit status says whether all
# succeeded.
# Knobs (environment): PY MODEL ARM CONC IN_LEN OUT_LEN REPEATS SOAK SOAK_C PORT DEVICE_ARGS PEER_PY STEPS
# RATES RATE_REQUESTS RATE_ARRIVALS.
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
STEPS=${STEPS:-http,soak,peer,inproc}
RATES=${RATES:-2,4,8}
RATE_REQUESTS=${RATE_REQUESTS:-80}
RATE_ARRIVALS=${RATE_ARRIVALS:-constant}
PEER_PY=${PEER_PY:-}
MAX_SEQS=$(echo "$CONC,$SOAK_C" | tr ',' '\n' | sort -n | tail -1)
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
failed=()
step() { echo "=== $1 ($(date +%T))"; }
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
bench() { $PY -m rltbench.server.bench "$@"; }

peer_client() {  # PEER_PY: a python that imports guidellm (installed from .whl/peer once)
  if [ -z "$PEER_PY" ] && ls .whl/peer/*.whl >/dev/null 2>&1; then
    peer_site=$(mktemp -d)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$peer_site" \
      .whl/peer/*.whl && PEER_PY="env PYTHONPATH=$peer_site:${PYTHONPATH:-} $PY"
  fi
  [ -n "$PEER_PY" ] && return 0
  echo "no .whl/peer wheels (scripts/fetch_peer_wheels.sh) and no PEER_PY: peer client skipped"
  return 1
}

run_guidellm() {  # run_guidellm NAME: scenario OUT/NAME_scenario.json -> OUT/NAME.json, log OUT/NAME.log
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $PEER_PY -m guidellm run -c "$OUT/${1}_scenario.json" \
    --output "kind=json,path=$OUT/$1.json" --disable-console-interactive >"$OUT/$1.log" 2>&1 \
    || { tail -30 "$OUT/$1.log"; return 1; }
}

scenario() {  # scenario NAME DESCRIPTION PROFILE CONSTRAINTS: guidellm's scenario file for this server
  cat >"$OUT/${1}_scenario.json" <<EOF
{"metadata": {"name": "$1", "description": "$2"},
 "spec": {"backend": {"kind": "openai_http", "target": "$URL", "request_format": "/v1/completions"},
          "profile": $3,
          "constraints": [$4],
          "tokenizer": {"kind": "huggingface_auto", "model": "$tok_dir"},
          "data": [{"kind": "synthetic_text", "prompt_tokens": $IN_LEN, "output_tokens": $OUT_LEN}]}}
EOF
}

step "serve"
tok_dir=$(mktemp -d)  # the id-word tokenizer, shared with the peer client (not a result)
# shellcheck disable=SC2086
$PY -m rltbench.cli serve --model "$MODEL" --weights random --arm "$ARM" $DEVICE_ARGS --port "$PORT" \
  --max-model-len $((IN_LEN + OUT_LEN)) --warmup-prefill-len "$IN_LEN" --no-prefix-caching \
  --max-num-seqs "$MAX_SEQS" --tokenizer ids --export-tokenizer "$tok_dir" >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null' EXIT
if ! bench wait "$URL" --timeout 400; then
  tail -20 "$OUT/server.log"
  exit 1
fi
grep -m2 -E "warming up|ready on" "$OUT/server.log"

if has_step http; then
  step "rltbench e2e over HTTP"
  bench scrape "$URL" "$OUT/metrics_http_before.json"
  $PY -m rltbench.cli e2e --backend openai --arm "$ARM=$URL" --model "$MODEL" --concurrency "$CONC" \
    --input-len "$IN_LEN" --output-len "$OUT_LEN" --repeats "$REPEATS" --no-live \
    --result-dir "$OUT/e2e-http" || failed+=(e2e-http)
  bench scrape "$URL" "$OUT/metrics_http_after.json"
fi

if has_step soak; then
  step "soak: $SOAK bursts of C=$SOAK_C"
  bench soak "$URL" --model "$MODEL" --bursts "$SOAK" --concurrency "$SOAK_C" \
    --input-len "$IN_LEN" --output-len "$OUT_LEN" --out "$OUT/soak" || failed+=(soak)
fi

if has_step peer; then
  step "peer client: guidellm"
  if peer_client; then
    scenario guidellm "bursts of C requests, as rltbench e2e --workload burst" \
      "{\"kind\": \"concurrent\", \"streams\": [$CONC]}" "{\"kind\": \"max_requests\", \"count\": [$CONC]}"
    bench scrape "$URL" "$OUT/metrics_peer_before.json"
    run_guidellm guidellm || failed+=(guidellm)
    bench scrape "$URL" "$OUT/metrics_peer_after.json"
    grep -A14 "Request Latency Statistics" "$OUT/guidellm.log" || true
    bench check "$URL" || failed+=(blocks-after-peer)
  else
    failed+=(guidellm-missing)
  fi
fi

rate_client() {  # rate_client NAME: rltbench's open-loop client into OUT/NAME, then every KV block free
  $PY -m rltbench.cli e2e --backend openai --arm "$ARM=$URL" --model "$MODEL" --workload rate \
    --request-rate "$RATES" --arrivals "$RATE_ARRIVALS" --num-prompts "$RATE_REQUESTS" \
    --input-len "$IN_LEN" --output-len "$OUT_LEN" --repeats 1 --no-live --result-dir "$OUT/$1" \
    || failed+=("$1")
  bench check "$URL" || failed+=("blocks-after-$1")
}

if has_step rate; then
  step "open-loop rates $RATES/s, $RATE_ARRIVALS, $RATE_REQUESTS requests each: rltbench, guidellm, rltbench"
  rate_client e2e-rate
  if peer_client; then
    scenario guidellm_rate "open-loop rates, as rltbench e2e --workload rate --arrivals $RATE_ARRIVALS" \
      "{\"kind\": \"$RATE_ARRIVALS\", \"rate\": [$RATES]}" \
      "{\"kind\": \"max_requests\", \"count\": $RATE_REQUESTS}"
    run_guidellm guidellm_rate || failed+=(guidellm-rate)
    bench check "$URL" || failed+=(blocks-after-guidellm-rate)
    rate_client e2e-rate-aa  # the A/A leg: the same client again, so the check can tell noise
    aa=()  # a second run that left no run directory is already counted as failed; compare without it
    [ -f "$OUT/e2e-rate-aa/manifest.json" ] && aa=(--rlt-aa "$OUT/e2e-rate-aa")
    bench rate-compare --rlt "$OUT/e2e-rate" --peer "$OUT/guidellm_rate.json" "${aa[@]}" \
      --out "$OUT/rate_check.md" || failed+=(rate-check)
  else
    failed+=(guidellm-missing)
  fi
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

if has_step inproc; then
  step "rltbench e2e in-process"
  # shellcheck disable=SC2086
  $PY -m rltbench.cli e2e --backend engine --arms "$ARM" --model "$MODEL" $DEVICE_ARGS --concurrency "$CONC" \
    --input-len "$IN_LEN" --output-len "$OUT_LEN" --repeats "$REPEATS" --no-live \
    --result-dir "$OUT/e2e-inproc" || failed+=(e2e-inproc)
fi

if [ -d "$OUT/e2e-http" ]; then
  step "tables"
  extra=()
  [ -d "$OUT/e2e-inproc" ] && extra+=(--inproc "$OUT/e2e-inproc")
  [ -f "$OUT/guidellm.json" ] && extra+=(--peer "$OUT/guidellm.json")
  bench compare --http "$OUT/e2e-http" "${extra[@]}" --scrapes "$OUT" --out "$OUT/table.md" || failed+=(tables)
fi
[ -f "$OUT/soak/soak.md" ] && head -3 "$OUT/soak/soak.md"

rm -rf "$tok_dir" "${peer_site:-}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all steps succeeded: $(cd "$OUT" && ls table.md rate_check.md 2>/dev/null | tr '\n' ' ')"
