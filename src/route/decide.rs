//! The decision: a statistics snapshot in, a choice and its reason out.
//!
//! 1. Health: backends whose circuit is open or that are at their concurrency limit are out;
//!    those whose every endpoint reports a saturated queue or KV cache are out while another
//!    usable backend is not saturated.
//! 2. Exploration: a small share of decisions picks any healthy backend, so that every backend's
//!    statistics stay fresh.
//! 3. Compliance: a backend complies with a class when each of its windowed statistics that the
//!    class constrains meets the bound. A statistic with fewer samples than the policy's minimum
//!    is not trusted and does not disqualify (a new backend must be able to earn its numbers).
//!    The hallucination rate misses its bound only when its whole 95% interval lies above it.
//!    A backend whose quality has confidently drifted (`quality::drift`) complies with no class.
//! 4. Choice among compliant backends by the class's objective; near-ties (within 5%) go to the
//!    less loaded of two drawn at random (power of two choices).
//! 5. No compliant backend: best effort, the one with the fewest violated bounds, reason
//!    `sla_unmet`.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    Cheapest,
    Fastest,
    BestQuality,
    BestValue,
}

/// An SLA class: latency bounds on p95s, quality floors and an objective.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p95_ms: Option<f64>,
    pub e2e_p95_ms: Option<f64>,
    pub max_perplexity: Option<f64>,
    pub max_hallucination_rate: Option<f64>,
    pub objective: Objective,
}

/// A backend's windowed statistics (the recorder's windows, or Prometheus in multi-replica mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Requests in the latency window.
    pub samples: u64,
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p95_ms: Option<f64>,
    pub e2e_p95_ms: Option<f64>,
    /// Output tokens per second over the window.
    pub tokens_per_sec: f64,
    /// Scored responses in the quality window, and their typical perplexity.
    pub scored: u64,
    pub perplexity: Option<f64>,
    /// Consistency checks that gave a verdict (a probability method or a calibrated
    /// threshold), and the share judged hallucinated; none without a verdict.
    pub rated: u64,
    pub hallucination_rate: Option<f64>,
    /// The lower end of the rate's 95% interval (calibration's uncertainty included): a
    /// `max_hallucination_rate` excludes a backend only when this is above it.
    pub hallucination_rate_lower: Option<f64>,
}

/// A confident quality drift (`quality::drift`) as a choice sees it: the unit's mean score
/// is worse than its reference's, and the 95% interval of the difference clears the signal's
/// minimum effect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Degraded {
    pub signal: &'static str,
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
    /// Against its peers (else against its own baseline).
    pub peers: bool,
}

impl From<&crate::quality::drift::Drift> for Degraded {
    fn from(d: &crate::quality::drift::Drift) -> Degraded {
        Degraded {
            signal: d.signal.as_str(),
            estimate: d.estimate,
            lower: d.lower,
            upper: d.upper,
            peers: matches!(d.reference, crate::quality::drift::Reference::Peers { .. }),
        }
    }
}

impl std::fmt::Display for Degraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:+.3} (95% {:.3} to {:.3}) against {}",
            self.signal,
            self.estimate,
            self.lower,
            self.upper,
            if self.peers { "its peers" } else { "its own baseline" }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: std::sync::Arc<str>,
    /// The circuit breaker lets a request through.
    pub healthy: bool,
    /// Every endpoint's server reports a queue or KV cache past the pool's thresholds.
    pub saturated: bool,
    pub outstanding: u64,
    /// Its statistics have no sample, yet a request was sent to it within the latency window:
    /// that request's sample is on its way (in flight, or its record not yet counted).
    pub awaiting_sample: bool,
    pub max_concurrency: Option<u64>,
    /// Price per 1M input and output tokens.
    pub price_input: f64,
    pub price_output: f64,
    pub stats: Stats,
    /// Its quality is confidently worse than its peers' or its baseline's: a bound every class
    /// keeps, whatever its own floors (`quality.drift.drain_on`).
    pub degraded: Option<Degraded>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Latency statistics need this many requests in the window to be trusted.
    pub min_samples: u64,
    /// Quality statistics need this many scored (or checked) responses to be trusted.
    pub min_quality_samples: u64,
    /// Share of decisions that explore (e.g. 0.02–0.05).
    pub exploration: f64,
}

