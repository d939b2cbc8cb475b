//! Sliding windows per backend: latency quantiles and counts over the last N seconds.
//!
//! A window is a ring of one-second slots, each with HDR histograms (2 significant digits,
//! i.e. 1% relative error) and counters. Only the recorder thread writes; readers get an
//! immutable `WindowSnapshot` published through `ArcSwap`, so the router never takes a lock.

use crate::quality::calibration::Verdict;
use crate::quality::drift::{Drift, Moments, Signal};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::HashMap;
use std::time::Duration;

use super::record::{Outcome, RequestRecord};

const MAX_MICROS: u64 = 3_600_000_000;

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_MICROS, 2).expect("valid bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_MICROS)
}

/// The three latency histograms a slot and the window's running total keep.
#[derive(Clone)]
struct Hists {
    ttft: Histogram<u64>,
    tpot: Histogram<u64>,
    e2e: Histogram<u64>,
}

impl Hists {
    fn new() -> Hists {
        Hists { ttft: new_hist(), tpot: new_hist(), e2e: new_hist() }
    }

    fn reset(&mut self) {
        self.ttft.reset();
        self.tpot.reset();
        self.e2e.reset();
    }

    fn add(&mut self, o: &Hists) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.ttft.add(&o.ttft);
        let _ = self.tpot.add(&o.tpot);
        let _ = self.e2e.add(&o.e2e);
    }

    /// False when `o` holds a count this does not (the running total would be wrong).
    fn subtract(&mut self, o: &Hists) -> bool {
        self.ttft.subtract(&o.ttft).is_ok()
            && self.tpot.subtract(&o.tpot).is_ok()
            && self.e2e.subtract(&o.e2e).is_ok()
    }
}

#[derive(Clone)]
struct Slot {
    /// u64::MAX: empty (never used, or left the window).
    second: u64,
    h: Hists,
    counts: Counts,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Counts {
    pub requests: u64,
    /// The backend failed: 5xx, an error event, a reset, a refused connection, a timeout (what
    /// the circuit breaker counts).
    pub errors: u64,
    /// The backend answered 4xx: the request's doing, not the backend's health.
    pub client_errors: u64,
    /// goodput refused the request before or instead of the backend (413, at capacity).
    pub rejected: u64,
    pub cancelled: u64,
    pub slo_judged: u64,
    pub slo_met: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub slo_met_output_tokens: u64,
    /// What the window's tokens cost at the backends' prices.
    pub cost: f64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.client_errors += o.client_errors;
        self.rejected += o.rejected;
        self.cancelled += o.cancelled;
        self.slo_judged += o.slo_judged;
        self.slo_met += o.slo_met;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.slo_met_output_tokens += o.slo_met_output_tokens;
        self.cost += o.cost;
    }
}

pub struct Window {
    slots: Vec<Slot>,
    /// The sum of every non-empty slot's histograms, kept as records come in and slots empty,
    /// so that a snapshot reads its quantiles from it without merging. Merging every slot took
    /// 518 µs for a full 60 s window (three histograms per second of it), once a second per
    /// window; a slot that empties is one subtraction per histogram.
    total: Hists,
}

/// Quantiles in seconds; `None` when the window saw no sample.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Quantiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
}

impl Quantiles {
    fn of(h: &Histogram<u64>) -> Quantiles {
        if h.is_empty() {
            return Quantiles::default();
        }
        let q = |p: f64| Some(h.value_at_quantile(p) as f64 / 1e6);
        Quantiles {
            count: h.len(),
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            mean: Some(h.mean() / 1e6),
        }
    }
}

/// Per endpoint of each pool: backend name, then endpoint label.
pub type EndpointWindows =
    std::collections::HashMap<String, std::collections::HashMap<String, WindowSnapshot>>;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WindowSnapshot {
    pub window_secs: u64,
    pub ttft: Quantiles,
    pub tpot: Quantiles,
    pub e2e: Quantiles,
    pub counts: Counts,
    /// Per second over the window.
    pub request_rate: f64,
    pub output_tokens_per_sec: f64,
    pub goodput_requests_per_sec: f64,
    pub goodput_tokens_per_sec: f64,
    /// slo_met / slo_judged.
    pub slo_attainment: Option<f64>,
    /// errors / requests: the backend's failures only. A client that sends bad requests or
    /// a request goodput refuses does not make a backend look unhealthy.
    pub error_rate: Option<f64>,
    /// Scored responses over the (longer) quality window.
    pub quality: QualitySnapshot,
    /// Latency and quality-weighted goodput and the seed indexes (filled when published).
    pub goodput: crate::goodput::Goodput,
}

