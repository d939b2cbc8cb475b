#!/usr/bin/env python3
"""What a proxy keeps per idle keep-alive connection after a large non-streaming answer.

    python3 scripts/bench/kept_connections.py PORT PID N

Opens N connections to the proxy at 127.0.0.1:PORT, sends one chat completion on each
(max_tokens 100000: the simulator answers in one large JSON body), reads the answer whole and
keeps the connection open; then reports the proxy's (PID) VmRSS before and after. A proxy that
retains a buffer sized by the largest answer shows it here as N times that size.
"""
import http.client
import json
import sys
import time

port, pid, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def rss_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


body = json.dumps({"model": "sim-model", "max_tokens": 100000, "messages": [{"role": "user", "content": "hi"}]})
before = rss_kb()
conns, total = [], 0
for _ in range(n):
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    total += len(c.getresponse().read())
    conns.append(c)
time.sleep(1)
print(json.dumps({"connections": n, "answer_bytes": total // n, "rss_before_kb": before, "rss_after_kb": rss_kb()}))
