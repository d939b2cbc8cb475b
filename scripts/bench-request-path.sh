#!/usr/bin/env bash
# Where a proxy's added TTFT lies, from its syscalls: goodput (working tree) and goodput at REV_A,
# each traced with strace while a light paced load (the simulator at 50 ms TTFT, 8 tokens 10 ms
# apart, 10 streams/s) goes through it. For every request, the time from the end of the read that
# brought the client's request to the write that sends it upstream (the request path), from the
# read of the upstream's response head to its write to the client, and the same for each chunk.
# ptrace slows every path alike, so compare the builds with each other, not with other figures.
#
#   scripts/bench-request-path.sh REV_A [REQUESTS=40]
#
# Results: target/bench/strace-*.txt and medians and 90th percentiles on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:?usage: scripts/bench-request-path.sh REV_A}"
REQUESTS="${REQUESTS:-40}"
OUT=target/bench
mkdir -p "$OUT"
command -v strace >/dev/null || { echo "strace is needed (apt-get install strace)" >&2; exit 1; }

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
A_BIN="$(build_rev "$REV_A" | tail -1)"
cargo build --release --quiet
BIN=target/release/goodput

start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 10 --jitter 0 --output-tokens 8
SIM="${LINE##*addr=}"
for build in "working tree=$BIN" "$REV_A=$A_BIN"; do
  name="${build%%=*}" bin="${build#*=}" trace="$OUT/strace-${name// /-}.txt"
  BIN="$bin" start_goodput --upstream "http://$SIM" --workers 1
  # Warm the pools (client and upstream connections) before tracing.
  "$BIN" bench --target "http://$GP" --model sim-model --rate 20 --num-requests 20 --input-len 2 \
    --output-len 8 --quiet >/dev/null 2>&1
  strace -f -tt -T -s 48 -p "$GP_PID" -o "$trace" 2>/dev/null &
  st=$!
  sleep 0.5
  "$BIN" bench --target "http://$GP" --model sim-model --rate 10 --num-requests "$REQUESTS" \
    --input-len 2 --output-len 8 --quiet >/dev/null 2>&1
  kill "$st"; wait "$st" 2>/dev/null || true
  kill "$GP_PID"
  python3 - "$name" "$trace" <<'PY'
import re, statistics, sys

def at(line):
    h, m, s = line.split()[1].split(":")
    return (int(h) * 3600 + int(m) * 60 + float(s)) * 1e6

def end(line):  # when the syscall returned: its start plus its duration (-T)
    return at(line) + float(re.search(r"<([\d.]+)>$", line.strip()).group(1)) * 1e6

name, trace = sys.argv[1], sys.argv[2]
# (what is read, what is written): the request, the response head, a chunk of the stream.
kinds = {
    "request path": (r'recvfrom\(\d+, "(POST|s HTTP)', r'(writev|sendto)\(\d+, \[?\{?(iov_base=)?"POST'),
    "response head": (r'recvfrom\(\d+, "HTTP/1.1 200', r'(writev|sendto)\(\d+, \[?\{?(iov_base=)?"HTTP/1.1 200'),
    "chunk": (r'recvfrom\(\d+, "[0-9A-Fa-f]+\\r\\ndata', r'(writev|sendto)\(\d+, \[?\{?(iov_base=)?"[0-9A-Fa-f]+\\r\\n'),
}
gaps = {k: [] for k in kinds}
read_at = {}
for line in open(trace):
    if "unfinished" in line or "resumed" in line:
        continue
    for k, (rd, wr) in kinds.items():
        if re.search(rd, line):
            read_at[k] = end(line)
        elif re.search(wr, line) and k in read_at:
            gaps[k].append(at(line) - read_at.pop(k))
for k, g in gaps.items():
    if g:
        g.sort()
        print(f"{name}: {k}: n={len(g)} p50 {statistics.median(g):.0f} µs, p90 {g[int(len(g) * 0.9)]:.0f} µs")
PY
done
