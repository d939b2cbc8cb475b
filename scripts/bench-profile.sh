#!/usr/bin/env bash
# Where the proxy's CPU goes on paced streams: perf samples one goodput (one worker) in front of
# the simulator (TTFT 50 ms, 64 tokens 10 ms apart) under `goodput bench` at RATE streams/s, and
# prints the share of samples (children included) under each part of the path.
#
#   RATE=400 SECS=6 scripts/bench-profile.sh
#
# Needs perf (Debian: linux-perf) and kernel.perf_event_paranoid <= 2. Output: target/bench/profile.txt
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${RATE:-400}" SECS="${SECS:-6}"
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
cargo build --release --quiet
BIN=target/release/goodput
K6=unused DURATION=0 TOKENS=0
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
OUT=target/bench; mkdir -p "$OUT"
start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 10 --jitter 0 --output-tokens 64
SIM="${LINE##*addr=}"
start_goodput --upstream "http://$SIM" --workers 1
load() { "$BIN" bench --target "http://$GP" --model sim-model --rate "$RATE" --num-requests "$1" \
  --input-len 2 --output-len 64 --quiet --json "$OUT/profile-load.json" >/dev/null; }
load "$((RATE * 2))" # warm: connections pooled on both sides
perf record -q -F 999 --call-graph dwarf,16384 -p "$GP_PID" -o "$OUT/profile.data" -- sleep "$SECS" 2>/dev/null &
rec=$!
load "$((RATE * (SECS + 2)))"
wait "$rec"
perf report -i "$OUT/profile.data" --children --sort symbol --stdio --percent-limit 0.5 2>/dev/null > "$OUT/profile-report.txt"
python3 - "$OUT/profile-report.txt" "$RATE" <<'PY' | tee "$OUT/profile.txt"
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
# The first (largest) match of each frame: its share with everything it calls.
parts = [
    ("client connection task (hyper server, the service, MeteredBody)", r"poll<goodput::proxy::server::serve::"),
    ("  writev to the client (the kernel's loopback send included)", r"\] __GI___writev"),
    ("  MeteredBody::poll_frame", r"MeteredBody as http_body::Body>::poll_frame"),
    ("    ResponseMeter::on_data (SSE events, chunk JSON, counts)", r"ResponseMeter::on_data\s"),
    ("upstream connection task (hyper's client)", r"poll<hyper::client::conn::http1::upgrades::UpgradeableConnection"),
    ("  recvfrom from the upstream", r"\[k\] __sys_recvfrom"),
    ("epoll_wait (tokio's I/O driver)", r"\] epoll_wait\s"),
]
print(f"| part of the path, {sys.argv[2]} streams/s | share of goodput's CPU samples |")
print("|---|---|")
for name, pat in parts:
    hit = next((l for l in lines if re.match(r"\s+[0-9.]+%", l) and re.search(pat, l)), None)
    print(f"| {name} | {hit.split()[0] if hit else 'not seen'} |")
PY
