//! Choosing a replica within a backend's pool, after the SLA class has chosen the backend:
//! what the Gateway API Inference Extension's endpoint picker and llm-d's scheduler do, with
//! goodput's own measurements beside the servers' reports.
//!
//! 1. Filter: endpoints whose breaker is open (or that already failed this request) are out;
//!    endpoints whose server reports a queue or KV cache past its threshold are saturated and
//!    out while any other is left. A signal that is unknown (the scrape failed or went stale)
//!    does not disqualify.
//! 2. Drain: endpoints whose quality has confidently drifted from their peers'
//!    (`quality::drift`) are out while any other is left, except for a `degraded_probe` share
//!    of choices that keeps scoring them, so that one that recovers comes back.
//! 3. Score the rest, each signal 0-1 across the pool, weighted: queue (the server's waiting +
//!    running, or goodput's own outstanding count when that is higher or the server's is
//!    unknown), KV-cache headroom, prefix affinity (the share of the prompt's leading blocks
//!    recently sent there) and goodput's measured TTFT p95 (trusted windows only).
//! 4. The best; near-ties go to the less loaded of two drawn (power of two choices).
//!
//! `pick` is pure: views and draws come in as arguments, so each choice replays in a test and
//! the decision log explains it after the fact.

use serde::Serialize;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;

use super::decide::{Degraded, Draw, Notes};
use crate::config::{PoolPolicy, PoolSettings};

/// One endpoint as a choice sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointView {
    pub label: Arc<str>,
    /// The breaker lets a request through, and this request has not failed there already.
    pub healthy: bool,
    /// Requests goodput has sent there and not seen finish.
    pub outstanding: u64,
    /// What its server reports (`None`: unknown).
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_cache: Option<f64>,
    /// The prompt's leading blocks recently sent there.
    pub matched: u32,
    /// goodput's TTFT p95 of the endpoint, when its window has enough samples.
    pub ttft_p95_ms: Option<f64>,
    /// Its quality has confidently drifted from its peers'.
    pub degraded: Option<Degraded>,
}

impl EndpointView {
    /// The requests the endpoint holds: its server's count, or goodput's own when higher (the
    /// scrape lags what goodput sent since) or when the server's is unknown.
    pub fn load(&self) -> f64 {
        let server = match (self.waiting, self.running) {
            (None, None) => None,
            (w, r) => Some(w.unwrap_or(0.0) + r.unwrap_or(0.0)),
        };
        server.map_or(self.outstanding as f64, |s| s.max(self.outstanding as f64))
    }

    fn known(&self) -> bool {
        self.waiting.is_some() || self.running.is_some() || self.kv_cache.is_some()
    }

    pub fn saturated(&self, p: &PoolSettings) -> bool {
        self.saturation(p).is_some()
    }

