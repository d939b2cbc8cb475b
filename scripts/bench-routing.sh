#!/usr/bin/env bash
# SLO attainment under SLA routing on light traffic, two builds side by side: three simulated
# backends (premium 15 ms, standard 30 ms, budget 400 ms TTFT; budget the cheapest), one class
# with TTFT p95 <= 150 ms and the `cheapest` objective, open-loop Poisson load at RATE
# requests/s for SECS seconds, windows of WINDOW seconds, REV_A and the working tree alternated
# REPS times. Reports how many requests each build sent to budget (the slow cheap backend) and
# the SLO attainment goodput counted, per repetition and as medians.
#
#   scripts/bench-routing.sh REV_A [RATE=2] [WINDOW=60] [SECS=90] [REPS=1]
#
# Results: target/bench/routing.jsonl and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:?usage: scripts/bench-routing.sh REV_A}"
RATE="${RATE:-2}" WINDOW="${WINDOW:-60}" SECS="${SECS:-90}" REPS="${REPS:-1}"
OUT=target/bench
mkdir -p "$OUT"
K6=unused DURATION=0 TOKENS=8
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
A_BIN="$(build_rev "$REV_A" | tail -1)"
cargo build --release --quiet
B_BIN=target/release/goodput
cfg="$OUT/routing-config.yaml"
cat > "$cfg" <<EOF
backends:
  - name: premium
    sim: {model: m, seed: 1, ttft_ms: 15, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 5.0, output_per_1m: 15.0}
  - name: standard
    sim: {model: m, seed: 2, ttft_ms: 30, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 1.0, output_per_1m: 3.0}
  - name: budget
    sim: {model: m, seed: 3, ttft_ms: 400, tpot_ms: 1, output_tokens: 8}
    price: {input_per_1m: 0.1, output_per_1m: 0.3}
metrics: {window_secs: $WINDOW}
classes:
  interactive: {ttft_p95_ms: 150, objective: cheapest}
routing: {default_class: interactive}
EOF

results="$OUT/routing.jsonl"
: > "$results"
one() { # NAME BIN
  BIN="$2" start_goodput --config "$cfg"
  "$B_BIN" bench --target "http://$GP" --model m --rate "$RATE" --num-requests "$((RATE * SECS))" \
    --input-len 2 --output-len 8 --quiet --json "$OUT/routing-load.json" >/dev/null 2>&1
  curl -s "http://$ADMIN/metrics" > "$OUT/routing-metrics.txt"
  kill "$GP_PID"; wait "$GP_PID" 2>/dev/null || true
  python3 - "$1" "$OUT/routing-metrics.txt" <<'PY' >> "$results"
import json, re, sys
text = open(sys.argv[2]).read().splitlines()
def total(name, **labels):
    out = 0.0
    for l in text:
        if l.startswith(name + "{") and all(f'{k}="{v}"' in l for k, v in labels.items()):
            out += float(l.rsplit(" ", 1)[1])
    return out
print(json.dumps({
    "path": sys.argv[1],
    "requests": total("goodput_route_decisions_total"),
    "to_budget": total("goodput_route_decisions_total", backend="budget"),
    "slo_attainment": total("goodput_slo_met_requests_total") / max(total("goodput_slo_judged_requests_total"), 1),
}))
PY
}
for _ in $(seq "$REPS"); do
  one "$REV_A" "$A_BIN"
  one "working tree" "$B_BIN"
done
python3 - "$results" "$RATE" "$WINDOW" "$SECS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"| build ({sys.argv[2]} requests/s, {sys.argv[3]} s windows, {sys.argv[4]} s) | requests to budget, per run | median share | SLO attainment, median |")
print("|---|---|---|---|")
for path in dict.fromkeys(r["path"] for r in rows):
    rs = [r for r in rows if r["path"] == path]
    share = statistics.median(r["to_budget"] / max(r["requests"], 1) for r in rs)
    att = statistics.median(r["slo_attainment"] for r in rs)
    runs = ", ".join("%.0f of %.0f" % (r["to_budget"], r["requests"]) for r in rs)
    print(f"| {path} | {runs} | {share:.3f} | {att:.3f} |")
PY
