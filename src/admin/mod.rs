//! The admin listener (loopback by default): /metrics, /healthz, /readyz, /admin/config,
//! /admin/backends (windowed statistics, goodput, circuit), /admin/routes (classes,
//! compliance, decisions), /admin/records (recent requests, numbers only), the /status page,
//! and POST /admin/sim/NAME to change an in-process simulated backend.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;

use crate::proxy::Proxy;

fn respond(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(body.into()))
        .expect("valid response")
}

fn json(v: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(v) {
        Ok(b) => respond(StatusCode::OK, "application/json", b),
        Err(e) => respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
    }
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes()).find_map(|(k, v)| (k == key).then(|| v.into_owned()))
}

/// /admin/* needs the bearer token when one is set; /metrics and the probes do not
/// (Prometheus and the kubelet scrape them), nor the /status page, which holds no data and
/// sends the token from its URL fragment. The comparison takes the same time wherever the
/// first difference is.
fn authorized(token: Option<&str>, req: &Request<Incoming>) -> bool {
    let Some(token) = token else { return true };
    let path = req.uri().path();
    if !path.starts_with("/admin/") {
        return true;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

pub async fn handle(proxy: &Proxy, token: Option<&str>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if !authorized(token, &req) {
        let mut r = respond(StatusCode::UNAUTHORIZED, "text/plain", "a bearer token is required\n");
        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return r;
    }
    if req.method() == Method::POST
        && let Some(name) = req.uri().path().strip_prefix("/admin/sim/")
    {
        let name = name.to_string();
        return sim_patch(proxy, &name, req).await;
    }
    if req.method() == Method::POST && req.uri().path() == "/admin/calibrate" {
        return calibrate(proxy);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only (and POST /admin/sim/NAME, POST /admin/calibrate)\n",
        );
    }
    match req.uri().path() {
        "/metrics" => {
            proxy.metrics.refresh_runtime();
            respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", proxy.metrics.encode())
        }
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if proxy.draining.load(std::sync::atomic::Ordering::Relaxed) {
                respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining: shutting down\n")
            } else if proxy.is_ready() {
                respond(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "waiting for the upstream to answer\n")
            }
        }
        "/admin/config" => json(&proxy.config.load().config.redacted()),
        "/admin/backends" => json(&backends(proxy)),
        "/admin/routes" => {
            let limit =
                query_param(req.uri().query(), "decisions").and_then(|v| v.parse().ok()).unwrap_or(50);
            json(&routes(proxy, limit))
        }
        "/status" => respond(StatusCode::OK, "text/html; charset=utf-8", STATUS_PAGE),
        "/admin/records" => {
            let query = req.uri().query();
            let limit = query_param(query, "limit").and_then(|v| v.parse().ok()).unwrap_or(100);
            let (id, outcome) = (query_param(query, "request_id"), query_param(query, "outcome"));
            json(&proxy.recorder.shared.recent(limit, id.as_deref(), outcome.as_deref()))
        }
        "/" => respond(
            StatusCode::OK,
            "text/plain",
            "goodput admin: /status (page) /metrics /healthz /readyz /admin/config /admin/backends \
             /admin/routes?decisions=N /admin/records?limit=N&request_id=ID&outcome=O; POST /admin/sim/NAME (simulated backends)\n",
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// The status page: one file, no build step, no CDN; it polls the JSON endpoints.
const STATUS_PAGE: &str = include_str!("status.html");

fn server_json(v: &crate::route::server::ServerView) -> serde_json::Value {
    serde_json::json!({
        "waiting": v.reading.waiting,
        "running": v.reading.running,
        "kv_cache_usage": v.reading.kv_cache_usage,
        "prefix_cache_hit_ratio": v.prefix_cache_hit_ratio,
        "preemptions": v.reading.preemptions,
        "kv_cache_tokens": v.reading.kv_cache_tokens,
        "age_ms": v.at.elapsed().as_millis() as u64,
    })
}

/// The pool's servers as one: queues and batches summed, the fullest KV cache, the mean hit
/// ratio of those that report one.
fn server_rollup(eps: &[std::sync::Arc<crate::route::Endpoint>]) -> Option<serde_json::Value> {
    let views: Vec<_> = eps.iter().filter_map(|e| e.server.view()).collect();
    if views.is_empty() {
        return None;
    }
    if views.len() == 1 {
        return Some(server_json(&views[0]));
    }
    let sum = |f: &dyn Fn(&crate::route::server::Reading) -> Option<f64>| {
        views.iter().filter_map(|v| f(&v.reading)).reduce(|a, b| a + b)
    };
    let ratios: Vec<f64> = views.iter().filter_map(|v| v.prefix_cache_hit_ratio).collect();
    Some(serde_json::json!({
        "waiting": sum(&|r| r.waiting),
        "running": sum(&|r| r.running),
        "kv_cache_usage": views.iter().filter_map(|v| v.reading.kv_cache_usage).reduce(f64::max),
        "prefix_cache_hit_ratio": (!ratios.is_empty()).then(|| ratios.iter().sum::<f64>() / ratios.len() as f64),
        "preemptions": sum(&|r| r.preemptions),
        "age_ms": views.iter().map(|v| v.at.elapsed().as_millis() as u64).max(),
    }))
}

/// Forget the calibrated consistency thresholds: the references are checked again, and rates
/// that need a threshold are null until then.
fn calibrate(proxy: &Proxy) -> Response<Full<Bytes>> {
    let snap = proxy.config.load();
    match snap.config.quality.consistency.as_ref().map(|c| c.calibration.is_some()) {
        Some(true) => {
            proxy.recorder.shared.recalibrate.store(true, std::sync::atomic::Ordering::Release);
            json(&serde_json::json!({"calibrating": true}))
        }
        _ => respond(
            StatusCode::CONFLICT,
            "text/plain",
            "no quality.consistency.calibration in the config: nothing to calibrate\n",
        ),
    }
}

fn backends(proxy: &Proxy) -> serde_json::Value {
    let snap = proxy.config.load();
    let windows = proxy.recorder.shared.windows.load();
    let endpoint_windows = proxy.recorder.shared.endpoint_windows.load();
    let remote = proxy.router.remote_stats();
    let calibration = proxy.recorder.shared.calibration.load();
    let drift = proxy.recorder.shared.drift.load();
    let list: Vec<serde_json::Value> = snap
        .backends
        .iter()
        .map(|b| {
            serde_json::json!({
                "name": &*b.name,
                "url": b.describe(),
                "simulated": b.sim.is_some(),
                "served_model": b.served_model.as_deref(),
                "tokenizer": b.tokenizer.is_some(),
                "price": b.price,
                "max_concurrency": b.max_concurrency,
                "outstanding": b.state.outstanding(),
                "circuit": b.state.breaker_state(),
                // The servers' own view (vLLM's /metrics), summed over the pool (the KV cache:
                // the fullest); null when no endpoint's is known.
                "server": server_rollup(&b.state.endpoints()),
                "pool": b.is_pool.then(|| &b.pool),
                "discovery": b.state.discovery.last(),
                "endpoints": b.state.endpoints().iter().map(|e| serde_json::json!({
                    "endpoint": &*e.label,
                    "outstanding": e.outstanding(),
                    "circuit": e.breaker_state(),
                    "server": e.server.view().map(|v| server_json(&v)),
                    // Block hashes remembered for prefix affinity, and how many at most (set,
                    // or sized from the server's KV cache).
                    "prefix_index": b.is_pool.then(|| serde_json::json!({
                        "blocks": b.state.prefix_blocks(&e.label),
                        "capacity": b.pool.prefix.index_capacity(e.server.view().and_then(|v| v.reading.kv_cache_tokens)),
                    })),
                    "window": endpoint_windows.get(&*b.name).and_then(|w| w.get(&*e.label)).map(|w| serde_json::json!({
                        "requests": w.counts.requests,
                        "ttft_p95_s": w.ttft.p95,
                        "e2e_p50_s": w.e2e.p50,
                        "slo_attainment": w.slo_attainment,
                        // Scores of the responses this endpoint served (its check's re-samples
                        // come from it too).
                        "quality": &w.quality,
                    })),
                    // Against the pool's other endpoints (quality::drift); absent: too few scores.
                    "drift": drift.endpoints.get(&*b.name).and_then(|d| d.get(&*e.label)),
                })).collect::<Vec<_>>(),
                "discovered_models": &**b.state.models.all(),
                // What its hallucination rate comes from (null: no consistency checks).
                "consistency_rate": calibration.get(&*b.name),
                // Against the backends that serve one of its models, else its own baseline
                // (quality::drift); absent: too few scores.
                "drift": drift.backends.get(&*b.name),
                "window": windows.get(&*b.name),
                "router_stats": remote.as_ref().and_then(|r| r.get(&*b.name)).cloned()
                    .or_else(|| windows.get(&*b.name).map(crate::route::router::stats_of)),
            })
        })
        .collect();
    serde_json::json!({
        "stats_source": if remote.is_some() { "prometheus" } else { "local" },
        "backends": list,
    })
}

fn routes(proxy: &Proxy, limit: usize) -> serde_json::Value {
    use crate::route::decide::{provisional_misses, violations};
    let snap = proxy.config.load_full();
    let windows = proxy.recorder.shared.windows.load();
    let classes = proxy.recorder.shared.classes.load();
    let drift = proxy.recorder.shared.drift.load();
    let decisions = proxy.router.recent(snap.config.routing.recent_decisions);
    let all = snap.routes.iter().chain(std::iter::once(&snap.default_route));
    let list: Vec<serde_json::Value> = all
        .map(|r| {
            let cands = proxy.router.candidates(&snap, r, &windows, &drift);
            let compliance: Vec<serde_json::Value> = cands
                .iter()
                .map(|c| {
                    let v = violations(&r.class, c, &snap.policy);
                    let counts = by_reason(&proxy.metrics.route_decisions, [&*r.name, &*c.name], REASONS);
                    // Choices within the backend's pool, per endpoint and reason.
                    let eps: serde_json::Map<String, serde_json::Value> = snap
                        .backend(&c.name)
                        .map(|b| b.state.endpoints())
                        .unwrap_or_default()
                        .iter()
                        .map(|e| {
                            let by = by_reason(
                                &proxy.metrics.endpoint_decisions,
                                [&*c.name, &*e.label],
                                POOL_REASONS,
                            );
                            (e.label.to_string(), by.into())
                        })
                        .collect();
                    serde_json::json!({
                        "backend": &*c.name,
                        "healthy": c.healthy,
                        "saturated": c.saturated,
                        "endpoint_decisions": eps,
                        "outstanding": c.outstanding,
                        "compliant": v.is_empty(),
                        "violations": v,
                        "provisional_misses": provisional_misses(&r.class, c, &snap.policy),
                        "awaiting_sample": c.awaiting_sample,
                        "stats": c.stats,
                        "decisions": counts,
                    })
                })
                .collect();
            let recent: Vec<_> = decisions.iter().filter(|d| d.route == r.name).take(limit).collect();
            serde_json::json!({
                "name": &*r.name,
                "class": &*r.class_name,
                "bounds": {
                    "ttft_p95_ms": r.class.ttft_p95_ms,
                    "tpot_p95_ms": r.class.tpot_p95_ms,
                    "e2e_p95_ms": r.class.e2e_p95_ms,
                    "max_perplexity": r.class.max_perplexity,
                    "max_hallucination_rate": r.class.max_hallucination_rate,
                },
                "objective": r.class.objective,
                "rewrite_model": r.rewrite_model,
                "shed": r.shed,
                "backends": compliance,
                "recent_decisions": recent,
            })
        })
        .collect();
    let class_windows: serde_json::Map<String, serde_json::Value> =
        classes.iter().map(|(k, w)| (k.clone(), serde_json::to_value(w).unwrap_or_default())).collect();
    serde_json::json!({
        "policy": {
            "exploration": snap.policy.exploration,
            "min_samples": snap.policy.min_samples,
            "min_quality_samples": snap.policy.min_quality_samples,
        },
        "routes": list,
        "classes": class_windows,
        "recent_decisions": decisions.iter().take(limit).collect::<Vec<_>>(),
    })
}

/// A decision counter's non-zero counts by reason, for the two labels before it.
fn by_reason(
    m: &prometheus::IntCounterVec,
    labels: [&str; 2],
    reasons: &[&str],
) -> serde_json::Map<String, serde_json::Value> {
    reasons
        .iter()
        .filter_map(|reason| {
            let n =
                m.get_metric_with_label_values(&[labels[0], labels[1], reason]).map(|m| m.get()).unwrap_or(0);
            (n > 0).then(|| (reason.to_string(), n.into()))
        })
        .collect()
}

const POOL_REASONS: &[&str] = &crate::route::PickReason::NAMES;

const REASONS: &[&str] = &[
    "cheapest",
    "fastest",
    "best_quality",
    "best_value",
    "explore",
    "sla_unmet",
    "failover",
    "no_healthy_backend",
];

/// `POST /admin/sim/NAME` with a JSON object: change an in-process simulated backend at run
/// time (degrade it, recover it). The admin listener is loopback-only by default.
async fn sim_patch(proxy: &Proxy, name: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt;
    let Some(sim) = proxy.config.sim(name) else {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no simulated backend named `{name}`\n"),
        );
    };
    let body = match http_body_util::Limited::new(req.into_body(), 64 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return respond(StatusCode::BAD_REQUEST, "text/plain", format!("cannot read the body: {e}\n"));
        }
    };
    let patch: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return respond(StatusCode::BAD_REQUEST, "text/plain", format!("invalid JSON: {e}\n")),
    };
    match sim.patch(&patch) {
        Ok(cfg) => {
            tracing::info!(backend = name, "simulated backend changed through the admin API");
            json(&cfg)
        }
        Err(e) => respond(StatusCode::BAD_REQUEST, "text/plain", format!("{e}\n")),
    }
}

pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, token: Option<Arc<str>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        let proxy = proxy.clone();
        let token = token.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                let token = token.clone();
                async move { Ok::<_, Infallible>(handle(&proxy, token.as_deref(), req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
