#!/usr/bin/env bash
# Side-by-side latency benchmark: the same simulated upstream (no artificial delay), the same
# open-loop k6 load at fixed rates, direct vs through goodput, alternated REPS times so that
# both paths see the same machine noise. Reports medians of the per-run p50/p99 and the added
# latency (proxy - direct). Then holds 1,000 concurrent streams open and reads goodput's RSS.
#
#   scripts/bench-proxy.sh [RATES="500 1000"] [DURATION=15s] [REPS=3]
#
# Results go to target/bench/proxy.json and a markdown table on stdout (paste into BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
RATES="${RATES:-500 1000}"
DURATION="${DURATION:-15s}"
REPS="${REPS:-3}"
TOKENS="${TOKENS:-16}"
OUT=target/bench
mkdir -p "$OUT"

K6="$(scripts/setup-bench.sh | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # start CMD... ; prints the first stdout line
  local fifo; fifo="$(mktemp -u)"; mkfifo "$fifo"
  "$@" > "$fifo" 2>/dev/null &
  pids+=($!)
  head -1 < "$fifo"
  cat "$fifo" > /dev/null &
  rm -f "$fifo"
}

SIM_LINE="$(start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS")"
SIM="${SIM_LINE##*addr=}"
GP_LINE="$(start $BIN serve --upstream "http://$SIM" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0)"
GP="$(echo "$GP_LINE" | sed -E 's/.*proxy=([^ ]+).*/\1/')"
ADMIN="$(echo "$GP_LINE" | sed -E 's/.*admin=([^ ]+).*/\1/')"
GP_PID="${pids[-1]}"
echo "sim=$SIM goodput=$GP admin=$ADMIN k6=$K6" >&2

run_k6() { # url rate stream -> json line {med, p99, dropped, failed}
  local f="$OUT/k6-$RANDOM.json"
  URL="$1" RATE="$2" STREAM="$3" DURATION="$DURATION" MAX_TOKENS="$TOKENS" \
    "$K6" run --quiet --no-color --summary-export "$f" scripts/bench/k6-openai.js >/dev/null 2>&1 || true
  python3 - "$f" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
d = m["http_req_duration"]
print(json.dumps({"med_ms": d["med"], "p99_ms": d["p(99)"],
                  "reqs": m["http_reqs"]["count"],
                  "dropped": m.get("dropped_iterations", {}).get("count", 0),
                  "failed": m["http_req_failed"]["passes"] if "passes" in m["http_req_failed"] else m["http_req_failed"].get("value", 0)}))
PY
  rm -f "$f"
}

results="$OUT/proxy-runs.jsonl"
: > "$results"
for stream in 0 1; do
  for rate in $RATES; do
    for rep in $(seq "$REPS"); do
      for path in direct goodput; do
        if [ "$path" = direct ]; then url="http://$SIM/v1/chat/completions"; else url="http://$GP/v1/chat/completions"; fi
        r="$(run_k6 "$url" "$rate" "$stream")"
        echo "{\"stream\":$stream,\"rate\":$rate,\"rep\":$rep,\"path\":\"$path\",\"k6\":$r}" | tee -a "$results" >&2
      done
    done
  done
done

# Memory with 1,000 streams open at once (slow upstream so that they overlap).
kill "${pids[@]}" 2>/dev/null || true; pids=()
SIM_LINE="$(start $BIN sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 40 --output-tokens 300)"
SIM="${SIM_LINE##*addr=}"
GP_LINE="$(start $BIN serve --upstream "http://$SIM" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0)"
GP="$(echo "$GP_LINE" | sed -E 's/.*proxy=([^ ]+).*/\1/')"
GP_PID="${pids[-1]}"
ulimit -n 65536 2>/dev/null || true
python3 scripts/bench/open_streams.py "$GP" "$GP_PID" 1000 > "$OUT/streams.json"
cat "$OUT/streams.json" >&2

python3 - "$results" "$OUT/streams.json" "$OUT/proxy.json" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
streams = json.load(open(sys.argv[2]))
rows = []
for stream in (0, 1):
    for rate in sorted({r["rate"] for r in runs}):
        sel = lambda p: [r["k6"] for r in runs if r["stream"] == stream and r["rate"] == rate and r["path"] == p]
        d, g = sel("direct"), sel("goodput")
        if not d or not g:
            continue
        md = lambda xs, k: st.median(x[k] for x in xs)
        row = {"stream": bool(stream), "rate": rate,
               "direct_p50_ms": md(d, "med_ms"), "goodput_p50_ms": md(g, "med_ms"),
               "direct_p99_ms": md(d, "p99_ms"), "goodput_p99_ms": md(g, "p99_ms"),
               "dropped": sum(x["dropped"] for x in d + g), "failed": sum(x["failed"] for x in d + g)}
        row["added_p50_ms"] = row["goodput_p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["goodput_p99_ms"] - row["direct_p99_ms"]
        rows.append(row)
json.dump({"rows": rows, "streams": streams}, open(sys.argv[3], "w"), indent=1)
print("| mode | rate (req/s) | direct p50 | goodput p50 | added p50 | direct p99 | goodput p99 | added p99 | dropped/failed |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {'stream' if r['stream'] else 'non-stream'} | {r['rate']} | {r['direct_p50_ms']:.3f} ms | {r['goodput_p50_ms']:.3f} ms | "
          f"{r['added_p50_ms']*1000:.0f} µs | {r['direct_p99_ms']:.3f} ms | {r['goodput_p99_ms']:.3f} ms | {r['added_p99_ms']*1000:.0f} µs | "
          f"{r['dropped']}/{r['failed']} |")
s = streams
print(f"\n1,000 concurrent streams: {s['open_at_once']} open at once, {s['completed']} completed, {s['failed']} failed; "
      f"goodput RSS before {s['before']['VmRSS']}, with all open {s['with_streams_open']['VmRSS']}, peak (VmHWM) {s['after']['VmHWM']}.")
PY