impl WindowSnapshot {
    /// What goodput is computed from.
    pub fn rates(&self) -> crate::goodput::Rates {
        crate::goodput::Rates {
            output_tokens_per_sec: self.output_tokens_per_sec,
            goodput_requests_per_sec: self.goodput_requests_per_sec,
            goodput_tokens_per_sec: self.goodput_tokens_per_sec,
            tokens: self.counts.input_tokens + self.counts.output_tokens,
            cost: self.counts.cost,
            judged: self.quality.judged,
            passed: self.quality.passed,
            perplexity_geomean: self.quality.perplexity_geomean,
            hallucination_rate: self.quality.hallucination_rate,
            hallucination_rate_interval: self.quality.hallucination_rate_interval,
        }
    }
}

impl Window {
    pub fn new(window_secs: u64) -> Window {
        let n = window_secs.clamp(1, 3600) as usize;
        let slot = Slot { second: u64::MAX, h: Hists::new(), counts: Counts::default() };
        Window { slots: vec![slot; n], total: Hists::new() }
    }

    pub fn len_secs(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Empty slot `i`, taking its histograms out of the running total.
    fn clear(&mut self, i: usize) {
        let s = &mut self.slots[i];
        if s.second == u64::MAX {
            return;
        }
        let consistent = self.total.subtract(&s.h);
        s.second = u64::MAX;
        s.h.reset();
        s.counts = Counts::default();
        if !consistent {
            // Cannot happen while the total is the slots' sum; if it ever is not, rebuild it.
            self.total.reset();
            for s in self.slots.iter().filter(|s| s.second != u64::MAX) {
                self.total.add(&s.h);
            }
        }
    }

    /// Add a finished record at `second` (a monotonic second count) and what its tokens cost.
    pub fn add(&mut self, second: u64, r: &RequestRecord, cost: f64) {
        let i = (second % self.slots.len() as u64) as usize;
        if self.slots[i].second != second {
            self.clear(i);
            self.slots[i].second = second;
        }
        let (s, total) = (&mut self.slots[i], &mut self.total);
        let c = &mut s.counts;
        c.requests += 1;
        c.cost += cost;
        c.errors += u64::from(r.outcome.is_upstream_failure());
        c.client_errors += u64::from(r.outcome == Outcome::ClientError);
        c.rejected += u64::from(r.outcome == Outcome::Rejected);
        c.cancelled += u64::from(r.outcome == Outcome::Cancelled);
        c.input_tokens += r.prompt_tokens.unwrap_or(0);
        c.output_tokens += r.completion_tokens.unwrap_or(0);
        if let Some(met) = r.slo_met {
            c.slo_judged += 1;
            if met {
                c.slo_met += 1;
                c.slo_met_output_tokens += r.completion_tokens.unwrap_or(0);
            }
        }
        if !r.outcome.is_error() {
            // Values are clamped into the histograms' bounds: recording cannot fail.
            if let Some(t) = r.ttft.map(micros) {
                let _ = s.h.ttft.record(t);
                let _ = total.ttft.record(t);
            }
            if let Some(t) = r.tpot.map(micros) {
                let _ = s.h.tpot.record(t);
                let _ = total.tpot.record(t);
            }
            if r.outcome == Outcome::Ok {
                let t = micros(r.e2e);
                let _ = s.h.e2e.record(t);
                let _ = total.e2e.record(t);
            }
        }
    }

    /// The last `len_secs` seconds ending at `now_second`.
    pub fn snapshot(&mut self, now_second: u64) -> WindowSnapshot {
        let n = self.slots.len() as u64;
        let mut ahead = false;
        for i in 0..self.slots.len() {
            let second = self.slots[i].second;
            if second == u64::MAX {
                continue;
            }
            if second > now_second {
                ahead = true; // only when seconds go back, which the recorder's clock does not
            } else if now_second - second >= n {
                self.clear(i);
            }
        }
        let within = |s: &&Slot| s.second != u64::MAX && s.second <= now_second;
        let mut counts = Counts::default();
        for s in self.slots.iter().filter(within) {
            counts.add(&s.counts);
        }
        let merged;
        let h = if ahead {
            let mut m = Hists::new();
            for s in self.slots.iter().filter(within) {
                m.add(&s.h);
            }
            merged = m;
            &merged
        } else {
            &self.total
        };
        let secs = n as f64;
        let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        WindowSnapshot {
            window_secs: n,
            ttft: Quantiles::of(&h.ttft),
            tpot: Quantiles::of(&h.tpot),
            e2e: Quantiles::of(&h.e2e),
            request_rate: counts.requests as f64 / secs,
            output_tokens_per_sec: counts.output_tokens as f64 / secs,
            goodput_requests_per_sec: counts.slo_met as f64 / secs,
            goodput_tokens_per_sec: counts.slo_met_output_tokens as f64 / secs,
            slo_attainment: ratio(counts.slo_met, counts.slo_judged),
            error_rate: ratio(counts.errors, counts.requests),
            counts,
            quality: QualitySnapshot::default(),
            goodput: Default::default(),
        }
    }
}

/// Quality scores are sparse (a sampled share of responses), so their window is longer than
/// latency's and its slots are coarser.
const QUALITY_SLOT_SECS: u64 = 10;
/// Perplexity is kept in thousandths in an integer histogram.
const PPL_SCALE: f64 = 1000.0;

#[derive(Clone)]
struct QualitySlot {
    index: u64,
    perplexity: Histogram<u64>,
    bits_per_byte_sum: f64,
    log_perplexity_sum: f64,
    tokens: u64,
    checked: u64,
    rated: u64,
    hallucinated: u64,
    /// Verdicts at the ends of a calibrated threshold's band (`quality::calibration::Verdict`).
    hallucinated_upper: u64,
    hallucinated_lower: u64,
    consistency_sum: f64,
    judged: u64,
    passed: u64,
    /// Per drift signal (`quality::drift::Signal::ALL` order).
    moments: [Moments; 2],
}

pub struct QualityWindow {
    slots: Vec<QualitySlot>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QualitySnapshot {
    pub window_secs: u64,
    pub scored: u64,
    pub scored_tokens: u64,
    pub perplexity_p50: Option<f64>,
    pub perplexity_p90: Option<f64>,
    pub perplexity_p95: Option<f64>,
    /// exp(mean ln ppl): the typical perplexity, not dragged by one degenerate response.
    pub perplexity_geomean: Option<f64>,
    pub bits_per_byte_mean: Option<f64>,
    /// Responses checked for consistency.
    pub consistency_checked: u64,
    /// Those whose score gave a verdict (a probability method, or a calibrated threshold),
    /// the hallucinated among them, and their share: null while no check gave a verdict.
    pub consistency_rated: u64,
    pub hallucinated: u64,
    pub hallucination_rate: Option<f64>,
    /// Its 95% interval: the Wilson intervals of the verdicts at the ends of a calibrated
    /// threshold's band, so it carries the calibration's uncertainty as well as the sample's.
    pub hallucination_rate_interval: Option<(f64, f64)>,
    pub consistency_score_mean: Option<f64>,
    /// Quality judgements (one per perplexity score, one per consistency check) and those
    /// that passed the class's floors: the pass rate that weights goodput.
    pub judged: u64,
    pub passed: u64,
    /// Per drift signal (`Signal::ALL` order): what drift is computed from.
    #[serde(skip)]
    pub moments: [Moments; 2],
}

impl QualityWindow {
    pub fn new(window_secs: u64) -> QualityWindow {
        let n = Self::slot_count(window_secs);
        let slot = QualitySlot {
            index: u64::MAX,
            perplexity: Histogram::new_with_bounds(1, 1_000_000_000_000, 2).expect("valid bounds"),
            bits_per_byte_sum: 0.0,
            log_perplexity_sum: 0.0,
            tokens: 0,
            checked: 0,
            rated: 0,
            hallucinated: 0,
            hallucinated_upper: 0,
            hallucinated_lower: 0,
            consistency_sum: 0.0,
            judged: 0,
            passed: 0,
            moments: Default::default(),
        };
        QualityWindow { slots: vec![slot; n] }
    }

