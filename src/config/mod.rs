//! Configuration: schema, defaults, validation with precise errors, and hot reload.
//!
//! The running config is an `ArcSwap<Config>`: the hot path loads a snapshot per request and
//! never waits on a reload. An invalid reload is rejected and the old snapshot keeps serving.

pub mod pool;
pub mod quality;
pub mod reload;
pub mod route;
pub mod routing;

pub use pool::{Discovery, PoolPolicy, PoolSettings, PoolWeights, PrefixSettings};
pub use quality::{
    CalibrationConfig, ConsistencyConfig, Device, DriftConfig, Method, PerplexityConfig, QualityConfig,
    Resample,
};
pub use reload::{ConfigHandle, spawn_reloader};
pub use route::{Route, RouteMatch};
pub use routing::{BreakerSettings, RoutingConfig, SlaClass, StatsSettings, StatsSource};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::sim::SimConfig;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Proxy listener (HTTP/1.1 and h2c). Read at start-up only.
    pub listen: String,
    /// Admin listener: /metrics, /healthz, /readyz, /admin/*. Read at start-up only.
    pub admin_listen: String,
    /// Bearer token that /admin/* requires (e.g. when admin_listen is not loopback).
    /// GOODPUT_ADMIN_TOKEN overrides it. /metrics, /healthz and /readyz stay open for
    /// Prometheus and the kubelet. Read at start-up only; redacted in /admin/config.
    pub admin_token: Option<String>,
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    pub limits: Limits,
    pub usage: UsageConfig,
    pub slo: Slo,
    pub metrics: MetricsConfig,
    /// Named classes of traffic (first match wins); unmatched requests are route `default`.
    pub routes: Vec<Route>,
    /// SLA classes by name; a route names its class.
    pub classes: std::collections::BTreeMap<String, SlaClass>,
    pub routing: RoutingConfig,
    pub quality: QualityConfig,
    /// TLS to `https://` backends. Read at start-up only.
    pub upstream_tls: UpstreamTls,
    /// Retired: ignored with a warning.
    #[serde(skip_serializing_if = "Retired::is_unset")]
    pub upstream: Retired,
    /// Retired: ignored with a warning.
    #[serde(skip_serializing_if = "Retired::is_unset")]
    pub server: Retired,
}

/// A section whose keys goodput no longer reads (`server.direct`, `upstream.direct`: goodput's
/// own HTTP/1.1 server loop and client are gone, hyper serves and forwards everything). An old
/// config still loads; `Config::warnings` names what it sets.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Retired {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
}

impl Retired {
    fn is_unset(&self) -> bool {
        self.direct.is_none()
    }
}

/// `https://` backends are verified against the system's roots and these.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTls {
    /// PEM files of extra CAs to trust (e.g. a cluster's own CA).
    pub ca_files: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "127.0.0.1:9464".into(),
            admin_token: None,
            backends: Vec::new(),
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            usage: UsageConfig::default(),
            slo: Slo::default(),
            metrics: MetricsConfig::default(),
            routes: Vec::new(),
            classes: Default::default(),
            routing: RoutingConfig::default(),
            quality: QualityConfig::default(),
            upstream_tls: UpstreamTls::default(),
            upstream: Retired::default(),
            server: Retired::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Label value for metrics; unique.
    pub name: String,
    /// Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000. Set one of `url`,
    /// `endpoints`, `discovery` and `sim`.
    #[serde(default)]
    pub url: Option<String>,
    /// A pool of replicas of one server, as base URLs: each request goes to one of them,
    /// chosen by `pool`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// A pool of replicas found in DNS (a Kubernetes headless Service), kept current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// How a replica of the pool is chosen (`endpoints`, `discovery`).
    #[serde(default)]
    pub pool: PoolSettings,
    /// Run the simulated backend in-process instead of calling a server (demo and tests).
    #[serde(default)]
    pub sim: Option<SimConfig>,
    /// Model names this backend serves. They become `gen_ai_request_model` label values;
    /// any other requested name is labelled `other` so that clients cannot grow cardinality.
    #[serde(default)]
    pub models: Vec<String>,
    /// The served model's tokenizer.json, used to count tokens when the server sends no usage.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// Extra headers sent upstream (e.g. an API key). Values are redacted in /admin/config.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Price per 1M tokens (any currency, used consistently): the `cheapest` and `best-value`
    /// objectives and the tput/(ppl x price) index use it.
    #[serde(default)]
    pub price: Price,
    /// Requests in flight at most; the router sends no more while it is reached.
    #[serde(default)]
    pub max_concurrency: Option<u64>,
    /// The server's own metrics (vLLM's `/metrics`: queue, running requests, KV cache, prefix
    /// cache, preemptions), read on an interval beside goodput's measurements.
    #[serde(default)]
    pub server_metrics: ServerMetrics,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerMetrics {
    pub enabled: bool,
    /// Default: 500 ms for a pool (`endpoints`, `discovery`), whose choices read it, else
    /// 1000 ms (a read costs vLLM's API server about 10 ms of CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Path on the backend's origin (not under its base path): vLLM serves `/metrics` at the
    /// root whatever prefix its API has.
    pub path: String,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics { enabled: true, interval_ms: None, path: "/metrics".into() }
    }
}

