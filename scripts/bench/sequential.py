#!/usr/bin/env python3
"""Send N chat requests one after another over one keep-alive connection and read each answer
to its end (scripts/bench-instructions.sh drives a proxy with it under callgrind, where only
the count of requests and events matters, not the time).

Usage: sequential.py HOST:PORT N stream|plain
"""
import http.client, json, sys

host, port = sys.argv[1].rsplit(":", 1)
n, stream = int(sys.argv[2]), sys.argv[3] == "stream"
body = json.dumps({"model": "sim-model", "stream": stream,
                   "messages": [{"role": "user", "content": "Say something."}]})
conn = http.client.HTTPConnection(host, int(port), timeout=120)
events = 0
for _ in range(n):
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {data[:200]!r}")
    events += data.count(b"data: ")
print(json.dumps({"requests": n, "events": events}))
