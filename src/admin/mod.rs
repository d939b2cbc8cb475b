//! The admin listener (loopback by default): /metrics, /healthz, /readyz, /admin/config,
//! /admin/backends (windowed statistics) and /admin/records (recent requests, numbers only).

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

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

pub async fn handle(proxy: &Proxy, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", proxy.metrics.encode())
        }
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if proxy.is_ready() {
                respond(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "waiting for the upstream to answer\n")
            }
        }
        "/admin/config" => json(&proxy.config.load().config.redacted()),
        "/admin/backends" => {
            let snap = proxy.config.load();
            let windows = proxy.recorder.shared.windows.load();
            let list: Vec<serde_json::Value> = snap
                .backends
                .iter()
                .map(|b| {
                    serde_json::json!({
                        "name": &*b.name,
                        "url": crate::config::redact_userinfo(&format!("{}{}", b.origin, b.base_path)),
                        "simulated": b.sim.is_some(),
                        "tokenizer": b.tokenizer.is_some(),
                        "window": windows.get(&*b.name),
                    })
                })
                .collect();
            json(&serde_json::json!({ "backends": list }))
        }
        "/admin/records" => {
            let limit = query_param(req.uri().query(), "limit").and_then(|v| v.parse().ok()).unwrap_or(100);
            json(&proxy.recorder.shared.recent(limit))
        }
        "/" => respond(
            StatusCode::OK,
            "text/plain",
            "goodput admin: /metrics /healthz /readyz /admin/config /admin/backends /admin/records?limit=N\n",
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(handle(&proxy, req).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
