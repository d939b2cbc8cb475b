//! Phase 4, meter (pingora's `response_filter` and `logging`): the answer's head is cleaned
//! and labelled, and its body is wrapped in `MeteredBody`. That forwards every upstream frame
//! as it arrives (no buffering), lets the `ResponseMeter` look at it, enforces the idle
//! timeout, and files the request's record exactly once: at the end of the upstream body, on
//! an upstream error, or on drop, which is how a client disconnect is seen. Dropping it also
//! drops the upstream body, which closes the upstream connection: vLLM aborts the generation
//! when that happens.

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus::IntGauge;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

use super::DisplayChain;
use super::error::{BoxError, Kind};
use super::headers;
use crate::config::Config;
use crate::config::reload::ResolvedBackend;
use crate::meter::observe::ResponseMeter;
use crate::meter::record::{Outcome, Payload, RequestRecord, TokenSource};
use crate::meter::recorder::Recorder;
use crate::route::{Dispatch, PickReason, Reason};

/// A metered request on its way: its record so far, and what the meter needs of the request.
pub struct MeteredRequest {
    pub record: RequestRecord,
    pub payload: Payload,
    /// Choices per request (`n`).
    pub n: u32,
    /// goodput asked the upstream for stream usage: the usage chunk is its to remove.
    pub injected: bool,
    pub t0: Instant,
    /// Reading the client's body: the client's time, not counted as the proxy's overhead.
    pub client_time: Duration,
}

/// Where the answer came from.
pub struct Upstream {
    pub backend: Arc<ResolvedBackend>,
    pub reason: Reason,
    /// Why this endpoint of the backend's pool.
    pub pick: PickReason,
    /// The request's claim on the backend's capacity, held until the body is dropped.
    pub dispatch: Dispatch,
    /// `first_byte_ms` after the request was sent: until then the answer's first token may
    /// still be on its way, however long the body has been silent.
    pub first_token_by: Instant,
}

/// The answer as the client gets it: hop-by-hop headers gone, the framing headers the ones
/// hyper parsed, goodput's routing headers when configured, and the body metered.
pub fn response_filter(
    resp: Response<Incoming>,
    metered: Option<MeteredRequest>,
    upstream: Upstream,
    cfg: &Config,
    recorder: &Recorder,
) -> Response<MeteredBody> {
    let t_headers = Instant::now();
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    // The length goodput frames the answer with is the one hyper parsed, not the upstream's
    // spelling of it (`+67`, `0067`).
    if parts.headers.contains_key(header::CONTENT_LENGTH) {
        match body.size_hint().exact() {
            Some(n) => parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n)),
            None => parts.headers.remove(header::CONTENT_LENGTH),
        };
    }
    let backend = &upstream.backend;
    if cfg.routing.response_headers {
        if let Ok(v) = HeaderValue::from_str(&backend.name) {
            parts.headers.insert("x-goodput-backend", v);
        }
        parts.headers.insert("x-goodput-reason", HeaderValue::from_static(upstream.reason.as_str()));
        if let Ok(v) = HeaderValue::from_str(&upstream.dispatch.endpoint().label) {
            parts.headers.insert("x-goodput-endpoint", v);
        }
        parts.headers.insert("x-goodput-endpoint-reason", HeaderValue::from_static(upstream.pick.as_str()));
    }
    let Some(MeteredRequest { mut record, payload, n, injected, t0, .. }) = metered else {
        // Unmetered paths: the answer's status is what the breaker learns.
        upstream.dispatch.report(parts.status.as_u16() < 500);
        let idle = Duration::from_millis(cfg.timeouts.idle_ms);
        let body = MeteredBody::new(body, None, Some(upstream.dispatch), idle, upstream.first_token_by);
        return Response::from_parts(parts, body);
    };
    let status = parts.status.as_u16();
    record.status = status;
    record.outcome = match status {
        500.. => Outcome::UpstreamError,
        400.. => Outcome::ClientError,
        _ => Outcome::Ok,
    };
    // An answer in a content coding (sent although admit asked for identity) is not text the
    // meter can read: it goes to the client as it came, its tokens and TTFT unknown, and is
    // counted so that the gap shows.
    let encoded = parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.is_empty() && !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let sse = !encoded
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    if injected && sse {
        // Bytes may be taken out: the length is no longer the upstream's.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let metrics = recorder.metrics();
    let labels = [&*record.model, &*record.backend, &*record.route];
    let itl = (sse && n <= 1).then(|| metrics.itl.with_label_values(&labels));
    let collect_text = backend.tokenizer.is_some() || payload.request.is_some();
    let in_flight =
        backend.in_flight.get_or_init(|| metrics.in_flight.with_label_values(&[&*backend.name])).clone();
    in_flight.inc();
    record.overhead += t_headers.elapsed();
    let meter = if encoded {
        metrics.encoded_responses.with_label_values(&[&*backend.name]).inc();
        ResponseMeter::unread()
    } else {
        ResponseMeter::new(sse, injected, n, collect_text, itl)
    };
    let metering = Box::new(Metering {
        meter,
        record,
        payload,
        recorder: recorder.clone(),
        t0,
        in_flight,
        upstream_errors: metrics.upstream_errors.clone(),
    });
    let idle = Duration::from_millis(cfg.timeouts.idle_ms);
    let body = MeteredBody::new(body, Some(metering), Some(upstream.dispatch), idle, upstream.first_token_by);
    Response::from_parts(parts, body)
}