    fn saturation(&self, p: &PoolSettings) -> Option<String> {
        if let Some(w) = self.waiting.filter(|w| *w > p.max_waiting) {
            return Some(format!("{w:.0} waiting > {:.0}", p.max_waiting));
        }
        if let Some(k) = self.kv_cache.filter(|k| *k > p.max_kv_cache) {
            return Some(format!("KV cache {:.0}% > {:.0}%", k * 100.0, p.max_kv_cache * 100.0));
        }
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PickReason {
    /// The pool has one usable endpoint.
    OnlyEndpoint,
    /// The longest run of the prompt's blocks was sent there.
    PrefixHit,
    LeastQueue,
    KvHeadroom,
    LowestLatency,
    /// The scores were within `near_tie`: the less loaded of two drawn.
    NearTie,
    /// No endpoint's server reported its state: goodput's own counts decided.
    FallbackUnknown,
    /// Every healthy endpoint is saturated: the least loaded.
    AllSaturated,
    /// No endpoint's breaker lets a request through: the least loaded (goodput adds no
    /// failure mode; the upstream's answer is what the client gets).
    NoHealthyEndpoint,
    /// An endpoint whose quality drifted was drained from this choice.
    QualityDegraded,
    /// The `degraded_probe` share: a drained endpoint, so that its scores stay fresh.
    QualityProbe,
    /// `policy: round_robin`.
    RoundRobin,
    /// `policy: least_outstanding`.
    LeastOutstanding,
}

impl PickReason {
    pub const COUNT: usize = 13;

    /// Every reason's name, in declaration order.
    pub const NAMES: [&'static str; PickReason::COUNT] = [
        "only_endpoint",
        "prefix_hit",
        "least_queue",
        "kv_headroom",
        "lowest_latency",
        "near_tie",
        "fallback_unknown",
        "all_saturated",
        "no_healthy_endpoint",
        "quality_degraded",
        "quality_probe",
        "round_robin",
        "least_outstanding",
    ];

    pub fn as_str(self) -> &'static str {
        PickReason::NAMES[self as usize]
    }
}

const _: () = assert!(PickReason::LeastOutstanding as usize + 1 == PickReason::COUNT);

#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// Index into the views; `None` when the pool is empty or every endpoint failed already.
    pub index: Option<usize>,
    pub reason: PickReason,
    pub explanation: String,
}

type Idx = SmallVec<[usize; 16]>;

/// Min-max scaled so that the best is 1 and the worst 0 (`lower_is_better`); all 1 when they
/// are equal. Unknown values score the mean of the known ones, so that they neither win nor
/// lose on that signal.
fn scaled(xs: &[Option<f64>], lower_is_better: bool) -> SmallVec<[f64; 16]> {
    let known = xs.iter().flatten();
    let (lo, hi) = known.clone().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
    let s = |x: f64| {
        if hi > lo {
            let t = (x - lo) / (hi - lo);
            if lower_is_better { 1.0 - t } else { t }
        } else {
            1.0
        }
    };
    let n = known.clone().count();
    let mean = if n == 0 { 1.0 } else { known.map(|&x| s(x)).sum::<f64>() / n as f64 };
    xs.iter().map(|x| x.map_or(mean, s)).collect()
}

/// Choose an endpoint for a prompt of `blocks` whole blocks.
pub fn pick(p: &PoolSettings, eps: &[EndpointView], blocks: u32, d: Draw) -> Pick {
    pick_with(p, eps, blocks, d, true)
}

/// `pick` without the explanation (the request path; the log explains later).
pub fn choose(p: &PoolSettings, eps: &[EndpointView], blocks: u32, d: Draw) -> Pick {
    pick_with(p, eps, blocks, d, false)
}

fn least_loaded(eps: &[EndpointView], among: impl Iterator<Item = usize>) -> Option<usize> {
    among.min_by(|&a, &b| eps[a].load().total_cmp(&eps[b].load()).then(a.cmp(&b)))
}

fn pick_with(p: &PoolSettings, eps: &[EndpointView], blocks: u32, d: Draw, explain: bool) -> Pick {
    let mut why = Notes::new(explain);
    let healthy: Idx = (0..eps.len()).filter(|&i| eps[i].healthy).collect();
    if healthy.is_empty() {
        return Pick {
            index: least_loaded(eps, 0..eps.len()),
            reason: PickReason::NoHealthyEndpoint,
            explanation: why.say(|| "no endpoint's circuit is closed: the least loaded".into()),
        };
    }
    if p.policy != PoolPolicy::Picker {
        return baseline(p, eps, &healthy, d, &why);
    }
    // 1. Filter.
    let open: Idx = healthy
        .iter()
        .copied()
        .filter(|&i| match eps[i].saturation(p) {
            Some(s) => {
                why.add(|w| write!(w, "; {} saturated ({s})", eps[i].label));
                false
            }
            None => true,
        })
        .collect();
    if open.is_empty() {
        let i = least_loaded(eps, healthy.iter().copied()).expect("healthy is not empty");
        return Pick {
            index: Some(i),
            reason: PickReason::AllSaturated,
            explanation: why.say(|| {
                format!("all_saturated: the least loaded, {} (load {:.0})", eps[i].label, eps[i].load())
            }),
        };
    }
    // 2. Drain.
    let (open, drained) = match drain(p, eps, open, d, &mut why) {
        Drain::Probe(pick) => return pick,
        Drain::Keep { open, drained } => (open, drained),
    };
    if let [i] = open[..] {
        let reason = if drained { PickReason::QualityDegraded } else { PickReason::OnlyEndpoint };
        return Pick {
            index: Some(i),
            reason,
            explanation: why.say(|| format!("{}: {}", reason.as_str(), eps[i].label)),
        };
    }
    // 3 and 4.
    best_scored(p, eps, &open, blocks, d, drained, &why)
}

