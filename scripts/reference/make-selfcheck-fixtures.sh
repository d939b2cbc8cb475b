#!/usr/bin/env bash
# Regenerate tests/fixtures/selfcheck/unigram_expected.json from unigram_cases.json with the
# reference implementation (PyPI selfcheckgpt 0.1.7). Not run by CI: the fixture is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${GOODPUT_CACHE:-$HOME/.cache/goodput}/venv-selfcheck"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet "spacy==3.8.*" nltk numpy
"$VENV/bin/pip" install --quiet --no-deps "selfcheckgpt==0.1.7"
"$VENV/bin/python" scripts/reference/selfcheck_unigram.py tests/fixtures/selfcheck/unigram_cases.json \
  > tests/fixtures/selfcheck/unigram_expected.json
echo "wrote tests/fixtures/selfcheck/unigram_expected.json" >&2
