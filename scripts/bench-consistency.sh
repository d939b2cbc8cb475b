#!/usr/bin/env bash
# The cost of one consistency check: N chat requests, one at a time, to goodput in front of the
# simulator (no delay, 48 tokens), first without consistency, then with every request checked
# (K=3 re-samples; methods unigram, embedding and prompt). Reports shadow upstream tokens per
# check (re-samples and judge calls) against the user request's own tokens, and goodput's CPU
# time per check (process CPU with checks minus without, over N). max_cpu 16: no CPU budget, so
# that every request is checked.
#
#   scripts/bench-consistency.sh [N=40]
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-40}"
OUT=target/bench
mkdir -p "$OUT"
EMBED="$(scripts/setup-embeddings.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput
K6=unused DURATION=0 TOKENS=48
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS"
SIM="${LINE##*addr=}"
sim_config "$SIM" "$OUT/cons-plain.yaml"
cp "$OUT/cons-plain.yaml" "$OUT/cons-checked.yaml"
printf 'quality:\n  max_cpu: 16\n  consistency:\n    sample_rate: 1.0\n    samples: 3\n    max_token_share: 1000\n    methods: [prompt, unigram, embedding]\n    embedding_model_dir: %s\n    onnxruntime: %s\n' \
  "$EMBED" "$ORT" >> "$OUT/cons-checked.yaml"

for mode in plain checked; do
  start_goodput --config "$OUT/cons-$mode.yaml"
  python3 - "$GP" "$ADMIN" "$GP_PID" "$N" "$mode" > "$OUT/cons-$mode.json" <<'PY'
import json, os, sys, time, urllib.request
gp, admin, pid, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
def metrics():
    out = {}
    for l in urllib.request.urlopen(f"http://{admin}/metrics").read().decode().splitlines():
        if l.startswith("#") or " " not in l: continue
        name = l.split("{")[0].split(" ")[0]
        out.setdefault(name, []).append((l.rsplit(" ", 1)[0], float(l.rsplit(" ", 1)[1])))
    return out
total = lambda m, name, has="": sum(v for k, v in m.get(name, []) if has in k)
c0 = cpu()
for i in range(n):
    body = json.dumps({"model": "sim-model", "temperature": 0, "max_tokens": 48,
                       "messages": [{"role": "user", "content": f"Tell me about topic {i}."}]}).encode()
    urllib.request.urlopen(urllib.request.Request(f"http://{gp}/v1/chat/completions", body,
                                                  {"content-type": "application/json"})).read()
deadline = time.time() + 300
while mode == "checked" and time.time() < deadline:
    m = metrics()
    if total(m, "goodput_consistency_checked_total") + total(m, "goodput_shadow_checks_skipped_total") >= n:
        break
    time.sleep(0.2)
time.sleep(0.5)
m = metrics()
print(json.dumps({"cpu_s": cpu() - c0, "checked": total(m, "goodput_consistency_checked_total"),
                  "user_tokens": total(m, "goodput_tokens_total"),
                  "sample_tokens": total(m, "goodput_shadow_tokens_total", 'kind="sample"'),
                  "judge_tokens": total(m, "goodput_shadow_tokens_total", 'kind="judge"'),
                  "judge_calls": total(m, "goodput_shadow_requests_total", 'kind="judge"')}))
PY
  kill "$GP_PID"; wait "$GP_PID" 2>/dev/null || true
done
python3 - "$OUT/cons-plain.json" "$OUT/cons-checked.json" "$N" <<'PY'
import json, sys
p, c, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
k = max(c["checked"], 1)
print(f"| per check (N={n}, {c['checked']:.0f} checked) | value |")
print("|---|---|")
print(f"| user request's own tokens (prompt + completion) | {p['user_tokens'] / n:.0f} |")
print(f"| re-sample tokens (K = 3) | {c['sample_tokens'] / k:.0f} |")
print(f"| judge calls / judge tokens (prompt method) | {c['judge_calls'] / k:.1f} / {c['judge_tokens'] / k:.0f} |")
print(f"| shadow tokens ÷ user tokens | {(c['sample_tokens'] + c['judge_tokens']) / k / (p['user_tokens'] / n):.1f} |")
print(f"| goodput CPU per request, no checks | {p['cpu_s'] / n * 1000:.2f} ms |")
print(f"| goodput CPU per check (with − without) | {(c['cpu_s'] - p['cpu_s']) / k * 1000:.1f} ms |")
PY
