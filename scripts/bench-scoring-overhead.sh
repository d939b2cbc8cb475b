#!/usr/bin/env bash
# Does quality scoring cost the proxy latency? The same simulated upstream (no artificial delay)
# and the same open-loop k6 load, direct vs goodput without scoring vs goodput scoring 100% of
# requests for perplexity (one SCHED_IDLE scoring thread; what it cannot keep up with is dropped
# and counted) vs goodput checking CHECK_RATE for consistency (K=3 re-samples, unigram + embedding,
# default budget: 20% of user tokens, 2 shadow requests at once), alternated REPS times. A fresh
# goodput per run, so that no backlog spills over.
#
#   RATE=200 DURATION=15s REPS=3 CHECK_RATE=0.05 [PATHS="direct plain scored checked"] \
#     scripts/bench-scoring-overhead.sh
#
# `scored` and `checked` run with the default CPU budget (quality.max_cpu); `scored@C` and
# `checked@C` with max_cpu C cores (e.g. PATHS="direct plain scored@8 scored@0.1").
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${RATE:-200}"
DURATION="${DURATION:-15s}"
REPS="${REPS:-3}"
TOKENS="${TOKENS:-16}"
# Share of requests checked for consistency (each check is 3 more generations upstream).
CHECK_RATE="${CHECK_RATE:-0.05}"
OUT=target/bench
mkdir -p "$OUT"
K6="$(scripts/setup-bench.sh | tail -1)"
MODEL="$(scripts/setup-models.sh | tail -1)"
EMBED="$(scripts/setup-embeddings.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS"
SIM="${LINE##*addr=}"
sim_config "$SIM" "$OUT/plain.yaml"
config_for() { # PATH -> the config file for it
  local kind="${1%@*}" f="$OUT/$1.yaml"
  [ "$kind" = plain ] && { echo "$OUT/plain.yaml"; return; }
  cp "$OUT/plain.yaml" "$f"
  printf 'quality:\n' >> "$f"
  [ "$kind" != "$1" ] && printf '  max_cpu: %s\n' "${1#*@}" >> "$f"
  if [ "$kind" = scored ]; then
    printf '  sample_rate: 1.0\n  queue_capacity: 16\n  perplexity:\n    model_dir: %s\n    onnxruntime: %s\n' \
      "$MODEL" "$ORT" >> "$f"
  else
    printf '  consistency:\n    sample_rate: %s\n    methods: [unigram, embedding]\n    embedding_model_dir: %s\n    onnxruntime: %s\n' \
      "$CHECK_RATE" "$EMBED" "$ORT" >> "$f"
  fi
  echo "$f"
}

results="$OUT/scoring-overhead-runs.jsonl"
: > "$results"
for stream in 0 1; do
  for rep in $(seq "$REPS"); do
    for path in ${PATHS:-direct plain scored checked}; do
      extra='{}'
      if [ "$path" = direct ]; then
        r="$(run_k6 "http://$SIM/v1/chat/completions" "$RATE" "$stream")"
      else
        start_goodput --config "$(config_for "$path")"
        r="$(run_k6 "http://$GP/v1/chat/completions" "$RATE" "$stream")"
        extra="$(curl -s "http://$ADMIN/metrics" | python3 -c '
import json, sys
v = {"scored": 0.0, "dropped": 0.0, "budget": 0.0, "cpu_s": 0.0}
for l in sys.stdin:
    if l.startswith(("goodput_scored_responses_total", "goodput_consistency_checked_total")): v["scored"] += float(l.split()[-1])
    if l.startswith(("goodput_scoring_dropped_total", "goodput_shadow_checks_skipped_total")):
        v["dropped"] += float(l.split()[-1])
        if "cpu_budget" in l: v["budget"] += float(l.split()[-1])
    if l.startswith("goodput_scoring_cpu_seconds_total"): v["cpu_s"] += float(l.split()[-1])
print(json.dumps(v))')"
        kill "$GP_PID"; wait "$GP_PID" 2>/dev/null || true
      fi
      echo "{\"stream\":$stream,\"rep\":$rep,\"path\":\"$path\",\"k6\":$r,\"scoring\":$extra}" | tee -a "$results" >&2
    done
  done
done

python3 - "$results" "$RATE" "${DURATION%s}" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
secs = float(sys.argv[3])
paths = list(dict.fromkeys(r["path"] for r in runs if r["path"] != "direct"))
print("| mode | rate | path | direct p50 / p99 | added p50 / p99 | added p99 ÷ plain's | scored / dropped (of which cpu_budget) per run | scoring CPU (cores) |")
print("|---|---|---|---|---|---|---|---|")
for stream in (0, 1):
    sel = lambda p: [r for r in runs if r["stream"] == stream and r["path"] == p]
    md = lambda xs, k: st.median(r["k6"][k] for r in xs)
    d = sel("direct")
    us = lambda v: f"{v * 1000:.0f} µs"
    plain99 = md(sel("plain"), "p99_ms") - md(d, "p99_ms") if sel("plain") else float("nan")
    for p in paths:
        xs = sel(p)
        a50, a99 = md(xs, "med_ms") - md(d, "med_ms"), md(xs, "p99_ms") - md(d, "p99_ms")
        counts = ", ".join(f"{r['scoring'].get('scored', 0):.0f}/{r['scoring'].get('dropped', 0):.0f} ({r['scoring'].get('budget', 0):.0f})" for r in xs)
        cpu = st.median(r["scoring"].get("cpu_s", 0) for r in xs) / secs
        print(f"| {'stream' if stream else 'non-stream'} | {sys.argv[2]} | {p} | {md(d, 'med_ms'):.3f} / {md(d, 'p99_ms'):.3f} ms | "
              f"{us(a50)} / {us(a99)} | {a99 / plain99 if plain99 > 0 else float('nan'):.2f} | {counts} | {cpu:.2f} |")
PY
