//! The router at run time: per-backend state (requests outstanding, circuit breaker) that
//! survives config reloads, the decision log, and the statistics the decisions read (this
//! process's windows, or Prometheus's view in multi-replica mode).

use arc_swap::ArcSwapOption;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::breaker::{Breaker, BreakerConfig};
use super::decide::{Candidate, Class, Decision, Draw, Policy, Reason, Stats, choose, decide};
use crate::config::reload::{ResolvedRoute, Snapshot};
use crate::meter::window::WindowSnapshot;

/// What the router knows of one backend beyond its statistics. Shared by every config
/// snapshot that has a backend of this name, so a reload keeps the counts and the breaker.
pub struct BackendState {
    outstanding: AtomicU64,
    breaker: Mutex<Breaker>,
    /// What the server reports about itself (route::server keeps it current).
    pub server: super::server::ServerSignals,
}

impl BackendState {
    pub fn new(cfg: BreakerConfig) -> Arc<BackendState> {
        Arc::new(BackendState {
            outstanding: AtomicU64::new(0),
            breaker: Mutex::new(Breaker::new(cfg, Instant::now())),
            server: Default::default(),
        })
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_breaker_config(&self, cfg: BreakerConfig) {
        self.breaker().set_config(cfg);
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
}

/// One request counted as outstanding at a backend until this is dropped (with the response
/// body, so a stream counts until its end).
pub struct Dispatch(Arc<BackendState>);

impl Dispatch {
    pub fn start(state: &Arc<BackendState>) -> Dispatch {
        state.outstanding.fetch_add(1, Ordering::Relaxed);
        Dispatch(state.clone())
    }

    /// Count the request unless the backend already has `max` outstanding: a hard limit,
    /// since two requests cannot both take the last slot.
    pub fn try_start(state: &Arc<BackendState>, max: Option<u64>) -> Option<Dispatch> {
        let Some(max) = max else { return Some(Self::start(state)) };
        state
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Dispatch(state.clone()))
    }

    pub fn state(&self) -> &BackendState {
        &self.0
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
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
        DecisionLog {
            unix_ms: self.unix_ms,
            route: self.route.clone(),
            class: self.class_name.clone(),
            backend: self.backend.clone(),
            reason: self.reason.as_str(),
            explanation,
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
}

/// A routing choice: the backend's index in the snapshot and the reason.
pub struct Choice {
    pub backend: usize,
    pub reason: Reason,
    /// Every usable candidate is at its max_concurrency: the request must be refused (503 +
    /// Retry-After), not queued inside the proxy. `backend` is then meaningless.
    pub at_capacity: bool,
}

pub struct Router {
    decisions: Mutex<VecDeque<Logged>>,
    metric: prometheus::IntCounterVec,
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
        checked: w.quality.consistency_checked,
        hallucination_rate: w.quality.hallucination_rate,
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
        Router { decisions: Mutex::new(VecDeque::new()), metric, remote: ArcSwapOption::empty() }
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
    ) -> Vec<Candidate> {
        let remote = self.remote.load();
        let now = Instant::now();
        route
            .candidates
            .iter()
            .map(|&i| {
                let b = &snap.backends[i];
                let stats = match remote.as_deref() {
                    Some(r) => r.get(&*b.name).cloned().unwrap_or_default(),
                    None => local.get(&*b.name).map(stats_of).unwrap_or_default(),
                };
                Candidate {
                    name: b.name.clone(),
                    healthy: b.state.healthy(now),
                    outstanding: b.state.outstanding(),
                    max_concurrency: b.max_concurrency,
                    price_input: b.price.input_per_1m,
                    price_output: b.price.output_per_1m,
                    stats,
                }
            })
            .collect()
    }

    /// Choose a backend for one request. `tried` are backends (snapshot indices) that already
    /// failed to connect for it: they are out, and the choice's reason becomes `failover`.
    /// When no candidate is usable (every circuit open or at its limit) the request still goes
    /// to the least loaded one, reason `no_healthy_backend`: goodput adds no failure mode of
    /// its own, and the upstream's answer is what the client gets.
    pub fn choose(
        &self,
        snap: &Snapshot,
        route: &ResolvedRoute,
        slo: SloHeaders,
        local: &HashMap<String, WindowSnapshot>,
        id: u64,
        tried: &[usize],
    ) -> Choice {
        let mut cands = self.candidates(snap, route, local);
        for (k, &i) in route.candidates.iter().enumerate() {
            if tried.contains(&i) {
                cands[k].healthy = false;
            }
        }
        let class = if slo.is_empty() { route.class.clone() } else { slo.apply(&route.class) };
        let draw = draw(id ^ tried.len() as u64);
        let d: Decision = choose(&class, &cands, &snap.policy, draw);
        let (k, mut reason) = match d.backend {
            Some(k) => (k, d.reason),
            None => {
                // Open circuits do not refuse (the upstream's answer is what the client
                // gets), but a configured concurrency limit is a promise to the backend.
                let has_room =
                    |k: &usize| cands[*k].max_concurrency.is_none_or(|m| cands[*k].outstanding < m);
                let Some(k) = (0..cands.len())
                    .filter(|k| !tried.contains(&route.candidates[*k]) && has_room(k))
                    .min_by_key(|&k| cands[k].outstanding)
                else {
                    return Choice { backend: 0, reason: Reason::NoHealthyBackend, at_capacity: true };
                };
                (k, Reason::NoHealthyBackend)
            }
        };
        if !tried.is_empty() {
            reason = Reason::Failover;
        }
        let backend = route.candidates[k];
        let b = &snap.backends[backend];
        b.state.breaker().allow(Instant::now());
        let counter = || self.metric.with_label_values(&[&*route.name, &*b.name, reason.as_str()]);
        match route.decided.get(k * Reason::COUNT + reason as usize) {
            Some(c) => c.get_or_init(counter).inc(),
            None => counter().inc(),
        }
        let keep = snap.config.routing.recent_decisions;
        if keep > 0 {
            let log = Logged {
                unix_ms: crate::meter::record::unix_ms(),
                route: route.name.clone(),
                class_name: route.class_name.clone(),
                backend: b.name.clone(),
                reason,
                class,
                cands,
                policy: snap.policy,
                draw,
                least_loaded: d.backend.is_none(),
                failover_from: tried.iter().map(|&i| snap.backends[i].name.clone()).collect(),
            };
            let mut q = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
            q.push_back(log);
            while q.len() > keep {
                q.pop_front();
            }
        }
        Choice { backend, reason, at_capacity: false }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_uniform() {
        assert_eq!(draw(7), draw(7));
        let n = 20_000;
        let below = (0..n).filter(|i| draw(*i).explore < 0.05).count();
        assert!((800..1200).contains(&below), "{below}");
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
