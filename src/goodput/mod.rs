//! Judging each request against its SLOs (latency goodput, as DistServe and
//! `vllm bench serve --goodput` define it).

use serde::Serialize;
use std::time::Duration;

use crate::config::Slo;

/// How a request ended, as far as its SLOs are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Answered,
    /// Any error: it misses every SLO.
    Failed,
    /// The client left: neither met nor missed.
    Cancelled,
    /// The request was the client's own error (`RequestRecord::latencies`): neither met nor
    /// missed, so a client that sends bad requests cannot burn the service's SLO budget.
    ClientFault,
}

/// What the SLO judgement reads of one request (`RequestRecord::latencies`).
#[derive(Debug, Clone, Copy)]
pub struct Latencies {
    pub ending: Ending,
    /// Streams only.
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Duration,
}

/// Whether `r` met every SLO in `slo`. `None`: not judged (the client cancelled, or the
/// request was its own error, so the backend neither met nor missed anything). Every other
/// error misses. A non-streaming response's first token reaches the client with the whole
/// body, so its TTFT is its e2e latency; TPOT is only judged where it was measured (streams).
pub fn judge(r: &Latencies, slo: &Slo) -> Option<bool> {
    match r.ending {
        Ending::Cancelled | Ending::ClientFault => return None,
        Ending::Failed => return Some(false),
        Ending::Answered => {}
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let ttft = r.ttft.unwrap_or(r.e2e);
    let ok_ttft = slo.ttft_ms.is_none_or(|t| ms(ttft) <= t);
    let ok_tpot = match (slo.tpot_ms, r.tpot) {
        (Some(t), Some(v)) => ms(v) <= t,
        _ => true,
    };
    let ok_e2e = slo.e2e_ms.is_none_or(|t| ms(r.e2e) <= t);
    Some(ok_ttft && ok_tpot && ok_e2e)
}

/// Goodput over a window, for one backend or one class. Quality-weighted figures are `None`
/// until some response in the window was judged for quality (they are not assumed perfect).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Goodput {
    /// All output tokens/s, SLO or not.
    pub tokens_per_sec: f64,
    /// Requests/s and output tokens/s that met every latency SLO of their class.
    pub latency_requests_per_sec: f64,
    pub latency_tokens_per_sec: f64,
    /// Share of quality judgements that passed the class's floors, and its 95% Wilson interval.
    pub quality_pass_rate: Option<f64>,
    pub quality_pass_interval: Option<(f64, f64)>,
    /// Latency goodput x the pass rate, with the interval carried over.
    pub quality_requests_per_sec: Option<f64>,
    pub quality_tokens_per_sec: Option<f64>,
    pub quality_tokens_per_sec_interval: Option<(f64, f64)>,
    /// What one million tokens (input and output) cost over the window, blended by traffic.
    pub price_per_1m_tokens: Option<f64>,
    /// The seed's indexes: tokens/s x (1 - hallucination rate), tokens/s / perplexity,
    /// tokens/s / (perplexity x price per 1M tokens).
    pub effective_tps: Option<f64>,
    /// The hallucination rate effective TPS is computed from, and both with the rate's 95%
    /// interval (sampling, and a calibrated threshold's own uncertainty).
    pub hallucination_rate: Option<f64>,
    pub hallucination_rate_interval: Option<(f64, f64)>,
    pub effective_tps_interval: Option<(f64, f64)>,
    pub tput_per_ppl: Option<f64>,
    pub tput_per_ppl_price: Option<f64>,
}

/// What a window measured that goodput is computed from (`WindowSnapshot::rates`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rates {
    /// All output tokens/s.
    pub output_tokens_per_sec: f64,
    /// Requests/s and output tokens/s that met every latency SLO.
    pub goodput_requests_per_sec: f64,
    pub goodput_tokens_per_sec: f64,
    /// Input and output tokens over the window, and what they cost.
    pub tokens: u64,
    pub cost: f64,
    /// Quality judgements over the quality window, and how many passed the floors.
    pub judged: u64,
    pub passed: u64,
    pub perplexity_geomean: Option<f64>,
    pub hallucination_rate: Option<f64>,
    pub hallucination_rate_interval: Option<(f64, f64)>,
}

/// The goodput figures of a window (latency counts, quality judgements, cost).
pub fn summarize(w: &Rates) -> Goodput {
    let tps = w.output_tokens_per_sec;
    let pass = (w.judged > 0).then(|| w.passed as f64 / w.judged as f64);
    let interval = wilson(w.passed, w.judged, 1.96);
    let price = (w.tokens > 0 && w.cost > 0.0).then(|| w.cost / w.tokens as f64 * 1e6);
    let ppl = w.perplexity_geomean;
    Goodput {
        tokens_per_sec: tps,
        latency_requests_per_sec: w.goodput_requests_per_sec,
        latency_tokens_per_sec: w.goodput_tokens_per_sec,
        quality_pass_rate: pass,
        quality_pass_interval: interval,
        quality_requests_per_sec: pass.map(|p| p * w.goodput_requests_per_sec),
        quality_tokens_per_sec: pass.map(|p| p * w.goodput_tokens_per_sec),
        quality_tokens_per_sec_interval: interval
            .map(|(lo, hi)| (lo * w.goodput_tokens_per_sec, hi * w.goodput_tokens_per_sec)),
        price_per_1m_tokens: price,
        effective_tps: w.hallucination_rate.map(|h| tps * (1.0 - h)),
        hallucination_rate: w.hallucination_rate,
        hallucination_rate_interval: w.hallucination_rate_interval,
        effective_tps_interval: w
            .hallucination_rate_interval
            .map(|(lo, hi)| (tps * (1.0 - hi), tps * (1.0 - lo))),
        tput_per_ppl: ppl.map(|p| tps / p),
        tput_per_ppl_price: ppl.zip(price).map(|(p, c)| tps / (p * c)),
    }
}

