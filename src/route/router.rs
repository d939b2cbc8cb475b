//! The router at run time: per-backend state (requests outstanding, circuit breaker) that
//! survives config reloads, the decision log, and the statistics the decisions read (this
//! process's windows, or Prometheus's view in multi-replica mode).

use arc_swap::{ArcSwap, ArcSwapOption};
use serde::Serialize;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::breaker::{Breaker, BreakerConfig};
use super::decide::{Candidate, Class, Degraded, Draw, Policy, Reason, Stats, choose, decide};
use super::pool::{EndpointView, PickReason, PrefixIndex};
use crate::config::reload::{ResolvedBackend, ResolvedRoute, Snapshot};
use crate::meter::window::{DriftView, WindowSnapshot, confident};

/// One replica of a backend: where it is, what goodput has sent it, its breaker and what its
/// server reports. Kept across reloads and DNS refreshes while its address stays in the pool; a
/// request in flight keeps its endpoint alive after it left.
pub struct Endpoint {
    /// `host:port`: how metrics, decisions and `/admin` name it.
    pub label: Arc<str>,
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    /// The `Host` header of requests sent to it, made once (hyper's client would format it for
    /// every request).
    pub host: Option<http::HeaderValue>,
    outstanding: AtomicU64,
    breaker: Mutex<Breaker>,
    /// What its server reports about itself (route::server keeps it current).
    pub server: super::server::ServerSignals,
    /// `goodput_endpoint_decisions_total` per reason, looked up on first use.
    decided: [OnceLock<prometheus::IntCounter>; PickReason::COUNT],
}

/// `Host` as hyper's client writes it: the host, and the port only when it is not the scheme's
/// default. `None` (hyper then writes it) for an authority that is no header value.
fn host_header(scheme: &http::uri::Scheme, authority: &http::uri::Authority) -> Option<http::HeaderValue> {
    let default = if *scheme == http::uri::Scheme::HTTPS { 443 } else { 80 };
    let value = match authority.port_u16() {
        Some(port) if port != default => format!("{}:{port}", authority.host()),
        _ => authority.host().to_string(),
    };
    http::HeaderValue::try_from(value).ok()
}

impl Endpoint {
    pub fn new(scheme: http::uri::Scheme, authority: http::uri::Authority, cfg: BreakerConfig) -> Endpoint {
        Endpoint {
            label: Arc::from(authority.as_str()),
            host: host_header(&scheme, &authority),
            scheme,
            authority,
            outstanding: AtomicU64::new(0),
            breaker: Mutex::new(Breaker::new(cfg, Instant::now())),
            server: Default::default(),
            decided: Default::default(),
        }
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Whether the breaker would let a request through now (does not claim a probe).
    pub fn healthy(&self, now: Instant) -> bool {
        self.breaker().would_allow(now)
    }

    pub fn breaker_state(&self) -> &'static str {
        self.breaker().state()
    }

    /// The request's outcome as the breaker counts it: connect failures, timeouts, resets and
    /// 5xx answers are failures.
    pub fn report(&self, ok: bool) {
        let now = Instant::now();
        let mut b = self.breaker();
        if ok { b.on_success(now) } else { b.on_failure(now) }
    }

    /// The endpoint as a choice sees it.
    pub fn view(&self, now: Instant, matched: u32, ttft_p95_ms: Option<f64>) -> EndpointView {
        let server = self.server.view();
        let r = server.as_ref().map(|v| &v.reading);
        EndpointView {
            label: self.label.clone(),
            healthy: self.healthy(now),
            outstanding: self.outstanding(),
            waiting: r.and_then(|r| r.waiting),
            running: r.and_then(|r| r.running),
            kv_cache: r.and_then(|r| r.kv_cache_usage),
            matched,
            ttft_p95_ms,
            degraded: None,
        }
    }
}

/// What the router knows of one backend beyond its statistics: its endpoints (one for a
/// `url`), the requests outstanding over all of them, and the pool's prefix index. Shared by
/// every config snapshot that has a backend of this name, so a reload keeps all of it.
pub struct BackendState {
    outstanding: AtomicU64,
    /// Metered requests to it in flight, and when the last one ended ([`mono_ms`]; 0: never):
    /// each one's record brings a latency sample to its window.
    samples_due: AtomicU64,
    last_sample_ms: AtomicU64,
    /// The next turn of `policy: round_robin`.
    turn: std::sync::atomic::AtomicUsize,
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    breaker_cfg: Mutex<BreakerConfig>,
    prefix: Mutex<PrefixIndex>,
    /// The model names its server lists (route::server keeps them current).
    pub models: super::server::Models,
    /// Where DNS discovery stands, for a backend that has it.
    pub discovery: super::discovery::Status,
}

impl BackendState {
    pub fn new(cfg: BreakerConfig) -> Arc<BackendState> {
        Arc::new(BackendState {
            outstanding: AtomicU64::new(0),
            samples_due: AtomicU64::new(0),
            last_sample_ms: AtomicU64::new(0),
            turn: Default::default(),
            endpoints: ArcSwap::from_pointee(Vec::new()),
            breaker_cfg: Mutex::new(cfg),
            prefix: Mutex::new(PrefixIndex::default()),
            models: Default::default(),
            discovery: Default::default(),
        })
    }

