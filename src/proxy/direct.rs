//! The direct upstream path: goodput's own HTTP/1.1 client for metered requests (whose body
//! is already in memory) to `http://` backends.
//!
//! Why not the general pooled client: hyper's client reads the upstream socket on a task of
//! its own and hands the body over one chunk at a time through a one-slot channel, so a
//! burst of SSE events costs a task hand-over (often a cross-thread wake) and a `writev` to
//! the client per event. Here the upstream socket is read by the client connection's own
//! task, in the body's `poll_frame`: one read, every complete chunk in it decoded, one frame,
//! one write. That is what nginx does, and it is where most of goodput's added latency per
//! stream went (BENCHMARKS.md). Heads are parsed by `httparse` (hyper's own parser); the
//! chunked decoder is below and fuzzed. `upstream.direct: false` turns the path off.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Largest response head accepted (hyper's default read buffer limit).
const MAX_HEAD: usize = 400 * 1024;
/// Most response headers accepted (hyper's default).
const MAX_HEADERS: usize = 100;
/// Longest chunk-size line (with extensions) and largest trailer section.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;
/// Read sizes for the upstream socket: SSE events are small, so a body starts with hyper's
/// initial buffer size and doubles while reads fill it (a large JSON answer).
const READ_MIN: usize = 8 * 1024;
const READ_MAX: usize = 256 * 1024;

/// Why a request on the direct path failed before a response head arrived.
#[derive(Debug)]
pub enum DirectError {
    Connect(io::Error),
    ConnectTimeout,
    /// After connecting: reset, early close, or a response that is not HTTP/1.x.
    Upstream(String),
}

impl std::fmt::Display for DirectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirectError::Connect(e) => write!(f, "{e}"),
            DirectError::ConnectTimeout => write!(f, "connect timed out"),
            DirectError::Upstream(s) => f.write_str(s),
        }
    }
}

/// An idle keep-alive connection and since when it has been idle.
type Idle = (TcpStream, Instant);

/// Idle keep-alive connections per backend authority.
pub struct DirectClient {
    idle: Mutex<HashMap<Arc<str>, Vec<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

pub struct Request<'a> {
    /// host[:port] (port 80 when absent), which is also the Host header unless `headers`
    /// sets one.
    pub authority: &'a Arc<str>,
    pub method: &'a http::Method,
    /// Path and query, with the backend's base path in front.
    pub target: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub connect_timeout: Duration,
}

