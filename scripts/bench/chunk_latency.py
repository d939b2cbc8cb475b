#!/usr/bin/env python3
"""Per-chunk forwarding latency, measured one way on the wire.

This script is both the upstream and the client. Its upstream thread serves an SSE chat stream
and notes when it writes each chunk; its client reads the stream, directly or through the proxy,
and notes when each chunk arrives. Latency of a chunk = arrival - write, both on this process's
clock, so no timer drift enters. Requests alternate direct/proxy (same machine noise); the
added latency is proxy minus direct at each percentile.

Usage: chunk_latency.py PROXY_PORT_FILE_OR_PORT [REQUESTS] [CHUNKS]
  Starts the upstream on an ephemeral port and prints it on stderr as "upstream=PORT"; the
  caller starts the proxy in front of it and passes the proxy's port via the file (or waits).
"""
import json, os, socket, sys, threading, time

n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
chunks = int(sys.argv[3]) if len(sys.argv) > 3 else 32
gap = 0.002
sent = {}  # (request id, k) -> perf_counter at write
lock = threading.Lock()

srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(64)
up_port = srv.getsockname()[1]


def serve_conn(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            rest += c.recv(65536)
        body, buf = rest[:length], rest[length:]
        if not head.startswith(b"POST"):
            c.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            continue
        rid = json.loads(body)["user"]
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for k in range(chunks):
            ev = ('data: {"choices":[{"index":0,"delta":{"content":"c%d"}}]}\n\n' % k).encode()
            time.sleep(gap)
            frame = b"%x\r\n%s\r\n" % (len(ev), ev)
            with lock:
                sent[(rid, k)] = time.perf_counter()
            c.sendall(frame)
        ev = b"data: [DONE]\n\n"
        c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))


def accept_loop():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve_conn, args=(c,), daemon=True).start()


threading.Thread(target=accept_loop, daemon=True).start()
print(f"upstream={up_port}", file=sys.stderr, flush=True)

arg = sys.argv[1]
while not arg.isdigit():
    if os.path.exists(arg) and open(arg).read().strip():
        arg = open(arg).read().strip()
    else:
        time.sleep(0.05)
proxy_port = int(arg)


def one(port, rid):
    body = json.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                       "user": rid, "messages": [{"role": "user", "content": "x"}]}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: %d\r\n\r\n" % len(body)) + body
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(req)
    buf, got, lat = b"", 0, []
    while got < chunks:
        d = s.recv(65536)
        t = time.perf_counter()
        if not d:
            break
        buf += d
        while got < chunks and (b'"content":"c%d"' % got) in buf:
            with lock:
                lat.append(t - sent[(rid, got)])
            got += 1
    s.close()
    return lat


res = {"direct": [], "proxy": []}
for i in range(n):
    res["direct"] += one(up_port, f"d{i}")
    res["proxy"] += one(proxy_port, f"p{i}")


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1e6


out = {"requests_each": n, "chunks_per_request": chunks}
for p in (0.5, 0.9, 0.99):
    d, x = q(res["direct"], p), q(res["proxy"], p)
    out[f"p{int(p * 100)}"] = {"direct_us": round(d, 1), "proxy_us": round(x, 1), "added_us": round(x - d, 1)}
print(json.dumps(out))