    pub fn len_secs(&self) -> u64 {
        self.slots.len() as u64 * QUALITY_SLOT_SECS
    }

    /// The length a window made for `window_secs` has (rounded up to whole slots).
    pub fn len_for(window_secs: u64) -> u64 {
        Self::slot_count(window_secs) as u64 * QUALITY_SLOT_SECS
    }

    fn slot_count(window_secs: u64) -> usize {
        window_secs.div_ceil(QUALITY_SLOT_SECS).clamp(1, 8640) as usize
    }

    fn slot(&mut self, second: u64) -> &mut QualitySlot {
        let index = second / QUALITY_SLOT_SECS;
        let n = self.slots.len() as u64;
        let s = &mut self.slots[(index % n) as usize];
        if s.index != index {
            s.index = index;
            s.perplexity.reset();
            s.bits_per_byte_sum = 0.0;
            s.log_perplexity_sum = 0.0;
            s.tokens = 0;
            s.checked = 0;
            s.rated = 0;
            s.hallucinated = 0;
            s.hallucinated_upper = 0;
            s.hallucinated_lower = 0;
            s.consistency_sum = 0.0;
            s.judged = 0;
            s.passed = 0;
            s.moments = Default::default();
        }
        s
    }

    /// A consistency check: its score, and its verdict when its method gives one
    /// (`quality::calibration`). Only a verdict counts toward the rate and the pass rate.
    pub fn add_consistency(&mut self, second: u64, score: f64, verdict: Option<Verdict>) {
        if !score.is_finite() {
            return;
        }
        let s = self.slot(second);
        s.checked += 1;
        s.consistency_sum += score;
        s.moments[1].add(score);
        if let Some(v) = verdict {
            let h = v.hallucinated;
            s.rated += 1;
            s.hallucinated += u64::from(h);
            s.hallucinated_upper += u64::from(v.upper);
            s.hallucinated_lower += u64::from(v.lower);
            s.judged += 1;
            s.passed += u64::from(!h);
        }
    }