impl DirectClient {
    /// A client whose idle connections are swept every few seconds (when created on a
    /// runtime): those the server closed or that idled past `idle_timeout` are closed.
    pub fn new(max_idle: usize, idle_timeout: Duration) -> Arc<DirectClient> {
        let client = Arc::new(DirectClient { idle: Mutex::new(HashMap::new()), max_idle, idle_timeout });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&client);
            rt.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    let Some(client) = weak.upgrade() else { return };
                    client.sweep();
                }
            });
        }
        client
    }

    fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        for list in idle.values_mut() {
            list.retain(|(s, since)| since.elapsed() <= self.idle_timeout && still_open(s));
        }
        idle.retain(|_, list| !list.is_empty());
    }

    /// A pooled connection that is still open, if there is one.
    fn checkout(&self, key: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(key)?;
        while let Some((stream, since)) = list.pop() {
            if since.elapsed() <= self.idle_timeout && still_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    fn checkin(&self, key: &Arc<str>, stream: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(key.clone()).or_default();
        if list.len() < self.max_idle {
            list.push((stream, Instant::now()));
        }
    }

    /// Send the request and read the response head. A pooled connection that turns out to
    /// have been closed by the server (nothing written, or EOF before any byte of a response)
    /// is replaced by a new one, once: the keep-alive race every HTTP/1 client has (Go's
    /// net/http retries the same way).
    pub async fn send(self: &Arc<Self>, req: Request<'_>) -> Result<Response<DirectBody>, DirectError> {
        let wire = encode(&req);
        let mut reused = self.checkout(req.authority);
        loop {
            let was_reused = reused.is_some();
            let mut stream = match reused.take() {
                Some(s) => s,
                None => connect(req.authority, req.connect_timeout).await?,
            };
            match exchange(&mut stream, &wire, req.method == http::Method::HEAD).await {
                Ok((head, rest)) => {
                    let mut body = DirectBody {
                        stream: Some(stream),
                        buf: rest,
                        decoder: head.decoder,
                        reusable: head.reusable,
                        pool: self.clone(),
                        key: req.authority.clone(),
                        want: READ_MIN,
                    };
                    // An empty body is complete with its head: it says so (is_end_stream) and
                    // the connection goes back to the pool now, since a server loop may never
                    // poll a body whose length is zero.
                    if body.decoder == Decoder::Length(0) {
                        body.decoder = Decoder::Done;
                        body.finish();
                    }
                    let mut r = Response::new(body);
                    *r.status_mut() = head.status;
                    *r.headers_mut() = head.headers;
                    return Ok(r);
                }
                Err(Exchange::Stale) if was_reused => continue,
                Err(Exchange::Stale) => {
                    return Err(DirectError::Upstream("connection closed before a response".into()));
                }
                Err(Exchange::Failed(s)) => return Err(DirectError::Upstream(s)),
            }
        }
    }
}

/// An idle connection has nothing to read: EOF means the server closed it, and data would
/// be a protocol error; either way it is not reused. (No syscall unless epoll said readable.)
fn still_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

async fn connect(authority: &str, timeout: Duration) -> Result<TcpStream, DirectError> {
    let a: http::uri::Authority = authority
        .parse()
        .map_err(|e| DirectError::Connect(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    let addr = format!("{}:{}", a.host(), a.port_u16().unwrap_or(80));
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| DirectError::ConnectTimeout)?
        .map_err(DirectError::Connect)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The request as it goes on the wire: head and body in one buffer, one write.
fn encode(req: &Request<'_>) -> Vec<u8> {
    let mut w = Vec::with_capacity(256 + req.headers.len() * 48 + req.body.len());
    w.extend_from_slice(req.method.as_str().as_bytes());
    w.push(b' ');
    w.extend_from_slice(req.target.as_bytes());
    w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    // A Host the backend's config sets (virtual hosting) wins, as with hyper's client.
    match req.headers.get(http::header::HOST) {
        Some(h) => w.extend_from_slice(h.as_bytes()),
        None => w.extend_from_slice(req.authority.as_bytes()),
    }
    w.extend_from_slice(b"\r\n");
    for (k, v) in req.headers {
        // The body is sent whole with its length; the framing is ours.
        if k == http::header::CONTENT_LENGTH || k == http::header::EXPECT || k == http::header::HOST {
            continue;
        }
        w.extend_from_slice(k.as_str().as_bytes());
        w.extend_from_slice(b": ");
        w.extend_from_slice(v.as_bytes());
        w.extend_from_slice(b"\r\n");
    }
    w.extend_from_slice(b"content-length: ");
    push_decimal(&mut w, req.body.len() as u64);
    w.extend_from_slice(b"\r\n\r\n");
    w.extend_from_slice(req.body);
    w
}

/// `n` in decimal, without a `String` per request.
pub(super) fn push_decimal(w: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    w.extend_from_slice(&digits[i..]);
}

enum Exchange {
    /// Nothing came back at all: on a reused connection, the server had closed it.
    Stale,
    Failed(String),
}

struct Head {
    status: StatusCode,
    headers: HeaderMap,
    decoder: Decoder,
    reusable: bool,
}

async fn exchange(
    stream: &mut TcpStream,
    wire: &[u8],
    head_request: bool,
) -> Result<(Head, BytesMut), Exchange> {
    let written = stream.write_all(wire).await;
    let mut buf = BytesMut::with_capacity(READ_MIN);
    loop {
        // A server may answer (and close) before reading a whole body: read what it said.
        match read_some(stream, &mut buf).await {
            Ok(0) if buf.is_empty() => {
                return Err(match written {
                    Err(e)
                        if e.kind() != io::ErrorKind::BrokenPipe
                            && e.kind() != io::ErrorKind::ConnectionReset =>
                    {
                        Exchange::Failed(format!("writing the request: {e}"))
                    }
                    _ => Exchange::Stale,
                });
            }
            Ok(0) => return Err(Exchange::Failed("connection closed inside the response head".into())),
            Ok(_) => {}
            Err(e) if buf.is_empty() && e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Exchange::Stale);
            }
            Err(e) => return Err(Exchange::Failed(e.to_string())),
        }
        match parse_head(&mut buf, head_request).map_err(Exchange::Failed)? {
            None if buf.len() > MAX_HEAD => {
                return Err(Exchange::Failed("response head larger than 400 KiB".into()));
            }
            None => continue,
            Some(None) => {} // 1xx: skipped, the real head follows
            Some(Some(head)) => return Ok((head, buf)),
        }
    }
}

async fn read_some(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_some(stream, buf, READ_MIN, cx)).await
}

