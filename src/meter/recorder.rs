//! The recorder: one thread that turns finished `RequestRecord`s into metrics, windows and
//! the recent-records ring. The hot path hands records over with `try_send` and never waits;
//! the CPU work that may remain (tokenizer counting) happens here, off the tokio workers.

use arc_swap::ArcSwap;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use super::record::{Outcome, Payload, RequestRecord, TokenSource};
use super::window::{DriftView, MomentWindow, QualityWindow, Window, WindowSnapshot};
use crate::config::ConfigHandle;
use crate::quality::calibration::{Calibrator, RateSource};
use crate::quality::consistency::{Checker, ConsistencyJob};
use crate::quality::drift::{self, Moments, Signal, Unit};
use crate::quality::scorer::{ScoreJob, Scorer};
use crate::quality::{QualityEvent, Subject};

const QUEUE: usize = 65_536;
const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// How long the recorder sleeps when its queue is empty: the delay before a finished request
/// shows in /metrics and the recent records. Windows (what the router reads) publish every
/// PUBLISH_EVERY anyway, and Prometheus scrapes every few seconds, so 50 ms loses nothing; at
/// 10 ms the wake-ups were a third of the recorder's CPU at 100 req/s and its context switches
/// outnumbered the proxy's own.
const DRAIN_EVERY: Duration = Duration::from_millis(50);
/// After this long without a record, the recorder blocks on its queue until a record comes or
/// the next publish is due: an idle sidecar wakes 4 times a second instead of 20. The first
/// record after a quiet spell pays one futex wake; the polling resumes with it.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// Where every filed record also goes, as one JSON line (`serve --request-log`): the numbers
/// and labels `/admin/records` shows, never text. Written and flushed on the recorder's own
/// thread, once per batch it drains, so a slow disk delays records, never a request.
pub type RequestLog = Box<dyn std::io::Write + Send>;

/// What readers (admin endpoints, the router) see; never locked by the hot path.
pub struct Shared {
    /// Per backend.
    pub windows: ArcSwap<HashMap<String, WindowSnapshot>>,
    /// Per endpoint of each pool (latency only), by backend then endpoint label.
    pub endpoint_windows: ArcSwap<super::window::EndpointWindows>,
    /// Per SLA class (the class each request was routed under).
    pub classes: ArcSwap<HashMap<String, WindowSnapshot>>,
    /// Per backend, what its hallucination rate comes from (consistency checks on only).
    pub calibration: ArcSwap<HashMap<String, RateSource>>,
    /// Quality drift per backend and per pool endpoint (absent: too few scores).
    pub drift: ArcSwap<DriftView>,
    /// Set by admin: forget calibrated thresholds and calibrate again.
    pub recalibrate: std::sync::atomic::AtomicBool,
    recent: Mutex<VecDeque<RequestRecord>>,
    /// Records fully processed so far (tests wait on it).
    processed: std::sync::atomic::AtomicU64,
    /// Records handed to the recorder so far (flush waits until processed catches up).
    submitted: std::sync::atomic::AtomicU64,
    /// Times the recorder's loop has run (how often the thread wakes).
    rounds: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// The last `limit` records, newest first; only those of the client's `request_id` and of
    /// `outcome` where given.
    pub fn recent(
        &self,
        limit: usize,
        request_id: Option<&str>,
        outcome: Option<&str>,
    ) -> Vec<RequestRecord> {
        let r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = |rec: &&RequestRecord| {
            request_id.is_none_or(|id| rec.request_id.as_deref() == Some(id))
                && outcome.is_none_or(|o| rec.outcome.as_str() == o)
        };
        r.iter().rev().filter(wanted).take(limit).cloned().collect()
    }

