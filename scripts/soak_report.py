"""Verdict and plot for scripts/soak.sh: growth trends after warm-up, and request counts."""
import csv, json, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

WARMUP_S = 120
# Allowed growth over the measured span (after warm-up): anything above is a trend.
LIMITS = {"rss_bytes": 16 * 2**20, "open_fds": 8, "tasks": 16}

out = Path(sys.argv[1])
rows = [{k: float(v or 0) for k, v in r.items()} for r in csv.DictReader(open(out / "samples.csv"))]


def slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


def metric_sum(path, name, prefix_only=False):
    total = 0.0
    for line in open(path):
        if line.startswith("#"):
            continue
        key = line.split("{")[0].split(" ")[0]
        if key == name:
            total += float(line.rsplit(" ", 1)[1])
    return total


steady = [r for r in rows if r["t_s"] >= WARMUP_S] or rows
span = steady[-1]["t_s"] - steady[0]["t_s"]
trend = {}
ok = True
for k, limit in LIMITS.items():
    g = slope([r["t_s"] for r in steady], [r[k] for r in steady]) * span
    trend[k] = {"growth_over_span": g, "limit": limit, "first": steady[0][k], "last": steady[-1][k],
                "max": max(r[k] for r in steady), "ok": g <= limit}
    ok &= g <= limit

client = {"completed": 0, "failed": 0}
for f in out.glob("client-*.json"):
    j = json.load(open(f))
    client["completed"] += j["completed"]
    client["failed"] += j["failed"]
sent = client["completed"] + client["failed"]
gp_requests = metric_sum(out / "goodput-metrics.txt", "goodput_requests_total")
shadow = metric_sum(out / "goodput-metrics.txt", "goodput_shadow_requests_total")
upstream = sum(metric_sum(out / f"sim{i}-metrics.txt", "sim_requests_total") for i in (1, 2))
counts = {"client_sent": sent, "client_failed": client["failed"], "goodput_metered": gp_requests,
          "upstream_total": upstream, "goodput_shadow": shadow, "upstream_user": upstream - shadow}
lost = not (sent == gp_requests == upstream - shadow) or client["failed"] > 0
ok &= not lost
summary = {"duration_s": rows[-1]["t_s"], "samples": len(rows), "warmup_s": WARMUP_S, "trend": trend,
           "counts": counts, "scoring_queue_max": max(r["scoring_queue"] for r in rows),
           "connections_max": max(r["connections"] for r in rows), "pass": ok}
json.dump(summary, open(out / "summary.json", "w"), indent=2)

fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
t = [r["t_s"] / 60 for r in rows]
for ax, (k, label, scale) in zip(axes, [("rss_bytes", "RSS (MiB)", 2**20), ("open_fds", "open fds", 1),
                                        ("tasks", "tokio tasks", 1), ("scoring_queue", "scoring queue", 1)]):
    ax.plot(t, [r[k] / scale for r in rows], lw=1.2)
    ax.axvline(WARMUP_S / 60, color="grey", ls=":", lw=1)
    ax.set_ylabel(label)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
axes[-1].set_xlabel("minutes")
fig.suptitle(f"goodput soak, {rows[-1]['t_s'] / 60:.0f} min: {'PASS' if ok else 'FAIL'}\n"
             f"requests: client {sent:.0f} = goodput {gp_requests:.0f} = upstream {upstream - shadow:.0f} "
             f"(+ {shadow:.0f} shadow)", fontsize=11)
fig.tight_layout()
fig.savefig(out / "soak.png", dpi=90)
print(json.dumps(summary, indent=2))
sys.exit(0 if ok else 1)
