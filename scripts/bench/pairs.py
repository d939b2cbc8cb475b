#!/usr/bin/env python3
"""Each peer's p99 against goodput's over every paired run of one or more bench-peers.sh runs.

    python3 scripts/bench/pairs.py target/bench/peers-fixed.jsonl [more runs' copies ...]

A pair is one repetition of one (mode, rate) row: the two paths ran back to back on the same
machine. Per peer: how many pairs had goodput's p99 lower (with the two-sided sign test's p),
the median of (peer's p99 - goodput's) with its quartiles, and a distribution-free 95%
confidence interval for that median (order statistics of the sign test). A lower bound above
-X µs says goodput's p99 is no more than X µs worse than the peer's in the median pair.
"""
import json
import statistics
import sys
from math import comb


def sign_p(k, n):
    """Two-sided sign test: how often a fair coin splits n pairs at least as unevenly as k."""
    tail = sum(comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


def summarize(files):
    rows = []
    for i, f in enumerate(files):
        for line in open(f):
            r = json.loads(line)
            r["pair"] = (i, r["stream"], r["rate"], r["rep"])
            rows.append(r)
    p99 = {(r["pair"], r["path"]): r["k6"]["p99_ms"] for r in rows}
    peers = [p for p in dict.fromkeys(r["path"] for r in rows) if p not in ("direct", "goodput")]
    for peer in peers:
        d = sorted((p99[(pair, peer)] - p99[(pair, "goodput")]) * 1000
                   for (pair, path) in p99 if path == "goodput" and (pair, peer) in p99)
        n = len(d)
        if n == 0:
            continue
        # The largest k with P(Binomial(n, 1/2) < k) <= 2.5%: [d_k, d_(n-k+1)] covers the median
        # with at least 95% probability.
        k, below = 0, 0.0
        while below + comb(n, k) / 2**n <= 0.025:
            below += comb(n, k) / 2**n
            k += 1
        lower = sum(x > 0 for x in d)
        ci = f"[{d[k - 1]:+.0f}, {d[n - k]:+.0f}] µs" if k >= 1 else "n/a (too few pairs)"
        print(f"- {peer}: goodput's p99 lower in {lower} of {n} pairs (sign test p = {sign_p(lower, n):.2g}); "
              f"median {peer}'s p99 − goodput's {statistics.median(d):+.0f} µs "
              f"(quartiles {d[n // 4]:+.0f} / {d[(3 * n) // 4]:+.0f} µs), 95% CI of that median {ci}")


if __name__ == "__main__":
    summarize(sys.argv[1:])