    pub fn processed(&self) -> u64 {
        self.processed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Cloned into every metered response body: three reference counts, not one per metric family
/// (a `Metrics` clone is ~60 atomic increments and as many decrements per request).
#[derive(Clone)]
pub struct Recorder {
    tx: SyncSender<(RequestRecord, Payload)>,
    metrics: Arc<Metrics>,
    pub shared: Arc<Shared>,
}

/// Where sampled responses go (the perplexity scorer, the consistency checker), and the
/// channel their results come back on.
pub struct QualityLink {
    pub scorer: Option<Scorer>,
    pub checker: Option<Checker>,
    pub results: Receiver<QualityEvent>,
}

impl Recorder {
    pub fn start(
        config: Arc<ConfigHandle>,
        metrics: Metrics,
        quality: Option<QualityLink>,
        log: Option<RequestLog>,
    ) -> Recorder {
        let (tx, rx) = sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            windows: ArcSwap::from_pointee(HashMap::new()),
            endpoint_windows: ArcSwap::from_pointee(HashMap::new()),
            classes: ArcSwap::from_pointee(HashMap::new()),
            calibration: ArcSwap::from_pointee(HashMap::new()),
            drift: ArcSwap::from_pointee(DriftView::default()),
            recalibrate: Default::default(),
            recent: Mutex::new(VecDeque::new()),
            processed: Default::default(),
            submitted: Default::default(),
            rounds: Default::default(),
        });
        let s2 = shared.clone();
        let m2 = metrics.clone();
        std::thread::Builder::new()
            .name("goodput-recorder".into())
            .spawn(move || run(rx, config, m2, s2, quality, log))
            .expect("spawn recorder thread");
        Recorder { tx, metrics: Arc::new(metrics), shared }
    }