    pub fn set_breaker_config(&self, cfg: BreakerConfig) {
        *self.breaker_cfg.lock().unwrap_or_else(|p| p.into_inner()) = cfg;
        for e in self.endpoints.load().iter() {
            e.breaker().set_config(cfg);
        }
    }

    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// The pool is now these addresses, in this order. An endpoint that stays keeps its
    /// counts, breaker and server view; one that left is returned (its requests in flight
    /// finish; its metrics go).
    pub fn set_endpoints(&self, addrs: Vec<(http::uri::Scheme, http::uri::Authority)>) -> Vec<Arc<Endpoint>> {
        let old = self.endpoints.load_full();
        let cfg = *self.breaker_cfg.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<Arc<Endpoint>> = addrs
            .into_iter()
            .map(|(scheme, authority)| {
                old.iter()
                    .find(|e| e.authority == authority && e.scheme == scheme)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Endpoint::new(scheme, authority, cfg)))
            })
            .collect();
        if new.len() == old.len() && new.iter().zip(old.iter()).all(|(a, b)| Arc::ptr_eq(a, b)) {
            return Vec::new();
        }
        let gone: Vec<Arc<Endpoint>> =
            old.iter().filter(|e| !new.iter().any(|n| Arc::ptr_eq(n, e))).cloned().collect();
        self.prefix().retain(|l| new.iter().any(|e| &*e.label == l));
        self.endpoints.store(Arc::new(new));
        gone
    }

    fn prefix(&self) -> std::sync::MutexGuard<'_, PrefixIndex> {
        self.prefix.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prefix index's block hashes for `endpoint` (admin).
    pub fn prefix_blocks(&self, endpoint: &str) -> usize {
        self.prefix().len(endpoint)
    }

    /// Requests outstanding over every endpoint.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// A metered request to it is in flight, or ended within the last `window_ms`: its sample
    /// is in a latency window of that length once its record lands (the recorder publishes
    /// within a fraction of a second; a record lost on a full queue is forgotten with the window).
    pub fn sample_due(&self, window_ms: u64) -> bool {
        if self.samples_due.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = self.last_sample_ms.load(Ordering::Relaxed);
        last != 0 && mono_ms().saturating_sub(last) < window_ms
    }

    /// Whether any endpoint's breaker would let a request through now.
    pub fn healthy(&self, now: Instant) -> bool {
        self.endpoints.load().iter().any(|e| e.healthy(now))
    }

    /// Whether every endpoint that would take a request reports a queue or KV cache past the
    /// pool's thresholds (unknown signals are not saturation).
    pub fn saturated(&self, p: &crate::config::PoolSettings, now: Instant) -> bool {
        let eps = self.endpoints.load();
        let mut healthy = eps.iter().filter(|e| e.healthy(now)).peekable();
        healthy.peek().is_some() && healthy.all(|e| e.view(now, 0, None).saturated(p))
    }

    /// The backend's breaker as one state: closed while any endpoint's is, else half open
    /// while any is, else open.
    pub fn breaker_state(&self) -> &'static str {
        let eps = self.endpoints.load();
        let states: SmallVec<[&str; 16]> = eps.iter().map(|e| e.breaker_state()).collect();
        ["closed", "half_open"].into_iter().find(|s| states.contains(s)).unwrap_or("open")
    }

    /// Choose an endpoint for a request: views of every endpoint (the ones in `tried` out),
    /// the choice, and the prompt's blocks recorded as sent there.
    pub fn pick(&self, ask: &PoolAsk<'_>, d: Draw) -> PoolPick {
        let eps = self.endpoints.load_full();
        let now = Instant::now();
        if let [only] = eps.as_slice() {
            // One endpoint (a `url`): nothing to weigh; the sidecar's path stays this short.
            if ask.tried.iter().any(|t| Arc::ptr_eq(t, only)) {
                return PoolPick {
                    endpoint: None,
                    reason: PickReason::NoHealthyEndpoint,
                    views: Vec::new(),
                    draw: d,
                };
            }
            let healthy = only.breaker().allow(now);
            let reason = if healthy { PickReason::OnlyEndpoint } else { PickReason::NoHealthyEndpoint };
            return PoolPick { endpoint: Some(only.clone()), reason, views: Vec::new(), draw: d };
        }
        let views: Vec<EndpointView> = {
            let ix = (!ask.blocks.is_empty()).then(|| self.prefix());
            eps.iter()
                .map(|e| {
                    let matched = ix.as_ref().map_or(0, |ix| ix.matched(&e.label, ask.blocks));
                    let mut v = e.view(now, matched, (ask.ttft_p95_ms)(&e.label));
                    v.healthy &= !ask.tried.iter().any(|t| Arc::ptr_eq(t, e));
                    v.degraded = (ask.degraded)(&e.label);
                    v
                })
                .collect()
        };
        // A request this endpoint already failed is not sent there again, even as a last resort.
        let untried: SmallVec<[usize; 16]> =
            (0..eps.len()).filter(|&i| !ask.tried.iter().any(|t| Arc::ptr_eq(t, &eps[i]))).collect();
        let d = match ask.settings.policy {
            crate::config::PoolPolicy::RoundRobin => {
                Draw { a: self.turn.fetch_add(1, Ordering::Relaxed), ..d }
            }
            _ => d,
        };
        let mut pick = super::pool::choose(ask.settings, &views, ask.blocks.len() as u32, d);
        if pick.index.is_some_and(|i| !untried.contains(&i)) {
            pick.index = None;
        }
        let endpoint = pick.index.map(|i| eps[i].clone());
        if let Some(e) = &endpoint {
            e.breaker().allow(now);
            if !ask.blocks.is_empty() {
                let kv_tokens = e.server.view().and_then(|v| v.reading.kv_cache_tokens);
                self.prefix().sent(&e.label, ask.blocks, ask.settings.prefix.index_capacity(kv_tokens));
            }
        }
        PoolPick { endpoint, reason: pick.reason, views, draw: d }
    }
}

