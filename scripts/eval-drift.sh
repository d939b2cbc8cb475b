#!/usr/bin/env bash
# What goodput's drift signal sees on real vLLM replicas (scripts/eval/drift.py says how):
# per scenario, a degraded replica (scripts/run-vllm-degraded.sh) in one pool with a healthy
# one (round robin, so each gets half), the chat mix at the servers' default sampling, every
# response scored and checked.
# `healthy -` is the false-alarm run: the second replica healthy too.
#
#   HEALTHY_URL=http://127.0.0.1:18021 scripts/eval-drift.sh
#   SCENARIOS="sampling:1.8 weights:2" REQUESTS=60 HEALTHY_URL=... scripts/eval-drift.sh
#
# VLLM_DTYPE: the suspects' precision, by default the fastest this CPU computes (bfloat16 with
# AVX-512 BF16, else float32; scripts/run-vllm.sh). Start the healthy replica with the same.
#
# HEALTHY_URL: a running scripts/run-vllm.sh. Each scenario's replica is started on
# SUSPECT_PORT (minutes: vLLM's warm-up compile) and stopped after, computing on SUSPECT_CORE
# (default 1: a healthy replica started with vLLM's automatic binding computes on core 0). Output:
# target/eval/drift-SCENARIO-LEVEL.json and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HEALTHY_URL:?a healthy replica, e.g. http://127.0.0.1:18021 (scripts/run-vllm.sh)}"
SCENARIOS="${SCENARIOS:-healthy:- sampling:1.8 weights:2 weights:4 template:no-assistant template:no-system}"
REQUESTS="${REQUESTS:-64}"
SUSPECT_PORT="${SUSPECT_PORT:-18023}"
SUSPECT_CORE="${SUSPECT_CORE:-1}"
export VLLM_DTYPE="${VLLM_DTYPE:-fastest}"
OUT=target/eval
mkdir -p "$OUT"
MODEL_DIR="$(scripts/setup-models.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
EMBED="$(scripts/setup-embeddings.sh | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput
K6=unused DURATION=0 TOKENS=0
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
suspect=""
stop_suspect() { [ -z "$suspect" ] || { kill -TERM -- "-$suspect" 2>/dev/null || true; sleep 3; kill -KILL -- "-$suspect" 2>/dev/null || true; suspect=""; }; }
trap 'stop_suspect; cleanup' EXIT
for sc in $SCENARIOS; do
  name="${sc%%:*}" level="${sc#*:}"
  log="$OUT/drift-$name-$level.vllm.log"
  if [ "$name" = healthy ]; then
    VLLM_CPU_OMP_THREADS_BIND="$SUSPECT_CORE" VLLM_PORT="$SUSPECT_PORT" setsid nice -n 10 scripts/run-vllm.sh --max-num-seqs 4 > "$log" 2>&1 &
  else
    VLLM_CPU_OMP_THREADS_BIND="$SUSPECT_CORE" VLLM_PORT="$SUSPECT_PORT" setsid nice -n 10 scripts/run-vllm-degraded.sh "$name" "$level" --max-num-seqs 4 > "$log" 2>&1 &
  fi
  suspect=$!
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$SUSPECT_PORT/v1/models" > /dev/null && break
    kill -0 "$suspect" 2>/dev/null || { echo "$sc: vLLM did not start; see $log" >&2; exit 1; }
    sleep 1
  done
  cat > "$OUT/drift.yaml" <<YAML
backends:
  - name: pool
    endpoints: ["$HEALTHY_URL", "http://127.0.0.1:$SUSPECT_PORT"]
    models: [smollm2]
    # An even split: each replica's scores accrue at the same pace.
    pool: {policy: round_robin}
routing: {exploration: 0.0}
metrics: {recent_records: 2000, window_secs: 3600}
quality:
  sample_rate: 1.0
  window_secs: 3600
  max_cpu: 16
  queue_capacity: 1000
  perplexity: {model_dir: $MODEL_DIR, onnxruntime: $ORT, max_response_tokens: 128}
  drift: {drain_on: []}
  consistency:
    sample_rate: 1.0
    samples: 3
    max_tokens: 48
    max_token_share: 1000
    max_concurrent: 4
    queue_capacity: 1000
    methods: [embedding, unigram]
    embedding_model_dir: $EMBED
    onnxruntime: $ORT
YAML
  start_goodput --config "$OUT/drift.yaml"
  python3 scripts/eval/drift.py "$GP" "$ADMIN" "${HEALTHY_URL#http://}" "127.0.0.1:$SUSPECT_PORT" "$REQUESTS" \
    "$OUT/drift-$name-$level.json" > /dev/null
  kill "$GP_PID" 2>/dev/null || true
  stop_suspect
  echo "$sc done" >&2
done
python3 - $SCENARIOS <<'PY'
import json, sys
print("| scenario | score | AUROC (95% CI) | median healthy / degraded | confident drift after (scores, seconds) | false-alarm polls |")
print("|---|---|---|---|---|---|")
for sc in sys.argv[1:]:
    name, level = sc.split(":", 1)
    r = json.load(open(f"target/eval/drift-{name}-{level}.json"))
    first = r["consistency_methods"][:1]
    for s, v in r["signals"].items():
        key = "bits_per_byte" if s == "bits_per_byte" else "consistency" if [s] == first else None
        d = r["detect"].get(key) if key else None
        det = "(not a drift signal)" if key is None else "never" if d is None else f'{d["scores"]} vs {d["reference_scores"]}, {d["seconds"]:.0f} s'
        fa = r["false_alarm_polls"].get(key, "") if key else ""
        a = v["auroc"]
        auc = f"{a[0]:.2f} ({a[1]:.2f}-{a[2]:.2f})" if a else "n/a"
        print(f'| {name} {level} | {s} | {auc} | {v["median_healthy"]} / {v["median_suspect"]} | {det} | {fa} |')
    print(f'| {name} {level} | cost | {r["scorer_cpu_seconds"]} scorer CPU s and {r["shadow_tokens"]} re-sampled tokens for {r["requests"]} responses ({r["requests_per_sec"]} req/s) | | | |')
PY
