#!/usr/bin/env bash
# CPU per streamed token of two goodput binaries, user and system time apart, in many short
# alternated pairs: for a change too small for bench-ab.sh's five repetitions to show. Both
# proxies sit in front of one simulator paced like bench-ab.sh's paced rows (50 ms TTFT, 64
# tokens 10 ms apart), one worker each; `goodput bench` (the working tree's release build)
# sends RATE streams/s for 10 s to A, then B (B first in even pairs).
#
#   scripts/bench-cpu-pairs.sh A_BIN B_BIN [RATES="100 400"] [REPS=12]
#
# Prints a line per run (µs of user and system time per token, from /proc/PID/stat) and per
# rate the median ratio B/A, how many pairs B used less, and the sign test's p. Results:
# target/bench/cpu-pairs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
A_BIN="${1:?usage: scripts/bench-cpu-pairs.sh A_BIN B_BIN}"
B_BIN="${2:?usage: scripts/bench-cpu-pairs.sh A_BIN B_BIN}"
RATES="${RATES:-100 400}"
REPS="${REPS:-12}"
OUT=target/bench
mkdir -p "$OUT"
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
cargo build --release --quiet
BIN=target/release/goodput
start "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 10 --jitter 0 --output-tokens 64
SIM="${LINE##*addr=}"
BIN="$A_BIN" start_goodput --upstream "http://$SIM" --workers 1; GP_A="$GP"; PID_A="$GP_PID"
BIN="$B_BIN" start_goodput --upstream "http://$SIM" --workers 1; GP_B="$GP"; PID_B="$GP_PID"
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; } # utime stime, clock ticks
runs="$OUT/cpu-pairs.jsonl"
: > "$runs"
for rate in $RATES; do
  for rep in $(seq "$REPS"); do
    order="a b"; [ $((rep % 2)) -eq 0 ] && order="b a"
    for path in $order; do
      if [ "$path" = a ]; then base="$GP_A"; pid="$PID_A"; else base="$GP_B"; pid="$PID_B"; fi
      n=$((rate * 10))
      read -r u0 s0 < <(ticks "$pid")
      "$BIN" bench --target "http://$base" --model sim-model --rate "$rate" --num-requests "$n" \
        --input-len 2 --output-len 64 --quiet >/dev/null 2>&1 || true
      read -r u1 s1 < <(ticks "$pid")
      python3 -c "import json; hz, t = $(getconf CLK_TCK), $n * 64
print(json.dumps({'rate': $rate, 'rep': $rep, 'path': '$path', 'user_us': ($u1 - $u0) * 1e6 / hz / t, 'sys_us': ($s1 - $s0) * 1e6 / hz / t}))" \
        | tee -a "$runs"
    done
  done
done
python3 - "$runs" <<'PY'
import json, statistics, sys
sys.path.insert(0, "scripts/bench")
from pairs import sign_p
rows = [json.loads(l) for l in open(sys.argv[1])]
for rate in sorted({r["rate"] for r in rows}):
    by = {}
    for r in rows:
        if r["rate"] == rate:
            by.setdefault(r["rep"], {})[r["path"]] = r
    pairs = [v for v in by.values() if len(v) == 2]
    tot = lambda r: r["user_us"] + r["sys_us"]
    ratios = [tot(v["b"]) / tot(v["a"]) for v in pairs]
    lower = sum(x < 1 for x in ratios)
    du = statistics.median(v["b"]["user_us"] - v["a"]["user_us"] for v in pairs)
    ds = statistics.median(v["b"]["sys_us"] - v["a"]["sys_us"] for v in pairs)
    print(f"{rate:.0f} streams/s: B/A CPU per token, median {statistics.median(ratios):.3f}; B lower in "
          f"{lower}/{len(pairs)} (sign test p = {sign_p(lower, len(pairs)):.2g}); median difference "
          f"user {du:+.2f} µs, system {ds:+.2f} µs a token")
PY
