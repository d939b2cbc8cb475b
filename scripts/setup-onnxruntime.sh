#!/usr/bin/env bash
# ONNX Runtime for the perplexity scorer: libonnxruntime.so taken from the PyPI wheel
# onnxruntime==1.31.x (no prebuilt-binary download; ort loads it at run time with init_from).
# Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}. Prints the library path as its last
# line: give it to goodput as ORT_DYLIB_PATH or quality.perplexity.onnxruntime.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-models"
ORT_VERSION="${ORT_VERSION:-1.31.*}"
LIB="$CACHE/onnxruntime/lib/libonnxruntime.so"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import onnxruntime" >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet "onnxruntime==$ORT_VERSION"
fi
if [ ! -s "$LIB" ]; then
  src="$("$VENV/bin/python" - <<'PY'
import glob, os, onnxruntime
libs = sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.*")))
print(libs[-1] if libs else "")
PY
)"
  [ -n "$src" ] || { echo "setup-onnxruntime: no libonnxruntime.so in the onnxruntime wheel" >&2; exit 1; }
  mkdir -p "$(dirname "$LIB")"
  cp -f "$src" "$LIB.part"
  mv -f "$LIB.part" "$LIB"
  echo "setup-onnxruntime: $(basename "$src") -> $LIB" >&2
fi
echo "$LIB"
