//! Phase 3, forward: the upstream call over hyper's pooled client, within the first-byte
//! timeout, and failover. A request goes to another candidate only when the failure surely
//! left none of it at the upstream (a connect error) and its body is in memory; a request that
//! may have been written is never sent twice, since the backend may be generating for it.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use std::time::{Duration, Instant};

use super::admit::ClientBody;
use super::error::{Error, Kind};
use super::meter::MeteredRequest;
use super::route::{self, Peer};
use super::{Proxy, UpstreamBody};
use crate::config::reload::{ResolvedBackend, ResolvedRoute, Snapshot};
use crate::openai::request::rewrite_model;
use crate::route::{Endpoint, SloHeaders};

/// What one request brings to the forward phase.
pub struct Outbound<'a> {
    pub parts: Parts,
    pub body: ClientBody,
    pub route: &'a ResolvedRoute,
    pub slo_headers: SloHeaders,
    /// The body's `model` field (metered paths).
    pub model: Option<&'a str>,
    pub id: u64,
    /// The prompt's JSON text (metered paths), for a pool's prefix affinity.
    pub prompt: Option<Bytes>,
}

/// Send the request to the backend and endpoint the router picks, failing over (to another
/// endpoint of the pool, or another backend) while that is safe. Every upstream failure is
/// counted (`goodput_upstream_errors_total`) and told to that endpoint's breaker; the last one
/// is returned. With the answer comes the instant `first_byte_ms` after it was sent, the
/// deadline for its first token.
pub async fn forward(
    proxy: &Proxy,
    snap: &Snapshot,
    out: Outbound<'_>,
    metered: &mut Option<MeteredRequest>,
) -> Result<(Response<Incoming>, Peer, Instant), Error> {
    let Outbound { mut parts, body, route, slo_headers, model, id, prompt } = out;
    let endpoints: usize = route.candidates.iter().map(|&i| snap.backends[i].state.endpoints().len()).sum();
    let can_failover = matches!(body, ClientBody::Whole(_)) && endpoints > 1;
    let mut body = Some(body);
    let timeouts = snap.config.timeouts;
    let mut tried = route::Tried::default();
    loop {
        let shared = &proxy.recorder.shared;
        let windows = route::Windows {
            backends: &shared.windows,
            endpoints: &shared.endpoint_windows,
            drift: &shared.drift,
        };
        let mut peer = route::upstream_peer(
            &proxy.router,
            windows,
            snap,
            route,
            slo_headers,
            id,
            &tried,
            prompt.as_deref(),
            metered.is_some(),
        )?;
        let backend = &peer.backend;
        let headers = if can_failover { parts.headers.clone() } else { std::mem::take(&mut parts.headers) };
        // A body in memory can be sent again; a streamed one only once (no failover then).
        let this_attempt = match &body {
            Some(ClientBody::Whole(bytes)) => ClientBody::Whole(bytes.clone()),
            _ => body.take().expect("a streamed body is sent once"),
        };
        let req = upstream_request(&parts, headers, this_attempt, backend, &peer.endpoint, route, model)?;
        if let Some(m) = metered.as_mut() {
            route::label(&mut m.record, backend, &peer.endpoint, route, model);
            // Time in the proxy before the upstream call; reading the body is the client's time.
            m.record.overhead = m.t0.elapsed().saturating_sub(m.client_time);
        }
        let first_byte = Duration::from_millis(timeouts.first_byte_ms);
        let first_token_by = Instant::now() + first_byte;
        let sent = tokio::time::timeout(first_byte, proxy.client.request(req)).await;
        let err = match answer(sent, &timeouts) {
            Ok(resp) => return Ok((resp, peer, first_token_by)),
            Err(e) => e,
        };
        if err.kind == Kind::BodyTooLarge {
            proxy.metrics.body_too_large.inc();
        }
        if err.kind.is_upstream() {
            peer.dispatch.report(false);
            proxy.metrics.upstream_errors.with_label_values(&[&*backend.name, err.kind.code()]).inc();
        }
        if err.may_fail_over() && can_failover {
            tried.failed(&peer);
            if tried.any_left(snap, route) {
                peer.dispatch.no_sample();
                let request_id = metered.as_ref().and_then(|m| m.record.request_id.as_deref());
                tracing::warn!(id, request_id, backend = %backend.name, endpoint = %peer.endpoint.label, kind = err.kind.code(), error = %err, "failing over");
                continue;
            }
        }
        if let Some(m) = metered.as_mut() {
            m.record.backend = backend.name.clone();
            m.record.endpoint = peer.endpoint.label.clone();
        }
        return Err(err);
    }
}

/// The upstream's answer, or why there is none.
pub(super) fn answer(
    sent: Result<Result<Response<Incoming>, hyper_util::client::legacy::Error>, tokio::time::error::Elapsed>,
    timeouts: &crate::config::Timeouts,
) -> Result<Response<Incoming>, Error> {
    match sent {
        Ok(Ok(resp)) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            // goodput strips Upgrade, so no request asked for this: relaying it would leave
            // client and upstream speaking different protocols on the connection. Dropping the
            // answer closes that upstream connection.
            Err(Error::new(Kind::UpstreamUpgrade, "upstream switched protocols without being asked")
                .sent(true))
        }
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(Error::from_client(e, timeouts.connect_ms)),
        Err(_) => Err(Error::new(
            Kind::UpstreamFirstByteTimeout,
            format!("upstream sent no response headers within {} ms", timeouts.first_byte_ms),
        )
        .sent(true)),
    }
}

/// The request as it goes to `backend`: its URI built from the backend's parts and the
/// client's path, the endpoint's `Host`, the backend's configured headers (which may replace
/// it), and the body (with the backend's model name on a route that rewrites it).
pub(super) fn upstream_request(
    parts: &Parts,
    mut headers: HeaderMap,
    body: ClientBody,
    backend: &ResolvedBackend,
    endpoint: &Endpoint,
    route: &ResolvedRoute,
    model: Option<&str>,
) -> Result<Request<UpstreamBody>, Error> {
    let target =
        parts.uri.path_and_query().cloned().unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let uri = backend.uri(endpoint, &target).map_err(|e| Error::new(Kind::BadTarget, e))?;
    if let Some(host) = &endpoint.host {
        headers.insert(header::HOST, host.clone());
    }
    for (k, v) in &backend.headers {
        headers.insert(k.clone(), v.clone());
    }
    let body = match body {
        ClientBody::Whole(mut bytes) => {
            // One public model name over backends that serve different models.
            if route.rewrite_model
                && let (Some(m), Some(served)) = (model, &backend.served_model)
                && !backend.serves(m)
                && let Some(b) = rewrite_model(&bytes, served)
            {
                bytes = Bytes::from(b);
                headers.insert(header::CONTENT_LENGTH, bytes.len().into());
            }
            Either::Left(Full::new(bytes))
        }
        ClientBody::Streaming(s) => Either::Right(s),
    };
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    *req.version_mut() = http::Version::HTTP_11;
    Ok(req)
}
