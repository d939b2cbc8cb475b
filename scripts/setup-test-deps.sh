#!/usr/bin/env bash
# Install what the test suite needs beyond Rust: Prometheus (Debian's package; the tests start
# it on a loopback port), Chromium (headless, for the admin status page test) and a TrueType
# font (DejaVu).
# Idempotent: does nothing when everything is already there.
set -euo pipefail

need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# A TrueType font: Chromium's page text and goodput bench --plot's labels.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)

if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup-test-deps: installing ${need[*]}" >&2
  $SUDO apt-get -o Acquire::Retries=3 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's package starts a system service where systemd runs; the tests start their own.
command -v prometheus >/dev/null
command -v chromium >/dev/null
echo "setup-test-deps: ok" >&2
