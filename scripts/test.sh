#!/usr/bin/env bash
# The whole test suite, as CI runs it: install test dependencies, check formatting and lints,
# then unit tests and black-box tests over real sockets (real Prometheus, vLLM and llama.cpp's
# servers and headless Chromium included), and the deployment checks (Helm chart, Prometheus
# rules, dashboards).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-test-deps.sh
# The real upstream for the end-to-end test: llama.cpp's server, SmolLM2 and the openai SDK
# (built once into ~/.cache/goodput; minutes on a cold cache, seconds after).
llm="$(scripts/setup-llm.sh | tail -1)"
read -r GOODPUT_LLM_VENV GOODPUT_LLM_GGUF GOODPUT_LLM_TOKDIR <<< "$llm"
export GOODPUT_LLM_VENV GOODPUT_LLM_GGUF GOODPUT_LLM_TOKDIR
# vLLM's CPU build serving the same SmolLM2 (tests/e2e_vllm.rs), and a second replica of it
# (tests/e2e_vllm_pool.rs: routing within a pool). The second is degraded as a bad deploy would
# degrade it (scripts/run-vllm-degraded.sh sampling): its default temperature is 1.8, so requests
# that set their own are served as by the first, and those that do not get gibberish
# (tests/e2e_vllm_drift.rs: drift detected, alerted and drained). Their start-up is minutes, most of it a
# warm-up compile, so they start once, now, and compile while the suite builds; the tests wait
# for them. At lower CPU priority, like llama.cpp: the client and goodput, whose clocks the
# tests compare, go first. --max-num-seqs 4: a queue forms in seconds on two cores; a KV cache
# of 32 blocks of 128 tokens: a few long system prompts fill one replica's prefix cache. Each
# computes on a core of its own, as two pods would (vLLM's automatic binding puts both on core 0).
read -r GOODPUT_VLLM_VENV _ <<< "$(scripts/setup-vllm.sh | tail -1)"
GOODPUT_VLLM_PORT="${GOODPUT_VLLM_PORT:-18021}"
GOODPUT_VLLM2_PORT="${GOODPUT_VLLM2_PORT:-18022}"
GOODPUT_VLLM_LOG="$(mktemp -t goodput-vllm.XXXXXX.log)"
GOODPUT_VLLM2_LOG="$(mktemp -t goodput-vllm2.XXXXXX.log)"
VLLM_CPU_OMP_THREADS_BIND=0 VLLM_PORT="$GOODPUT_VLLM_PORT" setsid nice -n 10 scripts/run-vllm.sh --max-num-seqs 4 \
  --num-gpu-blocks-override 32 > "$GOODPUT_VLLM_LOG" 2>&1 &
VLLM_PID=$!
VLLM_CPU_OMP_THREADS_BIND=1 VLLM_PORT="$GOODPUT_VLLM2_PORT" setsid nice -n 10 scripts/run-vllm-degraded.sh sampling 1.8 --max-num-seqs 4 \
  --num-gpu-blocks-override 32 > "$GOODPUT_VLLM2_LOG" 2>&1 &
VLLM2_PID=$!
# vLLM's engine runs in a child process: stop each whole group, politely first. set -e holds
# inside the trap too, and kill fails on a group that has already exited: `|| true`, or a green
# run would end with status 1 whenever vLLM stopped within the grace period.
trap 'kill -TERM -- -$VLLM_PID -$VLLM2_PID 2>/dev/null || true; sleep 3; kill -KILL -- -$VLLM_PID -$VLLM2_PID 2>/dev/null || true' EXIT
export GOODPUT_VLLM_VENV GOODPUT_VLLM_LOG GOODPUT_VLLM_PID="$VLLM_PID" \
  GOODPUT_VLLM_URL="http://127.0.0.1:$GOODPUT_VLLM_PORT" \
  GOODPUT_VLLM2_LOG GOODPUT_VLLM2_PID="$VLLM2_PID" GOODPUT_VLLM2_URL="http://127.0.0.1:$GOODPUT_VLLM2_PORT"
# The reference LM for perplexity (SmolLM2 converted to ONNX, seconds once the above is cached)
# and ONNX Runtime's library from the onnxruntime wheel.
GOODPUT_MODEL_DIR="$(scripts/setup-models.sh | tail -1)"
ORT_DYLIB_PATH="$(scripts/setup-onnxruntime.sh | tail -1)"
GOODPUT_MODELS_PYTHON="${GOODPUT_CACHE:-$HOME/.cache/goodput}/venv-models/bin/python"
# The sentence encoder for consistency's embedding method (all-MiniLM-L6-v2 → ONNX).
GOODPUT_EMBED_DIR="$(scripts/setup-embeddings.sh | tail -1)"
export GOODPUT_MODEL_DIR ORT_DYLIB_PATH GOODPUT_MODELS_PYTHON GOODPUT_EMBED_DIR
# Helm's library and kubernetes-validate for the chart checks (tests/deploy.rs).
GOODPUT_DEPLOY_PYTHON="$(scripts/setup-deploy-check.sh | tail -1)"
export GOODPUT_DEPLOY_PYTHON
cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
# The `cuda` build too (tests/cuda.rs, the CUDA provider's code): CI has no GPU to run it on;
# scripts/gpu-check.sh runs it on one.
cargo clippy --release --all-targets --features cuda -- -D warnings
# The unit tests and the black-box suite (tests/suite.rs, one binary) both run even when the
# first fails, and every test in each runs, so that one CI run reports every failure. Without
# backtraces: a failing test's message (with its file and line) is then the end of the output,
# which is the part of a CI log that gets read.
RUST_BACKTRACE=0 cargo test --release --tests --no-fail-fast
# Supply chain: cargo-deny (licenses, bans, sources; advisories where the database can be
# fetched) and yanked versions.
scripts/deny.sh
