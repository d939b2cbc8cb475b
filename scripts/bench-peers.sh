#!/usr/bin/env bash
# Side-by-side proxy benchmark: the same simulated upstream (no artificial delay), the same
# open-loop k6 load, direct vs goodput vs nginx vs Envoy vs HAProxy vs LiteLLM's proxy.
#  1. fixed rates (RATES), alternated REPS times: p50/p99 added latency, CPU per request, RSS;
#  2. a rate ladder (LADDER) per path: the highest rate sustained (no dropped or failed request,
#     every stream complete, p99 under MAX_P99_MS).
# Every figure is also given as a ratio to goodput's. One worker/thread per proxy: nginx one
# worker process, Envoy --concurrency 1, goodput --workers 1 (GP_WORKERS to change it).
# Within a repetition the paths run back to back, in reverse order on every other one, so that
# a drift of the machine favours no path.
#
#   scripts/bench-peers.sh [RATES="100 400"; "" skips them] [REPS=2] [DURATION=6s] [LADDER="5 10 ... 2560"; "" skips it]
#                          [PROFILE=production] [LOADGEN=k6|bench]
#
# LOADGEN=bench drives the fixed rates with `goodput bench` (the build under test's own load
# generator; regular arrivals, --burstiness 1000) instead of k6. It spends about a quarter of
# k6's CPU per request (138 against 518 µs here), so on these two shared vCPUs the proxies'
# tails are less buried under the load generator's. The ladder always uses k6.
#
# Results: target/bench/peers-*.jsonl and markdown tables on stdout (for BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
RATES="${RATES-100 400}"
REPS="${REPS:-2}"
DURATION="${DURATION:-6s}"
LADDER="${LADDER-5 10 20 40 80 160 320 640 1280 2560}"
LADDER_DURATION="${LADDER_DURATION:-4s}"
MAX_P99_MS="${MAX_P99_MS:-250}"
PATHS="${PATHS:-direct goodput nginx envoy haproxy litellm}"
TOKENS="${TOKENS:-16}"
GP_WORKERS="${GP_WORKERS:-1}"
# The build that ships (the image's: Cargo.toml's `production` profile, LTO); PROFILE=release
# measures the test build.
PROFILE="${PROFILE:-production}"
LOADGEN="${LOADGEN:-k6}"
export LITELLM_KEY="${LITELLM_KEY:-sk-goodput-bench-7f3a9c2e5b1d4f8a6c0e9b2d7a5f3c1e}"
OUT=target/bench
mkdir -p "$OUT"

K6="$(scripts/setup-bench.sh | tail -1)"
read -r ENVOY LITELLM <<< "$(scripts/setup-peers.sh | tail -1)"
cargo build --profile "$PROFILE" --quiet --bin goodput
BIN="target/$PROFILE/goodput"
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # port timeout_s
  for _ in $(seq $(( $2 * 10 ))); do
    python3 -c "import socket,sys; s=socket.socket(); s.settimeout(0.2); sys.exit(s.connect_ex(('127.0.0.1',$1)))" && return 0
    sleep 0.1
  done
  echo "nothing listens on $1 after $2 s" >&2; return 1
}

start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS"
SIM="${LINE##*addr=}"; UP="${SIM##*:}"
declare -A URL PID
URL[direct]="http://$SIM"; PID[direct]="${pids[-1]}"
start_goodput --upstream "http://$SIM" --workers "$GP_WORKERS"; URL[goodput]="http://$GP"; PID[goodput]="$GP_PID"
for p in nginx envoy haproxy litellm; do
  case " $PATHS " in *" $p "*) ;; *) continue ;; esac
  port="$(free_port)"
  if [ "$p" = nginx ]; then
    NGINX_WORKERS=1 scripts/bench/nginx.sh "$UP" "$port" "$PWD/$OUT/peer-nginx" >/dev/null 2>&1 &
  else
    bin=""; [ "$p" = envoy ] && bin="$ENVOY"; [ "$p" = litellm ] && bin="$LITELLM"
    scripts/bench/peers.sh "$p" "$UP" "$port" "$PWD/$OUT/peer-$p" "$bin" > "$OUT/peer-$p.log" 2>&1 &
  fi
  pids+=($!); PID[$p]=$!
  wait_port "$port" 90
  URL[$p]="http://127.0.0.1:$port"
