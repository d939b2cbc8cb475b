"""What the evaluation scripts share: goodput's HTTP API, its metrics summed per name, and AUROC
with a bootstrap interval."""

import random
import re
import urllib.request


def http(url, body=None, timeout=600):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def metrics(admin):
    """goodput's metrics at ADMIN, each name summed over its label sets."""
    out = {}
    for line in http(f"http://{admin}/metrics").decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def auroc(pos, neg):
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def auroc_ci(pos, neg, boots=1000):
    """[AUROC, lower, upper]: the point and a 95% bootstrap interval; None without both sides."""
    point = auroc(pos, neg)
    if point is None:
        return None
    rnd = random.Random(7)
    bs = sorted(auroc([rnd.choice(pos) for _ in pos], [rnd.choice(neg) for _ in neg]) for _ in range(boots))
    return [round(point, 3), round(bs[int(0.025 * boots)], 3), round(bs[int(0.975 * boots)], 3)]
