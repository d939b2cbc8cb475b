//! Quality drift: is a backend's (or a pool endpoint's) windowed quality worse than its
//! reference, with confidence? The reference is its peers serving the same model (the other
//! endpoints of its pool; the other backends that serve one of its models) when they have
//! scores enough, else its own longer baseline before the current window. Pure functions: the
//! recorder feeds them the windows' moments when it publishes.

use serde::Serialize;

/// Two-sided 95% normal quantile: the difference of two means over at least `min_samples`
/// scores each is near enough normal (Welch's standard error).
const Z95: f64 = 1.96;

/// Count, sum and sum of squares of a score: enough for a mean and a variance, and mergeable
/// across window slots and peers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    pub n: u64,
    pub sum: f64,
    pub sum_sq: f64,
}

impl Moments {
    pub fn add(&mut self, x: f64) {
        if x.is_finite() {
            self.n += 1;
            self.sum += x;
            self.sum_sq += x * x;
        }
    }

    pub fn merge(&mut self, o: &Moments) {
        self.n += o.n;
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
    }

    /// What `self` holds beyond `part` (a window less a part of it).
    pub fn minus(&self, part: &Moments) -> Moments {
        let n = self.n.saturating_sub(part.n);
        if n == 0 {
            return Moments::default();
        }
        Moments { n, sum: self.sum - part.sum, sum_sq: (self.sum_sq - part.sum_sq).max(0.0) }
    }

    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }

    /// The sample variance (n − 1).
    pub fn variance(&self) -> Option<f64> {
        (self.n >= 2).then(|| {
            let n = self.n as f64;
            ((self.sum_sq - self.sum * self.sum / n) / (n - 1.0)).max(0.0)
        })
    }
}

/// A quality score per response; higher is worse for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// Bits per byte of the response under the reference LM.
    BitsPerByte,
    /// The consistency score of the first configured method.
    Consistency,
}

impl Signal {
    pub const ALL: [Signal; 2] = [Signal::BitsPerByte, Signal::Consistency];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::BitsPerByte => "bits_per_byte",
            Signal::Consistency => "consistency",
        }
    }
}

/// What a unit was compared with.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reference {
    /// The pooled scores of these peers.
    Peers { names: Vec<String> },
    /// Its own scores over the baseline window, before the current window.
    Baseline,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Scores needed on each side before a drift is stated.
    pub min_samples: u64,
    /// A drift is confident when its interval's lower bound passes this, per signal.
    pub min_effect_bits_per_byte: f64,
    pub min_effect_consistency: f64,
}

