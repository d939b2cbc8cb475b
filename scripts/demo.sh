#!/usr/bin/env bash
# Real-traffic demo: llama.cpp's server with SmolLM2-135M behind goodput, and a gentle stream
# of varied requests (chat and completions, streaming or not) from the openai SDK.
#   scripts/demo.sh            # until Ctrl-C
#   DEMO_REQUESTS=20 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
llm="$(scripts/setup-llm.sh | tail -1)"
read -r VENV GGUF TOKDIR <<< "$llm"
cargo build --release --quiet
LLM_PORT="${LLM_PORT:-8011}"
PROXY="${PROXY:-127.0.0.1:8080}"
ADMIN="${ADMIN:-127.0.0.1:9464}"
mkdir -p target/demo

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
LLM_PORT="$LLM_PORT" scripts/run-llm.sh > target/demo/llama.log 2>&1 &
pids+=($!)
cat > target/demo/goodput.yaml <<YAML
listen: $PROXY
admin_listen: $ADMIN
backends:
  - name: llama-cpp
    url: http://127.0.0.1:$LLM_PORT
    models: [smollm2]
    tokenizer: $TOKDIR/tokenizer.json
slo:
  ttft_ms: 500
  tpot_ms: 50
  e2e_ms: 10000
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
  logs     target/demo/
TXT
"$VENV/bin/python" - "http://$PROXY/v1" "${DEMO_REQUESTS:-0}" <<'PY'
import random, sys, time
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
limit = int(sys.argv[2])
prompts = ["Explain what a GPU does in two sentences.", "Name three rivers in Europe.",
           "Write a haiku about latency.", "What is the capital of Japan?",
           "Give two tips for writing clear emails.", "Describe a lighthouse at night."]
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
