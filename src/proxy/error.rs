//! One error type for everything the proxy refuses or fails at. Its kind decides the status,
//! the OpenAI error body, the metric label, the record's outcome, whether the backend's
//! circuit breaker hears of it, and (with `sent`) whether another backend may be tried.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ProxyBody;
use crate::meter::record::Outcome;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request target that is not origin-form (`*`, authority-form): never forwarded.
    BadTarget,
    /// CONNECT: goodput is not a forward proxy.
    Connect,
    /// An HTTP/1.1 request without exactly one Host header.
    BadHost,
    /// The request body is over `limits.max_body_bytes`.
    BodyTooLarge,
    /// The client's body could not be read (it reset, or sent broken framing).
    BodyRead,
    /// Every candidate backend is at its `max_concurrency`.
    AtCapacity,
    /// The class sheds load and every endpoint it may use is saturated.
    Shed,
    /// The chosen backends have no endpoint (an empty DNS answer).
    NoEndpoint,
    /// goodput has no file descriptor left for the upstream connection (EMFILE, ENFILE): its
    /// own limit, not the backend's fault, so neither the breaker nor failover hears of it.
    OutOfDescriptors,
    /// No connection to the upstream (refused, unreachable, DNS, TLS handshake).
    UpstreamConnect,
    UpstreamConnectTimeout,
    /// No response head within `timeouts.first_byte_ms`.
    UpstreamFirstByteTimeout,
    /// A body goodput reads whole (a model list) fell silent for `timeouts.idle_ms`.
    UpstreamIdleTimeout,
    /// The connection broke, or the upstream spoke broken HTTP, before a response head.
    UpstreamProtocol,
    /// `101 Switching Protocols` to a request that asked for no upgrade (goodput strips them).
    UpstreamUpgrade,
}

impl Kind {
    /// The `kind` label of `goodput_upstream_errors_total` and the OpenAI error `code`.
    pub fn code(self) -> &'static str {
        match self {
            Kind::BadTarget => "invalid_target",
            Kind::Connect => "method_not_allowed",
            Kind::BadHost => "invalid_host",
            Kind::BodyTooLarge => "request_too_large",
            Kind::BodyRead => "body_read_failed",
            Kind::AtCapacity => "backend_at_capacity",
            Kind::Shed => "overloaded",
            Kind::NoEndpoint => "no_endpoint",
            Kind::OutOfDescriptors => "out_of_descriptors",
            Kind::UpstreamConnect => "connect",
            Kind::UpstreamConnectTimeout => "timeout_connect",
            Kind::UpstreamFirstByteTimeout => "timeout_first_byte",
            Kind::UpstreamIdleTimeout => "timeout_idle",
            Kind::UpstreamProtocol => "protocol",
            Kind::UpstreamUpgrade => "unexpected_upgrade",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Kind::BadTarget | Kind::BadHost | Kind::BodyRead => StatusCode::BAD_REQUEST,
            Kind::Connect => StatusCode::METHOD_NOT_ALLOWED,
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::AtCapacity | Kind::NoEndpoint | Kind::OutOfDescriptors => StatusCode::SERVICE_UNAVAILABLE,
            Kind::Shed => StatusCode::TOO_MANY_REQUESTS,
            Kind::UpstreamConnectTimeout | Kind::UpstreamFirstByteTimeout | Kind::UpstreamIdleTimeout => {
                StatusCode::GATEWAY_TIMEOUT
            }
            Kind::UpstreamConnect | Kind::UpstreamProtocol | Kind::UpstreamUpgrade => StatusCode::BAD_GATEWAY,
        }
    }

    /// The OpenAI error body's `type`.
    fn error_type(self) -> &'static str {
        match self {
            Kind::BadTarget | Kind::Connect | Kind::BadHost | Kind::BodyTooLarge | Kind::BodyRead => {
                "invalid_request_error"
            }
            Kind::AtCapacity | Kind::Shed | Kind::NoEndpoint | Kind::OutOfDescriptors => "overloaded_error",
            Kind::UpstreamConnectTimeout | Kind::UpstreamFirstByteTimeout | Kind::UpstreamIdleTimeout => {
                "upstream_timeout"
            }
            Kind::UpstreamConnect | Kind::UpstreamProtocol | Kind::UpstreamUpgrade => "upstream_error",
        }
    }

    /// How a metered request that ends here is recorded.
    pub fn outcome(self) -> Outcome {
        match self {
            Kind::BadTarget | Kind::Connect | Kind::BadHost | Kind::BodyTooLarge | Kind::BodyRead => {
                Outcome::Rejected
            }
            Kind::AtCapacity | Kind::Shed | Kind::NoEndpoint | Kind::OutOfDescriptors => Outcome::Rejected,
            Kind::UpstreamConnect => Outcome::ConnectError,
            Kind::UpstreamConnectTimeout | Kind::UpstreamFirstByteTimeout | Kind::UpstreamIdleTimeout => {
                Outcome::Timeout
            }
            Kind::UpstreamProtocol | Kind::UpstreamUpgrade => Outcome::UpstreamReset,
        }
    }

    /// The backend failed: counted in `goodput_upstream_errors_total` and by its breaker.
    pub fn is_upstream(self) -> bool {
        matches!(
            self,
            Kind::UpstreamConnect
                | Kind::UpstreamConnectTimeout
                | Kind::UpstreamFirstByteTimeout
                | Kind::UpstreamIdleTimeout
                | Kind::UpstreamProtocol
                | Kind::UpstreamUpgrade
        )
    }
}