/// What a choice within a pool needs to know of the request.
pub struct PoolAsk<'a> {
    pub settings: &'a crate::config::PoolSettings,
    /// The prompt's block hashes (empty: no prefix affinity).
    pub blocks: &'a [u64],
    /// goodput's TTFT p95 of an endpoint by label, where its window is trusted.
    pub ttft_p95_ms: &'a dyn Fn(&str) -> Option<f64>,
    /// An endpoint's confident quality drift, by label, where drift drains.
    pub degraded: &'a dyn Fn(&str) -> Option<Degraded>,
    /// Endpoints that already failed this request.
    pub tried: &'a [Arc<Endpoint>],
}

pub struct PoolPick {
    pub endpoint: Option<Arc<Endpoint>>,
    pub reason: PickReason,
    /// What the choice saw and drew, for the decision log.
    pub views: Vec<EndpointView>,
    pub draw: Draw,
}

/// A latency sample of a backend on its way: one metered request to it in flight. Counted in
/// `samples_due` while it lives.
pub struct SampleClaim(Arc<BackendState>);

impl SampleClaim {
    fn new(backend: &Arc<BackendState>) -> SampleClaim {
        backend.samples_due.fetch_add(1, Ordering::Relaxed);
        SampleClaim(backend.clone())
    }

    /// The first sample of a backend none is due from: one decision wins it, and a decision
    /// that lost sees the backend as awaiting its sample. Without this, decisions on two
    /// workers a few µs apart both find the backend unmeasured and unclaimed, and both probe it.
    fn first(backend: &Arc<BackendState>) -> Option<SampleClaim> {
        backend
            .samples_due
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| SampleClaim(backend.clone()))
    }
}

impl Drop for SampleClaim {
    fn drop(&mut self) {
        self.0.samples_due.fetch_sub(1, Ordering::Release);
    }
}

/// One request counted as outstanding at a backend and its endpoint until this is dropped
/// (with the response body, so a stream counts until its end).
pub struct Dispatch {
    backend: Arc<BackendState>,
    endpoint: Arc<Endpoint>,
    /// Its request's record will be a latency sample of this backend.
    sample: Option<SampleClaim>,
}

