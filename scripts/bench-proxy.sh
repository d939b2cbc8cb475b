#!/usr/bin/env bash
# Side-by-side latency benchmark: the same simulated upstream (no artificial delay), the same
# open-loop k6 load at fixed rates, direct vs through goodput vs through nginx (the reference
# streaming proxy), alternated REPS times so that every path sees the same machine noise.
# Reports medians of the per-run p50/p99 and the added latency (proxy - direct). Then the
# per-chunk forwarding latency on the wire (scripts/bench/chunk_latency.py), and finally
# 1,000 concurrent streams held open while goodput's RSS is read.
#
#   scripts/bench-proxy.sh [RATES="500 1000"] [DURATION=15s] [REPS=3] [CHUNK_ROUNDS=3]
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

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS"
SIM="${LINE##*addr=}"
start_goodput --upstream "http://$SIM"
NGINX_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
NGINX_WORKERS=1 scripts/bench/nginx.sh "${SIM##*:}" "$NGINX_PORT" "$PWD/$OUT/nginx" 2>/dev/null &
pids+=($!)
sleep 0.5
NGX="127.0.0.1:$NGINX_PORT"
echo "sim=$SIM goodput=$GP nginx=$NGX admin=$ADMIN k6=$K6" >&2

results="$OUT/proxy-runs.jsonl"
: > "$results"
for stream in 0 1; do
  for rate in $RATES; do
    for rep in $(seq "$REPS"); do
      for path in direct goodput nginx; do
        case "$path" in
          direct) url="http://$SIM/v1/chat/completions" ;;
          goodput) url="http://$GP/v1/chat/completions" ;;
          nginx) url="http://$NGX/v1/chat/completions" ;;
        esac
        r="$(run_k6 "$url" "$rate" "$stream")"
        echo "{\"stream\":$stream,\"rate\":$rate,\"rep\":$rep,\"path\":\"$path\",\"k6\":$r}" | tee -a "$results" >&2
      done
    done
  done
done

# Per-chunk forwarding latency on the wire, goodput, nginx and socat (a byte relay that parses
# nothing: the floor of one proxy hop on this machine), each against direct.
kill "${pids[@]}" 2>/dev/null || true; pids=()
# Rounds alternate the three, so that all see the same machine noise; the table gives
# the median over rounds of each round's percentile.
: > "$OUT/cl-goodput.jsonl"; : > "$OUT/cl-nginx.jsonl"; : > "$OUT/cl-socat.jsonl"
for _ in $(seq "${CHUNK_ROUNDS:-3}"); do
  for name in goodput nginx socat; do
    if [ "$name" = goodput ]; then chunk_latency "$name" "$BIN"; else chunk_latency "$name" "$name"; fi
    tee -a "$OUT/cl-$name.jsonl" < "$OUT/cl-$name.json" >&2
  done
done

# Memory with 1,000 streams open at once (slow upstream so that they overlap).
kill "${pids[@]}" 2>/dev/null || true; pids=()
start $BIN sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 40 --output-tokens 300
SIM="${LINE##*addr=}"
start_goodput --upstream "http://$SIM"
ulimit -n 65536 2>/dev/null || true
python3 scripts/bench/open_streams.py "$GP" "$GP_PID" 1000 > "$OUT/streams.json"
cat "$OUT/streams.json" >&2

python3 - "$results" "$OUT/streams.json" "$OUT/proxy.json" "$OUT/cl-goodput.jsonl" "$OUT/cl-nginx.jsonl" "$OUT/cl-socat.jsonl" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
streams = json.load(open(sys.argv[2]))
cl_runs = {n: [json.loads(l) for l in open(f)] for n, f in (("goodput", sys.argv[4]), ("nginx", sys.argv[5]), ("socat", sys.argv[6]))}
cl = {n: {p: {"added_us": st.median(r[p]["added_us"] for r in rs), "rounds": [r[p]["added_us"] for r in rs]}
          for p in ("p50", "p90", "p99")} for n, rs in cl_runs.items()}
rows = []
for stream in (0, 1):
    for rate in sorted({r["rate"] for r in runs}):
        sel = lambda p: [r["k6"] for r in runs if r["stream"] == stream and r["rate"] == rate and r["path"] == p]
        d, g, x = sel("direct"), sel("goodput"), sel("nginx")
        if not d or not g:
            continue
        md = lambda xs, k: st.median(v[k] for v in xs) if xs else float("nan")
        row = {"stream": bool(stream), "rate": rate,
               "direct_p50_ms": md(d, "med_ms"), "goodput_p50_ms": md(g, "med_ms"), "nginx_p50_ms": md(x, "med_ms"),
               "direct_p99_ms": md(d, "p99_ms"), "goodput_p99_ms": md(g, "p99_ms"), "nginx_p99_ms": md(x, "p99_ms"),
               "dropped": sum(v["dropped"] for v in d + g + x), "failed": sum(v["failed"] for v in d + g + x)}
        for p in ("goodput", "nginx"):
            row[f"{p}_added_p50_ms"] = row[f"{p}_p50_ms"] - row["direct_p50_ms"]
            row[f"{p}_added_p99_ms"] = row[f"{p}_p99_ms"] - row["direct_p99_ms"]
        rows.append(row)
json.dump({"rows": rows, "streams": streams, "chunk_latency": cl}, open(sys.argv[3], "w"), indent=1)
us = lambda v: f"{v * 1000:.0f} µs"
print("| mode | rate (req/s) | direct p50 / p99 | goodput added p50 / p99 | nginx added p50 / p99 | goodput/nginx added p99 | dropped/failed |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    ratio = r["goodput_added_p99_ms"] / r["nginx_added_p99_ms"] if r["nginx_added_p99_ms"] > 0 else float("nan")
    print(f"| {'stream' if r['stream'] else 'non-stream'} | {r['rate']} | {r['direct_p50_ms']:.3f} / {r['direct_p99_ms']:.3f} ms | "
          f"{us(r['goodput_added_p50_ms'])} / {us(r['goodput_added_p99_ms'])} | {us(r['nginx_added_p50_ms'])} / {us(r['nginx_added_p99_ms'])} | "
          f"{ratio:.2f} | {r['dropped']}/{r['failed']} |")
print(f"\n| per-chunk added latency (on the wire, 2 ms between chunks), median of {len(cl_runs['goodput'])} rounds | p50 | p90 | p99 | p50 of each round |")
print("|---|---|---|---|---|")
for name in ("goodput", "nginx", "socat"):
    c = cl[name]
    print(f"| {'socat (byte relay: the floor)' if name == 'socat' else name} | {c['p50']['added_us']:.0f} µs | {c['p90']['added_us']:.0f} µs | {c['p99']['added_us']:.0f} µs | "
          + ", ".join(f"{v:.0f}" for v in c["p50"]["rounds"]) + " |")
s = streams
print(f"\n1,000 concurrent streams: {s['open_at_once']} open at once, {s['completed']} completed, {s['failed']} failed; "
      f"goodput RSS before {s['before']['VmRSS']}, with all open {s['with_streams_open']['VmRSS']}, peak (VmHWM) {s['after']['VmHWM']}.")
PY
