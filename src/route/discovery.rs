//! Pools found in DNS: a backend with `discovery` has as endpoints every address its name
//! resolves to (a Kubernetes headless Service answers with one A record per ready pod),
//! resolved again every `refresh_secs` by the watcher task. hickory's resolver asks the
//! system's name servers (`/etc/resolv.conf`, search domains included) or the one configured.
//!
//! A lookup that fails keeps the endpoints of the last answer: a DNS outage is not a reason to
//! stop serving, and a replica that really went away fails to connect and its breaker opens.

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::router::BackendState;
use crate::config::Discovery;
use crate::config::reload::ResolvedBackend;
use crate::meter::metrics::Metrics;

const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a backend's discovery stands.
#[derive(Default)]
pub struct Status {
    inner: Mutex<Inner>,
    busy: AtomicBool,
}

#[derive(Default)]
struct Inner {
    /// The settings the resolver was built for (a reload may change them).
    spec: Option<Discovery>,
    resolver: Option<TokioResolver>,
    next: Option<Instant>,
    last: Option<Report>,
}

/// The last lookup, for `/admin/backends`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub unix_ms: u64,
    pub addresses: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Status {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn last(&self) -> Option<Report> {
        self.inner().last.clone()
    }
}

fn resolver(d: &Discovery) -> Result<TokioResolver, String> {
    let mut builder = match &d.nameserver {
        Some(ns) => {
            let addr: SocketAddr = ns.parse().map_err(|e| format!("nameserver `{ns}`: {e}"))?;
            let mut server = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut server.connections {
                c.port = addr.port();
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![server]),
                TokioRuntimeProvider::default(),
            )
        }
        None => {
            TokioResolver::builder_tokio().map_err(|e| format!("reading the system's DNS settings: {e}"))?
        }
    };
    // Answers are wanted fresh at each refresh, not from a cache that outlives it.
    let refresh = Duration::from_secs(d.refresh_secs);
    let opts = builder.options_mut();
    opts.positive_max_ttl = Some(refresh);
    opts.negative_max_ttl = Some(refresh);
    opts.timeout = Duration::from_secs(2);
    builder.build().map_err(|e| e.to_string())
}

/// Resolve the pool's name now and make its answer the backend's endpoints. Returns how many
/// addresses it had, or why the lookup failed (the endpoints then stay as they were).
pub async fn refresh(name: &str, state: &BackendState, d: &Discovery) -> Result<usize, String> {
    let resolver = {
        let mut inner = state.discovery.inner();
        if inner.spec.as_ref() != Some(d) || inner.resolver.is_none() {
            inner.resolver = Some(resolver(d)?);
            inner.spec = Some(d.clone());
        }
        inner.resolver.clone().expect("just set")
    };
    let looked = tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup_ip(d.dns.as_str())).await;
    let result = match looked {
        Err(_) => Err(format!("no answer for {} within {LOOKUP_TIMEOUT:?}", d.dns)),
        Ok(Err(e)) => Err(format!("{}: {e}", d.dns)),
        Ok(Ok(ips)) => {
            let mut ips: Vec<IpAddr> = ips.iter().collect();
            ips.sort();
            ips.dedup();
            let scheme = if d.scheme == "https" { http::uri::Scheme::HTTPS } else { http::uri::Scheme::HTTP };
            let addrs: Vec<_> = ips
                .iter()
                .filter_map(|ip| {
                    let a = SocketAddr::new(*ip, d.port).to_string();
                    Some((scheme.clone(), a.parse::<http::uri::Authority>().ok()?))
                })
                .collect();
            let n = addrs.len();
            let before: Vec<Arc<str>> = state.endpoints().iter().map(|e| e.label.clone()).collect();
            let gone = state.set_endpoints(addrs);
            for e in &gone {
                tracing::info!(backend = name, endpoint = %e.label, "endpoint left the pool (DNS)");
            }
            for e in state.endpoints().iter().filter(|e| !before.contains(&e.label)) {
                tracing::info!(backend = name, endpoint = %e.label, "endpoint joined the pool (DNS)");
            }
            Ok(n)
        }
    };
    let mut inner = state.discovery.inner();
    inner.next = Some(Instant::now() + Duration::from_secs(d.refresh_secs));
    inner.last = Some(Report {
        unix_ms: crate::meter::record::unix_ms(),
        addresses: *result.as_ref().unwrap_or(&0),
        error: result.as_ref().err().cloned(),
    });
    result
}

/// Called by the watcher on each tick: a refresh when one is due and none is running.
pub fn poll(b: &Arc<ResolvedBackend>, d: &Discovery, metrics: &Metrics, now: Instant) {
    let status = &b.state.discovery;
    let due = status.inner().next.is_none_or(|t| now >= t);
    if !due || status.busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let (b, d, metrics) = (b.clone(), d.clone(), metrics.clone());
    tokio::spawn(async move {
        let result = refresh(&b.name, &b.state, &d).await;
        let label = if result.is_ok() { "success" } else { "error" };
        metrics.discovery_refreshes.with_label_values(&[&*b.name, label]).inc();
        if let Err(why) = result {
            tracing::warn!(backend = %b.name, "DNS discovery failed; keeping the last endpoints: {why}");
        }
        b.state.discovery.busy.store(false, Ordering::Release);
    });
}
