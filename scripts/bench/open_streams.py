#!/usr/bin/env python3
"""Hold N concurrent streaming requests open through the proxy and report its memory.

Usage: open_streams.py PROXY_HOST:PORT PID N
Each connection sends one streaming chat request and reads it slowly to the end. Once all N
streams have delivered their first bytes, the proxy's VmRSS/VmHWM are sampled from /proc.
"""
import asyncio, json, sys, time

host, port = sys.argv[1].rsplit(":", 1)
pid, n = int(sys.argv[2]), int(sys.argv[3])
body = json.dumps({"model": "sim-model", "stream": True,
                   "messages": [{"role": "user", "content": "hold this stream open"}]}).encode()
req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
       b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
started = 0
done = 0
failed = 0


def mem():
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, v = line.split(":", 1)
        if k in ("VmRSS", "VmHWM", "Threads"):
            out[k] = v.strip()
    return out


async def one(all_open):
    global started, done, failed
    try:
        r, w = await asyncio.open_connection(host, int(port))
        w.write(req)
        await w.drain()
        first = await r.read(64)
        if not first.startswith(b"HTTP/1.1 200"):
            failed += 1
            return
        started += 1
        if started == n:
            all_open.set()
        while True:
            chunk = await r.read(256)
            if not chunk or b"data: [DONE]" in chunk:
                break
            await asyncio.sleep(0.01)
        done += 1
        w.close()
    except Exception:
        failed += 1


async def main():
    all_open = asyncio.Event()
    base = mem()
    tasks = [asyncio.create_task(one(all_open)) for _ in range(n)]
    try:
        await asyncio.wait_for(all_open.wait(), timeout=60)
    except asyncio.TimeoutError:
        pass
    await asyncio.sleep(2)
    peak = mem()
    await asyncio.gather(*tasks)
    print(json.dumps({"streams": n, "open_at_once": started, "completed": done, "failed": failed,
                      "before": base, "with_streams_open": peak, "after": mem()}))


asyncio.run(main())
