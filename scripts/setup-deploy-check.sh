#!/usr/bin/env bash
# What the deployment checks need: Helm's own library for Python (PyPI helm-python-sdk; no helm
# binary) to render and lint the chart, and kubernetes-validate (PyPI; ships the Kubernetes
# schemas) to validate what it renders. promtool comes with Debian's prometheus package
# (scripts/setup-test-deps.sh). Also dnslib (PyPI), the DNS server the pool-discovery test
# answers from (tests/e2e/dns_server.py). Idempotent; cached in ${GOODPUT_CACHE:-~/.cache/goodput}.
# Prints the venv's python as its last line.
set -euo pipefail
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-deploy"
if ! "$VENV/bin/python" -c "import helm_python, kubernetes_validate, yaml, dnslib" >/dev/null 2>&1; then
  echo "setup-deploy-check: installing helm-python-sdk and kubernetes-validate into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "helm-python-sdk==0.2.2" "kubernetes-validate==1.37.0" pyyaml "dnslib==0.9.26"
fi
echo "$VENV/bin/python"