impl Dispatch {
    /// Count the request unless the backend already has `max` outstanding: a hard limit,
    /// since two requests cannot both take the last slot. `sample`: the choice's claim on the
    /// backend's next sample, kept while the request is a sample of it.
    pub fn try_start(
        backend: &Arc<BackendState>,
        endpoint: &Arc<Endpoint>,
        max: Option<u64>,
        sample: Option<SampleClaim>,
    ) -> Option<Dispatch> {
        let claimed = match max {
            None => {
                backend.outstanding.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(max) => backend
                .outstanding
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
                .is_ok(),
        };
        claimed.then(|| {
            endpoint.outstanding.fetch_add(1, Ordering::Relaxed);
            Dispatch { backend: backend.clone(), endpoint: endpoint.clone(), sample }
        })
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The request's outcome, told to its endpoint's breaker.
    pub fn report(&self, ok: bool) {
        self.endpoint.report(ok);
    }

    /// The request fails over: its record will name the backend it ends at, so it brings no
    /// sample of this one.
    pub fn no_sample(&mut self) {
        self.sample = None;
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        self.backend.outstanding.fetch_sub(1, Ordering::Relaxed);
        self.endpoint.outstanding.fetch_sub(1, Ordering::Relaxed);
        if let Some(claim) = self.sample.take() {
            // The time first: a decision that sees none due sees when the last one ended.
            self.backend.last_sample_ms.store(mono_ms(), Ordering::Relaxed);
            drop(claim);
        }
    }
}

/// How long a request's sample stays in the statistics the router reads: the local latency
/// window, or the PromQL range when they come from Prometheus. A backend with no sample, and none
/// due within that span, is not held back.
fn sample_window_secs(cfg: &crate::config::Config, remote: bool) -> u64 {
    match remote {
        true => cfg.routing.stats.range_secs().unwrap_or(cfg.metrics.window_secs),
        false => cfg.metrics.window_secs,
    }
}

/// Milliseconds on a monotonic clock that starts at 1 (0 stands for "never").
fn mono_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// A decision as the log keeps it: its inputs, so that the request path does not format the
/// explanation that few decisions are ever read for.
#[derive(Clone)]
struct Logged {
    unix_ms: u64,
    route: Arc<str>,
    class_name: Arc<str>,
    backend: Arc<str>,
    reason: Reason,
    class: Class,
    cands: Vec<Candidate>,
    policy: Policy,
    draw: Draw,
    /// The decision function found no usable backend; the least loaded one was taken.
    least_loaded: bool,
    /// Backends that failed to connect before this choice.
    failover_from: Vec<Arc<str>>,
    /// The choice within the backend's pool, when it has several endpoints.
    pool: Option<LoggedPick>,
    /// The endpoint the request went to.
    endpoint: Option<Arc<str>>,
}

#[derive(Clone)]
struct LoggedPick {
    settings: crate::config::PoolSettings,
    views: Vec<EndpointView>,
    blocks: u32,
    draw: Draw,
}

impl Logged {
    /// The explanation the decision had: `decide` is pure, so the same inputs give the words
    /// of the choice that was made.
    fn explain(&self) -> DecisionLog {
        let mut explanation = decide(&self.class, &self.cands, &self.policy, self.draw).explanation;
        if self.least_loaded {
            explanation = format!("{explanation}; sent to the least loaded: {}", self.backend);
        }
        if !self.failover_from.is_empty() {
            let from: Vec<&str> = self.failover_from.iter().map(|n| &**n).collect();
            explanation = format!("failover from {} (connect failed): {explanation}", from.join(", "));
        }
        let (endpoint_reason, endpoint_explanation) = match &self.pool {
            Some(p) => {
                let k = super::pool::pick(&p.settings, &p.views, p.blocks, p.draw);
                (Some(k.reason.as_str()), Some(k.explanation))
            }
            None => (None, None),
        };
        DecisionLog {
            unix_ms: self.unix_ms,
            route: self.route.clone(),
            class: self.class_name.clone(),
            backend: self.backend.clone(),
            reason: self.reason.as_str(),
            explanation,
            endpoint: self.endpoint.clone(),
            endpoint_reason,
            endpoint_explanation,
        }
    }
}

/// A decision as /admin/routes and the status page show it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionLog {
    pub unix_ms: u64,
    pub route: Arc<str>,
    pub class: Arc<str>,
    pub backend: Arc<str>,
    pub reason: &'static str,
    pub explanation: String,
    /// The endpoint within the backend's pool, and why that one (pools of several only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_explanation: Option<String>,
}

/// A routing choice: the backend's index in the snapshot, its endpoint and the reasons.
pub struct Choice {
    pub backend: usize,
    pub reason: Reason,
    /// `None`: the backend has no endpoint left for this request (its pool is empty, or each
    /// one failed it already).
    pub endpoint: Option<Arc<Endpoint>>,
    pub pick: PickReason,
    /// Every usable candidate is at its max_concurrency: the request must be refused (503 +
    /// Retry-After), not queued inside the proxy. `backend` is then meaningless.
    pub at_capacity: bool,
    /// Every endpoint of every candidate is saturated and the class sheds: refuse with 429.
    pub shed: Option<String>,
    /// A metered request's sample of the chosen backend, for [`Dispatch::try_start`]; the
    /// first one of an unmeasured backend is won by one choice only (`SampleClaim::first`).
    /// Dropped unused, it frees the backend for the next choice.
    pub sample: Option<SampleClaim>,
}

impl Choice {
    fn refused(at_capacity: bool, shed: Option<String>) -> Choice {
        Choice {
            backend: 0,
            reason: Reason::NoHealthyBackend,
            endpoint: None,
            pick: PickReason::NoHealthyEndpoint,
            at_capacity,
            shed,
            sample: None,
        }
    }
}

/// What one choice needs to know of the request beyond the route.
pub struct Ask<'a> {
    pub slo: SloHeaders,
    pub id: u64,
    /// Backends (snapshot indices) with no endpoint left for this request.
    pub tried: &'a [usize],
    /// Endpoints that failed to connect for it.
    pub tried_endpoints: &'a [Arc<Endpoint>],
    /// The prompt's JSON text, for prefix affinity.
    pub prompt: Option<&'a [u8]>,
    /// The recorder's per-endpoint windows, by backend then endpoint label.
    pub endpoint_windows: &'a EndpointWindows,
    /// The recorder's drift signals.
    pub drift: &'a DriftView,
    /// The request is metered: its record will be a latency sample of the backend chosen.
    pub sample: bool,
}

pub use crate::meter::window::EndpointWindows;

pub struct Router {
    decisions: Mutex<VecDeque<Logged>>,
    metric: prometheus::IntCounterVec,
    /// `goodput_endpoint_decisions_total{backend, endpoint, reason}`.
    endpoint_metric: Option<prometheus::IntCounterVec>,
    /// Statistics read back from Prometheus; `None`: the local windows.
    remote: ArcSwapOption<HashMap<String, Stats>>,
}

/// Per-request SLO overrides (`x-slo-ttft-ms`, `x-slo-tpot-ms`, as in the Gateway API
/// Inference Extension).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloHeaders {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

static X_SLO_TTFT_MS: http::HeaderName = http::HeaderName::from_static("x-slo-ttft-ms");
static X_SLO_TPOT_MS: http::HeaderName = http::HeaderName::from_static("x-slo-tpot-ms");

