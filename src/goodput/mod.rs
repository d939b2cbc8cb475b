//! Judging each request against its SLOs (latency goodput, as DistServe and
//! `vllm bench serve --goodput` define it).

use crate::config::Slo;
use crate::meter::record::{Outcome, RequestRecord};

/// Whether `r` met every SLO in `slo`. `None`: not judged (the client cancelled, so the
/// backend neither met nor missed anything). Errors always miss. A non-streaming response's
/// first token reaches the client with the whole body, so its TTFT is its e2e latency; TPOT
/// is only judged where it was measured (streams).
pub fn judge(r: &RequestRecord, slo: &Slo) -> Option<bool> {
    if r.outcome == Outcome::Cancelled {
        return None;
    }
    if r.outcome != Outcome::Ok {
        return Some(false);
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

/// The Wilson score interval for a proportion: `successes` of `n` at z (1.96 for 95%). Quality
/// is measured on a sample only, so the quality-weighted goodput carries this interval. `None`
/// without observations.
pub fn wilson(successes: u64, n: u64, z: f64) -> Option<(f64, f64)> {
    if n == 0 {
        return None;
    }
    let (n, p) = (n as f64, successes.min(n) as f64 / n as f64);
    let z2 = z * z;
    let center = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    Some(((center - half).max(0.0), (center + half).min(1.0)))
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
    }
    use crate::meter::record::TokenSource;
    use crate::openai::Operation;
    use std::time::Duration;

    fn rec(outcome: Outcome, ttft: Option<u64>, tpot: Option<u64>, e2e: u64) -> RequestRecord {
        RequestRecord {
            id: 1,
            start_unix_ms: 0,
            backend: "b".into(),
            route: "r".into(),
            model: "m".into(),
            operation: Operation::Chat,
            stream: ttft.is_some(),
            n: 1,
            status: 200,
            outcome,
            finish_reason: None,
            ttft: ttft.map(Duration::from_millis),
            tpot: tpot.map(Duration::from_millis),
            itl_mean: None,
            e2e: Duration::from_millis(e2e),
            prompt_tokens: None,
            prompt_source: TokenSource::None,
            completion_tokens: None,
            completion_source: TokenSource::None,
            content_chunks: 0,
            overhead: Duration::ZERO,
            slo_met: None,
            perplexity: None,
            bits_per_byte: None,
            texts: None,
            hallucination_score: None,
            sentence_scores: None,
            score_request: None,
            sample_perplexity: false,
            sample_consistency: false,
        }
    }

    const SLO: Slo = Slo { ttft_ms: Some(100.0), tpot_ms: Some(20.0), e2e_ms: Some(1000.0) };

    #[test]
    fn every_slo_must_hold() {
        assert_eq!(judge(&rec(Outcome::Ok, Some(100), Some(20), 1000), &SLO), Some(true));
        assert_eq!(judge(&rec(Outcome::Ok, Some(101), Some(20), 900), &SLO), Some(false));
        assert_eq!(judge(&rec(Outcome::Ok, Some(50), Some(21), 900), &SLO), Some(false));
        assert_eq!(judge(&rec(Outcome::Ok, Some(50), Some(10), 1001), &SLO), Some(false));
    }

    #[test]
    fn errors_miss_and_cancellations_are_not_judged() {
        assert_eq!(judge(&rec(Outcome::UpstreamReset, Some(1), Some(1), 2), &SLO), Some(false));
        assert_eq!(judge(&rec(Outcome::Timeout, None, None, 2), &SLO), Some(false));
        assert_eq!(judge(&rec(Outcome::Cancelled, Some(1), None, 2), &SLO), None);
    }

    #[test]
    fn non_streaming_ttft_is_e2e() {
        assert_eq!(judge(&rec(Outcome::Ok, None, None, 150), &SLO), Some(false));
        assert_eq!(judge(&rec(Outcome::Ok, None, None, 90), &SLO), Some(true));
        assert_eq!(judge(&rec(Outcome::Ok, None, None, 150), &Slo::default()), Some(true));
    }
}