/// Read what the socket has into `buf`, with room for at least `want / 2` bytes (`want` after
/// growing it). Through tokio's `poll_read`, which takes a short read as "drained" (as nginx
/// does): the next poll waits for epoll instead of spending a `recv` on EAGAIN, and the
/// client's write goes out one syscall sooner on every SSE event.
///
/// SSE events are read into what is left of the buffer until less than half remains. Growing
/// it waits until the socket is readable: hyper polls the body again right after taking a
/// frame, before it writes that frame out, and the frame still shares the buffer then, so a
/// `reserve` at that point allocated a new buffer. Once bytes have arrived, the frames before
/// them have been written and dropped, and `reserve` takes the buffer back without allocating.
pub(super) fn poll_read_some(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < want / 2 {
        ready!(stream.poll_read_ready(cx))?;
        buf.reserve(want);
    }
    tokio_util::io::poll_read_buf(Pin::new(stream), cx, buf)
}

/// Parse a response head at the start of `buf`: `None` while incomplete; once complete it
/// is taken out of `buf`, `Some(None)` for an interim 1xx (skipped), else the head.
///
/// The header values share the head's bytes (one reference count) rather than each being
/// copied into an allocation of its own.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Option<Head>>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut slots);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("invalid response head: {e}")),
    };
    let code = r.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| format!("invalid status {code}"))?;
    if status.is_informational() && code != 101 {
        buf.advance(n);
        return Ok(Some(None));
    }
    let version = r.version;
    // Each name, and where its value lies in the head (httparse's slices are of `buf`).
    let base = buf.as_ptr() as usize;
    let mut found: SmallVec<[(HeaderName, usize, usize); 16]> = SmallVec::new();
    for h in r.headers.iter() {
        let name =
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| "invalid header name".to_string())?;
        let at = h.value.as_ptr() as usize - base;
        found.push((name, at, at + h.value.len()));
    }
    let head = buf.split_to(n).freeze();
    let mut headers = HeaderMap::with_capacity(found.len());
    let mut chunked = false;
    let mut coded = false;
    let mut length: Option<u64> = None;
    let mut close = version != Some(1);
    for (name, from, to) in found {
        let value = HeaderValue::from_maybe_shared(head.slice(from..to))
            .map_err(|_| "invalid header value".to_string())?;
        if name == http::header::TRANSFER_ENCODING {
            coded = true;
            chunked = value
                .to_str()
                .ok()
                .and_then(|v| v.rsplit(',').next())
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if name == http::header::CONTENT_LENGTH {
            let l = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or("invalid content-length")?;
            if length.is_some_and(|old| old != l) {
                return Err("conflicting content-length headers".into());
            }
            length = Some(l);
        } else if name == http::header::CONNECTION {
            let v = value.to_str().unwrap_or("");
            if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")) {
                close = true;
            } else if version == Some(0) && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
            {
                close = false;
            }
        }
        headers.append(name, value);
    }
    let decoder = if head_request || code == 204 || code == 304 || code == 101 {
        Decoder::Length(0)
    } else if coded {
        // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3); a coding that does
        // not end in chunked is delimited by the close.
        headers.remove(http::header::CONTENT_LENGTH);
        if chunked { Decoder::Chunked(Chunked::Size) } else { Decoder::Eof }
    } else if let Some(l) = length {
        Decoder::Length(l)
    } else {
        Decoder::Eof
    };
    let reusable = !close && code != 101 && !matches!(decoder, Decoder::Eof);
    Ok(Some(Some(Head { status, headers, decoder, reusable })))
}

