//! The running configuration: a validated `Config` resolved into what the hot path uses,
//! swapped atomically on reload (file change in the config's directory, or SIGHUP).

use arc_swap::ArcSwap;
use http::HeaderMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokenizers::Tokenizer;

use super::{Config, ConfigError, ConfigErrors};
use crate::route::{BackendState, Class, Endpoint, Objective, Policy, Reason};
use crate::sim::{Sim, Sims};

/// A backend as the hot path needs it: parsed once per config load, not per request.
pub struct ResolvedBackend {
    pub name: Arc<str>,
    /// Path prefix of the backend URL(s), without a trailing slash (usually empty). The
    /// scheme and authority are each endpoint's (`state.endpoints()`), parsed once: upstream
    /// URIs are built from these parts and the request's own path, never by joining strings.
    pub base_path: String,
    /// A pool of replicas (`endpoints`, `discovery`): `pool` chooses one per request.
    pub is_pool: bool,
    pub pool: super::PoolSettings,
    models: HashMap<String, Arc<str>>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub headers: HeaderMap,
    pub sim: Option<Arc<Sim>>,
    /// The model it serves (first of `models`, else the simulator's): the name a route with
    /// `rewrite_model` puts in the body.
    pub served_model: Option<Arc<str>>,
    pub price: super::Price,
    pub max_concurrency: Option<u64>,
    /// Outstanding requests and the circuit breaker; kept across reloads by name.
    pub state: Arc<BackendState>,
    /// `goodput_requests_in_flight{backend}`, looked up on first use rather than per request.
    pub in_flight: OnceLock<prometheus::IntGauge>,
}

impl ResolvedBackend {
    /// The upstream URI of a request: this backend's scheme, authority and base path, then the
    /// client's path and query. Only origin-form targets (`/...`) are accepted, so that no
    /// client target can change where the request goes.
    pub fn uri(&self, e: &Endpoint, target: &http::uri::PathAndQuery) -> Result<http::Uri, String> {
        if !target.as_str().starts_with('/') {
            return Err(format!("request target {target} is not origin-form"));
        }
        let pq = if self.base_path.is_empty() {
            target.clone()
        } else {
            http::uri::PathAndQuery::try_from(format!("{}{target}", self.base_path))
                .map_err(|e| e.to_string())?
        };
        http::Uri::builder()
            .scheme(e.scheme.clone())
            .authority(e.authority.clone())
            .path_and_query(pq)
            .build()
            .map_err(|e| e.to_string())
    }

    /// The model names it serves: configured, discovered and the simulator's.
    pub fn served_models(&self) -> Vec<String> {
        let mut out: Vec<String> = self.models.keys().cloned().collect();
        out.extend(self.state.models.all().iter().map(|m| m.to_string()));
        out.extend(self.served_model.iter().map(|m| m.to_string()));
        out.sort();
        out.dedup();
        out
    }

    /// Bounded label value for a requested model name.
    pub fn serves(&self, model: &str) -> bool {
        self.models.contains_key(model) || self.state.models.get(model).is_some()
    }

    pub fn model_label(&self, requested: Option<&str>) -> Arc<str> {
        thread_local! {
            static OTHER: Arc<str> = Arc::from("other");
            static UNKNOWN: Arc<str> = Arc::from("unknown");
        }
        match requested {
            None => UNKNOWN.with(Arc::clone),
            Some(m) => match self.models.get(m) {
                Some(l) => l.clone(),
                // Names the server listed on /v1/models (bounded), when the config lists none.
                None => self.state.models.get(m).unwrap_or_else(|| OTHER.with(Arc::clone)),
            },
        }
    }

    /// Where the backend is, for people: its URL, or its pool's endpoints.
    pub fn describe(&self) -> String {
        let eps = self.state.endpoints();
        let urls: Vec<String> =
            eps.iter().map(|e| format!("{}://{}{}", e.scheme, e.authority, self.base_path)).collect();
        crate::config::redact_userinfo(&urls.join(", "))
    }

    /// An endpoint for goodput's own requests (readiness, shadow re-samples): the least
    /// loaded one whose breaker is closed, else the first.
    pub fn any_endpoint(&self) -> Option<Arc<Endpoint>> {
        let eps = self.state.endpoints();
        let now = std::time::Instant::now();
        eps.iter().filter(|e| e.healthy(now)).min_by_key(|e| e.outstanding()).or_else(|| eps.first()).cloned()
    }

