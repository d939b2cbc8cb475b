#!/usr/bin/env bash
# A/B benchmark of two goodput builds, side by side in one run: the same simulated upstream (no
# artificial delay), the same open-loop k6 load, direct vs build A vs build B alternated REPS
# times, so both builds see the same machine noise. Reports medians of the per-run p50/p99 and
# the added latency over direct, and each build's CPU time (utime + stime) per request, B as a
# ratio to A. Then per-chunk latency on the wire (scripts/bench/chunk_latency.py), A, B and
# nginx alternated CHUNK_ROUNDS times.
#
# Then realistic pacing (PACED_RATES, default "100 400" streams/s; empty skips): the simulator
# at --ttft-ms 50 --tpot-ms 10 --jitter 0 with 64 output tokens, driven by `goodput bench`
# (open loop, Poisson), direct vs A vs B vs nginx alternated REPS times: added TTFT and
# inter-token latency (p50 and p99 over direct, median over the repetitions) and each proxy's
# CPU time per streamed token.
#
#   scripts/bench-ab.sh REV_A [REV_B=working tree] [RATES="500 1000"] [DURATION=10s] [REPS=3]
#                       [CHUNK_ROUNDS=3; 0 skips] [GP_WORKERS=1] [LOADGEN=k6|bench]
#                       [PACED_RATES="100 400"] [PACED_DURATION=10s] [ZERO_DELAY=1; 0 skips]
#                       [PROFILE=production] [PIN=0] [A_BIN, B_BIN: builds made elsewhere]
#
# PIN=1 runs the paced rows with each proxy (A, B, nginx) on CPU 1 and the simulator and the load
# generator on CPU 0, as a sidecar with a CPU of its own runs: a proxy's wait for a core then
# comes from its own work, not from the load generator's. Needs two CPUs.
#
# LOADGEN=bench drives the load with `goodput bench` (the working tree's), as bench-peers.sh can.
#
# REV_A is built in a git worktree under target/ab (its own target directory: the first run
# compiles every dependency once), in the same cargo profile as B; a revision older than the
# `production` profile (ec628d9) needs PROFILE=release. Results: target/bench/ab-runs.jsonl and
# a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REV_A="${1:?usage: scripts/bench-ab.sh REV_A [REV_B]}"
REV_B="${2:-}"
RATES="${RATES:-500 1000}"
DURATION="${DURATION:-10s}"
REPS="${REPS:-3}"
TOKENS="${TOKENS:-16}"
# One worker, as bench-peers.sh gives goodput beside one-worker peers.
GP_WORKERS="${GP_WORKERS:-1}"
OUT=target/bench
mkdir -p "$OUT"

# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

K6="$(scripts/setup-bench.sh | tail -1)"
# Both builds in the profile that ships (the image's: Cargo.toml's `production`, fat LTO), since
# LTO inlines across crates, and the two builds differ in how much of the path is another crate's.
# PROFILE=release measures the test build. The simulator and the load generator are the working
# tree's release build either way.
export PROFILE="${PROFILE:-production}"
[ -n "${A_BIN:-}" ] || A_BIN="$(build_rev "$REV_A" | tail -1)"
if [ -n "${B_BIN:-}" ]; then : # a build made elsewhere (scripts/build-pgo.sh)
elif [ -n "$REV_B" ]; then B_BIN="$(build_rev "$REV_B" | tail -1)"
else cargo build --profile "$PROFILE" --quiet --bin goodput; B_BIN="target/$PROFILE/goodput"; fi
cargo build --release --quiet
BIN=target/release/goodput
LOADGEN_BIN="$BIN"

start $BIN sim --listen 127.0.0.1:0 --ttft-ms 0 --tpot-ms 0 --output-tokens "$TOKENS"
SIM="${LINE##*addr=}"
BIN="$A_BIN" start_goodput --upstream "http://$SIM" --workers "$GP_WORKERS"; GP_A="$GP"; PID_A="$GP_PID"
BIN="$B_BIN" start_goodput --upstream "http://$SIM" --workers "$GP_WORKERS"; GP_B="$GP"; PID_B="$GP_PID"
echo "sim=$SIM a=$GP_A ($REV_A) b=$GP_B (${REV_B:-working tree}) k6=$K6" >&2