/// The upstream fell silent in the middle of an answer whose head had come.
#[derive(Debug)]
pub struct BodyTimeout {
    /// Before its first token (`first_byte_ms`), rather than between two frames (`idle_ms`).
    pub first_token: bool,
    pub silent: Duration,
}

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first_token {
            true => write!(f, "upstream sent no first token in time (timeouts.first_byte_ms)"),
            false => write!(f, "upstream sent nothing for {:?} (timeouts.idle_ms)", self.silent),
        }
    }
}

impl std::error::Error for BodyTimeout {}

/// Per-request metering state; absent for paths that are only forwarded.
pub struct Metering {
    pub meter: ResponseMeter,
    pub record: RequestRecord,
    pub payload: Payload,
    pub recorder: Recorder,
    pub t0: Instant,
    pub in_flight: IntGauge,
    /// `goodput_upstream_errors_total{backend, kind}`, for an error the body meets.
    pub upstream_errors: prometheus::IntCounterVec,
}

pub struct MeteredBody {
    inner: Incoming,
    metering: Option<Box<Metering>>,
    /// Counts the request as outstanding at its backend until the body is dropped; with
    /// metering, the request's final outcome goes to the backend's circuit breaker.
    dispatch: Option<Dispatch>,
    /// Fires `idle_after` past `last_data` at the earliest. It is not moved on every frame
    /// (that re-filed it in tokio's timer wheel for every SSE event); when it fires while data
    /// has come since, it is re-armed for `last_data + idle_after`.
    idle: Pin<Box<Sleep>>,
    idle_after: Duration,
    last_data: Instant,
    /// Set until the first token (a stream's first content, or any body bytes of an answer
    /// that is not a stream) has come. A server that sends its head at once and then queues
    /// the request (vLLM does) is silent until then: that wait is bounded by `first_byte_ms`,
    /// as the wait for a head is, not by `idle_ms`.
    first_token_by: Option<Instant>,
    tail: Option<Bytes>,
    ended: bool,
    /// Something (the response head, then data) was handed to hyper since this body last
    /// returned `Pending`, the point at which hyper flushes. hyper drops what it has not
    /// flushed when a body fails, so an upstream error waits for one flush first.
    unflushed: bool,
    /// An upstream error held back for that flush.
    deferred: Option<BoxError>,
}