    /// The endpoint labelled `label` while it is in the pool, else `any_endpoint`: a check's
    /// re-samples come from the replica that served the response, so that its quality is
    /// that replica's.
    pub fn endpoint_or_any(&self, label: &str) -> Option<Arc<Endpoint>> {
        let eps = self.state.endpoints();
        eps.iter().find(|e| !label.is_empty() && &*e.label == label).cloned().or_else(|| self.any_endpoint())
    }
}

pub struct Snapshot {
    pub config: Config,
    pub backends: Vec<Arc<ResolvedBackend>>,
    /// Routes as the hot path uses them, in config order (index = `config.routes` index).
    pub routes: Vec<ResolvedRoute>,
    /// Requests no route matches.
    pub default_route: ResolvedRoute,
    pub policy: Policy,
}

/// A route resolved once per config load: its label, SLA class, candidate backends and the
/// SLOs its requests are judged against.
pub struct ResolvedRoute {
    pub name: Arc<str>,
    pub class_name: Arc<str>,
    pub class: Class,
    /// Indices into `Snapshot::backends`, in config order.
    pub candidates: Vec<usize>,
    pub sample_rate: f64,
    pub rewrite_model: bool,
    /// The class sheds load when its every endpoint is saturated (`SlaClass::shed`).
    pub shed: bool,
    /// Per-request judgement: the class's bounds where set, else the global `slo`.
    pub slo: super::Slo,
    /// `goodput_route_decisions_total` per candidate and reason (`k * Reason::COUNT +
    /// reason`), looked up on first use rather than per request.
    pub decided: Box<[OnceLock<prometheus::IntCounter>]>,
}

/// The class of requests that name none and no `routing.default_class` is set: no bounds,
/// fastest first.
pub const UNCLASSED: &str = "default";

impl Snapshot {
    fn new(config: Config, backends: Vec<Arc<ResolvedBackend>>) -> Snapshot {
        let resolve = |name: &str, r: Option<&super::Route>| {
            let class_name = r.and_then(|r| r.class.clone()).or_else(|| config.routing.default_class.clone());
            let sla = class_name.as_ref().and_then(|c| config.classes.get(c));
            let class = match sla {
                Some(c) => Class {
                    ttft_p95_ms: c.ttft_p95_ms,
                    tpot_p95_ms: c.tpot_p95_ms,
                    e2e_p95_ms: c.e2e_p95_ms,
                    max_perplexity: c.max_perplexity,
                    max_hallucination_rate: c.max_hallucination_rate,
                    objective: c.objective,
                },
                None => Class {
                    ttft_p95_ms: None,
                    tpot_p95_ms: None,
                    e2e_p95_ms: None,
                    max_perplexity: None,
                    max_hallucination_rate: None,
                    objective: Objective::Fastest,
                },
            };
            let g = config.slo;
            let slo = super::Slo {
                ttft_ms: class.ttft_p95_ms.or(g.ttft_ms),
                tpot_ms: class.tpot_p95_ms.or(g.tpot_ms),
                e2e_ms: class.e2e_p95_ms.or(g.e2e_ms),
            };
            let allowed = r.map(|r| r.backends.as_slice()).unwrap_or(&[]);
            let candidates: Vec<usize> = (0..backends.len())
                .filter(|&i| allowed.is_empty() || allowed.iter().any(|a| *a == *backends[i].name))
                .collect();
            let decided = (0..candidates.len() * Reason::COUNT).map(|_| OnceLock::new()).collect();
            ResolvedRoute {
                name: Arc::from(name),
                class_name: Arc::from(class_name.as_deref().unwrap_or(UNCLASSED)),
                class,
                candidates,
                sample_rate: r.and_then(|r| r.sample_rate).unwrap_or(config.quality.sample_rate),
                rewrite_model: r.is_some_and(|r| r.rewrite_model),
                shed: sla.is_some_and(|c| c.shed),
                slo,
                decided,
            }
        };
        let routes = config.routes.iter().map(|r| resolve(&r.name, Some(r))).collect();
        let default_route = resolve("default", None);
        let policy = Policy {
            min_samples: config.routing.min_samples,
            min_quality_samples: config.routing.min_quality_samples,
            exploration: config.routing.exploration,
        };
        Snapshot { config, backends, routes, default_route, policy }
    }

    /// The first matching route, else `default`.
    pub fn route(&self, path: &str, model: Option<&str>, headers: &HeaderMap) -> &ResolvedRoute {
        match super::route::select(&self.config.routes, path, model, headers) {
            Some(i) => &self.routes[i],
            None => &self.default_route,
        }
    }