/// The baselines goodput is measured against: no server signal, no prefix.
fn baseline(p: &PoolSettings, eps: &[EndpointView], healthy: &Idx, d: Draw, why: &Notes) -> Pick {
    let (i, reason) = match p.policy {
        PoolPolicy::RoundRobin => (healthy[d.a % healthy.len()], PickReason::RoundRobin),
        _ => {
            let least = healthy.iter().map(|&i| eps[i].outstanding).min().expect("not empty");
            let ties: Idx = healthy.iter().copied().filter(|&i| eps[i].outstanding == least).collect();
            (ties[d.a % ties.len()], PickReason::LeastOutstanding)
        }
    };
    let explanation =
        why.say(|| format!("{}: {} ({} outstanding)", reason.as_str(), eps[i].label, eps[i].outstanding));
    Pick { index: Some(i), reason, explanation }
}

enum Drain {
    /// The `degraded_probe` share: this choice goes to a drained endpoint.
    Probe(Pick),
    /// The endpoints left to score, and whether any was drained.
    Keep { open: Idx, drained: bool },
}

/// Step 2: endpoints whose quality drifted are out while any other is left, except for the
/// probe share of choices.
fn drain(p: &PoolSettings, eps: &[EndpointView], open: Idx, d: Draw, why: &mut Notes) -> Drain {
    let degraded = open.iter().filter(|&&i| eps[i].degraded.is_some()).count();
    if degraded == 0 {
        return Drain::Keep { open, drained: false };
    }
    if degraded == open.len() {
        why.add(|w| w.write_str("; every open endpoint's quality drifted: none drained"));
        return Drain::Keep { open, drained: false };
    }
    let of = |i: &usize| eps[*i].degraded.map(|g| (*i, g));
    if d.explore < p.degraded_probe {
        let (i, g) = open.iter().filter_map(of).nth(d.a % degraded).expect("counted");
        let share = p.degraded_probe * 100.0;
        return Drain::Probe(Pick {
            index: Some(i),
            reason: PickReason::QualityProbe,
            explanation: why
                .say(|| format!("quality_probe: {} (share {share:.0}%), drained for {g}", eps[i].label)),
        });
    }
    for (i, g) in open.iter().filter_map(of) {
        why.add(|w| write!(w, "; {} drained ({g})", eps[i].label));
    }
    Drain::Keep { open: open.into_iter().filter(|&i| eps[i].degraded.is_none()).collect(), drained: true }
}

/// Each open endpoint's weighted signals: queue, KV cache, prefix, latency.
type Terms = SmallVec<[[f64; 4]; 16]>;

