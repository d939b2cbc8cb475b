#!/usr/bin/env bash
# The whole test suite, as CI runs it: install test dependencies, check formatting and lints,
# then unit tests and black-box tests over real sockets (real Prometheus included).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-test-deps.sh
cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release --tests
