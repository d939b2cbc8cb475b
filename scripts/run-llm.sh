#!/usr/bin/env bash
# Run llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct in the foreground on
# 127.0.0.1:${LLM_PORT:-8011}. It serves one request at a time, in order.
set -euo pipefail
cd "$(dirname "$0")/.."
llm="$(scripts/setup-llm.sh | tail -1)"
read -r VENV GGUF _TOKDIR <<< "$llm"
# --interrupt_requests False: the default cuts a running stream off when another request comes.
exec "$VENV/bin/python" -m llama_cpp.server \
  --model "$GGUF" --host 127.0.0.1 --port "${LLM_PORT:-8011}" \
  --n_threads "${LLM_THREADS:-2}" --n_ctx 2048 --interrupt_requests False "$@"