    /// The first configured backend (readiness is probed there).
    pub fn default_backend(&self) -> &Arc<ResolvedBackend> {
        &self.backends[0]
    }

    pub fn backend(&self, name: &str) -> Option<&Arc<ResolvedBackend>> {
        self.backends.iter().find(|b| &*b.name == name)
    }
}

pub struct ConfigHandle {
    current: ArcSwap<Snapshot>,
    path: Option<PathBuf>,
    upstream_override: Option<String>,
    last_text: std::sync::Mutex<String>,
    /// The simulated backends the command started (`sim::Sims`).
    sims: Arc<Sims>,
    /// `goodput_config_reloads_total{result}`, owned by the metrics registry.
    reloads: prometheus::IntCounterVec,
    /// The config goodput started with: what its start-up-only settings still are.
    startup: Config,
}

impl ConfigHandle {
    /// Load, validate and resolve the first config. `upstream` (from --upstream) replaces the
    /// first backend's URL, at start-up and on every reload. The config's simulated backends
    /// must be running in `sims` (see `start_sims`).
    pub async fn start(
        path: Option<PathBuf>,
        upstream: Option<String>,
        reloads: prometheus::IntCounterVec,
        sims: Arc<Sims>,
    ) -> Result<Arc<ConfigHandle>, ConfigErrors> {
        let (config, text) = read(path.as_ref(), upstream.as_deref())?;
        let handle = ConfigHandle {
            current: ArcSwap::from_pointee(Snapshot::new(Config::default(), Vec::new())),
            path,
            upstream_override: upstream,
            last_text: std::sync::Mutex::new(text),
            sims,
            reloads,
            startup: config.clone(),
        };
        let snap = handle.resolve(config).await?;
        log_warnings(&snap.config);
        handle.current.store(Arc::new(snap));
        Ok(Arc::new(handle))
    }

    /// The current snapshot: one atomic load, no lock.
    pub fn load(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.current.load()
    }

    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn path(&self) -> Option<&PathBuf> {
        self.path.as_ref()
    }

    /// The in-process simulator behind a backend, if it is one.
    pub fn sim(&self, backend: &str) -> Option<Arc<Sim>> {
        self.sims.get(backend).map(|(_, s)| s)
    }

