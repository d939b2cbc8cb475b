//! Prometheus metric definitions. Names follow the OpenTelemetry GenAI semantic conventions
//! where they define one; everything else is `goodput_*`. The README lists each with its formula.

use prometheus::{
    CounterVec, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry,
};

/// OTel's recommended TTFT buckets, extended below for fast backends and above to vLLM's tail.
pub const TTFT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// OTel's TPOT buckets, extended the same way; also used for inter-token latency.
pub const TPOT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// OTel's request duration buckets, extended to vLLM's long tail.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68, 655.36, 1310.72, 2621.44,
];
/// OTel's token usage buckets (powers of 4).
pub const TOKEN_BUCKETS: &[f64] =
    &[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0];
/// The proxy's own overhead: 5 µs to 50 ms.
pub const OVERHEAD_BUCKETS: &[f64] =
    &[0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05];

/// Labels of the per-request families, in this order.
pub const REQ_LABELS: &[&str] = &["gen_ai_request_model", "backend", "route"];

/// What an upstream server reported on its own /metrics, as the `goodput_server_*` series
/// export it (`route::server` reads the server and fills this in).
pub struct ServerGauges {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_cache_usage: Option<f64>,
    pub prefix_cache_hit_ratio: Option<f64>,
    /// Preemptions since the previous reading; `None` where the server exports none.
    pub preempted: Option<f64>,
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub ttft: HistogramVec,
    pub tpot: HistogramVec,
    pub itl: HistogramVec,
    pub duration: HistogramVec,
    pub token_usage: HistogramVec,
    pub requests: IntCounterVec,
    pub tokens: IntCounterVec,
    pub slo_judged: IntCounterVec,
    pub slo_met: IntCounterVec,
    pub slo_met_tokens: IntCounterVec,
    pub slo_judged_tokens: IntCounterVec,
    pub overhead: Histogram,
    pub in_flight: IntGaugeVec,
    pub upstream_errors: IntCounterVec,
    pub config_reloads: IntCounterVec,
    pub records_dropped: IntCounter,
    pub usage_injected: IntCounter,
    pub usage_stripped: IntCounter,
    pub encoded_responses: IntCounterVec,
    pub body_too_large: IntCounter,
    pub build_info: IntGaugeVec,
    pub response_perplexity: HistogramVec,
    pub response_bits_per_byte: HistogramVec,
    pub scored: IntCounterVec,
    pub scored_tokens: IntCounterVec,
    pub scoring_queue_depth: prometheus::IntGauge,
    pub scoring_dropped: IntCounterVec,
    pub scoring_failed: IntCounterVec,
    pub scoring_duration: Histogram,
    pub scoring_batch_size: Histogram,
    pub scoring_cpu: CounterVec,
    pub scoring_cpu_budget: Gauge,
    pub shadow_requests: IntCounterVec,
    pub shadow_tokens: IntCounterVec,
    pub shadow_skipped: IntCounterVec,
    pub consistency_score: HistogramVec,
    pub consistency_checked: IntCounterVec,
    pub consistency_rated: IntCounterVec,
    pub consistency_hallucinated: IntCounterVec,
    pub consistency_hallucinated_band: IntCounterVec,
    pub consistency_threshold: GaugeVec,
    pub quality_drift: GaugeVec,
    pub quality_drift_confident: GaugeVec,
    pub consistency_failed: IntCounter,
    pub route_decisions: IntCounterVec,
    pub route_stats_reads: IntCounterVec,
    pub backend_outstanding: GaugeVec,
    pub circuit_state: GaugeVec,
    pub window_throughput: GaugeVec,
    pub window_goodput_requests: GaugeVec,
    pub window_goodput_tokens: GaugeVec,
    pub window_quality_pass_rate: GaugeVec,
    pub window_hallucination_rate: GaugeVec,
    pub window_index: GaugeVec,
    /// What each upstream server reports on its own /metrics (route::server reads it).
    pub server_waiting: GaugeVec,
    pub server_running: GaugeVec,
    pub server_kv_cache_usage: GaugeVec,
    pub server_prefix_hit_ratio: GaugeVec,
    pub server_preemptions: CounterVec,
    pub server_metrics_up: GaugeVec,
    /// Choices within pools, and each endpoint's requests outstanding.
    pub endpoint_decisions: IntCounterVec,
    pub endpoint_outstanding: GaugeVec,
    /// Endpoints in each backend's pool (DNS discovery changes it).
    pub pool_endpoints: GaugeVec,
    pub discovery_refreshes: IntCounterVec,
    /// Client connections open now (limits.max_connections bounds it).
    pub client_connections: prometheus::IntGauge,
    /// Answers cut because the client took nothing for limits.send_timeout_ms.
    pub client_send_timeouts: IntCounter,
    /// Requests or connections the proxy refused on a limit, by reason.
    pub rejected: IntCounterVec,
    /// Read from the runtime at each scrape (the soak test watches it; the `process_*` series
    /// are `meter::process`'s, read at each scrape too).
    pub runtime_alive_tasks: prometheus::IntGauge,
}

