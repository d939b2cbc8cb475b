#!/usr/bin/env python3
"""Write goodput's Grafana dashboards (grafana/dashboards/*.json) from one description.

    python3 grafana/make_dashboards.py [OUT_DIR]

Every dashboard has a datasource variable and backend and model variables; every panel's PromQL
uses them. tests/dashboards.rs evaluates every expression against a real Prometheus that scraped
a running goodput under load (scoring and routing on): each must parse and return data. Sparse
error counters end in `or vector(0)`, so that a healthy system shows 0 rather than "No data".
"""
import json
import os

SEL = 'backend=~"$backend",gen_ai_request_model=~"$model"'
RI = "$__rate_interval"


def variables():
    def query_var(name, label, metric, label_name):
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": f"label_values({metric}, {label_name})", "refId": "var"},
            "definition": f"label_values({metric}, {label_name})",
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
            "sort": 1,
        }

    return [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "refresh": 1,
        },
        query_var("backend", "backend", "goodput_requests_total", "backend"),
        query_var("model", "model", "goodput_requests_total", "gen_ai_request_model"),
    ]


# goodput's own process_* series: vLLM (and most exporters) export the same names, so only the
# targets that also export goodput_build_info.
GOODPUT_PROCESS = "* on (instance, job) group_left goodput_build_info"


def annotations():
    """Events drawn on every panel: what changed when a figure moved. One marker a minute at most."""

    def prom(name, color, expr, title, text):
        return {
            "name": name,
            "enable": True,
            "hide": False,
            "iconColor": color,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "expr": expr,
            "step": "1m",
            "titleFormat": title,
            "textFormat": text,
            "tagKeys": "instance",
            "useValueForTime": False,
        }

    return [
        {
            "builtIn": 1,
            "name": "Annotations & Alerts",
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "type": "dashboard",
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        },
        # A new pod or a restarted container: the process started in the last two minutes
        # (two scrape intervals of slack, so that one sample a minute always sees it).
        prom(
            "goodput started",
            "purple",
            "max by (instance, version) (process_start_time_seconds * on (instance, job) group_left (version) goodput_build_info) > time() - 120",
            "goodput started",
            "{{instance}} version {{version}}",
        ),
        prom(
            "config reloaded",
            "blue",
            'sum by (instance) (increase(goodput_config_reloads_total{result="success"}[1m])) > 0',
            "config reloaded",
            "{{instance}}",
        ),
        prom(
            "config rejected",
            "red",
            'sum by (instance) (increase(goodput_config_reloads_total{result="invalid"}[1m])) > 0',
            "invalid config rejected (the previous one serves)",
            "{{instance}}",
        ),
    ]


class Board:
    def __init__(self, uid, title, description):
        self.uid, self.title, self.description = uid, title, description
        self.panels = []
        self.x = self.y = 0

    def panel(self, title, targets, unit="short", kind="timeseries", w=12, h=8, description="", extra=None):
        if self.x + w > 24:
            self.x, self.y = 0, self.y + h
        p = {
            "id": len(self.panels) + 1,
            "type": kind,
            "title": title,
            "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [
                {
                    "refId": chr(ord("A") + i),
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "expr": expr,
                    "legendFormat": legend,
                }
                for i, (expr, legend) in enumerate(targets)
            ],
        }
        if kind == "heatmap":
            p["targets"][0]["format"] = "heatmap"
            p["options"] = {"calculate": False, "yAxis": {"unit": unit}}
        if extra:
            p.update(extra)
        self.panels.append(p)
        self.x += w
        return p

    def write(self, path):
        d = {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["goodput", "llm"],
            "schemaVersion": 39,
            "version": 1,
            "editable": True,
            "time": {"from": "now-1h", "to": "now"},
            "refresh": "30s",
            "timezone": "browser",
            "templating": {"list": variables()},
            "annotations": {"list": annotations()},
            "panels": self.panels,
        }
        with open(path, "w") as f:
            json.dump(d, f, indent=2)
            f.write("\n")


