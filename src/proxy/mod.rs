//! The proxy: listener, per-request handling, upstream forwarding.
//!
//! Path of a request: `serve` accepts a connection → goodput's own HTTP/1.1 loop (`front`)
//! reads chat and completions requests, and hands anything else (h2c included) to hyper's
//! server → `Proxy::handle`:
//! admission (body limit; metered paths read the JSON body and may add include_usage) →
//! route → send upstream: metered requests to http:// backends over goodput's own HTTP/1.1
//! client (`direct`), everything else over hyper's pooled client → the response goes back
//! with its body wrapped in `MeteredBody`, which meters it on the fly and emits one
//! `RequestRecord`.

pub mod body;
pub mod direct;
pub mod front;
pub mod headers;
pub mod tls;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

use crate::config::ConfigHandle;
use crate::meter::metrics::Metrics;
use crate::meter::observe::ResponseMeter;
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::recorder::Recorder;
use crate::openai::request::rewrite_model;
use crate::openai::{Operation, RequestInfo, inject_include_usage};
use crate::route::{Dispatch, Router, SloHeaders};
use body::{FromUpstream, MeteredBody, Metering};

pub type UpstreamBody = Either<Full<Bytes>, Limited<Incoming>>;

/// How one attempt goes upstream: goodput's own HTTP/1.1 client (to this authority, with the
/// body in memory) or hyper's pooled client.
enum Outgoing<'a> {
    Direct(&'a Arc<str>, Bytes),
    Pooled(UpstreamBody),
}
pub type ProxyBody = Either<MeteredBody, Full<Bytes>>;

/// A client's request body: still to be read from hyper, or read whole already by goodput's
/// own HTTP/1.1 server loop (`front`), which takes only bodies within the limit.
pub enum ClientBody {
    Hyper(Incoming),
    Read(Bytes),
}

pub struct Proxy {
    pub config: Arc<ConfigHandle>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub router: Router,
    client: Client<tls::Connector, UpstreamBody>,
    /// Metered requests to http:// backends (see direct.rs).
    direct: Arc<direct::DirectClient>,
    ready: AtomicBool,
    /// Set on SIGTERM: /readyz answers 503 so that load balancers stop sending.
    pub draining: AtomicBool,
    next_id: AtomicU64,
    /// Which scorers run: sampled requests keep their body and text for them.
    sampling: Sampling,
}

/// The scorers that are running (read at start-up).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampling {
    pub perplexity: bool,
    pub consistency: bool,
}

/// An OpenAI-style error body: `{"error": {"message", "type", "code"}}`.
pub fn error_response(status: StatusCode, kind: &str, code: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "code": code}});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Either::Right(Full::new(Bytes::from(body.to_string()))))
        .expect("valid response")
}

impl Proxy {
    pub fn new(
        config: Arc<ConfigHandle>,
        recorder: Recorder,
        metrics: Metrics,
        sampling: Sampling,
        connector: tls::Connector,
    ) -> Arc<Proxy> {
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        Arc::new(Proxy {
            config,
            recorder,
            router: Router::new(metrics.route_decisions.clone()),
            metrics,
            client,
            direct: direct::DirectClient::new(1024, Duration::from_secs(90)),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            sampling,
        })
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }

    /// Probe the upstream until it answers anything at all; /readyz turns ready then.
    pub fn spawn_readiness_probe(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            while !this.is_ready() {
                let origin = this.config.load().default_backend().origin.clone();
                let base = this.config.load().default_backend().base_path.clone();
                if let Ok(req) = Request::get(format!("{origin}{base}/v1/models"))
                    .header(header::USER_AGENT, "goodput-readiness")
                    .body(Either::Left(Full::new(Bytes::new())))
                    && let Ok(Ok(_)) =
                        tokio::time::timeout(Duration::from_secs(5), this.client.request(req)).await
                {
                    this.ready.store(true, Ordering::Relaxed);
                    tracing::info!(upstream = %origin, "upstream answered; ready");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// Whether this request is scored for perplexity, and checked for consistency: by the
    /// forcing header, else deterministically by request id (independent draws for the two).
    fn sample(
        &self,
        cfg: &crate::config::Config,
        headers: &http::HeaderMap,
        id: u64,
        rate: f64,
    ) -> (bool, bool) {
        use crate::quality::sampler::{forced, key, sampled};
        let s = self.sampling;
        if !(s.perplexity || s.consistency) {
            return (false, false);
        }
        let q = &cfg.quality;
        let force = forced(headers.get(q.force_header.as_str()));
        let k = key(headers.get("x-request-id").map(|v| v.as_bytes()), id);
        let cons_rate = q.consistency.as_ref().map_or(0.0, |c| c.sample_rate);
        (
            s.perplexity && (force || sampled(k, rate)),
            // A different salt: the two samples are drawn independently.
            s.consistency && (force || sampled(k ^ 0x5eed_c0de_5eed_c0de, cons_rate)),
        )
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<ClientBody>,
        client: Option<SocketAddr>,
    ) -> Response<ProxyBody> {
        let t0 = Instant::now();
        let snap = self.config.load_full();
        let cfg = &snap.config;
        let op =
            (req.method() == http::Method::POST).then(|| Operation::from_path(req.uri().path())).flatten();
        let (mut parts, body) = req.into_parts();
        let limit = cfg.limits.max_body_bytes;

        let declared_len = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared_len.is_some_and(|l| l > limit) {
            self.metrics.body_too_large.inc();
            if let ClientBody::Hyper(mut body) = body {
                linger(&mut body).await;
            }
            return too_large(limit);
        }
        headers::strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        headers::add_forwarded(&mut parts.headers, client.map(|c| c.ip()));
        let slo_headers = SloHeaders::from(&parts.headers);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);

        // The body: metered paths read it whole (it must be parsed) within the limit, and so
        // can send it again on failover; other paths stream it unless it is empty.
        let mut metering = None;
        let mut client_time = Duration::ZERO;
        let mut model_field: Option<String> = None;
        let mut streamed = None;
        let replay: Option<Bytes> = match (op, body) {
            (None, ClientBody::Read(bytes)) => Some(bytes),
            (None, ClientBody::Hyper(body)) if body.is_end_stream() => Some(Bytes::new()),
            (None, ClientBody::Hyper(body)) => {
                streamed = Some(Limited::new(body, limit as usize));
                None
            }
            (Some(op), body) => {
                let t_read = Instant::now();
                let read = match body {
                    ClientBody::Hyper(body) => read_body(body, limit as usize).await,
                    ClientBody::Read(bytes) if bytes.len() as u64 > limit => Err(BodyRead::TooLarge),
                    ClientBody::Read(bytes) => Ok(bytes),
                };
                client_time = t_read.elapsed();
                let bytes = match read {
                    Ok(b) => b,
                    Err(BodyRead::TooLarge) => {
                        self.metrics.body_too_large.inc();
                        return too_large(limit);
                    }
                    Err(BodyRead::Failed) => {
                        return error_response(
                            StatusCode::BAD_REQUEST,
                            "invalid_request_error",
                            "body_read_failed",
                            "could not read the request body",
                        );
                    }
                };
                let info = RequestInfo::parse(&bytes);
                if info.valid_json {
                    model_field = info.model.clone();
                }
                let inject = cfg.usage.inject_stream_usage && info.wants_injected_usage();
                let rewritten = if inject { inject_include_usage(&bytes, &info) } else { None };
                let injected = rewritten.is_some();
                if injected {
                    self.metrics.usage_injected.inc();
                }
                metering = Some((op, info, injected, bytes.clone()));
                Some(match rewritten {
                    Some(b) => Bytes::from(b),
                    None => bytes,
                })
            }
        };
        let route = snap.route(parts.uri.path(), model_field.as_deref(), &parts.headers);

        // Quality sampling: a hash and a refcount; the scoring happens elsewhere.
        let mut metering = metering.map(|(op, info, injected, original)| {
            let (sample_ppl, sample_cons) = self.sample(cfg, &parts.headers, id, route.sample_rate);
            let sample_ppl = sample_ppl && info.valid_json;
            let sample_cons = sample_cons && info.valid_json;
            let backend0 = &snap.backends[route.candidates.first().copied().unwrap_or(0)];
            let mut record = RequestRecord::start(
                id,
                backend0.name.clone(),
                route.name.clone(),
                route.class_name.clone(),
                backend0.model_label(model_field.as_deref()),
                op,
            );
            record.stream = info.stream;
            record.n = info.n;
            record.score_request = (sample_ppl || sample_cons).then_some(original);
            record.sample_perplexity = sample_ppl;
            record.sample_consistency = sample_cons;
            let mut slo = route.slo;
            slo.ttft_ms = slo_headers.ttft_ms.or(slo.ttft_ms);
            slo.tpot_ms = slo_headers.tpot_ms.or(slo.tpot_ms);
            record.slo = Some(slo);
            (record, info, injected)
        });

        // Route, send, and on a connect failure (no byte of the request left) fail over to
        // the next candidate while the body can be sent again.
        let can_failover = replay.is_some() && route.candidates.len() > 1;
        // Borrowed from the client URI for every attempt (no copy per request).
        let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let timeouts = cfg.timeouts;
        let errors = self.metrics.upstream_errors.clone();
        let mut tried: Vec<usize> = Vec::new();
        let mut full_retries = 0u32;
        let (resp, backend, dispatch, reason) = loop {
            // The statistics snapshot is read per attempt and not held across the await.
            let choice = {
                let windows = self.recorder.shared.windows.load();
                self.router.choose(&snap, route, slo_headers, &windows, id, &tried)
            };
            // A backend that filled up between the choice and here is chosen again (rare).
            let dispatch = if choice.at_capacity {
                None
            } else {
                let b = &snap.backends[choice.backend];
                Dispatch::try_start(&b.state, b.max_concurrency)
            };
            let Some(dispatch) = dispatch else {
                full_retries += 1;
                if choice.at_capacity || full_retries > 8 {
                    self.metrics.rejected.with_label_values(&["backend_at_capacity"]).inc();
                    if let Some((mut record, _, _)) = metering.take() {
                        record.status = 503;
                        record.outcome = Outcome::Rejected;
                        record.e2e = t0.elapsed();
                        self.recorder.submit(record);
                    }
                    let mut r = error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "overloaded_error",
                        "backend_at_capacity",
                        "every backend of this route is at its max_concurrency; retry later",
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(cfg.limits.retry_after_secs));
                    return r;
                }
                continue;
            };
            let backend = snap.backends[choice.backend].clone();
            let mut headers =
                if can_failover { parts.headers.clone() } else { std::mem::take(&mut parts.headers) };
            for (k, v) in &backend.headers {
                headers.insert(k.clone(), v.clone());
            }
            // The direct path: a metered request (body in memory) to an http:// backend.
            let direct_to = backend.authority.as_ref().filter(|_| cfg.upstream.direct && op.is_some());
            let outgoing = match (&replay, streamed.take()) {
                (Some(bytes), _) => {
                    let mut bytes = bytes.clone();
                    // One public model name over backends that serve different models.
                    if route.rewrite_model
                        && let (Some(m), Some(served)) = (model_field.as_deref(), &backend.served_model)
                        && !backend.serves(m)
                        && let Some(b) = rewrite_model(&bytes, served)
                    {
                        bytes = Bytes::from(b);
                    }
                    match direct_to {
                        // The direct path writes its own framing (Content-Length from the body).
                        Some(authority) => Outgoing::Direct(authority, bytes),
                        None => {
                            if op.is_some() {
                                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                            }
                            Outgoing::Pooled(Either::Left(Full::new(bytes)))
                        }
                    }
                }
                (None, Some(s)) => Outgoing::Pooled(Either::Right(s)),
                (None, None) => Outgoing::Pooled(Either::Left(Full::new(Bytes::new()))),
            };
            if let Some((record, _, _)) = &mut metering {
                record.backend = backend.name.clone();
                let effective = match (route.rewrite_model, model_field.as_deref(), &backend.served_model) {
                    (true, Some(m), Some(served)) if !backend.serves(m) => Some(&**served),
                    _ => model_field.as_deref(),
                };
                record.model = backend.model_label(effective);
            }
            let t_send = Instant::now();
            // Time in the proxy before the upstream call; reading the body is the client's time.
            if let Some((record, _, _)) = &mut metering {
                record.overhead = t_send.duration_since(t0).saturating_sub(client_time);
            }
            let first_byte = Duration::from_millis(timeouts.first_byte_ms);
            let result = match outgoing {
                Outgoing::Direct(authority, bytes) => {
                    let mut target = String::with_capacity(backend.base_path.len() + pq.len());
                    target.push_str(&backend.base_path);
                    target.push_str(pq);
                    let req = direct::Request {
                        authority,
                        method: &parts.method,
                        target: &target,
                        headers: &headers,
                        body: &bytes,
                        connect_timeout: Duration::from_millis(timeouts.connect_ms),
                    };
                    tokio::time::timeout(first_byte, self.direct.send(req)).await.map(|r| {
                        r.map(|r| r.map(FromUpstream::Direct))
                            .map_err(|e| classify_direct(&e, timeouts.connect_ms))
                    })
                }
                Outgoing::Pooled(body) => {
                    // Only hyper's client wants a parsed URI; the direct path writes `target`.
                    let mut uri =
                        String::with_capacity(backend.origin.len() + backend.base_path.len() + pq.len());
                    uri.push_str(&backend.origin);
                    uri.push_str(&backend.base_path);
                    uri.push_str(pq);
                    let Ok(uri) = uri.parse::<http::Uri>() else {
                        return error_response(
                            StatusCode::BAD_REQUEST,
                            "invalid_request_error",
                            "bad_uri",
                            "invalid request URI",
                        );
                    };
                    let mut upstream_req = Request::new(body);
                    *upstream_req.method_mut() = parts.method.clone();
                    *upstream_req.uri_mut() = uri;
                    *upstream_req.headers_mut() = headers;
                    *upstream_req.version_mut() = http::Version::HTTP_11;
                    tokio::time::timeout(first_byte, self.client.request(upstream_req)).await.map(|r| {
                        r.map(|r| r.map(FromUpstream::Hyper)).map_err(|e| classify(&e, timeouts.connect_ms))
                    })
                }
            };
            let (status, kind, outcome, msg) = match result {
                Ok(Ok(r)) => break (r, backend, dispatch, choice.reason),
                Err(_) => (
                    StatusCode::GATEWAY_TIMEOUT,
                    "timeout_first_byte",
                    Outcome::Timeout,
                    format!("upstream sent no response headers within {} ms", timeouts.first_byte_ms),
                ),
                Ok(Err(e)) => e,
            };
            backend.state.report(false);
            let before_any_byte = matches!(kind, "connect" | "timeout_connect");
            if before_any_byte && can_failover && tried.len() + 1 < route.candidates.len() {
                errors.with_label_values(&[&backend.name, kind]).inc();
                tracing::warn!(backend = %backend.name, kind, "upstream failure, failing over: {msg}");
                tried.push(choice.backend);
                continue;
            }
            return fail_with(
                &mut metering,
                &self.recorder,
                &errors,
                &backend.name,
                t0,
                status,
                kind,
                outcome,
                msg,
            );
        };
        let t_headers = Instant::now();
        self.ready.store(true, Ordering::Relaxed);

        let (mut rparts, rbody) = resp.into_parts();
        headers::strip_hop_by_hop(&mut rparts.headers);
        if cfg.routing.response_headers {
            if let Ok(v) = HeaderValue::from_str(&backend.name) {
                rparts.headers.insert("x-goodput-backend", v);
            }
            rparts.headers.insert("x-goodput-reason", HeaderValue::from_static(reason.as_str()));
        }
        if metering.is_none() {
            // Unmetered paths: the answer's status is what the breaker learns.
            backend.state.report(rparts.status.as_u16() < 500);
        }
        let idle = Duration::from_millis(timeouts.idle_ms);
        let metering = metering.map(|(mut record, info, injected)| {
            let status = rparts.status.as_u16();
            record.status = status;
            record.outcome = if status >= 500 {
                Outcome::UpstreamError
            } else if status >= 400 {
                Outcome::ClientError
            } else {
                Outcome::Ok
            };
            let sse = rparts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if injected && sse {
                // Bytes may be taken out: the length is no longer the upstream's.
                rparts.headers.remove(header::CONTENT_LENGTH);
            }
            let itl = (sse && info.n <= 1).then(|| {
                self.metrics.itl.with_label_values(&[&*record.model, &*record.backend, &*record.route])
            });
            let collect_text = backend.tokenizer.is_some() || record.score_request.is_some();
            let in_flight = backend
                .in_flight
                .get_or_init(|| self.metrics.in_flight.with_label_values(&[&*backend.name]))
                .clone();
            in_flight.inc();
            Box::new(Metering {
                meter: ResponseMeter::new(sse, injected, info.n, collect_text, itl),
                record,
                recorder: self.recorder.clone(),
                t0,
                in_flight,
                upstream_errors: errors.clone(),
            })
        });
        let mut metering = metering;
        if let Some(m) = &mut metering {
            m.record.overhead += t_headers.elapsed();
        }
        Response::from_parts(rparts, Either::Left(MeteredBody::new(rbody, metering, Some(dispatch), idle)))
    }
}

#[allow(clippy::too_many_arguments)]
fn fail_with(
    metering: &mut Option<(RequestRecord, RequestInfo, bool)>,
    recorder: &Recorder,
    errors: &prometheus::IntCounterVec,
    backend: &str,
    t0: Instant,
    status: StatusCode,
    kind: &'static str,
    outcome: Outcome,
    msg: String,
) -> Response<ProxyBody> {
    errors.with_label_values(&[backend, kind]).inc();
    if let Some((mut record, _, _)) = metering.take() {
        record.status = status.as_u16();
        record.outcome = outcome;
        record.e2e = t0.elapsed();
        recorder.submit(record);
    }
    tracing::warn!(backend, kind, "upstream failure: {msg}");
    let err_type = match status {
        StatusCode::GATEWAY_TIMEOUT => "upstream_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
        _ => "upstream_error",
    };
    error_response(status, err_type, kind, &msg)
}

enum BodyRead {
    TooLarge,
    Failed,
}

/// Read a metered request body whole, within `limit`. Past the limit, keep reading and
/// discarding what the client is still sending for a short while (nginx's lingering close):
/// a client that is mid-upload then reads the 413 instead of a connection reset.
/// Before a 413, read (and discard) what the client is still sending, for up to 1 s or 64 MiB,
/// as nginx's lingering close does: closing on unread data resets the connection, and the
/// reset can destroy the 413 before the client reads it.
async fn linger(body: &mut Incoming) {
    let drain = async {
        let mut discarded = 0usize;
        while let Some(Ok(f)) = body.frame().await {
            discarded += f.data_ref().map_or(0, |d| d.len());
            if discarded > 64 * 1024 * 1024 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, BodyRead> {
    let mut first: Option<Bytes> = None;
    let mut more: Option<bytes::BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyRead::Failed)?.into_data() else { continue };
        len += data.len();
        if len > limit {
            linger(&mut body).await;
            return Err(BodyRead::TooLarge);
        }
        // The usual body is one frame: keep it as it came, copy only from the second on.
        match (&mut first, &mut more) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut b = bytes::BytesMut::with_capacity(f.len() + data.len());
                b.extend_from_slice(f);
                b.extend_from_slice(&data);
                more = Some(b);
            }
            (Some(_), Some(b)) => b.extend_from_slice(&data),
        }
    }
    Ok(match more {
        Some(b) => b.freeze(),
        None => first.unwrap_or_default(),
    })
}