    /// Wait (up to `limit`) until every record handed over so far is in the metrics; true
    /// when it is. Used on shutdown.
    pub async fn flush(&self, limit: Duration) -> bool {
        let target = self.shared.submitted.load(std::sync::atomic::Ordering::Acquire);
        let deadline = Instant::now() + limit;
        while self.shared.processed() < target {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Hand a finished record over; never blocks.
    pub fn submit(&self, r: RequestRecord, payload: Payload) {
        match self.tx.try_send((r, payload)) {
            Ok(()) => {
                self.shared.submitted.fetch_add(1, std::sync::atomic::Ordering::Release);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.records_dropped.inc()
            }
        }
    }
}

struct BackendWindows {
    latency: Window,
    quality: QualityWindow,
    /// The drift signals over `quality.drift.baseline_secs`.
    baseline: MomentWindow,
}

impl BackendWindows {
    fn new(snap: &crate::config::reload::Snapshot) -> BackendWindows {
        let (lat, q) = (snap.config.metrics.window_secs, snap.config.quality.window_secs);
        BackendWindows {
            latency: Window::new(lat),
            quality: QualityWindow::new(q),
            baseline: MomentWindow::new(snap.config.quality.drift.baseline_secs),
        }
    }

    /// A reload that changes a window's length starts that window afresh.
    fn resize(&mut self, snap: &crate::config::reload::Snapshot) -> &mut BackendWindows {
        let (lat, q) = (snap.config.metrics.window_secs, snap.config.quality.window_secs);
        if self.latency.len_secs() != lat {
            self.latency = Window::new(lat);
        }
        if self.quality.len_secs() != QualityWindow::len_for(q) {
            self.quality = QualityWindow::new(q);
        }
        let b = snap.config.quality.drift.baseline_secs;
        if self.baseline.len_secs() != MomentWindow::len_for(b) {
            self.baseline = MomentWindow::new(b);
        }
        self
    }

    /// Latency and quality over their windows, and the goodput figures from both.
    fn snapshot(&mut self, now: u64) -> WindowSnapshot {
        let mut s = self.latency.snapshot(now);
        s.quality = self.quality.snapshot(now);
        s.goodput = crate::goodput::summarize(&s.rates());
        s
    }
}

fn run(
    rx: Receiver<(RequestRecord, Payload)>,
    config: Arc<ConfigHandle>,
    metrics: Metrics,
    shared: Arc<Shared>,
    quality: Option<QualityLink>,
    log: Option<RequestLog>,
) {
    let mut t = Thread {
        config,
        metrics,
        shared,
        quality,
        log,
        log_failing: false,
        line: Vec::new(),
        epoch: Instant::now(),
        windows: HashMap::new(),
        classes: HashMap::new(),
        endpoints: HashMap::new(),
        exported: Vec::new(),
        calibrator: Calibrator::default(),
        thresholds: Vec::new(),
        drift_exported: Vec::new(),
    };
    let mut last_publish = Instant::now();
    let mut last_work = Instant::now();
    loop {
        // Drain what is queued, then sleep: the hot path's try_send never has to wake this
        // thread (a futex wake and a context switch per request, measured as the largest
        // per-request cost before this change). Only a quiet recorder blocks (PARK_AFTER).
        t.shared.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut first = None;
        if last_work.elapsed() >= PARK_AFTER {
            match rx.recv_timeout(PUBLISH_EVERY.saturating_sub(last_publish.elapsed())) {
                Ok(r) => first = Some(r),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let Some(filed) = t.file_queued(&rx, first) else { return };
        let scored = t.apply_scores();
        // Publish on a clock, not per record: windows also age when no traffic comes.
        if last_publish.elapsed() >= PUBLISH_EVERY {
            t.publish();
            last_publish = Instant::now();
        }
        if filed > 0 || scored {
            last_work = Instant::now();
        } else if last_work.elapsed() < PARK_AFTER {
            std::thread::sleep(DRAIN_EVERY);
        }
    }
}

/// The recorder thread's own state: the windows it keeps, what it exported (so that a backend,
/// endpoint or threshold that left loses its series), the calibrator and the request log.
struct Thread {
    config: Arc<ConfigHandle>,
    metrics: Metrics,
    shared: Arc<Shared>,
    quality: Option<QualityLink>,
    log: Option<RequestLog>,
    log_failing: bool,
    /// The request log's line, reused.
    line: Vec<u8>,
    epoch: Instant,
    windows: HashMap<String, BackendWindows>,
    classes: HashMap<String, BackendWindows>,
    /// Pools' endpoints: (backend, endpoint) → their latency and quality windows.
    endpoints: HashMap<(Arc<str>, Arc<str>), BackendWindows>,
    /// Endpoints whose gauges are exported.
    exported: Vec<(Arc<str>, Arc<str>)>,
    calibrator: Calibrator,
    thresholds: Vec<[String; 3]>,
    drift_exported: Vec<[String; 4]>,
}

/// A backend's or a class's windows, made on its first record (the only one that allocates its
/// key) and resized on a reload.
fn windows_of<'a>(
    ws: &'a mut HashMap<String, BackendWindows>,
    key: &str,
    snap: &crate::config::reload::Snapshot,
) -> &'a mut BackendWindows {
    if !ws.contains_key(key) {
        ws.insert(key.to_string(), BackendWindows::new(snap));
    }
    ws.get_mut(key).expect("inserted above").resize(snap)
}

impl Thread {
    /// File every queued record (`first`, then what `try_recv` gives), each exactly once. The
    /// number filed; `None` when the proxy is gone.
    fn file_queued(
        &mut self,
        rx: &Receiver<(RequestRecord, Payload)>,
        mut first: Option<(RequestRecord, Payload)>,
    ) -> Option<u64> {
        let mut filed = 0;
        loop {
            let next = match first.take() {
                Some(r) => Ok(r),
                None => rx.try_recv(),
            };
            match next {
                Ok((r, payload)) => {
                    self.file(r, payload);
                    filed += 1;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if let Some(w) = self.log.as_mut() {
                        log_written(w.flush(), &mut self.log_failing);
                    }
                    return None;
                }
            }
        }
        // Flushed before the records count as processed: a shutdown that waited for them
        // finds them in the request log too.
        if filed > 0
            && let Some(w) = self.log.as_mut()
        {
            log_written(w.flush(), &mut self.log_failing);
        }
        self.shared.processed.fetch_add(filed, std::sync::atomic::Ordering::Release);
        Some(filed)
    }

    /// One record: its counts completed, then metrics, the scorers' share, the windows, the
    /// request log and the recent-records ring.
    fn file(&mut self, mut r: RequestRecord, mut payload: Payload) {
        let snap = self.config.load_full();
        finalize(&mut r, &payload, &snap);
        observe(&self.metrics, &r);
        if let Some(q) = &self.quality {
            hand_over(q, &r, &mut payload);
        }
        let cost = snap
            .backend(&r.backend)
            .map_or(0.0, |b| b.price.of(r.prompt_tokens.unwrap_or(0), r.completion_tokens.unwrap_or(0)));
        let now = self.epoch.elapsed().as_secs();
        windows_of(&mut self.windows, &r.backend, &snap).latency.add(now, &r, cost);
        windows_of(&mut self.classes, &r.class, &snap).latency.add(now, &r, cost);
        if !r.endpoint.is_empty() && snap.backend(&r.backend).is_some_and(|b| b.is_pool) {
            self.endpoints
                .entry((r.backend.clone(), r.endpoint.clone()))
                .or_insert_with(|| BackendWindows::new(&snap))
                .resize(&snap)
                .latency
                .add(now, &r, cost);
        }
        if let Some(w) = self.log.as_mut() {
            // Whole lines only reach the writer: stdout's lines never interleave.
            self.line.clear();
            let written = serde_json::to_writer(&mut self.line, &r).map_err(std::io::Error::from);
            self.line.push(b'\n');
            log_written(written.and_then(|()| w.write_all(&self.line)), &mut self.log_failing);
        }
        let keep = snap.config.metrics.recent_records;
        let mut recent = self.shared.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.push_back(r);
        while recent.len() > keep {
            recent.pop_front();
        }
    }

    /// Apply every score that came back; true when any did.
    fn apply_scores(&mut self) -> bool {
        let mut any = false;
        while let Some(ev) = self.quality.as_ref().and_then(|q| q.results.try_recv().ok()) {
            any = true;
            self.apply(ev);
        }
        any
    }

    /// A score into the windows of its backend, its class and its endpoint (whose windows exist
    /// once a request it served was filed), and onto its record while that is recent.
    fn apply(&mut self, ev: QualityEvent) {
        let snap = self.config.load_full();
        let of = match &ev {
            QualityEvent::Perplexity(r) => &r.of,
            QualityEvent::Consistency(r) => &r.of,
        };
        let (id, backend, class, endpoint) =
            (of.id, of.backend.clone(), of.class.clone(), of.endpoint.clone());
        windows_of(&mut self.windows, &backend, &snap);
        windows_of(&mut self.classes, &class, &snap);
        let verdict = match &ev {
            QualityEvent::Consistency(res) => self.verdict(&snap, res),
            QualityEvent::Perplexity(_) => None,
        };
        let now = self.epoch.elapsed().as_secs();
        let scopes = [
            self.windows.get_mut(&*backend),
            self.classes.get_mut(&*class),
            self.endpoints.get_mut(&(backend, endpoint)),
        ];
        let mut recent = self.shared.recent.lock().unwrap_or_else(|p| p.into_inner());
        let rec = recent.iter_mut().rev().find(|r| r.id == id);
        match ev {
            QualityEvent::Perplexity(res) => {
                let max_ppl = snap.config.classes.get(&*class).and_then(|c| c.max_perplexity);
                let passed = max_ppl.is_none_or(|m| res.perplexity <= m);
                for w in scopes.into_iter().flatten() {
                    w.quality.add(now, res.perplexity, res.bits_per_byte, res.tokens, passed);
                    w.baseline.add(now, Signal::BitsPerByte, res.bits_per_byte);
                }
                if let Some(r) = rec {
                    r.perplexity = Some(res.perplexity);
                    r.bits_per_byte = Some(res.bits_per_byte);
                }
            }
            QualityEvent::Consistency(res) => {
                for w in scopes.into_iter().flatten() {
                    w.quality.add_consistency(now, res.score, verdict);
                    w.baseline.add(now, Signal::Consistency, res.score);
                }
                if let Some(r) = rec {
                    r.hallucination_score = Some(res.score);
                    r.sentence_scores = Some(res.sentence_scores);
                    r.consistency_scores =
                        Some(res.method_scores.iter().map(|(m, s)| (m.as_str(), *s)).collect());
                    r.hallucinated = verdict.map(|v| v.hallucinated);
                }
            }
        }
    }

    /// A consistency check's verdict, where its backend's rate has a source (a probability
    /// method, or a threshold calibrated on the reference, which this check may complete),
    /// counted in the metrics.
    fn verdict(
        &mut self,
        snap: &crate::config::reload::Snapshot,
        res: &crate::quality::consistency::ConsistencyResult,
    ) -> Option<crate::quality::calibration::Verdict> {
        let c = snap.config.quality.consistency.as_ref()?;
        let backend = &*res.of.backend;
        self.calibrator.load(c);
        let unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if let Some(t) = self.calibrator.observe(c, backend, res.method, res.score, unix) {
            tracing::info!(reference = %t.reference, method = t.method.as_str(), threshold = t.threshold, checks = t.checks, "consistency threshold calibrated");
        }
        let v = self.calibrator.source(c, backend).verdict(res.score)?;
        let labels = res.of.labels();
        let m = &self.metrics;
        m.consistency_rated.with_label_values(&labels).inc();
        // inc_by(0) too: the series exist from the first verdict, so that increase() over
        // them reads 0 rather than nothing.
        m.consistency_hallucinated.with_label_values(&labels).inc_by(u64::from(v.hallucinated));
        let [method, b, route] = labels;
        for (end, h) in [("lower", v.lower), ("upper", v.upper)] {
            m.consistency_hallucinated_band.with_label_values(&[method, b, route, end]).inc_by(u64::from(h));
        }
        Some(v)
    }

    /// What readers see, every PUBLISH_EVERY: the windows' snapshots, the calibration, the
    /// drift and the gauges. Backends, classes and endpoints that left the config leave with
    /// their series.
    fn publish(&mut self) {
        let now = self.epoch.elapsed().as_secs();
        let snap = self.config.load_full();
        self.windows.retain(|name, _| snap.backends.iter().any(|b| &*b.name == name));
        self.classes.retain(|name, _| {
            snap.config.classes.contains_key(name) || name == crate::config::reload::UNCLASSED
        });
        if let Some(c) = &snap.config.quality.consistency {
            self.publish_calibration(&snap, c);
        }
        let publish =
            |scope: &str, ws: &mut HashMap<String, BackendWindows>| -> HashMap<String, WindowSnapshot> {
                ws.iter_mut()
                    .map(|(k, w)| {
                        let s = w.snapshot(now);
                        export_goodput(&self.metrics, scope, k, &s.goodput);
                        (k.clone(), s)
                    })
                    .collect()
            };
        self.shared.windows.store(Arc::new(publish("backend", &mut self.windows)));
        self.shared.classes.store(Arc::new(publish("class", &mut self.classes)));
        let live = |b: &str, e: &str| {
            snap.backend(b).is_some_and(|b| b.is_pool && b.state.endpoints().iter().any(|x| &*x.label == e))
        };
        self.endpoints.retain(|(b, e), _| live(b, e));
        let mut ew: super::window::EndpointWindows = HashMap::new();
        for ((b, e), w) in self.endpoints.iter_mut() {
            ew.entry(b.to_string()).or_default().insert(e.to_string(), w.snapshot(now));
        }
        self.shared.endpoint_windows.store(Arc::new(ew));
        let view = drift_view(&snap, &self.windows, &self.endpoints, now);
        self.drift_exported = export_drift(&self.metrics, &view, std::mem::take(&mut self.drift_exported));
        self.shared.drift.store(Arc::new(view));
        self.export_states(&snap);
    }

    /// Each backend's rate source, and its threshold as a gauge.
    fn publish_calibration(
        &mut self,
        snap: &crate::config::reload::Snapshot,
        c: &crate::config::quality::ConsistencyConfig,
    ) {
        self.calibrator.load(c);
        if self.shared.recalibrate.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.calibrator.reset(Some(c));
            tracing::info!("consistency thresholds forgotten: calibrating again");
        }
        let sources: HashMap<String, RateSource> =
            snap.backends.iter().map(|b| (b.name.to_string(), self.calibrator.source(c, &b.name))).collect();
        let mut now_thresholds = Vec::new();
        for (b, src) in &sources {
            let (method, source) = match src {
                RateSource::Probability { method, .. } => (*method, "configured"),
                RateSource::Calibrated(t) => (t.method, "calibrated"),
                _ => continue,
            };
            if let Some(t) = src.threshold() {
                self.metrics.consistency_threshold.with_label_values(&[b, method.as_str(), source]).set(t);
                now_thresholds.push([b.clone(), method.as_str().to_string(), source.to_string()]);
            }
        }
        for gone in self.thresholds.iter().filter(|x| !now_thresholds.contains(x)) {
            let _ = self.metrics.consistency_threshold.remove_label_values(&[&gone[0], &gone[1], &gone[2]]);
        }
        self.thresholds = now_thresholds;
        self.shared.calibration.store(Arc::new(sources));
    }

    /// Pools' sizes, outstanding requests per backend and endpoint, and circuit states.
    fn export_states(&mut self, snap: &crate::config::reload::Snapshot) {
        let m = &self.metrics;
        let mut now_exported = Vec::new();
        for b in &snap.backends {
            let eps = b.state.endpoints();
            m.pool_endpoints.with_label_values(&[&*b.name]).set(eps.len() as f64);
            for e in eps.iter() {
                m.endpoint_outstanding.with_label_values(&[&*b.name, &*e.label]).set(e.outstanding() as f64);
                now_exported.push((b.name.clone(), e.label.clone()));
            }
        }
        for (b, e) in self.exported.iter().filter(|x| !now_exported.contains(x)) {
            m.remove_server(b, e);
        }
        self.exported = now_exported;
        for b in &snap.backends {
            m.backend_outstanding.with_label_values(&[&*b.name]).set(b.state.outstanding() as f64);
            let state = b.state.breaker_state();
            for s in ["closed", "open", "half_open"] {
                m.circuit_state.with_label_values(&[&*b.name, s]).set(f64::from(u8::from(s == state)));
            }
        }
    }
}

/// A backend's or an endpoint's drift signals: its name, the models it serves, and its moments
/// over the quality window and over the baseline.
struct Scored {
    name: String,
    models: Vec<String>,
    recent: [Moments; 2],
    baseline: [Moments; 2],
}

impl Scored {
    fn of(name: &str, models: Vec<String>, w: &BackendWindows, now: u64) -> Scored {
        let (recent, baseline) = (w.quality.moments(now), w.baseline.total(now));
        Scored { name: name.to_string(), models, recent, baseline }
    }

