//! What an upstream server says about itself, read beside goodput's own measurements: the model
//! names it serves (`/v1/models`) and its load as vLLM reports it on `/metrics` (queue, running
//! requests, KV-cache usage, prefix-cache hits, preemptions), endpoint by endpoint. One task
//! watches every backend that has a server (and refreshes discovered pools from DNS); what it
//! learns lives in the backend's `BackendState` and its endpoints, so it survives a reload and
//! the router and `/admin/backends` read it with one atomic load.

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::router::Endpoint;
use crate::config::ConfigHandle;
use crate::config::reload::ResolvedBackend;
use crate::meter::metrics::{Metrics, ServerGauges};

/// The user agent of goodput's own requests to a server (not user traffic).
pub const USER_AGENT: &str = "goodput-watch";
/// Served model names learnt from `/v1/models`, at most this many: each becomes a label value.
pub const MAX_DISCOVERED_MODELS: usize = 32;
/// Until the first answer, `/v1/models` is asked this often (the server may still be loading
/// its model when goodput starts beside it); afterwards every `MODELS_REFRESH`.
const MODELS_RETRY: Duration = Duration::from_secs(5);
const MODELS_REFRESH: Duration = Duration::from_secs(60);
/// A server without `/metrics` (404, or no vLLM metric in it) is asked again this rarely.
const NO_METRICS_RETRY: Duration = Duration::from_secs(60);
/// The prefix-cache hit ratio is over the queries of about this long.
const HIT_RATIO_SPAN: Duration = Duration::from_secs(60);

/// One reading of the server's `/metrics`. A field is `None` when the server does not export
/// it (an older vLLM, another server).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Reading {
    /// `vllm:num_requests_waiting`: requests queued, not yet scheduled.
    pub waiting: Option<f64>,
    /// `vllm:num_requests_running`: requests in the running batch.
    pub running: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (0-1; older vLLM: `gpu_cache_usage_perc`).
    pub kv_cache_usage: Option<f64>,
    /// `vllm:prefix_cache_queries_total` and `_hits_total`, in tokens.
    pub prefix_cache_queries: Option<f64>,
    pub prefix_cache_hits: Option<f64>,
    /// `vllm:num_preemptions_total`: sequences preempted for lack of KV-cache blocks.
    pub preemptions: Option<f64>,
    /// The KV cache's size in tokens, from `vllm:cache_config_info` (`kv_cache_size_tokens`, or
    /// `num_gpu_blocks` x `block_size`): how much prompt the replica's prefix cache can hold.
    pub kv_cache_tokens: Option<f64>,
}

/// The metric names read, each with the field it fills. Series of one name are summed (one per
/// engine or model), except the KV-cache usage, where the fullest engine is the one that queues.
const NAMES: &[(&str, Field)] = &[
    ("vllm:num_requests_waiting", Field::Waiting),
    ("vllm:num_requests_running", Field::Running),
    ("vllm:kv_cache_usage_perc", Field::Kv),
    ("vllm:gpu_cache_usage_perc", Field::Kv),
    ("vllm:prefix_cache_queries", Field::Queries),
    ("vllm:prefix_cache_hits", Field::Hits),
    ("vllm:num_preemptions", Field::Preemptions),
    ("vllm:cache_config_info", Field::CacheConfig),
];

#[derive(Clone, Copy)]
enum Field {
    Waiting,
    Running,
    Kv,
    Queries,
    Hits,
    Preemptions,
    CacheConfig,
}

/// The family a sample or `# TYPE` line belongs to, when it is one goodput reads. Counters'
/// samples carry `_total` (and `_created`, skipped).
fn family(line: &str) -> Option<Field> {
    let name = line.strip_prefix("# TYPE ").unwrap_or(line);
    let name = &name[..name.find(['{', ' ']).unwrap_or(name.len())];
    if name.ends_with("_created") {
        return None;
    }
    let base = name.strip_suffix("_total").unwrap_or(name);
    NAMES.iter().find(|(n, _)| *n == base).map(|(_, f)| *f)
}

