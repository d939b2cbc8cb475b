//! The recorder: one thread that turns finished `RequestRecord`s into metrics, windows and
//! the recent-records ring. The hot path hands records over with `try_send` and never waits;
//! the CPU work that may remain (tokenizer counting) happens here, off the tokio workers.

use arc_swap::ArcSwap;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use super::record::{Outcome, RequestRecord, TokenSource};
use super::window::{Window, WindowSnapshot};
use crate::config::ConfigHandle;

const QUEUE: usize = 65_536;
const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// How long the recorder sleeps when its queue is empty: the delay before a finished request
/// shows in /metrics.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// What readers (admin endpoints, the router) see; never locked by the hot path.
pub struct Shared {
    pub windows: ArcSwap<HashMap<String, WindowSnapshot>>,
    recent: Mutex<VecDeque<RequestRecord>>,
    /// Records fully processed so far (tests wait on it).
    processed: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub fn recent(&self, limit: usize) -> Vec<RequestRecord> {
        let r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().rev().take(limit).cloned().collect()
    }

    pub fn processed(&self) -> u64 {
        self.processed.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[derive(Clone)]
pub struct Recorder {
    tx: SyncSender<RequestRecord>,
    metrics: Metrics,
    pub shared: Arc<Shared>,
}

impl Recorder {
    pub fn start(config: Arc<ConfigHandle>, metrics: Metrics) -> Recorder {
        let (tx, rx) = sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            windows: ArcSwap::from_pointee(HashMap::new()),
            recent: Mutex::new(VecDeque::new()),
            processed: Default::default(),
        });
        let s2 = shared.clone();
        let m2 = metrics.clone();
        std::thread::Builder::new()
            .name("goodput-recorder".into())
            .spawn(move || run(rx, config, m2, s2))
            .expect("spawn recorder thread");
        Recorder { tx, metrics, shared }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Hand a finished record over; never blocks.
    pub fn submit(&self, r: RequestRecord) {
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.records_dropped.inc()
            }
        }
    }
}

fn run(rx: Receiver<RequestRecord>, config: Arc<ConfigHandle>, metrics: Metrics, shared: Arc<Shared>) {
    let epoch = Instant::now();
    let mut windows: HashMap<String, Window> = HashMap::new();
    let mut last_publish = Instant::now();
    loop {
        // Drain what is queued, then sleep: the hot path's try_send never has to wake this
        // thread (a futex wake and a context switch per request, measured as the largest
        // per-request cost before this change).
        let mut got_any = false;
        loop {
            match rx.try_recv() {
                Ok(mut r) => {
                    got_any = true;
                    let snap = config.load_full();
                    finalize(&mut r, &snap);
                    observe(&metrics, &r);
                    let window_secs = snap.config.metrics.window_secs;
                    let w = windows.entry(r.backend.to_string()).or_insert_with(|| Window::new(window_secs));
                    if w.len_secs() != window_secs {
                        *w = Window::new(window_secs);
                    }
                    w.add(epoch.elapsed().as_secs(), &r);
                    let keep = snap.config.metrics.recent_records;
                    let mut recent = shared.recent.lock().unwrap_or_else(|p| p.into_inner());
                    recent.push_back(r);
                    while recent.len() > keep {
                        recent.pop_front();
                    }
                    drop(recent);
                    shared.processed.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        // Publish on a clock, not per record: windows also age when no traffic comes.
        if last_publish.elapsed() >= PUBLISH_EVERY {
            let now = epoch.elapsed().as_secs();
            let snap = config.load_full();
            // Backends that left the config leave the windows too.
            windows.retain(|name, _| snap.backends.iter().any(|b| &*b.name == name));
            let map = windows.iter().map(|(k, w)| (k.clone(), w.snapshot(now))).collect();
            shared.windows.store(Arc::new(map));
            last_publish = Instant::now();
        }
        if !got_any {
            std::thread::sleep(DRAIN_EVERY);
        }
    }
}

/// Settle token counts (tokenizer fallback), TPOT and the SLO verdict; drop the text.
fn finalize(r: &mut RequestRecord, snap: &crate::config::reload::Snapshot) {
    let texts = r.texts.take();
    if r.completion_tokens.is_none() {
        let tok = snap.backends.iter().find(|b| b.name == r.backend).and_then(|b| b.tokenizer.clone());
        match (texts, tok) {
            (Some(texts), Some(tok)) => {
                let mut n = 0u64;
                for t in &texts {
                    match tok.encode_fast(t.as_str(), false) {
                        Ok(enc) => n += enc.len() as u64,
                        Err(e) => tracing::debug!(error = %e, "tokenizer failed"),
                    }
                }
                r.completion_tokens = Some(n);
                r.completion_source = TokenSource::Tokenizer;
            }
            _ if r.stream && r.content_chunks > 0 => {
                r.completion_source = TokenSource::Chunks;
            }
            _ => {}
        }
    }
    r.compute_tpot();
    r.slo_met = crate::goodput::judge(r, &snap.config.slo);
}

fn observe(m: &Metrics, r: &RequestRecord) {
    let labels = [&*r.model, &*r.backend, &*r.route];
    if let Some(t) = r.ttft {
        m.ttft.with_label_values(&labels).observe(t.as_secs_f64());
    }
    if let Some(t) = r.tpot {
        m.tpot.with_label_values(&labels).observe(t.as_secs_f64());
    }
    let outcome = r.outcome.as_str();
    m.duration.with_label_values(&[labels[0], labels[1], labels[2], outcome]).observe(r.e2e.as_secs_f64());
    let status = status_label(r.status);
    m.requests
        .with_label_values(&[
            labels[0],
            labels[1],
            labels[2],
            status,
            outcome,
            r.finish_reason.unwrap_or("none"),
        ])
        .inc();
    for (ty, n, src) in
        [("input", r.prompt_tokens, r.prompt_source), ("output", r.completion_tokens, r.completion_source)]
    {
        if let Some(n) = n {
            m.token_usage.with_label_values(&[labels[0], labels[1], labels[2], ty]).observe(n as f64);
        }
        m.tokens
            .with_label_values(&[labels[0], labels[1], labels[2], ty, src.as_str()])
            .inc_by(n.unwrap_or(0));
    }
    if let Some(met) = r.slo_met {
        let out = r.completion_tokens.unwrap_or(0);
        m.slo_judged.with_label_values(&labels).inc();
        m.slo_judged_tokens.with_label_values(&labels).inc_by(out);
        if met {
            m.slo_met.with_label_values(&labels).inc();
            m.slo_met_tokens.with_label_values(&labels).inc_by(out);
        }
    }
    if r.outcome != Outcome::Rejected {
        m.overhead.observe(r.overhead.as_secs_f64());
    }
}

/// Status codes as label values: the common ones exactly, the rest by class (bounded).
fn status_label(s: u16) -> &'static str {
    const EXACT: &[(u16, &str)] = &[
        (200, "200"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (408, "408"),
        (413, "413"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    if let Some((_, l)) = EXACT.iter().find(|(c, _)| *c == s) {
        return l;
    }
    match s {
        0..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
