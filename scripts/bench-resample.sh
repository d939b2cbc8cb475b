#!/usr/bin/env bash
# What a consistency check costs the server, with its K re-samples asked for as one request
# with `n: K` (quality.consistency.resample: n; vLLM honours it) against K requests (separate),
# alternated REPS times on the same server, the same prompts, one check at a time:
#   - the server's CPU seconds per check (its process tree, from /proc);
#   - wall seconds per check (from the user request to the check's end);
#   - shadow requests and shadow prompt tokens per check (what the usage says was prefilled).
#
#   VLLM_URL=http://127.0.0.1:18021 REPS=3 CHECKS=8 scripts/bench-resample.sh
#
# Output: a table on stdout and target/bench/resample.json. The server must be idle otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VLLM_URL:?the server, e.g. http://127.0.0.1:18021 (scripts/run-vllm.sh)}"
REPS="${REPS:-3}"
CHECKS="${CHECKS:-8}"
K="${K:-3}"
OUT=target/bench
mkdir -p "$OUT"
cargo build --release --quiet
BIN=target/release/goodput
TOKENS=0
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
trap cleanup EXIT
port="${VLLM_URL##*:}"
SERVER_PID="$(ss -ltnpH "sport = :$port" | sed -nE 's/.*pid=([0-9]+).*/\1/p' | head -1)"
[ -n "$SERVER_PID" ] || { echo "no process listens on port $port" >&2; exit 1; }

rows=()
for rep in $(seq "$REPS"); do
  for mode in n separate; do
    cat > "$OUT/resample-$mode.yaml" <<YAML
backends:
  - {name: server, url: "$VLLM_URL", models: [smollm2]}
metrics: {recent_records: 1000}
quality:
  consistency: {sample_rate: 1.0, samples: $K, max_tokens: 48, methods: [unigram],
                max_token_share: 1000, resample: $mode}
YAML
    start_goodput --config "$OUT/resample-$mode.yaml"
    row="$(python3 scripts/bench/resample.py "$GP" "$ADMIN" "$SERVER_PID" "$CHECKS" "$mode" "$rep")"
    echo "$row" >&2
    rows+=("$row")
    kill "$GP_PID"
    wait "$GP_PID" 2>/dev/null || true
  done
done
printf '%s\n' "${rows[@]}" > "$OUT/resample-rows.jsonl"
python3 - "$OUT/resample-rows.jsonl" "$OUT/resample.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = {}
print("| resample | server CPU s per check | wall s per check | shadow requests per check | shadow prompt tokens per check | reps |")
print("|---|---|---|---|---|---|")
for mode in ["n", "separate"]:
    r = [x for x in rows if x["mode"] == mode]
    med = {k: statistics.median(x[k] for x in r) for k in ["cpu_s", "wall_s", "requests", "prompt_tokens"]}
    out[mode] = {"median": med, "runs": r}
    print(f"| {mode} | {med['cpu_s']:.2f} | {med['wall_s']:.2f} | {med['requests']:.1f} | {med['prompt_tokens']:.0f} | {len(r)} |")
n, s = out["n"]["median"], out["separate"]["median"]
print(f"\nn / separate (medians): server CPU {n['cpu_s'] / s['cpu_s']:.2f}x, wall {n['wall_s'] / s['wall_s']:.2f}x")
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