fn too_large(limit: u64) -> Response<ProxyBody> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "request_too_large",
        &format!("request body exceeds the limit of {limit} bytes"),
    )
}

fn find_source<T: std::error::Error + 'static>(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<T>() {
            return true;
        }
        match e.source() {
            Some(s) => e = s,
            None => return false,
        }
    }
}

/// Map a direct-path error to (status, metric kind, outcome, message), as `classify` does.
fn classify_direct(e: &direct::DirectError, connect_ms: u64) -> (StatusCode, &'static str, Outcome, String) {
    match e {
        direct::DirectError::ConnectTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_connect",
            Outcome::Timeout,
            format!("could not connect to the upstream within {connect_ms} ms"),
        ),
        direct::DirectError::Connect(e) => (
            StatusCode::BAD_GATEWAY,
            "connect",
            Outcome::ConnectError,
            format!("could not connect to the upstream: {e}"),
        ),
        direct::DirectError::Upstream(s) => (
            StatusCode::BAD_GATEWAY,
            "protocol",
            Outcome::UpstreamReset,
            format!("upstream failed before answering: {s}"),
        ),
    }
}

/// Map a client error to (status, metric kind, outcome, message).
fn classify(
    e: &hyper_util::client::legacy::Error,
    connect_ms: u64,
) -> (StatusCode, &'static str, Outcome, String) {
    let mut timed_out = false;
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut detail = String::new();
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            timed_out = true;
        }
        if detail.is_empty() {
            detail = s.to_string();
        }
        src = s.source();
    }
    if std::error::Error::source(e).is_some_and(find_source::<http_body_util::LengthLimitError>) {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            Outcome::Rejected,
            "request body exceeds the limit".into(),
        );
    }
    if e.is_connect() {
        if timed_out {
            (
                StatusCode::GATEWAY_TIMEOUT,
                "timeout_connect",
                Outcome::Timeout,
                format!("could not connect to the upstream within {connect_ms} ms"),
            )
        } else {
            (
                StatusCode::BAD_GATEWAY,
                "connect",
                Outcome::ConnectError,
                format!("could not connect to the upstream: {detail}"),
            )
        }
    } else {
        (
            StatusCode::BAD_GATEWAY,
            "protocol",
            Outcome::UpstreamReset,
            format!("upstream failed before answering: {detail}"),
        )
    }
}

