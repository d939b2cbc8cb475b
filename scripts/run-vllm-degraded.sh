#!/usr/bin/env bash
# A degraded vLLM replica, for the drift tests and measurements (README, "Quality drift"): each
# scenario stands in for a failure vLLM's users report, where the server keeps answering fast.
#   sampling TEMP          a bad deploy's default sampling: --override-generation-config with
#                          this temperature, for requests that do not set their own
#   weights BITS           damaged weights: the same GGUF converted with every linear layer
#                          quantized again at BITS bits (2: broken; 4: subtle)
#   template no-system     a wrong chat template: system prompts dropped
#   template no-assistant  a wrong chat template: the assistant tag never opened
# Runs in the foreground like scripts/run-vllm.sh (VLLM_PORT); extra arguments go to vLLM.
# Usage: run-vllm-degraded.sh SCENARIO LEVEL [vLLM arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
scenario="${1:?scenario: sampling, weights or template}"
level="${2:?level: a temperature, bits, or a template name}"
shift 2
case "$scenario" in
  sampling)
    exec scripts/run-vllm.sh --override-generation-config "{\"temperature\": $level}" "$@" ;;
  weights)
    [[ "$level" =~ ^[2-8]$ ]] || { echo "weights takes 2 to 8 bits" >&2; exit 2; }
    CACHE="${GOODPUT_CACHE:-$HOME/.cache/goodput}"
    scripts/setup-vllm.sh > /dev/null  # vLLM, and the converter's safetensors
    read -r LLM_VENV GGUF TOKDIR <<< "$(scripts/setup-llm.sh | tail -1)"
    OUT="$CACHE/models/smollm2-135m-instruct-hf-q$level"
    if [ ! -s "$OUT/model.safetensors" ] || [ "$OUT/model.safetensors" -ot scripts/models/gguf_to_hf.py ]; then
      echo "converting $GGUF with every linear layer at $level bits" >&2
      "$LLM_VENV/bin/python" scripts/models/gguf_to_hf.py "$GGUF" "$TOKDIR" "$OUT.tmp" --requantize "$level"
      rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
    fi
    VLLM_MODEL="$OUT" exec scripts/run-vllm.sh "$@" ;;
  template)
    t="scripts/models/templates/$level.jinja"
    [ -f "$t" ] || { echo "no template $t" >&2; exit 2; }
    exec scripts/run-vllm.sh --chat-template "$t" "$@" ;;
  *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