    fn unit(&self, signal: usize) -> Unit<'_> {
        Unit {
            name: &self.name,
            models: &self.models,
            recent: self.recent[signal],
            baseline: self.baseline[signal],
        }
    }
}

/// Each backend against the backends that share a model with it, and each pool endpoint
/// against the other endpoints of its pool (`quality::drift`).
fn drift_view(
    snap: &crate::config::reload::Snapshot,
    windows: &HashMap<String, BackendWindows>,
    endpoints: &HashMap<(Arc<str>, Arc<str>), BackendWindows>,
    now: u64,
) -> DriftView {
    let settings = snap.config.quality.drift.settings();
    let mut view = DriftView::default();
    let backends: Vec<Scored> = snap
        .backends
        .iter()
        .filter_map(|b| Some(Scored::of(&b.name, b.served_models(), windows.get(&*b.name)?, now)))
        .collect();
    // Every endpoint of a pool serves what the pool serves: all are peers.
    let pools: Vec<(&str, Vec<Scored>)> = snap
        .backends
        .iter()
        .filter(|b| b.is_pool)
        .map(|b| {
            let eps = endpoints
                .iter()
                .filter(|((name, _), _)| *name == b.name)
                .map(|((_, e), w)| Scored::of(e, vec![String::new()], w, now))
                .collect();
            (&*b.name, eps)
        })
        .collect();
    for (i, signal) in Signal::ALL.into_iter().enumerate() {
        let units: Vec<Unit> = backends.iter().map(|b| b.unit(i)).collect();
        for (name, d) in drift::assess(signal, &units, &settings) {
            view.backends.entry(name).or_default().push(d);
        }
        for (backend, eps) in &pools {
            let units: Vec<Unit> = eps.iter().map(|e| e.unit(i)).collect();
            for (name, d) in drift::assess(signal, &units, &settings) {
                view.endpoints.entry(backend.to_string()).or_default().entry(name).or_default().push(d);
            }
        }
    }
    view
}

