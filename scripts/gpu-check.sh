#!/usr/bin/env bash
# The GPU checks, in one run, on a machine with an NVIDIA GPU (CI has none; run this by hand):
#   1. tests/cuda.rs: the perplexity model on CUDA scores as on the CPU (0.5% in perplexity);
#   2. `goodput ppl --device cuda:0` against `--device cpu` on the fixture paragraph;
#   3. a clear error, and with allow_cpu_fallback a logged fallback, when CUDA cannot be loaded;
#   4. scoring throughput (benches/scoring.rs) on cuda:0 and on all the CPU's cores;
#   5. `goodput serve` scoring 100% of requests on cuda:0 behind the simulator under
#      `goodput bench` load: responses scored, none failed, and the latency next to no scoring
#      and to the simulator reached directly.
# Needs ORT_DYLIB_PATH = onnxruntime-gpu's libonnxruntime.so (default: ORT_GPU=1
# scripts/setup-onnxruntime.sh, which puts CUDA 13's libraries beside it; a library from
# elsewhere needs them on the loader path, which below also takes from a Python environment's
# NVIDIA wheels), and GOODPUT_MODEL_DIR (default: scripts/setup-models.sh). Built with
# cargo `--features cuda` unless GOODPUT_BIN, CUDA_TEST_BIN and SCORING_BENCH_BIN name prebuilt
# binaries (a GPU machine without a Rust toolchain). Writes results to ${GPU_OUT:-target/gpu}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${GPU_OUT:-target/gpu}"
mkdir -p "$OUT"
# GPU_DEVICE=cpu runs steps 2, 4 and 5 on the CPU: a dry run of this script on a machine without a GPU.
DEV="${GPU_DEVICE:-cuda:0}"
# Offered loads (req/s) for step 5, each for SECS seconds.
RATES="${RATES:-500 1000}"
SECS="${SECS:-6}"
fail=0
# STEPS="5" runs only some of the steps; REPS repeats step 5's rows; MODES and STREAMS narrow them;
# MAX_CPU sets step 5's quality.max_cpu (default 16, so that the device, not the budget, limits).
want() { [[ " ${STEPS:-1 2 3 4 5} " == *" $1 "* ]]; }
REPS="${REPS:-1}"
MODES="${MODES:-plain scored1 scored}"
STREAMS="${STREAMS:-stream no-stream}"
check() { if [ "$1" = ok ]; then echo "PASS $2"; else echo "FAIL $2"; fail=1; fi; }

: "${ORT_DYLIB_PATH:=$(ORT_GPU=1 scripts/setup-onnxruntime.sh | tail -1)}"
: "${GOODPUT_MODEL_DIR:=$(scripts/setup-models.sh | tail -1)}"
export ORT_DYLIB_PATH GOODPUT_MODEL_DIR
if [ -z "${GOODPUT_BIN:-}" ]; then
  cargo build --release --features cuda --bin goodput || exit 1
  GOODPUT_BIN=target/release/goodput
  CUDA_TEST_BIN="$(cargo test --release --features cuda --no-run --test cuda --message-format json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')"
  SCORING_BENCH_BIN="$(cargo bench --features cuda --bench scoring --no-run --message-format json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')"
fi

# What the CUDA provider links to, from NVIDIA's PyPI wheels in this Python (torch's, say).
cuda_dirs="$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
want = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10"]
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
dirs = []
for r in roots:
    for w in want:
        for f in glob.glob(os.path.join(r, "nvidia", "**", w), recursive=True):
            d = os.path.dirname(f)
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)"
export LD_LIBRARY_PATH="${cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cores: $(nproc); onnxruntime: $ORT_DYLIB_PATH; CUDA libraries from: ${cuda_dirs:-the system}"

if want 1; then
echo "== 1. tests/cuda.rs"
"$CUDA_TEST_BIN" --nocapture 2>&1 | tee "$OUT/cuda-test.log"
[ "${PIPESTATUS[0]}" = 0 ] && check ok "CUDA scores as the CPU does" || check no "CUDA scores as the CPU does"

