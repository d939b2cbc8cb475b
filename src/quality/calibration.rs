//! From consistency scores to a hallucination rate. A method whose score is a probability
//! (`prompt`) gives a rate through `quality.consistency.threshold`; a ranking method
//! (`unigram`, `embedding`) only orders responses, so its threshold is calibrated on a
//! reference taken as healthy with a stated error rate: the score above which that share of
//! the reference's checked responses lie. Until then no rate is reported (null), never a
//! number that reads as one and is not.
//!
//! Pure state, owned by the recorder thread; what admin shows is its `view`.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

use crate::config::{CalibrationConfig, ConsistencyConfig, Method};

/// A calibrated threshold and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    pub method: Method,
    pub threshold: f64,
    /// The backend whose checks set it.
    pub reference: String,
    pub checks: usize,
    pub reference_rate: f64,
    /// The stated rate's 95% interval: its sampling error over `checks` reference checks and,
    /// where stated, over the labelled answers it was measured on (`reference_labelled`).
    #[serde(default)]
    pub reference_rate_interval: Option<[f64; 2]>,
    /// The thresholds at that interval's ends, `[upper, lower]`: the share of responses above
    /// the first bounds the rate from above, above the second from below, so that the reported
    /// interval carries the calibration's own uncertainty, not only the sampling of verdicts.
    /// Absent in a file stored before it existed.
    #[serde(default)]
    pub band: Option<[f64; 2]>,
    /// Unix seconds.
    pub calibrated_at: u64,
}

/// One check's verdict, and the verdicts at the ends of a calibrated threshold's band (equal
/// to it where the threshold is configured, or stored without a band).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub hallucinated: bool,
    /// Above the band's lower threshold: counts toward the rate's upper bound.
    pub upper: bool,
    /// Above the band's upper threshold: counts toward the rate's lower bound.
    pub lower: bool,
}

/// Per backend, what its rate comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RateSource {
    /// The method's score is a probability: `threshold` from the config.
    Probability {
        method: Method,
        threshold: f64,
    },
    Calibrated(Threshold),
    /// Collecting the reference's scores: `have` of `need`; no rate meanwhile.
    Calibrating {
        method: Method,
        reference: String,
        have: usize,
        need: usize,
    },
    /// A ranking method and no calibration configured: scores, no rate.
    Uncalibrated {
        method: Method,
    },
}

impl RateSource {
    pub fn threshold(&self) -> Option<f64> {
        match self {
            RateSource::Probability { threshold, .. } => Some(*threshold),
            RateSource::Calibrated(t) => Some(t.threshold),
            _ => None,
        }
    }

    /// The verdict on `score`; none where no rate is given (calibrating, uncalibrated).
    pub fn verdict(&self, score: f64) -> Option<Verdict> {
        let t = self.threshold()?;
        let h = score > t;
        let band = match self {
            RateSource::Calibrated(c) => c.band,
            _ => None,
        };
        Some(match band {
            Some([upper, lower]) => Verdict { hallucinated: h, upper: score > upper, lower: score > lower },
            None => Verdict { hallucinated: h, upper: h, lower: h },
        })
    }
}

/// The stated reference rate's 95% interval. `checks` reference checks and `labelled` answers
/// (where stated) each sample it; their errors add, so the effective sample size is
/// 1 / (1/checks + 1/labelled).
pub fn reference_interval(rate: f64, checks: usize, labelled: Option<usize>) -> (f64, f64) {
    let inv = 1.0 / checks.max(1) as f64 + labelled.map_or(0.0, |l| 1.0 / l.max(1) as f64);
    crate::goodput::wilson_p(rate, 1.0 / inv, 1.96)
}

#[derive(Default)]
pub struct Calibrator {
    /// By reference key (the reference backend, or each backend in the period mode).
    scores: HashMap<String, Vec<f64>>,
    done: HashMap<String, Threshold>,
    loaded_from: Option<std::path::PathBuf>,
}

/// The score above which `rate` of `scores` lie (the (1 - rate) quantile, nearest rank from
/// above): a later response counts as hallucinated when it scores strictly above it.
pub fn quantile_threshold(scores: &[f64], rate: f64) -> Option<f64> {
    let mut s: Vec<f64> = scores.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    // `above` of them lie above the threshold: the largest `above` scores.
    let above = ((rate * s.len() as f64).round() as usize).min(s.len() - 1);
    Some(s[s.len() - 1 - above])
}

impl Calibrator {
    fn key<'a>(k: &'a CalibrationConfig, backend: &'a str) -> &'a str {
        k.reference_backend.as_deref().unwrap_or(backend)
    }