/// Response body framing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoder {
    Length(u64),
    Chunked(Chunked),
    /// Until the server closes the connection.
    Eof,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chunked {
    Size,
    Data(u64),
    DataEnd,
    /// Trailer section; the count is its bytes so far.
    Trailers(usize),
}

impl Decoder {
    /// Consume what `buf` holds, passing payload pieces to `out` (split off `buf`, no copy).
    pub fn decode(&mut self, buf: &mut BytesMut, out: &mut impl FnMut(Bytes)) -> Result<(), String> {
        loop {
            match self {
                Decoder::Done => return Ok(()),
                Decoder::Eof => {
                    if !buf.is_empty() {
                        out(buf.split().freeze());
                    }
                    return Ok(());
                }
                Decoder::Length(0) => *self = Decoder::Done,
                Decoder::Length(rem) => {
                    if buf.is_empty() {
                        return Ok(());
                    }
                    let k = (*rem).min(buf.len() as u64) as usize;
                    out(buf.split_to(k).freeze());
                    *rem -= k as u64;
                    if *rem == 0 {
                        *self = Decoder::Done;
                    }
                }
                Decoder::Chunked(c) => match *c {
                    Chunked::Size => {
                        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                            if buf.len() > MAX_CHUNK_LINE {
                                return Err("chunk size line too long".into());
                            }
                            return Ok(());
                        };
                        if nl > MAX_CHUNK_LINE {
                            return Err("chunk size line too long".into());
                        }
                        let size = parse_chunk_size(&buf[..nl])?;
                        buf.advance(nl + 1);
                        *c = if size == 0 { Chunked::Trailers(0) } else { Chunked::Data(size) };
                    }
                    Chunked::Data(rem) => {
                        if buf.is_empty() {
                            return Ok(());
                        }
                        let k = rem.min(buf.len() as u64) as usize;
                        out(buf.split_to(k).freeze());
                        *c = if rem == k as u64 { Chunked::DataEnd } else { Chunked::Data(rem - k as u64) };
                    }
                    Chunked::DataEnd => {
                        if buf.len() < 2 {
                            if buf.first().is_some_and(|&b| b != b'\r') {
                                return Err("missing CRLF after chunk data".into());
                            }
                            return Ok(());
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err("missing CRLF after chunk data".into());
                        }
                        buf.advance(2);
                        *c = Chunked::Size;
                    }
                    Chunked::Trailers(seen) => {
                        // Trailer fields are dropped (they are not forwarded either way by
                        // SSE clients); the section ends with an empty line.
                        let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                            if seen + buf.len() > MAX_TRAILERS {
                                return Err("trailer section too large".into());
                            }
                            return Ok(());
                        };
                        let empty = nl == 0 || (nl == 1 && buf[0] == b'\r');
                        let seen = seen + nl + 1;
                        if seen > MAX_TRAILERS {
                            return Err("trailer section too large".into());
                        }
                        buf.advance(nl + 1);
                        *self = if empty { Decoder::Done } else { Decoder::Chunked(Chunked::Trailers(seen)) };
                    }
                },
            }
        }
    }

    fn remaining_hint(&self) -> SizeHint {
        match self {
            Decoder::Length(n) => SizeHint::with_exact(*n),
            Decoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// `1a;ext=1\r` → 26. Hex digits, then optional whitespace and extensions.
fn parse_chunk_size(line: &[u8]) -> Result<u64, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut size: u64 = 0;
    let mut digits = 0;
    for &b in line {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b';' | b' ' | b'\t' => break,
            _ => return Err("invalid chunk size".into()),
        };
        digits += 1;
        size =
            size.checked_mul(16).and_then(|s| s.checked_add(u64::from(d))).ok_or("chunk size overflows")?;
    }
    if digits == 0 {
        return Err("invalid chunk size".into());
    }
    Ok(size)
}

/// A response body read from the upstream socket in the caller's task. Each poll hands
/// over everything the last read brought, as one frame. At the end, a keep-alive
/// connection goes back to the pool; dropped early (the client left), it is closed, which
/// is how the upstream learns to stop generating.
pub struct DirectBody {
    stream: Option<TcpStream>,
    buf: BytesMut,
    decoder: Decoder,
    reusable: bool,
    pool: Arc<DirectClient>,
    key: Arc<str>,
    /// Room to read into next (READ_MIN, doubled while reads fill it).
    want: usize,
}

