#!/usr/bin/env bash
# Where a proxy's added TTFT lies, from its syscalls, traced with perf's syscall tracepoints (no
# ptrace: the proxy runs at its own speed): goodput (working tree), goodput at REV_A and nginx,
# one worker each, alternated REPS times, each under the same light paced load (the simulator at
# 50 ms TTFT, 64 tokens 10 ms apart, RATE streams/s, REQUESTS requests). For every request: the
# time from the end of the read that brought the client's request to the write that sends it
# upstream (the request path), from the read of the upstream's response head to its write to the
# client, and the same for each later chunk; and since chunks of many streams arrive together (an
# LLM server decodes its batch in one step), each chunk's write from the first read of its burst,
# which a stream's first token waits too. cpu-clock samples (every SAMPLE_US µs of CPU; 0 turns
# them off) taken inside request paths are grouped by where the code comes from (goodput's phases,
# hyper, hyper_util, serde_json, the kernel, ...): the microseconds a request path spends in each.
# Sampling slows the traced proxy a little; the latencies are also given without it (SAMPLE_US=0).
#
#   scripts/bench-request-path.sh REV_A [RATE=100] [REQUESTS=1000] [REPS=2] [SAMPLE_US=100]
#                                 [A_BIN, B_BIN: builds made elsewhere, in place of REV_A's and
#                                 the working tree's, e.g. scripts/build-pgo.sh's]
#
# Needs perf with tracepoints (root, or kernel.perf_event_paranoid at -1). Release builds (the
# samples need symbols). Results: target/bench/request-path.jsonl and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:?usage: scripts/bench-request-path.sh REV_A}"
RATE="${RATE:-100}"
REQUESTS="${REQUESTS:-1000}"
REPS="${REPS:-2}"
SAMPLE_US="${SAMPLE_US:-100}"
OUT=target/bench
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }
grep -q 'syscalls:sys_enter_writev' <(perf list 2>/dev/null) \
  || { echo "perf cannot see syscall tracepoints here (run as root)" >&2; exit 1; }
scripts/setup-bench.sh >/dev/null # nginx

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
[ -n "${A_BIN:-}" ] || A_BIN="$(build_rev "$REV_A" | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput
LOADGEN_BIN="$BIN"
B_BIN="${B_BIN:-$BIN}"

start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 10 --jitter 0 --output-tokens 64
SIM="${LINE##*addr=}"
events=syscalls:sys_exit_accept4,syscalls:sys_enter_connect
for c in recvfrom read readv writev sendto write sendmsg; do
  events+=",syscalls:sys_enter_$c,syscalls:sys_exit_$c"
done
[ "$SAMPLE_US" = 0 ] || events+=",cpu-clock/period=$((SAMPLE_US * 1000))/"

results="$OUT/request-path.jsonl"
: > "$results"
for rep in $(seq "$REPS"); do
  order="working-tree $REV_A nginx"; [ $((rep % 2)) -eq 0 ] && order="nginx $REV_A working-tree"
  for name in $order; do
    # A fresh proxy each time: its client and upstream connections open while it is traced, which
    # is how the analysis tells the two kinds of socket apart.
    if [ "$name" = nginx ]; then
      port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
      dir="$PWD/$OUT/nginx-request-path"
      rm -f "$dir/nginx.pid"
      NGINX_WORKERS=1 scripts/bench/nginx.sh "${SIM##*:}" "$port" "$dir" >/dev/null 2>&1 &
      master=$!
      for _ in $(seq 100); do [ -s "$dir/nginx.pid" ] && break; sleep 0.05; done
      sleep 0.3
      pid="$(pgrep -P "$master" | head -1)"
      addr="127.0.0.1:$port"
    else
      bin="$B_BIN"; [ "$name" = "$REV_A" ] && bin="$A_BIN"
      BIN="$bin" start_goodput --upstream "http://$SIM" --workers 1
      pid="$GP_PID" addr="$GP"
    fi
    dump="$OUT/perf-request-path-$name.data"
    perf record -q -e "$events" -p "$pid" -o "$dump" >/dev/null 2>&1 &
    rec=$!
    sleep 1
    "$BIN" bench --target "http://$addr" --model sim-model --rate "$RATE" --burstiness 1000 \
      --num-requests "$REQUESTS" --input-len 2 --output-len 64 --quiet >/dev/null 2>&1
    kill -INT "$rec"; wait "$rec" 2>/dev/null || true
    if [ "$name" = nginx ]; then kill -QUIT "$master"; wait "$master" 2>/dev/null || true
    else kill "$pid"; wait "$pid" 2>/dev/null || true; fi
    perf script -i "$dump" -F tid,time,event,trace,ip,sym 2>/dev/null > "$dump.txt"
    python3 scripts/bench/request_path.py "$name" "$dump.txt" 20 "$SAMPLE_US" --json "$results"
    rm -f "$dump" "$dump.txt"
  done
done

python3 - "$results" "$REV_A" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = ["working-tree", sys.argv[2], "nginx"]
def med(name, key, q):
    xs = [r[key] if q is None else r[key][q] for r in rows if r["name"] == name and r.get(key)]
    return statistics.median(xs) if xs else float("nan")
print("| path | request path p50 / p90 | response head p50 | chunk p50 / p90 | chunk from its burst p50 / p90 |")
print("|---|---|---|---|---|")
for n in names:
    print(f"| {n} | {med(n, 'request_path_us', 'p50'):.0f} / {med(n, 'request_path_us', 'p90'):.0f} µs "
          f"| {med(n, 'response_head_us', 'p50'):.0f} µs | {med(n, 'chunk_us', 'p50'):.0f} / {med(n, 'chunk_us', 'p90'):.0f} µs "
          f"| {med(n, 'chunk_from_burst_us', 'p50'):.0f} / {med(n, 'chunk_from_burst_us', 'p90'):.0f} µs |")
origins = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    for k, v in r.get("request_path_by_origin_us", {}).items():
        origins[k][r["name"]].append(v)
if origins:
    print()
    print("| request path spent in (µs per request, cpu-clock samples) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    total = lambda n: sum(statistics.median(v[n]) for v in origins.values() if v.get(n))
    for k in sorted(origins, key=lambda k: -statistics.median(origins[k].get("working-tree", [0]))):
        cells = [f"{statistics.median(origins[k][n]):.1f}" if origins[k].get(n) else "" for n in names]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("| all sampled | " + " | ".join(f"{total(n):.1f}" for n in names) + " |")
    print("| request path, mean | " + " | ".join(f"{med(n, 'request_path_mean_us', None):.1f}" for n in names) + " |")
PY