impl SloHeaders {
    pub fn from(h: &http::HeaderMap) -> SloHeaders {
        let ms = |name: &http::HeaderName| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        SloHeaders { ttft_ms: ms(&X_SLO_TTFT_MS), tpot_ms: ms(&X_SLO_TPOT_MS) }
    }

    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none()
    }

    pub fn apply(&self, class: &Class) -> Class {
        let mut c = class.clone();
        c.ttft_p95_ms = self.ttft_ms.or(c.ttft_p95_ms);
        c.tpot_p95_ms = self.tpot_ms.or(c.tpot_p95_ms);
        c
    }
}

/// A backend's windowed statistics as the decision function reads them.
pub fn stats_of(w: &WindowSnapshot) -> Stats {
    let ms = |s: Option<f64>| s.map(|v| v * 1000.0);
    Stats {
        samples: w.counts.requests,
        ttft_p95_ms: ms(w.ttft.p95),
        tpot_p95_ms: ms(w.tpot.p95),
        e2e_p95_ms: ms(w.e2e.p95),
        tokens_per_sec: w.output_tokens_per_sec,
        scored: w.quality.scored,
        perplexity: w.quality.perplexity_geomean,
        rated: w.quality.consistency_rated,
        hallucination_rate: w.quality.hallucination_rate,
        hallucination_rate_lower: w.quality.hallucination_rate_interval.map(|i| i.0),
    }
}

/// Cheap deterministic draws from the request id (splitmix64): decisions replay in tests.
pub fn draw(id: u64) -> Draw {
    let mut s = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let explore = (next() >> 11) as f64 / (1u64 << 53) as f64;
    Draw { explore, a: next() as usize, b: next() as usize }
}

impl Router {
    pub fn new(metric: prometheus::IntCounterVec) -> Router {
        Router {
            decisions: Mutex::new(VecDeque::new()),
            metric,
            endpoint_metric: None,
            remote: ArcSwapOption::empty(),
        }
    }

    /// Count choices within pools in this metric too.
    pub fn with_endpoint_metric(mut self, m: prometheus::IntCounterVec) -> Router {
        self.endpoint_metric = Some(m);
        self
    }

    /// Statistics from Prometheus replace the local windows (`None` goes back to them).
    pub fn set_remote_stats(&self, stats: Option<HashMap<String, Stats>>) {
        self.remote.store(stats.map(Arc::new));
    }

    pub fn remote_stats(&self) -> Option<Arc<HashMap<String, Stats>>> {
        self.remote.load_full()
    }

    /// The candidates of a route as the decision function sees them.
    pub fn candidates(
        &self,
        snap: &Snapshot,
        route: &ResolvedRoute,
        local: &HashMap<String, WindowSnapshot>,
        drift: &DriftView,
    ) -> Vec<Candidate> {
        let remote = self.remote.load();
        let now = Instant::now();
        let on = &snap.config.quality.drift.drain_on;
        let drain = !on.is_empty() && !drift.backends.is_empty();
        let window_ms = sample_window_secs(&snap.config, remote.is_some()).saturating_mul(1000);
        route
            .candidates
            .iter()
            .map(|&i| {
                let b = &snap.backends[i];
                let stats = match remote.as_deref() {
                    Some(r) => r.get(&*b.name).cloned().unwrap_or_default(),
                    None => local.get(&*b.name).map(stats_of).unwrap_or_default(),
                };
                let awaiting_sample = stats.samples == 0 && b.state.sample_due(window_ms);
                Candidate {
                    name: b.name.clone(),
                    healthy: b.state.healthy(now),
                    saturated: b.state.saturated(&b.pool, now),
                    outstanding: b.state.outstanding(),
                    awaiting_sample,
                    max_concurrency: b.max_concurrency,
                    price_input: b.price.input_per_1m,
                    price_output: b.price.output_per_1m,
                    stats,
                    degraded: if drain { drift.backend(&b.name, on).map(Degraded::from) } else { None },
                }
            })
            .collect()
    }