/// Steps 3 and 4, over two or more open endpoints.
fn best_scored(
    p: &PoolSettings,
    eps: &[EndpointView],
    open: &Idx,
    blocks: u32,
    d: Draw,
    drained: bool,
    why: &Notes,
) -> Pick {
    let terms = weighted(p, eps, open, blocks);
    let total = |k: usize| terms[k].iter().sum::<f64>();
    let best = (0..open.len()).map(total).fold(f64::NEG_INFINITY, f64::max);
    let w = p.weights;
    let span = w.queue + w.kv_cache + w.prefix + w.latency;
    let near: Idx = (0..open.len()).filter(|&k| total(k) >= best - p.near_tie * span).collect();
    let (x, y) = (near[d.a % near.len()], near[d.b % near.len()]);
    let load = |k: usize| eps[open[k]].load();
    let k = if near.len() == 1 {
        near[0]
    } else if load(y) < load(x) || (load(y) == load(x) && total(y) > total(x)) {
        y
    } else {
        x
    };
    let reason = if drained {
        PickReason::QualityDegraded
    } else {
        match lead(&terms, k, near.len(), load) {
            PickReason::PrefixHit => PickReason::PrefixHit,
            _ if !open.iter().any(|&i| eps[i].known()) => PickReason::FallbackUnknown,
            reason => reason,
        }
    };
    let explanation = why.say(|| {
        let mut s = format!("{}: {}", reason.as_str(), eps[open[k]].label);
        for (j, &i) in open.iter().enumerate() {
            let _ = explain_endpoint(&mut s, &eps[i], total(j), blocks);
        }
        if near.len() > 1 {
            let _ = write!(s, "; {} near-ties, the less loaded of two drawn", near.len());
        }
        s
    });
    Pick { index: Some(open[k]), reason, explanation }
}

/// Each signal scaled over the open endpoints, times its weight.
fn weighted(p: &PoolSettings, eps: &[EndpointView], open: &Idx, blocks: u32) -> Terms {
    let signal = |f: &dyn Fn(&EndpointView) -> Option<f64>| {
        open.iter().map(|&i| f(&eps[i])).collect::<SmallVec<[_; 16]>>()
    };
    let queue = scaled(&signal(&|e| Some(e.load())), true);
    let kv = scaled(&signal(&|e| e.kv_cache), true);
    let latency = scaled(&signal(&|e| e.ttft_p95_ms), true);
    // A cached prefix saves its prefill, not a wait in a queue: it counts only at an endpoint
    // within `prefix.max_load_gap` requests of the least loaded one, so that shared prompts do
    // not all pile onto the replica that has them while another is idle.
    let min_load = open.iter().map(|&i| eps[i].load()).fold(f64::INFINITY, f64::min);
    let prefix = |i: usize| {
        let near_least = eps[i].load() <= min_load + p.prefix.max_load_gap;
        if blocks == 0 || !near_least {
            0.0
        } else {
            f64::from(eps[i].matched.min(blocks)) / f64::from(blocks)
        }
    };
    let w = p.weights;
    (0..open.len())
        .map(|k| [w.queue * queue[k], w.kv_cache * kv[k], w.prefix * prefix(open[k]), w.latency * latency[k]])
        .collect()
}

/// Why `k` was chosen: the signal that most separates it from the best of the others (on equal
/// leads, the first in the order queue, KV, prefix, latency), or the load among near-ties.
fn lead(terms: &Terms, k: usize, near: usize, load: impl Fn(usize) -> f64) -> PickReason {
    let total = |k: usize| terms[k].iter().sum::<f64>();
    let runner = (0..terms.len())
        .filter(|&j| j != k)
        .max_by(|&a, &b| total(a).total_cmp(&total(b)))
        .expect("two or more");
    if near > 1 {
        return if load(k) < load(runner) { PickReason::LeastQueue } else { PickReason::NearTie };
    }
    let (tk, tr) = (terms[k], terms[runner]);
    let lead = (1..4).fold(0, |best, t| if tk[t] - tr[t] > tk[best] - tr[best] { t } else { best });
    [PickReason::LeastQueue, PickReason::KvHeadroom, PickReason::PrefixHit, PickReason::LowestLatency][lead]
}

