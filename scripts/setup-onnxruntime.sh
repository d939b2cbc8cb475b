#!/usr/bin/env bash
# ONNX Runtime for the perplexity scorer: libonnxruntime.so taken from the PyPI wheel
# onnxruntime==1.31.x (no prebuilt-binary download; ort loads it at run time with init_from).
# Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}. Prints the library path as its last
# line: give it to goodput as ORT_DYLIB_PATH or quality.perplexity.onnxruntime.
# ORT_GPU=1: the same from onnxruntime-gpu (CUDA 13 build) for `device: cuda:N` with a goodput
# built `--features cuda`, in its own venv and directory: the CUDA provider libraries
# (libonnxruntime_providers_cuda.so, _shared.so) must sit beside libonnxruntime.so. CUDA 13's
# runtime, cuBLAS, cuRAND (and cuDNN) come from the system or from NVIDIA's PyPI wheels, on the
# loader path (scripts/gpu-check.sh finds them).
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
ORT_VERSION="${ORT_VERSION:-1.31.*}"
if [ "${ORT_GPU:-0}" = 1 ]; then
  VENV="$CACHE/venv-ort-gpu"
  PKG=onnxruntime-gpu
  LIB="$CACHE/onnxruntime-gpu/lib/libonnxruntime.so"
else
  VENV="$CACHE/venv-models"
  PKG=onnxruntime
  LIB="$CACHE/onnxruntime/lib/libonnxruntime.so"
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import onnxruntime" >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet "$PKG==$ORT_VERSION"
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
  for p in "$(dirname "$src")"/libonnxruntime_providers_*.so; do
    [ -e "$p" ] && cp -f "$p" "$(dirname "$LIB")/"
  done
  cp -f "$src" "$LIB.part"
  mv -f "$LIB.part" "$LIB"
  echo "setup-onnxruntime: $(basename "$src") -> $LIB" >&2
fi
echo "$LIB"