/// The randomness a decision uses, drawn by the caller: `explore` uniform in [0, 1), `a` and `b`
/// any integers (taken modulo the number of candidates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub explore: f64,
    pub a: usize,
    pub b: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Cheapest,
    Fastest,
    BestQuality,
    BestValue,
    Explore,
    SlaUnmet,
    NoHealthyBackend,
    Failover,
}

// Failover is the last variant: every reason indexes below COUNT.
const _: () = assert!(Reason::Failover as usize + 1 == Reason::COUNT);

impl Reason {
    /// How many reasons there are (`self as usize` is below it).
    pub const COUNT: usize = 8;

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Cheapest => "cheapest",
            Reason::Fastest => "fastest",
            Reason::BestQuality => "best_quality",
            Reason::BestValue => "best_value",
            Reason::Explore => "explore",
            Reason::SlaUnmet => "sla_unmet",
            Reason::NoHealthyBackend => "no_healthy_backend",
            Reason::Failover => "failover",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Index into the candidates; `None` only with `no_healthy_backend`.
    pub backend: Option<usize>,
    pub reason: Reason,
    /// Indices of the compliant candidates.
    pub compliant: Indices,
    /// One line a person can read: what was chosen, why, and why the others were not.
    pub explanation: String,
}

/// The bounds a candidate violates, with trusted statistics only.
pub fn violations(class: &Class, c: &Candidate, p: &Policy) -> Vec<String> {
    let mut v = Vec::new();
    each_violation(class, c, p, |what| v.push(what.to_string()));
    v
}

/// How many bounds a candidate violates: `violations` without the words.
fn violated(class: &Class, c: &Candidate, p: &Policy) -> usize {
    let mut n = 0;
    each_violation(class, c, p, |_| n += 1);
    n
}

/// The latency bounds a candidate's window misses, whether or not it holds enough samples to
/// be trusted.
fn each_latency_miss(class: &Class, s: &Stats, mut f: impl FnMut(std::fmt::Arguments)) {
    for (what, bound, got) in [
        ("ttft p95", class.ttft_p95_ms, s.ttft_p95_ms),
        ("tpot p95", class.tpot_p95_ms, s.tpot_p95_ms),
        ("e2e p95", class.e2e_p95_ms, s.e2e_p95_ms),
    ] {
        if let (Some(b), Some(g)) = (bound, got)
            && g > b
        {
            f(format_args!("{what} {g:.0} ms > {b:.0} ms"));
        }
    }
}

/// The latency bounds that the few samples of a candidate not yet trusted (fewer than
/// `min_samples`) already miss. Too few to call it non-compliant, enough not to send it the
/// class's traffic while another compliant backend is not held back: it then gets the
/// exploration share only, until it has enough samples to be judged or none are left in the
/// window. Otherwise a known-slow cheaper backend would take a request (an SLO miss) each time
/// one of its samples left the window, to stay measured.
pub fn provisional_misses(class: &Class, c: &Candidate, p: &Policy) -> Vec<String> {
    let mut v = Vec::new();
    if (1..p.min_samples).contains(&c.stats.samples) {
        each_latency_miss(class, &c.stats, |what| v.push(what.to_string()));
    }
    v
}

/// Held back while another compliant backend is not: its few samples already miss a bound
/// (`provisional_misses`), or it has none yet and the first is on its way. Without the second,
/// a new backend, or one whose samples all left the window, would take every request of the
/// class until its first record landed: a burst, before anything is known, to a backend that
/// may be slow. One request at a time learns as much.
fn held_back(class: &Class, c: &Candidate, p: &Policy) -> bool {
    if c.awaiting_sample {
        return true;
    }
    let mut held = false;
    if (1..p.min_samples).contains(&c.stats.samples) {
        each_latency_miss(class, &c.stats, |_| held = true);
    }
    held
}