results="$OUT/ab-runs.jsonl"
: > "$results"
[ "${ZERO_DELAY:-1}" = 1 ] || RATES=""
for stream in 0 1; do
  for rate in $RATES; do
    for rep in $(seq "$REPS"); do
      # Reversed on every other repetition, so that a drift of the machine favours neither build.
      order="direct a b"; [ $((rep % 2)) -eq 0 ] && order="b a direct"
      for path in $order; do
        pid=""
        case "$path" in
          direct) url="http://$SIM/v1/chat/completions" ;;
          a) url="http://$GP_A/v1/chat/completions"; pid="$PID_A" ;;
          b) url="http://$GP_B/v1/chat/completions"; pid="$PID_B" ;;
        esac
        c0=0; [ -n "$pid" ] && c0="$(cpu_ticks "$pid")"
        if [ "${LOADGEN:-k6}" = bench ]; then r="$(bench_run "${url%/v1/chat/completions}" "$rate" "$stream" "$DURATION")"
        else r="$(run_k6 "$url" "$rate" "$stream")"; fi
        cpu=0; [ -n "$pid" ] && cpu=$(( $(cpu_ticks "$pid") - c0 ))
        echo "{\"stream\":$stream,\"rate\":$rate,\"rep\":$rep,\"path\":\"$path\",\"k6\":$r,\"cpu_ticks\":$cpu}" | tee -a "$results" >&2
      done
    done
  done
done

[ -z "$RATES" ] || python3 - "$results" "$REV_A" "${REV_B:-working tree}" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b = sys.argv[2], sys.argv[3]
hz = int(sys.argv[4])
sys.path.insert(0, "scripts/bench")
from pairs import sign_p  # two-sided sign test: k of n paired runs favour one side
print(f"| mode | rate (req/s) | direct p50 / p99 | A ({a}) added p50 / p99 | B ({b}) added p50 / p99 | B/A added p50 | B lower, p50 / p99 (sign test p) | CPU per request A / B | B/A CPU | dropped/failed |")
print("|---|---|---|---|---|---|---|---|---|---|")
for stream in (0, 1):
    for rate in sorted({r["rate"] for r in rows}):
        sel = lambda p: [r["k6"] for r in rows if r["stream"] == stream and r["rate"] == rate and r["path"] == p]
        med = lambda p, k: statistics.median(x[k] for x in sel(p))
        d50, d99 = med("direct", "med_ms"), med("direct", "p99_ms")
        add = lambda p: ((med(p, "med_ms") - d50) * 1000, (med(p, "p99_ms") - d99) * 1000)
        (a50, a99), (b50, b99) = add("a"), add("b")
        bad = sum(x["dropped"] + x["failed"] for p in ("a", "b") for x in sel(p))
        # goodput's own CPU time (utime + stime) per request, median over the runs.
        cpu = lambda p: statistics.median(r["cpu_ticks"] / hz / r["k6"]["reqs"] * 1e6 for r in rows
                                          if r["stream"] == stream and r["rate"] == rate and r["path"] == p)
        ca, cb = cpu("a"), cpu("b")
        # Paired: A and B of the same repetition ran back to back.
        reps = {}
        for r in rows:
            if r["stream"] == stream and r["rate"] == rate and r["path"] in ("a", "b"):
                reps.setdefault(r["rep"], {})[r["path"]] = r["k6"]
        pairs = [v for v in reps.values() if len(v) == 2]
        lower = lambda k: sum(v["b"][k] < v["a"][k] for v in pairs)
        l50, l99, n = lower("med_ms"), lower("p99_ms"), len(pairs)
        paired = f"{l50}/{n} ({sign_p(l50, n):.2g}) / {l99}/{n} ({sign_p(l99, n):.2g})"
        print(f"| {'stream' if stream else 'non-stream'} | {rate} | {d50:.3f} / {d99:.3f} ms | {a50:.0f} µs / {a99:.0f} µs | {b50:.0f} µs / {b99:.0f} µs | {b50 / a50:.2f} | {paired} | {ca:.0f} / {cb:.0f} µs | {cb / ca:.2f} | {bad} |")