def quantiles(metric, by="backend", extra=""):
    sel = SEL + extra
    return [
        (f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[{RI}])))", f"p{int(q * 100)} {{{{{by}}}}}")
        for q in (0.5, 0.95, 0.99)
    ]


def overview():
    b = Board("goodput-overview", "goodput / Overview", "Traffic, latency, throughput and latency goodput per backend.")
    b.panel("Requests/s by outcome", [(f"sum by (backend, outcome) (rate(goodput_requests_total{{{SEL}}}[{RI}]))", "{{backend}} {{outcome}}")], "reqps")
    b.panel(
        "Errors/s (upstream errors, timeouts, resets)",
        [(f'sum by (backend) (rate(goodput_requests_total{{{SEL},outcome=~"upstream_error|upstream_reset|connect_error|timeout"}}[{RI}])) or vector(0)', "{{backend}}")],
        "reqps",
    )
    b.panel("Time to first token (streams)", quantiles("gen_ai_server_time_to_first_token_seconds"), "s", w=8)
    b.panel("Time per output token", quantiles("gen_ai_server_time_per_output_token_seconds"), "s", w=8)
    b.panel(
        "Inter-token latency (streams)",
        quantiles("goodput_inter_token_latency_seconds"),
        "s",
        w=8,
        description="Gaps between content-bearing chunks, divided by the tokens a chunk carried when the server reports it: the stalls a reader sees, which a mean time per output token hides.",
    )
    b.panel("End-to-end latency", quantiles("gen_ai_server_request_duration_seconds", extra=',outcome="ok"'), "s")
    b.panel(
        "Output tokens/s: throughput and latency goodput",
        [
            (f'sum by (backend) (rate(goodput_tokens_total{{{SEL},type="output"}}[{RI}]))', "throughput {{backend}}"),
            (f"sum by (backend) (rate(goodput_slo_met_output_tokens_total{{{SEL}}}[{RI}]))", "goodput {{backend}}"),
        ],
        "short",
        description="Goodput: output tokens/s of requests that met every latency SLO of their class.",
    )
    # SLO attainment beside the server's own queue and KV cache (vLLM's /metrics, read by
    # goodput per backend), so that a breach shows its cause on the same row.
    b.panel(
        "SLO attainment",
        [
            (f"sum by (backend) (rate(goodput_slo_met_requests_total{{{SEL}}}[{RI}])) / sum by (backend) (rate(goodput_slo_judged_requests_total{{{SEL}}}[{RI}]))", "requests {{backend}}"),
            (f"sum by (backend) (rate(goodput_slo_met_output_tokens_total{{{SEL}}}[{RI}])) / sum by (backend) (rate(goodput_slo_judged_output_tokens_total{{{SEL}}}[{RI}]))", "output tokens {{backend}}"),
        ],
        "percentunit",
        w=8,
        description="Share of judged requests (all but client cancellations and the client's own 4xx errors other than 429) that met every SLO, and the share of their output tokens: below the requests' line, the misses are the long answers (TPOT or end-to-end), above it the short ones.",
    )
    b.panel(
        "Server queue and batch (vLLM)",
        [
            ('sum by (backend) (goodput_server_requests_waiting{backend=~"$backend"})', "waiting {{backend}}"),
            ('sum by (backend) (goodput_server_requests_running{backend=~"$backend"})', "running {{backend}}"),
        ],
        "short",
        w=8,
        description="vllm:num_requests_waiting and vllm:num_requests_running as goodput reads them from each backend's /metrics. A queue that grows while attainment falls: the backend is past its capacity (vLLM's --max-num-seqs or its KV cache).",
    )
    b.panel(
        "KV cache and prefix-cache hits (vLLM)",
        [
            ('max by (backend) (goodput_server_kv_cache_usage_ratio{backend=~"$backend"})', "KV cache used {{backend}}"),
            ('max by (backend) (goodput_server_prefix_cache_hit_ratio{backend=~"$backend"})', "prefix hits {{backend}}"),
            ('sum by (backend) (rate(goodput_server_preemptions_total{backend=~"$backend"}[$__rate_interval]))', "preemptions/s {{backend}}"),
        ],
        "percentunit",
        w=8,
        description="KV-cache usage (vllm:kv_cache_usage_perc), the share of prompt tokens found in vLLM's prefix cache over the last minute, and preemptions (sequences evicted for lack of KV blocks: near 100% usage they cost recomputation and latency).",
    )
    b.panel(
        "Goodput / throughput (recorded, 5m)",
        [('goodput:goodput_to_throughput:ratio_rate5m{backend=~"$backend"}', "{{backend}} {{route}}")],
        "percentunit",
    )
    b.panel(
        "SLO error budget burn (1h, objective 99%)",
        [("goodput:slo_errors:ratio_rate1h / 0.01", "{{route}}")],
        "short",
        description="1 = burning the budget exactly as fast as a 99% objective allows; the fast-burn alert pages at 14.4.",
    )
    b.panel(
        "goodput's own overhead",
        [(f"histogram_quantile({q}, sum by (le) (rate(goodput_proxy_overhead_seconds_bucket[{RI}])))", f"p{int(q * 100)}") for q in (0.5, 0.99)],
        "s",
    )
    b.panel(
        "goodput's CPU (cores)",
        [
            (f"sum by (instance) (rate(process_cpu_seconds_total[{RI}]) {GOODPUT_PROCESS})", "all {{instance}}"),
            (f"sum by (instance) (rate(goodput_scoring_cpu_seconds_total[{RI}]))", "scoring {{instance}}"),
        ],
        "short",
        w=8,
        description="CPU of each goodput process, every thread; the scorers' share (perplexity, embeddings) is bounded by quality.max_cpu and runs at idle priority.",
    )
    b.panel(
        "goodput's CPU per 1k output tokens (without scoring)",
        [
            (
                f"(sum(rate(process_cpu_seconds_total[{RI}]) {GOODPUT_PROCESS}) - (sum(rate(goodput_scoring_cpu_seconds_total[{RI}])) or vector(0)))"
                f' / sum(rate(goodput_tokens_total{{type="output"}}[{RI}])) * 1e6',
                "proxy CPU per 1k output tokens",
            )
        ],
        "ms",
        w=8,
        description="What metering and forwarding cost per token the clients received, over every backend and model: the proxy's CPU (process CPU less the scorers') divided by output tokens/s. BENCHMARKS.md has the same figure measured side by side with nginx.",
    )
    b.panel(
        "goodput's memory and file descriptors",
        [
            (f"max by (instance) (process_resident_memory_bytes {GOODPUT_PROCESS})", "resident {{instance}}"),
            (f"max by (instance) (process_open_fds / process_max_fds {GOODPUT_PROCESS})", "descriptors used {{instance}}"),
        ],
        "bytes",
        w=8,
        description="Resident memory, and open file descriptors as a share of the limit (one per client connection and one per upstream connection). Past the limit requests are refused with 503 out_of_descriptors; GoodputFileDescriptorsNearLimit warns at 80%.",
        extra={
            "fieldConfig": {
                "defaults": {"unit": "bytes"},
                "overrides": [
                    {
                        "matcher": {"id": "byFrameRefID", "options": "B"},
                        "properties": [{"id": "unit", "value": "percentunit"}, {"id": "custom.axisPlacement", "value": "right"}],
                    }
                ],
            }
        },
    )
    b.panel(
        "Requests in flight, client connections and tasks alive",
        [
            ('sum by (backend) (goodput_in_flight_requests{backend=~"$backend"})', "{{backend}}"),
            ("sum(goodput_client_connections)", "client connections (limits.max_connections)"),
            ("sum(goodput_runtime_alive_tasks)", "tokio tasks alive"),
        ],
        "short",
        description="Tasks alive: one per client connection, one per upstream connection, one per h2 answer (its send watchdog) and a few background loops. Tasks that keep growing while connections and requests in flight stay flat are a leak.",
    )
    b.panel(
        "Refused by goodput, and records dropped (/s)",
        [
            (f"sum by (reason) (rate(goodput_rejected_total[{RI}])) or vector(0)", "refused {{reason}}"),
            (f"sum(rate(goodput_request_body_too_large_total[{RI}]))", "refused: body over limits.max_body_bytes (413)"),
            (f"sum(rate(goodput_records_dropped_total[{RI}]))", "records dropped (missing from every figure)"),
            (f"sum(rate(goodput_client_send_timeouts_total[{RI}]))", "cut: client took nothing for limits.send_timeout_ms"),
        ],
        "reqps",
        description="Answered by goodput itself for want of capacity: max_connections, backend_at_capacity (every backend of a route at its max_concurrency), no_endpoint (a pool with no address), out_of_descriptors (goodput's open-file limit) with 503, overloaded (a class that sheds) with 429. A body over limits.max_body_bytes gets 413. Records dropped: requests forwarded but not measured because the recorder fell behind; should stay 0. Cut: answers whose client took none of them for limits.send_timeout_ms (a hung client, one gone without closing, or an h2 stream given no window): the HTTP/1.1 connection closed or the h2 stream reset; their requests were cancelled upstream.",
    )
    b.panel(
        "goodput instances by version",
        [("count by (version) (goodput_build_info)", "{{version}}")],
        "short",
        description="Scraped goodput processes per version: during a rollout the new version replaces the old; two versions for long means a rollout stalled.",
    )
    b.panel(
        "Tokens/s by source of the count",
        [(f"sum by (type, source) (rate(goodput_tokens_total{{{SEL}}}[{RI}]))", "{{type}} {{source}}")],
        "short",
    )
    b.panel(
        "Stream usage asked for and taken out (/s)",
        [
            (f"sum(rate(goodput_usage_injected_total[{RI}]))", "streams goodput asked for include_usage"),
            (f"sum(rate(goodput_usage_chunks_removed_total[{RI}]))", "usage chunks taken out before the client"),
        ],
        "reqps",
        description="goodput's one change to traffic (usage.inject_stream_usage): streams whose client did not ask for usage get it asked for, and the usage-only chunk that comes back is removed. The two lines match when every server honours include_usage; a gap is streams whose server sent no usage, counted from chunks or the tokenizer instead (Tokens/s by source).",
    )
    return b


