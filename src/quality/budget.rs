//! The CPU budget of quality scoring (`quality.max_cpu`), shared by the perplexity scorer and
//! the embedding thread. SCHED_IDLE orders threads on one core, but a busy scorer still costs the
//! proxy on a small machine: a wake-up that must preempt it waits longer than one onto an idle
//! core, and the tail of every request on the box grows with the share of time the scorer runs
//! (BENCHMARKS.md). So scoring is also paced: after work that took C seconds of CPU, the scoring
//! threads rest until C / max_cpu seconds after it began, and what is sampled while they rest is
//! dropped at once and counted (`reason="cpu_budget"`) instead of queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct CpuBudget {
    /// Cores the scorers may keep busy on average; infinite for no budget.
    cores: f64,
    origin: Instant,
    /// Nanoseconds after `origin` before which the scorers rest.
    next_ns: AtomicU64,
}

impl CpuBudget {
    pub fn new(cores: f64) -> CpuBudget {
        CpuBudget { cores, origin: Instant::now(), next_ns: AtomicU64::new(0) }
    }

    /// No budget (offline tools, and `max_cpu` large enough to never bind).
    pub fn unlimited() -> CpuBudget {
        CpuBudget::new(f64::INFINITY)
    }

    pub fn cores(&self) -> f64 {
        self.cores
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether the scorers may start work now (they are not resting).
    pub fn available(&self) -> bool {
        self.ns(Instant::now()) >= self.next_ns.load(Ordering::Relaxed)
    }

    /// Block the calling scoring thread (never a tokio worker) while the scorers rest.
    pub fn wait(&self) {
        loop {
            let (now, next) = (self.ns(Instant::now()), self.next_ns.load(Ordering::Relaxed));
            if now >= next {
                return;
            }
            std::thread::sleep(Duration::from_nanos(next - now));
        }
    }

    /// Run one piece of scoring work on the calling thread: its CPU time (the thread's clock
    /// times `threads`, the session's intra-op threads, which work alongside it) is counted in
    /// `used` and charged.
    pub fn spend<R>(&self, threads: usize, used: &prometheus::Counter, work: impl FnOnce() -> R) -> R {
        let (began, cpu0) = (Instant::now(), thread_cpu_time());
        let out = work();
        let cpu = thread_cpu_time().saturating_sub(cpu0) * u32::try_from(threads).unwrap_or(u32::MAX);
        used.inc_by(cpu.as_secs_f64());
        self.charge(began, cpu);
        out
    }

    /// Work that began at `began` used `cpu`: the scorers rest until cpu / cores after it
    /// began (or after the rest already owed, when several threads share the budget).
    pub fn charge(&self, began: Instant, cpu: Duration) {
        if !self.cores.is_finite() {
            return;
        }
        let rest = (cpu.as_secs_f64() / self.cores * 1e9).min(u64::MAX as f64 / 2.0) as u64;
        let began = self.ns(began);
        let _ = self.next_ns.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            Some(next.max(began).saturating_add(rest))
        });
    }
}

/// CPU time the calling thread has used (zero where the clock is unavailable).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// The default `max_cpu`: 5% of the cores this process may use (its cgroup quota included), at
/// least a tenth of one core. On 2 vCPUs that is 0.1 core, which kept the proxy's added p99
/// under 1 ms while sampling 100% of requests (BENCHMARKS.md); 0.2 was at the edge.
pub fn default_cores() -> f64 {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (n as f64 * 0.05).max(0.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_followed_by_rest_in_proportion_to_its_cpu() {
        let b = CpuBudget::new(0.5);
        assert!(b.available());
        let began = Instant::now();
        // 20 ms of CPU at half a core: rest until 40 ms after the work began.
        b.charge(began, Duration::from_millis(20));
        assert!(!b.available());
        b.wait();
        assert!(began.elapsed() >= Duration::from_millis(40));
        assert!(b.available());
    }

    #[test]
    fn threads_sharing_a_budget_add_up_their_rest() {
        let b = CpuBudget::new(1.0);
        let began = Instant::now();
        b.charge(began, Duration::from_millis(30));
        b.charge(began, Duration::from_millis(30));
        b.wait();
        assert!(began.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn no_budget_never_rests() {
        let b = CpuBudget::unlimited();
        b.charge(Instant::now(), Duration::from_secs(1000));
        assert!(b.available());
    }

    #[test]
    fn the_thread_clock_counts_this_threads_work_and_not_its_sleep() {
        let t0 = thread_cpu_time();
        let (mut x, deadline) = (0u64, Instant::now() + Duration::from_secs(10));
        // Busy until the clock shows 20 ms of this thread's CPU (however often it is preempted).
        while thread_cpu_time() - t0 < Duration::from_millis(20) {
            assert!(Instant::now() < deadline, "the thread CPU clock does not advance");
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let t1 = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(50));
        assert!(thread_cpu_time() - t1 < Duration::from_millis(10));
    }
}
