#!/usr/bin/env bash
# ONNX Runtime for the perplexity scorer: libonnxruntime.so taken from the PyPI wheel
# onnxruntime==1.31.x (no prebuilt-binary download; ort loads it at run time with init_from).
# Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}. Prints the library path as its last
# line: give it to goodput as ORT_DYLIB_PATH or quality.perplexity.onnxruntime.
# ORT_GPU=1: the same from onnxruntime-gpu (CUDA 13 build) for `device: cuda:N` with a goodput
# built `--features cuda`, in its own venv and directory, with what its CUDA provider links to
# beside it: the provider libraries and CUDA 13's runtime, cuBLAS and cuRAND from NVIDIA's PyPI
# wheels (about 500 MB; goodput loads them from there before the provider). Only the NVIDIA
# driver (libcuda.so.1) must come from the machine.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
ORT_VERSION="${ORT_VERSION:-1.31.*}"
CUDA_PKGS=()
if [ "${ORT_GPU:-0}" = 1 ]; then
  VENV="$CACHE/venv-ort-gpu"
  PKG=onnxruntime-gpu
  CUDA_PKGS=("nvidia-cuda-runtime~=13.0" "nvidia-cublas~=13.0" "nvidia-curand~=10.0")
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
  "$VENV/bin/pip" install --quiet "$PKG==$ORT_VERSION" "${CUDA_PKGS[@]}"
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
  if [ "${ORT_GPU:-0}" = 1 ]; then
    cuda_lib="$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')"
    for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcurand.so.10; do
      cp -fL "$cuda_lib/$l" "$(dirname "$LIB")/"
    done
  fi
  cp -f "$src" "$LIB.part"
  mv -f "$LIB.part" "$LIB"
  echo "setup-onnxruntime: $(basename "$src") -> $LIB" >&2
fi
echo "$LIB"