/// Calls `f` with each violated bound, described (the description is formatted only if used).
fn each_violation(class: &Class, c: &Candidate, p: &Policy, mut f: impl FnMut(std::fmt::Arguments)) {
    let s = &c.stats;
    if s.samples >= p.min_samples {
        each_latency_miss(class, s, &mut f);
    }
    if s.scored >= p.min_quality_samples
        && let (Some(b), Some(g)) = (class.max_perplexity, s.perplexity)
        && g > b
    {
        f(format_args!("perplexity {g:.1} > {b:.1}"));
    }
    // Confidently above: a calibrated rate on tens of checks is uncertain by ±0.2, and a bound on
    // its point estimate would exclude a healthy backend on that noise alone.
    if s.rated >= p.min_quality_samples
        && let (Some(b), Some(g)) = (class.max_hallucination_rate, s.hallucination_rate)
    {
        match s.hallucination_rate_lower {
            Some(lo) if lo > b => f(format_args!("hallucination rate {g:.2} (95% from {lo:.2}) > {b:.2}")),
            None if g > b => f(format_args!("hallucination rate {g:.2} > {b:.2}")),
            _ => {}
        }
    }
    if let Some(g) = &c.degraded {
        f(format_args!("quality_degraded: {g}"));
    }
}

/// The objective's cost of a candidate: lower is better. Unknown statistics cost the most
/// among known ones would, so that a measured good backend beats an unmeasured one.
fn cost(obj: Objective, c: &Candidate) -> f64 {
    let s = &c.stats;
    let price = c.price_input + c.price_output;
    let ppl = s.perplexity.unwrap_or(f64::INFINITY);
    match obj {
        Objective::Cheapest => price,
        Objective::Fastest => s.ttft_p95_ms.or(s.e2e_p95_ms).unwrap_or(f64::INFINITY),
        Objective::BestQuality => ppl * (1.0 + s.hallucination_rate.unwrap_or(0.0)),
        // The seed's tput / (ppl x price), with quality: effective tokens/s = tput x (1 - h).
        Objective::BestValue => {
            let value =
                s.tokens_per_sec * (1.0 - s.hallucination_rate.unwrap_or(0.0)) / (ppl * price.max(1e-9));
            if value.is_finite() && value > 0.0 { 1.0 / value } else { f64::INFINITY }
        }
    }
}

/// The decision and its explanation.
pub fn decide(class: &Class, cands: &[Candidate], p: &Policy, d: Draw) -> Decision {
    decide_with(class, cands, p, d, true)
}

/// The same decision without its explanation, which is left empty: the request path takes
/// this, and the decision log explains later by calling `decide` on the same inputs (the
/// function is pure, so the words are those of the choice that was made).
pub fn choose(class: &Class, cands: &[Candidate], p: &Policy, d: Draw) -> Decision {
    decide_with(class, cands, p, d, false)
}

/// Candidate indices; routes rarely have more than a few backends.
pub type Indices = SmallVec<[usize; 8]>;

/// A decision's explanation, written only when it will be read: the request path leaves it
/// empty and the decision log explains the same decision later.
pub(super) struct Notes(Option<String>);

impl Notes {
    pub(super) fn new(explain: bool) -> Notes {
        Notes(explain.then(String::new))
    }

    pub(super) fn add(&mut self, note: impl FnOnce(&mut String) -> std::fmt::Result) {
        if let Some(s) = &mut self.0 {
            let _ = note(s);
        }
    }

    /// The explanation: `head`, then every note so far.
    pub(super) fn say(&self, head: impl FnOnce() -> String) -> String {
        self.0.as_ref().map_or_else(String::new, |notes| head() + notes)
    }
}