PY

PACED_RATES="${PACED_RATES-100 400}"
if [ -n "$PACED_RATES" ]; then
  scripts/setup-bench.sh >/dev/null # nginx
  UP_CPU=(); PROXY_CPU=()
  if [ "${PIN:-0}" = 1 ]; then UP_CPU=(taskset -c 0); PROXY_CPU=(taskset -c 1); fi
  start "${UP_CPU[@]}" "$BIN" sim --listen 127.0.0.1:0 --ttft-ms 50 --tpot-ms 10 --jitter 0 --output-tokens 64
  PSIM="${LINE##*addr=}"
  CPU_PREFIX=("${PROXY_CPU[@]}")
  BIN="$A_BIN" start_goodput --upstream "http://$PSIM" --workers "$GP_WORKERS"; PGP_A="$GP"; PPID_A="$GP_PID"
  BIN="$B_BIN" start_goodput --upstream "http://$PSIM" --workers "$GP_WORKERS"; PGP_B="$GP"; PPID_B="$GP_PID"
  CPU_PREFIX=()
  nport="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  NGINX_WORKERS=1 "${PROXY_CPU[@]}" scripts/bench/nginx.sh "${PSIM##*:}" "$nport" "$PWD/$OUT/nginx-paced" >/dev/null 2>&1 &
  pids+=($!); sleep 0.5
  NGINX_PID="$(cat "$OUT/nginx-paced/nginx.pid")"
  paced="$OUT/ab-paced.jsonl"
  : > "$paced"
  for rate in $PACED_RATES; do
    for rep in $(seq "$REPS"); do
      order="direct a b nginx"; [ $((rep % 2)) -eq 0 ] && order="nginx b a direct"
      for path in $order; do
        case "$path" in
          direct) base="http://$PSIM"; pid="" ;;
          a) base="http://$PGP_A"; pid="$PPID_A" ;;
          b) base="http://$PGP_B"; pid="$PPID_B" ;;
          nginx) base="http://127.0.0.1:$nport"; pid="$NGINX_PID" ;;
        esac
        c0=0; [ -n "$pid" ] && c0="$(cpu_ticks "$pid")"
        f="$OUT/paced-$RANDOM.json"
        n="$(python3 -c "print(int($rate * float('${PACED_DURATION:-10s}'.rstrip('s'))))")"
        "${UP_CPU[@]}" "$BIN" bench --target "$base" --model sim-model --rate "$rate" --num-requests "$n" \
          --input-len 2 --output-len 64 --quiet --json "$f" >/dev/null 2>&1 || true
        cpu=0; [ -n "$pid" ] && cpu=$(( $(cpu_ticks "$pid") - c0 ))
        python3 - "$f" "$rate" "$rep" "$path" "$cpu" <<'PY' | tee -a "$paced" >&2
import json, sys
m = json.load(open(sys.argv[1]))
print(json.dumps({"rate": float(sys.argv[2]), "rep": int(sys.argv[3]), "path": sys.argv[4], "cpu_ticks": int(sys.argv[5]),
                  "ttft50": m["ttft"]["median_ms"], "ttft99": m["ttft"]["p99_ms"],
                  "itl50": m["itl"]["median_ms"], "itl99": m["itl"]["p99_ms"],
                  "tokens": m["total_output_tokens"], "completed": m["completed"], "failed": m["failed"]}))
PY
        rm -f "$f"
      done
    done
  done
  python3 - "$paced" "$REV_A" "${REV_B:-working tree}" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b, hz = sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, "scripts/bench")