impl Backend {
    /// Whether requests are spread over several replicas (then `pool` chooses).
    pub fn is_pool(&self) -> bool {
        self.discovery.is_some() || self.endpoints.len() > 1
    }

    /// How often the servers' `/metrics` are read.
    pub fn server_metrics_interval(&self) -> std::time::Duration {
        let ms = self.server_metrics.interval_ms.unwrap_or(if self.is_pool() { 500 } else { 1000 });
        std::time::Duration::from_millis(ms)
    }

    /// A backend that sets nothing but a name and a URL (as `--upstream` makes one).
    pub fn at(name: String, url: String) -> Backend {
        Backend {
            name,
            url: Some(url),
            endpoints: Vec::new(),
            discovery: None,
            pool: PoolSettings::default(),
            sim: None,
            models: Vec::new(),
            tokenizer: None,
            headers: Default::default(),
            price: Default::default(),
            max_concurrency: None,
            server_metrics: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    pub input_per_1m: f64,
    pub output_per_1m: f64,
}

impl Price {
    /// Cost of one request's tokens.
    pub fn of(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_per_1m + output as f64 * self.output_per_1m) / 1e6
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP connect to the upstream.
    pub connect_ms: u64,
    /// From sending the request to the answer's first token: its response headers and, for a
    /// server that sends them at once and then queues the request (vLLM), its first content.
    pub first_byte_ms: u64,
    /// Longest silence between two body frames of a response once its first token has come.
    pub idle_ms: u64,
    /// How long an idle upstream connection is kept for reuse. Below the upstream's own
    /// keep-alive timeout (5 s in vLLM and llama.cpp's server), so that goodput never writes a
    /// request to a connection the server is closing.
    pub pool_idle_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { connect_ms: 2_000, first_byte_ms: 300_000, idle_ms: 120_000, pool_idle_ms: 4_000 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: u64,
    /// Client connections open at once. A connection past it is answered 503 with Retry-After
    /// and closed, so that a flood cannot exhaust file descriptors. Read at start-up only.
    pub max_connections: usize,
    /// Largest request head (request line and headers, HTTP/1.1) or header list (h2); larger
    /// ones get 431. Read at start-up only.
    pub max_header_bytes: usize,
    /// A client must send its whole request head within this time (slowloris). Read at start-up.
    pub header_read_timeout_ms: u64,
    /// A client that takes none of its answer for this long has its connection closed (nginx's
    /// `send_timeout`): a stuck client would otherwise hold its connection, the upstream
    /// request and the generation without end; over h2 a stream the client grants no window
    /// is reset. For connections accepted, and h2 answers begun, after a reload.
    pub send_timeout_ms: u64,
    /// Retry-After (seconds) on the 503s that limits answer.
    pub retry_after_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 * 1024 * 1024,
            max_connections: 10_000,
            max_header_bytes: 64 * 1024,
            header_read_timeout_ms: 30_000,
            send_timeout_ms: 60_000,
            retry_after_secs: 1,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    /// Ask for `stream_options.include_usage` on streams whose client did not, and remove the
    /// usage-only chunk before the client sees it. The one change the proxy makes to traffic.
    pub inject_stream_usage: bool,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig { inject_stream_usage: true }
    }
}

/// Latency SLOs that judge each request; absent ones are not checked.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Length of the sliding windows per backend.
    pub window_secs: u64,
    /// How many finished-request records /admin/records keeps (no text, only numbers).
    pub recent_records: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { window_secs: 60, recent_records: 1000 }
    }
}