    /// A perplexity score; `passed`: within the class's `max_perplexity` (or none is set).
    pub fn add(&mut self, second: u64, perplexity: f64, bits_per_byte: f64, tokens: u64, passed: bool) {
        if !(perplexity.is_finite() && perplexity >= 1.0 && bits_per_byte.is_finite()) {
            return;
        }
        let s = self.slot(second);
        s.judged += 1;
        s.passed += u64::from(passed);
        let _ = s.perplexity.record(((perplexity * PPL_SCALE) as u64).clamp(1, 1_000_000_000_000));
        s.bits_per_byte_sum += bits_per_byte;
        s.moments[0].add(bits_per_byte);
        s.log_perplexity_sum += perplexity.ln();
        s.tokens += tokens;
    }

    /// The slots still inside the window at `now_second`.
    fn live(&self, now_second: u64) -> impl Iterator<Item = &QualitySlot> {
        let now = now_second / QUALITY_SLOT_SECS;
        let n = self.slots.len() as u64;
        self.slots.iter().filter(move |s| s.index != u64::MAX && s.index <= now && now - s.index < n)
    }

    /// The drift signals' moments over the window, without the histogram merge of `snapshot`.
    pub fn moments(&self, now_second: u64) -> [Moments; 2] {
        let mut out = [Moments::default(); 2];
        for s in self.live(now_second) {
            for (o, x) in out.iter_mut().zip(&s.moments) {
                o.merge(x);
            }
        }
        out
    }