    /// Choose a backend for one request, then an endpoint of its pool. Backends in
    /// `ask.tried` are out and the choice's reason becomes `failover`. When no candidate is
    /// usable (every circuit open, at its limit or saturated) the request still goes to the
    /// least loaded one, reason `no_healthy_backend`: goodput adds no failure mode of its own,
    /// and the upstream's answer is what the client gets; a class that sheds refuses instead.
    pub fn choose(
        &self,
        snap: &Snapshot,
        route: &ResolvedRoute,
        local: &HashMap<String, WindowSnapshot>,
        ask: &Ask<'_>,
    ) -> Choice {
        let tried = ask.tried;
        let mut cands = self.candidates(snap, route, local, ask.drift);
        for (k, &i) in route.candidates.iter().enumerate() {
            if tried.contains(&i) {
                cands[k].healthy = false;
            }
        }
        let class = if ask.slo.is_empty() { route.class.clone() } else { ask.slo.apply(&route.class) };
        let draw = draw(ask.id ^ tried.len() as u64 ^ ((ask.tried_endpoints.len() as u64) << 32));
        // Before the decision: a predicted wait past the TTFT objective sheds too, and that
        // does not make a backend unusable for the decision.
        if let Some(why) = self.shed(snap, route, ask, &class) {
            return Choice::refused(false, Some(why));
        }
        let Some(Decided { k, reason, least_loaded, sample }) =
            decide_and_claim(&class, &mut cands, snap, route, ask, draw)
        else {
            return Choice::refused(true, None);
        };
        let reason =
            if tried.is_empty() && ask.tried_endpoints.is_empty() { reason } else { Reason::Failover };
        let backend = route.candidates[k];
        let b = &snap.backends[backend];
        let blocks = match ask.prompt {
            Some(p) if b.is_pool && b.pool.weights.prefix > 0.0 => {
                super::pool::prompt_blocks(p, b.pool.prefix.block_bytes, b.pool.prefix.max_prompt_blocks)
            }
            _ => Vec::new(),
        };
        let PoolPick { endpoint, reason: pick, views, draw: pool_draw } =
            pick_endpoint(snap, b, ask, &blocks);
        let counter = || self.metric.with_label_values(&[&*route.name, &*b.name, reason.as_str()]);
        match route.decided.get(k * Reason::COUNT + reason as usize) {
            Some(c) => c.get_or_init(counter).inc(),
            None => counter().inc(),
        }
        if let (Some(e), Some(m)) = (&endpoint, &self.endpoint_metric) {
            e.decided[pick as usize]
                .get_or_init(|| m.with_label_values(&[&*b.name, &*e.label, pick.as_str()]))
                .inc();
        }
        let keep = snap.config.routing.recent_decisions;
        if keep > 0 {
            let entry = Logged {
                unix_ms: crate::meter::record::unix_ms(),
                route: route.name.clone(),
                class_name: route.class_name.clone(),
                backend: b.name.clone(),
                reason,
                class,
                cands,
                policy: snap.policy,
                draw,
                least_loaded,
                failover_from: tried.iter().map(|&i| snap.backends[i].name.clone()).collect(),
                endpoint: endpoint.as_ref().map(|e| e.label.clone()),
                pool: (!views.is_empty()).then(|| LoggedPick {
                    settings: b.pool.clone(),
                    views,
                    blocks: blocks.len() as u32,
                    draw: pool_draw,
                }),
            };
            let mut q = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
            q.push_back(entry);
            while q.len() > keep {
                q.pop_front();
            }
        }
        Choice { backend, reason, endpoint, pick, at_capacity: false, shed: None, sample }
    }

    /// Why a request of a class that sheds is refused: every endpoint of every candidate
    /// backend is saturated, or would keep it waiting past its TTFT objective (the queue ×
    /// the time a queued request waits there, from goodput's measurements: e2e p50 / the
    /// running batch). `None`: send it.
    fn shed(&self, snap: &Snapshot, route: &ResolvedRoute, ask: &Ask<'_>, class: &Class) -> Option<String> {
        if !route.shed {
            return None;
        }
        let now = Instant::now();
        let slo_ttft = ask.slo.ttft_ms.or(class.ttft_p95_ms);
        let mut worst = Vec::new();
        for &i in &route.candidates {
            let b = &snap.backends[i];
            let windows = ask.endpoint_windows.get(&*b.name);
            for e in b.state.endpoints().iter() {
                let v = e.view(now, 0, None);
                if !v.healthy {
                    continue;
                }
                if v.saturated(&b.pool) {
                    worst.push(format!("{}/{} saturated", b.name, e.label));
                    continue;
                }
                let w = windows
                    .and_then(|w| w.get(&*e.label))
                    .filter(|w| w.counts.requests >= snap.policy.min_samples);
                let predicted = match (v.waiting, w.and_then(|w| w.e2e.p50), w.and_then(|w| w.ttft.p50)) {
                    (Some(q), Some(e2e), Some(ttft)) => {
                        Some((q * e2e / v.running.unwrap_or(1.0).max(1.0) + ttft) * 1000.0)
                    }
                    _ => None,
                };
                match (predicted, slo_ttft) {
                    (Some(p), Some(slo)) if p > slo => {
                        worst.push(format!("{}/{} predicted TTFT {p:.0} ms > {slo:.0} ms", b.name, e.label))
                    }
                    // Room somewhere: send it.
                    _ => return None,
                }
            }
        }
        (!worst.is_empty()).then(|| worst.join("; "))
    }

    /// The most recent decisions, newest first.
    pub fn recent(&self, limit: usize) -> Vec<DecisionLog> {
        // Explained outside the lock: the request path takes it for every decision.
        let logged: Vec<Logged> = {
            let q = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
            q.iter().rev().take(limit).cloned().collect()
        };
        logged.iter().map(Logged::explain).collect()
    }
}

/// A decision, and the latency sample it claims where the request is metered.
struct Decided {
    /// The candidate chosen.
    k: usize,
    reason: Reason,
    /// The decision found no usable candidate and the least loaded one was taken.
    least_loaded: bool,
    sample: Option<SampleClaim>,
}

