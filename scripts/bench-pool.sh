#!/usr/bin/env bash
# Routing within a pool of two vLLM replicas, side by side (scripts/bench/pool.py): round robin
# (what a Kubernetes Service gives, near enough), least outstanding, and goodput's picker, each
# a goodput in front of the same two replicas, on three workloads (queue skew from traffic
# goodput does not see, shared long system prompts, a mix). Starts the replicas (vLLM's CPU
# build, SmolLM2, --max-num-seqs 4, a KV cache of 32 blocks of 128 tokens, one core each) unless
# VLLM_A / VLLM_B name running ones.
#
#   RATE=2.5 DURATION=60 REPS=2 SLO_MS=1000 SLO_GRID=500,1000,2000,4000 WORKLOADS=prefix,mix,skew
#   [VLLM_DTYPE=fastest|bfloat16|float32] scripts/bench-pool.sh
#
# The defaults are BENCHMARKS.md's run: at 2.5 requests/s round robin's attainment of a 1 s
# TTFT falls below 90% on the shared prefixes.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${RATE:-2.5}" DURATION="${DURATION:-60}" REPS="${REPS:-2}" SLO_MS="${SLO_MS:-1000}"
WORKLOADS="${WORKLOADS:-prefix,mix,skew}" SLO_GRID="${SLO_GRID:-500,1000,2000,4000}"
# The replicas' precision: by default the fastest this CPU computes (scripts/run-vllm.sh).
# Routing is compared, not scores.
export VLLM_DTYPE="${VLLM_DTYPE:-fastest}"
read -r VENV _ <<< "$(scripts/setup-vllm.sh | tail -1)"
cargo build --release --quiet
OUT=target/bench; mkdir -p "$OUT"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done' EXIT
wait_up() { for _ in $(seq 900); do curl -sf "$1/v1/models" >/dev/null && return 0; sleep 1; done; echo "$1 did not start" >&2; exit 1; }
if [ -z "${VLLM_A:-}" ]; then
  # One core each (vLLM's automatic binding would put both on core 0).
  for core in 0 1; do
    port=$((18031 + core))
    VLLM_CPU_OMP_THREADS_BIND=$core VLLM_PORT=$port setsid scripts/run-vllm.sh --max-num-seqs 4 \
      --num-gpu-blocks-override 32 > "$OUT/pool-vllm-$port.log" 2>&1 &
    PIDS+=($!)
  done
  VLLM_A=http://127.0.0.1:18031 VLLM_B=http://127.0.0.1:18032
fi
wait_up "$VLLM_A"; wait_up "$VLLM_B"
GPS=()
for policy in round_robin least_outstanding picker; do
  cat > "$OUT/pool-$policy.yaml" <<YAML
backends:
  - name: pool
    endpoints: ["$VLLM_A", "$VLLM_B"]
    server_metrics: {interval_ms: 250}
    pool: {policy: $policy, prefix: {index_blocks: 64}}
routing: {exploration: 0.0}
YAML
  setsid target/release/goodput serve --config "$OUT/pool-$policy.yaml" --listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 > "$OUT/pool-$policy.out" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "proxy=" "$OUT/pool-$policy.out" && break; sleep 0.1; done
  addr="$(grep -o 'proxy=[^ ]*' "$OUT/pool-$policy.out" | head -1 | cut -d= -f2)"
  GPS+=(--gp "$policy=http://$addr")
done
"$VENV/bin/python" scripts/bench/pool.py "${GPS[@]}" --replica "$VLLM_A" --replica "$VLLM_B" \
  --rate "$RATE" --duration "$DURATION" --reps "$REPS" --slo-ms "$SLO_MS" --slo-grid "$SLO_GRID" --workloads "$WORKLOADS" | tee "$OUT/pool.txt"
