//! A circuit breaker per backend: it opens on consecutive failures or on a high error rate over
//! a window, stays open for a while, then lets one probe through (half-open); the probe's outcome
//! closes it or opens it again. Time comes in as an argument.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    pub consecutive_failures: u32,
    /// Opens when failures / requests over the window reach this, with at least `min_requests`.
    pub error_rate: f64,
    pub min_requests: u32,
    pub window: Duration,
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            error_rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: bool },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: State,
    consecutive: u32,
    window_start: Instant,
    requests: u32,
    failures: u32,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig, now: Instant) -> Breaker {
        Breaker { cfg, state: State::Closed, consecutive: 0, window_start: now, requests: 0, failures: 0 }
    }

    pub fn set_config(&mut self, cfg: BreakerConfig) {
        self.cfg = cfg;
    }

    /// Whether `allow` would let a request through now, without claiming the half-open probe.
    pub fn would_allow(&self, now: Instant) -> bool {
        match self.state {
            State::Closed | State::HalfOpen { probing: false } => true,
            State::Open { until } => now >= until,
            State::HalfOpen { probing: true } => false,
        }
    }

    /// Whether a request may go to this backend now. In half-open state one probe at a time.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state {
            State::Closed => true,
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen { probing: true };
                true
            }
            State::Open { .. } => false,
            State::HalfOpen { probing: true } => false,
            State::HalfOpen { probing: false } => {
                self.state = State::HalfOpen { probing: true };
                true
            }
        }
    }

    pub fn on_success(&mut self, now: Instant) {
        self.roll(now);
        self.requests += 1;
        self.consecutive = 0;
        if matches!(self.state, State::HalfOpen { .. }) {
            self.close(now);
        }
    }

    pub fn on_failure(&mut self, now: Instant) {
        self.roll(now);
        self.requests += 1;
        self.failures += 1;
        self.consecutive += 1;
        let rate_tripped = self.requests >= self.cfg.min_requests
            && f64::from(self.failures) / f64::from(self.requests) >= self.cfg.error_rate;
        match self.state {
            State::HalfOpen { .. } => self.open(now),
            State::Closed if self.consecutive >= self.cfg.consecutive_failures || rate_tripped => {
                self.open(now)
            }
            _ => {}
        }
    }

    /// `closed`, `open` or `half_open`, for metrics and /admin/backends.
    pub fn state(&self) -> &'static str {
        match self.state {
            State::Closed => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }

    fn roll(&mut self, now: Instant) {
        if now.saturating_duration_since(self.window_start) >= self.cfg.window {
            self.window_start = now;
            self.requests = 0;
            self.failures = 0;
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = State::Open { until: now + self.cfg.open_for };
    }

    fn close(&mut self, now: Instant) {
        self.state = State::Closed;
        self.consecutive = 0;
        self.window_start = now;
        self.requests = 0;
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_consecutive_failures_then_probes_and_closes() {
        let t0 = Instant::now();
        let mut b = Breaker::new(BreakerConfig::default(), t0);
        for _ in 0..4 {
            b.on_failure(t0);
        }
        assert_eq!(b.state(), "closed");
        b.on_success(t0);
        for _ in 0..4 {
            b.on_failure(t0);
        }
        assert_eq!(b.state(), "closed", "a success resets the run");
        b.on_failure(t0);
        assert_eq!(b.state(), "open");
        assert!(!b.allow(t0 + Duration::from_secs(4)));
        let t5 = t0 + Duration::from_secs(5);
        assert!(b.allow(t5), "one probe after open_for");
        assert_eq!(b.state(), "half_open");
        assert!(!b.allow(t5), "only one probe at a time");
        b.on_success(t5);
        assert_eq!(b.state(), "closed");
        assert!(b.allow(t5));
    }

    #[test]
    fn a_failed_probe_opens_again() {
        let t0 = Instant::now();
        let cfg = BreakerConfig { consecutive_failures: 1, ..Default::default() };
        let mut b = Breaker::new(cfg, t0);
        b.on_failure(t0);
        let t = t0 + cfg.open_for;
        assert!(b.allow(t));
        b.on_failure(t);
        assert_eq!(b.state(), "open");
        assert!(!b.allow(t + Duration::from_secs(1)));
        assert!(b.allow(t + cfg.open_for));
    }

    #[test]
    fn opens_on_error_rate_over_the_window() {
        let t0 = Instant::now();
        let mut b = Breaker::new(BreakerConfig::default(), t0);
        // Alternating: never 5 in a row, but 50% errors over 20 requests.
        for i in 0..19 {
            if i % 2 == 0 { b.on_failure(t0) } else { b.on_success(t0) }
        }
        assert_eq!(b.state(), "closed", "19 requests: below min_requests");
        b.on_success(t0);
        b.on_failure(t0);
        assert_eq!(b.state(), "open", "11 of 21 failed");
        // Old errors age out with the window.
        let mut b = Breaker::new(BreakerConfig::default(), t0);
        for _ in 0..4 {
            b.on_failure(t0);
            b.on_success(t0);
        }
        let later = t0 + Duration::from_secs(11);
        for _ in 0..19 {
            b.on_success(later);
        }
        b.on_failure(later);
        assert_eq!(b.state(), "closed");
    }
}
