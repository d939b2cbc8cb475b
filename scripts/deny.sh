#!/usr/bin/env bash
# Supply-chain checks (CI runs this): cargo-deny (crates.io, cached in ~/.cache/goodput/tools)
# on licenses, bans and sources; RustSec advisories when the database can be had; and yanked
# releases through the crates.io index.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
DENY="$CACHE/tools/bin/cargo-deny"
if ! "$DENY" --version >/dev/null 2>&1; then
  echo "deny: installing cargo-deny into $CACHE/tools (a few minutes, once)" >&2
  # Its own release profile is fat LTO in one codegen unit, slow to build on two cores for a
  # tool that reads two lockfiles: built without them (a cold CI run installs it every time).
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install cargo-deny --version 0.20.2 --locked --root "$CACHE/tools" >&2
fi
"$DENY" check bans licenses sources
# The advisory database is a git repository on GitHub (rustsec/advisory-db). Where it cannot
# be fetched (this project's machines reach only crates.io, PyPI, Debian and npm) say so
# plainly instead of passing silently.
if timeout 10 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
  "$DENY" check advisories
else
  echo "deny: advisories NOT CHECKED: the RustSec database (github.com/rustsec/advisory-db) cannot be fetched from here" >&2
fi
python3 scripts/check-yanked.py Cargo.lock fuzz/Cargo.lock
