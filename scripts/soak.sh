#!/usr/bin/env bash
# Soak: a steady mixed load (streaming and not, two classes) through goodput with routing over
# two simulated backends (separate processes), perplexity scoring and consistency checks on,
# for DURATION seconds (default 1800). Every 10 s it samples goodput's RSS, open fds, live
# tasks, client connections and scoring queue. At the end: the curves as a PNG, a linear trend
# of each after warm-up, and the request counts of client, goodput and upstreams, which must
# be equal. Exit status 0 only when there is no growth trend and no request was lost.
#   scripts/soak.sh [DURATION_S] [RATE_PER_S]     (results in ${OUT:-target/soak})
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-1800}"
RATE="${2:-16}"
OUT="${OUT:-target/soak}"
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/samples.csv
cargo build --release --quiet
BIN=target/release/goodput
MODEL_DIR="$(scripts/setup-models.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
VENV="$CACHE/venv-plot"
if ! "$VENV/bin/python" -c "import matplotlib" >/dev/null 2>&1; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet "matplotlib==3.11.2"
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
S1=$(port); S2=$(port); P=$(port); A=$(port)
"$BIN" sim --listen "127.0.0.1:$S1" --workers 1 --seed 1 --ttft-ms 30 --tpot-ms 4 --output-tokens 48 >/dev/null 2>&1 & pids+=($!)
"$BIN" sim --listen "127.0.0.1:$S2" --workers 1 --seed 2 --ttft-ms 60 --tpot-ms 8 --output-tokens 48 >/dev/null 2>&1 & pids+=($!)
cat > "$OUT/goodput.yaml" <<YAML
listen: 127.0.0.1:$P
admin_listen: 127.0.0.1:$A
backends:
  - {name: fast, url: "http://127.0.0.1:$S1", models: [sim-model], price: {input_per_1m: 2, output_per_1m: 6}}
  - {name: cheap, url: "http://127.0.0.1:$S2", models: [sim-model], price: {input_per_1m: 1, output_per_1m: 2}}
classes:
  interactive: {ttft_p95_ms: 150, tpot_p95_ms: 20, objective: cheapest}
  batch: {e2e_p95_ms: 5000, objective: cheapest}
routes:
  - {name: batch, match: {headers: {x-class: batch}}, class: batch}
routing: {default_class: interactive, min_samples: 10}
quality:
  sample_rate: 0.1
  perplexity: {model_dir: "$MODEL_DIR", onnxruntime: "$ORT", threads: 1}
  consistency: {sample_rate: 0.02, samples: 2, methods: [unigram], max_token_share: 0.2}
YAML
"$BIN" serve --config "$OUT/goodput.yaml" --workers 2 > "$OUT/goodput.out" 2> "$OUT/goodput.err" & GP=$!
pids+=($GP)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$A/healthz" >/dev/null && break; sleep 0.2; done

N=$(python3 -c "print(int($RATE * $DURATION / 2))")
half=$(python3 -c "print($RATE / 2)")
bench() { "$BIN" bench --target "http://127.0.0.1:$P" --model sim-model --rate "$half" --num-requests "$N" \
  --input-len 64 --output-len 48 --quiet "$@"; }
bench --label stream --json "$OUT/client-stream.json" > "$OUT/bench-stream.out" 2>&1 & B1=$!
bench --label batch --no-stream --header "x-class: batch" --json "$OUT/client-batch.json" \
  > "$OUT/bench-batch.out" 2>&1 & B2=$!
pids+=($B1 $B2)

echo "t_s,rss_bytes,open_fds,tasks,connections,scoring_queue" > "$OUT/samples.csv"
m() { grep -E "^$1 " <<< "$metrics" | awk '{print $2}' | head -1; }
t0=$(date +%s)
while kill -0 "$B1" 2>/dev/null || kill -0 "$B2" 2>/dev/null; do
  metrics="$(curl -sf "http://127.0.0.1:$A/metrics" || true)"
  rss=$(( $(awk '/VmRSS/ {print $2}' "/proc/$GP/status") * 1024 ))
  fds=$(ls "/proc/$GP/fd" | wc -l)
  echo "$(( $(date +%s) - t0 )),$rss,$fds,$(m goodput_runtime_alive_tasks),$(m goodput_client_connections),$(m goodput_scoring_queue_depth)" >> "$OUT/samples.csv"
  sleep 10
done
wait "$B1" "$B2" || true
sleep 2
curl -sf "http://127.0.0.1:$A/metrics" > "$OUT/goodput-metrics.txt"
curl -sf "http://127.0.0.1:$S1/metrics" > "$OUT/sim1-metrics.txt"
curl -sf "http://127.0.0.1:$S2/metrics" > "$OUT/sim2-metrics.txt"
"$VENV/bin/python" scripts/soak_report.py "$OUT"