fn decide_with(class: &Class, cands: &[Candidate], p: &Policy, d: Draw, explain: bool) -> Decision {
    let mut why = Notes::new(explain);
    // 1. Health.
    let usable = usable(cands, &mut why);
    if usable.is_empty() {
        return Decision {
            backend: None,
            reason: Reason::NoHealthyBackend,
            compliant: Indices::new(),
            explanation: why.say(|| "no healthy backend".into()),
        };
    }
    // 3, before 2: an exploring decision still says which backends comply.
    let compliant: Indices = usable
        .iter()
        .copied()
        .filter(|&i| {
            let ok = violated(class, &cands[i], p) == 0;
            if !ok {
                why.add(|w| {
                    write!(w, "; {} misses {}", cands[i].name, violations(class, &cands[i], p).join(", "))
                });
            }
            ok
        })
        .collect();
    // 2. Exploration.
    if d.explore < p.exploration {
        let i = usable[d.a % usable.len()];
        let share = p.exploration * 100.0;
        let explanation = why.say(|| format!("explore: {} (share {share:.0}%)", cands[i].name));
        return Decision { backend: Some(i), reason: Reason::Explore, explanation, compliant };
    }
    // 5. Best effort: the fewest violated bounds, then the objective.
    if compliant.is_empty() {
        let i = *usable
            .iter()
            .min_by(|&&x, &&y| {
                let (vx, vy) = (violated(class, &cands[x], p), violated(class, &cands[y], p));
                vx.cmp(&vy)
                    .then(cost(class.objective, &cands[x]).total_cmp(&cost(class.objective, &cands[y])))
            })
            .expect("usable is not empty");
        let explanation = why.say(|| format!("sla_unmet: best effort {}", cands[i].name));
        return Decision { backend: Some(i), reason: Reason::SlaUnmet, explanation, compliant };
    }
    // 4. The objective, among those not held back.
    let pool = not_held_back(class, cands, p, &compliant, &mut why);
    let (i, near) = by_objective(class.objective, cands, &pool, d);
    let reason = match class.objective {
        Objective::Cheapest => Reason::Cheapest,
        Objective::Fastest => Reason::Fastest,
        Objective::BestQuality => Reason::BestQuality,
        Objective::BestValue => Reason::BestValue,
    };
    let explanation = why.say(|| {
        let names: Vec<&str> = compliant.iter().map(|&j| &*cands[j].name).collect();
        let ties = if near > 1 { format!(" ({near} near-tied, fewer outstanding)") } else { String::new() };
        format!("{}: {} among compliant [{}]{ties}", reason.as_str(), cands[i].name, names.join(", "))
    });
    Decision { backend: Some(i), reason, compliant, explanation }
}

/// Step 1. Saturation is soft: a busy server still serves, so a saturated backend is out only
/// while another usable one is not (as within a pool, `route::pool`).
fn usable(cands: &[Candidate], why: &mut Notes) -> Indices {
    let open = |c: &Candidate| c.healthy && c.max_concurrency.is_none_or(|m| c.outstanding < m);
    let any_unsaturated = cands.iter().any(|c| open(c) && !c.saturated);
    (0..cands.len())
        .filter(|&i| {
            let c = &cands[i];
            let ok = open(c) && (!c.saturated || !any_unsaturated);
            let state = if !c.healthy {
                "unhealthy"
            } else if !open(c) {
                "at its concurrency limit"
            } else if ok {
                "saturated (every endpoint's queue or KV cache past its threshold), kept: no usable backend is not"
            } else {
                "saturated (every endpoint's queue or KV cache past its threshold)"
            };
            if !ok || c.saturated {
                why.add(|w| write!(w, "; {} {state}", c.name));
            }
            ok
        })
        .collect()
}

