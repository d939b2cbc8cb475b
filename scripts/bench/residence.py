#!/usr/bin/env python3
"""Time inside a proxy per request, from `perf script` output of its syscall tracepoints: from
the first read that brought the client's request in to the write of it upstream ("request"),
and from the first read that brought the upstream's answer in to its first write to the client
("answer"). The trace starts with the proxy idle: the first socket that brings data is the
client's, the first other one written after it the upstream's. Prints a JSON line with the
median, p90 and p99 in µs.

Usage: perf script -F tid,time,event,trace | residence.py
"""
import json, re, statistics, sys

client = upstream = None
READS = {"read", "recvfrom", "readv", "recvmsg"}
WRITES = {"write", "sendto", "writev", "sendmsg"}
pending = {}  # tid -> (syscall, fd) entered and not yet returned
read_at = {}  # fd -> when its first read with data since the last write the other way returned
req, ans = [], []
for line in sys.stdin:
    m = re.search(r"(\d+)\s+(\d+\.\d+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)", line)
    if not m:
        continue
    tid, t, kind, name, args = int(m.group(1)), float(m.group(2)), m.group(3), m.group(4), m.group(5)
    if kind == "enter":
        fd = re.search(r"fd: (0x[0-9a-f]+|\d+)", args)
        if fd:
            pending[tid] = (name, int(fd.group(1), 0))
            f = pending[tid][1]
            if name in WRITES and client is not None and upstream is None and f != client:
                upstream = f
            if name in WRITES:
                # The first write to the other side after data came in: what that read caused.
                src = upstream if f == client else client if f == upstream else None
                if src is not None and src in read_at:
                    (ans if f == client else req).append((t - read_at.pop(src)) * 1e6)
        continue
    call = pending.pop(tid, None)
    ret = re.search(r"0x([0-9a-f]+)", args)
    if call and call[0] in READS and ret and 0 < int(ret.group(1), 16) < 1 << 62:
        if client is None:
            client = call[1]
        # The first read since the last write the other way: later ones belong to the same step.
        read_at.setdefault(call[1], t)

def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else None

print(json.dumps({"client_fd": client, "upstream_fd": upstream, **{k: {"n": len(v), "p50": statistics.median(v) if v else None, "p90": q(v, 0.9), "p99": q(v, 0.99)}
                  for k, v in (("request", req), ("answer", ans))}}))