    /// Re-read the file; swap only if it is valid. Returns the result label counted in
    /// `goodput_config_reloads_total`.
    pub async fn reload(&self) -> &'static str {
        let result = match read(self.path.as_ref(), self.upstream_override.as_deref()) {
            Err(e) => {
                tracing::error!(errors = %e, "config reload rejected; the previous config keeps serving");
                "invalid"
            }
            Ok((config, text)) => {
                let unchanged = self.last_text.lock().map(|t| *t == text).unwrap_or(false);
                if unchanged {
                    "unchanged"
                } else {
                    // A reload may add simulated backends: they start before it is resolved.
                    let resolved = match start_config_sims(&config, &self.sims).await {
                        Ok(()) => self.resolve(config).await,
                        Err(e) => Err(e),
                    };
                    match resolved {
                        Ok(snap) => {
                            // Against the start-up config: what still differs from what runs.
                            let on_restart = self.startup.startup_only_changes(&snap.config);
                            log_warnings(&snap.config);
                            self.current.store(Arc::new(snap));
                            if let Ok(mut t) = self.last_text.lock() {
                                *t = text;
                            }
                            if on_restart.is_empty() {
                                tracing::info!("config reloaded");
                            } else {
                                tracing::warn!(
                                    settings = %on_restart.join(", "),
                                    "config reloaded; these settings are read at start-up and take effect on restart"
                                );
                            }
                            "success"
                        }
                        Err(e) => {
                            tracing::error!(errors = %e, "config reload rejected; the previous config keeps serving");
                            "invalid"
                        }
                    }
                }
            }
        };
        self.reloads.with_label_values(&[result]).inc();
        result
    }

    async fn resolve(&self, config: Config) -> Result<Snapshot, ConfigErrors> {
        let mut backends = Vec::with_capacity(config.backends.len());
        for (i, b) in config.backends.iter().enumerate() {
            let err = |field: &str, message: String| {
                ConfigErrors(vec![ConfigError { path: format!("backends[{i}]{field}"), message }])
            };
            let mut sim_handle = None;
            let urls: Vec<String> = match (&b.url, &b.sim) {
                (Some(u), _) => vec![u.clone()],
                (None, Some(sc)) => {
                    // Started before resolution (`start_sims`); resolving may change its settings.
                    let (addr, sim) = self
                        .sims
                        .get(&b.name)
                        .ok_or_else(|| err(".sim", "the simulated backend was not started".into()))?;
                    if *sim.config() != *sc {
                        sim.set_config(sc.clone());
                    }
                    sim_handle = Some(sim);
                    vec![format!("http://{addr}")]
                }
                (None, None) => b.endpoints.clone(),
            };
            let mut addrs = Vec::with_capacity(urls.len());
            let mut base_path = String::new();
            for (k, url) in urls.iter().enumerate() {
                let field = if b.url.is_some() || b.sim.is_some() {
                    ".url".to_string()
                } else {
                    format!(".endpoints[{k}]")
                };
                let uri: http::Uri = url.parse().map_err(|e| err(&field, format!("{e}")))?;
                let scheme = uri.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
                let authority =
                    uri.authority().cloned().ok_or_else(|| err(&field, "the URL has no host".into()))?;
                base_path = uri.path().trim_end_matches('/').to_string();
                addrs.push((scheme, authority));
            }
            let tokenizer = match &b.tokenizer {
                None => None,
                Some(p) => {
                    let p = p.clone();
                    let t = tokio::task::spawn_blocking(move || Tokenizer::from_file(&p))
                        .await
                        .map_err(|e| err(".tokenizer", e.to_string()))?
                        .map_err(|e| err(".tokenizer", format!("cannot load tokenizer: {e}")))?;
                    Some(Arc::new(t))
                }
            };
            let mut headers = HeaderMap::new();
            for (k, v) in &b.headers {
                if let (Ok(k), Ok(v)) =
                    (http::HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_str(v))
                {
                    headers.insert(k, v);
                }
            }
            let mut models: HashMap<String, Arc<str>> =
                b.models.iter().map(|m| (m.clone(), Arc::from(m.as_str()))).collect();
            if let Some(sc) = &b.sim {
                models.entry(sc.model.clone()).or_insert_with(|| Arc::from(sc.model.as_str()));
            }
            let served_model = b
                .models
                .first()
                .map(|m| Arc::from(m.as_str()))
                .or_else(|| b.sim.as_ref().map(|s| Arc::from(s.model.as_str())));
            let breaker = config.routing.breaker.to_breaker();
            let state = match self.current.load().backend(&b.name) {
                Some(old) => {
                    old.state.set_breaker_config(breaker);
                    old.state.clone()
                }
                None => BackendState::new(breaker),
            };
            match &b.discovery {
                None => {
                    state.set_endpoints(addrs);
                }
                // A new pool (or one whose DNS settings changed) is looked up before it serves;
                // a failure is not a config error (the name may have no ready pod yet).
                Some(d)
                    if state.discovery.last().is_none()
                        || self
                            .current
                            .load()
                            .config
                            .backends
                            .iter()
                            .find(|o| o.name == b.name)
                            .and_then(|o| o.discovery.as_ref())
                            != Some(d) =>
                {
                    if let Err(why) = crate::route::discovery::refresh(&b.name, &state, d).await {
                        tracing::warn!(backend = %b.name, "DNS discovery: {why}; the pool is empty until it answers");
                    }
                }
                Some(_) => {}
            }
            backends.push(Arc::new(ResolvedBackend {
                name: Arc::from(b.name.as_str()),
                base_path,
                is_pool: b.is_pool(),
                pool: b.pool.clone(),
                models,
                tokenizer,
                headers,
                sim: sim_handle,
                served_model,
                price: b.price,
                max_concurrency: b.max_concurrency,
                state,
                in_flight: OnceLock::new(),
            }));
        }
        Ok(Snapshot::new(config, backends))
    }
}

/// Start the simulated backends the config at `path` names (with `--upstream`, the first
/// backend is the upstream and not simulated): the command does this before
/// `ConfigHandle::start`, so that resolving a config never starts a server.
pub async fn start_sims(
    path: Option<&PathBuf>,
    upstream: Option<&str>,
    sims: &Sims,
) -> Result<(), ConfigErrors> {
    let (config, _) = read(path, upstream)?;
    start_config_sims(&config, sims).await
}

