#!/usr/bin/env bash
# Make the reference LM for perplexity: SmolLM2-135M-Instruct converted from its GGUF to ONNX by
# scripts/models/gguf_to_onnx.py, with tokenizer.json and the chat template beside it, and check it
# against llama.cpp (scripts/models/validate_onnx.py, reported, not yet enforced). Idempotent;
# cached in ${GOODPUT_CACHE:-~/.cache/goodput}. Prints the model directory as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-models"
ORT_VERSION="${ORT_VERSION:-1.31.*}"
llm="$(scripts/setup-llm.sh | tail -1)"
read -r _LLM_VENV GGUF TOKDIR <<< "$llm"
OUT="$CACHE/models/smollm2-135m-instruct-onnx"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import onnxruntime, onnx, gguf, numpy, llama_cpp" >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet --find-links "$CACHE/wheels" \
    "onnxruntime==$ORT_VERSION" onnx numpy "gguf==0.19.0" "llama-cpp-python==0.3.36"
fi
if [ ! -s "$OUT/model.onnx" ] || [ "$OUT/model.onnx" -ot scripts/models/gguf_to_onnx.py ]; then
  "$VENV/bin/python" scripts/models/gguf_to_onnx.py "$GGUF" "$OUT"
  "$VENV/bin/python" scripts/models/validate_onnx.py "$GGUF" "$OUT" >&2 || \
    echo "setup-models: perplexity differs from llama.cpp's by more than 1% (see above)" >&2
fi
cp -f "$TOKDIR/tokenizer.json" "$TOKDIR/chat_template.jinja" "$TOKDIR/special_tokens.json" "$OUT/"
echo "$OUT"