/// A refusal or failure, with what caused it.
#[derive(Debug)]
pub struct Error {
    pub kind: Kind,
    /// Whether any byte of the request may have reached the upstream. Only a request that
    /// surely did not is sent again (to another backend): a written POST is never replayed,
    /// since the backend may be running its generation.
    pub sent: bool,
    message: String,
    source: Option<BoxError>,
    retry_after: Option<u64>,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Error {
        Error { kind, sent: false, message: message.into(), source: None, retry_after: None }
    }

    pub fn with_source(mut self, source: impl Into<BoxError>) -> Error {
        self.source = Some(source.into());
        self
    }

    pub fn sent(mut self, sent: bool) -> Error {
        self.sent = sent;
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Error {
        self.retry_after = Some(secs);
        self
    }

    /// Another candidate backend may be tried: the upstream failed and has none of the request.
    pub fn may_fail_over(&self) -> bool {
        self.kind.is_upstream() && !self.sent
    }

    /// Classify a failure of hyper's client. A connect error has sent nothing; anything after
    /// the connection was made may have written the request.
    pub fn from_client(e: hyper_util::client::legacy::Error, connect_ms: u64) -> Error {
        // The client's streamed body failed, not the upstream: the client's error, which
        // neither the breaker nor the upstream error count may hear of.
        let body = chain(&e).find_map(|s| s.downcast_ref::<ClientBodyError>()).map(|b| {
            if b.0.is::<http_body_util::LengthLimitError>() {
                (Kind::BodyTooLarge, "request body exceeds the limit")
            } else {
                (Kind::BodyRead, "could not read the request body")
            }
        });
        if let Some((kind, message)) = body {
            return Error::new(kind, message).with_source(e).sent(true);
        }
        if e.is_connect() {
            let out_of_fds = chain(&e).any(|s| {
                s.downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::raw_os_error)
                    .is_some_and(|c| c == libc::EMFILE || c == libc::ENFILE)
            });
            if out_of_fds {
                return Error::new(
                    Kind::OutOfDescriptors,
                    "goodput has no file descriptor left for the upstream connection",
                )
                .with_source(e)
                .retry_after(1);
            }
            let timed_out = chain(&e).any(|s| {
                s.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            });
            return if timed_out {
                Error::new(
                    Kind::UpstreamConnectTimeout,
                    format!("could not connect to the upstream within {connect_ms} ms"),
                )
            } else {
                Error::new(Kind::UpstreamConnect, "could not connect to the upstream")
            }
            .with_source(e);
        }
        Error::new(Kind::UpstreamProtocol, "upstream failed before answering").with_source(e).sent(true)
    }