fn explain_endpoint(s: &mut String, e: &EndpointView, score: f64, blocks: u32) -> std::fmt::Result {
    write!(s, "; {} score {score:.2} (load {:.0}", e.label, e.load())?;
    if let Some(kv) = e.kv_cache {
        write!(s, ", KV {:.0}%", kv * 100.0)?;
    }
    if blocks > 0 {
        write!(s, ", prefix {}/{blocks}", e.matched.min(blocks))?;
    }
    if let Some(t) = e.ttft_p95_ms {
        write!(s, ", ttft p95 {t:.0} ms")?;
    }
    if !e.known() {
        s.push_str(", server unknown");
    }
    s.push(')');
    Ok(())
}

/// The prompt's whole blocks as a chain of hashes: each covers its block and every block
/// before it, so that one hash stands for the whole prefix up to it (as vLLM's block hashes
/// do). At most `max` blocks.
pub fn prompt_blocks(prompt: &[u8], block: usize, max: usize) -> Vec<u64> {
    // Fixed seeds: the same prompt hashes the same across reloads (the index survives them).
    let h = ahash::RandomState::with_seeds(0x676f_6f64, 0x7075_7400, 0x706f_6f6c, 0x7072_6566);
    let mut prev = 0u64;
    prompt
        .chunks_exact(block.max(1))
        .take(max)
        .map(|b| {
            prev = h.hash_one((prev, b));
            prev
        })
        .collect()
}

/// Which block chains were recently sent to which endpoint: per endpoint a bounded set of
/// hashes, the least recently sent forgotten first (an approximation of what its prefix cache
/// still holds).
#[derive(Default)]
pub struct PrefixIndex {
    per: HashMap<Arc<str>, Lru>,
}

impl PrefixIndex {
    /// How many of `blocks`' leading blocks were sent to `endpoint` and not forgotten.
    pub fn matched(&self, endpoint: &str, blocks: &[u64]) -> u32 {
        let Some(lru) = self.per.get(endpoint) else { return 0 };
        blocks.iter().take_while(|h| lru.map.contains_key(h)).count() as u32
    }

    /// `blocks` were sent to `endpoint`. The first blocks are the most shared: they are
    /// touched last, so they are the last forgotten.
    pub fn sent(&mut self, endpoint: &Arc<str>, blocks: &[u64], capacity: usize) {
        if blocks.is_empty() {
            return;
        }
        let lru = self.per.entry(endpoint.clone()).or_default();
        for &h in blocks.iter().rev() {
            lru.touch(h, capacity);
        }
    }

    /// Endpoints that left the pool leave the index.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.per.retain(|k, _| keep(k));
    }

    pub fn len(&self, endpoint: &str) -> usize {
        self.per.get(endpoint).map_or(0, |l| l.map.len())
    }
}

/// A bounded set with least-recently-used eviction: `map` holds each hash's last use, `log`
/// the uses in order; a log entry whose stamp is not the hash's last use is stale and skipped.
#[derive(Default)]
struct Lru {
    stamp: u64,
    map: HashMap<u64, u64>,
    log: VecDeque<(u64, u64)>,
}