/// Perplexity buckets: log-spaced, 2^(k/2) from 1 to 2^16 (perplexity is a geometric quantity).
fn perplexity_buckets() -> Vec<f64> {
    (0..=32).map(|k| 2f64.powf(k as f64 / 2.0)).collect()
}

/// Bits per byte: 0.05 .. ~6.4, log-spaced.
fn bpb_buckets() -> Vec<f64> {
    (0..=14).map(|k| 0.05 * 2f64.powf(k as f64 / 2.0)).collect()
}

fn hist(reg: &Registry, name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
        .expect("valid histogram");
    reg.register(Box::new(h.clone())).expect("unique metric");
    h
}

fn gauge(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    reg.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn int_gauge(reg: &Registry, name: &str, help: &str) -> prometheus::IntGauge {
    let g = prometheus::IntGauge::new(name, help).expect("valid gauge");
    reg.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn counter(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    reg.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let reg = Registry::new();
        let l = REQ_LABELS;
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            l.iter().copied().chain(extra.iter().copied()).collect()
        };
        let overhead = Histogram::with_opts(
            HistogramOpts::new(
                "goodput_proxy_overhead_seconds",
                "Time spent inside the proxy per request, outside the upstream call: request \
                 handling before forwarding, response handling after the upstream's headers, and \
                 the metering of every body frame.",
            )
            .buckets(OVERHEAD_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        reg.register(Box::new(overhead.clone())).expect("unique metric");
        let single = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid counter");
            reg.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let in_flight = IntGaugeVec::new(
            Opts::new("goodput_in_flight_requests", "Metered requests currently being served."),
            &["backend"],
        )
        .expect("valid gauge");
        reg.register(Box::new(in_flight.clone())).expect("unique metric");
        let build_info = IntGaugeVec::new(
            Opts::new("goodput_build_info", "Always 1; labelled with the version."),
            &["version"],
        )
        .expect("valid gauge");
        reg.register(Box::new(build_info.clone())).expect("unique metric");
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        reg.register(Box::new(super::process::ProcessCollector::new())).expect("unique metric");
        let scoring_queue_depth = prometheus::IntGauge::new(
            "goodput_scoring_queue_depth",
            "Sampled responses waiting for a scoring thread.",
        )
        .expect("valid gauge");
        reg.register(Box::new(scoring_queue_depth.clone())).expect("unique metric");
        let scoring_duration = Histogram::with_opts(
            HistogramOpts::new(
                "goodput_scoring_duration_seconds",
                "Time from taking a response off the queue to its score (render, tokenize, the model call of its batch).",
            )
            .buckets(prometheus::exponential_buckets(0.005, 2.0, 14).expect("valid buckets")),
        )
        .expect("valid histogram");
        reg.register(Box::new(scoring_duration.clone())).expect("unique metric");
        let scoring_batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "goodput_scoring_batch_size",
                "Responses scored together in one model call (perplexity.max_batch caps it).",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )
        .expect("valid histogram");
        reg.register(Box::new(scoring_batch_size.clone())).expect("unique metric");
        let scoring_cpu = CounterVec::new(
            Opts::new(
                "goodput_scoring_cpu_seconds_total",
                "CPU time spent scoring (tokenizing and model calls; the scoring thread's clock times its session's intra-op threads), by scorer (perplexity, embedding).",
            ),
            &["scorer"],
        )
        .expect("valid counter");
        reg.register(Box::new(scoring_cpu.clone())).expect("unique metric");
        let scoring_cpu_budget = Gauge::new(
            "goodput_scoring_cpu_budget_cores",
            "quality.max_cpu in effect: the cores the scorers may keep busy on average (set when a scorer starts).",
        )
        .expect("valid gauge");
        reg.register(Box::new(scoring_cpu_budget.clone())).expect("unique metric");
        let m = Metrics {
            ttft: hist(
                &reg,
                "gen_ai_server_time_to_first_token_seconds",
                "Streaming requests: from the first byte received from the client to the first chunk carrying generated content.",
                TTFT_BUCKETS,
                l,
            ),
            tpot: hist(
                &reg,
                "gen_ai_server_time_per_output_token_seconds",
                "(e2e - TTFT) / (completion_tokens per choice - 1), as vllm bench serve defines TPOT.",
                TPOT_BUCKETS,
                l,
            ),
            itl: hist(
                &reg,
                "goodput_inter_token_latency_seconds",
                "Gaps between content-bearing chunks of a stream, divided by the tokens a chunk carried when the backend reports it.",
                TPOT_BUCKETS,
                l,
            ),
            duration: hist(
                &reg,
                "gen_ai_server_request_duration_seconds",
                "From the first byte received from the client to the last byte of the response (or its abort).",
                DURATION_BUCKETS,
                &with(&["outcome"]),
            ),
            token_usage: hist(
                &reg,
                "gen_ai_client_token_usage",
                "Tokens per request, by gen_ai_token_type (input, output).",
                TOKEN_BUCKETS,
                &with(&["gen_ai_token_type"]),
            ),
            requests: counter(
                &reg,
                "goodput_requests_total",
                "Metered requests by HTTP status sent to the client and outcome (ok, upstream_error, upstream_reset, timeout, cancelled, ...).",
                &with(&["status", "outcome", "finish_reason"]),
            ),
            tokens: counter(
                &reg,
                "goodput_tokens_total",
                "Tokens by type (input, output) and the source of the count (usage, tokenizer, chunks, none).",
                &with(&["type", "source"]),
            ),
            slo_judged: counter(
                &reg,
                "goodput_slo_judged_requests_total",
                "Requests judged against the SLOs (all but client cancellations and the client's own errors, a 4xx other than 429; other errors count as misses).",
                l,
            ),
            slo_met: counter(&reg, "goodput_slo_met_requests_total", "Requests that met every SLO.", l),
            slo_judged_tokens: counter(
                &reg,
                "goodput_slo_judged_output_tokens_total",
                "Output tokens of requests judged against the SLOs.",
                l,
            ),
            slo_met_tokens: counter(
                &reg,
                "goodput_slo_met_output_tokens_total",
                "Output tokens of requests that met every SLO: rate() of this is latency goodput in tokens/s.",
                l,
            ),
            overhead,
            in_flight,
            upstream_errors: counter(
                &reg,
                "goodput_upstream_errors_total",
                "Upstream failures by kind: connect, timeout_connect, timeout_first_byte, timeout_idle, reset, protocol.",
                &["backend", "kind"],
            ),
            config_reloads: counter(
                &reg,
                "goodput_config_reloads_total",
                "Config reloads by result (success, invalid, unchanged).",
                &["result"],
            ),
            records_dropped: single(
                "goodput_records_dropped_total",
                "Finished-request records dropped because the recorder fell behind.",
            ),
            usage_injected: single(
                "goodput_usage_injected_total",
                "Streams for which the proxy asked the upstream for include_usage.",
            ),
            usage_stripped: single(
                "goodput_usage_chunks_removed_total",
                "Usage-only chunks removed before the client saw them (the client had not asked for usage).",
            ),
            encoded_responses: counter(
                &reg,
                "goodput_encoded_responses_total",
                "Metered answers sent in a content coding although goodput asked for identity: forwarded unchanged and not read (no tokens, no TTFT).",
                &["backend"],
            ),
            body_too_large: single("goodput_request_body_too_large_total", "Requests refused with 413."),
            build_info,
            response_perplexity: hist(
                &reg,
                "goodput_response_perplexity",
                "Perplexity of scored responses under the reference LM: exp(-mean log p(response token | prompt, earlier tokens)).",
                &perplexity_buckets(),
                l,
            ),
            response_bits_per_byte: hist(
                &reg,
                "goodput_response_bits_per_byte",
                "Bits per UTF-8 byte of scored responses under the reference LM: -sum log p / bytes / ln 2 (comparable across tokenizers).",
                &bpb_buckets(),
                l,
            ),
            scored: counter(&reg, "goodput_scored_responses_total", "Responses scored for perplexity.", l),
            scored_tokens: counter(
                &reg,
                "goodput_scored_tokens_total",
                "Response tokens scored for perplexity (at most max_response_tokens per response).",
                l,
            ),
            scoring_queue_depth,
            scoring_dropped: counter(
                &reg,
                "goodput_scoring_dropped_total",
                "Sampled responses not scored, by reason: queue_full (scorers behind), cpu_budget (scorers resting to stay within quality.max_cpu), nothing_to_score (empty response or a token-id prompt).",
                &["reason"],
            ),
            scoring_failed: counter(
                &reg,
                "goodput_scoring_failed_total",
                "Scoring attempts that failed (unparseable request, template or model error), by scorer.",
                &["scorer"],
            ),
            scoring_duration,
            scoring_batch_size,
            scoring_cpu,
            scoring_cpu_budget,
            shadow_requests: counter(
                &reg,
                "goodput_shadow_requests_total",
                "Shadow requests goodput sent for consistency checks (not user traffic), by kind (sample: one re-sample; samples_n: the K re-samples in one request with n = K; judge: a SelfCheck-Prompt question) and outcome (ok, error, timeout).",
                &["backend", "kind", "outcome"],
            ),
            shadow_tokens: counter(
                &reg,
                "goodput_shadow_tokens_total",
                "Upstream tokens spent on shadow requests, from their usage, by kind and type (input, output).",
                &["backend", "kind", "type"],
            ),
            shadow_skipped: counter(
                &reg,
                "goodput_shadow_checks_skipped_total",
                "Consistency checks not run or not finished, by reason: token_budget, cpu_budget (embeddings resting to stay within quality.max_cpu), queue_full, bad_request, nothing_to_check, shutdown.",
                &["reason"],
            ),
            consistency_score: hist(
                &reg,
                "goodput_consistency_score",
                "Consistency score of checked responses in [0, 1] (mean over sentences; 0 = every re-sample agrees), by method. A ranking score for unigram and embedding (healthy text scores near 1 under unigram), a probability for prompt; the rate is goodput_consistency_hallucinated_total / goodput_consistency_rated_total.",
                &(1..=18)
                    .map(|i| i as f64 * 0.05)
                    .chain([0.92, 0.94, 0.96, 0.97, 0.98, 0.985, 0.99, 0.995, 0.999, 1.0])
                    .collect::<Vec<_>>(),
                &with(&["method"]),
            ),
            consistency_checked: counter(
                &reg,
                "goodput_consistency_checked_total",
                "Responses checked for consistency.",
                l,
            ),
            consistency_rated: counter(
                &reg,
                "goodput_consistency_rated_total",
                "Checked responses that got a verdict: the method's score is a probability (prompt, against quality.consistency.threshold) or its threshold is calibrated. Checks by an uncalibrated ranking method get none.",
                l,
            ),
            consistency_hallucinated: counter(
                &reg,
                "goodput_consistency_hallucinated_total",
                "Rated responses judged hallucinated (score above the threshold): ÷ goodput_consistency_rated_total = the hallucination rate.",
                l,
            ),
            consistency_hallucinated_band: counter(
                &reg,
                "goodput_consistency_hallucinated_band_total",
                "Rated responses above the threshold at one end of the calibration's band (the thresholds of the stated rate's 95% interval; without a band, the threshold itself): the Wilson interval of end=\"lower\" ÷ goodput_consistency_rated_total gives the hallucination rate's lower bound, of end=\"upper\" its upper bound.",
                &[REQ_LABELS[0], REQ_LABELS[1], REQ_LABELS[2], "end"],
            ),
            quality_drift: gauge(
                &reg,
                "goodput_quality_drift",
                "A backend's or pool endpoint's mean quality score over the quality window less its reference's (its peers serving the same model, else its own baseline), by scope (backend, endpoint), name, backend (the backend itself, or the endpoint's pool), signal (bits_per_byte, consistency) and bound (estimate, lower, upper: the 95% interval). Positive is worse. Absent while either side has fewer than quality.drift.min_samples scores.",
                &["scope", "name", "backend", "signal", "bound"],
            ),
            quality_drift_confident: gauge(
                &reg,
                "goodput_quality_drift_confident",
                "1 when goodput_quality_drift's lower bound is above the signal's quality.drift.min_effect_*: worse than the reference, and not by noise.",
                &["scope", "name", "backend", "signal"],
            ),
            consistency_threshold: gauge(
                &reg,
                "goodput_consistency_threshold",
                "The score above which a checked response counts as hallucinated, by backend, method and source (configured: a probability method's quality.consistency.threshold; calibrated: set on a reference). Absent: no verdicts, no rate.",
                &["backend", "method", "source"],
            ),
            consistency_failed: single(
                "goodput_consistency_failed_total",
                "Consistency checks that got no usable re-sample or score.",
            ),
            route_decisions: counter(
                &reg,
                "goodput_route_decisions_total",
                "Routing decisions by route, chosen backend and reason: cheapest, fastest, best_quality, best_value (the class's objective among compliant backends), explore, sla_unmet (none complied: best effort), failover (after a connect failure), no_healthy_backend.",
                &["route", "backend", "reason"],
            ),
            route_stats_reads: counter(
                &reg,
                "goodput_route_stats_reads_total",
                "Reads of the router's statistics from Prometheus (routing.stats.source: prometheus), by result (success, error).",
                &["result"],
            ),
            backend_outstanding: gauge(
                &reg,
                "goodput_backend_outstanding_requests",
                "Requests sent to the backend and not finished (what max_concurrency and the tie-break read).",
                &["backend"],
            ),
            server_waiting: gauge(
                &reg,
                "goodput_server_requests_waiting",
                "The upstream server's own queue: requests waiting to be scheduled (vllm:num_requests_waiting), read from its /metrics.",
                &["backend", "endpoint"],
            ),
            server_running: gauge(
                &reg,
                "goodput_server_requests_running",
                "Requests in the upstream server's running batch (vllm:num_requests_running).",
                &["backend", "endpoint"],
            ),
            server_kv_cache_usage: gauge(
                &reg,
                "goodput_server_kv_cache_usage_ratio",
                "The upstream server's KV-cache usage, 0-1 (vllm:kv_cache_usage_perc; the fullest engine).",
                &["backend", "endpoint"],
            ),
            server_prefix_hit_ratio: gauge(
                &reg,
                "goodput_server_prefix_cache_hit_ratio",
                "Prefix-cache hits / queries (in tokens) of the upstream server over the last minute; absent without queries.",
                &["backend", "endpoint"],
            ),
            server_preemptions: {
                let c = CounterVec::new(
                    Opts::new(
                        "goodput_server_preemptions_total",
                        "Sequences the upstream server preempted for lack of KV-cache blocks (increase of vllm:num_preemptions_total while goodput watched).",
                    ),
                    &["backend", "endpoint"],
                )
                .expect("valid counter");
                reg.register(Box::new(c.clone())).expect("unique metric");
                c
            },
            server_metrics_up: gauge(
                &reg,
                "goodput_server_metrics_up",
                "1 while the upstream server's /metrics answers with vLLM's metrics, 0 when it stopped answering (the goodput_server_* gauges are then removed, not left stale).",
                &["backend", "endpoint"],
            ),
            endpoint_decisions: counter(
                &reg,
                "goodput_endpoint_decisions_total",
                "Choices of an endpoint within a backend's pool, by reason (prefix_hit, least_queue, kv_headroom, lowest_latency, near_tie, fallback_unknown, only_endpoint, all_saturated, no_healthy_endpoint, quality_degraded, quality_probe, round_robin, least_outstanding).",
                &["backend", "endpoint", "reason"],
            ),
            endpoint_outstanding: gauge(
                &reg,
                "goodput_endpoint_outstanding_requests",
                "Requests sent to the endpoint and not finished.",
                &["backend", "endpoint"],
            ),
            pool_endpoints: gauge(
                &reg,
                "goodput_pool_endpoints",
                "Endpoints in the backend's pool (its url, endpoints list or DNS answer).",
                &["backend"],
            ),
            discovery_refreshes: counter(
                &reg,
                "goodput_discovery_refreshes_total",
                "DNS lookups of discovered pools, by result (success, error).",
                &["backend", "result"],
            ),
            circuit_state: gauge(
                &reg,
                "goodput_backend_circuit_state",
                "1 for the backend's current circuit-breaker state (closed, open, half_open), 0 for the others.",
                &["backend", "state"],
            ),
            window_throughput: gauge(
                &reg,
                "goodput_window_output_tokens_per_second",
                "Output tokens/s over the sliding window (metrics.window_secs), per scope (backend or class) and name.",
                &["scope", "name"],
            ),
            window_goodput_requests: gauge(
                &reg,
                "goodput_window_goodput_requests_per_second",
                "Requests/s over the window that met every latency SLO of their class (weighting=latency), times the quality pass rate (weighting=quality, with quality_lower and quality_upper from its 95% Wilson interval).",
                &["scope", "name", "weighting"],
            ),
            window_goodput_tokens: gauge(
                &reg,
                "goodput_window_goodput_tokens_per_second",
                "Output tokens/s over the window of requests that met every latency SLO (weighting=latency), times the quality pass rate (weighting=quality, quality_lower, quality_upper).",
                &["scope", "name", "weighting"],
            ),
            window_quality_pass_rate: gauge(
                &reg,
                "goodput_window_quality_pass_rate",
                "Share of quality judgements over the quality window that passed the class's floors (perplexity <= max_perplexity; not hallucinated), with its 95% Wilson interval (bound=estimate, lower, upper).",
                &["scope", "name", "bound"],
            ),
            window_hallucination_rate: gauge(
                &reg,
                "goodput_window_hallucination_rate",
                "Share of rated consistency checks over the quality window judged hallucinated, with its 95% interval (bound=estimate, lower, upper): the verdicts' sampling and, for a calibrated threshold, the calibration's own uncertainty. Absent without rated checks.",
                &["scope", "name", "bound"],
            ),
            window_index: gauge(
                &reg,
                "goodput_window_index",
                "The seed's indexes over the window: effective_tps = tokens/s x (1 - hallucination rate); tput_per_ppl = tokens/s / perplexity; tput_per_ppl_price = tokens/s / (perplexity x price per 1M tokens).",
                &["scope", "name", "index"],
            ),
            client_connections: int_gauge(
                &reg,
                "goodput_client_connections",
                "Client connections open now on the proxy listener (limits.max_connections bounds it).",
            ),
            client_send_timeouts: single(
                "goodput_client_send_timeouts_total",
                "Answers cut because the client took none of them for limits.send_timeout_ms (an HTTP/1.1 connection closed, an h2 stream reset); their requests count as cancelled.",
            ),
            rejected: counter(
                &reg,
                "goodput_rejected_total",
                "Connections or requests refused for want of capacity, with Retry-After, by reason: max_connections (503), backend_at_capacity (503, every candidate at its max_concurrency), no_endpoint (503, no endpoint known), overloaded (429, a class that sheds), out_of_descriptors (503, no file descriptor left for the upstream connection).",
                &["reason"],
            ),
            runtime_alive_tasks: int_gauge(
                &reg,
                "goodput_runtime_alive_tasks",
                "Tokio tasks alive at scrape time (connections, streams, background loops): a leak shows as growth.",
            ),
            registry: reg,
        };
        // Counters that alerts read with increase() or rate() exist at 0 from the start: a
        // series that first appears at 1 shows no increase, so the first invalid reload would
        // never fire GoodputConfigReloadFailed.
        for result in ["success", "invalid", "unchanged"] {
            m.config_reloads.with_label_values(&[result]);
        }
        for reason in ["queue_full", "cpu_budget", "nothing_to_score"] {
            m.scoring_dropped.with_label_values(&[reason]);
        }
        m
    }

    /// goodput_requests_total summed by outcome (logged at shutdown).
    pub fn requests_by_outcome(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for mf in self.registry.gather() {
            if mf.name() != "goodput_requests_total" {
                continue;
            }
            for m in mf.get_metric() {
                if let Some(l) = m.get_label().iter().find(|l| l.name() == "outcome") {
                    *out.entry(l.value().to_string()).or_insert(0) += m.get_counter().get_value() as u64;
                }
            }
        }
        out
    }

    /// A backend's server state as the last scrape gave it; `None` removes the gauges.
    pub fn set_server(&self, backend: &str, endpoint: &str, view: Option<&ServerGauges>) {
        let gauges = [
            (&self.server_waiting, view.and_then(|v| v.waiting)),
            (&self.server_running, view.and_then(|v| v.running)),
            (&self.server_kv_cache_usage, view.and_then(|v| v.kv_cache_usage)),
            (&self.server_prefix_hit_ratio, view.and_then(|v| v.prefix_cache_hit_ratio)),
        ];
        for (g, x) in gauges {
            match x {
                Some(x) => g.with_label_values(&[backend, endpoint]).set(x),
                None => {
                    let _ = g.remove_label_values(&[backend, endpoint]);
                }
            }
        }
        if let Some(n) = view.and_then(|v| v.preempted) {
            self.server_preemptions.with_label_values(&[backend, endpoint]).inc_by(n);
        }
        self.server_metrics_up
            .with_label_values(&[backend, endpoint])
            .set(f64::from(u8::from(view.is_some())));
    }

    /// An endpoint whose server is no longer read (turned off, or it left the pool): none of
    /// its `goodput_server_*` or `goodput_endpoint_*` series.
    pub fn remove_server(&self, backend: &str, endpoint: &str) {
        let _ = self.endpoint_outstanding.remove_label_values(&[backend, endpoint]);
        for g in [
            &self.server_waiting,
            &self.server_running,
            &self.server_kv_cache_usage,
            &self.server_prefix_hit_ratio,
            &self.server_metrics_up,
        ] {
            let _ = g.remove_label_values(&[backend, endpoint]);
        }
        let _ = self.server_preemptions.remove_label_values(&[backend, endpoint]);
    }

    /// Refresh the gauges read from the runtime, just before a scrape.
    pub fn refresh_runtime(&self) {
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            self.runtime_alive_tasks.set(h.metrics().num_alive_tasks() as i64);
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The names this file registers: its string literals that look like a metric's name,
    /// label lists (`&[…]`) left out.
    fn registered() -> BTreeSet<String> {
        let src = [include_str!("metrics.rs"), include_str!("process.rs")]
            .map(|s| s.split("#[cfg(test)]").next().unwrap())
            .concat();
        let src = src.as_str();
        let mut code = String::new();
        let mut rest = src;
        while let Some(i) = rest.find("&[") {
            code.push_str(&rest[..i]);
            rest = &rest[i..];
            rest = &rest[rest.find(']').map_or(rest.len(), |j| j + 1)..];
        }
        code.push_str(rest);
        code.split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| {
                ["goodput_", "gen_ai_", "process_"].iter().any(|p| s.starts_with(p))
                    && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
            .map(str::to_string)
            .collect()
    }

    /// The names README's metrics table lists (a row may name two).
    fn documented() -> BTreeSet<String> {
        let readme = include_str!("../../README.md");
        let section = readme.split("\n## Metrics\n").nth(1).unwrap().split("\n## ").next().unwrap();
        section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| {
                let first = l.split('|').nth(1).unwrap();
                first.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn readme_lists_every_metric_and_no_other() {
        let (code, doc) = (registered(), documented());
        assert!(code.len() > 50, "the scan found {} names: {code:?}", code.len());
        let missing: Vec<_> = code.difference(&doc).collect();
        let stale: Vec<_> = doc.difference(&code).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "README's metrics table lacks {missing:?} and lists {stale:?}, which nothing registers"
        );
    }
}