impl MeteredBody {
    pub fn new(
        inner: Incoming,
        metering: Option<Box<Metering>>,
        dispatch: Option<Dispatch>,
        idle_after: Duration,
        first_token_by: Instant,
    ) -> Self {
        let now = Instant::now();
        let mut body = MeteredBody {
            inner,
            metering,
            dispatch,
            idle: Box::pin(tokio::time::sleep_until(first_token_by.max(now + idle_after).into())),
            idle_after,
            last_data: now,
            first_token_by: Some(first_token_by),
            tail: None,
            ended: false,
            unflushed: true,
            deferred: None,
        };
        // An empty upstream body (`content-length: 0`) is never polled: hyper writes the head
        // and stops. File the record now, or its drop would count the request as cancelled.
        if body.metering.is_some() && body.inner.is_end_stream() {
            body.end_of_upstream(Instant::now());
        }
        body
    }

    /// The upstream said nothing for too long: the answer ends with a timeout.
    fn fell_silent(&mut self) -> BoxError {
        self.ended = true;
        let first = self.first_token_by.is_some();
        let kind = if first { Kind::UpstreamFirstByteTimeout } else { Kind::UpstreamIdleTimeout }.code();
        if let Some(m) = &self.metering {
            m.upstream_errors.with_label_values(&[&m.record.backend, kind]).inc();
        }
        let e = BodyTimeout { first_token: first, silent: self.last_data.elapsed() };
        self.log_cut(kind, &e);
        self.finish(Some(Outcome::Timeout), Instant::now());
        Box::new(e)
    }

    /// The upstream body failed (a reset, a framing error): the answer ends there.
    fn upstream_failed(&mut self, e: &hyper::Error) {
        self.ended = true;
        if let Some(m) = &self.metering {
            m.upstream_errors.with_label_values(&[&m.record.backend, "reset"]).inc();
        }
        self.log_cut("reset", e);
        self.finish(Some(Outcome::UpstreamReset), Instant::now());
    }