/// Accept connections until `shutdown` resolves; each connection is served on its own task.
/// Then stop accepting, let in-flight requests finish for up to `grace`, and return.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let limits = proxy.config.load().config.limits;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let (drain, draining) = tokio::sync::watch::channel(false);
    let front = Arc::new(front::Front {
        proxy: proxy.clone(),
        hyper: builder,
        header_timeout: Duration::from_millis(limits.header_read_timeout_ms),
        max_head: limits.max_header_bytes.max(8192),
        drain: draining,
    });
    let open = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let metrics = proxy.metrics.clone();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        if open.load(Ordering::Relaxed) >= limits.max_connections {
            metrics.rejected.with_label_values(&["max_connections"]).inc();
            refuse(stream, limits.retry_after_secs, &refusing);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let slot = ConnSlot::take(&open, &metrics.client_connections);
        // Counted by the graceful shutdown whichever server loop serves the connection.
        let watcher = graceful.watcher();
        let direct = proxy.config.load().config.server.direct;
        let front = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if direct {
                front::serve_connection(front, stream, remote, watcher).await;
            } else {
                front::serve_with_hyper(&front, stream, remote, watcher).await;
            }
        });
    }
    drop(listener);
    proxy.draining.store(true, Ordering::Relaxed);
    let _ = drain.send(true);
    tracing::info!(connections = graceful.count(), "draining in-flight requests");
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "grace period over; closing the remaining connections");
    }
}

/// One open client connection, counted until its task ends.
struct ConnSlot {
    open: Arc<AtomicUsize>,
    gauge: prometheus::IntGauge,
}

impl ConnSlot {
    fn take(open: &Arc<AtomicUsize>, gauge: &prometheus::IntGauge) -> ConnSlot {
        open.fetch_add(1, Ordering::Relaxed);
        gauge.inc();
        ConnSlot { open: open.clone(), gauge: gauge.clone() }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        self.gauge.dec();
    }
}

/// Answer a connection over limits.max_connections with 503 + Retry-After, without reading
/// its request. The answer is written whole, then the socket lingers briefly (its unread
/// request would otherwise turn the close into a reset that can destroy the answer). At most
/// MAX_REFUSING connections linger; past that a connection is simply closed.
fn refuse(stream: tokio::net::TcpStream, retry_after: u64, refusing: &Arc<AtomicUsize>) {
    const MAX_REFUSING: usize = 64;
    if refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let refusing = refusing.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = r#"{"error":{"message":"goodput is at limits.max_connections; retry later","type":"overloaded_error","code":"max_connections"}}"#;
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: {retry_after}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut stream = stream;
        let linger = async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), linger).await;
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}
