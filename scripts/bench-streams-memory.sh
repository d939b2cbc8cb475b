#!/usr/bin/env bash
# goodput's memory with 1,000 streams open at once, for one or more builds in turn over the same
# slow simulated upstream (50 ms TTFT, 40 ms TPOT, 300 tokens, so the streams overlap): the part
# of scripts/bench-proxy.sh that measures it, on its own.
# Then the memory that KEPT (default 200) idle keep-alive connections hold after one large answer
# each.
#   scripts/bench-streams-memory.sh [BIN...]   (default: target/release/goodput)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
[ $# -gt 0 ] || { cargo build --release --quiet; set -- target/release/goodput; }
start "$1" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 40 --output-tokens 300
SIM="${LINE##*addr=}"
ulimit -n 65536 2>/dev/null || true
for b in "$@"; do
  BIN="$b" start_goodput --upstream "http://$SIM"
  echo "$b: $(python3 scripts/bench/open_streams.py "$GP" "$GP_PID" 1000)"
  kill "$GP_PID"
  sleep 1
done
# Then what stays behind: KEPT idle keep-alive connections (0 skips), each after one ~650 KB
# non-streaming answer (scripts/bench/kept_connections.py).
if [ "${KEPT:-200}" -gt 0 ]; then
  start "$1" sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --jitter 0 --output-tokens 100000
  BIG="${LINE##*addr=}"
  for b in "$@"; do
    BIN="$b" start_goodput --upstream "http://$BIG"
    echo "$b: $(python3 scripts/bench/kept_connections.py "${GP##*:}" "$GP_PID" "${KEPT:-200}")"
    kill "$GP_PID"
    sleep 1
  done
fi
kill "${pids[@]}" 2>/dev/null || true