    /// An answer the upstream cut after its head, logged as one it failed before the head is
    /// (the same message; `kind` tells them apart): ids and addresses, never content.
    fn log_cut(&self, kind: &'static str, e: &(dyn std::error::Error + '_)) {
        let r = self.metering.as_ref().map(|m| &m.record);
        tracing::warn!(
            id = r.map(|r| r.id),
            request_id = r.and_then(|r| r.request_id.as_deref()),
            backend = r.map(|r| &*r.backend),
            endpoint = self.dispatch.as_ref().map(|d| &*d.endpoint().label),
            kind,
            error = %DisplayChain(e),
            "upstream failure"
        );
    }

    /// A frame from the upstream, metered; what goes to the client (None when the meter took
    /// all of it out: a stripped usage chunk).
    fn on_frame(&mut self, frame: Frame<Bytes>) -> Option<Frame<Bytes>> {
        self.unflushed = true;
        let now = Instant::now();
        self.last_data = now;
        let frame = match frame.into_data() {
            Ok(data) => {
                let Some(m) = self.metering.as_mut() else {
                    self.first_token_came(now);
                    return Some(Frame::data(data));
                };
                let out = m.meter.on_data(data, now);
                let first_token = m.meter.first_token_seen();
                m.record.overhead += now.elapsed();
                if first_token {
                    self.first_token_came(now);
                }
                out.map(Frame::data)
            }
            Err(other) => Some(other),
        };
        // A body with a known length may never be polled to its end: hyper stops once it has
        // written content-length bytes. File the record now.
        if self.inner.is_end_stream() {
            self.end_of_upstream(now);
        }
        frame
    }

    fn finish(&mut self, outcome: Option<Outcome>, end: Instant) {
        let Some(mut m) = self.metering.take() else { return };
        let obs = &mut m.meter.observed;
        let r = &mut m.record;
        r.e2e = end.saturating_duration_since(m.t0);
        r.content_chunks = obs.content_chunks;
        if r.stream {
            r.ttft = obs.first_content.map(|t| t.saturating_duration_since(m.t0));
            r.itl_mean = (obs.itl_count > 0).then(|| obs.itl_sum / obs.itl_count as u32);
        }
        r.finish_reason = obs.finish_reason;
        if let Some(u) = obs.usage {
            if let Some(p) = u.prompt_tokens {
                r.prompt_tokens = Some(p);
                r.prompt_source = TokenSource::Usage;
            }
            if let Some(c) = u.completion_tokens {
                r.completion_tokens = Some(c);
                r.completion_source = TokenSource::Usage;
            }
        }
        // The text goes to the recorder for the tokenizer count (which replaces the chunk
        // count) and for scoring.
        if r.completion_tokens.is_none() || m.payload.request.is_some() {
            m.payload.texts = obs.texts.take();
        }
        if r.completion_tokens.is_none() && r.stream && obs.content_choice_chunks > 0 {
            r.completion_tokens = Some(obs.content_choice_chunks);
            r.completion_source = TokenSource::Chunks;
        }
        if obs.usage_chunks_removed > 0 {
            m.recorder.metrics().usage_stripped.inc_by(obs.usage_chunks_removed);
        }
        r.outcome = match outcome {
            // The stream had ended in protocol terms ([DONE] seen); a client that closes its
            // connection before the chunked body's last bytes (the openai SDK does) got it all.
            Some(Outcome::Cancelled) if obs.done => r.outcome,
            Some(o) => o,
            None if obs.error_event && r.status < 400 => Outcome::UpstreamError,
            None => r.outcome,
        };
        m.in_flight.dec();
        if let Some(d) = &self.dispatch {
            d.report(!r.outcome.is_upstream_failure());
        }
        let Metering { record, payload, recorder, .. } = *m;
        recorder.submit(record, payload);
    }

    /// Whether the upstream has been silent for `idle_after`. Polls the timer, so that it wakes
    /// this task; re-arms it when it fired early because data came in the meantime.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.idle.as_mut().poll(cx).is_pending() {
            return false;
        }
        let due = match self.first_token_by {
            Some(by) => by.max(self.last_data + self.idle_after),
            None => self.last_data + self.idle_after,
        };
        // tokio's timer has millisecond ticks and fires at or after its deadline.
        if Instant::now() + Duration::from_millis(1) >= due {
            return true;
        }
        self.idle.as_mut().reset(due.into());
        // Registers the re-armed timer with this task's waker.
        self.idle.as_mut().poll(cx).is_ready()
    }

    /// From the first token on, silence is bounded by `idle_after`: the timer, armed for the
    /// first-token deadline, moves to the sooner idle one.
    fn first_token_came(&mut self, now: Instant) {
        if self.first_token_by.take().is_some() {
            self.idle.as_mut().reset((now + self.idle_after).into());
        }
    }

    /// Release any held bytes and emit the record, its end-to-end time ending at `end`.
    fn end_of_upstream(&mut self, end: Instant) {
        self.ended = true;
        if let Some(m) = &mut self.metering {
            let t = Instant::now();
            let tail = m.meter.on_end();
            m.record.overhead += t.elapsed();
            self.tail = match (self.tail.take(), tail) {
                (Some(a), Some(b)) => Some([a, b].concat().into()),
                (a, b) => a.or(b),
            };
        }
        self.finish(None, end);
    }
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(e) = this.deferred.take() {
            return Poll::Ready(Some(Err(e)));
        }
        loop {
            if let Some(t) = this.tail.take() {
                this.unflushed = true;
                return Poll::Ready(Some(Ok(Frame::data(t))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if this.idle_expired(cx) {
                        return Poll::Ready(Some(Err(this.fell_silent())));
                    }
                    this.unflushed = false;
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    this.end_of_upstream(Instant::now());
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    this.upstream_failed(&e);
                    if this.unflushed {
                        // The bytes that did arrive reach the client before the cut.
                        this.deferred = Some(e.into());
                        this.unflushed = false;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(f) = this.on_frame(frame) {
                        return Poll::Ready(Some(Ok(f)));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.tail.is_none() && self.deferred.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended && self.deferred.is_none() {
            return SizeHint::with_exact(self.tail.as_ref().map_or(0, |t| t.len() as u64));
        }
        // Exact only when no byte can be taken out.
        match &self.metering {
            Some(m) if m.meter.may_rewrite() => SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        if self.metering.is_some() {
            // The client went away (or hyper gave up on the connection) before the end.
            self.finish(Some(Outcome::Cancelled), Instant::now());
        }
    }
}