/// The decision over `cands`; `None`: every candidate not yet tried is at its concurrency
/// limit, and the request must be refused. When no candidate is usable otherwise (every circuit
/// open or saturated) the least loaded is taken: open circuits do not refuse (the upstream's
/// answer is what the client gets), but a configured concurrency limit is a promise to the
/// backend.
fn decide_and_claim(
    class: &Class,
    cands: &mut [Candidate],
    snap: &Snapshot,
    route: &ResolvedRoute,
    ask: &Ask<'_>,
    draw: Draw,
) -> Option<Decided> {
    loop {
        let d = choose(class, cands, &snap.policy, draw);
        let (k, reason) = match d.backend {
            Some(k) => (k, d.reason),
            None => {
                let has_room =
                    |k: &usize| cands[*k].max_concurrency.is_none_or(|m| cands[*k].outstanding < m);
                let k = (0..cands.len())
                    .filter(|k| !ask.tried.contains(&route.candidates[*k]) && has_room(k))
                    .min_by_key(|&k| cands[k].outstanding)?;
                (k, Reason::NoHealthyBackend)
            }
        };
        let least_loaded = d.backend.is_none();
        let (c, state) = (&cands[k], &snap.backends[route.candidates[k]].state);
        let sample = if !ask.sample {
            None
        } else if c.stats.samples > 0 || c.awaiting_sample {
            Some(SampleClaim::new(state))
        } else {
            match SampleClaim::first(state) {
                Some(claim) => Some(claim),
                // Another decision claimed it since the candidates were read: decide again as
                // it would now (at most once per candidate, since a held one is never claimed).
                None => {
                    cands[k].awaiting_sample = true;
                    continue;
                }
            }
        };
        return Some(Decided { k, reason, least_loaded, sample });
    }
}

