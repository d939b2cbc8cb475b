//! Phase 1, admit (pingora's `request_filter`): what goodput refuses before any backend is
//! chosen, the header hygiene of a reverse proxy, and the body. Metered paths (chat,
//! completions) read the body whole within the limit, skim its JSON and may ask the upstream
//! for stream usage; other paths stream it through.

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{HeaderValue, Method, Request, Version, header};
use http_body_util::combinators::MapErr;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::error::{BoxError, ClientBodyError, Error, Kind};
use super::headers;
use crate::config::Config;
use crate::meter::metrics::Metrics;
use crate::openai::{Operation, RequestInfo, inject_include_usage};

/// A request goodput has accepted, ready to be routed and forwarded.
pub struct Admitted {
    /// The head as it goes upstream (hop-by-hop headers gone, X-Forwarded-* set, no Host).
    pub parts: Parts,
    pub body: ClientBody,
    /// Set for the metered paths (chat and completions).
    pub metered: Option<Metered>,
    /// The time spent reading the client's body: the client's time, not the proxy's.
    pub client_time: Duration,
}

/// The body to send upstream.
pub enum ClientBody {
    /// In memory: sent as it is, and again on failover.
    Whole(Bytes),
    /// Still arriving from the client, within the body limit: sent once, never replayed.
    Streaming(StreamingBody),
}

/// A body streamed through, its errors marked as the client's.
pub type StreamingBody = MapErr<Limited<Incoming>, fn(BoxError) -> ClientBodyError>;

/// What goodput read of a metered request.
pub struct Metered {
    pub op: Operation,
    pub info: RequestInfo,
    /// `stream_options.include_usage` was added upstream: the usage chunk is goodput's to remove.
    pub injected: bool,
    /// The body as the client sent it (what the scorers re-sample from).
    pub original: Bytes,
}

impl Metered {
    /// The `model` field, when the body is JSON.
    pub fn model(&self) -> Option<&str> {
        self.info.model.as_deref().filter(|_| self.info.valid_json)
    }
}

pub async fn request_filter(
    req: Request<Incoming>,
    client: Option<SocketAddr>,
    cfg: &Config,
    metrics: &Metrics,
) -> Result<Admitted, Error> {
    let (mut parts, body) = req.into_parts();
    check_target(&parts)?;
    let limit = cfg.limits.max_body_bytes;
    let declared_len = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|l| l > limit) {
        linger(body);
        return Err(too_large(limit, metrics));
    }
    headers::strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    headers::add_forwarded(&mut parts.headers, client.map(|c| c.ip()));

    let op = (parts.method == Method::POST).then(|| Operation::from_path(parts.uri.path())).flatten();
    let Some(op) = op else {
        let body = if body.is_end_stream() {
            ClientBody::Whole(Bytes::new())
        } else {
            ClientBody::Streaming(Limited::new(body, limit as usize).map_err(ClientBodyError as fn(_) -> _))
        };
        return Ok(Admitted { parts, body, metered: None, client_time: Duration::ZERO });
    };
    // The meter reads the answer's text, so it asks for it uncoded: without this, the SDKs'
    // default `Accept-Encoding: gzip, …` gets a compressing server's answers in gzip, and their
    // tokens go uncounted. Every HTTP client accepts identity; LLM answers are small, and a
    // compressed stream is held back by the compressor anyway.
    parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let t_read = Instant::now();
    let bytes = match read_body(body, limit as usize).await {
        Ok(b) => b,
        Err(BodyRead::TooLarge) => return Err(too_large(limit, metrics)),
        Err(BodyRead::Failed(e)) => {
            return Err(Error::new(Kind::BodyRead, "could not read the request body").with_source(e));
        }
    };
    let client_time = t_read.elapsed();
    let info = RequestInfo::parse(&bytes);
    let rewritten = (cfg.usage.inject_stream_usage && info.wants_injected_usage())
        .then(|| inject_include_usage(&bytes, &info))
        .flatten();
    let injected = rewritten.is_some();
    if injected {
        metrics.usage_injected.inc();
    }
    let upstream = rewritten.map_or_else(|| bytes.clone(), Bytes::from);
    // The length is the body's as it goes upstream.
    parts.headers.insert(header::CONTENT_LENGTH, upstream.len().into());
    Ok(Admitted {
        parts,
        body: ClientBody::Whole(upstream),
        metered: Some(Metered { op, info, injected, original: bytes }),
        client_time,
    })
}

