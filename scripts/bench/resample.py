"""One run of scripts/bench-resample.sh: CHECKS chat requests through goodput, one at a time,
each waited for until its consistency check has ended; the server's CPU (its process tree)
and the wall time over the run, and goodput's shadow counters. Prints one JSON line."""

import json
import os
import re
import sys
import time
import urllib.request

gp, admin, server_pid, checks, mode, rep = sys.argv[1:7]
checks = int(checks)
TICK = os.sysconf("SC_CLK_TCK")
# A shared system prompt of a few hundred tokens, as chat traffic carries: what `n` can prefill once.
SYSTEM = ("You are a careful assistant for a travel company. Answer in one short sentence, "
          "name the place you mean, and never invent facts you are unsure of. ") * 6
QUESTIONS = [l.split("\t")[1] for l in open("scripts/eval/facts.tsv", encoding="utf-8")
             if l.strip() and not l.startswith("#")]


def tree(pid):
    """pid and its descendants (vLLM's engine core is a child process)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parents[d] = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]
            except OSError:
                pass
    out, todo = [], [str(pid)]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parents.items() if pp == p]
    return out


def cpu_s():
    t = 0
    for p in tree(server_pid):
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])
        except OSError:
            pass
    return t / TICK


def metrics():
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key = line.rsplit(" ", 1)[0]
        out[key] = float(line.rsplit(" ", 1)[1])
    return out


def total(m, name, **labels):
    return sum(v for k, v in m.items()
               if re.split(r"[{ ]", k, 1)[0] == name and all(f'{a}="{b}"' in k for a, b in labels.items()))


def done(m):
    return sum(total(m, n) for n in ["goodput_consistency_checked_total", "goodput_consistency_failed_total",
                                      "goodput_shadow_checks_skipped_total"])


c0, t0 = cpu_s(), time.monotonic()
for i in range(checks):
    q = QUESTIONS[(i * 7 + int(rep)) % len(QUESTIONS)]
    body = {"model": "smollm2", "temperature": 0.7, "max_tokens": 48,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
    req = urllib.request.Request(f"http://{gp}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=300).read()
    deadline = time.monotonic() + 300
    while done(metrics()) < i + 1:
        if time.monotonic() > deadline:
            sys.exit(f"check {i} did not finish")
        time.sleep(0.05)
wall, cpu = time.monotonic() - t0, cpu_s() - c0
m = metrics()
checked = total(m, "goodput_consistency_checked_total")
print(json.dumps({
    "mode": mode, "rep": int(rep), "checks": checks, "checked": checked,
    "cpu_s": round(cpu / checks, 4), "wall_s": round(wall / checks, 3),
    "requests": total(m, "goodput_shadow_requests_total", outcome="ok") / checks,
    "prompt_tokens": total(m, "goodput_shadow_tokens_total", type="input") / checks,
}))