    pub fn snapshot(&self, now_second: u64) -> QualitySnapshot {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000_000, 2).expect("valid bounds");
        let (mut bpb, mut lnp, mut tokens) = (0.0, 0.0, 0);
        let (mut checked, mut rated, mut hallucinated, mut csum) = (0, 0, 0, 0.0);
        let (mut upper, mut lower) = (0, 0);
        let (mut judged, mut passed) = (0, 0);
        for s in self.live(now_second) {
            let _ = h.add(&s.perplexity);
            bpb += s.bits_per_byte_sum;
            lnp += s.log_perplexity_sum;
            tokens += s.tokens;
            checked += s.checked;
            rated += s.rated;
            hallucinated += s.hallucinated;
            upper += s.hallucinated_upper;
            lower += s.hallucinated_lower;
            csum += s.consistency_sum;
            judged += s.judged;
            passed += s.passed;
        }
        let count = h.len();
        let q = |p: f64| (count > 0).then(|| h.value_at_quantile(p) as f64 / PPL_SCALE);
        QualitySnapshot {
            window_secs: self.len_secs(),
            scored: count,
            scored_tokens: tokens,
            perplexity_p50: q(0.5),
            perplexity_p90: q(0.9),
            perplexity_p95: q(0.95),
            perplexity_geomean: (count > 0).then(|| (lnp / count as f64).exp()),
            bits_per_byte_mean: (count > 0).then(|| bpb / count as f64),
            consistency_checked: checked,
            consistency_rated: rated,
            hallucinated,
            hallucination_rate: (rated > 0).then(|| hallucinated as f64 / rated as f64),
            hallucination_rate_interval: crate::goodput::wilson(lower, rated, 1.96)
                .zip(crate::goodput::wilson(upper, rated, 1.96))
                .map(|(l, u)| (l.0, u.1)),
            consistency_score_mean: (checked > 0).then(|| csum / checked as f64),
            judged,
            passed,
            moments: self.moments(now_second),
        }
    }
}

/// The drift signals' moments over a long window (the baseline a unit without peers is
/// compared with): minute slots, sums only.
pub struct MomentWindow {
    /// (slot index, moments per signal).
    slots: Vec<(u64, [Moments; 2])>,
}

const MOMENT_SLOT_SECS: u64 = 60;

impl MomentWindow {
    pub fn new(window_secs: u64) -> MomentWindow {
        let n = (Self::len_for(window_secs) / MOMENT_SLOT_SECS) as usize;
        MomentWindow { slots: vec![(u64::MAX, Default::default()); n] }
    }

    pub fn len_secs(&self) -> u64 {
        self.slots.len() as u64 * MOMENT_SLOT_SECS
    }

    pub fn len_for(window_secs: u64) -> u64 {
        window_secs.div_ceil(MOMENT_SLOT_SECS).clamp(1, 10_080) * MOMENT_SLOT_SECS
    }

    pub fn add(&mut self, second: u64, signal: Signal, x: f64) {
        let index = second / MOMENT_SLOT_SECS;
        let n = self.slots.len() as u64;
        let s = &mut self.slots[(index % n) as usize];
        if s.0 != index {
            *s = (index, Default::default());
        }
        s.1[signal as usize].add(x);
    }