/// The endpoint within backend `b`'s pool, from goodput's trusted per-endpoint TTFT windows and
/// the drift that drains.
fn pick_endpoint(snap: &Snapshot, b: &ResolvedBackend, ask: &Ask<'_>, blocks: &[u64]) -> PoolPick {
    let min = snap.policy.min_samples;
    let windows = ask.endpoint_windows.get(&*b.name);
    let ttft = |label: &str| {
        windows?.get(label).filter(|w| w.counts.requests >= min).and_then(|w| w.ttft.p95).map(|s| s * 1000.0)
    };
    let on = &snap.config.quality.drift.drain_on;
    // The pool's drift, looked up once per choice (none: nothing drains).
    let pool_drift = if on.is_empty() { None } else { ask.drift.endpoints.get(&*b.name) };
    let degraded = |label: &str| confident(pool_drift?.get(label)?, on).map(Degraded::from);
    let pool_ask = PoolAsk {
        settings: &b.pool,
        blocks,
        ttft_p95_ms: &ttft,
        degraded: &degraded,
        tried: ask.tried_endpoints,
    };
    b.state.pick(&pool_ask, draw(ask.id.rotate_left(17) ^ ask.tried_endpoints.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_the_port_only_when_it_is_not_the_schemes_default() {
        let host = |scheme: &str, authority: &str| {
            host_header(&scheme.parse().unwrap(), &authority.parse().unwrap()).unwrap()
        };
        assert_eq!(host("http", "vllm:8000"), "vllm:8000");
        assert_eq!(host("http", "vllm:80"), "vllm");
        assert_eq!(host("http", "vllm"), "vllm");
        assert_eq!(host("https", "vllm:443"), "vllm");
        assert_eq!(host("https", "vllm:80"), "vllm:80");
        assert_eq!(host("http", "[::1]:8000"), "[::1]:8000");
        assert_eq!(host("http", "user@vllm:8000"), "vllm:8000");
    }

    #[test]
    fn draws_are_deterministic_and_uniform() {
        assert_eq!(draw(7), draw(7));
        let n = 20_000;
        let below = (0..n).filter(|i| draw(*i).explore < 0.05).count();
        assert!((800..1200).contains(&below), "{below}");
    }

    #[test]
    fn a_sample_is_due_while_a_metered_request_is_in_flight_and_for_a_window_after() {
        let backend = BackendState::new(BreakerConfig::default());
        backend.set_endpoints(vec![("http".parse().unwrap(), "127.0.0.1:1".parse().unwrap())]);
        let ep = backend.endpoints();
        assert!(!backend.sample_due(60_000), "never sent to");
        let unmetered = Dispatch::try_start(&backend, &ep[0], None, None).unwrap();
        assert!(!backend.sample_due(60_000), "an unmetered request brings no sample");
        drop(unmetered);
        assert!(!backend.sample_due(60_000));
        let metered =
            || Dispatch::try_start(&backend, &ep[0], None, Some(SampleClaim::new(&backend))).unwrap();
        let mut d = metered();
        assert!(backend.sample_due(0), "in flight, whatever the window");
        d.no_sample();
        assert!(!backend.sample_due(60_000), "failed over: its record names another backend");
        drop(d);
        assert!(!backend.sample_due(60_000), "a request that failed over ended here unmeasured");
        drop(metered());
        assert!(backend.sample_due(60_000), "ended just now: its record is on its way");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!backend.sample_due(10), "ended longer ago than the window");
    }

    /// Two unmeasured backends, `a` the cheaper, for a class that wants the cheapest; no
    /// exploration, which may reach a backend whatever its state.
    async fn two_new_backends(test: &str) -> (Arc<crate::config::reload::ConfigHandle>, Router) {
        let dir = std::env::temp_dir().join(format!("goodput-router-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{test}.yaml"));
        std::fs::write(
            &path,
            "backends:\n  - {name: a, url: \"http://127.0.0.1:9\", price: {input_per_1m: 1, output_per_1m: 1}}\n\
             \x20 - {name: b, url: \"http://127.0.0.1:10\", price: {input_per_1m: 2, output_per_1m: 2}}\n\
             classes:\n  c: {ttft_p95_ms: 1000, objective: cheapest}\nrouting: {default_class: c, exploration: 0}\n",
        )
        .unwrap();
        let reloads = prometheus::IntCounterVec::new(prometheus::Opts::new("r", "r"), &["result"]).unwrap();
        let config =
            crate::config::reload::ConfigHandle::start(Some(path), None, reloads, Default::default())
                .await
                .expect("config");
        let metric =
            prometheus::IntCounterVec::new(prometheus::Opts::new("d", "d"), &["route", "backend", "reason"])
                .unwrap();
        (config, Router::new(metric))
    }

    fn decide_one(router: &Router, snap: &Snapshot, id: u64, sample: bool) -> (String, Option<SampleClaim>) {
        let (endpoints, drift) = (EndpointWindows::default(), DriftView::default());
        let ask = Ask {
            slo: SloHeaders::default(),
            id,
            tried: &[],
            tried_endpoints: &[],
            prompt: None,
            endpoint_windows: &endpoints,
            drift: &drift,
            sample,
        };
        let c = router.choose(snap, &snap.default_route, &HashMap::new(), &ask);
        (snap.backends[c.backend].name.to_string(), c.sample)
    }

    #[tokio::test]
    async fn a_choice_claims_a_new_backends_first_sample() {
        let (config, router) = two_new_backends("claims").await;
        let snap = config.load_full();
        let (b, unmetered) = decide_one(&router, &snap, 1, false);
        assert_eq!((b.as_str(), unmetered.is_some()), ("a", false), "an unmetered request claims nothing");
        let (b, first) = decide_one(&router, &snap, 2, true);
        assert_eq!((b.as_str(), first.is_some()), ("a", true));
        // Before it is dispatched, the next decision sees `a`'s sample on its way.
        let (b, second) = decide_one(&router, &snap, 3, true);
        assert_eq!((b.as_str(), second.is_some()), ("b", true));
        // Both on their way: nothing is learned by holding either back. The third is a second
        // sample of `a`, not its first.
        let samples_due = |i: usize| snap.backends[i].state.samples_due.load(Ordering::Relaxed);
        let (b, third) = decide_one(&router, &snap, 4, true);
        assert_eq!((b.as_str(), third.is_some(), samples_due(0)), ("a", true, 2));
        drop(third);
        // A claim dropped undispatched (a refusal, a full backend) frees the backend.
        drop(first);
        let (b, again) = decide_one(&router, &snap, 5, true);
        assert_eq!((b.as_str(), again.is_some()), ("a", true));
        // Dispatched, the claim is the request's sample until it ends.
        let a = &snap.backends[0].state;
        let d = Dispatch::try_start(a, &a.endpoints()[0], None, again).unwrap();
        assert!(a.sample_due(0));
        drop(d);
        assert_eq!(samples_due(0), 0, "claimed once, released once");
        drop(second);
        assert_eq!(samples_due(1), 0);
    }

    /// Decisions at the same moment on two threads, as on two tokio workers: only one of them
    /// probes `a`, whichever reads the candidates first.
    #[tokio::test]
    async fn concurrent_decisions_send_one_probe_per_new_backend() {
        let (config, router) = two_new_backends("concurrent").await;
        let snap = config.load_full();
        let (router, snap) = (&router, &*snap);
        let barrier = std::sync::Barrier::new(2);
        for round in 0..300u64 {
            let (x, y) = std::thread::scope(|s| {
                let go = |id: u64| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        decide_one(router, snap, id, true)
                    })
                };
                let (x, y) = (go(2 * round), go(2 * round + 1));
                (x.join().unwrap(), y.join().unwrap())
            });
            assert_ne!(x.0, y.0, "round {round}: both probed {}", x.0);
            assert!(x.1.is_some() && y.1.is_some(), "round {round}");
        }
    }

    #[test]
    fn the_hold_lasts_the_span_the_statistics_cover() {
        let cfg = |yaml: &str| {
            crate::config::Config::from_yaml(&format!(
                "backends:\n  - name: a\n    url: http://127.0.0.1:8000\nmetrics: {{window_secs: 30}}\n{yaml}"
            ))
            .unwrap()
        };
        assert_eq!(sample_window_secs(&cfg(""), false), 30);
        let prom =
            cfg("routing:\n  stats: {source: prometheus, prometheus_url: \"http://p:9090\", range: 5m}\n");
        assert_eq!(sample_window_secs(&prom, true), 300);
        assert_eq!(sample_window_secs(&prom, false), 30, "fallen back to the local windows");
    }

    #[test]
    fn slo_headers_override_the_class() {
        let mut h = http::HeaderMap::new();
        h.insert("x-slo-ttft-ms", "250".parse().unwrap());
        h.insert("x-slo-tpot-ms", "nope".parse().unwrap());
        let s = SloHeaders::from(&h);
        assert_eq!(s, SloHeaders { ttft_ms: Some(250.0), tpot_ms: None });
        let c = Class {
            ttft_p95_ms: Some(1000.0),
            tpot_p95_ms: Some(40.0),
            e2e_p95_ms: None,
            max_perplexity: None,
            max_hallucination_rate: None,
            objective: super::super::Objective::Cheapest,
        };
        let a = s.apply(&c);
        assert_eq!((a.ttft_p95_ms, a.tpot_p95_ms), (Some(250.0), Some(40.0)));
    }
}
