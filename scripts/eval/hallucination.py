"""Labelled evaluation of goodput's consistency methods (scripts/eval-hallucination.sh runs it).

Factual questions with answers checkable by string match (scripts/eval/facts.tsv) go through
goodput to a real LLM server, every response consistency-checked. Each answer is labelled wrong
when it names none of the accepted answers. Phases, one request at a time:

  calibrate  half the questions (every other one), healthy sampling (HEALTHY_TEMPERATURE,
             default 0.7): goodput calibrates its ranking method's threshold on these checks,
             stating REFERENCE_RATE as their error rate;
  validate   the other half, healthy: goodput's reported rate against the observed error rate
             of these responses (other questions, so that a server that repeats its answers
             cannot make the check pass by construction);
  greedy     (when the healthy temperature is not 0) the validate half again at temperature 0,
             as factual questions are usually served: fewer wrong answers under the same
             calibration, so a rate that tracks errors falls with them;
  gibberish  every question at temperature 1.8: the rate must be clearly higher.

`hallucination.py label URL FACTS REPS` asks the calibrate half straight from the server at the
healthy temperature and prints its observed error rate and the number of answers labelled: the
labelled sample of the reference that an operator states as `reference_rate` and
`reference_labelled` (scripts/eval-hallucination.sh does this when no REFERENCE_RATE is given).

With PERPLEXITY=1 (goodput then scores every response's perplexity too) the record's perplexity
and bits per byte are analysed beside the methods, as ranking signals: goodput derives no rate
from them.

Per method: AUROC of the score for "wrong" (bootstrap 95% interval), and a reliability table
(the verdict, or score bins for a probability method, against the observed error rate).
Per phase and kind of question: the observed error rate beside goodput's verdicts.
Answers are held in memory only; the output has numbers.
"""

import json
import math
import os
import re
import sys
import time

import evallib
from evallib import http

MODEL = "smollm2"
HEALTHY_T = float(os.environ.get("HEALTHY_TEMPERATURE", "0.7"))
PPL = os.environ.get("PERPLEXITY", "0") == "1"
if sys.argv[1] == "label":
    gp, facts_path, reps = sys.argv[2].removeprefix("http://"), sys.argv[3], int(sys.argv[4])
else:
    gp, admin, facts_path, reps, out_path = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]


def metrics():
    return evallib.metrics(admin)


facts = []
for line in open(facts_path, encoding="utf-8"):
    if line.startswith("#") or not line.strip():
        continue
    kind, question, answers = line.rstrip("\n").split("\t")
    facts.append((kind, question, answers.split("|")))


def correct(kind, answer, accepted):
    for a in accepted:
        flags = 0 if kind == "symbol" else re.IGNORECASE
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(a) + r"(?![A-Za-z0-9])", answer, flags):
            return True
    return False


def ask(question, temperature):
    body = {
        "model": MODEL,
        "temperature": temperature,
        "max_tokens": 40,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": question},
        ],
    }
    r = json.loads(http(f"http://{gp}/v1/chat/completions", json.dumps(body).encode()))
    return r["choices"][0]["message"]["content"]


if sys.argv[1] == "label":
    wrong = [not correct(k, ask(q, HEALTHY_T), acc) for _ in range(reps) for k, q, acc in facts[0::2]]
    print(f"calibrate half at temperature {HEALTHY_T}: {sum(wrong)} of {len(wrong)} wrong", file=sys.stderr)
    print(round(sum(wrong) / len(wrong), 3), len(wrong))
    sys.exit(0)


def checked_total():
    m = metrics()
    return m.get("goodput_consistency_checked_total", 0) + m.get("goodput_consistency_failed_total", 0) + m.get(
        "goodput_shadow_checks_skipped_total", 0
    )


def ppl_total():
    """Responses the perplexity scorer has finished with (0 when it is not configured)."""
    m = metrics()
    return sum(m.get(k, 0) for k in ("goodput_scored_responses_total", "goodput_scoring_dropped_total", "goodput_scoring_failed_total"))