from pairs import sign_p
print(f"\n| realistic pacing (sim: TTFT 50 ms, TPOT 10 ms, 64 tokens) | rate (streams/s) | added TTFT p50 / p99 | added ITL p50 / p99 | CPU per streamed token | failed |")
print("|---|---|---|---|---|---|")
for rate in sorted({r["rate"] for r in rows}):
    by = lambda p: {r["rep"]: r for r in rows if r["rate"] == rate and r["path"] == p}
    direct = by("direct")
    for p, label in (("a", f"A ({a})"), ("b", f"B ({b})"), ("nginx", "nginx")):
        runs = by(p)
        # Added over direct within the same repetition, then the median over repetitions.
        add = lambda k: statistics.median((runs[i][k] - direct[i][k]) * 1000 for i in runs if i in direct)
        cpu = statistics.median(r["cpu_ticks"] / hz / max(r["tokens"], 1) * 1e6 for r in runs.values())
        failed = sum(r["failed"] for r in runs.values())
        print(f"| {label} | {rate:.0f} | {add('ttft50'):.0f} µs / {add('ttft99'):.0f} µs | {add('itl50'):.0f} µs / {add('itl99'):.0f} µs | {cpu:.1f} µs | {failed} |")
    ra, rb = by("a"), by("b")
    pairs = [i for i in ra if i in rb]
    lower = sum(rb[i]["ttft99"] < ra[i]["ttft99"] for i in pairs)
    lower_itl = sum(rb[i]["itl99"] < ra[i]["itl99"] for i in pairs)
    print(f"| B lower than A, p99 TTFT / ITL (sign test p) | {rate:.0f} | {lower}/{len(pairs)} ({sign_p(lower, len(pairs)):.2g}) | {lower_itl}/{len(pairs)} ({sign_p(lower_itl, len(pairs)):.2g}) | | |")
    # The issue's targets read per repetition: B's TTFT and ITL medians minus A's, B's CPU per
    # token over A's, the median over the pairs.
    diff = lambda k: statistics.median((rb[i][k] - ra[i][k]) * 1000 for i in pairs)
    tok = lambda r: r["cpu_ticks"] / max(r["tokens"], 1)
    ratio = statistics.median(tok(rb[i]) / tok(ra[i]) for i in pairs if tok(ra[i]) > 0)
    print(f"| B − A in the same repetition, median: TTFT p50 / ITL p50 / CPU per token | {rate:.0f} | {diff('ttft50'):+.0f} µs | {diff('itl50'):+.0f} µs | {ratio:.2f}× | |")
PY
fi

[ "${CHUNK_ROUNDS:-3}" -gt 0 ] || exit 0
# Per-chunk latency on the wire: rounds alternate A, B, nginx and socat (a byte relay: the
# floor of one proxy hop), the same machine noise for all; the table gives the median over
# rounds of each round's added p50 and p99.
kill "${pids[@]}" 2>/dev/null || true; pids=()
scripts/setup-bench.sh >/dev/null # nginx
for name in a b nginx socat; do : > "$OUT/cl-ab-$name.jsonl"; done
for _ in $(seq "${CHUNK_ROUNDS:-3}"); do
  for name in a b nginx socat; do
    case "$name" in a) proxy="$A_BIN" ;; b) proxy="$B_BIN" ;; *) proxy="$name" ;; esac
    chunk_latency "ab-$name" "$proxy"
    tee -a "$OUT/cl-ab-$name.jsonl" < "$OUT/cl-ab-$name.json" >&2
  done
done
python3 - "$OUT" "$REV_A" "${REV_B:-working tree}" <<'PY'
import json, statistics, sys
out, a, b = sys.argv[1:4]
runs = {n: [json.loads(l) for l in open(f"{out}/cl-ab-{n}.jsonl")] for n in ("a", "b", "nginx", "socat")}
print(f"\n| per-chunk added latency (on the wire, 2 ms between chunks), median of {len(runs['a'])} rounds | p50 | p99 | p50 of each round |")
print("|---|---|---|---|")
for n, label in (("a", f"A ({a})"), ("b", f"B ({b})"), ("nginx", "nginx"), ("socat", "socat (byte relay: the floor)")):
    p50 = [r["p50"]["added_us"] for r in runs[n]]
    p99 = [r["p99"]["added_us"] for r in runs[n]]
    print(f"| {label} | {statistics.median(p50):.0f} µs | {statistics.median(p99):.0f} µs | " + ", ".join(f"{v:.0f}" for v in p50) + " |")
PY