fi
if want 2; then
echo "== 2. goodput ppl, cuda:0 vs cpu"
"$GOODPUT_BIN" ppl --json --device "$DEV" --model "$GOODPUT_MODEL_DIR" tests/fixtures/paragraph.txt > "$OUT/ppl-cuda.json"
"$GOODPUT_BIN" ppl --json --device cpu --model "$GOODPUT_MODEL_DIR" tests/fixtures/paragraph.txt > "$OUT/ppl-cpu.json"
cat "$OUT/ppl-cuda.json" "$OUT/ppl-cpu.json"
python3 - "$OUT/ppl-cuda.json" "$OUT/ppl-cpu.json" <<'PY' && check ok "goodput ppl on cuda:0 equals cpu" || check no "goodput ppl on cuda:0 equals cpu"
import json, sys
g, c = (json.load(open(f)) for f in sys.argv[1:3])
assert g["tokens"] == c["tokens"], (g, c)
for k in ["token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"]:
    assert abs(g[k] - c[k]) / c[k] < 0.005, (k, g[k], c[k])
PY

fi
if want 3; then
echo "== 3. CUDA that cannot load"
err="$(LD_LIBRARY_PATH=/nonexistent "$GOODPUT_BIN" ppl --device cuda:0 --model "$GOODPUT_MODEL_DIR" tests/fixtures/paragraph.txt 2>&1 >/dev/null)"
rc=$?
echo "rc=$rc: $err" | tail -3
if [ "$rc" != 0 ]; then check ok "no CUDA libraries: a clear error"; else echo "(the system loader path has CUDA: nothing to refuse)"; fi
printf 'backends:\n  - name: sim\n    url: http://127.0.0.1:9\n    models: [sim-model]\nquality:\n  sample_rate: 1.0\n  perplexity:\n    model_dir: %s\n    onnxruntime: %s\n    device: cuda:7\n    allow_cpu_fallback: true\n' \
  "$GOODPUT_MODEL_DIR" "$ORT_DYLIB_PATH" > "$OUT/fallback.yaml"
timeout 20 "$GOODPUT_BIN" serve --config "$OUT/fallback.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 > "$OUT/fallback.log" 2>&1 &
fb=$!
for _ in $(seq 100); do grep -q "perplexity scorer ready" "$OUT/fallback.log" && break; sleep 0.1; done
kill $fb 2>/dev/null
grep -E "falling back|scorer ready" "$OUT/fallback.log"
grep -q "falling back" "$OUT/fallback.log" && grep -q "scorer ready.*Cpu" "$OUT/fallback.log" &&
  check ok "cuda:7 (no such GPU) with allow_cpu_fallback: logged, scores on the CPU" || check no "fallback to the CPU"

fi
if want 4; then
echo "== 4. scoring throughput"
for dev in $(echo "$DEV cpu" | tr ' ' '\n' | uniq); do
  shapes="1x512 8x128 32x512"; [ "$dev" = cpu ] && shapes="1x512 8x128"
  BENCH_DEVICE=$dev BENCH_SHAPES="$shapes" BENCH_THREADS="$(nproc)" BENCH_REPS=7 "$SCORING_BENCH_BIN" --bench 2>&1 |
    grep '^{' | tee -a "$OUT/scoring.jsonl"
done

fi
if want 5; then
echo "== 5. goodput serve, 100% scored on cuda:0, under load"
"$GOODPUT_BIN" sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens 64 > "$OUT/sim.log" 2>&1 &
sim_pid=$!
for _ in $(seq 100); do grep -q "addr=" "$OUT/sim.log" && break; sleep 0.05; done
SIM="$(grep -o 'addr=[^ ]*' "$OUT/sim.log" | head -1 | cut -d= -f2)"
printf 'backends:\n  - name: sim\n    url: http://%s\n    models: [sim-model]\n' "$SIM" > "$OUT/plain.yaml"
cp "$OUT/plain.yaml" "$OUT/scored.yaml"
# MAX_CPU: quality.max_cpu (default 16: how much the device can score, as in BENCHMARKS.md;
# unset it, MAX_CPU=, for goodput's default budget).
MAX_CPU="${MAX_CPU-16}"
budget=""; [ -n "$MAX_CPU" ] && budget="  max_cpu: $MAX_CPU
"
printf 'quality:\n  sample_rate: 1.0\n  queue_capacity: 64\n%s  perplexity:\n    model_dir: %s\n    onnxruntime: %s\n    device: %s\n' \
  "$budget" "$GOODPUT_MODEL_DIR" "$ORT_DYLIB_PATH" "$DEV" >> "$OUT/scored.yaml"