/// Parse a `/metrics` body. `None` when it holds none of vLLM's metrics (not a vLLM server).
/// Only the few families goodput reads go to the parser: vLLM's page is hundreds of lines of
/// histograms, and a construct the parser does not know elsewhere on it must not cost these.
pub fn read_metrics(text: &str) -> Option<Reading> {
    let mut wanted = String::new();
    for l in text.lines().filter(|l| family(l).is_some()) {
        wanted.push_str(l.trim_end_matches('\r'));
        wanted.push('\n');
    }
    if wanted.is_empty() {
        return None;
    }
    let (_, families) = nom_openmetrics::parser::prometheus(&wanted).ok()?;
    let mut r = Reading::default();
    for s in families.iter().flat_map(|f| &f.samples) {
        let v = s.number();
        let Some(f) = family(s.name()) else { continue };
        if !v.is_finite() {
            continue;
        }
        let slot = match f {
            Field::Waiting => &mut r.waiting,
            Field::Running => &mut r.running,
            Field::Kv => {
                r.kv_cache_usage = Some(r.kv_cache_usage.map_or(v, |k| k.max(v)));
                continue;
            }
            Field::Queries => &mut r.prefix_cache_queries,
            Field::Hits => &mut r.prefix_cache_hits,
            Field::Preemptions => &mut r.preemptions,
            Field::CacheConfig => {
                // An info metric: the numbers are in its labels. One series per engine.
                let label = |k: &str| {
                    s.labels().iter().find(|l| l.name == k).and_then(|l| l.value.parse::<f64>().ok())
                };
                let tokens = label("kv_cache_size_tokens")
                    .or_else(|| Some(label("num_gpu_blocks")? * label("block_size")?))
                    .filter(|t| t.is_finite() && *t > 0.0);
                if let Some(t) = tokens {
                    r.kv_cache_tokens = Some(r.kv_cache_tokens.unwrap_or(0.0) + t);
                }
                continue;
            }
        };
        *slot = Some(slot.unwrap_or(0.0) + v);
    }
    (r != Reading::default()).then_some(r)
}

/// What `/admin/backends`, the status page and the router see of a server's own state.
#[derive(Debug, Clone, Serialize)]
pub struct ServerView {
    #[serde(flatten)]
    pub reading: Reading,
    /// Hits over queries of the last minute's prefix-cache lookups; `None` without lookups.
    pub prefix_cache_hit_ratio: Option<f64>,
    #[serde(skip)]
    pub at: Instant,
}

impl ServerView {
    /// The `goodput_server_*` gauges of this reading, with the preemptions since the last one.
    fn gauges(&self, preempted: f64) -> ServerGauges {
        ServerGauges {
            waiting: self.reading.waiting,
            running: self.reading.running,
            kv_cache_usage: self.reading.kv_cache_usage,
            prefix_cache_hit_ratio: self.prefix_cache_hit_ratio,
            preempted: self.reading.preemptions.map(|_| preempted),
        }
    }
}

/// Per endpoint: the latest view of its server (`None`: unknown, stale or not exported).
#[derive(Default)]
pub struct ServerSignals {
    view: ArcSwapOption<ServerView>,
    watch: Mutex<Watch>,
    busy: AtomicBool,
}

#[derive(Default)]
struct Watch {
    next_metrics: Option<Instant>,
    /// (when, queries, hits) over the last HIT_RATIO_SPAN, for the hit ratio.
    prefix: VecDeque<(Instant, f64, f64)>,
    last_preemptions: Option<f64>,
    last_ok: Option<Instant>,
}

/// Per backend: the model names its server lists on `/v1/models`.
#[derive(Default)]
pub struct Models {
    names: ArcSwap<Vec<Arc<str>>>,
    /// (next poll, whether the list has been read once)
    watch: Mutex<(Option<Instant>, bool)>,
    busy: AtomicBool,
}

impl Models {
    /// The served name `requested`, if the server listed it.
    pub fn get(&self, requested: &str) -> Option<Arc<str>> {
        self.names.load().iter().find(|m| &***m == requested).cloned()
    }

    pub fn all(&self) -> Arc<Vec<Arc<str>>> {
        self.names.load_full()
    }

    fn set(&self, mut names: Vec<Arc<str>>) {
        names.truncate(MAX_DISCOVERED_MODELS);
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.names.store(Arc::new(names));
    }
}