    /// The answer the client gets: the kind's status and an OpenAI-style error body.
    pub fn response(&self) -> Response<ProxyBody> {
        // The first cause below hyper-util's own wrapper ("client error (Connect)").
        let cause =
            chain(self).skip(1).find(|s| !s.is::<hyper_util::client::legacy::Error>()).map(|s| s.to_string());
        let message = match cause {
            Some(cause) if self.kind.is_upstream() => format!("{}: {cause}", self.message),
            _ => self.message.clone(),
        };
        let mut r = error_response(self.kind.status(), self.kind.error_type(), self.kind.code(), &message);
        if let Some(secs) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// A failure of the client's body while it streams upstream (a reset, broken chunked framing,
/// the body limit), so that it is told apart from the upstream's own failures.
#[derive(Debug)]
pub struct ClientBodyError(pub BoxError);

impl fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the client's request body failed")
    }
}

impl std::error::Error for ClientBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// A warning that can come in a flood (every request, every retry), said at most once a
/// second with the count of those left out. Shared by tasks: atomics, no lock.
pub struct Quiet {
    epoch: std::time::Instant,
    /// Milliseconds after `epoch` plus one second of the last line; 0 before the first.
    last_ms: AtomicU64,
    left_out: AtomicU64,
}

impl Quiet {
    pub fn new() -> Quiet {
        Quiet { epoch: std::time::Instant::now(), last_ms: AtomicU64::new(0), left_out: AtomicU64::new(0) }
    }

    /// `Some(lines left out since the last)` when a line is due.
    pub fn due(&self) -> Option<u64> {
        let now = self.epoch.elapsed().as_millis() as u64 + 1000;
        let last = self.last_ms.load(Ordering::Relaxed);
        let quiet = last != 0 && now - last < 1000;
        if quiet || self.last_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.left_out.swap(0, Ordering::Relaxed))
    }
}

impl Default for Quiet {
    fn default() -> Self {
        Self::new()
    }
}

/// An error and its sources, outermost first.
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |e| e.source())
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn a_flood_of_warnings_is_one_line_a_second_with_the_count_left_out() {
        let q = Quiet::new();
        assert_eq!(q.due(), Some(0));
        for _ in 0..49 {
            assert_eq!(q.due(), None);
        }
        // One second later the next line is due, and says how many were left out.
        q.last_ms.fetch_sub(1000, Ordering::Relaxed);
        assert_eq!(q.due(), Some(49));
        assert_eq!(q.due(), None);
    }

    #[test]
    fn only_an_unsent_upstream_failure_fails_over() {
        let connect = Error::new(Kind::UpstreamConnect, "x");
        assert!(connect.may_fail_over());
        assert!(!Error::new(Kind::UpstreamProtocol, "x").sent(true).may_fail_over());
        assert!(!Error::new(Kind::BodyTooLarge, "x").may_fail_over());
        assert!(!Error::new(Kind::AtCapacity, "x").may_fail_over());
    }

    #[test]
    fn kinds_decide_status_outcome_and_breaker() {
        for (kind, status, upstream) in [
            (Kind::BadTarget, 400, false),
            (Kind::Connect, 405, false),
            (Kind::BadHost, 400, false),
            (Kind::BodyTooLarge, 413, false),
            (Kind::BodyRead, 400, false),
            (Kind::AtCapacity, 503, false),
            (Kind::OutOfDescriptors, 503, false),
            (Kind::UpstreamConnect, 502, true),
            (Kind::UpstreamConnectTimeout, 504, true),
            (Kind::UpstreamFirstByteTimeout, 504, true),
            (Kind::UpstreamIdleTimeout, 504, true),
            (Kind::UpstreamProtocol, 502, true),
            (Kind::UpstreamUpgrade, 502, true),
        ] {
            assert_eq!(kind.status().as_u16(), status, "{kind:?}");
            assert_eq!(kind.is_upstream(), upstream, "{kind:?}");
            assert_eq!(kind.outcome().is_upstream_failure(), upstream, "{kind:?}");
        }
    }

    #[tokio::test]
    async fn the_body_names_the_cause_and_retry_after_is_set() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = Error::new(Kind::UpstreamProtocol, "upstream failed before answering").with_source(io);
        assert_eq!(std::error::Error::source(&e).unwrap().to_string(), "reset by peer");
        let r = e.response();
        assert_eq!(r.status(), 502);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "protocol");
        assert_eq!(v["error"]["type"], "upstream_error");
        assert_eq!(v["error"]["message"], "upstream failed before answering: reset by peer");
        let r = Error::new(Kind::AtCapacity, "full").retry_after(3).response();
        assert_eq!(r.headers()["retry-after"], "3");
    }
}