def scores(rec):
    """The record's consistency scores, and with PERPLEXITY its perplexity and bits per byte
    (ranking signals read here only; goodput calibrates no rate from them)."""
    out = dict(rec.get("consistency_scores") or {})
    for k in ("perplexity", "bits_per_byte"):
        if PPL and rec.get(k) is not None:
            out[k] = rec[k]
    return out


def run_phase(name, temperature, n_before, questions):
    ppl_before = ppl_total() if PPL else 0
    labels, kinds = [], []
    for _ in range(reps):
        for kind, q, accepted in questions:
            labels.append(0 if correct(kind, ask(q, temperature), accepted) else 1)
            kinds.append(kind)
    # Every check finished (or failed, or was skipped) before the counters are read.
    deadline = time.time() + 1800
    while checked_total() < n_before + len(labels) or (PPL and ppl_total() < ppl_before + len(labels)):
        if time.time() > deadline:
            sys.exit(f"{name}: checks did not finish")
        time.sleep(1)
    time.sleep(0.5)
    recs = json.loads(http(f"http://{admin}/admin/records?limit={len(labels)}"))
    recs.sort(key=lambda r: r["id"])
    rows = [(lab, scores(r), r.get("hallucinated")) for lab, r in zip(labels, recs)]
    m = metrics()
    return rows, kinds, m, n_before + len(labels)


def wilson(k, n, z=1.96):
    if n == 0:
        return None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(p, 3), round(c - h, 3), round(c + h, 3)]


def auroc_ci(rows, method):
    pts = [(lab, s[method]) for lab, s, _ in rows if method in s]
    return evallib.auroc_ci([v for lab, v in pts if lab], [v for lab, v in pts if not lab])


def by_kind(rows, kinds):
    """Per kind of question: the observed error rate, and the share goodput's verdicts (each
    record's `hallucinated`, what its counters add up) called hallucinated. The threshold is
    fixed once calibrated, so this is the rate goodput reports for traffic of that kind alone."""
    out = {}
    for kind in sorted(set(kinds)):
        sel = [(lab, h) for (lab, _, h), k in zip(rows, kinds) if k == kind]
        rated = [h for _, h in sel if h is not None]
        out[kind] = {
            "responses": len(sel),
            "observed_error_rate": wilson(sum(lab for lab, _ in sel), len(sel)),
            "goodput_rate": wilson(sum(bool(h) for h in rated), len(rated)) if rated else None,
        }
    return out


def delta(m1, m0, name):
    return m1.get(name, 0.0) - m0.get(name, 0.0)


m0 = metrics()
n0 = checked_total()
phases = {}
prev_m, prev_n = m0, n0
plan = [("calibrate", HEALTHY_T, facts[0::2]), ("validate", HEALTHY_T, facts[1::2])]
if HEALTHY_T != 0:
    plan.append(("greedy", 0.0, facts[1::2]))
plan.append(("gibberish", 1.8, facts))
for name, temp, questions in plan:
    rows, kinds, m, n = run_phase(name, temp, prev_n, questions)
    rated = delta(m, prev_m, "goodput_consistency_rated_total")
    halluc = delta(m, prev_m, "goodput_consistency_hallucinated_total")
    errors = sum(lab for lab, _, _ in rows)
    phases[name] = {
        "temperature": temp,
        "responses": len(rows),
        "observed_error_rate": wilson(errors, len(rows)),
        "goodput_rated": rated,
        "goodput_rate": wilson(int(halluc), int(rated)) if rated else None,
        "by_kind": by_kind(rows, kinds),
        "rows": rows,
        "kinds": kinds,
    }
    prev_m, prev_n = m, n
    print(f"{name}: {len(rows)} responses, observed error rate {phases[name]['observed_error_rate']}, "
          f"goodput's rate {phases[name]['goodput_rate']} over {rated:.0f} rated; by kind {phases[name]['by_kind']}",
          file=sys.stderr)

# goodput's interval for each phase and kind, as its windows compute it: the Wilson intervals of
# the verdicts at the ends of the calibrated threshold's band (the stated rate's own interval).
src = next(b["consistency_rate"] for b in json.loads(http(f"http://{admin}/admin/backends"))["backends"])
band, primary = src.get("band"), src.get("method")


