"""Routing within a pool of two vLLM replicas, side by side: the same open-loop workload through
goodput with `policy: round_robin` (what a Kubernetes Service gives, near enough),
`least_outstanding` and goodput's picker, alternated, `reps` times each.

Workloads:
- skew: a client goodput does not see keeps replica A busy (`--skew` long generations at once);
  short chats arrive through goodput (Poisson, `--rate` per second).
- prefix: chats that share one of six long system prompts (~900 tokens each; fresh prompts per
  run), Poisson at `--rate`.
- mix: both at once.

Per run: TTFT p50 and p95 (first content token, measured here), SLO attainment (TTFT within
`--slo-ms`), and vLLM's own prefix-cache hit ratio over the pool (hits / queries of its
counters over the run). Prints one JSON line per run and a table of medians over reps, with each
policy's figures as a ratio to round robin's.

    python scripts/bench/pool.py --gp rr=URL --gp lo=URL --gp picker=URL --replica URL --replica URL
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx


def prom(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def vllm_counters(client, replicas):
    q = h = 0.0
    for r in replicas:
        t = (await client.get(r + "/metrics")).text
        q += prom(t, "vllm:prefix_cache_queries_total")
        h += prom(t, "vllm:prefix_cache_hits_total")
    return q, h


FAILURES = {}


async def chat(client, url, messages, max_tokens):
    """TTFT in seconds (first content token), or None on failure; why is counted in FAILURES
    (an HTTP status, a transport error or timeout, or a stream that ended without content)."""
    body = {"model": "smollm2", "stream": True, "max_tokens": max_tokens, "messages": messages}
    t0 = time.perf_counter()
    ttft = None
    why = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            if r.status_code != 200:
                why = f"status {r.status_code}"
            else:
                async for line in r.aiter_lines():
                    if ttft is None and line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                        ttft = time.perf_counter() - t0
                if ttft is None:
                    why = "no content"
    except httpx.HTTPError as e:
        why = type(e).__name__
    if why:
        FAILURES[why] = FAILURES.get(why, 0) + 1
    return ttft


def systems(tag):
    return [
        "".join(
            f"Rule {j} of desk {tag}-{k}: answer in one short sentence and cite handbook section {k}.{j}. "
            for j in range(40)
        )
        for k in range(6)
    ]


async def skew_load(client, replica, n, stop):
    """n long generations at once straight to the replica, renewed until stop."""

    async def one(i):
        while not stop.is_set():
            try:
                await client.post(
                    replica + "/v1/completions",
                    json={"model": "smollm2", "prompt": f"Tell me a long story, number {i}.", "max_tokens": 200, "ignore_eos": True},
                    timeout=300,
                )
            except httpx.HTTPError:
                await asyncio.sleep(0.1)

    await asyncio.gather(*(one(i) for i in range(n)))


def within(ttfts, slo):
    """The share of requests whose TTFT met the SLO (same unit); a failed one (None) missed it."""
    return sum(1 for t in ttfts if t is not None and t <= slo) / max(1, len(ttfts))


async def run(client, gp, workload, args, replicas, tag):
    rng = random.Random(hash((workload, tag)) & 0xFFFF)
    stop = asyncio.Event()
    background = None
    if workload in ("skew", "mix"):
        background = asyncio.create_task(skew_load(client, replicas[0], args.skew, stop))
        await asyncio.sleep(2.0)
    q0, h0 = await vllm_counters(client, replicas)
    prompts = systems(tag)
    tasks = []
    FAILURES.clear()
    t_end = time.perf_counter() + args.duration
    i = 0
    while time.perf_counter() < t_end:
        i += 1
        if workload == "skew" or (workload == "mix" and i % 2 == 0):
            msgs = [{"role": "user", "content": f"Say hello to visitor {tag}-{i}."}]
        else:
            k = rng.randrange(len(prompts))
            msgs = [{"role": "system", "content": prompts[k]}, {"role": "user", "content": f"Question {i}: which section?"}]
        tasks.append(asyncio.create_task(chat(client, gp, msgs, args.max_tokens)))
        await asyncio.sleep(rng.expovariate(args.rate))
    ttfts = await asyncio.gather(*tasks)
    q1, h1 = await vllm_counters(client, replicas)
    stop.set()
    if background:
        background.cancel()
        try:
            await background
        except asyncio.CancelledError:
            pass
    ok = sorted(t for t in ttfts if t is not None)
    pct = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")
    return {
        "requests": len(ttfts),
        "failed": len(ttfts) - len(ok),
        "why_failed": dict(FAILURES),
        "ttft_p50_ms": pct(0.5) * 1000,
        "ttft_p95_ms": pct(0.95) * 1000,
        "slo_attainment": within(ttfts, args.slo_ms / 1000.0),
        "prefix_hit_ratio": (h1 - h0) / (q1 - q0) if q1 > q0 else None,
        # Every request's TTFT (None: failed), so attainment can be read at any SLO afterwards.
        "ttfts_ms": [None if t is None else round(t * 1000) for t in ttfts],
    }


async def idle(client, replicas):
    while True:
        busy = 0.0
        for r in replicas:
            t = (await client.get(r + "/metrics")).text
            busy += prom(t, "vllm:num_requests_running") + prom(t, "vllm:num_requests_waiting")
        if busy == 0:
            return
        await asyncio.sleep(0.5)


async def warm_up(client, replicas, max_tokens):
    """A replica's first long prefills after start-up run slower than later ones: send each a
    few, with prompts no measured run shares, so the first policy in the order does not pay."""
    for r in replicas:
        for k, system in enumerate(systems("warmup")[:3]):
            await chat(client, r, [{"role": "system", "content": system}, {"role": "user", "content": f"Warm-up {k}."}], max_tokens)
    FAILURES.clear()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gp", action="append", required=True, help="NAME=URL of a goodput")
    ap.add_argument("--replica", action="append", required=True)
    ap.add_argument("--workloads", default="skew,prefix,mix")
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skew", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--slo-ms", type=float, default=1000)
    ap.add_argument("--warmup", type=int, default=1, help="0: skip the warm-up requests")
    ap.add_argument("--slo-grid", default="500,1000,2000,4000", help="more SLOs (ms) to read attainment at")
    args = ap.parse_args()
    gps = [g.split("=", 1) for g in args.gp]
    results = {}
    # A busy vLLM answers /metrics slowly: generous timeouts for everything but the requests
    # measured (which set their own).
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200), timeout=60) as client:
        if args.warmup:
            await warm_up(client, args.replica, args.max_tokens)
        for w in args.workloads.split(","):
            for rep in range(args.reps):
                order = gps if rep % 2 == 0 else list(reversed(gps))
                for name, url in order:
                    await idle(client, args.replica)
                    r = await run(client, url, w, args, args.replica, f"{w}{rep}{name}")
                    r.update(workload=w, policy=name, rep=rep, rate=args.rate)
                    print(json.dumps(r), flush=True)
                    results.setdefault((w, name), []).append(r)
    med = lambda rs, k: statistics.median([r[k] for r in rs if r[k] is not None]) if any(r[k] is not None for r in rs) else float("nan")
    base = gps[0][0]
    print(f"\n| workload | policy | TTFT p50 ms | TTFT p95 ms | SLO attainment (TTFT <= {args.slo_ms:.0f} ms) | vLLM prefix hit ratio | p50 / p95 / attainment vs {base} |")
    print("|---|---|---|---|---|---|---|")
    for w in args.workloads.split(","):
        b = results[(w, base)]
        for name, _ in gps:
            rs = results[(w, name)]
            # Round robin at 0 (every request missed): the ratio is undefined, not a crash.
            ratio = lambda k: f"{med(rs, k) / med(b, k):.2f}" if med(b, k) else "n/a"
            ratios = " / ".join(ratio(k) for k in ("ttft_p50_ms", "ttft_p95_ms", "slo_attainment"))
            print(
                f"| {w} | {name} | {med(rs, 'ttft_p50_ms'):.0f} | {med(rs, 'ttft_p95_ms'):.0f} | "
                f"{med(rs, 'slo_attainment'):.2f} | {med(rs, 'prefix_hit_ratio'):.2f} | {ratios} |"
            )
    # Where round robin crosses 90% depends on the SLO as much as on the load: attainment over
    # all repetitions' requests at each SLO of the grid, from the same runs.
    grid = [float(x) for x in args.slo_grid.split(",") if x]
    print("\n| workload | policy | " + " | ".join(f"TTFT <= {g / 1000:g} s" for g in grid) + " | requests |")
    print("|---|---|" + "---|" * (len(grid) + 1))
    for w in args.workloads.split(","):
        for name, _ in gps:
            all_ttfts = [t for r in results[(w, name)] for t in r["ttfts_ms"]]
            cells = " | ".join(f"{within(all_ttfts, g):.2f}" for g in grid)
            print(f"| {w} | {name} | {cells} | {len(all_ttfts)} |")


if __name__ == "__main__":
    asyncio.run(main())