/// Start any simulated backend of `config` that is not running yet.
async fn start_config_sims(config: &Config, sims: &Sims) -> Result<(), ConfigErrors> {
    for (i, b) in config.backends.iter().enumerate() {
        if let (None, Some(sc)) = (&b.url, &b.sim) {
            sims.start(&b.name, sc.clone()).await.map_err(|e| {
                ConfigErrors(vec![ConfigError {
                    path: format!("backends[{i}].sim"),
                    message: format!("cannot start the simulator: {e}"),
                }])
            })?;
        }
    }
    Ok(())
}

/// Once per config that is adopted, not on every read of the file.
fn log_warnings(config: &Config) {
    for w in config.warnings() {
        tracing::warn!("config: {w}");
    }
}

fn read(path: Option<&PathBuf>, upstream: Option<&str>) -> Result<(Config, String), ConfigErrors> {
    let text = match path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: String::new(),
                message: format!("cannot read {}: {e}", p.display()),
            }])
        })?,
        None => String::new(),
    };
    let mut config: Config = if text.trim().is_empty() {
        Config::default()
    } else {
        // Validated below, after --upstream may have supplied the missing backend.
        Config::parse(&text)?
    };
    if let Some(u) = upstream {
        let (name, url) = split_upstream(u);
        match config.backends.first_mut() {
            Some(b) => {
                b.url = Some(url.to_string());
                b.sim = None;
                b.endpoints.clear();
                b.discovery = None;
                if let Some(n) = name {
                    b.name = n.to_string();
                }
            }
            None => config.backends.push(super::Backend::at(
                name.map_or_else(|| name_from_host(url), str::to_string),
                url.to_string(),
            )),
        }
    }
    config.validate()?;
    Ok((config, text))
}

/// `--upstream NAME=URL` or `--upstream URL`.
fn split_upstream(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once('=') {
        Some((name, url)) if !name.is_empty() && !name.contains([':', '/']) => (Some(name), url),
        _ => (None, arg),
    }
}

/// A backend named after its URL's host (`http://vllm-0.vllm:8000` → `vllm-0.vllm`), so that
/// metrics and decisions say which server they are about; `default` when there is none.
fn name_from_host(url: &str) -> String {
    let host = url.parse::<http::Uri>().ok().and_then(|u| u.host().map(str::to_string)).unwrap_or_default();
    let name: String = host
        .trim_matches(['[', ']'])
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect();
    if name.is_empty() { "default".into() } else { name }
}

/// Reload on any change in the config file's directory (Kubernetes swaps a ConfigMap by
/// re-pointing the `..data` symlink, so watching the file itself would miss it) and on SIGHUP.
pub fn spawn_reloader(handle: Arc<ConfigHandle>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let watcher = handle.path().and_then(|p| {
        let dir = p
            .parent()
            .map(|d| if d.as_os_str().is_empty() { PathBuf::from(".") } else { d.to_path_buf() })?;
        let tx = tx.clone();
        let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res
                && !ev.kind.is_access()
            {
                let _ = tx.try_send(());
            }
        })
        .map_err(|e| tracing::warn!(error = %e, "cannot watch the config directory; reload with SIGHUP"))
        .ok()?;
        use notify::Watcher;
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(
                |e| tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the config directory"),
            )
            .ok()?;
        Some(w)
    });
    tokio::spawn(async move {
        let (_watcher, _tx) = (watcher, tx);
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hup_recv = std::future::pending::<Option<()>>();
            tokio::select! {
                r = rx.recv() => {
                    if r.is_none() { return; }
                    // Editors and ConfigMap swaps write in several steps: let them settle.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = hup_recv => {}
            }
            if handle.path().is_some() {
                handle.reload().await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_argument_names_the_backend() {
        assert_eq!(split_upstream("vllm=http://10.0.0.7:8000"), (Some("vllm"), "http://10.0.0.7:8000"));
        assert_eq!(split_upstream("http://h:1/a=b"), (None, "http://h:1/a=b"));
        assert_eq!(name_from_host("http://vllm-0.vllm.ns:8000"), "vllm-0.vllm.ns");
        assert_eq!(name_from_host("http://127.0.0.1:8021"), "127.0.0.1");
        assert_eq!(name_from_host("http://[::1]:8021"), "__1");
        assert_eq!(name_from_host("not a url"), "default");
        let (c, _) = read(None, Some("http://vllm:8000")).unwrap();
        assert_eq!(c.backends[0].name, "vllm");
        let (c, _) = read(None, Some("gpu-a=http://vllm:8000")).unwrap();
        assert_eq!(c.backends[0].name, "gpu-a");
    }
}