/// Compliant backends whose few samples already miss a bound are held back while another
/// compliant one is not (a cold start, where every backend is new, still learns).
fn not_held_back(
    class: &Class,
    cands: &[Candidate],
    p: &Policy,
    compliant: &Indices,
    why: &mut Notes,
) -> Indices {
    let held: Indices = compliant.iter().copied().filter(|&i| held_back(class, &cands[i], p)).collect();
    if held.len() == compliant.len() {
        return compliant.clone();
    }
    for &i in &held {
        let c = &cands[i];
        why.add(|w| {
            if c.awaiting_sample {
                write!(w, "; {} held back: its first sample is on its way", c.name)
            } else {
                let misses = provisional_misses(class, c, p).join(", ");
                write!(
                    w,
                    "; {} held back: its {} of {} samples miss {misses}",
                    c.name, c.stats.samples, p.min_samples
                )
            }
        });
    }
    compliant.iter().copied().filter(|i| !held.contains(i)).collect()
}

/// The lowest cost; near-ties (within 5%) go to the less loaded of two drawn (power of two
/// choices). With the number of near-ties.
fn by_objective(obj: Objective, cands: &[Candidate], pool: &Indices, d: Draw) -> (usize, usize) {
    let best = pool.iter().map(|&i| cost(obj, &cands[i])).fold(f64::INFINITY, f64::min);
    let near: Indices = pool
        .iter()
        .copied()
        .filter(|&i| {
            let c = cost(obj, &cands[i]);
            c == best || (best.is_finite() && c <= best * 1.05)
        })
        .collect();
    let (x, y) = (near[d.a % near.len()], near[d.b % near.len()]);
    let i = if cands[y].outstanding < cands[x].outstanding { y } else { x };
    (i, near.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(name: &str, price: f64, ttft: f64, ppl: f64) -> Candidate {
        Candidate {
            name: name.into(),
            healthy: true,
            saturated: false,
            outstanding: 0,
            awaiting_sample: false,
            max_concurrency: None,
            price_input: price / 2.0,
            price_output: price / 2.0,
            stats: Stats {
                samples: 100,
                ttft_p95_ms: Some(ttft),
                tpot_p95_ms: Some(20.0),
                e2e_p95_ms: Some(ttft + 1000.0),
                tokens_per_sec: 1000.0,
                scored: 50,
                perplexity: Some(ppl),
                rated: 50,
                hallucination_rate: Some(0.1),
                hallucination_rate_lower: Some(0.05),
            },
            degraded: None,
        }
    }

    fn class(obj: Objective) -> Class {
        Class {
            ttft_p95_ms: Some(500.0),
            tpot_p95_ms: Some(50.0),
            e2e_p95_ms: None,
            max_perplexity: Some(20.0),
            max_hallucination_rate: Some(0.3),
            objective: obj,
        }
    }

    const P: Policy = Policy { min_samples: 20, min_quality_samples: 10, exploration: 0.05 };
    const NO_EXPLORE: Draw = Draw { explore: 0.99, a: 0, b: 1 };

    #[test]
    fn each_objective_picks_its_backend_among_compliant_ones() {
        let cands = vec![
            cand("cheap", 1.0, 400.0, 15.0),
            cand("fast", 5.0, 100.0, 12.0),
            cand("good", 3.0, 300.0, 6.0),
        ];
        let pick = |o| decide(&class(o), &cands, &P, NO_EXPLORE);
        assert_eq!(pick(Objective::Cheapest).backend, Some(0));
        assert_eq!(pick(Objective::Fastest).backend, Some(1));
        assert_eq!(pick(Objective::BestQuality).backend, Some(2));
        // Value = tput (1 - h) / (ppl x price): 1/15, 1/60, 1/18 (x 900) -> cheap.
        let d = pick(Objective::BestValue);
        assert_eq!((d.backend, d.reason), (Some(0), Reason::BestValue));
        assert!(
            d.explanation.starts_with("best_value: cheap among compliant [cheap, fast, good]"),
            "{}",
            d.explanation
        );
    }

    #[test]
    fn non_compliant_backends_are_filtered_with_their_reasons() {
        let mut slow = cand("slow-cheap", 0.5, 900.0, 10.0);
        slow.stats.hallucination_rate = Some(0.5);
        slow.stats.hallucination_rate_lower = Some(0.35);
        let cands = vec![slow, cand("ok", 2.0, 200.0, 10.0)];
        let d = decide(&class(Objective::Cheapest), &cands, &P, NO_EXPLORE);
        assert_eq!(
            (d.backend, d.reason, d.compliant.clone()),
            (Some(1), Reason::Cheapest, Indices::from_slice(&[1]))
        );
        assert!(
            d.explanation.contains(
                "slow-cheap misses ttft p95 900 ms > 500 ms, hallucination rate 0.50 (95% from 0.35) > 0.30"
            ),
            "{}",
            d.explanation
        );
    }

    #[test]
    fn a_hallucination_rate_misses_its_bound_only_when_confidently_above() {
        let cheap = |rate: f64, lower: Option<f64>| {
            let mut c = cand("cheap", 0.5, 200.0, 10.0);
            (c.stats.hallucination_rate, c.stats.hallucination_rate_lower) = (Some(rate), lower);
            vec![c, cand("dear", 2.0, 200.0, 10.0)]
        };
        let pick = |cands: &[Candidate]| decide(&class(Objective::Cheapest), cands, &P, NO_EXPLORE);
        // Above the bound of 0.3, but its interval reaches below it: kept.
        assert_eq!(pick(&cheap(0.45, Some(0.25))).backend, Some(0));
        // The whole interval above: out.
        let d = pick(&cheap(0.45, Some(0.31)));
        assert_eq!(d.backend, Some(1), "{}", d.explanation);
        assert!(
            d.explanation.contains("hallucination rate 0.45 (95% from 0.31) > 0.30"),
            "{}",
            d.explanation
        );
        // Without an interval the point decides.
        assert_eq!(pick(&cheap(0.45, None)).backend, Some(1));
        assert_eq!(pick(&cheap(0.25, None)).backend, Some(0));
    }

    #[test]
    fn a_confidently_degraded_backend_is_out_for_every_class_but_still_explored() {
        let mut bad = cand("bad-cheap", 0.5, 200.0, 10.0);
        bad.degraded =
            Some(Degraded { signal: "bits_per_byte", estimate: 0.5, lower: 0.4, upper: 0.6, peers: true });
        let cands = vec![bad, cand("ok", 2.0, 200.0, 10.0)];
        let no_floors = Class {
            ttft_p95_ms: None,
            tpot_p95_ms: None,
            e2e_p95_ms: None,
            max_perplexity: None,
            max_hallucination_rate: None,
            objective: Objective::Cheapest,
        };
        let d = decide(&no_floors, &cands, &P, NO_EXPLORE);
        assert_eq!((d.backend, d.reason), (Some(1), Reason::Cheapest), "{}", d.explanation);
        assert!(
            d.explanation.contains(
                "bad-cheap misses quality_degraded: bits_per_byte +0.500 (95% 0.400 to 0.600) against its peers"
            ),
            "{}",
            d.explanation
        );
        // The exploration share still reaches it, so that its scores stay fresh.
        let d = decide(&no_floors, &cands, &P, Draw { explore: 0.0, a: 0, b: 0 });
        assert_eq!((d.backend, d.reason), (Some(0), Reason::Explore));
        // Alone, it still serves (best effort): draining adds no failure mode.
        let d = decide(&no_floors, &cands[..1], &P, NO_EXPLORE);
        assert_eq!((d.backend, d.reason), (Some(0), Reason::SlaUnmet));
    }

    #[test]
    fn untrusted_statistics_do_not_disqualify_but_hold_back_a_backend_that_misses_already() {
        let new = |samples: u64, ttft: f64| {
            let mut c = cand("new", 0.1, ttft, 99.0);
            (c.stats.samples, c.stats.scored, c.stats.rated) = (samples, 2, 0);
            vec![cand("old", 1.0, 200.0, 10.0), c]
        };
        let pick = |cands: &[Candidate]| decide(&class(Objective::Cheapest), cands, &P, NO_EXPLORE);
        // Unmeasured, or its few samples within the bounds: the cheaper new backend is taken.
        assert_eq!(pick(&new(0, 5000.0)).backend, Some(1), "no samples: only its ttft field says 5 s");
        let d = pick(&new(3, 300.0));
        assert_eq!(d.backend, Some(1), "{}", d.explanation);
        // 3 samples at 5 s TTFT: too few to call it non-compliant, but the traffic stays on the
        // trusted compliant backend, and the new one keeps the exploration share.
        let d = pick(&new(3, 5000.0));
        assert_eq!((d.backend, d.reason), (Some(0), Reason::Cheapest), "{}", d.explanation);
        assert_eq!(d.compliant, Indices::from_slice(&[0, 1]), "not disqualified");
        assert!(
            d.explanation.contains("new held back: its 3 of 20 samples miss ttft p95 5000 ms > 500 ms"),
            "{}",
            d.explanation
        );
        let explored =
            decide(&class(Objective::Cheapest), &new(3, 5000.0), &P, Draw { explore: 0.0, a: 1, b: 1 });
        assert_eq!((explored.backend, explored.reason), (Some(1), Reason::Explore));
        // Every compliant backend held back (a cold start): the objective still decides.
        let mut both = new(3, 5000.0);
        both[0].stats.samples = 2;
        both[0].stats.ttft_p95_ms = Some(900.0);
        assert_eq!(pick(&both).backend, Some(1));
        assert_eq!(
            provisional_misses(&class(Objective::Cheapest), &both[0], &P),
            ["ttft p95 900 ms > 500 ms"]
        );
        assert!(
            provisional_misses(&class(Objective::Cheapest), &cand("trusted", 1.0, 900.0, 10.0), &P)
                .is_empty()
        );
    }

    #[test]
    fn an_unmeasured_backend_takes_one_request_at_a_time_until_its_first_sample_lands() {
        let mut new = cand("new", 0.1, 0.0, 99.0);
        new.stats = Stats::default();
        let cands = |awaiting: bool| {
            let mut n = new.clone();
            n.awaiting_sample = awaiting;
            vec![cand("old", 1.0, 200.0, 10.0), n]
        };
        let pick = |cands: &[Candidate]| decide(&class(Objective::Cheapest), cands, &P, NO_EXPLORE);
        // Nothing sent yet: the cheaper one takes the request, its probe.
        assert_eq!(pick(&cands(false)).backend, Some(1));
        // While that probe's sample is on its way, the class's traffic stays where it is known
        // to comply; exploration still reaches the new one.
        let d = pick(&cands(true));
        assert_eq!((d.backend, d.reason), (Some(0), Reason::Cheapest), "{}", d.explanation);
        assert_eq!(d.compliant, Indices::from_slice(&[0, 1]), "not disqualified");
        assert!(d.explanation.contains("new held back: its first sample is on its way"), "{}", d.explanation);
        let explored =
            decide(&class(Objective::Cheapest), &cands(true), &P, Draw { explore: 0.0, a: 1, b: 1 });
        assert_eq!((explored.backend, explored.reason), (Some(1), Reason::Explore));
        // A cold start, where every backend awaits its first sample: the objective decides.
        let mut cold = cands(true);
        cold[0].stats = Stats::default();
        cold[0].awaiting_sample = true;
        assert_eq!(pick(&cold).backend, Some(1));
    }

    #[test]
    fn best_effort_when_nothing_complies() {
        let cands = vec![cand("a", 1.0, 900.0, 30.0), cand("b", 2.0, 900.0, 10.0)];
        let d = decide(&class(Objective::Cheapest), &cands, &P, NO_EXPLORE);
        // a misses two bounds (ttft, perplexity), b one: b, flagged.
        assert_eq!((d.backend, d.reason), (Some(1), Reason::SlaUnmet));
        assert!(d.compliant.is_empty());
    }

    #[test]
    fn unhealthy_and_saturated_backends_are_skipped() {
        let mut a = cand("a", 1.0, 100.0, 10.0);
        a.healthy = false;
        let mut b = cand("b", 1.0, 100.0, 10.0);
        b.max_concurrency = Some(4);
        b.outstanding = 4;
        let d = decide(&class(Objective::Cheapest), &[a.clone(), b.clone()], &P, NO_EXPLORE);
        assert_eq!((d.backend, d.reason), (None, Reason::NoHealthyBackend));
        assert!(
            d.explanation.contains("a unhealthy") && d.explanation.contains("b at its concurrency limit")
        );
        let d = decide(&class(Objective::Cheapest), &[a, b, cand("c", 9.0, 100.0, 10.0)], &P, NO_EXPLORE);
        assert_eq!(d.backend, Some(2));
    }

    #[test]
    fn saturation_is_soft() {
        let mut busy = cand("busy", 1.0, 100.0, 10.0);
        busy.saturated = true;
        // Another backend is not saturated: the busy one is out, though cheaper.
        let d = decide(
            &class(Objective::Cheapest),
            &[busy.clone(), cand("calm", 9.0, 100.0, 10.0)],
            &P,
            NO_EXPLORE,
        );
        assert_eq!((d.backend, d.reason), (Some(1), Reason::Cheapest), "{}", d.explanation);
        assert!(d.explanation.contains("busy saturated"), "{}", d.explanation);
        // A sidecar's only backend is busy: it still serves, under the objective's reason, and
        // the explanation says it is saturated (not "no healthy backend").
        let d = decide(&class(Objective::Cheapest), std::slice::from_ref(&busy), &P, NO_EXPLORE);
        assert_eq!((d.backend, d.reason), (Some(0), Reason::Cheapest), "{}", d.explanation);
        assert!(
            d.explanation.contains("busy saturated") && d.explanation.contains("kept"),
            "{}",
            d.explanation
        );
        // Unhealthy beats saturated: the saturated one is kept when it is the only usable one.
        let mut down = cand("down", 0.5, 100.0, 10.0);
        down.healthy = false;
        let d = decide(&class(Objective::Cheapest), &[down, busy], &P, NO_EXPLORE);
        assert_eq!((d.backend, d.reason), (Some(1), Reason::Cheapest), "{}", d.explanation);
    }

    #[test]
    fn exploration_and_power_of_two_choices() {
        let cands =
            vec![cand("x", 1.0, 100.0, 10.0), cand("y", 1.02, 100.0, 10.0), cand("z", 9.0, 100.0, 10.0)];
        let d = decide(&class(Objective::Cheapest), &cands, &P, Draw { explore: 0.01, a: 2, b: 0 });
        assert_eq!((d.backend, d.reason), (Some(2), Reason::Explore));
        // x and y are within 5% on price: the less loaded of the two drawn wins.
        let mut loaded = cands.clone();
        loaded[0].outstanding = 7;
        let d = decide(&class(Objective::Cheapest), &loaded, &P, Draw { explore: 0.5, a: 0, b: 1 });
        assert_eq!(d.backend, Some(1), "{}", d.explanation);
        // Over many draws exploration is taken at about its share.
        let n = 10_000;
        let explored = (0..n)
            .filter(|i| {
                let e = (*i as f64 + 0.5) / n as f64;
                decide(&class(Objective::Cheapest), &cands, &P, Draw { explore: e, a: *i, b: i / 3 }).reason
                    == Reason::Explore
            })
            .count();
        assert_eq!(explored, 500);
    }
}