impl Lru {
    fn touch(&mut self, h: u64, capacity: usize) {
        self.stamp += 1;
        self.map.insert(h, self.stamp);
        self.log.push_back((h, self.stamp));
        while self.map.len() > capacity {
            let Some((old, at)) = self.log.pop_front() else { break };
            if self.map.get(&old) == Some(&at) {
                self.map.remove(&old);
            }
        }
        if self.log.len() > 2 * capacity + 64 {
            let map = &self.map;
            self.log.retain(|(h, at)| map.get(h) == Some(at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(label: &str, outstanding: u64, waiting: Option<f64>, kv: Option<f64>) -> EndpointView {
        EndpointView {
            label: Arc::from(label),
            healthy: true,
            outstanding,
            waiting,
            running: waiting.map(|_| 0.0),
            kv_cache: kv,
            matched: 0,
            ttft_p95_ms: None,
            degraded: None,
        }
    }

    const D: Draw = Draw { explore: 0.5, a: 0, b: 1 };

    #[test]
    fn a_degraded_endpoint_is_drained_but_probed() {
        let p = PoolSettings::default();
        let g = Degraded { signal: "bits_per_byte", estimate: 1.2, lower: 0.9, upper: 1.5, peers: true };
        // b has the shorter queue and would win, but its quality drifted.
        let mut eps =
            [ep("a", 0, Some(3.0), Some(0.1)), ep("b", 0, Some(0.0), Some(0.1)), ep("c", 0, Some(3.0), None)];
        eps[1].degraded = Some(g);
        let k = pick(&p, &eps, 0, D);
        assert_eq!(k.reason, PickReason::QualityDegraded, "{}", k.explanation);
        assert_ne!(k.index, Some(1));
        assert!(
            k.explanation
                .contains("; b drained (bits_per_byte +1.200 (95% 0.900 to 1.500) against its peers)"),
            "{}",
            k.explanation
        );
        // The probe share still reaches it.
        let k = pick(&p, &eps, 0, Draw { explore: 0.01, a: 7, b: 0 });
        assert_eq!((k.index, k.reason), (Some(1), PickReason::QualityProbe), "{}", k.explanation);
        assert!(k.explanation.starts_with("quality_probe: b (share 5%), drained for bits_per_byte"));
        let off = PoolSettings { degraded_probe: 0.0, ..p.clone() };
        assert_eq!(
            pick(&off, &eps, 0, Draw { explore: 0.0, a: 1, b: 0 }).reason,
            PickReason::QualityDegraded
        );
        // Two endpoints, one drained: the other, named as the drain's choice.
        let k = pick(&p, &eps[..2], 0, D);
        assert_eq!((k.index, k.reason), (Some(0), PickReason::QualityDegraded), "{}", k.explanation);
        // Every open endpoint drifted (against their baselines): none is drained.
        eps[0].degraded = Some(g);
        eps[2].degraded = Some(g);
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::LeastQueue), "{}", k.explanation);
        // A saturated healthy endpoint is not a reason to keep a degraded one... unless it is the
        // only other: saturation filters first, then the drain keeps at least one.
        let mut eps = [ep("a", 0, Some(9.0), Some(0.1)), ep("b", 0, Some(0.0), Some(0.1))];
        eps[1].degraded = Some(g);
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::OnlyEndpoint), "{}", k.explanation);
    }

