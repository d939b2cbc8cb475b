#!/usr/bin/env bash
# Time inside the proxy per request, from the kernel's syscall tracepoints (perf record, no
# ptrace): from the read that brings the client's request in to its write upstream, and from
# the read that brings the upstream's answer in to its first write to the client. This is the
# part of the added latency that is the proxy's own work, without the client's, the
# upstream's or the network's time, which dominate (and blur) the figures on the wire.
# Requests come one at a time, PACE_MS apart, as at a low rate: each meets an idle proxy.
# Paths: goodput (working tree), optionally goodput at REV_A, and nginx, alternated ROUNDS
# times over the same simulated upstream.
#
#   scripts/bench-residence.sh [REV_A] [N=300] [PACE_MS=10] [ROUNDS=3] [MODE=plain|stream]
#                              [EXTRA="name=binary ..."]
#
# Results: target/bench/residence.jsonl and a table on stdout (medians over rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:-}"
N="${N:-300}"
PACE_MS="${PACE_MS:-10}"
ROUNDS="${ROUNDS:-3}"
MODE="${MODE:-plain}"
OUT=target/bench
mkdir -p "$OUT"
scripts/setup-bench.sh >/dev/null # nginx
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
goodput_and_nginx "$REV_A"
EVENTS=""
for s in read recvfrom readv recvmsg write sendto writev sendmsg; do
  EVENTS="$EVENTS,syscalls:sys_enter_$s,syscalls:sys_exit_$s"
done
EVENTS="${EVENTS#,}"

start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens 16
SIM="${LINE##*addr=}"
results="$OUT/residence.jsonl"
: > "$results"
for round in $(seq "$ROUNDS"); do
  for p in "${paths[@]}"; do
    name="${p%%=*}" proxy="${p#*=}"
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    if [ "$proxy" = nginx ]; then
      NGINX_WORKERS=1 scripts/bench/nginx.sh "${SIM##*:}" "$port" "$PWD/$OUT/nginx-res" >/dev/null 2>&1 &
    else
      "$proxy" serve --upstream "http://$SIM" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 --workers 1 >/dev/null 2>&1 &
    fi
    pid=$!
    for _ in $(seq 100); do
      python3 -c "import socket; socket.create_connection(('127.0.0.1', $port)).close()" 2>/dev/null && break
      sleep 0.1
    done
    # The worker that serves the traffic: nginx's only worker process, or goodput itself.
    traced="$pid"; [ "$proxy" = nginx ] && traced="$(pgrep -P "$pid" | head -1)"
    python3 scripts/bench/paced.py "127.0.0.1:$port" 20 "$MODE" 0 >/dev/null # warm: upstream connection up
    sleep 0.3
    perf record -q -e "$EVENTS" -p "$traced" -o "$OUT/residence.data" >/dev/null 2>&1 &
    rec=$!
    sleep 1
    python3 scripts/bench/paced.py "127.0.0.1:$port" "$N" "$MODE" "$PACE_MS" >/dev/null
    kill -INT "$rec"; wait "$rec" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    r="$(perf script -i "$OUT/residence.data" -F tid,time,event,trace 2>/dev/null | python3 scripts/bench/residence.py)"
    echo "{\"round\":$round,\"path\":\"$name\",\"mode\":\"$MODE\",\"res\":$r}" | tee -a "$results" >&2
  done
done

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["path"] for r in rows))
med = lambda n, k, q: statistics.median(r["res"][k][q] for r in rows if r["path"] == n)
g = names[0]
print("| path | request in → upstream: p50 / p90 / p99 | answer in → client: p50 / p90 / p99 | request p50 / goodput's | answer p50 / goodput's |")
print("|---|---|---|---|---|")
for n in names:
    f = lambda k: " / ".join(f"{med(n, k, q):.0f}" for q in ("p50", "p90", "p99")) + " µs"
    print(f"| {n} | {f('request')} | {f('answer')} | {med(n, 'request', 'p50') / med(g, 'request', 'p50'):.2f} | {med(n, 'answer', 'p50') / med(g, 'answer', 'p50'):.2f} |")
PY
