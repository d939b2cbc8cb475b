//! Routing settings: SLA classes, the decision policy, the circuit breaker and where the
//! router's statistics come from.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::route::Objective;

/// An SLA class: latency bounds on windowed p95s, quality floors and an objective. A request
/// is also judged against the same latency bounds (TTFT, TPOT, e2e) for goodput.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlaClass {
    #[serde(default)]
    pub ttft_p95_ms: Option<f64>,
    #[serde(default)]
    pub tpot_p95_ms: Option<f64>,
    #[serde(default)]
    pub e2e_p95_ms: Option<f64>,
    /// Typical (geometric-mean) perplexity of the backend's scored responses.
    #[serde(default)]
    pub max_perplexity: Option<f64>,
    /// Share of consistency-checked responses judged hallucinated.
    #[serde(default)]
    pub max_hallucination_rate: Option<f64>,
    #[serde(default = "default_objective")]
    pub objective: Objective,
    /// Refuse (429 with Retry-After) rather than queue when every endpoint of every backend
    /// the class may use is saturated, or would keep the request waiting past its TTFT
    /// objective (`x-slo-ttft-ms`, else `ttft_p95_ms`). Off by default: a sidecar adds no
    /// failure mode unless asked.
    #[serde(default)]
    pub shed: bool,
}

fn default_objective() -> Objective {
    Objective::BestValue
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Share of decisions that pick any healthy backend, so every backend's statistics stay fresh.
    pub exploration: f64,
    /// Requests in a backend's latency window before its latency statistics are trusted.
    pub min_samples: u64,
    /// Scored (or checked) responses before its quality statistics are trusted.
    pub min_quality_samples: u64,
    /// The class of requests whose route names none. Unset: no bounds, objective `fastest`.
    pub default_class: Option<String>,
    /// Add `x-goodput-backend` and `x-goodput-reason` to each routed response.
    pub response_headers: bool,
    /// Decisions kept for /admin/routes and the status page.
    pub recent_decisions: usize,
    pub breaker: BreakerSettings,
    pub stats: StatsSettings,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            exploration: 0.03,
            min_samples: 20,
            min_quality_samples: 10,
            default_class: None,
            response_headers: false,
            recent_decisions: 200,
            breaker: BreakerSettings::default(),
            stats: StatsSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    /// Opens after this many failures in a row (connect errors, resets, 5xx, timeouts).
    pub consecutive_failures: u32,
    /// Opens when failures reach this share of requests over `window_secs`...
    pub error_rate: f64,
    /// ...with at least this many requests in it.
    pub min_requests: u32,
    pub window_secs: u64,
    /// Stays open this long, then lets one probe through (half-open).
    pub open_secs: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            consecutive_failures: 5,
            error_rate: 0.5,
            min_requests: 20,
            window_secs: 10,
            open_secs: 5,
        }
    }
}