    /// Thresholds kept at `path` by an earlier run (for the configured method only).
    pub fn load(&mut self, c: &ConsistencyConfig) {
        let Some(path) = c.calibration.as_ref().and_then(|k| k.path.clone()) else { return };
        if self.loaded_from.as_ref() == Some(&path) {
            return;
        }
        self.loaded_from = Some(path.clone());
        let Ok(text) = std::fs::read_to_string(&path) else { return };
        match serde_json::from_str::<HashMap<String, Threshold>>(&text) {
            Ok(m) => {
                let method = c.methods.first().copied();
                self.done = m.into_iter().filter(|(_, t)| Some(t.method) == method).collect();
                tracing::info!(path = %path.display(), thresholds = self.done.len(), "calibration loaded");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "calibration file unreadable: calibrating again")
            }
        }
    }

    /// What `backend`'s rate comes from now.
    pub fn source(&self, c: &ConsistencyConfig, backend: &str) -> RateSource {
        let method = c.methods.first().copied().unwrap_or(Method::Unigram);
        if method.is_probability() {
            return RateSource::Probability { method, threshold: c.threshold };
        }
        let Some(k) = &c.calibration else { return RateSource::Uncalibrated { method } };
        let key = Self::key(k, backend);
        match self.done.get(key) {
            Some(t) if t.method == method => RateSource::Calibrated(t.clone()),
            _ => RateSource::Calibrating {
                method,
                reference: key.to_string(),
                have: self.scores.get(key).map_or(0, Vec::len),
                need: k.checks,
            },
        }
    }

    /// One check's primary score from `backend`; returns a threshold that this completed.
    pub fn observe(
        &mut self,
        c: &ConsistencyConfig,
        backend: &str,
        method: Method,
        score: f64,
        now_unix: u64,
    ) -> Option<Threshold> {
        let k = c.calibration.as_ref()?;
        if method.is_probability() || !score.is_finite() {
            return None;
        }
        let key = Self::key(k, backend);
        if key != backend || self.done.get(key).is_some_and(|t| t.method == method) {
            return None;
        }
        let s = self.scores.entry(key.to_string()).or_default();
        s.push(score);
        if s.len() < k.checks {
            return None;
        }
        let (lo, hi) = reference_interval(k.reference_rate, s.len(), k.reference_labelled);
        let t = Threshold {
            method,
            threshold: quantile_threshold(s, k.reference_rate)?,
            reference: key.to_string(),
            checks: s.len(),
            reference_rate: k.reference_rate,
            reference_rate_interval: Some([lo, hi]),
            band: Some([quantile_threshold(s, hi)?, quantile_threshold(s, lo)?]),
            calibrated_at: now_unix,
        };
        self.scores.remove(key);
        self.done.insert(key.to_string(), t.clone());
        if let Some(path) = &k.path {
            self.store(path);
        }
        Some(t)
    }

    /// Forget every threshold and collect again (admin's "calibrate").
    pub fn reset(&mut self, c: Option<&ConsistencyConfig>) {
        self.scores.clear();
        self.done.clear();
        if let Some(path) = c.and_then(|c| c.calibration.as_ref()).and_then(|k| k.path.as_ref()) {
            self.store(path);
        }
    }

    fn store(&self, path: &Path) {
        let write = || -> std::io::Result<()> {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&self.done)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "calibration not stored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> ConsistencyConfig {
        serde_yaml_ng::from_str(&format!("methods: [unigram]\n{extra}")).unwrap()
    }

    #[test]
    fn the_threshold_leaves_the_stated_share_of_the_reference_above_it() {
        let scores: Vec<f64> = (0..100).map(|i| f64::from(i) / 100.0).collect();
        let t = quantile_threshold(&scores, 0.1).unwrap();
        assert_eq!(scores.iter().filter(|&&s| s > t).count(), 10, "{t}");
        let t = quantile_threshold(&scores, 0.5).unwrap();
        assert_eq!(scores.iter().filter(|&&s| s > t).count(), 50, "{t}");
        // Scores bunched near 1 (what unigram gives healthy text) still split at the quantile.
        let bunched: Vec<f64> = (0..40).map(|i| 0.98 + f64::from(i) * 0.0004).collect();
        let t = quantile_threshold(&bunched, 0.25).unwrap();
        assert_eq!(bunched.iter().filter(|&&s| s > t).count(), 10);
        assert_eq!(quantile_threshold(&[f64::NAN], 0.1), None);
    }

    #[test]
    fn a_ranking_method_has_no_rate_until_calibrated() {
        let c = cfg("");
        let k = Calibrator::default();
        assert_eq!(k.source(&c, "a"), RateSource::Uncalibrated { method: Method::Unigram });
        assert_eq!(k.source(&c, "a").threshold(), None);
        // `prompt` scores are probabilities: the configured threshold, no calibration.
        let p: ConsistencyConfig =
            serde_yaml_ng::from_str("methods: [prompt, unigram]\nthreshold: 0.4\n").unwrap();
        assert_eq!(k.source(&p, "a").threshold(), Some(0.4));
    }

    #[test]
    fn a_reference_backend_sets_one_threshold_for_all() {
        let c = cfg("calibration: {reference_backend: ref, checks: 10, reference_rate: 0.2}\n");
        let mut k = Calibrator::default();
        // Other backends' checks do not count toward the reference.
        for _ in 0..20 {
            assert!(k.observe(&c, "other", Method::Unigram, 0.99, 1).is_none());
        }
        assert!(matches!(k.source(&c, "other"), RateSource::Calibrating { have: 0, need: 10, .. }));
        let mut done = None;
        for i in 0..10 {
            done = done.or(k.observe(&c, "ref", Method::Unigram, 0.90 + f64::from(i) * 0.01, 7));
        }
        let t = done.expect("ten checks calibrate");
        assert_eq!((t.reference.as_str(), t.checks, t.calibrated_at), ("ref", 10, 7));
        assert!((t.threshold - 0.97).abs() < 1e-9, "{t:?}");
        assert_eq!(k.source(&c, "other").threshold(), Some(t.threshold));
        assert_eq!(k.source(&c, "ref").threshold(), Some(t.threshold));
        // Calibrate again on command: no rate until the reference has been checked again.
        k.reset(Some(&c));
        assert_eq!(k.source(&c, "other").threshold(), None);
    }

    #[test]
    fn without_a_reference_each_backend_calibrates_on_its_own_first_checks() {
        let dir = std::env::temp_dir().join(format!("goodput-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cal.json");
        let c = cfg(&format!("calibration: {{checks: 10, reference_rate: 0.1, path: {}}}\n", path.display()));
        let mut k = Calibrator::default();
        for i in 0..10 {
            k.observe(&c, "a", Method::Unigram, f64::from(i), 1);
        }
        assert_eq!(k.source(&c, "a").threshold(), Some(8.0));
        assert_eq!(k.source(&c, "b").threshold(), None);
        // Kept across a restart, for the same method only.
        let mut again = Calibrator::default();
        again.load(&c);
        assert_eq!(again.source(&c, "a").threshold(), Some(8.0));
        let other = ConsistencyConfig { methods: vec![Method::Embedding], ..c.clone() };
        let mut third = Calibrator::default();
        third.load(&other);
        assert_eq!(third.source(&other, "a").threshold(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_band_carries_the_calibrations_own_uncertainty() {
        // 100 reference checks at 0.00..0.99, 20% stated: Wilson gives 0.133-0.289 over 100.
        let (lo, hi) = reference_interval(0.2, 100, None);
        assert!((lo - 0.1333).abs() < 1e-3 && (hi - 0.2888).abs() < 1e-3, "{lo} {hi}");
        // Stated from 100 labelled answers too: both errors add (an effective 50).
        let (lo2, hi2) = reference_interval(0.2, 100, Some(100));
        assert!((lo2 - 0.1124).abs() < 1e-3 && (hi2 - 0.3304).abs() < 1e-3, "{lo2} {hi2}");
        let c = cfg("calibration: {checks: 100, reference_rate: 0.2}\n");
        let mut k = Calibrator::default();
        for i in 0..100 {
            k.observe(&c, "a", Method::Unigram, f64::from(i) / 100.0, 1);
        }
        let src = k.source(&c, "a");
        let RateSource::Calibrated(t) = &src else { panic!("{src:?}") };
        let [upper, lower] = t.band.unwrap();
        assert!(upper < t.threshold && t.threshold < lower, "{t:?}");
        // On the reference itself, the band's ends flag the interval's ends.
        let share = |thr: f64| (0..100).filter(|&i| f64::from(i) / 100.0 > thr).count();
        assert_eq!((share(lower), share(t.threshold), share(upper)), (13, 20, 29), "{t:?}");
        let v = |x: f64| src.verdict(x).unwrap();
        assert_eq!(v(0.99), Verdict { hallucinated: true, upper: true, lower: true });
        assert_eq!(v(0.75), Verdict { hallucinated: false, upper: true, lower: false });
        assert_eq!(v(0.1), Verdict { hallucinated: false, upper: false, lower: false });
        // A threshold stored before the band existed still loads; its bounds are its verdict.
        let old = r#"{"method":"unigram","threshold":0.5,"reference":"a","checks":10,"reference_rate":0.1,"calibrated_at":1}"#;
        let t: Threshold = serde_json::from_str(old).unwrap();
        let v = RateSource::Calibrated(t).verdict(0.6).unwrap();
        assert_eq!(v, Verdict { hallucinated: true, upper: true, lower: true });
        // A probability's threshold is configured: no band.
        let p = RateSource::Probability { method: Method::Prompt, threshold: 0.5 };
        assert_eq!(p.verdict(0.4), Some(Verdict { hallucinated: false, upper: false, lower: false }));
        assert_eq!(RateSource::Uncalibrated { method: Method::Unigram }.verdict(0.9), None);
    }
}