/// The drift as gauges; label sets that no longer have a drift are removed. Returns what is
/// exported now.
/// Each series names its backend (an endpoint's is its pool), so that drift can be filtered and
/// alerts routed by backend.
fn export_drift(m: &Metrics, view: &DriftView, before: Vec<[String; 4]>) -> Vec<[String; 4]> {
    let mut now = Vec::new();
    let backends = view.backends.iter().map(|(name, d)| ("backend", name, name, d));
    let eps = view
        .endpoints
        .iter()
        .flat_map(|(pool, e)| e.iter().map(move |(name, d)| ("endpoint", name, pool, d)));
    for (scope, name, backend, drifts) in backends.chain(eps) {
        for d in drifts {
            let signal = d.signal.as_str();
            for (bound, v) in [("estimate", d.estimate), ("lower", d.lower), ("upper", d.upper)] {
                m.quality_drift.with_label_values(&[scope, name, backend, signal, bound]).set(v);
            }
            m.quality_drift_confident
                .with_label_values(&[scope, name, backend, signal])
                .set(f64::from(u8::from(d.confident)));
            now.push([scope.to_string(), name.clone(), backend.clone(), signal.to_string()]);
        }
    }
    for gone in before.iter().filter(|x| !now.contains(x)) {
        let [scope, name, backend, signal] = gone;
        for bound in ["estimate", "lower", "upper"] {
            let _ = m.quality_drift.remove_label_values(&[scope, name, backend, signal, bound]);
        }
        let _ = m.quality_drift_confident.remove_label_values(&[scope, name, backend, signal]);
    }
    now
}