/// What nginx refuses before routing: CONNECT (405), a target that is not origin-form
/// (`*`, authority-form; an absolute-form target is served by its path, as HTTP/2's always
/// is), and an HTTP/1.1 request without exactly one Host header (400).
fn check_target(parts: &Parts) -> Result<(), Error> {
    if parts.method == Method::CONNECT {
        return Err(Error::new(Kind::Connect, "CONNECT is not supported: goodput is a reverse proxy"));
    }
    if !parts.uri.path().starts_with('/') {
        return Err(Error::new(Kind::BadTarget, "the request target must be a path starting with /"));
    }
    if parts.version == Version::HTTP_11 {
        let hosts = parts.headers.get_all(header::HOST).iter().count();
        if hosts != 1 {
            let what = if hosts == 0 { "no Host header" } else { "more than one Host header" };
            return Err(Error::new(Kind::BadHost, format!("an HTTP/1.1 request with {what}")));
        }
    }
    Ok(())
}

fn too_large(limit: u64, metrics: &Metrics) -> Error {
    metrics.body_too_large.inc();
    Error::new(Kind::BodyTooLarge, format!("request body exceeds the limit of {limit} bytes"))
}

enum BodyRead {
    TooLarge,
    Failed(hyper::Error),
}

/// While the 413 goes out, read (and discard) what the client is still sending, as nginx's
/// lingering close does: closing on unread data resets the connection, and the reset can
/// destroy the 413 before the client reads it. The answer does not wait for the drain; the
/// drain stops after LINGER_TOTAL, LINGER_IDLE without data, or LINGER_BYTES, and hyper
/// closes the connection when it drops the body unread.
fn linger(mut body: Incoming) {
    const LINGER_TOTAL: Duration = Duration::from_secs(30);
    const LINGER_IDLE: Duration = Duration::from_secs(5);
    const LINGER_BYTES: usize = 64 * 1024 * 1024;
    tokio::spawn(async move {
        let drain = async {
            let mut discarded = 0usize;
            while let Ok(Some(Ok(f))) = tokio::time::timeout(LINGER_IDLE, body.frame()).await {
                discarded += f.data_ref().map_or(0, |d| d.len());
                if discarded > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TOTAL, drain).await;
    });
}

/// Read a metered request body whole, within `limit`.
async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, BodyRead> {
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyRead::Failed)?.into_data() else { continue };
        len += data.len();
        if len > limit {
            linger(body);
            return Err(BodyRead::TooLarge);
        }
        // The usual body is one frame: keep it as it came, copy only from the second on.
        match (&mut first, &mut more) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut b = BytesMut::with_capacity(f.len() + data.len());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, target: &str, version: Version, hosts: &[&str]) -> Parts {
        let mut b = Request::builder().method(method).uri(target).version(version);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn targets_goodput_refuses() {
        let kind = |p: Parts| check_target(&p).err().map(|e| e.kind);
        assert_eq!(kind(parts("POST", "/v1/chat/completions", Version::HTTP_11, &["a"])), None);
        assert_eq!(kind(parts("GET", "*", Version::HTTP_11, &["a"])), Some(Kind::BadTarget));
        assert_eq!(kind(parts("OPTIONS", "*", Version::HTTP_11, &["a"])), Some(Kind::BadTarget));
        assert_eq!(kind(parts("CONNECT", "example.com:443", Version::HTTP_11, &["a"])), Some(Kind::Connect));
        assert_eq!(kind(parts("GET", "/", Version::HTTP_11, &[])), Some(Kind::BadHost));
        assert_eq!(kind(parts("GET", "/", Version::HTTP_11, &["a", "b"])), Some(Kind::BadHost));
        // HTTP/1.0 needs no Host; HTTP/2 carries :authority instead (absolute-form here).
        assert_eq!(kind(parts("GET", "/", Version::HTTP_10, &[])), None);
        assert_eq!(kind(parts("GET", "http://a/v1/models", Version::HTTP_2, &[])), None);
    }
}