    pub fn total(&self, now_second: u64) -> [Moments; 2] {
        let now = now_second / MOMENT_SLOT_SECS;
        let n = self.slots.len() as u64;
        let mut out = [Moments::default(); 2];
        for (index, m) in &self.slots {
            if *index == u64::MAX || *index > now || now - *index >= n {
                continue;
            }
            for (o, x) in out.iter_mut().zip(m) {
                o.merge(x);
            }
        }
        out
    }
}

/// Drift by backend, and by backend then endpoint (absent: too few scores). The recorder
/// publishes it; the router drains what is confidently worse.
#[derive(Debug, Default)]
pub struct DriftView {
    pub backends: HashMap<String, Vec<Drift>>,
    pub endpoints: HashMap<String, HashMap<String, Vec<Drift>>>,
}

impl DriftView {
    /// A backend's confident drift in one of `signals`, if any.
    pub fn backend(&self, name: &str, signals: &[Signal]) -> Option<&Drift> {
        confident(self.backends.get(name)?, signals)
    }
}

/// The first confident drift of `signals`, in `Signal::ALL` order (bits per byte, then
/// consistency).
pub fn confident<'a>(ds: &'a [Drift], signals: &[Signal]) -> Option<&'a Drift> {
    ds.iter().find(|d| d.confident && signals.contains(&d.signal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::record::TokenSource;
    use crate::openai::Operation;

    fn rec(ttft_ms: u64, ok: bool, met: bool) -> RequestRecord {
        RequestRecord {
            stream: true,
            status: 200,
            outcome: if ok { Outcome::Ok } else { Outcome::UpstreamError },
            ttft: Some(Duration::from_millis(ttft_ms)),
            e2e: Duration::from_millis(ttft_ms * 2),
            prompt_tokens: Some(1),
            prompt_source: TokenSource::Usage,
            completion_tokens: Some(10),
            completion_source: TokenSource::Usage,
            content_chunks: 10,
            slo_met: Some(met),
            ..RequestRecord::start(0, Operation::Chat)
        }
    }

    #[test]
    fn quantiles_over_window() {
        let mut w = Window::new(10);
        for i in 1..=100 {
            w.add(5, &rec(i, true, i <= 90), 0.0);
        }
        let s = w.snapshot(5);
        assert_eq!(s.ttft.count, 100);
        let p50 = s.ttft.p50.unwrap();
        assert!((p50 - 0.050).abs() < 0.001, "{p50}");
        let p99 = s.ttft.p99.unwrap();
        assert!((p99 - 0.099).abs() < 0.002, "{p99}");
        assert_eq!(s.slo_attainment, Some(0.9));
        assert_eq!(s.counts.output_tokens, 1000);
        assert_eq!(s.goodput_tokens_per_sec, 90.0);
    }

    #[test]
    fn old_slots_expire() {
        let mut w = Window::new(10);
        w.add(1, &rec(10, true, true), 0.0);
        w.add(12, &rec(20, false, false), 0.0);
        let s = w.snapshot(12);
        assert_eq!(s.counts.requests, 1, "second 1 is outside [3, 12]");
        assert_eq!(s.error_rate, Some(1.0));
        assert_eq!(s.ttft.count, 0, "errors do not enter latency quantiles");
        assert_eq!(w.snapshot(30).counts.requests, 0);
    }

    #[test]
    fn error_rate_counts_the_backends_failures_not_the_clients() {
        let mut w = Window::new(10);
        let with = |outcome| RequestRecord { outcome, ..rec(10, true, true) };
        for o in [Outcome::Ok, Outcome::ClientError, Outcome::Rejected, Outcome::Cancelled, Outcome::Timeout]
        {
            w.add(1, &with(o), 0.0);
        }
        let s = w.snapshot(1);
        assert_eq!((s.counts.errors, s.counts.client_errors, s.counts.rejected), (1, 1, 1));
        assert_eq!(s.error_rate, Some(0.2));
        assert_eq!(s.ttft.count, 2, "only answered requests enter latency quantiles");
    }

    #[test]
    fn quality_window() {
        let mut q = QualityWindow::new(60);
        assert_eq!(q.len_secs(), 60);
        for (i, p) in [2.0, 8.0, 4.0].iter().enumerate() {
            q.add(i as u64, *p, 1.0, 10, *p < 5.0);
        }
        q.add(3, f64::NAN, 1.0, 1, true);
        let s = q.snapshot(5);
        assert_eq!((s.scored, s.scored_tokens), (3, 30));
        assert!((s.perplexity_geomean.unwrap() - 4.0).abs() < 1e-9);
        assert!((s.perplexity_p50.unwrap() - 4.0).abs() < 0.05);
        assert_eq!(s.bits_per_byte_mean, Some(1.0));
        assert_eq!((s.judged, s.passed), (3, 2), "8.0 failed its floor; NaN is not judged");
        assert_eq!(q.snapshot(70).scored, 0, "slot 0 (seconds 0-9) left the 60 s window");
        // A score without a verdict (an uncalibrated ranking method) is no rate.
        q.add_consistency(71, 0.9, None);
        let s = q.snapshot(75);
        assert_eq!((s.consistency_checked, s.consistency_rated, s.hallucination_rate), (1, 0, None));
        assert_eq!((s.judged, s.passed), (0, 0), "no verdict is no judgement");
        let v = |hallucinated, upper, lower| Some(Verdict { hallucinated, upper, lower });
        q.add_consistency(71, 0.8, v(true, true, true));
        q.add_consistency(72, 0.1, v(false, false, false));
        q.add_consistency(73, f64::NAN, v(true, true, true));
        let s = q.snapshot(75);
        assert_eq!((s.consistency_checked, s.consistency_rated, s.hallucinated), (3, 2, 1));
        assert_eq!(s.hallucination_rate, Some(0.5));
        assert!((s.consistency_score_mean.unwrap() - 0.6).abs() < 1e-12);
        // Without a band the interval is the verdicts' Wilson interval (1 of 2).
        let (lo, hi) = s.hallucination_rate_interval.unwrap();
        assert!((lo - 0.0945).abs() < 1e-3 && (hi - 0.9055).abs() < 1e-3, "{lo} {hi}");
        // A response inside the band counts toward the upper bound only.
        for second in 74..78 {
            q.add_consistency(second, 0.5, v(false, true, false));
        }
        let s = q.snapshot(78);
        assert_eq!(s.hallucination_rate, Some(1.0 / 6.0));
        let (lo, hi) = s.hallucination_rate_interval.unwrap();
        let (lo1, _) = crate::goodput::wilson(1, 6, 1.96).unwrap();
        let (_, hi5) = crate::goodput::wilson(5, 6, 1.96).unwrap();
        assert_eq!((lo, hi), (lo1, hi5));
    }

    /// The running total against merging every slot afresh, over adds and snapshots in any
    /// order: the clock moving on, standing still, gaps longer than the window, and records
    /// and snapshots for an earlier second than the last one's.
    #[test]
    fn snapshots_equal_a_fresh_merge_of_every_slot() {
        let fresh = |w: &Window, now: u64| {
            let n = w.slots.len() as u64;
            let (mut ttft, mut tpot, mut e2e) = (new_hist(), new_hist(), new_hist());
            let mut counts = Counts::default();
            for s in w.slots.iter().filter(|s| s.second != u64::MAX && s.second <= now && now - s.second < n)
            {
                ttft.add(&s.h.ttft).unwrap();
                tpot.add(&s.h.tpot).unwrap();
                e2e.add(&s.h.e2e).unwrap();
                counts.add(&s.counts);
            }
            (Quantiles::of(&ttft), Quantiles::of(&tpot), Quantiles::of(&e2e), counts)
        };
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for n in [1, 2, 3, 10] {
            let mut w = Window::new(n);
            let mut now = 0;
            for step in 0..3000 {
                match next(10) {
                    0 => now += 1,
                    1 => now += next(3 * n + 2),
                    2 => now = now.saturating_sub(next(n + 2)),
                    3..=6 => {
                        let ms = 1 + next(500);
                        // Whole costs keep the float sums exact in any order.
                        w.add(now, &rec(ms, next(4) != 0, next(2) == 0), next(3) as f64);
                    }
                    _ => {
                        let s = w.snapshot(now);
                        let (ttft, tpot, e2e, counts) = fresh(&w, now);
                        let at = format!("window {n} s, step {step}, second {now}");
                        assert_eq!((s.ttft, s.tpot, s.e2e), (ttft, tpot, e2e), "{at}");
                        assert_eq!(s.counts, counts, "{at}");
                    }
                }
            }
        }
    }

    #[test]
    fn slot_reuse_resets() {
        let mut w = Window::new(2);
        w.add(0, &rec(10, true, true), 0.0);
        w.add(2, &rec(30, true, true), 0.0);
        let s = w.snapshot(2);
        assert_eq!(s.counts.requests, 1);
        assert!((s.ttft.p50.unwrap() - 0.030).abs() < 0.001);
    }

    #[test]
    fn a_drift_drains_only_in_the_signals_asked_for() {
        use crate::quality::drift::Reference;
        let d = |signal, confident| Drift {
            signal,
            estimate: 0.3,
            lower: 0.2,
            upper: 0.4,
            n: 20,
            reference_n: 20,
            reference: Reference::Baseline,
            confident,
        };
        let mut v = DriftView::default();
        v.endpoints
            .entry("pool".into())
            .or_default()
            .insert("a:1".into(), vec![d(Signal::BitsPerByte, false), d(Signal::Consistency, true)]);
        v.backends.insert("pool".into(), vec![d(Signal::BitsPerByte, true)]);
        let a = &v.endpoints["pool"]["a:1"];
        assert!(confident(a, &[Signal::BitsPerByte]).is_none());
        assert_eq!(confident(a, &Signal::ALL).map(|d| d.signal), Some(Signal::Consistency));
        assert!(v.backend("pool", &[Signal::BitsPerByte]).is_some());
        assert!(v.backend("pool", &[]).is_none());
    }
}