def goodput_interval(rows):
    scored = [s[primary] for _, s, h in rows if h is not None and primary in s]
    if not band or not scored:
        return None
    upper = sum(v > band[0] for v in scored)
    lower = sum(v > band[1] for v in scored)
    return [wilson(lower, len(scored))[1], wilson(upper, len(scored))[2]]


for p in phases.values():
    p["goodput_rate_interval_with_calibration"] = goodput_interval(p["rows"])
    for kind, entry in p["by_kind"].items():
        entry["goodput_rate_interval_with_calibration"] = goodput_interval(
            [r for r, k in zip(p["rows"], p["kinds"]) if k == kind]
        )
report_calibration = {k: src.get(k) for k in ("state", "method", "threshold", "band", "reference_rate", "reference_rate_interval", "checks")}

methods = sorted({k for p in phases.values() for _, s, _ in p["rows"] for k in s})
healthy = phases["calibrate"]["rows"] + phases["validate"]["rows"]
report = {"calibration": report_calibration, "phases": {}, "methods": {}}
for name, p in phases.items():
    report["phases"][name] = {k: v for k, v in p.items() if k not in ("rows", "kinds")}
    # Per response, numbers only (for analysis beyond this script): kind, label, scores, verdict.
    report["phases"][name]["per_response"] = [
        {"kind": k, "wrong": lab, "scores": sc, "hallucinated": h} for (lab, sc, h), k in zip(p["rows"], p["kinds"])
    ]
for meth in methods:
    entry = {
        "auroc_wrong_vs_right_healthy": auroc_ci(healthy, meth),
        "auroc_wrong_vs_right_all": auroc_ci(healthy + phases["gibberish"]["rows"], meth),
    }
    # Median score per phase, and the reliability of a threshold calibrated on the calibrate
    # phase's observed error rate (what goodput's calibration does with a stated rate).
    for name, p in phases.items():
        v = sorted(s[meth] for _, s, _ in p["rows"] if meth in s)
        entry[f"median_{name}"] = round(v[len(v) // 2], 4) if v else None
    cal = sorted(s[meth] for _, s, _ in phases["calibrate"]["rows"] if meth in s)
    err = phases["calibrate"]["observed_error_rate"][0]
    if cal:
        above = min(round(err * len(cal)), len(cal) - 1)
        thr = cal[len(cal) - 1 - above]
        entry["threshold_from_calibrate"] = thr
        rel = {}
        for name in [p for p in phases if p != "calibrate"]:
            rows = [(lab, s[meth]) for lab, s, _ in phases[name]["rows"] if meth in s]
            flagged = [lab for lab, v in rows if v > thr]
            passed = [lab for lab, v in rows if v <= thr]
            rel[name] = {
                "predicted_rate": round(len(flagged) / len(rows), 3) if rows else None,
                "observed_error_rate": wilson(sum(lab for lab, _ in rows), len(rows)),
                "error_rate_when_flagged": wilson(sum(flagged), len(flagged)),
                "error_rate_when_passed": wilson(sum(passed), len(passed)),
            }
        entry["calibrated_verdicts"] = rel
    # A probability method: its score bins against the observed error rate.
    bins = [0.0, 0.25, 0.5, 0.75, 1.0001] if meth not in ("perplexity", "bits_per_byte") else []
    table = []
    for lo, hi in zip(bins, bins[1:]):
        sel = [(lab, s[meth]) for lab, s, _ in healthy + phases["gibberish"]["rows"] if meth in s and lo <= s[meth] < hi]
        if sel:
            table.append({
                "bin": [lo, min(hi, 1.0)],
                "n": len(sel),
                "mean_score": round(sum(v for _, v in sel) / len(sel), 3),
                "observed_error_rate": wilson(sum(lab for lab, _ in sel), len(sel)),
            })
    entry["reliability_bins"] = table
    report["methods"][meth] = entry

json.dump(report, open(out_path, "w"), indent=1)
print(json.dumps(report, indent=1))
