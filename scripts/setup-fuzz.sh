#!/usr/bin/env bash
# cargo-fuzz (crates.io) for the fuzz targets under fuzz/; libFuzzer needs the nightly
# toolchain this machine's rustup already has. Idempotent; cached in
# ${GOODPUT_CACHE:-~/.cache/goodput}/tools. Prints the cargo-fuzz binary as its last line.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
BIN="$CACHE/tools/bin/cargo-fuzz"
if ! "$BIN" --version >/dev/null 2>&1; then
  echo "setup-fuzz: installing cargo-fuzz into $CACHE/tools (about a minute)" >&2
  cargo install cargo-fuzz --version 0.13.2 --locked --root "$CACHE/tools" >&2
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "setup-fuzz: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
  exit 1
fi
echo "$BIN"
