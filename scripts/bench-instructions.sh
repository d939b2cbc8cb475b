#!/usr/bin/env bash
# Instructions on the proxy's event loop per SSE event and per non-streaming request, counted
# by callgrind: goodput (working tree), optionally goodput at REV_A, and nginx, over the same
# simulated upstream. Instruction counts repeat run after run whatever else the machine does,
# so they show what a hot-path change saves where latency on this noisy VM cannot.
#
#   scripts/bench-instructions.sh [REV_A]
#
# Each figure is a difference of two runs that differ only in what is counted (32 more tokens
# per stream, 40 more requests), divided by that difference, so start-up and idle work cancel.
# Events that reach the proxy together are read and written in one wake-up, and how often that
# happens depends on timing, so the table also counts the writes to the client (callgrind's
# call counts, scripts/bench/cg_writes.py) and gives the instructions per write.
# goodput is counted on its tokio workers (task polls and the I/O driver: where a request and
# its events are handled; the recorder and scoring threads work off that path), nginx on its
# worker process. Results: target/bench/instructions.json and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:-}"
OUT=target/bench
CG="$OUT/callgrind"
mkdir -p "$CG"
# nginx's worker drops root for nobody and must still write its profile.
chmod 1777 "$CG"
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
scripts/setup-bench.sh >/dev/null # nginx

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
goodput_and_nginx "$REV_A"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# count NAME PROXY SIM_ARGS REQUESTS MODE -> instructions counted for the run
count() {
  local name="$1" proxy="$2" sim_args="$3" n="$4" mode="$5" port pid
  rm -f "$CG/$name".*
  start "$BIN" sim --listen 127.0.0.1:0 --jitter 0 $sim_args
  local sim="${LINE##*addr=}" sim_pid="${pids[-1]}"
  port="$(free_port)"
  if [ "$proxy" = nginx ]; then
    NGINX_WORKERS=1 valgrind --tool=callgrind --trace-children=yes \
      --callgrind-out-file="$PWD/$CG/$name.%p" scripts/bench/nginx.sh "${sim##*:}" "$port" "$PWD/$CG/nginx-$name" \
      >/dev/null 2>&1 &
  else
    valgrind --tool=callgrind --toggle-collect='*Context::run_task*' --toggle-collect='*Context::park_internal*' \
      --callgrind-out-file="$CG/$name.0" "$proxy" serve --upstream "http://$sim" --listen "127.0.0.1:$port" \
      --admin-listen 127.0.0.1:0 >/dev/null 2>&1 &
  fi
  pid=$!
  for _ in $(seq 300); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port)).close()" 2>/dev/null && break
    sleep 0.1
  done
  python3 scripts/bench/sequential.py "127.0.0.1:$port" "$n" "$mode" >&2
  if [ "$proxy" = nginx ]; then
    kill -QUIT "$(cat "$CG/nginx-$name/nginx.pid")"
  else
    kill -INT "$pid"
  fi
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  kill "$sim_pid" 2>/dev/null || true
  # nginx: the worker is the process that handled the traffic, the one with the most.
  local most=0 t file=
  for f in "$CG/$name".*; do
    t="$(sed -n 's/^totals: //p' "$f")"
    if [ "${t:-0}" -gt "$most" ]; then most="$t"; file="$f"; fi
  done
  echo "$most $(python3 scripts/bench/cg_writes.py "$file")"
}

results="$OUT/instructions.jsonl"
: > "$results"
for p in "${paths[@]}"; do
  name="${p%%=*}" proxy="${p#*=}"
  tag="${name//[^a-zA-Z0-9]/_}"
  # Streams: events 2 ms apart, so that each is read and written on its own wake-up.
  s16="$(count "$tag-s16" "$proxy" "--ttft-ms 0 --tpot-ms 2 --output-tokens 16" 20 stream)"
  s48="$(count "$tag-s48" "$proxy" "--ttft-ms 0 --tpot-ms 2 --output-tokens 48" 20 stream)"
  n20="$(count "$tag-n20" "$proxy" "--ttft-ms 0 --tpot-ms 0 --output-tokens 16" 20 plain)"
  n60="$(count "$tag-n60" "$proxy" "--ttft-ms 0 --tpot-ms 0 --output-tokens 16" 60 plain)"
  read -r s16 w16 <<< "$s16"
  read -r s48 w48 <<< "$s48"
  n20="${n20% *}" n60="${n60% *}"
  echo "{\"path\":\"$name\",\"s16\":$s16,\"s48\":$s48,\"w16\":$w16,\"w48\":$w48,\"n20\":$n20,\"n60\":$n60}" | tee -a "$results" >&2
done

python3 - "$results" "$OUT/instructions.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    r["per_event"] = (r["s48"] - r["s16"]) / (20 * 32)
    # Events that arrive together go out in one write: per write is the cost of a wake-up.
    r["writes_per_event"] = (r["w48"] - r["w16"]) / (20 * 32)
    r["per_write"] = (r["s48"] - r["s16"]) / max(1, r["w48"] - r["w16"])
    r["per_request"] = (r["n60"] - r["n20"]) / 40
json.dump(rows, open(sys.argv[2], "w"), indent=1)
g = rows[0]
print("| path | instructions per SSE event | writes per event | per write | per non-streaming request "
      "| event / goodput's | write / goodput's | request / goodput's |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['path']} | {r['per_event']:,.0f} | {r['writes_per_event']:.2f} | {r['per_write']:,.0f} "
          f"| {r['per_request']:,.0f} | {r['per_event'] / g['per_event']:.2f} "
          f"| {r['per_write'] / g['per_write']:.2f} | {r['per_request'] / g['per_request']:.2f} |")
PY