#[derive(Debug)]
pub struct BodyError(pub String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

impl DirectBody {
    fn finish(&mut self) {
        if let Some(s) = self.stream.take()
            && self.reusable
            && self.buf.is_empty()
        {
            self.pool.checkin(&self.key, s);
        }
    }
}

impl Body for DirectBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            let mut held = Held::default();
            if let Err(e) = this.decoder.decode(&mut this.buf, &mut |b| held.push(b)) {
                this.decoder = Decoder::Done;
                this.stream = None;
                return Poll::Ready(Some(Err(BodyError(format!("invalid response body: {e}")))));
            }
            if this.decoder == Decoder::Done {
                this.finish();
            }
            if let Some(b) = held.take() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.decoder == Decoder::Done {
                return Poll::Ready(None);
            }
            let Some(stream) = &mut this.stream else { return Poll::Ready(None) };
            match ready!(poll_read_some(stream, &mut this.buf, this.want, cx)) {
                Ok(0) if this.decoder == Decoder::Eof => {
                    this.decoder = Decoder::Done;
                    this.stream = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.decoder = Decoder::Done;
                    this.stream = None;
                    return Poll::Ready(Some(Err(BodyError(
                        "upstream closed the connection inside the body".into(),
                    ))));
                }
                Ok(n) => {
                    if n >= this.want {
                        this.want = (this.want * 2).min(READ_MAX);
                    }
                }
                Err(e) => {
                    this.decoder = Decoder::Done;
                    this.stream = None;
                    return Poll::Ready(Some(Err(BodyError(format!("reading the upstream: {e}")))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder == Decoder::Done
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.remaining_hint()
    }
}

/// Payload pieces of one read, as one frame: a single piece is passed on as it is; several
/// (the chunks of a burst of SSE events) are joined, so the client gets them in one write.
#[derive(Default)]
enum Held {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Held {
    fn push(&mut self, b: Bytes) {
        *self = match std::mem::take(self) {
            Held::Empty => Held::One(b),
            Held::One(a) => {
                let mut m = BytesMut::with_capacity((a.len() + b.len()).max(4096));
                m.extend_from_slice(&a);
                m.extend_from_slice(&b);
                Held::Many(m)
            }
            Held::Many(mut m) => {
                m.extend_from_slice(&b);
                Held::Many(m)
            }
        };
    }

    fn take(&mut self) -> Option<Bytes> {
        match std::mem::take(self) {
            Held::Empty => None,
            Held::One(b) => Some(b),
            Held::Many(m) => Some(m.freeze()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// Decode `wire` fed in pieces split at `cuts`; returns the payload and the final state.
    fn decode_split(
        mut d: Decoder,
        wire: &[u8],
        cuts: &[usize],
    ) -> Result<(Vec<u8>, Decoder, usize), String> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&wire.len())) {
            buf.extend_from_slice(&wire[last..c]);
            last = c;
            d.decode(&mut buf, &mut |b| out.extend_from_slice(&b))?;
        }
        Ok((out, d, buf.len()))
    }

    #[test]
    fn decimal_lengths() {
        for n in [0u64, 7, 10, 99, 100, 4096, 123_456_789, u64::MAX] {
            let mut w = b"x".to_vec();
            push_decimal(&mut w, n);
            assert_eq!(w, format!("x{n}").into_bytes());
        }
    }

    const CHUNKED: &[u8] =
        b"5;ext=\"a\"\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";

    #[test]
    fn chunked_at_every_split() {
        let want = b"helloabcdefghijklmnopqrstuvwxyz";
        for i in 0..=CHUNKED.len() {
            for j in i..=CHUNKED.len() {
                let (out, d, left) = decode_split(Decoder::Chunked(Chunked::Size), CHUNKED, &[i, j]).unwrap();
                assert_eq!(out, want, "split {i},{j}");
                assert_eq!(d, Decoder::Done);
                assert_eq!(left, 0);
            }
        }
    }

    #[test]
    fn chunked_leaves_the_next_message_alone() {
        let mut wire = CHUNKED.to_vec();
        wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let (_, d, left) = decode_split(Decoder::Chunked(Chunked::Size), &wire, &[]).unwrap();
        assert_eq!(d, Decoder::Done);
        assert_eq!(left, 17);
    }

    #[test]
    fn chunked_rejects_bad_framing() {
        for bad in [&b"zz\r\nhello\r\n"[..], b"\r\n", b"5\r\nhelloXX", b"ffffffffffffffffff\r\n"] {
            assert!(decode_split(Decoder::Chunked(Chunked::Size), bad, &[]).is_err(), "{bad:?}");
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 10];
        assert!(decode_split(Decoder::Chunked(Chunked::Size), &long, &[]).is_err());
        let mut trailers = b"0\r\n".to_vec();
        trailers.extend(std::iter::repeat_n(b'a', MAX_TRAILERS + 1));
        assert!(decode_split(Decoder::Chunked(Chunked::Size), &trailers, &[]).is_err());
    }

    #[test]
    fn length_and_eof_framing() {
        let (out, d, left) = decode_split(Decoder::Length(5), b"hello, next", &[2]).unwrap();
        assert_eq!((out.as_slice(), d, left), (&b"hello"[..], Decoder::Done, 6));
        let (out, d, _) = decode_split(Decoder::Eof, b"anything", &[3]).unwrap();
        assert_eq!((out.as_slice(), d), (&b"anything"[..], Decoder::Eof));
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"1a\r"), Ok(26));
        assert_eq!(parse_chunk_size(b"1A;name=value"), Ok(26));
        assert_eq!(parse_chunk_size(b"0"), Ok(0));
        assert!(parse_chunk_size(b"").is_err());
        assert!(parse_chunk_size(b";x").is_err());
        assert!(parse_chunk_size(b"1g").is_err());
    }

    /// `parse_head` on `wire`, and how much of it is left.
    fn parse(wire: &[u8]) -> (Result<Option<Option<Head>>, String>, usize) {
        let mut buf = BytesMut::from(wire);
        let r = parse_head(&mut buf, false);
        (r, buf.len())
    }

    fn head(wire: &[u8]) -> Head {
        match parse(wire) {
            (Ok(Some(Some(h))), 0) => h,
            (other, left) => panic!("{:?}, {left} left", other.map(|o| o.map(|h| h.is_some()))),
        }
    }

    #[test]
    fn heads() {
        let h =
            head(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(h.status, 200);
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));
        assert!(h.reusable);
        assert_eq!(h.headers["content-type"], "text/event-stream");

        // Transfer-Encoding wins over Content-Length, which is dropped.
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));
        assert!(!h.headers.contains_key("content-length"));

        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\nconnection: close\r\n\r\n");
        assert_eq!(h.decoder, Decoder::Length(12));
        assert!(!h.reusable);

        // No framing: read until close, never reused. HTTP/1.0 closes unless asked not to.
        assert_eq!(head(b"HTTP/1.1 200 OK\r\n\r\n").decoder, Decoder::Eof);
        assert!(!head(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").reusable);
        assert!(head(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\n").reusable);
        assert_eq!(head(b"HTTP/1.1 204 No Content\r\n\r\n").decoder, Decoder::Length(0));
        // A transfer coding that does not end in chunked: delimited by the close.
        let h = head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 3\r\n\r\n");
        assert_eq!((h.decoder, h.reusable), (Decoder::Eof, false));

        // Interim responses are skipped; incomplete heads wait; bad ones are errors.
        assert!(matches!(parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1"), (Ok(Some(None)), 8)));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\ncontent-le"), (Ok(None), 27)));
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n").0.is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n").0.is_err());
        assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").0.is_err());
        // The body after the head stays in the buffer; the values are the head's bytes.
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nx-request-id: abc \r\nserver: s\r\ncontent-length: 4\r\n\r\nbody"[..],
        );
        let Ok(Some(Some(h))) = parse_head(&mut buf, false) else { panic!() };
        assert_eq!(&buf[..], b"body");
        assert_eq!(
            (h.headers["x-request-id"].as_bytes(), h.headers["server"].as_bytes()),
            (&b"abc"[..], &b"s"[..])
        );
        assert_eq!(h.decoder, Decoder::Length(4));
    }

    fn post<'a>(
        authority: &'a Arc<str>,
        target: &'a str,
        headers: &'a HeaderMap,
        body: &'a Bytes,
    ) -> Request<'a> {
        Request {
            authority,
            method: &http::Method::POST,
            target,
            headers,
            body,
            connect_timeout: Duration::from_secs(2),
        }
    }

    #[test]
    fn request_encoding() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("expect", HeaderValue::from_static("100-continue"));
        let authority: Arc<str> = Arc::from("10.0.0.1:8000");
        let body = Bytes::from_static(b"{}");
        let wire = encode(&post(&authority, "/v1/chat/completions", &headers, &body));
        assert_eq!(
            std::str::from_utf8(&wire).unwrap(),
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 10.0.0.1:8000\r\ncontent-type: application/json\r\n\
             content-length: 2\r\n\r\n{}"
        );
        headers.insert("host", HeaderValue::from_static("models.internal"));
        let wire = encode(&post(&authority, "/v1/chat/completions", &headers, &body));
        assert!(wire.starts_with(b"POST /v1/chat/completions HTTP/1.1\r\nhost: models.internal\r\n"));
        assert_eq!(wire.windows(5).filter(|w| w.eq_ignore_ascii_case(b"host:")).count(), 1);
    }

    /// A raw upstream: answers each request on a connection with `answer`, counting
    /// connections; closes a connection after `per_conn` answers.
    async fn upstream(
        answer: &'static [u8],
        per_conn: usize,
    ) -> (Arc<str>, Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: Arc<str> = Arc::from(l.local_addr().unwrap().to_string());
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    for _ in 0..per_conn {
                        let mut req = Vec::new();
                        let mut b = [0u8; 4096];
                        while !req.ends_with(b"\r\n\r\n{}") {
                            match s.read(&mut b).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => req.extend_from_slice(&b[..n]),
                            }
                        }
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, conns)
    }

    async fn get(client: &Arc<DirectClient>, authority: &Arc<str>) -> Result<(StatusCode, Vec<u8>), String> {
        use http_body_util::BodyExt;
        let headers = HeaderMap::new();
        let body = Bytes::from_static(b"{}");
        let r = client
            .send(post(authority, "/v1/completions", &headers, &body))
            .await
            .map_err(|e| e.to_string())?;
        let status = r.status();
        let body = r.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, body.to_vec()))
    }

    const SSE: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
        f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

    #[tokio::test]
    async fn keep_alive_connections_are_reused() {
        let (addr, conns) = upstream(SSE, 100).await;
        let client = DirectClient::new(8, Duration::from_secs(60));
        for _ in 0..5 {
            let (status, body) = get(&client, &addr).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(body, b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced() {
        // One answer per connection, then the server closes it: the next request finds the
        // pooled connection closed (or races the close) and is sent on a new one.
        let (addr, conns) = upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 1).await;
        let client = DirectClient::new(8, Duration::from_secs(60));
        for _ in 0..4 {
            assert_eq!(get(&client, &addr).await.unwrap(), (StatusCode::OK, b"ok".to_vec()));
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn the_sweep_closes_what_the_server_closed() {
        let (addr, _) = upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 1).await;
        let client = DirectClient::new(8, Duration::from_secs(60));
        get(&client, &addr).await.unwrap();
        let pooled = || client.idle.lock().unwrap().get(&addr).map_or(0, Vec::len);
        assert_eq!(pooled(), 1);
        // The server's FIN reaches the idle socket; the sweep sees it without a request.
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.sweep();
        assert_eq!(pooled(), 0);
    }

    #[tokio::test]
    async fn truncated_bodies_and_bad_heads_are_errors() {
        let (addr, _) =
            upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nshort", 1).await;
        let client = DirectClient::new(8, Duration::from_secs(60));
        // The server closes after 5 of 10 bytes.
        let err = get(&client, &addr).await.unwrap_err();
        assert!(err.contains("inside the body"), "{err}");
        let (addr, _) = upstream(b"garbage\r\n\r\n", 1).await;
        let err = get(&client, &addr).await.unwrap_err();
        assert!(err.contains("invalid response head"), "{err}");
        let closed = Arc::from("127.0.0.1:1");
        assert!(matches!(
            client.send(post(&closed, "/", &HeaderMap::new(), &Bytes::new())).await,
            Err(DirectError::Connect(_))
        ));
    }
}
