#!/usr/bin/env bash
# Labelled evaluation of the consistency methods on a real LLM server (scripts/eval/
# hallucination.py says how): goodput in front of it checks every response with unigram,
# METHODS (default: embedding, unigram, prompt, the server as its own judge); the first
# calibrates on the first phase (half the questions) with REFERENCE_RATE as the stated error
# rate of that phase's responses, and is validated on the other half.
#
#   VLLM_URL=http://127.0.0.1:18021 REPS=2 scripts/eval-hallucination.sh
#   METHODS="unigram, embedding" ...   # unigram calibrated; no judge (much faster)
#   HEALTHY_TEMPERATURE=0 ...          # healthy traffic served greedily
#   PERPLEXITY=1 ...                   # also score every response's perplexity (ranking only)
#
# REFERENCE_RATE (and REFERENCE_LABELLED, the answers it was measured on): the stated error rate
# of the calibrate half. Without it, the script first asks that half straight from the server
# (REPS times, at HEALTHY_TEMPERATURE, default 0.7) and states the share it labels wrong and how
# many it labelled, as an operator labels a sample of the reference. At temperature 0 that is
# the half's own rate; above 0 it is an estimate from other samples of the same questions.
# Output: target/eval/hallucination.json.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VLLM_URL:?the server to evaluate, e.g. http://127.0.0.1:18021 (scripts/run-vllm.sh)}"
REPS="${REPS:-1}"
export HEALTHY_TEMPERATURE="${HEALTHY_TEMPERATURE:-0.7}"
if [ -z "${REFERENCE_RATE:-}" ]; then
  read -r REFERENCE_RATE REFERENCE_LABELLED < <(python3 scripts/eval/hallucination.py label "$VLLM_URL" scripts/eval/facts.tsv "$REPS")
fi
[ -n "${REFERENCE_RATE:-}" ] || { echo "labelling the reference failed" >&2; exit 1; }
LABELLED="${REFERENCE_LABELLED:+, reference_labelled: $REFERENCE_LABELLED}"
echo "reference_rate stated: $REFERENCE_RATE${LABELLED}" >&2
METHODS="${METHODS:-embedding, unigram, prompt}"
OUT=target/eval
mkdir -p "$OUT"
EMBED="$(scripts/setup-embeddings.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
PPL_YAML=""
if [ "${PERPLEXITY:-0}" = 1 ]; then
  PPL_YAML="  sample_rate: 1.0
  perplexity: {model_dir: $(scripts/setup-models.sh | tail -1), onnxruntime: $ORT}"
fi
export PERPLEXITY="${PERPLEXITY:-0}"
cargo build --release --quiet
BIN=target/release/goodput
K6=unused DURATION=0 TOKENS=0
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
N="$(grep -vc '^#' scripts/eval/facts.tsv)"
cat > "$OUT/hallucination.yaml" <<YAML
backends:
  - name: vllm
    url: $VLLM_URL
    models: [smollm2]
metrics: {recent_records: 2000}
quality:
  max_cpu: 16
$PPL_YAML
  consistency:
    sample_rate: 1.0
    samples: 3
    max_tokens: 40
    max_token_share: 1000
    max_concurrent: 4
    queue_capacity: 1000
    methods: [$METHODS]
    max_sentences: 4
    embedding_model_dir: $EMBED
    onnxruntime: $ORT
    calibration: {checks: $(((N + 1) / 2 * REPS)), reference_rate: $REFERENCE_RATE$LABELLED}
YAML
start_goodput --config "$OUT/hallucination.yaml"
python3 scripts/eval/hallucination.py "$GP" "$ADMIN" scripts/eval/facts.tsv "$REPS" "$OUT/hallucination.json"
