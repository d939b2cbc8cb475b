#!/usr/bin/env python3
"""Calls to the socket write functions (writev, send, sendto, sendmsg) in a callgrind
profile: the wake-ups that wrote something out. scripts/bench-instructions.sh divides by them,
because two SSE events that arrive together are read and written in one wake-up, and how often
that happens depends on timing.

Usage: cg_writes.py CALLGRIND_OUT_FILE
"""
import re, sys

WRITES = {"writev", "send", "sendto", "sendmsg"}
names, callee, n = {}, None, 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3).strip()
        if m.group(1) == "cfn":
            callee = names.get(m.group(2))
        continue
    m = re.match(r"^calls=(\d+)", line)
    if m and callee in WRITES:
        n += int(m.group(1))
print(n)