def quality():
    b = Board("goodput-quality", "goodput / Quality", "Perplexity and consistency of the scored sample, scorer health, quality-weighted goodput.")
    b.panel("Perplexity of scored responses", quantiles("goodput_response_perplexity")[:2], "short")
    b.panel(
        "Bits per byte of scored responses",
        quantiles("goodput_response_bits_per_byte")[:2],
        "short",
        description="The reference model's surprise per UTF-8 byte of the response (-sum log p / bytes / ln 2). Unlike perplexity it does not depend on how a tokenizer splits the text, so backends whose models tokenize differently compare on it; quality drift is detected on it.",
    )
    b.panel(
        "Perplexity distribution",
        [(f"sum by (le) (rate(goodput_response_perplexity_bucket{{{SEL}}}[{RI}]))", "{{le}}")],
        "short",
        kind="heatmap",
    )
    b.panel(
        "Hallucination rate (rated consistency checks, recorded 1h)",
        [
            ('goodput:hallucination:ratio_rate1h{backend=~"$backend"}', "{{backend}} {{route}}"),
            ('goodput_window_hallucination_rate{scope="backend",name=~"$backend"}', "{{name}} window {{bound}}"),
        ],
        "percentunit",
        description="Share of rated checks judged hallucinated: a probability method (prompt) or a calibrated threshold. An uncalibrated ranking method (unigram, embedding) gives no rate, and this panel stays empty. The window's lower and upper bounds are its 95% interval, which for a calibrated threshold includes the calibration's own uncertainty.",
    )
    b.panel(
        "Consistency score distribution",
        [(f"sum by (le) (rate(goodput_consistency_score_bucket{{{SEL}}}[{RI}]))", "{{le}}")],
        "short",
        kind="heatmap",
    )
    b.panel(
        "Share of responses scored",
        [
            (f'sum by (backend) (rate(goodput_scored_responses_total{{{SEL}}}[{RI}])) / sum by (backend) (rate(goodput_requests_total{{{SEL},outcome="ok"}}[{RI}]))', "perplexity {{backend}}"),
            (f'sum by (backend) (rate(goodput_consistency_checked_total{{{SEL}}}[{RI}])) / sum by (backend) (rate(goodput_requests_total{{{SEL},outcome="ok"}}[{RI}]))', "consistency {{backend}}"),
        ],
        "percentunit",
    )
    b.panel(
        "Scorer: drops, failures and queue",
        [
            (f"sum by (reason) (rate(goodput_scoring_dropped_total[{RI}])) or vector(0)", "dropped {{reason}}"),
            (f"sum(rate(goodput_scoring_failed_total[{RI}])) or vector(0)", "failed"),
            ("goodput_scoring_queue_depth", "queue depth"),
        ],
        "short",
    )
    b.panel(
        "Consistency checks: skipped, failed, shadow errors (/s)",
        [
            (f"sum by (reason) (rate(goodput_shadow_checks_skipped_total[{RI}])) or vector(0)", "skipped {{reason}}"),
            (f"sum(rate(goodput_consistency_failed_total[{RI}]))", "failed (no usable re-sample or score)"),
            (f'sum by (backend, kind) (rate(goodput_shadow_requests_total{{backend=~"$backend",outcome!="ok"}}[{RI}])) or vector(0)', "shadow {{kind}} errors {{backend}}"),
        ],
        "reqps",
        description="Checks not run (token_budget, cpu_budget, queue_full, ...) or run without a verdict, and the re-sample requests that failed or timed out. A check that does not finish is left out of the consistency figures, neither consistent nor not.",
    )
    b.panel(
        "Scoring time per response",
        [(f"histogram_quantile({q}, sum by (le) (rate(goodput_scoring_duration_seconds_bucket[{RI}])))", f"p{int(q * 100)}") for q in (0.5, 0.95)],
        "s",
        description="From leaving the queue to the score, the model call of its batch included.",
    )
    b.panel(
        "Scoring CPU and its budget",
        [
            (f"sum by (scorer) (rate(goodput_scoring_cpu_seconds_total[{RI}]))", "{{scorer}}"),
            ("max(goodput_scoring_cpu_budget_cores)", "budget (quality.max_cpu)"),
        ],
        "short",
        description="Cores the scorers keep busy. At the budget they rest between responses and drop what is sampled meanwhile (dropped cpu_budget above).",
    )
    b.panel(
        "Tokens scored (/s, and per scoring CPU second)",
        [
            (f"sum(rate(goodput_scored_tokens_total{{{SEL}}}[{RI}]))", "tokens scored/s"),
            (
                f"sum(rate(goodput_scored_tokens_total[{RI}])) / sum(rate(goodput_scoring_cpu_seconds_total{{scorer=\"perplexity\"}}[{RI}]))",
                "tokens per CPU second (perplexity)",
            ),
        ],
        "short",
        description="What the reference model gets through: tokens scored per second, and per second of the perplexity scorer's CPU (its speed on this hardware; BENCHMARKS.md has it measured). Divide the sampled tokens/s you want scored by the second line to size quality.max_cpu.",
    )
    b.panel(
        "Scorer batch size",
        [(f"sum(rate(goodput_scoring_batch_size_sum[{RI}])) / sum(rate(goodput_scoring_batch_size_count[{RI}]))", "responses per model call")],
        "short",
        description="On a GPU one model call scores what waits in the queue, up to perplexity.max_batch; near 1 with a full queue means the scorer cannot batch.",
    )
    # Every drift series names its backend (an endpoint's is its pool).
    def drift(metric):
        return f'{metric}{{backend=~"$backend"}}'

    b.panel(
        "Quality drift against the reference (95% interval)",
        [(drift("goodput_quality_drift"), "{{backend}} {{scope}} {{name}} {{signal}} {{bound}}")],
        "short",
        description="Mean score over the quality window less the reference's (its peers serving the same model, else its own baseline): bits per byte, or the first consistency method's score. Positive is worse. Absent until both sides have quality.drift.min_samples scores.",
    )
    b.panel(
        "Confident quality drift (drains a pool endpoint; alert after 15 min)",
        [(f"max by (scope, name, backend, signal) ({drift('goodput_quality_drift_confident')})", "{{backend}} {{scope}} {{name}} {{signal}}")],
        "short",
        description="1 while the drift's lower bound is above quality.drift.min_effect_*: a pool endpoint with it in a drain_on signal is drained, and GoodputQualityDrift fires when it holds for 15 minutes.",
    )
    b.panel(
        "Quality-weighted goodput (95% Wilson interval)",
        [('goodput_window_goodput_tokens_per_second{scope="backend",name=~"$backend"}', "{{name}} {{weighting}}")],
        "short",
        description="Latency goodput x the pass rate of the quality judgements; lower and upper carry the pass rate's interval.",
    )
    b.panel(
        "Quality pass rate",
        [('goodput_window_quality_pass_rate{scope="backend",name=~"$backend"}', "{{name}} {{bound}}")],
        "percentunit",
    )
    b.panel(
        "The seed's indexes",
        [('goodput_window_index{scope="backend",name=~"$backend"}', "{{name}} {{index}}")],
        "short",
        description="effective_tps = tokens/s x (1 - hallucination rate); tput_per_ppl; tput_per_ppl_price.",
    )
    b.panel(
        "Shadow re-sampling cost (tokens/s)",
        [(f'sum by (backend, kind) (rate(goodput_shadow_tokens_total{{backend=~"$backend"}}[{RI}]))', "{{backend}} {{kind}}")],
        "short",
    )
    return b


