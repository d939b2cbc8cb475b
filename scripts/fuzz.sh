#!/usr/bin/env bash
# Build the fuzz targets (fuzz/) and run each for SECONDS (default 60), starting from the
# committed seed corpus. New inputs go to a scratch corpus (the committed one is not touched);
# a crash leaves its input under fuzz/artifacts/TARGET and fails the script.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# CI does not fuzz: tests/fuzz_corpus.rs replays the committed corpus through the same
# properties (fuzz/properties/). RELIABILITY.md records long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
shift || true
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
FUZZ="$(scripts/setup-fuzz.sh | tail -1)"
export PATH="$(dirname "$FUZZ"):$PATH"
# The instrumented build of every dependency takes minutes: keep it between runs.
export CARGO_TARGET_DIR="${GOODPUT_FUZZ_TARGET_DIR:-$CACHE/fuzz-target}"
# No AddressSanitizer: goodput's code is safe Rust (panics, overflows with debug assertions
# and stack overflows are caught without it), and the build is several times faster; 16
# codegen units let both cores compile the goodput crate.
FLAGS=(--release --sanitizer none --codegen-units 16)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sse_reader usage_strip openai_parsers config)
for t in "${targets[@]}"; do
  cargo +nightly fuzz build "${FLAGS[@]}" "$t"
done
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
  echo "fuzz: $t for ${SECS}s" >&2
  log="$scratch/$t.log"
  if ! cargo +nightly fuzz run "${FLAGS[@]}" "$t" "$scratch/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$SECS" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1; then
    tail -60 "$log" >&2
    echo "fuzz: $t FAILED (input under fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  stat() { grep -o "stat::$1: *[0-9]*" "$log" | grep -o '[0-9]*$' || echo '?'; }
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)"
  echo "fuzz: $t ok: $(stat number_of_executed_units) runs in ${SECS}s, $cov," \
    "corpus $(ls "$scratch/$t" "fuzz/corpus/$t" | wc -l) inputs, peak RSS $(stat peak_rss_mb) MB" >&2
done