impl Settings {
    fn min_effect(&self, s: Signal) -> f64 {
        match s {
            Signal::BitsPerByte => self.min_effect_bits_per_byte,
            Signal::Consistency => self.min_effect_consistency,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drift {
    pub signal: Signal,
    /// The unit's mean less the reference's: positive is worse.
    pub estimate: f64,
    /// Its 95% interval.
    pub lower: f64,
    pub upper: f64,
    pub n: u64,
    pub reference_n: u64,
    pub reference: Reference,
    /// The interval lies above the signal's minimum effect: worse, and not by noise.
    pub confident: bool,
}

/// `x` against `reference`; `None` while either side has fewer than `min_samples` scores.
pub fn compare(
    signal: Signal,
    x: &Moments,
    r: &Moments,
    reference: Reference,
    s: &Settings,
) -> Option<Drift> {
    if x.n < s.min_samples.max(2) || r.n < s.min_samples.max(2) {
        return None;
    }
    let estimate = x.mean()? - r.mean()?;
    let half = Z95 * (x.variance()? / x.n as f64 + r.variance()? / r.n as f64).sqrt();
    Some(Drift {
        signal,
        estimate,
        lower: estimate - half,
        upper: estimate + half,
        n: x.n,
        reference_n: r.n,
        reference,
        confident: estimate - half > s.min_effect(signal),
    })
}

/// A backend or an endpoint, with the moments of one signal.
pub struct Unit<'a> {
    pub name: &'a str,
    /// Models it serves: units that share one are peers (every endpoint of a pool shares its
    /// backend's).
    pub models: &'a [String],
    /// Over the quality window.
    pub recent: Moments,
    /// Over the baseline window, which includes the quality window.
    pub baseline: Moments,
}

/// Each unit against its peers with scores enough, or against its own baseline.
pub fn assess(signal: Signal, units: &[Unit<'_>], s: &Settings) -> Vec<(String, Drift)> {
    let mut out = Vec::new();
    for u in units {
        let peers: Vec<&Unit> = units
            .iter()
            .filter(|p| {
                p.name != u.name
                    && p.recent.n >= s.min_samples
                    && p.models.iter().any(|m| u.models.contains(m))
            })
            .collect();
        let drift = if peers.is_empty() {
            compare(signal, &u.recent, &u.baseline.minus(&u.recent), Reference::Baseline, s)
        } else {
            let mut r = Moments::default();
            for p in &peers {
                r.merge(&p.recent);
            }
            let names = peers.iter().map(|p| p.name.to_string()).collect();
            compare(signal, &u.recent, &r, Reference::Peers { names }, s)
        };
        if let Some(d) = drift {
            out.push((u.name.to_string(), d));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    const S: Settings =
        Settings { min_samples: 20, min_effect_bits_per_byte: 0.1, min_effect_consistency: 0.05 };

    fn sample(mean: f64, spread: f64, n: usize, rng: &mut StdRng) -> Moments {
        let mut m = Moments::default();
        for _ in 0..n {
            m.add(mean + spread * (rng.random::<f64>() - 0.5));
        }
        m
    }

    #[test]
    fn moments_give_mean_and_variance_and_subtract() {
        let mut m = Moments::default();
        for x in [1.0, 2.0, 3.0, 4.0] {
            m.add(x);
        }
        m.add(f64::NAN);
        assert_eq!((m.n, m.mean()), (4, Some(2.5)));
        assert!((m.variance().unwrap() - 5.0 / 3.0).abs() < 1e-12);
        let mut first = Moments::default();
        first.add(1.0);
        first.add(2.0);
        let rest = m.minus(&first);
        assert_eq!((rest.n, rest.mean()), (2, Some(3.5)));
        assert_eq!(first.minus(&m), Moments::default());
    }

    #[test]
    fn a_clearly_worse_unit_drifts_with_confidence_and_noise_does_not() {
        let mut rng = StdRng::seed_from_u64(7);
        let healthy = sample(0.36, 0.2, 40, &mut rng);
        let broken = sample(2.8, 0.6, 40, &mut rng);
        let d = compare(Signal::BitsPerByte, &broken, &healthy, Reference::Baseline, &S).unwrap();
        assert!(d.confident && d.lower > 2.0 && d.upper < 2.9, "{d:?}");
        // The other way round: better, so not a drift.
        let d = compare(Signal::BitsPerByte, &healthy, &broken, Reference::Baseline, &S).unwrap();
        assert!(!d.confident && d.upper < 0.0, "{d:?}");
        // Two draws of the same traffic: over many seeds, confident drift stays rare.
        let mut confident = 0;
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (a, b) = (sample(0.36, 0.2, 30, &mut rng), sample(0.36, 0.2, 30, &mut rng));
            confident +=
                usize::from(compare(Signal::BitsPerByte, &a, &b, Reference::Baseline, &S).unwrap().confident);
        }
        assert_eq!(confident, 0, "the minimum effect keeps noise out");
        // Too few scores: nothing stated.
        let few = sample(2.8, 0.6, 5, &mut rng);
        assert!(compare(Signal::BitsPerByte, &few, &healthy, Reference::Baseline, &S).is_none());
    }

    #[test]
    fn peers_are_the_reference_and_the_baseline_serves_a_unit_alone() {
        let mut rng = StdRng::seed_from_u64(3);
        let m = ["smollm2".to_string()];
        let other = ["llama".to_string()];
        let (a, b) = (sample(0.05, 0.05, 30, &mut rng), sample(0.5, 0.2, 30, &mut rng));
        let c = sample(0.9, 0.1, 30, &mut rng);
        let units = [
            Unit { name: "a", models: &m, recent: a, baseline: a },
            Unit { name: "b", models: &m, recent: b, baseline: b },
            // Serves another model: not a peer; its baseline is only its current window.
            Unit { name: "c", models: &other, recent: c, baseline: c },
        ];
        let out = assess(Signal::Consistency, &units, &S);
        let get = |n: &str| out.iter().find(|(k, _)| k == n).map(|(_, d)| d.clone());
        let b_drift = get("b").unwrap();
        assert_eq!(b_drift.reference, Reference::Peers { names: vec!["a".into()] });
        assert!(b_drift.confident, "{b_drift:?}");
        assert!(!get("a").unwrap().confident);
        assert!(get("c").is_none(), "no peer, and no baseline before its window");
        // With an hour of its own healthy scores before the window, c is compared with them.
        let mut long = sample(0.1, 0.1, 100, &mut rng);
        long.merge(&c);
        let units = [Unit { name: "c", models: &other, recent: c, baseline: long }];
        let out = assess(Signal::Consistency, &units, &S);
        assert_eq!(out[0].1.reference, Reference::Baseline);
        assert!(out[0].1.confident && out[0].1.reference_n == 100, "{:?}", out[0]);
    }
}
