//! `MeteredBody`: the response body handed to the client. It forwards every upstream frame
//! as it arrives (no buffering), lets the `ResponseMeter` look at it, enforces the idle
//! timeout, and fires exactly once at the end: on end of stream, on an upstream error, or on
//! drop, which is how a client disconnect is seen. Dropping it also drops the upstream body,
//! which closes the upstream connection: vLLM aborts the generation when that happens.

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus::IntGauge;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

use super::direct::DirectBody;
use crate::meter::observe::ResponseMeter;
use crate::meter::record::{Outcome, RequestRecord, TokenSource};
use crate::meter::recorder::Recorder;
use crate::route::Dispatch;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub struct IdleTimeout(pub Duration);

impl std::fmt::Display for IdleTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "upstream sent nothing for {:?}", self.0)
    }
}

impl std::error::Error for IdleTimeout {}

/// The upstream's response body: from hyper's pooled client, or read by goodput's own
/// HTTP/1.1 client in this task (`direct.rs`).
pub enum FromUpstream {
    Hyper(Incoming),
    Direct(DirectBody),
}

impl Body for FromUpstream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            FromUpstream::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            FromUpstream::Direct(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            FromUpstream::Hyper(b) => b.is_end_stream(),
            FromUpstream::Direct(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            FromUpstream::Hyper(b) => b.size_hint(),
            FromUpstream::Direct(b) => b.size_hint(),
        }
    }
}

/// Per-request metering state; absent for paths that are only forwarded.
pub struct Metering {
    pub meter: ResponseMeter,
    pub record: RequestRecord,
    pub recorder: Recorder,
    pub t0: Instant,
    pub in_flight: IntGauge,
    /// `goodput_upstream_errors_total{backend, kind}`, for an error the body meets.
    pub upstream_errors: prometheus::IntCounterVec,
}

pub struct MeteredBody {
    inner: FromUpstream,
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
    tail: Option<Bytes>,
    ended: bool,
    /// Something (the response head, then data) was handed to hyper since this body last
    /// returned `Pending`, the point at which hyper flushes. hyper drops what it has not
    /// flushed when a body fails, so an upstream error waits for one flush first.
    unflushed: bool,
    /// An upstream error held back for that flush.
    deferred: Option<BoxError>,
    /// When the upstream body ended, if its record is still to be settled: the meter adds no
    /// bytes at the end, so the parse of the response and the filing of its record wait until
    /// the last bytes have been handed to the client (`settle`), instead of delaying them.
    settle_at: Option<Instant>,
}

impl MeteredBody {
    pub fn new(
        inner: FromUpstream,
        metering: Option<Box<Metering>>,
        dispatch: Option<Dispatch>,
        idle_after: Duration,
    ) -> Self {
        let mut body = MeteredBody {
            inner,
            metering,
            dispatch,
            idle: Box::pin(tokio::time::sleep(idle_after)),
            idle_after,
            last_data: Instant::now(),
            tail: None,
            ended: false,
            unflushed: true,
            deferred: None,
            settle_at: None,
        };
        // An empty upstream body (`content-length: 0`) is never polled: hyper and the own
        // server loop write the head and stop. Settle the record now, or its drop would count
        // the request as cancelled.
        if body.metering.is_some() && body.inner.is_end_stream() {
            body.end_of_upstream(Instant::now());
        }
        body
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
        if r.completion_tokens.is_none() || r.score_request.is_some() {
            r.texts = obs.texts.take();
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
            d.state().report(!r.outcome.is_upstream_failure());
        }
        let Metering { record, recorder, .. } = *m;
        recorder.submit(record);
    }

    /// Whether the upstream has been silent for `idle_after`. Polls the timer, so that it wakes
    /// this task; re-arms it when it fired early because data came in the meantime.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.idle.as_mut().poll(cx).is_pending() {
            return false;
        }
        let due = self.last_data + self.idle_after;
        // tokio's timer has millisecond ticks and fires at or after its deadline.
        if Instant::now() + Duration::from_millis(1) >= due {
            return true;
        }
        self.idle.as_mut().reset(due.into());
        // Registers the re-armed timer with this task's waker.
        self.idle.as_mut().poll(cx).is_ready()
    }

    /// The upstream body is complete. When the meter may still add bytes (a held usage
    /// chunk), they and the record come now; otherwise the record waits for `settle`.
    fn upstream_ended(&mut self, at: Instant) {
        self.ended = true;
        match &self.metering {
            Some(m) if !m.meter.may_rewrite() => self.settle_at = Some(at),
            _ => self.end_of_upstream(at),
        }
    }

    /// Settle a record held back by `upstream_ended`. The own server loop calls it after each
    /// write to the client; dropping the body calls it too (hyper's server, or a client gone).
    pub fn settle(&mut self) {
        if let Some(at) = self.settle_at.take() {
            self.end_of_upstream(at);
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
                        this.ended = true;
                        if let Some(m) = &this.metering {
                            m.upstream_errors.with_label_values(&[&m.record.backend, "timeout_idle"]).inc();
                        }
                        this.finish(Some(Outcome::Timeout), Instant::now());
                        return Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle_after)))));
                    }
                    this.unflushed = false;
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    this.upstream_ended(Instant::now());
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    if let Some(m) = &this.metering {
                        m.upstream_errors.with_label_values(&[&m.record.backend, "reset"]).inc();
                    }
                    this.finish(Some(Outcome::UpstreamReset), Instant::now());
                    if this.unflushed {
                        // The bytes that did arrive reach the client before the cut.
                        this.deferred = Some(e);
                        this.unflushed = false;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    this.unflushed = true;
                    let now = Instant::now();
                    this.last_data = now;
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            let Some(m) = this.metering.as_mut() else {
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            };
                            let out = m.meter.on_data(data, now);
                            m.record.overhead += now.elapsed();
                            out.map(Frame::data)
                        }
                        Err(other) => Some(other),
                    };
                    // A body with a known length may never be polled to its end: hyper stops
                    // once it has written content-length bytes. Settle the record now.
                    if this.inner.is_end_stream() {
                        this.upstream_ended(now);
                    }
                    match frame {
                        Some(f) => return Poll::Ready(Some(Ok(f))),
                        None => continue,
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
        self.settle();
        if self.metering.is_some() {
            // The client went away (or hyper gave up on the connection) before the end.
            self.finish(Some(Outcome::Cancelled), Instant::now());
        }
    }
}
