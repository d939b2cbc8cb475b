# Helpers shared by the benchmark scripts (sourced; expects $OUT, $BIN, $K6, $DURATION, $TOKENS).

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# CPU time (utime + stime, clock ticks) of a process and its children, e.g. nginx's workers.
proc_tree() { local p="$1"; echo "$p"; for c in $(pgrep -P "$p" || true); do proc_tree "$c"; done; }
cpu_ticks() { local t=0; for p in $(proc_tree "$1"); do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }

# REV -> its git worktree, target/ab/src-REV (made on first use).
rev_worktree() {
  local dir="target/ab/src-$1"
  mkdir -p target/ab
  if [ ! -d "$dir" ]; then git worktree add --detach "$dir" "$1" >&2; fi
  echo "$dir"
}

# REV -> path of its binary (cargo profile $PROFILE, default release), built in a git worktree
# under target/ab.
build_rev() {
  local rev="$1" dir profile="${PROFILE:-release}"
  dir="$(rev_worktree "$rev")"
  (cd "$dir" && cargo build --profile "$profile" --quiet --bin goodput --target-dir ../target >&2)
  cp -f "target/ab/target/$profile/goodput" "target/ab/target/$profile/goodput-$rev"
  echo "target/ab/target/$profile/goodput-$rev"
}

# Per-chunk forwarding latency on the wire (scripts/bench/chunk_latency.py is the upstream and
# the client) through PROXY: a goodput binary, or "nginx". Writes $OUT/cl-NAME.json.
chunk_latency() { # NAME PROXY
  local name="$1" proxy="$2" pf="$OUT/pport-$1" up port p cl
  rm -f "$pf" "$OUT/cl-$name.err"
  python3 scripts/bench/chunk_latency.py "$pf" "${CHUNK_REQS:-150}" 32 2>"$OUT/cl-$name.err" > "$OUT/cl-$name.json" &
  cl=$!
  for _ in $(seq 100); do grep -q upstream= "$OUT/cl-$name.err" 2>/dev/null && break; sleep 0.05; done
  up="$(sed -n 's/upstream=//p' "$OUT/cl-$name.err")"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  if [ "$proxy" = nginx ]; then
    NGINX_WORKERS=1 scripts/bench/nginx.sh "$up" "$port" "$PWD/$OUT/nginx-cl" >/dev/null 2>&1 &
  elif [ "$proxy" = socat ]; then
    # The floor: a byte relay (no HTTP, no parsing), TCP_NODELAY both ways like the proxies.
    socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork,nodelay" "TCP:127.0.0.1:$up,nodelay" >/dev/null 2>&1 &
  else
    "$proxy" serve --upstream "http://127.0.0.1:$up" --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 >/dev/null 2>&1 &
  fi
  p=$!
  sleep 0.5; echo "$port" > "$pf"
  wait "$cl"; kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
}

# The paths a per-request benchmark compares: goodput (working tree, release), goodput at
# REV_A when given, any EXTRA "name=binary" pairs, then nginx. Sets BIN and the array `paths`.
goodput_and_nginx() { # [REV_A]
  cargo build --release --quiet
  BIN=target/release/goodput
  paths=("goodput=$BIN")
  if [ -n "${1:-}" ]; then paths+=("goodput@$1=$(build_rev "$1" | tail -1)"); fi
  for e in ${EXTRA:-}; do paths+=("$e"); done
  paths+=("nginx=nginx")
}

LINE=""
start() { # start CMD... ; sets LINE to its first stdout line, appends its pid to pids
  local log; log="$(mktemp)"
  "$@" > "$log" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 200); do
    LINE="$(head -1 "$log")"
    [ -n "$LINE" ] && return 0
    sleep 0.05
  done
  echo "did not start: $*" >&2; exit 1
}

# A command prefix for start_goodput, e.g. (taskset -c 1) to give goodput a CPU of its own.
CPU_PREFIX=()
start_goodput() { # goodput serve ARGS... on ephemeral ports; sets GP, ADMIN (addresses) and GP_PID
  start "${CPU_PREFIX[@]}" "$BIN" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 "$@"
  GP="$(echo "$LINE" | sed -E 's/.*proxy=([^ ]+).*/\1/')"
  ADMIN="$(echo "$LINE" | sed -E 's/.*admin=([^ ]+).*/\1/')"
  GP_PID="${pids[-1]}"
}

sim_config() { # SIM_ADDR FILE: a goodput config with the simulator at SIM_ADDR as its backend
  printf 'backends:\n  - name: sim\n    url: http://%s\n    models: [sim-model]\n' "$1" > "$2"
}

# The same open-loop load from `goodput bench` ($LOADGEN_BIN, default $BIN): regular arrivals
# (gamma shape 1000), about a quarter of k6's CPU per request on this machine. Prints the
# json line run_k6 does. AUTH, when set, is a NAME:VALUE header for every request.
bench_run() { # base_url rate stream duration
  local f="$OUT/gb-$RANDOM.json" n
  n="$(python3 -c "print(int($2 * float('${4%s}')))")"
  "${LOADGEN_BIN:-$BIN}" bench --target "$1" --model sim-model --rate "$2" --burstiness 1000 --num-requests "$n" \
    --input-len 2 --output-len "$TOKENS" $([ "$3" = 1 ] || echo --no-stream) \
    ${AUTH:+--header "$AUTH"} --quiet --json "$f" >/dev/null 2>&1 || true
  python3 - "$f" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(json.dumps({"med_ms": m["e2el"]["median_ms"], "p99_ms": m["e2el"]["p99_ms"],
                  "reqs": m["completed"] + m["failed"], "dropped": 0, "failed": m["failed"],
                  "checks_failed": 0}))
PY
  rm -f "$f"
}

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

