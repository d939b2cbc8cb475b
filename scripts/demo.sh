#!/usr/bin/env bash
# Real-traffic demo: vLLM's CPU build (or llama.cpp's server) serving SmolLM2-135M behind
# goodput, with perplexity scoring and consistency checks on, and a gentle stream of varied
# requests (chat and completions, streaming or not) from the openai SDK. The status page
# (http://127.0.0.1:9464/status) fills with latency, goodput, vLLM's queue and KV cache, and
# quality scores of real responses.
#   scripts/demo.sh                      # vLLM, until Ctrl-C (its start-up takes minutes)
#   DEMO_SERVER=llama scripts/demo.sh    # llama.cpp's server instead
#   DEMO_REQUESTS=20 scripts/demo.sh
#   DEMO_URL=http://127.0.0.1:18021 scripts/demo.sh   # a server already serving SmolLM2
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER="${DEMO_SERVER:-vllm}"
llm="$(scripts/setup-llm.sh | tail -1)"
read -r VENV GGUF TOKDIR <<< "$llm"
# The scorers' models: SmolLM2 in ONNX (perplexity) and all-MiniLM-L6-v2 (consistency), and
# ONNX Runtime's library.
MODEL_DIR="$(scripts/setup-models.sh | tail -1)"
EMBED_DIR="$(scripts/setup-embeddings.sh | tail -1)"
ORT="$(scripts/setup-onnxruntime.sh | tail -1)"
cargo build --release --quiet
PORT="${LLM_PORT:-8011}"
PROXY="${PROXY:-127.0.0.1:8080}"
ADMIN="${ADMIN:-127.0.0.1:9464}"
mkdir -p target/demo

pids=()
trap 'for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done' EXIT INT TERM
case "$SERVER" in
  vllm)
    read -r VLLM_VENV _ <<< "$(scripts/setup-vllm.sh | tail -1)"
    VENV="$VLLM_VENV"
    if [ -z "${DEMO_URL:-}" ]; then
      VLLM_PORT="$PORT" setsid scripts/run-vllm.sh > target/demo/vllm.log 2>&1 &
      pids+=($!)
    fi
    # The served model name comes from vLLM's /v1/models; usage comes in its answers.
    NAME=vllm
    BACKEND="  - name: $NAME
    url: ${DEMO_URL:-http://127.0.0.1:$PORT}"
    ;;
  llama)
    if [ -z "${DEMO_URL:-}" ]; then
      LLM_PORT="$PORT" setsid scripts/run-llm.sh > target/demo/llama.log 2>&1 &
      pids+=($!)
    fi
    # llama.cpp's server sends no usage in streams: goodput counts with the tokenizer.
    NAME=llama-cpp
    BACKEND="  - name: $NAME
    url: ${DEMO_URL:-http://127.0.0.1:$PORT}
    models: [smollm2]
    tokenizer: $TOKDIR/tokenizer.json"
    ;;
  *) echo "DEMO_SERVER is vllm or llama" >&2; exit 2 ;;
esac
URL="${DEMO_URL:-http://127.0.0.1:$PORT}"
echo "demo: waiting for $SERVER at $URL (logs in target/demo/)" >&2
for i in $(seq 1200); do
  curl -fs "$URL/v1/models" >/dev/null 2>&1 && break
  [ $((i % 100)) -eq 0 ] && echo "demo: $SERVER still starting ($((i / 5)) s)" >&2
  sleep 0.2
done
cat > target/demo/goodput.yaml <<YAML
listen: $PROXY
admin_listen: $ADMIN
backends:
$BACKEND
slo:
  ttft_ms: 500
  tpot_ms: 80
  e2e_ms: 10000
quality:
  # A demo scores half the responses; production samples a few percent.
  sample_rate: 0.5
  max_cpu: 0.5
  perplexity:
    model_dir: $MODEL_DIR
    onnxruntime: $ORT
  consistency:
    sample_rate: 0.2
    samples: 3
    max_tokens: 64
    methods: [embedding, unigram]
    embedding_model_dir: $EMBED_DIR
    max_token_share: 0.5
    # The reference config's setup: a rate once the first 20 checks set embedding's threshold,
    # with SmolLM2's measured error rate on factual questions stated (README, "Hallucination
    # rate"); until then the status page shows "calibrating", not a number.
    calibration: {reference_backend: $NAME, checks: 20, reference_rate: 0.34, reference_labelled: 90}
YAML
target/release/goodput serve --config target/demo/goodput.yaml > target/demo/goodput.out 2> target/demo/goodput.log &
pids+=($!)
for _ in $(seq 600); do
  curl -fs "http://$ADMIN/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
cat <<TXT
goodput is serving real traffic:
  proxy    http://$PROXY/v1   (OpenAI API; model name: smollm2)
  metrics  http://$ADMIN/metrics
  records  http://$ADMIN/admin/records?limit=5
  windows  http://$ADMIN/admin/backends
  status   http://$ADMIN/status
  logs     target/demo/
TXT
"$VENV/bin/python" - "http://$PROXY/v1" "${DEMO_REQUESTS:-0}" scripts/eval/facts.tsv <<'PY'
import random, sys, time
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
limit = int(sys.argv[2])
# Open requests, and the factual questions the calibration's stated rate was measured on.
prompts = ["Explain what a GPU does in two sentences.", "Name three rivers in Europe.",
           "Write a haiku about latency.", "Give two tips for writing clear emails.",
           "Describe a lighthouse at night."]
prompts += [l.split("\t")[1] for l in open(sys.argv[3], encoding="utf-8") if l.strip() and not l.startswith("#")]
rng = random.Random(0)
n = 0
while limit == 0 or n < limit:
    n += 1
    p, stream, chat = rng.choice(prompts), rng.random() < 0.7, rng.random() < 0.8
    kw = dict(model="smollm2", max_tokens=rng.choice([16, 32, 64, 128]), temperature=0.7, stream=stream)
    t = time.perf_counter()
    if chat:
        r = client.chat.completions.create(messages=[{"role": "user", "content": p}], **kw)
    else:
        r = client.completions.create(prompt=p, **kw)
    if stream:
        for _ in r:
            pass
    print(f"request {n}: {'chat' if chat else 'completion'} {'stream' if stream else 'whole'} "
          f"{(time.perf_counter() - t) * 1000:.0f} ms", flush=True)
    time.sleep(rng.uniform(0.3, 1.5))
PY