/// The Wilson score interval for a proportion: `successes` of `n` at z (1.96 for 95%). Quality
/// is measured on a sample only, so the quality-weighted goodput carries this interval. `None`
/// without observations.
pub fn wilson(successes: u64, n: u64, z: f64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    Some(wilson_p(successes.min(n) as f64 / n as f64, n as f64, z))
}

/// The same for a proportion `p` over `n` observations, where `n` may be an effective sample
/// size (not whole) that combines several sources of sampling error.
pub fn wilson_p(p: f64, n: f64, z: f64) -> (f64, f64) {
    let z2 = z * z;
    let center = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    // At p = 0 or 1 the bound is exact; rounding must not lift it off the estimate.
    let lo = if p <= 0.0 { 0.0 } else { (center - half).max(0.0) };
    let hi = if p >= 1.0 { 1.0 } else { (center + half).min(1.0) };
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_interval() {
        // Reference values (e.g. statsmodels proportion_confint(method="wilson")).
        let (lo, hi) = wilson(8, 10, 1.96).unwrap();
        assert!((lo - 0.4902).abs() < 1e-3 && (hi - 0.9433).abs() < 1e-3, "{lo} {hi}");
        let (lo, hi) = wilson(0, 50, 1.96).unwrap();
        assert!(lo == 0.0 && (hi - 0.0713).abs() < 1e-3, "{lo} {hi}");
        let (lo, hi) = wilson(500, 1000, 1.96).unwrap();
        assert!((lo - 0.4691).abs() < 1e-3 && (hi - 0.5309).abs() < 1e-3);
        assert_eq!(wilson(0, 0, 1.96), None);
        for n in 1..200 {
            assert_eq!(wilson(0, n, 1.96).unwrap().0, 0.0);
            assert_eq!(wilson(n, n, 1.96).unwrap().1, 1.0);
        }
    }
    #[test]
    fn goodput_summary() {
        let mut w = Rates {
            output_tokens_per_sec: 100.0,
            goodput_requests_per_sec: 2.0,
            goodput_tokens_per_sec: 80.0,
            ..Default::default()
        };
        let g = summarize(&w);
        assert_eq!((g.latency_tokens_per_sec, g.quality_tokens_per_sec), (80.0, None), "no judgement yet");
        w.tokens = 2_000_000;
        w.cost = 4.0;
        w.judged = 10;
        w.passed = 8;
        w.perplexity_geomean = Some(5.0);
        w.hallucination_rate = Some(0.25);
        w.hallucination_rate_interval = Some((0.1, 0.5));
        let g = summarize(&w);
        assert_eq!(g.quality_pass_rate, Some(0.8));
        assert_eq!(g.quality_tokens_per_sec, Some(64.0));
        let (lo, hi) = g.quality_tokens_per_sec_interval.unwrap();
        assert!((lo - 0.4902 * 80.0).abs() < 0.1 && (hi - 0.9433 * 80.0).abs() < 0.1, "{lo} {hi}");
        assert_eq!(g.price_per_1m_tokens, Some(2.0));
        assert_eq!(g.effective_tps, Some(75.0));
        // The rate's upper bound gives effective TPS's lower one.
        assert_eq!(g.effective_tps_interval, Some((50.0, 90.0)));
        assert_eq!(g.tput_per_ppl, Some(20.0));
        assert_eq!(g.tput_per_ppl_price, Some(10.0));
    }

    fn rec(ending: Ending, ttft: Option<u64>, tpot: Option<u64>, e2e: u64) -> Latencies {
        Latencies {
            ending,
            ttft: ttft.map(Duration::from_millis),
            tpot: tpot.map(Duration::from_millis),
            e2e: Duration::from_millis(e2e),
        }
    }

    const SLO: Slo = Slo { ttft_ms: Some(100.0), tpot_ms: Some(20.0), e2e_ms: Some(1000.0) };

    #[test]
    fn every_slo_must_hold() {
        assert_eq!(judge(&rec(Ending::Answered, Some(100), Some(20), 1000), &SLO), Some(true));
        assert_eq!(judge(&rec(Ending::Answered, Some(101), Some(20), 900), &SLO), Some(false));
        assert_eq!(judge(&rec(Ending::Answered, Some(50), Some(21), 900), &SLO), Some(false));
        assert_eq!(judge(&rec(Ending::Answered, Some(50), Some(10), 1001), &SLO), Some(false));
    }

    #[test]
    fn errors_miss_and_cancellations_are_not_judged() {
        assert_eq!(judge(&rec(Ending::Failed, Some(1), Some(1), 2), &SLO), Some(false));
        assert_eq!(judge(&rec(Ending::Failed, None, None, 2), &SLO), Some(false));
        assert_eq!(judge(&rec(Ending::Cancelled, Some(1), None, 2), &SLO), None);
        assert_eq!(judge(&rec(Ending::ClientFault, None, None, 2), &SLO), None);
    }

    #[test]
    fn non_streaming_ttft_is_e2e() {
        assert_eq!(judge(&rec(Ending::Answered, None, None, 150), &SLO), Some(false));
        assert_eq!(judge(&rec(Ending::Answered, None, None, 90), &SLO), Some(true));
        assert_eq!(judge(&rec(Ending::Answered, None, None, 150), &Slo::default()), Some(true));
    }
}