impl BreakerSettings {
    pub fn to_breaker(self) -> crate::route::breaker::BreakerConfig {
        crate::route::breaker::BreakerConfig {
            consecutive_failures: self.consecutive_failures,
            error_rate: self.error_rate,
            min_requests: self.min_requests,
            window: std::time::Duration::from_secs(self.window_secs),
            open_for: std::time::Duration::from_secs(self.open_secs),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StatsSource {
    /// This process's own windows.
    #[default]
    Local,
    /// Prometheus's HTTP query API over every replica's (or sidecar's) metrics, so that
    /// several router replicas decide on one view.
    Prometheus,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StatsSettings {
    pub source: StatsSource,
    /// Base URL of Prometheus, e.g. `http://prometheus.monitoring:9090`.
    pub prometheus_url: Option<String>,
    /// How often the statistics are read back.
    pub refresh_secs: u64,
    /// PromQL range of the latency statistics (e.g. 1m); quality uses `quality.window_secs`.
    pub range: String,
    /// Label matchers added to every query, e.g. `namespace="llm"`.
    pub selector: String,
}

impl Default for StatsSettings {
    fn default() -> Self {
        StatsSettings {
            source: StatsSource::Local,
            prometheus_url: None,
            refresh_secs: 5,
            range: "1m".into(),
            selector: String::new(),
        }
    }
}

pub(super) fn validate(
    r: &RoutingConfig,
    classes: &BTreeMap<String, SlaClass>,
    err: &mut dyn FnMut(String, String),
) {
    if !(0.0..=0.5).contains(&r.exploration) {
        err("routing.exploration".into(), format!("must be between 0 and 0.5, got {}", r.exploration));
    }
    if let Some(c) = &r.default_class
        && !classes.contains_key(c)
    {
        err("routing.default_class".into(), format!("no class named `{c}`"));
    }
    let b = &r.breaker;
    if b.consecutive_failures == 0 {
        err("routing.breaker.consecutive_failures".into(), "must be >= 1".into());
    }
    if !(b.error_rate > 0.0 && b.error_rate <= 1.0) {
        err("routing.breaker.error_rate".into(), format!("must be within (0, 1], got {}", b.error_rate));
    }
    if b.window_secs == 0 || b.open_secs == 0 {
        err("routing.breaker".into(), "window_secs and open_secs must be >= 1".into());
    }
    let s = &r.stats;
    if s.source == StatsSource::Prometheus {
        match &s.prometheus_url {
            None => err("routing.stats.prometheus_url".into(), "required with source: prometheus".into()),
            Some(u) => {
                if let Err(why) = super::check_upstream_url(u) {
                    err("routing.stats.prometheus_url".into(), why);
                }
            }
        }
    }
    if s.refresh_secs == 0 {
        err("routing.stats.refresh_secs".into(), "must be >= 1".into());
    }
    if !matches!(s.range_secs(), Some(1..)) {
        err(
            "routing.stats.range".into(),
            format!("`{}` is not a positive PromQL duration like 30s, 1m or 5m", s.range),
        );
    }
    for (name, c) in classes {
        let p = format!("classes.{name}");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            err(p.clone(), "a class name must be non-empty [A-Za-z0-9._-]".into());
        }
        for (f, v) in [
            ("ttft_p95_ms", c.ttft_p95_ms),
            ("tpot_p95_ms", c.tpot_p95_ms),
            ("e2e_p95_ms", c.e2e_p95_ms),
            ("max_perplexity", c.max_perplexity),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                err(format!("{p}.{f}"), format!("must be a positive number, got {v}"));
            }
        }
        if let Some(h) = c.max_hallucination_rate
            && !(0.0..=1.0).contains(&h)
        {
            err(format!("{p}.max_hallucination_rate"), format!("must be between 0 and 1, got {h}"));
        }
    }
}

impl StatsSettings {
    /// `range` in seconds: a number and a unit of s, m or h (the PromQL durations accepted).
    pub fn range_secs(&self) -> Option<u64> {
        let r = &self.range;
        let digits = r.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let scale = match &r[digits.len()..] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            _ => return None,
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse::<u64>().ok()?.checked_mul(scale)
    }
}

#[cfg(test)]
mod tests {
    use super::StatsSettings;

    #[test]
    fn a_range_is_a_positive_promql_duration_in_seconds_minutes_or_hours() {
        let secs = |r: &str| StatsSettings { range: r.into(), ..Default::default() }.range_secs();
        assert_eq!(secs("45s"), Some(45));
        assert_eq!(secs("1m"), Some(60));
        assert_eq!(secs("2h"), Some(7200));
        for bad in ["", "m", "1", "1d", "1.5m", "-1m", "1m30s", "99999999999999999999s"] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
        assert_eq!(secs("0s"), Some(0), "parsed; validation refuses it");
        let load = |r: &str| {
            crate::config::Config::from_yaml(&format!(
                "backends:\n  - name: a\n    url: http://127.0.0.1:8000\nrouting:\n  stats: {{range: {r}}}\n"
            ))
        };
        assert!(load("5m").is_ok());
        for bad in ["0s", "1d"] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains("routing.stats.range") && e.contains("positive PromQL duration"), "{e}");
        }
    }
}
