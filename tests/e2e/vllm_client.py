#!/usr/bin/env python3
"""The client of tests/e2e_vllm.rs: the official openai SDK against vLLM, directly and through
goodput, with vLLM's own /metrics read before and after each request. Prints one JSON document
for the Rust test to compare with goodput's records.

Usage: vllm_client.py MODE VLLM_URL PROXY_URL
  MODE identity: greedy chat and completions, streamed or not, with and without the client's
       own stream usage; the text, and every stream event as the client received it.
  MODE counts:   n=1 and n=2 through goodput; the usage vLLM reported and the change in its
       token counters.
  MODE timing:   streamed requests one at a time, through goodput and directly in turn; the
       client's TTFT and e2e, and the change in vLLM's TTFT and e2e histograms (one request
       each, so exact).
  MODE hangup:   a long stream closed after a few chunks; how long vLLM kept the request and
       the tokens it generated.
"""
import json, sys, time

import openai
from prometheus_client.parser import text_string_to_metric_families

from timed_http import TimedTransport, arrivals, first_content_arrival, httpx, sent_at

mode, vllm_url, proxy_url = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3].rstrip("/")
MODEL = "smollm2"


def client(base):
    http = httpx.Client(transport=TimedTransport(), timeout=300)
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, http_client=http)


def events():
    """The stream as the client received it: each SSE event's data, parsed; ids and creation
    times (which differ between any two requests) taken out."""
    raw = b"".join(c for _, c in arrivals).replace(b"\r\n", b"\n")
    out = []
    for block in raw.split(b"\n\n"):
        data = b"\n".join(l[5:].lstrip(b" ") for l in block.split(b"\n") if l.startswith(b"data:"))
        if not data:
            continue
        if data == b"[DONE]":
            out.append("[DONE]")
            continue
        ev = json.loads(data)
        ev.pop("id", None)
        ev.pop("created", None)
        out.append(ev)
    return out


def vllm_metrics():
    """vLLM's counters and histogram sums, summed over label sets."""
    text = httpx.get(vllm_url + "/metrics", timeout=30).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:") and not s.name.endswith("_created") and "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def settled(before, keys, min_change=None):
    """vLLM's metrics once its counters stop moving (they are updated as the engine's stats
    arrive, a moment after the response's last byte)."""
    last = None
    for _ in range(50):
        now = vllm_metrics()
        if now.get("vllm:num_requests_running", 0) == 0 and last is not None and all(
            now.get(k) == last.get(k) for k in keys
        ) and (min_change is None or now.get(min_change, 0) > before.get(min_change, 0)):
            return now
        last = now
        time.sleep(0.2)
    return last


def delta(before, after, key):
    return after.get(key, 0.0) - before.get(key, 0.0)


direct, proxy = client(vllm_url), client(proxy_url)
CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three rivers in Europe and say one thing about each."},
]
PROMPT = "The three most important inventions of the nineteenth century were"
GREEDY = dict(model=MODEL, temperature=0, max_tokens=40)


def call(c, kind, stream, usage=False, **kw):
    args = dict(GREEDY, **kw)
    if stream and usage:
        args["stream_options"] = {"include_usage": True}
    if kind == "chat":
        r = c.chat.completions.create(messages=CHAT, stream=stream, **args)
    else:
        r = c.completions.create(prompt=PROMPT, stream=stream, **args)
    if not stream:
        texts = [(ch.message.content if kind == "chat" else ch.text) for ch in r.choices]
        return {"texts": texts, "usage": r.usage.model_dump() if r.usage else None}
    texts, usage_seen = {}, None
    for ev in r:
        if getattr(ev, "usage", None):
            usage_seen = ev.usage.model_dump()
        for ch in ev.choices:
            piece = (ch.delta.content if kind == "chat" else ch.text) or ""
            texts[ch.index] = texts.get(ch.index, "") + piece
    return {"texts": [texts[i] for i in sorted(texts)], "usage": usage_seen, "events": events()}


out = {}
if mode == "identity":
    cases = []
    for kind in ("chat", "completion"):
        for stream, usage in ((False, False), (True, False), (True, True)):
            # The same request once before, so that direct and proxied calls meet the same
            # prefix cache (a cached prefix is computed differently, and greedy outputs could
            # then differ for a reason that is not goodput's).
            call(direct, kind, stream, usage)
            d = call(direct, kind, stream, usage)
            p = call(proxy, kind, stream, usage)
            cases.append({"kind": kind, "stream": stream, "usage": usage, "direct": d, "proxy": p})
    out["cases"] = cases
elif mode == "counts":
    cases = []
    keys = ["vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total"]
    for n in (1, 2):
        for stream in (False, True):
            before = settled({}, keys)
            # Sampled, so that the n choices differ (and so their lengths).
            r = call(proxy, "chat", stream, False, n=n, temperature=0.8, seed=7, max_tokens=24 + 8 * n)
            after = settled(before, keys, "vllm:request_success_total")
            cases.append({
                "n": n, "stream": stream, "client": r,
                "generation_tokens": delta(before, after, "vllm:generation_tokens_total"),
                "prompt_tokens": delta(before, after, "vllm:prompt_tokens_total"),
            })
    out["cases"] = cases
elif mode == "timing":
    # Through goodput and directly, alternating (who goes first too), so that both meet the
    # same load: what vLLM's own clock leaves out (its HTTP parsing, chat template and
    # tokenization, the client's socket) is in the direct runs as well.
    runs = []
    keys = ["vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"]
    for i in range(16):
        via = "proxy" if (i + i // 2) % 2 == 0 else "direct"
        before = settled({}, keys)
        t0 = time.perf_counter()
        r = (proxy if via == "proxy" else direct).chat.completions.create(
            messages=[{"role": "user", "content": f"Count from {i} to {i + 9}."}],
            stream=True, **GREEDY)
        for _ in r:
            pass
        e2e = time.perf_counter() - t0
        ttft = first_content_arrival() - sent_at[0]
        after = settled(before, keys, "vllm:e2e_request_latency_seconds_count")
        assert delta(before, after, "vllm:time_to_first_token_seconds_count") == 1
        runs.append({
            "via": via, "client_ttft": ttft, "client_e2e": e2e,
            "vllm_ttft": delta(before, after, "vllm:time_to_first_token_seconds_sum"),
            "vllm_e2e": delta(before, after, "vllm:e2e_request_latency_seconds_sum"),
        })
    out["runs"] = runs
elif mode == "hangup":
    keys = ["vllm:generation_tokens_total"]
    before = settled({}, keys)
    s = proxy.chat.completions.create(
        messages=[{"role": "user", "content": "Write a very long story about a dragon and a lighthouse."}],
        model=MODEL, temperature=0, max_tokens=1500, stream=True)
    got = 0
    for ev in s:
        if ev.choices and ev.choices[0].delta.content:
            got += 1
            if got == 5:
                break
    s.close()
    closed = time.perf_counter()
    freed = None
    while time.perf_counter() - closed < 10:
        if vllm_metrics().get("vllm:num_requests_running", 0) == 0:
            freed = time.perf_counter() - closed
            break
        time.sleep(0.02)
    after = settled(before, keys)
    out = {"chunks_read": got, "freed_s": freed,
           "generation_tokens": delta(before, after, "vllm:generation_tokens_total")}
print(json.dumps(out))