done
# LiteLLM answers its first requests slowly (lazy imports): warm every path up.
for p in $PATHS; do
  for _ in 1 2 3; do curl -s -o /dev/null -H 'content-type: application/json' -H "authorization: Bearer $LITELLM_KEY" \
    -d '{"model":"sim-model","messages":[{"role":"user","content":"warm"}]}' "${URL[$p]}/v1/chat/completions" || true; done
done
echo "paths: $(for p in $PATHS; do printf '%s=%s ' "$p" "${URL[$p]}"; done)" >&2

rss_kb() { local t=0; for p in $(proc_tree "$1"); do v="$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)"; t=$((t + ${v:-0})); done; echo "$t"; }

k6_run() { # url rate stream duration -> json {med_ms,p99_ms,reqs,dropped,failed,checks_failed}
  local f="$OUT/k6-$RANDOM.json"
  URL="$1/v1/chat/completions" RATE="$2" STREAM="$3" DURATION="$4" MAX_TOKENS="$TOKENS" AUTH="Bearer $LITELLM_KEY" \
    "$K6" run --quiet --no-color --summary-export "$f" scripts/bench/k6-openai.js >/dev/null 2>&1 || true
  python3 - "$f" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
d = m["http_req_duration"]
f = m["http_req_failed"]
print(json.dumps({"med_ms": d["med"], "p99_ms": d["p(99)"], "reqs": m["http_reqs"]["count"],
                  "dropped": m.get("dropped_iterations", {}).get("count", 0),
                  "failed": f.get("passes", f.get("value", 0)),
                  "checks_failed": m.get("checks", {}).get("fails", 0)}))
PY
  rm -f "$f"
}

fixed_run() { # url rate stream duration
  if [ "$LOADGEN" = bench ]; then AUTH="authorization:Bearer $LITELLM_KEY" bench_run "$@"; else k6_run "$@"; fi
}

fixed="$OUT/peers-fixed.jsonl"; : > "$fixed"
for stream in 0 1; do
  for rate in $RATES; do
    for rep in $(seq "$REPS"); do
      order="$PATHS"; [ $((rep % 2)) = 0 ] && order="$(echo "$PATHS" | tr ' ' '\n' | tac | tr '\n' ' ')"
      for p in $order; do
        c0="$(cpu_ticks "${PID[$p]}")"
        r="$(fixed_run "${URL[$p]}" "$rate" "$stream" "$DURATION")"
        c1="$(cpu_ticks "${PID[$p]}")"
        echo "{\"loadgen\":\"$LOADGEN\",\"stream\":$stream,\"rate\":$rate,\"rep\":$rep,\"path\":\"$p\",\"cpu_ticks\":$((c1 - c0)),\"rss_kb\":$(rss_kb "${PID[$p]}"),\"k6\":$r}" | tee -a "$fixed" >&2
      done
    done
  done
done

ladder="$OUT/peers-ladder.jsonl"; : > "$ladder"
for stream in 0 1; do
  for p in $PATHS; do
    for rate in $LADDER; do
      r="$(k6_run "${URL[$p]}" "$rate" "$stream" "$LADDER_DURATION")"
      echo "{\"stream\":$stream,\"rate\":$rate,\"path\":\"$p\",\"k6\":$r}" | tee -a "$ladder" >&2
      ok="$(python3 -c "import json,sys; k=json.loads(sys.argv[1]); print(int(k['dropped']==0 and k['failed']==0 and k['checks_failed']==0 and k['p99_ms']<$MAX_P99_MS))" "$r")"
      [ "$ok" = 1 ] || break
      sleep 1
    done
  done
done

