#!/usr/bin/env bash
# A profile-guided build of goodput: the `production` profile, optimised with a profile of the
# proxy's own request path under paced traffic, so that the code a request runs is laid out
# together and its branches are predicted. What it buys is a shorter path for a request that
# finds the caches cold, which is every request on a CPU shared with the load (BENCHMARKS.md,
# "A profile-guided build").
#
#   scripts/build-pgo.sh        # prints the binary's path: target/pgo/use/production/goodput
#   FEATURES=cuda scripts/build-pgo.sh
#   scripts/build-pgo.sh REV    # REV built and trained the same way, in bench-ab.sh's worktree
#                               # (target/ab/src-REV), so that two profile-guided builds can be
#                               # compared: prints target/ab/src-REV/target/pgo/use/production/goodput
#
# Three steps, about 15 minutes on 2 cores (two full builds):
#   1. an instrumented build (-Cprofile-generate);
#   2. training: that build serves streamed and whole chat completions from its own simulator,
#      driven by its own load generator (`goodput bench`), with one worker and with two;
#   3. the profile merged with llvm-profdata (rustup's llvm-tools, the one that matches rustc)
#      and the optimised build (-Cprofile-use).
# Only the serving process's profile is used; the simulator's and the load generator's go to a
# directory that is thrown away. Needs no network once llvm-tools is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
# The training below runs from here (its helpers are this tree's); the builds run in SRC.
SRC=.
if [ -n "${1:-}" ]; then SRC="$(rev_worktree "$1")"; fi

sysroot="$(rustc --print sysroot)"
profdata="$(find "$sysroot" -name llvm-profdata -type f 2>/dev/null | head -1)"
if [ -z "$profdata" ]; then
  rustup component add llvm-tools >&2
  profdata="$(find "$sysroot" -name llvm-profdata -type f | head -1)"
fi
[ -x "$profdata" ] || { echo "llvm-profdata not found (rustup component add llvm-tools)" >&2; exit 1; }

PGO="$(cd "$SRC" && pwd)/target/pgo"
features=()
if [ -n "${FEATURES:-}" ]; then features=(--features "$FEATURES"); fi
rm -rf "$PGO/data" "$PGO/discard"
mkdir -p "$PGO/data" "$PGO/discard"
# RUSTFLAGS also reach build scripts and proc macros, which then write profiles as they run.
(cd "$SRC" && LLVM_PROFILE_FILE="$PGO/discard/%p-%m.profraw" RUSTFLAGS="-Cprofile-generate=$PGO/discard" \
  CARGO_TARGET_DIR="$PGO/gen" cargo build --profile production --locked --quiet --bin goodput "${features[@]}" >&2)
GEN="$PGO/gen/production/goodput"

export LLVM_PROFILE_FILE="$PGO/discard/%p-%m.profraw"
start "$GEN" sim --listen 127.0.0.1:0 --ttft-ms 5 --tpot-ms 2 --jitter 0 --output-tokens 32
sim="${LINE##*addr=}"
for workers in 1 2; do
  BIN="$GEN" LLVM_PROFILE_FILE="$PGO/data/%p-%m.profraw" start_goodput --upstream "http://$sim" --workers "$workers"
  "$GEN" bench --target "http://$GP" --model sim-model --rate 100 --num-requests 1500 \
    --input-len 16 --output-len 32 --quiet >/dev/null
  "$GEN" bench --target "http://$GP" --model sim-model --rate 100 --num-requests 500 \
    --input-len 16 --output-len 32 --no-stream --quiet >/dev/null
  # The profile is written when the process exits, and SIGINT is a graceful stop.
  kill -INT "$GP_PID"
  wait "$GP_PID" || true
done
ls "$PGO"/data/*.profraw >/dev/null || { echo "training wrote no profile" >&2; exit 1; }
rm -f "$PGO"/goodput*.profdata
"$profdata" merge -o "$PGO/goodput.profdata" "$PGO"/data/*.profraw
# Cargo does not track the contents of a file that RUSTFLAGS names: a profile named by its
# contents makes every crate build again with a new one, not only those whose source changed.
prof="$PGO/goodput-$(sha256sum "$PGO/goodput.profdata" | cut -c1-16).profdata"
mv "$PGO/goodput.profdata" "$prof"

(cd "$SRC" && RUSTFLAGS="-Cprofile-use=$prof -Cllvm-args=-pgo-warn-missing-function=false" \
  CARGO_TARGET_DIR="$PGO/use" cargo build --profile production --locked --quiet --bin goodput "${features[@]}" >&2)
out=target/pgo/use/production/goodput
if [ "$SRC" = . ]; then echo "$out"; else echo "$SRC/$out"; fi
