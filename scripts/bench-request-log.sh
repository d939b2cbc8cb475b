#!/usr/bin/env bash
# What `serve --request-log` costs: CPU of goodput's recorder thread per request, without and
# with the log (a file), alternated REPS times in one run against a zero-delay simulator,
# streamed requests of 16 tokens at RATE req/s from `goodput bench`.
#
#   REPS=3 RATE=1000 N=10000 scripts/bench-request-log.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${REPS:-3}" RATE="${RATE:-1000}" N="${N:-10000}"
cargo build --release --quiet
BIN=target/release/goodput
K6=unused DURATION=0 TOKENS=0
OUT=target/bench; mkdir -p "$OUT"
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --jitter 0 --output-tokens 16
SIM="${LINE##*addr=}"
HZ="$(getconf CLK_TCK)"
recorder_ticks() { for t in /proc/"$1"/task/*; do grep -q goodput-recorde "$t/comm" && awk '{print $14 + $15}' "$t/stat"; done; }
load() { "$BIN" bench --target "http://$GP" --model sim-model --rate "$RATE" --num-requests "$1" \
  --input-len 2 --output-len 16 --quiet --json "$OUT/request-log-load.json" >/dev/null; }
echo "| rep | recorder CPU µs per request, no log | with --request-log | lines written |"
echo "|---|---|---|---|"
for rep in $(seq "$REPS"); do
  row="| $rep"
  for mode in off on; do
    log="$OUT/request-log.jsonl"; rm -f "$log"
    args=(); [ "$mode" = on ] && args=(--request-log "$log")
    start_goodput --upstream "http://$SIM" --workers 1 "${args[@]}"
    load 300 # warm
    c0="$(recorder_ticks "$GP_PID")"
    load "$N"
    sleep 0.3
    c1="$(recorder_ticks "$GP_PID")"
    row="$row | $(python3 -c "print(f'{($c1 - $c0) * 1e6 / $HZ / $N:.1f}')")"
    lines=0; [ "$mode" = on ] && lines="$(wc -l < "$log")"
    kill "$GP_PID"; wait "$GP_PID" 2>/dev/null || true
  done
  echo "$row | $lines |"
done