/// The window's goodput as gauges (absent quality figures are not exported, not zeroed).
fn export_goodput(m: &Metrics, scope: &str, name: &str, g: &crate::goodput::Goodput) {
    m.window_throughput.with_label_values(&[scope, name]).set(g.tokens_per_sec);
    let set = |v: &prometheus::GaugeVec, w: &str, x: Option<f64>| {
        if let Some(x) = x {
            v.with_label_values(&[scope, name, w]).set(x);
        }
    };
    let (req, tok) = (&m.window_goodput_requests, &m.window_goodput_tokens);
    set(req, "latency", Some(g.latency_requests_per_sec));
    set(tok, "latency", Some(g.latency_tokens_per_sec));
    set(req, "quality", g.quality_requests_per_sec);
    set(tok, "quality", g.quality_tokens_per_sec);
    set(tok, "quality_lower", g.quality_tokens_per_sec_interval.map(|i| i.0));
    set(tok, "quality_upper", g.quality_tokens_per_sec_interval.map(|i| i.1));
    let pr = &m.window_quality_pass_rate;
    set(pr, "estimate", g.quality_pass_rate);
    set(pr, "lower", g.quality_pass_interval.map(|i| i.0));
    set(pr, "upper", g.quality_pass_interval.map(|i| i.1));
    let hr = &m.window_hallucination_rate;
    set(hr, "estimate", g.hallucination_rate);
    set(hr, "lower", g.hallucination_rate_interval.map(|i| i.0));
    set(hr, "upper", g.hallucination_rate_interval.map(|i| i.1));
    let ix = &m.window_index;
    set(ix, "effective_tps", g.effective_tps);
    set(ix, "tput_per_ppl", g.tput_per_ppl);
    set(ix, "tput_per_ppl_price", g.tput_per_ppl_price);
}

