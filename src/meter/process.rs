//! The process's own figures under the names, types and units every Prometheus client library
//! exports (`process_cpu_seconds_total`, …), so that the usual queries and dashboards read
//! goodput as they read any other process. Read at each scrape, from syscalls and /proc.
//!
//! Not the `prometheus` crate's `process` collector: it truncates CPU time to whole seconds,
//! which makes a sidecar's fraction of a core read as steps of a second, and it pulls in procfs.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, Metric, MetricFamily, MetricType};
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// (name, help, type) of each series, in the order `collect` returns them.
const SERIES: [(&str, &str, MetricType); 7] = [
    (
        "process_cpu_seconds_total",
        "User and system CPU time of the goodput process, every thread (the scorers' too), in seconds.",
        MetricType::COUNTER,
    ),
    (
        "process_start_time_seconds",
        "When the goodput process started, in seconds since the Unix epoch.",
        MetricType::GAUGE,
    ),
    ("process_resident_memory_bytes", "Resident memory of the goodput process.", MetricType::GAUGE),
    ("process_virtual_memory_bytes", "Virtual memory of the goodput process.", MetricType::GAUGE),
    ("process_open_fds", "Open file descriptors of the goodput process.", MetricType::GAUGE),
    (
        "process_max_fds",
        "The goodput process's limit on open file descriptors (RLIMIT_NOFILE, soft).",
        MetricType::GAUGE,
    ),
    ("process_threads", "OS threads of the goodput process.", MetricType::GAUGE),
];

pub struct ProcessCollector {
    descs: Vec<Desc>,
    start_time: f64,
}

impl ProcessCollector {
    /// Built at start-up: the start time is now, within milliseconds of the exec.
    pub fn new() -> ProcessCollector {
        let descs = SERIES
            .iter()
            .map(|(name, help, _)| {
                Desc::new((*name).into(), (*help).into(), Vec::new(), HashMap::new()).expect("valid name")
            })
            .collect();
        let start_time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        ProcessCollector { descs, start_time }
    }

    /// Each series' value now; `None` where the system did not say.
    fn read(&self) -> [Option<f64>; 7] {
        // statm: sizes in pages; the first field is the virtual size, the second the resident set.
        let statm = std::fs::read_to_string("/proc/self/statm").ok();
        let pages = |i: usize| {
            let n = statm.as_deref()?.split_whitespace().nth(i)?.parse::<f64>().ok()?;
            // SAFETY: sysconf has no preconditions.
            Some(n * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64)
        };
        let entries = |dir: &str| std::fs::read_dir(dir).ok().map(|d| d.count() as f64);
        [
            cpu_seconds(),
            Some(self.start_time),
            pages(1),
            pages(0),
            entries("/proc/self/fd"),
            max_fds(),
            entries("/proc/self/task"),
        ]
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

fn cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(secs(u.ru_utime) + secs(u.ru_stime))
}

/// The process's limit on open files (soft and hard): read here for `process_max_fds`, and by
/// the command, which raises the soft one at start.
pub fn open_file_limit() -> Option<libc::rlimit> {
    // SAFETY: getrlimit writes the struct it is given; a zeroed rlimit is a valid value.
    let mut l: libc::rlimit = unsafe { std::mem::zeroed() };
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0).then_some(l)
}

fn max_fds() -> Option<f64> {
    open_file_limit().filter(|l| l.rlim_cur != libc::RLIM_INFINITY).map(|l| l.rlim_cur as f64)
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut out = Vec::with_capacity(SERIES.len());
        for ((name, help, kind), value) in SERIES.iter().zip(self.read()) {
            let Some(value) = value else { continue };
            let mut m = Metric::default();
            if *kind == MetricType::COUNTER {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            } else {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
            let mut f = MetricFamily::default();
            f.set_name((*name).into());
            f.set_help((*help).into());
            f.set_field_type(*kind);
            f.set_metric(vec![m]);
            out.push(f);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(c: &ProcessCollector, name: &str) -> f64 {
        let f = c.collect().into_iter().find(|f| f.name() == name).unwrap_or_else(|| panic!("{name}"));
        let m = &f.get_metric()[0];
        if f.get_field_type() == MetricType::COUNTER {
            m.get_counter().get_value()
        } else {
            m.get_gauge().get_value()
        }
    }

    #[test]
    fn reads_the_process_and_counts_cpu_below_a_second() {
        let c = ProcessCollector::new();
        let names: Vec<_> = c.collect().iter().map(|f| f.name().to_string()).collect();
        assert_eq!(names, SERIES.map(|s| s.0), "every series, in order");

        // A few ms of work shows: whole seconds would read 0 here.
        let t0 = std::time::Instant::now();
        let cpu0 = value(&c, "process_cpu_seconds_total");
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let spent = value(&c, "process_cpu_seconds_total") - cpu0;
        assert!(spent > 0.01 && spent < 1.0, "{spent} s for 50 ms of busy work");

        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        assert!((now - value(&c, "process_start_time_seconds")).abs() < 60.0);
        let (rss, vsz) =
            (value(&c, "process_resident_memory_bytes"), value(&c, "process_virtual_memory_bytes"));
        assert!(rss > 1e6 && vsz >= rss, "rss {rss}, virtual {vsz}");

        // Files opened are descriptors more, threads started are threads more (other tests run
        // beside this one, so by a margin rather than exactly).
        let fds = value(&c, "process_open_fds");
        let files: Vec<_> = (0..64).map(|_| std::fs::File::open("/proc/self/statm").unwrap()).collect();
        let more = value(&c, "process_open_fds") - fds;
        assert!((54.0..=74.0).contains(&more), "{more} descriptors for 64 files");
        drop(files);
        assert!(value(&c, "process_max_fds") >= value(&c, "process_open_fds"));
        let threads = value(&c, "process_threads");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let started: Vec<_> = (0..16)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || rx.lock().map(|r| r.recv()).ok())
            })
            .collect();
        let more = value(&c, "process_threads") - threads;
        assert!(more >= 8.0, "{more} threads for 16 started");
        drop(tx);
        for t in started {
            let _ = t.join();
        }
    }
}
