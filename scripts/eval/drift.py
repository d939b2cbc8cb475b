"""One scenario of the drift measurement (scripts/eval-drift.sh runs it): goodput in front of a
pool of two vLLM replicas, `healthy` and `suspect`, every response scored (bits per byte,
perplexity) and consistency-checked (each configured method). The chat mix of
scripts/eval/chat-prompts.jsonl goes through goodput four at a time at the servers' default
sampling, while goodput's drift reading of each replica is polled every second.

Per signal:
  auroc        suspect's responses against healthy's (bootstrap 95% interval): how well one
               response separates; about 0.5 when the suspect is healthy too
  detect       the first poll at which the suspect's drift was confident: seconds since the
               first request, and the scores each side had then (null: never in this run)
  false_alarm  polls at which the healthy replica was confidently worse than the suspect
The cost: scorer CPU seconds and re-sampled tokens over the run, and per detection.
Responses are held in memory only; the output has numbers.

Usage: drift.py GOODPUT ADMIN HEALTHY SUSPECT REQUESTS OUT.json
"""

import json
import random
import sys
import threading
import time

import evallib
from evallib import auroc_ci, http

gp, admin, healthy, suspect, n_req, out_path = sys.argv[1:7]
n_req = int(n_req)
SIGNALS = ["bits_per_byte", "consistency"]


def metrics():
    return evallib.metrics(admin)


mix = [json.loads(line)["messages"] for line in open("scripts/eval/chat-prompts.jsonl", encoding="utf-8")]


# The prompts in a seeded random order: round robin alternates replicas by arrival, so the mix
# in file order would send one replica the even prompts and the other the odd ones, and any
# difference between those halves would read as drift.
order = [i % len(mix) for i in range(n_req)]
random.Random(7).shuffle(order)


def ask(i):
    body = {"model": "smollm2", "max_tokens": 48, "messages": mix[order[i]]}
    http(f"http://{gp}/v1/chat/completions", json.dumps(body).encode())


def drift_of(bk, endpoint):
    for e in bk["backends"][0].get("endpoints", []):
        if e["endpoint"] == endpoint:
            return {d["signal"]: d for d in (e.get("drift") or [])}
    return {}


t0 = time.time()
detect = {s: None for s in SIGNALS}
false_alarm = {s: 0 for s in SIGNALS}
polls = 0
done = threading.Event()


def poll():
    global polls
    while not done.is_set():
        bk = json.loads(http(f"http://{admin}/admin/backends"))
        polls += 1
        sd, hd = drift_of(bk, suspect), drift_of(bk, healthy)
        for s in SIGNALS:
            d = sd.get(s)
            if d and d["confident"] and detect[s] is None:
                detect[s] = {
                    "seconds": round(time.time() - t0, 1),
                    "scores": d["n"],
                    "reference_scores": d["reference_n"],
                    "estimate": round(d["estimate"], 3),
                    "interval": [round(d["lower"], 3), round(d["upper"], 3)],
                }
            if hd.get(s, {}).get("confident"):
                false_alarm[s] += 1
        done.wait(1.0)


m0 = metrics()
poller = threading.Thread(target=poll, daemon=True)
poller.start()
next_i = iter(range(n_req))
lock = threading.Lock()


def worker():
    while True:
        with lock:
            i = next(next_i, None)
        if i is None:
            return
        ask(i)


workers = [threading.Thread(target=worker) for _ in range(4)]
for w in workers:
    w.start()
for w in workers:
    w.join()
sent_secs = time.time() - t0


def finished():
    m = metrics()
    scored = sum(m.get(k, 0) for k in ["goodput_scored_responses_total", "goodput_scoring_dropped_total",
                                        "goodput_scoring_failed_total"]) - sum(
        m0.get(k, 0) for k in ["goodput_scored_responses_total", "goodput_scoring_dropped_total",
                               "goodput_scoring_failed_total"])
    checked = sum(m.get(k, 0) - m0.get(k, 0) for k in ["goodput_consistency_checked_total",
                                                        "goodput_consistency_failed_total",
                                                        "goodput_shadow_checks_skipped_total"])
    return scored >= n_req and checked >= n_req, m


deadline = time.time() + 3600
while True:
    ok, m1 = finished()
    if ok:
        break
    if time.time() > deadline:
        sys.exit("scoring did not finish")
    time.sleep(1)
time.sleep(1.5)
done.set()
poller.join()

recs = json.loads(http(f"http://{admin}/admin/records?limit={n_req}"))


def score(r, s):
    if s == "bits_per_byte":
        return r.get("bits_per_byte")
    if s == "perplexity":
        return r.get("perplexity")
    return (r.get("consistency_scores") or {}).get(s)


methods = sorted({k for r in recs for k in (r.get("consistency_scores") or {})})


def median(xs):
    xs = sorted(xs)
    return round(xs[len(xs) // 2], 3) if xs else None


per_signal = {}
for s in ["bits_per_byte", "perplexity"] + methods:
    pos = [v for r in recs if r.get("endpoint") == suspect and (v := score(r, s)) is not None]
    neg = [v for r in recs if r.get("endpoint") == healthy and (v := score(r, s)) is not None]
    per_signal[s] = {"auroc": auroc_ci(pos, neg), "median_suspect": median(pos), "median_healthy": median(neg),
                     "n_suspect": len(pos), "n_healthy": len(neg)}

cpu = {k: round(m1.get(k, 0) - m0.get(k, 0), 1) for k in ["goodput_scoring_cpu_seconds_total"]}
shadow_tokens = m1.get("goodput_shadow_tokens_total", 0) - m0.get("goodput_shadow_tokens_total", 0)
served = {}
for r in recs:
    served[r.get("endpoint")] = served.get(r.get("endpoint"), 0) + 1
result = {
    "requests": n_req,
    "served": served,
    "seconds": round(sent_secs, 1),
    "requests_per_sec": round(n_req / sent_secs, 3),
    "sample_rate": 1.0,
    "consistency_methods": methods,
    "signals": per_signal,
    "detect": detect,
    "polls": polls,
    "false_alarm_polls": false_alarm,
    "scorer_cpu_seconds": cpu["goodput_scoring_cpu_seconds_total"],
    "shadow_tokens": int(shadow_tokens),
}
json.dump(result, open(out_path, "w"), indent=2)
print(json.dumps(result, indent=2))