    #[test]
    fn the_shorter_queue_wins_and_says_so() {
        let p = PoolSettings::default();
        let eps = [ep("a", 0, Some(4.0), Some(0.1)), ep("b", 0, Some(0.0), Some(0.1))];
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::LeastQueue), "{}", k.explanation);
        assert!(k.explanation.starts_with("least_queue: b"), "{}", k.explanation);
        assert_eq!(choose(&p, &eps, 0, D).index, k.index, "the same choice without words");
    }

    #[test]
    fn goodputs_own_count_covers_the_scrapes_lag() {
        let p = PoolSettings::default();
        // The server said 0 at its last scrape; goodput has sent 3 since.
        let eps = [ep("a", 3, Some(0.0), None), ep("b", 1, Some(1.0), None)];
        assert_eq!(pick(&p, &eps, 0, D).index, Some(1));
    }

    #[test]
    fn a_queue_and_a_full_cache_together_are_named_as_the_queue() {
        let p = PoolSettings { near_tie: 0.0, ..Default::default() };
        let eps = [ep("a", 0, Some(4.0), Some(0.8)), ep("b", 0, Some(0.0), Some(0.1))];
        assert_eq!(pick(&p, &eps, 0, D).reason, PickReason::LeastQueue);
    }

    #[test]
    fn kv_headroom_decides_between_equal_queues() {
        let p = PoolSettings { near_tie: 0.0, ..Default::default() };
        let eps = [ep("a", 1, Some(0.0), Some(0.85)), ep("b", 1, Some(0.0), Some(0.2))];
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::KvHeadroom), "{}", k.explanation);
    }

    #[test]
    fn saturated_endpoints_are_filtered_and_all_saturated_takes_the_least_loaded() {
        let p = PoolSettings::default();
        let eps = [
            ep("a", 0, Some(9.0), Some(0.1)),
            ep("b", 5, Some(2.0), Some(0.95)),
            ep("c", 2, Some(1.0), Some(0.3)),
        ];
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(2), PickReason::OnlyEndpoint));
        assert!(k.explanation.contains("a saturated (9 waiting > 5)"), "{}", k.explanation);
        assert!(k.explanation.contains("b saturated (KV cache 95% > 90%)"), "{}", k.explanation);
        let eps = [ep("a", 0, Some(9.0), None), ep("b", 0, Some(7.0), None)];
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::AllSaturated));
    }

    #[test]
    fn unknown_signals_do_not_disqualify_and_fall_back_to_goodputs_counts() {
        let p = PoolSettings::default();
        let eps = [ep("a", 4, None, None), ep("b", 1, None, None)];
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::FallbackUnknown), "{}", k.explanation);
        assert!(k.explanation.contains("server unknown"));
        // One known, one unknown: the unknown one is not out.
        let eps = [ep("a", 0, Some(0.0), Some(0.5)), ep("b", 0, None, None)];
        let k = pick(&p, &eps, 0, Draw { a: 1, b: 1, explore: 0.0 });
        assert!(k.index.is_some());
    }

    #[test]
    fn unhealthy_endpoints_are_out_and_none_left_takes_the_least_loaded() {
        let p = PoolSettings::default();
        let mut eps = [ep("a", 0, Some(0.0), None), ep("b", 3, Some(3.0), None)];
        eps[0].healthy = false;
        assert_eq!(pick(&p, &eps, 0, D).index, Some(1));
        eps[1].healthy = false;
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(0), PickReason::NoHealthyEndpoint));
        assert_eq!(pick(&p, &[], 0, D).index, None);
    }

    #[test]
    fn the_longest_prefix_wins_unless_it_is_saturated() {
        let p = PoolSettings::default();
        let mut eps = [ep("a", 2, Some(1.0), Some(0.3)), ep("b", 0, Some(0.0), Some(0.1))];
        eps[0].matched = 8;
        let k = pick(&p, &eps, 10, D);
        assert_eq!((k.index, k.reason), (Some(0), PickReason::PrefixHit), "{}", k.explanation);
        assert!(k.explanation.contains("prefix 8/10"), "{}", k.explanation);
        // A short match does not outweigh a long queue.
        eps[0].matched = 1;
        eps[0].waiting = Some(4.0);
        assert_eq!(pick(&p, &eps, 10, D).index, Some(1));
        // Saturated: out whatever it holds.
        eps[0].matched = 10;
        eps[0].waiting = Some(6.0);
        assert_eq!(pick(&p, &eps, 10, D).index, Some(1));
    }

    #[test]
    fn a_prefix_does_not_draw_requests_onto_a_replica_far_busier_than_the_others() {
        let p = PoolSettings::default();
        let mut eps = [ep("a", 0, Some(1.0), Some(0.2)), ep("b", 0, Some(0.0), Some(0.2))];
        eps[0].running = Some(2.0);
        eps[0].matched = 10;
        // Load 3 against 0, a gap of 3 > 2: the prefix is not worth the wait.
        let k = pick(&p, &eps, 10, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::LeastQueue), "{}", k.explanation);
        // Load 2 against 0: within the gap, the prefix wins.
        eps[0].running = Some(1.0);
        assert_eq!(pick(&p, &eps, 10, D).reason, PickReason::PrefixHit);
    }

    #[test]
    fn measured_latency_counts_when_trusted() {
        let p = PoolSettings { near_tie: 0.0, ..Default::default() };
        let mut eps = [ep("a", 1, Some(0.0), Some(0.2)), ep("b", 1, Some(0.0), Some(0.2))];
        eps[0].ttft_p95_ms = Some(900.0);
        eps[1].ttft_p95_ms = Some(120.0);
        let k = pick(&p, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::LowestLatency), "{}", k.explanation);
    }

    #[test]
    fn near_ties_go_to_the_less_loaded_of_two_drawn() {
        let p = PoolSettings::default();
        let eps: Vec<EndpointView> = (0..4).map(|i| ep(&format!("e{i}"), 0, Some(0.0), Some(0.1))).collect();
        let mut seen = [0; 4];
        for a in 0..4 {
            for b in 0..4 {
                let k = pick(&p, &eps, 0, Draw { explore: 0.0, a, b });
                assert_eq!(k.reason, PickReason::NearTie);
                seen[k.index.unwrap()] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n > 0), "every tie can be drawn: {seen:?}");
    }

    #[test]
    fn the_baseline_policies_ignore_the_servers() {
        let mut eps = [ep("a", 3, Some(0.0), None), ep("b", 1, Some(9.0), None), ep("c", 1, Some(9.0), None)];
        eps[2].healthy = false;
        let rr = PoolSettings { policy: PoolPolicy::RoundRobin, ..Default::default() };
        let picks: Vec<_> =
            (0..4).map(|a| pick(&rr, &eps, 0, Draw { explore: 0.0, a, b: 0 }).index).collect();
        assert_eq!(picks, [Some(0), Some(1), Some(0), Some(1)], "in turn, over the healthy ones");
        let lo = PoolSettings { policy: PoolPolicy::LeastOutstanding, ..Default::default() };
        let k = pick(&lo, &eps, 0, D);
        assert_eq!((k.index, k.reason), (Some(1), PickReason::LeastOutstanding), "b, queue or not");
    }

    #[test]
    fn prompt_blocks_chain_and_count_whole_blocks_only() {
        let a = prompt_blocks(&[b'x'; 1000], 256, 100);
        assert_eq!(a.len(), 3);
        let mut other = vec![b'x'; 1000];
        other[300] = b'y';
        let b = prompt_blocks(&other, 256, 100);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2], "a block's hash covers every block before it");
        assert_ne!(a[0], a[1], "equal blocks at different places differ");
        assert_eq!(prompt_blocks(&[b'x'; 1000], 256, 2).len(), 2);
        assert!(prompt_blocks(b"short", 256, 10).is_empty());
    }

    #[test]
    fn the_index_matches_leading_blocks_and_forgets_the_least_recent() {
        let mut ix = PrefixIndex::default();
        let e: Arc<str> = Arc::from("e");
        let p1 = prompt_blocks(&[b'a'; 1024], 256, 100);
        ix.sent(&e, &p1, 6);
        assert_eq!(ix.matched("e", &p1), 4);
        assert_eq!(ix.matched("other", &p1), 0);
        let mut longer = vec![b'a'; 2048];
        longer[1500] = b'b';
        assert_eq!(ix.matched("e", &prompt_blocks(&longer, 256, 100)), 4);
        // A second prompt pushes the first's last blocks out first; its leading blocks stay.
        let p2 = prompt_blocks(&[b'z'; 1024], 256, 100);
        ix.sent(&e, &p2, 6);
        assert_eq!(ix.len("e"), 6);
        assert_eq!(ix.matched("e", &p2), 4);
        assert_eq!(ix.matched("e", &p1), 2);
        // Many touches keep the log bounded.
        for i in 0..10_000u64 {
            ix.sent(&e, &[i], 6);
        }
        assert_eq!(ix.len("e"), 6);
        assert!(ix.per["e"].log.len() <= 2 * 6 + 64);
        ix.retain(|k| k != "e");
        assert_eq!(ix.len("e"), 0);
    }
}