def routing():
    b = Board("goodput-routing", "goodput / Routing", "Routing decisions by reason, compliance and goodput per backend and class.")
    b.panel(
        "Decisions/s by reason",
        [(f'sum by (reason) (rate(goodput_route_decisions_total{{backend=~"$backend"}}[{RI}]))', "{{reason}}")],
        "reqps",
    )
    b.panel(
        "Decisions/s by route and backend",
        [(f'sum by (route, backend) (rate(goodput_route_decisions_total{{backend=~"$backend"}}[{RI}]))', "{{route}} → {{backend}}")],
        "reqps",
    )
    b.panel(
        "Share of decisions with no compliant backend (sla_unmet)",
        [(f'(sum(rate(goodput_route_decisions_total{{reason="sla_unmet"}}[{RI}])) or vector(0)) / sum(rate(goodput_route_decisions_total[{RI}]))', "sla_unmet")],
        "percentunit",
    )
    b.panel(
        "SLO attainment per backend and route",
        [('goodput:slo_attainment:ratio_rate5m{backend=~"$backend"}', "{{backend}} {{route}}")],
        "percentunit",
    )
    b.panel(
        "TTFT p95 per backend (what compliance reads)",
        quantiles("gen_ai_server_time_to_first_token_seconds")[1:2],
        "s",
    )
    b.panel(
        "Circuit breakers and load",
        [
            ('max by (backend) (goodput_backend_circuit_state{backend=~"$backend",state!="closed"})', "{{backend}} not closed"),
            ('goodput_backend_outstanding_requests{backend=~"$backend"}', "{{backend}} outstanding"),
        ],
        "short",
    )
    b.panel(
        "Throughput and goodput per class (latency and quality-weighted)",
        [
            ('goodput_window_output_tokens_per_second{scope="class"}', "{{name}} throughput"),
            ('goodput_window_goodput_tokens_per_second{scope="class"}', "{{name}} goodput {{weighting}}"),
        ],
        "short",
        description="Output tokens/s over the router's window (metrics.window_secs), and the part of them that met the class's latency SLOs (latency) times the quality pass rate (quality, with its 95% interval): the figures the router compares.",
    )
    b.panel(
        "Throughput and goodput per backend (latency and quality-weighted)",
        [
            ('goodput_window_output_tokens_per_second{scope="backend",name=~"$backend"}', "{{name}} throughput"),
            ('goodput_window_goodput_tokens_per_second{scope="backend",name=~"$backend"}', "{{name}} goodput {{weighting}}"),
        ],
        "short",
        description="Output tokens/s over the router's window (metrics.window_secs), and the part of them that met the class's latency SLOs (latency) times the quality pass rate (quality, with its 95% interval): the figures the router compares.",
    )
    b.panel(
        "Pool: queue per endpoint (vLLM's waiting + running)",
        [
            ('sum by (backend, endpoint) (goodput_server_requests_waiting{backend=~"$backend"})', "{{backend}} {{endpoint}} waiting"),
            ('sum by (backend, endpoint) (goodput_server_requests_running{backend=~"$backend"})', "{{backend}} {{endpoint}} running"),
        ],
        "short",
        description="What each replica's own /metrics says; goodput's pool choices read it (and goodput's own outstanding count where it is higher or unknown).",
    )
    b.panel(
        "Pool: KV cache and prefix-cache hits per endpoint",
        [
            ('max by (backend, endpoint) (goodput_server_kv_cache_usage_ratio{backend=~"$backend"})', "{{backend}} {{endpoint}} KV used"),
            ('max by (backend, endpoint) (goodput_server_prefix_cache_hit_ratio{backend=~"$backend"})', "{{backend}} {{endpoint}} prefix hits"),
        ],
        "percentunit",
    )
    b.panel(
        "Pool: endpoint choices/s by reason",
        [(f'sum by (backend, endpoint, reason) (rate(goodput_endpoint_decisions_total{{backend=~"$backend"}}[{RI}]))', "{{endpoint}} {{reason}}")],
        "reqps",
        description="prefix_hit, least_queue, kv_headroom, lowest_latency, near_tie, fallback_unknown (no server signal: goodput's own counts), all_saturated, no_healthy_endpoint, quality_degraded (an endpoint whose quality drifted was drained), quality_probe (the share that still goes there).",
    )
    b.panel(
        "Pool: endpoints and requests outstanding",
        [
            ('goodput_pool_endpoints{backend=~"$backend"}', "{{backend}} endpoints"),
            ('sum by (backend) (goodput_server_metrics_up{backend=~"$backend"})', "{{backend}} endpoints whose vLLM /metrics goodput reads"),
            ('goodput_endpoint_outstanding_requests{backend=~"$backend"}', "{{backend}} {{endpoint}} outstanding"),
        ],
        "short",
    )
    b.panel(
        "Pool: DNS lookups/s by result",
        [(f'sum by (backend, result) (rate(goodput_discovery_refreshes_total{{backend=~"$backend"}}[{RI}]))', "{{backend}} {{result}}")],
        "reqps",
        description="Pools found in DNS only. A failed lookup keeps the last answer's endpoints, so errors with no success mean the pool no longer follows its Service (GoodputDiscoveryFailing after 15 minutes).",
    )
    b.panel(
        "Failovers and upstream errors",
        [
            (f'sum by (backend) (rate(goodput_route_decisions_total{{reason="failover"}}[{RI}])) or vector(0)', "failover to {{backend}}"),
            (f'sum by (backend, kind) (rate(goodput_upstream_errors_total{{backend=~"$backend"}}[{RI}])) or vector(0)', "{{backend}} {{kind}}"),
        ],
        "reqps",
    )
    return b


if __name__ == "__main__":
    import sys

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards")
    os.makedirs(out, exist_ok=True)
    for board, name in ((overview(), "overview"), (quality(), "quality"), (routing(), "routing")):
        board.write(os.path.join(out, f"goodput-{name}.json"))
        print(f"{out}/goodput-{name}.json: {len(board.panels)} panels")