impl ServerSignals {
    /// The server's own state, when a recent scrape gave one.
    pub fn view(&self) -> Option<Arc<ServerView>> {
        self.view.load_full()
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fold one reading in; returns the view and the preemptions since the last reading.
    fn update(&self, r: Reading, now: Instant) -> (Arc<ServerView>, f64) {
        let mut w = self.watch();
        w.last_ok = Some(now);
        let preempted = match (w.last_preemptions, r.preemptions) {
            (Some(a), Some(b)) if b >= a => b - a,
            _ => 0.0,
        };
        w.last_preemptions = r.preemptions;
        let ratio = match (r.prefix_cache_queries, r.prefix_cache_hits) {
            (Some(q), Some(h)) => {
                // A restarted server starts its counters again.
                if w.prefix.back().is_some_and(|&(_, q0, h0)| q < q0 || h < h0) {
                    w.prefix.clear();
                }
                w.prefix.push_back((now, q, h));
                while w.prefix.len() > 2 && now.duration_since(w.prefix[1].0) >= HIT_RATIO_SPAN {
                    w.prefix.pop_front();
                }
                let &(_, q0, h0) = w.prefix.front().expect("just pushed");
                (q > q0).then(|| ((h - h0) / (q - q0)).clamp(0.0, 1.0))
            }
            _ => None,
        };
        let view = Arc::new(ServerView { reading: r, prefix_cache_hit_ratio: ratio, at: now });
        self.view.store(Some(view.clone()));
        (view, preempted)
    }

    /// A failed or empty scrape: the view goes once it is older than `stale`. True when a
    /// view the server once gave has just gone (a server that never gave one has no gauges).
    fn failed(&self, now: Instant, stale: Duration) -> bool {
        let w = self.watch();
        if w.last_ok.is_some_and(|t| now.duration_since(t) >= stale) {
            return self.view.swap(None).is_some();
        }
        false
    }
}

type HttpClient = Client<crate::tls::Connector, Empty<Bytes>>;

/// Watch every backend with a server: each endpoint's `/metrics` where `server_metrics` is
/// on, `/v1/models` where the config lists no `models`, and DNS where the pool is discovered.
/// Backends and endpoints come and go with reloads and DNS answers.
pub fn spawn_watcher(config: Arc<ConfigHandle>, metrics: Metrics, connector: crate::tls::Connector) {
    let pool_idle = Duration::from_millis(config.load().config.timeouts.pool_idle_ms);
    let client: HttpClient = crate::tls::client_builder(pool_idle).pool_max_idle_per_host(1).build(connector);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let snap = config.load_full();
            let now = Instant::now();
            for b in &snap.backends {
                if b.sim.is_some() {
                    continue;
                }
                let cfg = snap.config.backends.iter().find(|c| *c.name == *b.name);
                let Some(cfg) = cfg else { continue };
                if let Some(d) = &cfg.discovery {
                    super::discovery::poll(b, d, &metrics, now);
                }
                let interval = cfg.server_metrics_interval();
                for e in b.state.endpoints().iter() {
                    let signals = &e.server;
                    // Turned off by a reload: what it read last goes, not left to go stale.
                    if !cfg.server_metrics.enabled {
                        if signals.view.swap(None).is_some() {
                            metrics.remove_server(&b.name, &e.label);
                        }
                        continue;
                    }
                    if signals.busy.load(Ordering::Relaxed)
                        || signals.watch().next_metrics.is_some_and(|t| now < t)
                    {
                        continue;
                    }
                    signals.busy.store(true, Ordering::Relaxed);
                    let (b, e, client, m) = (b.clone(), e.clone(), client.clone(), metrics.clone());
                    let path = cfg.server_metrics.path.clone();
                    tokio::spawn(async move {
                        scrape(&client, &b, &e, &path, interval, &m).await;
                        e.server.busy.store(false, Ordering::Relaxed);
                    });
                }
                let models = &b.state.models;
                let due = models.watch.lock().unwrap_or_else(|p| p.into_inner()).0.is_none_or(|t| now >= t);
                if cfg.models.is_empty() && due && !models.busy.swap(true, Ordering::Relaxed) {
                    let (b, client) = (b.clone(), client.clone());
                    tokio::spawn(async move {
                        discover(&client, &b).await;
                        b.state.models.busy.store(false, Ordering::Relaxed);
                    });
                }
            }
        }
    });
}

/// Why a poll gave nothing: the server could not be reached (asked again at the interval: it
/// may be restarting), or it answered with something else than what was asked for (asked
/// again rarely: it is not a vLLM, or this is not its metrics path).
enum Fail {
    Unreachable(String),
    Unusable(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Unreachable(why) | Fail::Unusable(why) => f.write_str(why),
        }
    }
}