/// Give a finished, sampled request's text to the scorers (both may take it); count every
/// request's tokens toward the shadow budget.
fn hand_over(q: &QualityLink, r: &RequestRecord, payload: &mut Payload) {
    let tokens = r.prompt_tokens.unwrap_or(0) + r.completion_tokens.unwrap_or(0);
    if let Some(c) = &q.checker {
        c.note_user_tokens(tokens);
    }
    let Some(request) = payload.request.take() else { return };
    if r.outcome != Outcome::Ok {
        return;
    }
    let Some(response) = payload.texts.take().and_then(|t| t.into_iter().next()) else { return };
    if payload.consistency
        && let Some(c) = &q.checker
    {
        c.offer(ConsistencyJob {
            of: Subject::of(r),
            operation: r.operation,
            request: request.clone(),
            response: response.clone(),
            prompt_tokens: r.prompt_tokens.unwrap_or(0),
            completion_tokens: r.completion_tokens.unwrap_or(0),
        });
    }
    if payload.perplexity
        && let Some(s) = &q.scorer
    {
        s.offer(ScoreJob { of: Subject::of(r), operation: r.operation, request, response });
    }
}

/// A failing request log (a full disk) is said once, and again when it recovers; records go
/// on to the metrics and the ring either way.
fn log_written(result: std::io::Result<()>, failing: &mut bool) {
    match result {
        Err(e) if !*failing => {
            *failing = true;
            tracing::warn!(error = %e, "request log: cannot write; records go on to the metrics");
        }
        Ok(()) if *failing => {
            *failing = false;
            tracing::info!("request log: writing again");
        }
        _ => {}
    }
}