python3 - "$fixed" "$ladder" "$(getconf CLK_TCK)" "$MAX_P99_MS" <<'PY'
import json, math, statistics, sys
fixed = [json.loads(l) for l in open(sys.argv[1])]
ladder = [json.loads(l) for l in open(sys.argv[2])]
tck, max_p99 = int(sys.argv[3]), sys.argv[4]
paths = list(dict.fromkeys(r["path"] for r in fixed + ladder))  # RATES="" runs the ladder alone
proxies = [p for p in paths if p != "direct"]
med = lambda xs: statistics.median(xs) if xs else float("nan")
sys.path.insert(0, "scripts/bench")
from pairs import sign_p, summarize
# p99 differences between paths are mostly machine noise at these rates, so each path's p99 is
# also compared with goodput's run by run: the two runs of one repetition are adjacent in time.
# "goodput's p99 lower" counts the repetitions where it was, with the two-sided sign test's p
# (how often a coin would split the repetitions at least that unevenly); the paired column is
# the median of (this path's p99 - goodput's) over them.
if fixed:
    print("| mode | rate | path | added p50 | added p99 | CPU per request | peak RSS | p50 / goodput's | p99 / goodput's | CPU / goodput's | goodput's p99 lower, paired | median paired p99 − goodput's | dropped+failed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for stream in (0, 1):
    for rate in sorted({r["rate"] for r in fixed}):
        sel = lambda p: [r for r in fixed if r["stream"] == stream and r["rate"] == rate and r["path"] == p]
        d50 = med([r["k6"]["med_ms"] for r in sel("direct")]); d99 = med([r["k6"]["p99_ms"] for r in sel("direct")])
        fig = {}
        for p in proxies:
            rs = sel(p)
            fig[p] = ((med([r["k6"]["med_ms"] for r in rs]) - d50) * 1000, (med([r["k6"]["p99_ms"] for r in rs]) - d99) * 1000,
                      med([r["cpu_ticks"] / tck / max(r["k6"]["reqs"], 1) * 1e6 for r in rs]), max(r["rss_kb"] for r in rs) / 1024,
                      sum(r["k6"]["dropped"] + r["k6"]["failed"] + r["k6"]["checks_failed"] for r in rs))
        g = fig["goodput"]
        g99 = {r["rep"]: r["k6"]["p99_ms"] for r in sel("goodput")}
        for p in proxies:
            a50, a99, cpu, rss, bad = fig[p]
            ratio = lambda x, y: f"{x / y:.2f}" if y > 0 and x > 0 else "n/a"
            diffs = [r["k6"]["p99_ms"] - g99[r["rep"]] for r in sel(p) if r["rep"] in g99]
            paired = ("—", "—") if p == "goodput" else (
                f"{sum(d > 0 for d in diffs)}/{len(diffs)} (p={sign_p(sum(d > 0 for d in diffs), len(diffs)):.2f})",
                f"{med(diffs) * 1000:+.0f} µs")
            print(f"| {'stream' if stream else 'non-stream'} | {rate} | {p} | {a50:.0f} µs | {a99:.0f} µs | {cpu:.0f} µs | {rss:.1f} MB | {ratio(a50, g[0])} | {ratio(a99, g[1])} | {ratio(cpu, g[2])} | {paired[0]} | {paired[1]} | {bad} |")
if fixed:
    print()
    print("Every row's pairs together (scripts/bench/pairs.py):")
    print()
    summarize([sys.argv[1]])
if not ladder:
    sys.exit(0)
print()
print(f"Highest rate sustained (no dropped or failed request, every stream complete, p99 < {max_p99} ms):")
print()
print("| mode | path | highest rate (req/s) | goodput's / this |")
print("|---|---|---|---|")
for stream in (0, 1):
    best = {}
    for p in paths:
        ok = [r["rate"] for r in ladder if r["stream"] == stream and r["path"] == p and r["k6"]["dropped"] == 0
              and r["k6"]["failed"] == 0 and r["k6"]["checks_failed"] == 0 and r["k6"]["p99_ms"] < float(max_p99)]
        best[p] = max(ok) if ok else 0
    for p in paths:
        r = f"{best['goodput'] / best[p]:.1f}" if best[p] else "inf"
        print(f"| {'stream' if stream else 'non-stream'} | {p} | {best[p]} | {r} |")
PY