/// GET `uri`; the body only when the answer is a 2xx of one of the `types` (media type
/// prefixes) and at most `limit` bytes.
async fn get(
    client: &HttpClient,
    uri: http::Uri,
    b: &ResolvedBackend,
    timeout: Duration,
    types: &[&str],
    limit: usize,
) -> Result<Bytes, Fail> {
    let mut req = http::Request::get(uri).body(Empty::new()).map_err(|e| Fail::Unusable(e.to_string()))?;
    // The backend's extra headers (an API key) go with these requests too; the user agent
    // tells the server's access log who polls it.
    for (k, v) in &b.headers {
        req.headers_mut().insert(k, v.clone());
    }
    req.headers_mut().insert(http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT));
    tokio::time::timeout(timeout, async {
        let resp = client.request(req).await.map_err(|e| Fail::Unreachable(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(Fail::Unusable(format!("answered {status}")));
        }
        let ctype =
            resp.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !types.iter().any(|t| ctype.starts_with(t)) {
            return Err(Fail::Unusable(format!("answered with content-type `{ctype}`")));
        }
        let body = http_body_util::Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| Fail::Unusable(format!("reading the answer: {e}")))?;
        Ok(body.to_bytes())
    })
    .await
    .unwrap_or_else(|_| Err(Fail::Unreachable(format!("no answer within {timeout:?}"))))
}

async fn scrape(
    client: &HttpClient,
    b: &ResolvedBackend,
    e: &Endpoint,
    path: &str,
    interval: Duration,
    m: &Metrics,
) {
    // A busy vLLM's API server answers /metrics slowly (seconds, on a small CPU under load),
    // and a late reading still beats none: the timeout is not the interval.
    let timeout = (4 * interval).clamp(Duration::from_secs(2), Duration::from_secs(10));
    let started = Instant::now();
    let uri = http::Uri::builder()
        .scheme(e.scheme.clone())
        .authority(e.authority.clone())
        .path_and_query(path)
        .build();
    let types = ["text/plain", "application/openmetrics-text"];
    let result = match uri {
        Ok(uri) => get(client, uri, b, timeout, &types, 4 << 20).await,
        Err(e) => Err(Fail::Unusable(e.to_string())),
    };
    let reading = result.and_then(|body| {
        read_metrics(&String::from_utf8_lossy(&body))
            .ok_or_else(|| Fail::Unusable("no vLLM metrics in it".into()))
    });
    let now = Instant::now();
    let signals = &e.server;
    let next = match reading {
        Ok(r) => {
            let (view, preempted) = signals.update(r, now);
            m.set_server(&b.name, &e.label, Some(&view.gauges(preempted)));
            started + interval
        }
        Err(fail) => {
            // Three intervals (and a timeout) without an answer and the signals are unknown,
            // not stale numbers.
            if signals.failed(now, (3 * interval).max(timeout + interval)) {
                m.set_server(&b.name, &e.label, None);
            }
            tracing::debug!(backend = %b.name, endpoint = %e.label, "server metrics: {fail}");
            match fail {
                Fail::Unreachable(_) => started + interval,
                Fail::Unusable(_) => now + NO_METRICS_RETRY,
            }
        }
    };
    signals.watch().next_metrics = Some(next);
}

/// The model names the backend serves, asked of its first endpoint that answers.
async fn discover(client: &HttpClient, b: &ResolvedBackend) {
    let mut names = Err(Fail::Unreachable("no endpoint".into()));
    for e in b.state.endpoints().iter() {
        let Ok(uri) = b.uri(e, &http::uri::PathAndQuery::from_static("/v1/models")) else { continue };
        names = get(client, uri, b, Duration::from_secs(5), &["application/json"], 1 << 20).await.and_then(
            |body| {
                let v: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| Fail::Unusable(e.to_string()))?;
                let data = v["data"].as_array().ok_or_else(|| Fail::Unusable("no `data` list".into()))?;
                Ok(data.iter().filter_map(|m| m["id"].as_str()).map(Arc::from).collect::<Vec<Arc<str>>>())
            },
        );
        if names.is_ok() {
            break;
        }
    }
    let models = &b.state.models;
    let known = match names {
        Ok(names) => {
            if *models.all() != names {
                tracing::info!(backend = %b.name, models = ?names, "served models");
            }
            models.set(names);
            true
        }
        Err(why) => {
            tracing::debug!(backend = %b.name, "/v1/models: {why}");
            models.watch.lock().unwrap_or_else(|p| p.into_inner()).1
        }
    };
    models.watch.lock().unwrap_or_else(|p| p.into_inner()).0 =
        Some(Instant::now() + if known { MODELS_REFRESH } else { MODELS_RETRY });
}

#[cfg(test)]
mod tests {
    use super::*;

