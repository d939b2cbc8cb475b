#!/usr/bin/env bash
# Scoring throughput side by side, in one run: goodput's Rust path (ort + tokenizers) vs Python
# onnxruntime on the same model.onnx vs llama.cpp on the GGUF it was converted from; tokens/s at
# batch 1x512 and 8x128, median of REPS runs each, ROUNDS rounds interleaved (the machine is
# noisy). Usage: scripts/bench-scoring.sh [ROUNDS] [REPS]   (THREADS=2 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
REPS="${2:-5}"
THREADS="${THREADS:-2}"
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
GOODPUT_MODEL_DIR="$(scripts/setup-models.sh | tail -1)"
ORT_DYLIB_PATH="$(scripts/setup-onnxruntime.sh | tail -1)"
read -r _V GGUF _T <<< "$(scripts/setup-llm.sh | tail -1)"
export GOODPUT_MODEL_DIR ORT_DYLIB_PATH BENCH_THREADS="$THREADS" BENCH_REPS="$REPS"
PY="$CACHE/venv-models/bin/python"
cargo bench --bench scoring --no-run -q 2>/dev/null
out="$(mktemp)"
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  cargo bench --bench scoring -q 2>/dev/null | grep '^{' >> "$out"
  "$PY" scripts/bench/scoring.py onnx "$GOODPUT_MODEL_DIR" "$THREADS" "$REPS" >> "$out"
  "$PY" scripts/bench/scoring.py llama "$GGUF" "$THREADS" "$REPS" >> "$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by, embed = {}, {}
for r in rows:
    if "sentences_per_s" in r:  # the sentence encoder's rows (GOODPUT_EMBED_DIR set)
        embed.setdefault(r["shape"], []).append(r["sentences_per_s"])
    else:
        by.setdefault((r["shape"], r["impl"]), []).append(r["tokens_per_s"])
print(f"| shape | implementation | tokens/s (median of rounds) | goodput ÷ this |")
print("|---|---|---|---|")
for shape in ["1x512", "8x128"]:
    ours = statistics.median(by[(shape, "goodput (ort)")])
    for impl in ["goodput (ort)", "Python onnxruntime", "llama.cpp (llama-cpp-python)"]:
        v = statistics.median(by[(shape, impl)])
        print(f"| {shape} | {impl} | {v:.0f} | {ours / v:.2f} |")
for shape, v in embed.items():
    print(f"| sentence encoder, {shape} | goodput embedding (ort) | {statistics.median(v):.0f} sentences/s | |")
PY
rm -f "$out"
