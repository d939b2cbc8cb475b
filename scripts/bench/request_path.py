#!/usr/bin/env python3
"""Per-request latencies inside a proxy, from a `perf script` dump of its syscall tracepoints
(scripts/bench-request-path.sh records it; no ptrace, so the proxy runs at its own speed).

For each request: the request path, from the end of the read that brought the client's request
to the write that sends it upstream; the response head, from the upstream read that brought it to
the write to the client; and each later chunk the same way. With cpu-clock samples in the dump,
the samples taken inside request paths are grouped by where the code comes from, as microseconds
per request.

Chunks of many streams arrive together (an LLM server decodes its whole batch in one step, and the
simulator's timers fire on the same millisecond), so a chunk also waits for the others of its
burst: "chunk from burst" is the time from the first upstream read of a burst (syscalls less than
BURST_GAP_US apart) to each write to a client in it. The first token of a stream waits the same.

Client sockets are the ones accept4 returned, upstream sockets the ones passed to connect, so the
trace must start before the proxy's connections open. The first SKIP requests (the warm-up) are
left out.

Usage: request_path.py NAME DUMP [SKIP=20] [SAMPLE_US=100] [--json FILE]
"""
import bisect
import collections
import json
import re
import statistics
import sys

EVENT = re.compile(r"\s*(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")
SYSCALL = re.compile(r"syscalls:sys_(enter|exit)_(\w+)")
STALE_US = 10_000
BURST_GAP_US = 300
READS, WRITES = ("recvfrom", "read", "readv"), ("writev", "sendto", "write", "sendmsg")

# Where a sampled function comes from, first match wins.
ORIGINS = [
    ("goodput: route", r"goodput::route"),
    ("goodput: request skim", r"goodput::openai"),
    ("goodput: config", r"goodput::config"),
    ("goodput: record", r"goodput::meter"),
    ("goodput: proxy phases", r"goodput::"),
    ("hyper_util (pool, client)", r"hyper_util"),
    ("hyper", r"hyper::"),
    ("serde_json", r"serde"),
    ("arc_swap", r"arc_swap"),
    ("http, httparse", r"\bhttp::|httparse"),
    ("tokio", r"tokio::"),
    ("malloc, memcpy", r"malloc|free|memmove|memcpy|_int_|realloc|alloc::"),
    ("nginx", r"^ngx_"),
    ("kernel", r"^[a-z_0-9.]+$"),
]


def origin(sym):
    for name, pat in ORIGINS:
        if re.search(pat, sym):
            return name
    return "other (core, std, bytes, ...)"


def quantiles(xs):
    xs = sorted(xs)
    return {"n": len(xs), "p50": statistics.median(xs), "p90": xs[int(0.9 * len(xs))]} if xs else None


def main():
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        i = args.index("--json")
        out = args[i + 1]
        del args[i : i + 2]
    name, dump = args[0], args[1]
    skip = int(args[2]) if len(args) > 2 else 20
    period = float(args[3]) if len(args) > 3 else 100.0

    clients, upstreams = set(), set()
    last_fd = {}  # tid -> fd of its syscall in progress
    # Client fd -> when the last read of its request ended, for requests not yet sent upstream
    # (a request can come in more than one read), oldest first.
    requests = collections.OrderedDict()
    client_of = {}  # upstream fd -> the client fd whose request it carries
    upstream_of = {}  # client fd -> upstream fd
    read_at = {}  # upstream fd -> (when its first unrelayed read ended, whether it was the head)
    reads = {}  # upstream fd -> data reads since the request was written
    windows, head, chunk, from_burst = [], [], [], []
    burst_at, previous = None, None  # when the burst's first upstream read ended; last syscall
    samples = []
    for line in open(dump):
        m = EVENT.match(line)
        if not m:
            continue
        tid, t, event, rest = m.group(1), float(m.group(2)) * 1e6, m.group(3), m.group(4)
        s = SYSCALL.match(event)
        if not s:
            if event.startswith("cpu-clock"):
                parts = rest.split(None, 1)  # the address, then the function
                samples.append((t, parts[1].strip() if len(parts) > 1 else "?"))
            continue
        kind, call = s.groups()
        if previous is not None and t - previous > BURST_GAP_US:
            burst_at = None
        previous = t
        if kind == "enter":
            f = re.search(r"fd: 0x([0-9a-f]+)", rest)
            fd = int(f.group(1), 16) if f else None
            last_fd[tid] = fd
            if call == "connect":
                upstreams.add(fd)
            elif call in WRITES and fd in upstreams and requests:
                # Only requests are written upstream; they leave in the order they came. A read
                # that sent nothing upstream (a refused request, the rest of one) is left behind.
                while len(requests) > 1 and t - next(iter(requests.values())) > STALE_US:
                    requests.popitem(last=False)
                c, at = requests.popitem(last=False)
                windows.append((at, t))
                client_of[fd], upstream_of[c], reads[fd] = c, fd, 0
                read_at.pop(fd, None)
            elif call in WRITES and fd in clients:
                if burst_at is not None:
                    from_burst.append(t - burst_at)
                if upstream_of.get(fd) in read_at:
                    at, is_head = read_at.pop(upstream_of[fd])
                    (head if is_head else chunk).append(t - at)
            continue
        ret = int(rest.split()[0], 16)
        if ret >= 1 << 63:
            ret -= 1 << 64
        if call == "accept4" and ret > 0:
            clients.add(ret)
        elif call in READS and ret > 0:
            fd = last_fd.get(tid)
            if fd in clients:
                requests[fd] = t
            elif fd in upstreams:
                if burst_at is None:
                    burst_at = t
                nth = reads.get(fd, 1)
                reads[fd] = nth + 1
                # Reads that arrive before the last was relayed go out in the same write.
                read_at.setdefault(fd, (t, nth == 0))

    windows = windows[skip:]
    result = {
        "name": name,
        "request_path_us": quantiles([b - a for a, b in windows]),
        "response_head_us": quantiles(head[skip:]),
        "chunk_us": quantiles(chunk),
        "chunk_from_burst_us": quantiles(from_burst),
    }
    if samples:
        samples.sort()
        times = [t for t, _ in samples]
        by = collections.Counter()
        for a, b in windows:
            i = bisect.bisect_left(times, a)
            while i < len(times) and times[i] <= b:
                by[origin(samples[i][1])] += 1
                i += 1
        n = max(1, len(windows))
        result["sample_period_us"] = period
        result["request_path_by_origin_us"] = {k: v * period / n for k, v in by.most_common()}
        result["request_path_mean_us"] = statistics.mean(b - a for a, b in windows) if windows else None

    for k in ("request_path_us", "response_head_us", "chunk_us", "chunk_from_burst_us"):
        q = result[k]
        if q:
            print(f"{name}: {k[:-3].replace('_', ' ')}: n={q['n']} p50 {q['p50']:.0f} µs, p90 {q['p90']:.0f} µs")
    if result.get("request_path_mean_us"):
        print(f"{name}: request path: mean {result['request_path_mean_us']:.0f} µs, of which sampled:")
    for k, v in result.get("request_path_by_origin_us", {}).items():
        print(f"{name}:   request path in {k}: {v:.1f} µs")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