    // As vLLM 0.32 (V1 engine) writes them, trimmed, with one other family around.
    const VLLM: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.42
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="smollm2"} 2.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 250.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="smollm2"} 1.0
"#;

    #[test]
    fn reads_vllm_metrics() {
        let r = read_metrics(VLLM).unwrap();
        assert_eq!(r.running, Some(3.0));
        assert_eq!(r.waiting, Some(7.0));
        assert_eq!(r.kv_cache_usage, Some(0.42));
        assert_eq!(r.preemptions, Some(2.0));
        assert_eq!(r.prefix_cache_queries, Some(1000.0));
        assert_eq!(r.prefix_cache_hits, Some(250.0));
    }

    #[test]
    fn engines_are_summed_and_the_fullest_cache_counts() {
        let text = "vllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 5\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.9\n";
        let r = read_metrics(text).unwrap();
        assert_eq!(r.waiting, Some(7.0));
        assert_eq!(r.kv_cache_usage, Some(0.9));
        assert_eq!(r.running, None);
    }

    #[test]
    fn the_kv_cache_size_comes_from_the_cache_config_info() {
        // vLLM 0.32's line, shortened; older ones have no kv_cache_size_tokens.
        let text = "# TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"128\",enable_prefix_caching=\"True\",engine=\"0\",kv_cache_size_tokens=\"4096\",num_gpu_blocks=\"32\",sliding_window=\"None\"} 1.0\n\
            vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"1000\",num_gpu_blocks_override=\"None\"} 1.0\n";
        let r = read_metrics(text).unwrap();
        assert_eq!(r.kv_cache_tokens, Some(4096.0 + 16_000.0));
        assert_eq!(r.waiting, None);
        let p = crate::config::PrefixSettings::default();
        assert_eq!(p.index_capacity(Some(4096.0)), 64, "4096 tokens x 4 bytes / 256-byte blocks");
        assert_eq!(p.index_capacity(None), 16_384);
        assert_eq!(p.index_capacity(Some(1.0)), 16, "never below 16");
        let set = crate::config::PrefixSettings { index_blocks: Some(100), ..p };
        assert_eq!(set.index_capacity(Some(4096.0)), 100, "a configured size wins");
    }

    #[test]
    fn a_server_without_vllm_metrics_has_none() {
        assert_eq!(read_metrics("# TYPE http_requests_total counter\nhttp_requests_total 4\n"), None);
        assert_eq!(read_metrics("<html>not found</html>"), None);
        assert_eq!(read_metrics(""), None);
    }

    #[test]
    fn hit_ratio_is_over_the_recent_queries_and_survives_a_restart() {
        let s = ServerSignals::default();
        let t0 = Instant::now();
        let at = |q: f64, h: f64| Reading {
            prefix_cache_queries: Some(q),
            prefix_cache_hits: Some(h),
            preemptions: Some(q / 100.0),
            ..Default::default()
        };
        let (v, _) = s.update(at(100.0, 0.0), t0);
        assert_eq!(v.prefix_cache_hit_ratio, None, "one reading has no interval");
        let (v, p) = s.update(at(200.0, 80.0), t0 + Duration::from_secs(1));
        assert_eq!(v.prefix_cache_hit_ratio, Some(0.8));
        assert_eq!(p, 1.0, "preemptions since the last reading");
        // Two minutes on, the first minute's lookups no longer count.
        let (v, _) = s.update(at(300.0, 80.0), t0 + Duration::from_secs(121));
        assert_eq!(v.prefix_cache_hit_ratio, Some(0.0));
        // The server restarted: counters from zero, no negative ratio or preemptions.
        let (v, p) = s.update(at(10.0, 5.0), t0 + Duration::from_secs(122));
        assert_eq!(v.prefix_cache_hit_ratio, None);
        assert_eq!(p, 0.0);
    }

    #[test]
    fn the_view_goes_unknown_after_failures_not_before() {
        let s = ServerSignals::default();
        let t0 = Instant::now();
        s.update(Reading { waiting: Some(1.0), ..Default::default() }, t0);
        assert!(!s.failed(t0 + Duration::from_millis(900), Duration::from_secs(1)));
        assert!(s.view().is_some());
        assert!(s.failed(t0 + Duration::from_millis(1100), Duration::from_secs(1)));
        assert!(s.view().is_none());
        assert!(!s.failed(t0 + Duration::from_millis(1200), Duration::from_secs(1)), "gone once");
        assert!(!ServerSignals::default().failed(t0, Duration::ZERO), "never had one");
    }

    #[test]
    fn discovered_models_are_bounded() {
        let s = Models::default();
        s.set((0..100).map(|i| Arc::from(format!("m{i}"))).collect());
        assert_eq!(s.all().len(), MAX_DISCOVERED_MODELS);
        assert_eq!(s.get("m3").as_deref(), Some("m3"));
        assert_eq!(s.get("m99"), None);
    }
}