# The same, one response per model call: what batching buys, side by side.
sed 's/^  perplexity:$/  perplexity:\n    max_batch: 1/' "$OUT/scored.yaml" > "$OUT/scored1.yaml"
# And on the CPU (one SCHED_IDLE thread): tells the scorer's device from the rest of the pipeline.
sed "s/^    device: .*/    device: cpu/" "$OUT/scored.yaml" > "$OUT/scoredcpu.yaml"
bench() { # label target stream-flag
  "$GOODPUT_BIN" bench --target "$2" --model sim-model --rate "$RATE" --num-requests "$((RATE * SECS))" --output-len 64 \
    --input-len 64 --quiet --label "$1" --json "$OUT/bench-$1.json" $3 > /dev/null 2>&1
  python3 - "$OUT/bench-$1.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f'{sys.argv[2]:>18}: completed {r["completed"]} failed {r["failed"]} e2e p50 {r["e2el"]["median_ms"]:.3f} ms p99 {r["e2el"]["p99_ms"]:.3f} ms; ttft p50 {r["ttft"]["median_ms"]:.3f} p99 {r["ttft"]["p99_ms"]:.3f}')
PY
}
for RATE in $RATES; do
 for rep in $(seq "$REPS"); do
  for mode in $MODES; do
    "$GOODPUT_BIN" serve --config "$OUT/$mode.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 > "$OUT/serve-$mode.log" 2>&1 &
    gp_pid=$!
    for _ in $(seq 300); do grep -q "proxy=" "$OUT/serve-$mode.log" && break; sleep 0.1; done
    GP="$(grep -o 'proxy=[^ ]*' "$OUT/serve-$mode.log" | head -1 | cut -d= -f2)"
    ADMIN="$(grep -o 'admin=[^ ]*' "$OUT/serve-$mode.log" | head -1 | cut -d= -f2)"
    for s in $STREAMS; do
      flag=""; [ $s = no-stream ] && flag=--no-stream
      bench "$RATE-$rep-direct-for-$mode-$s" "http://$SIM" "$flag"
      bench "$RATE-$rep-$mode-$s" "http://$GP" "$flag"
    done
    sleep 2
    curl -s "http://$ADMIN/metrics" > "$OUT/metrics-$mode.txt"
    kill $gp_pid; wait $gp_pid 2>/dev/null
  done
 done
  for mode in $MODES; do
    [ "$mode" = plain ] && continue
    echo "at $RATE req/s, $mode on $DEV (last repetition):"
    grep -E "^goodput_(scored_responses_total|scoring_failed_total|scoring_dropped_total)|^goodput_scoring_(duration_seconds|batch_size)_(sum|count)" "$OUT/metrics-$mode.txt"
  done
done
kill $sim_pid
grep -E "scorer ready" "$OUT/serve-scored.log"
python3 - "$OUT/metrics-scored.txt" <<'PY' && check ok "serve scored on cuda:0, none failed" || check no "serve scored on cuda:0"
import sys
tot = {}
for l in open(sys.argv[1]):
    if l.startswith("goodput_scor"):
        name, v = l.split("{")[0].split(" ")[0], float(l.rsplit(" ", 1)[1])
        tot[name] = tot.get(name, 0) + v
print(tot)
assert tot.get("goodput_scored_responses_total", 0) > 0
assert tot.get("goodput_scoring_failed_total", 0) == 0
PY
want="$(echo "$DEV" | sed -E 's/cuda:([0-9]+)/Cuda(\1)/; s/cpu/Cpu/')"
grep -q "scorer ready.*device=$want" "$OUT/serve-scored.log" && check ok "the scorer ran on $want" || check no "the scorer ran on $want"
fi
exit $fail