/// One precise problem: where in the file, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() || self.path == "." {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// The settings read only at start-up that differ in `new`: a reload applies everything
    /// else and names these, which take effect on restart.
    pub fn startup_only_changes(&self, new: &Config) -> Vec<&'static str> {
        // Sample rates are read per request; the rest of the consistency section at start-up.
        let checks =
            |c: &Option<ConsistencyConfig>| c.clone().map(|c| ConsistencyConfig { sample_rate: 0.0, ..c });
        let (q, nq) = (&self.quality, &new.quality);
        [
            ("listen", self.listen != new.listen),
            ("admin_listen", self.admin_listen != new.admin_listen),
            ("admin_token", self.admin_token != new.admin_token),
            ("upstream_tls", self.upstream_tls != new.upstream_tls),
            // The upstream clients are built at start-up.
            ("timeouts.connect_ms", self.timeouts.connect_ms != new.timeouts.connect_ms),
            ("timeouts.pool_idle_ms", self.timeouts.pool_idle_ms != new.timeouts.pool_idle_ms),
            ("limits.max_connections", self.limits.max_connections != new.limits.max_connections),
            ("limits.max_header_bytes", self.limits.max_header_bytes != new.limits.max_header_bytes),
            (
                "limits.header_read_timeout_ms",
                self.limits.header_read_timeout_ms != new.limits.header_read_timeout_ms,
            ),
            ("quality.queue_capacity", q.queue_capacity != nq.queue_capacity),
            ("quality.max_cpu", q.max_cpu != nq.max_cpu),
            ("quality.perplexity", q.perplexity != nq.perplexity),
            ("quality.consistency", checks(&q.consistency) != checks(&nq.consistency)),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }

    /// What a valid config sets that has no effect, one sentence each.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = [("server.direct", self.server), ("upstream.direct", self.upstream)]
            .into_iter()
            .filter(|(_, r)| !r.is_unset())
            .map(|(key, _)| {
                format!("`{key}` is no longer read and is ignored: hyper serves every connection and sends every upstream request; remove the key")
            })
            .collect();
        if let Some(c) = &self.quality.consistency
            && let Some(m) = c.methods.first()
            && !m.is_probability()
            && c.calibration.is_none()
        {
            w.push(format!(
                "`quality.consistency`: `{}` scores only rank responses, so no hallucination rate is reported (null) until `calibration` sets a threshold; `threshold` applies to `prompt` only",
                m.as_str()
            ));
        }
        w
    }

    pub fn from_yaml(text: &str) -> Result<Config, ConfigErrors> {
        let cfg = Config::parse(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parse without the semantic checks of `validate`.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            // The YAML error text carries its own (shorter) path and location: keep the reason.
            let mut message = inner.to_string();
            if let Some((head, rest)) = message.split_once(": ")
                && !head.contains(' ')
            {
                message = rest.to_string();
            }
            if let Some(loc) = inner.location() {
                let suffix = format!(" at line {} column {}", loc.line(), loc.column());
                if let Some(m) = message.strip_suffix(&suffix) {
                    message = m.to_string();
                }
                message = format!("{message} (line {}, column {})", loc.line(), loc.column());
            }
            ConfigErrors(vec![ConfigError { path, message }])
        })
    }

    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                path: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        Config::from_yaml(&text)
    }

    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errs = Vec::new();
        let mut err = |path: String, message: String| errs.push(ConfigError { path, message });
        for (field, v) in [("listen", &self.listen), ("admin_listen", &self.admin_listen)] {
            if v.parse::<std::net::SocketAddr>().is_err() {
                err(field.into(), format!("`{v}` is not an address like 127.0.0.1:8080"));
            }
        }
        if self.backends.is_empty() {
            err("backends".into(), "at least one backend is required".into());
        }
        let mut names = std::collections::HashSet::new();
        for (i, b) in self.backends.iter().enumerate() {
            let p = format!("backends[{i}]");
            if b.name.is_empty() || !b.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                err(format!("{p}.name"), format!("`{}` must be non-empty [A-Za-z0-9._-]", b.name));
            }
            if !names.insert(b.name.as_str()) {
                err(format!("{p}.name"), format!("duplicate backend name `{}`", b.name));
            }
            let set = [b.url.is_some(), !b.endpoints.is_empty(), b.discovery.is_some(), b.sim.is_some()];
            match set.iter().filter(|x| **x).count() {
                0 => err(p.clone(), "set `url`, `endpoints`, `discovery` or `sim`".into()),
                1 => {}
                _ => err(p.clone(), "set only one of `url`, `endpoints`, `discovery` and `sim`".into()),
            }
            if let Some(u) = &b.url
                && let Err(why) = check_upstream_url(u)
            {
                err(format!("{p}.url"), why);
            }
            let mut seen = std::collections::HashSet::new();
            for (k, u) in b.endpoints.iter().enumerate() {
                if let Err(why) = check_upstream_url(u) {
                    err(format!("{p}.endpoints[{k}]"), why);
                } else if !seen.insert(endpoint_key(u)) {
                    err(format!("{p}.endpoints[{k}]"), format!("`{u}` is listed twice"));
                }
            }
            if b.endpoints.len() > 1 {
                let base =
                    |u: &str| u.parse::<http::Uri>().map(|u| u.path().trim_end_matches('/').to_string()).ok();
                if b.endpoints.iter().any(|u| base(u) != base(&b.endpoints[0])) {
                    err(
                        format!("{p}.endpoints"),
                        "every endpoint must have the same path (replicas of one server)".into(),
                    );
                }
            }
            if let Some(d) = &b.discovery {
                if d.dns.is_empty() || d.dns.contains(['/', ':', ' ']) {
                    err(format!("{p}.discovery.dns"), format!("`{}` is not a DNS name", d.dns));
                }
                if d.port == 0 {
                    err(format!("{p}.discovery.port"), "must be a port number".into());
                }
                if !(1..=86_400).contains(&d.refresh_secs) {
                    err(format!("{p}.discovery.refresh_secs"), "must be between 1 and 86400".into());
                }
                if !matches!(d.scheme.as_str(), "http" | "https") {
                    err(format!("{p}.discovery.scheme"), "must be http or https".into());
                }
                if let Some(ns) = &d.nameserver
                    && ns.parse::<std::net::SocketAddr>().is_err()
                {
                    err(
                        format!("{p}.discovery.nameserver"),
                        format!("`{ns}` is not an address like 10.96.0.10:53"),
                    );
                }
            }
            for (field, why) in b.pool.problems() {
                err(format!("{p}.pool.{field}"), why);
            }
            if let Some(s) = &b.sim
                && let Err((field, why)) = s.validate()
            {
                err(format!("{p}.sim.{field}"), why);
            }
            if let Some(t) = &b.tokenizer
                && !t.is_file()
            {
                err(format!("{p}.tokenizer"), format!("no such file: {}", t.display()));
            }
            if !(b.price.input_per_1m >= 0.0
                && b.price.output_per_1m >= 0.0
                && b.price.input_per_1m.is_finite()
                && b.price.output_per_1m.is_finite())
            {
                err(format!("{p}.price"), "prices must be finite and >= 0".into());
            }
            let sm = &b.server_metrics;
            if let Some(ms) = sm.interval_ms
                && !(100..=3_600_000).contains(&ms)
            {
                err(format!("{p}.server_metrics.interval_ms"), "must be between 100 and 3600000".into());
            }
            if !sm.path.starts_with('/') || http::uri::PathAndQuery::try_from(sm.path.as_str()).is_err() {
                err(format!("{p}.server_metrics.path"), format!("`{}` is not a path like /metrics", sm.path));
            }
            if b.max_concurrency == Some(0) {
                err(format!("{p}.max_concurrency"), "must be >= 1 (omit it for no limit)".into());
            }
            for (k, v) in &b.headers {
                if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    err(format!("{p}.headers.{k}"), "not a valid header name".into());
                }
                if http::HeaderValue::from_str(v).is_err() {
                    err(format!("{p}.headers.{k}"), "not a valid header value".into());
                }
            }
        }
        let t = &self.timeouts;
        for (field, v) in [
            ("connect_ms", t.connect_ms),
            ("first_byte_ms", t.first_byte_ms),
            ("idle_ms", t.idle_ms),
            ("pool_idle_ms", t.pool_idle_ms),
        ] {
            if v == 0 {
                err(format!("timeouts.{field}"), "must be > 0".into());
            }
        }
        let l = &self.limits;
        if l.max_body_bytes == 0 {
            err("limits.max_body_bytes".into(), "must be > 0".into());
        }
        if l.max_connections == 0 {
            err("limits.max_connections".into(), "must be > 0".into());
        }
        // hyper's HTTP/1.1 read buffer cannot be smaller than 8 KiB.
        if !(8192..=16 * 1024 * 1024).contains(&l.max_header_bytes) {
            err("limits.max_header_bytes".into(), "must be between 8192 and 16777216".into());
        }
        if l.header_read_timeout_ms == 0 {
            err("limits.header_read_timeout_ms".into(), "must be > 0".into());
        }
        if l.send_timeout_ms == 0 {
            err("limits.send_timeout_ms".into(), "must be > 0".into());
        }
        if matches!(&self.admin_token, Some(t) if t.is_empty() || http::HeaderValue::from_str(t).is_err()) {
            err("admin_token".into(), "must be a non-empty header-safe string".into());
        }
        for (field, v) in
            [("ttft_ms", self.slo.ttft_ms), ("tpot_ms", self.slo.tpot_ms), ("e2e_ms", self.slo.e2e_ms)]
        {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                err(format!("slo.{field}"), format!("must be a positive number of milliseconds, got {v}"));
            }
        }
        if !(1..=3600).contains(&self.metrics.window_secs) {
            err("metrics.window_secs".into(), "must be between 1 and 3600".into());
        }
        if let Some(j) = self.quality.consistency.as_ref().and_then(|c| c.judge_backend.as_ref())
            && !self.backends.iter().any(|b| &b.name == j)
        {
            err("quality.consistency.judge_backend".into(), format!("no backend named `{j}`"));
        }
        if let Some(r) = self
            .quality
            .consistency
            .as_ref()
            .and_then(|c| c.calibration.as_ref())
            .and_then(|k| k.reference_backend.as_ref())
            && !self.backends.iter().any(|b| &b.name == r)
        {
            err(
                "quality.consistency.calibration.reference_backend".into(),
                format!("no backend named `{r}`"),
            );
        }
        let backend_names: Vec<&str> = self.backends.iter().map(|b| b.name.as_str()).collect();
        route::validate(&self.routes, &backend_names, &self.classes, &mut err);
        routing::validate(&self.routing, &self.classes, &mut err);
        self.quality.validate(&mut err);
        if errs.is_empty() { Ok(()) } else { Err(ConfigErrors(errs)) }
    }

    /// The config as /admin/config shows it: header values (API keys) redacted.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        if c.admin_token.is_some() {
            c.admin_token = Some("<redacted>".into());
        }
        for b in &mut c.backends {
            for v in b.headers.values_mut() {
                *v = "<redacted>".into();
            }
            if let Some(u) = &mut b.url {
                *u = redact_userinfo(u);
            }
        }
        c
    }
}