/// Settle token counts (tokenizer fallback), TPOT and the SLO verdict.
fn finalize(r: &mut RequestRecord, payload: &Payload, snap: &crate::config::reload::Snapshot) {
    if matches!(r.completion_source, TokenSource::Chunks | TokenSource::None)
        && let (Some(texts), Some(tok)) = (
            &payload.texts,
            snap.backends.iter().find(|b| b.name == r.backend).and_then(|b| b.tokenizer.clone()),
        )
    {
        let mut n = 0u64;
        for t in texts {
            match tok.encode_fast(t.as_str(), false) {
                Ok(enc) => n += enc.len() as u64,
                Err(e) => tracing::debug!(error = %e, "tokenizer failed"),
            }
        }
        r.completion_tokens = Some(n);
        r.completion_source = TokenSource::Tokenizer;
    }
    r.compute_tpot();
    r.slo_met = crate::goodput::judge(&r.latencies(), &r.slo.unwrap_or(snap.config.slo));
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
        // inc_by(0) on a miss too: a backend or route that has met no SLO since goodput
        // started has a met series at 0, so attainment reads 0 and the burn-rate alerts fire,
        // where a missing series would make both ratios empty.
        m.slo_met.with_label_values(&labels).inc_by(u64::from(met));
        m.slo_met_tokens.with_label_values(&labels).inc_by(if met { out } else { 0 });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::request::Operation;
    use std::sync::atomic::Ordering;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_quiet_recorder_blocks_instead_of_polling_and_still_takes_records() {
        let metrics = Metrics::new();
        let config = ConfigHandle::start(
            None,
            Some("http://127.0.0.1:9".into()),
            metrics.config_reloads.clone(),
            Default::default(),
        )
        .await
        .expect("config");
        let recorder = Recorder::start(config, metrics, None, None);
        // Past PARK_AFTER with nothing to do: the loop runs for publishes only (4 a second),
        // where polling every DRAIN_EVERY would be ~20.
        tokio::time::sleep(PARK_AFTER + Duration::from_millis(500)).await;
        let before = recorder.shared.rounds.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rounds = recorder.shared.rounds.load(Ordering::Relaxed) - before;
        assert!(rounds <= 8, "an idle recorder woke {rounds} times in a second");
        assert!(rounds >= 2, "the windows must still be published while idle ({rounds} rounds)");
        // A record that arrives while it is blocked is taken.
        let r = RequestRecord { backend: "default".into(), ..RequestRecord::start(1, Operation::Chat) };
        recorder.submit(r, Payload::default());
        assert!(recorder.flush(Duration::from_secs(5)).await, "the record was not processed");
        assert_eq!(recorder.shared.processed(), 1);
    }
}
