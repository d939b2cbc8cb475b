#!/usr/bin/env python3
"""Send N chat requests one after another over one keep-alive connection, PACE_MS apart, and
read each answer to its end (scripts/bench-residence.sh). Paced, so that every request meets
an idle proxy, as at a low rate. Each request goes out in one write, head and body together,
as HTTP clients with a small body send it (Python's http.client sends them apart, which would
time the client's second packet, not the proxy).

Usage: paced.py HOST:PORT N stream|plain PACE_MS
"""
import json, socket, sys, time

host, port = sys.argv[1].rsplit(":", 1)
n, stream, pace = int(sys.argv[2]), sys.argv[3] == "stream", float(sys.argv[4]) / 1000
body = json.dumps({"model": "sim-model", "stream": stream,
                   "messages": [{"role": "user", "content": "Say something."}]}).encode()
request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
           f"content-length: {len(body)}\r\n\r\n").encode() + body
s = socket.create_connection((host, int(port)))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""

def answer():
    """Read one response to its end: content-length or chunked framing."""
    global buf
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].split()[1] == "200":
        sys.exit(f"answer: {lines[0]}")
    h = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    if "content-length" in h:
        want = int(h["content-length"])
        while len(buf) < want:
            buf += s.recv(65536)
        buf = buf[want:]
        return
    while True:  # chunked: size line, data, CRLF; a zero size ends it
        while b"\r\n" not in buf:
            buf += s.recv(65536)
        size_line, rest = buf.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            rest += s.recv(65536)
        buf = rest[size + 2:]
        if size == 0:
            return

for _ in range(n):
    s.sendall(request)
    answer()
    time.sleep(pace)
print(json.dumps({"requests": n}))