fn check_upstream_url(u: &str) -> Result<(), String> {
    let uri: http::Uri = u.parse().map_err(|e| format!("`{u}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(s) => return Err(format!("scheme `{s}` is not supported; use http:// or https://")),
        None => return Err(format!("`{u}` needs a scheme, e.g. http://{u}")),
    }
    if uri.host().is_none() {
        return Err(format!("`{u}` has no host"));
    }
    if uri.query().is_some() {
        return Err("a backend URL cannot carry a query".into());
    }
    Ok(())
}

/// An endpoint's identity in the pool: its scheme and authority (`http://10.0.0.7:8000`).
pub fn endpoint_key(u: &str) -> String {
    match u.parse::<http::Uri>() {
        Ok(uri) => {
            format!("{}://{}", uri.scheme_str().unwrap_or("http"), uri.authority().map_or("", |a| a.as_str()))
        }
        Err(_) => u.to_string(),
    }
}

pub fn redact_userinfo(u: &str) -> String {
    match (u.find("://"), u.find('@')) {
        (Some(s), Some(at)) if at > s => format!("{}<redacted>@{}", &u[..s + 3], &u[at + 1..]),
        _ => u.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "backends:\n  - name: a\n    url: http://127.0.0.1:8000\n";

    #[test]
    fn a_reload_names_the_settings_that_wait_for_a_restart() {
        let old = Config::from_yaml(&format!(
            "{MIN}quality:\n  sample_rate: 0.1\n  consistency:\n    sample_rate: 0.01\n"
        ))
        .unwrap();
        // Rates and backends apply at once: nothing to name.
        let live = Config::from_yaml(
            "backends:\n  - name: b\n    url: http://127.0.0.1:9000\n\
             quality:\n  sample_rate: 0.5\n  consistency:\n    sample_rate: 0.2\n",
        )
        .unwrap();
        assert!(old.startup_only_changes(&live).is_empty());
        let restart = Config::from_yaml(&format!(
            "{MIN}listen: 0.0.0.0:9999\nquality:\n  max_cpu: 2\n  consistency:\n    samples: 5\n\
             timeouts: {{connect_ms: 100, pool_idle_ms: 1000, idle_ms: 5}}\nlimits: {{max_connections: 9}}\n"
        ))
        .unwrap();
        assert_eq!(
            old.startup_only_changes(&restart),
            [
                "listen",
                "timeouts.connect_ms",
                "timeouts.pool_idle_ms",
                "limits.max_connections",
                "quality.max_cpu",
                "quality.consistency"
            ]
        );
    }

    #[test]
    fn a_pool_is_a_list_or_a_dns_name_and_its_mistakes_are_named() {
        let pool = |b: &str| Config::from_yaml(&format!("backends:\n  - name: p\n{b}"));
        let c = pool("    endpoints: [http://10.0.0.1:8000, http://10.0.0.2:8000]\n").unwrap();
        assert!(c.backends[0].is_pool());
        assert_eq!(c.backends[0].server_metrics_interval(), std::time::Duration::from_millis(500));
        assert!(!Config::from_yaml(MIN).unwrap().backends[0].is_pool());
        assert_eq!(Config::from_yaml(MIN).unwrap().backends[0].server_metrics_interval().as_millis(), 1000);
        let c = pool("    discovery: {dns: vllm.llm.svc.cluster.local, port: 8000}\n").unwrap();
        assert_eq!(c.backends[0].discovery.as_ref().unwrap().refresh_secs, 10);
        for (yaml, path, words) in [
            ("    url: http://a:1\n    endpoints: [http://b:1]\n", "backends[0]", "only one of"),
            ("    endpoints: [http://a:1, http://a:1/]\n", "backends[0].endpoints[1]", "listed twice"),
            ("    endpoints: [http://a:1/v1, http://b:1]\n", "backends[0].endpoints", "same path"),
            ("    endpoints: [a:1]\n", "backends[0].endpoints[0]", "scheme"),
            ("    discovery: {dns: \"http://x\", port: 80}\n", "backends[0].discovery.dns", "not a DNS name"),
            (
                "    discovery: {dns: x, port: 80, nameserver: \"10.0.0.1\"}\n",
                "backends[0].discovery.nameserver",
                "address",
            ),
            (
                "    discovery: {dns: x, port: 80, scheme: ftp}\n",
                "backends[0].discovery.scheme",
                "http or https",
            ),
            (
                "    url: http://a:1\n    pool: {max_kv_cache: 1.5}\n",
                "backends[0].pool.max_kv_cache",
                "(0, 1]",
            ),
            (
                "    url: http://a:1\n    pool: {weights: {prefix: -1}}\n",
                "backends[0].pool.weights.prefix",
                ">= 0",
            ),
        ] {
            let e = pool(yaml).unwrap_err();
            assert!(e.0.iter().any(|e| e.path == path && e.message.contains(words)), "{yaml}: {e}");
        }
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_yaml(MIN).unwrap();
        assert_eq!(c.listen, "0.0.0.0:8080");
        assert_eq!(c.admin_listen, "127.0.0.1:9464");
        assert_eq!(c.limits.max_body_bytes, 32 * 1024 * 1024);
        assert!(c.usage.inject_stream_usage);
    }

    #[test]
    fn unknown_field_names_its_path() {
        let e =
            Config::from_yaml("backends:\n  - name: a\n    url: http://x:1\n    modle: [m]\n").unwrap_err();
        assert_eq!(e.0[0].path, "backends[0].modle");
        assert!(e.0[0].message.contains("unknown field `modle`"), "{}", e);
    }

    #[test]
    fn wrong_type_names_its_path() {
        let e = Config::from_yaml(&format!("{MIN}timeouts:\n  connect_ms: soon\n")).unwrap_err();
        assert_eq!(e.0[0].path, "timeouts.connect_ms");
    }

    #[test]
    fn semantic_errors_are_all_reported() {
        let e = Config::from_yaml(
            "listen: nowhere\nbackends:\n  - name: a\n    url: ftp://x\n  - name: a\n  \nslo:\n  ttft_ms: -1\n",
        )
        .unwrap_err();
        let paths: Vec<_> = e.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["listen", "backends[0].url", "backends[1].name", "backends[1]", "slo.ttft_ms"]
        );
        let e =
            Config::from_yaml(&format!("{MIN}limits: {{send_timeout_ms: 0, header_read_timeout_ms: 0}}\n"))
                .unwrap_err();
        let paths: Vec<_> = e.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["limits.header_read_timeout_ms", "limits.send_timeout_ms"]);
    }

    #[test]
    fn redaction() {
        let c = Config::from_yaml(
            "backends:\n  - name: a\n    url: http://user:pw@h:1\n    headers:\n      authorization: Bearer sk-123\n",
        )
        .unwrap();
        let r = serde_json::to_string(&c.redacted()).unwrap();
        assert!(!r.contains("sk-123") && !r.contains("pw@"), "{r}");
    }

    #[test]
    fn retired_keys_load_with_a_warning() {
        let base = "backends:\n  - name: a\n    url: http://127.0.0.1:8000\n";
        let old =
            Config::from_yaml(&format!("{base}server: {{direct: false}}\nupstream: {{direct: true}}\n"))
                .expect("an old config still loads");
        let w = old.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("`server.direct`") && w[1].contains("`upstream.direct`"), "{w:?}");
        assert!(Config::from_yaml(base).unwrap().warnings().is_empty());
        // Written back (/admin/config), a retired key is not shown when unset.
        let yaml = serde_yaml_ng::to_string(&Config::from_yaml(base).unwrap()).unwrap();
        assert!(!yaml.contains("direct"), "{yaml}");
        // Anything else in the retired sections is still an error.
        assert!(Config::from_yaml(&format!("{base}server: {{workers: 2}}\n")).is_err());
    }

    #[test]
    fn shipped_configs_are_valid() {
        for f in ["config/goodput.yaml", "config/demo.yaml"] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
            Config::load(&p).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }
}
