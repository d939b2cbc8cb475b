//! goodput's own HTTP/1.1 server loop, for the requests that make up an LLM server's traffic:
//! chat and completions POSTs over HTTP/1.1 with a Content-Length body.
//!
//! Why: hyper's server spent about 10,000 instructions per request and 3,000 per SSE event in
//! its dispatcher, its body channel and its encoder (callgrind, BENCHMARKS.md); that was most of
//! what goodput did beyond nginx. Here the head is parsed by `httparse` (hyper's own parser),
//! the body is read into memory (the proxy reads metered bodies whole anyway), and each frame
//! the response body yields goes out with its chunk framing in the same write.
//!
//! Anything else hands the connection, with every byte read and not yet used, to hyper's
//! server for the rest of its life (`goodput_server_handoffs_total{reason}`): h2c, another
//! method or path, HTTP/1.0, chunked or `Expect: 100-continue` bodies, upgrades, several
//! Content-Lengths, a body over the limit (hyper answers 413), a head that is malformed or too
//! large (400, 431). So every answer that needs HTTP's corners comes from hyper, and this loop
//! only has to be right about the plain case.
//!
//! What it keeps from hyper's server: keep-alive and pipelining (answers in order), the head
//! read timeout (which also bounds an idle keep-alive connection), a client that closes or
//! half-closes its side is gone (its request is dropped, which cancels the upstream call),
//! backpressure (the body is not polled while the client's socket is full), graceful drain
//! (idle connections close; a request in flight finishes with `connection: close`).

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::Either;
use hyper::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use smallvec::SmallVec;
use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;

use super::direct::{poll_read_some, push_decimal};
use super::{ClientBody, Proxy, ProxyBody};
use crate::openai::Operation;

/// Most request headers (hyper's default).
const MAX_HEADERS: usize = 100;
/// Read size for the client socket.
const READ: usize = 8 * 1024;
/// While a request is in flight, pipelined bytes are read up to this much (so that a close is
/// seen); past it the socket is left alone until the answers catch up.
const MAX_PIPELINED: usize = 64 * 1024;
/// Data at least this long is written from its own buffer instead of being copied.
const BIG: usize = 16 * 1024;
/// Output queued past this stops taking frames from the body until it is written.
const MAX_QUEUED: usize = 64 * 1024;

/// What every connection of one listener shares.
pub struct Front {
    pub proxy: Arc<Proxy>,
    /// hyper's server, for the connections handed over.
    pub hyper: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    pub header_timeout: Duration,
    /// Largest request head (limits.max_header_bytes); a longer one goes to hyper for its 431.
    pub max_head: usize,
    /// Turns true when the listener drains.
    pub drain: watch::Receiver<bool>,
}

/// Serve one client connection until it closes, is handed to hyper, or drains. `watcher`
/// keeps the connection counted by the listener's graceful shutdown.
pub async fn serve_connection(front: Arc<Front>, stream: TcpStream, remote: SocketAddr, watcher: Watcher) {
    let mut c = Conn { stream, rbuf: BytesMut::with_capacity(READ), out: Out::default() };
    let mut drain = front.drain.clone();
    let timer = tokio::time::sleep(front.header_timeout);
    tokio::pin!(timer);
    loop {
        if *drain.borrow() {
            return c.close().await;
        }
        timer.as_mut().reset(tokio::time::Instant::now() + front.header_timeout);
        let limit = front.proxy.config.load().config.limits.max_body_bytes;
        let (parts, len, close) = match c.read_head(&front, limit, timer.as_mut(), &mut drain).await {
            Next::Fast(parts, len, close) => (parts, len, close),
            Next::Close => return,
            Next::TimedOut => return c.timed_out().await,
            Next::HandOff(reason) => {
                front.proxy.metrics.handoffs.with_label_values(&[reason]).inc();
                return c.hand_off(&front, remote, watcher).await;
            }
        };
        let Some(body) = c.read_body(len).await else { return };
        let req = Request::from_parts(parts, ClientBody::Read(body));
        let answer = front.proxy.clone().handle(req, Some(remote));
        tokio::pin!(answer);
        let resp = poll_fn(|cx| {
            if let Poll::Ready(r) = answer.as_mut().poll(cx) {
                return Poll::Ready(Some(r));
            }
            // A client that left: dropping the request cancels the upstream call.
            if c.client_gone(cx) { Poll::Ready(None) } else { Poll::Pending }
        })
        .await;
        let Some(resp) = resp else { return };
        let close = close || *drain.borrow();
        if !c.respond(resp, close).await || close {
            return c.close().await;
        }
    }
}

// Returned once per request and taken apart at once; a Box would be an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// A request for this loop: its head, its body's length, and whether the client asked to
    /// close after it.
    Fast(http::request::Parts, usize, bool),
    HandOff(&'static str),
    TimedOut,
    Close,
}

struct Conn {
    stream: TcpStream,
    /// Bytes read from the client and not yet used (the next head, pipelined requests).
    rbuf: BytesMut,
    out: Out,
}

impl Conn {
    async fn read_head(
        &mut self,
        front: &Front,
        limit: u64,
        mut timer: Pin<&mut Sleep>,
        drain: &mut watch::Receiver<bool>,
    ) -> Next {
        let changed = drain.changed();
        tokio::pin!(changed);
        poll_fn(|cx| {
            loop {
                if !self.rbuf.is_empty() {
                    match parse(&mut self.rbuf, limit) {
                        Parsed::Partial if self.rbuf.len() >= front.max_head => {
                            return Poll::Ready(Next::HandOff("too_large"));
                        }
                        Parsed::Partial => {}
                        Parsed::HandOff(reason) => return Poll::Ready(Next::HandOff(reason)),
                        Parsed::Fast(parts, len, close) => return Poll::Ready(Next::Fast(parts, len, close)),
                    }
                }
                match poll_read_some(&mut self.stream, &mut self.rbuf, READ, cx) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Next::Close),
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Pending => {}
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Next::TimedOut);
                }
                // Draining: a connection between requests closes now.
                if self.rbuf.is_empty() && changed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Next::Close);
                }
                return Poll::Pending;
            }
        })
        .await
    }

    async fn read_body(&mut self, len: usize) -> Option<Bytes> {
        if self.rbuf.len() < len {
            // Room for what is declared, up to 1 MiB at once: a client that declares 32 MiB
            // and sends nothing is not given 32 MiB. Past that the buffer grows as bytes come.
            self.rbuf.reserve((len - self.rbuf.len()).min(1 << 20));
            while self.rbuf.len() < len {
                match poll_fn(|cx| poll_read_some(&mut self.stream, &mut self.rbuf, READ, cx)).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        }
        Some(self.rbuf.split_to(len).freeze())
    }

    /// Whether the client has closed (or half-closed) its side. Reads what it pipelines in
    /// the meantime, up to MAX_PIPELINED.
    fn client_gone(&mut self, cx: &mut Context<'_>) -> bool {
        while self.rbuf.len() < MAX_PIPELINED {
            match poll_read_some(&mut self.stream, &mut self.rbuf, READ, cx) {
                Poll::Ready(Ok(0) | Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        false
    }

    /// Write the answer; true when the connection can carry the next request.
    async fn respond(&mut self, resp: Response<ProxyBody>, close: bool) -> bool {
        let (parts, mut body) = resp.into_parts();
        self.out.clear();
        let mut framing = encode_head(&mut self.out.buf, &parts, &body, close);
        poll_fn(|cx| self.drive(&mut body, &mut framing, cx)).await
    }

    /// Move frames from the body to the client: every frame ready is queued (a burst of
    /// events goes out in one write), then the queue is written. The body is not polled while
    /// the queue is full and the client's socket is not writable: backpressure, as in hyper.
    fn drive(&mut self, body: &mut ProxyBody, framing: &mut Framing, cx: &mut Context<'_>) -> Poll<bool> {
        loop {
            let mut waiting = false;
            while !framing.done() && self.out.has_room() {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        // Trailers are not forwarded (as hyper, unless the client asked).
                        if let Ok(data) = frame.into_data() {
                            framing.data(data, &mut self.out);
                        }
                        // A body with a known length may not be polled past its end.
                        if !framing.done() && body.is_end_stream() {
                            framing.end(&mut self.out);
                        }
                    }
                    // What did arrive still goes out; the connection then closes without the
                    // chunked terminator, so the client sees the cut.
                    Poll::Ready(Some(Err(_))) => framing.fail(),
                    Poll::Ready(None) => framing.end(&mut self.out),
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                }
            }
            if !self.out.is_empty() {
                let written = self.out.poll_write(&mut self.stream, cx);
                // The last bytes are with the kernel (or waiting for the client): now the
                // record of a finished response is filed.
                if let Either::Left(b) = body {
                    b.settle();
                }
                match written {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return Poll::Ready(false),
                    Poll::Pending => {
                        return if self.client_gone(cx) { Poll::Ready(false) } else { Poll::Pending };
                    }
                }
            }
            if framing.done() {
                return Poll::Ready(framing.ok());
            }
            if waiting {
                return if self.client_gone(cx) { Poll::Ready(false) } else { Poll::Pending };
            }
        }
    }

    /// hyper serves the rest of the connection, starting with the bytes read and not used.
    async fn hand_off(self, front: &Front, remote: SocketAddr, watcher: Watcher) {
        let io = Prefixed { prefix: self.rbuf.freeze(), stream: self.stream };
        serve_with_hyper(front, io, remote, watcher).await;
    }

    /// A head that did not arrive within limits.header_read_timeout_ms: 408 if part of one
    /// came (as hyper answers), then close.
    async fn timed_out(mut self) {
        if !self.rbuf.is_empty() {
            let _ = self
                .stream
                .write_all(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
        }
        self.close().await;
    }

    async fn close(mut self) {
        // shutdown(2) of the write side: it does not wait for the client.
        let _ = self.stream.shutdown().await;
    }
}

/// A whole connection served by hyper's server (HTTP/1.1 or h2c), from its first byte: where
/// the own loop hands one over, and every connection with `server.direct: false`.
pub async fn serve_with_hyper<I>(front: &Front, io: I, remote: SocketAddr, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let proxy = front.proxy.clone();
    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(proxy.handle(req.map(ClientBody::Hyper), Some(remote)).await) }
    });
    let conn = front.hyper.serve_connection(TokioIo::new(io), svc).into_owned();
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[allow(clippy::large_enum_variant)]
enum Parsed {
    Partial,
    HandOff(&'static str),
    Fast(http::request::Parts, usize, bool),
}

/// `parse` for the fuzz target (fuzz/fuzz_targets/http1_request.rs): `None` while the head is
/// incomplete, `Err(reason)` for a hand-off (with `buf` untouched), else the head, the body's
/// length and whether the client asked to close.
#[doc(hidden)]
pub fn decide(
    buf: &mut BytesMut,
    limit: u64,
) -> Option<Result<(http::request::Parts, usize, bool), &'static str>> {
    match parse(buf, limit) {
        Parsed::Partial => None,
        Parsed::HandOff(r) => Some(Err(r)),
        Parsed::Fast(p, len, close) => Some(Ok((p, len, close))),
    }
}

/// Parse a request head at the start of `buf`. A request this loop serves is taken out of
/// `buf`; anything else is left there whole, for hyper.
fn parse(buf: &mut BytesMut, limit: u64) -> Parsed {
    const H2: &[u8] = b"PRI * HTTP/2.0";
    if buf.starts_with(H2) {
        return Parsed::HandOff("h2c");
    }
    if H2.starts_with(buf) {
        return Parsed::Partial;
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Request::new(&mut slots);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::HandOff("too_large"),
        Err(_) => return Parsed::HandOff("invalid"),
    };
    if r.version != Some(1) {
        return Parsed::HandOff("not_http11");
    }
    let path = r.path.unwrap_or("");
    let bare = path.split_once('?').map_or(path, |(p, _)| p);
    if r.method != Some("POST") || !path.starts_with('/') || Operation::from_path(bare).is_none() {
        return Parsed::HandOff("not_metered");
    }
    // Names, and where the target and each value lie in the head (httparse's slices are of
    // `buf`), so that the values can share the head's bytes.
    let base = buf.as_ptr() as usize;
    let target = (path.as_ptr() as usize - base, path.len());
    let mut found: SmallVec<[(HeaderName, usize, usize); 24]> = SmallVec::new();
    let mut length: Option<u64> = None;
    let mut close = false;
    for h in r.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else { return Parsed::HandOff("invalid") };
        if name == TRANSFER_ENCODING || name == EXPECT || name == UPGRADE {
            return Parsed::HandOff("framing");
        }
        if name == CONTENT_LENGTH {
            let v = h.value;
            if length.is_some() {
                return Parsed::HandOff("framing");
            }
            if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                return Parsed::HandOff("invalid");
            }
            length = Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')));
        } else if name == CONNECTION {
            close |= h.value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
        let at = h.value.as_ptr() as usize - base;
        found.push((name, at, at + h.value.len()));
    }
    let len = length.unwrap_or(0);
    if len > limit {
        return Parsed::HandOff("too_large");
    }
    let Ok(len) = usize::try_from(len) else { return Parsed::HandOff("too_large") };
    let mut headers = HeaderMap::with_capacity(found.len());
    let head = buf.split_to(n).freeze();
    let built = (|| {
        let uri = Uri::from_maybe_shared(head.slice(target.0..target.0 + target.1)).ok()?;
        for (name, from, to) in found {
            headers.append(name, HeaderValue::from_maybe_shared(head.slice(from..to)).ok()?);
        }
        Some(uri)
    })();
    let Some(uri) = built else {
        // Back in front of the rest, whole, for hyper's 400.
        let mut whole = BytesMut::with_capacity(head.len() + buf.len());
        whole.extend_from_slice(&head);
        whole.extend_from_slice(buf);
        *buf = whole;
        return Parsed::HandOff("invalid");
    };
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = Method::POST;
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    parts.headers = headers;
    Parsed::Fast(parts, len, close)
}

/// How the response body is delimited on the wire, and how far it has got.
#[derive(Debug, PartialEq)]
enum Framing {
    /// Content-Length: the bytes still to send.
    Length(u64),
    Chunked,
    /// 204 and 304: no body.
    Empty,
    /// Sent whole (`true`) or cut short.
    Done(bool),
}

impl Framing {
    fn done(&self) -> bool {
        matches!(self, Framing::Done(_))
    }

    fn ok(&self) -> bool {
        matches!(self, Framing::Done(true))
    }

    fn fail(&mut self) {
        *self = Framing::Done(false);
    }

    fn data(&mut self, mut data: Bytes, out: &mut Out) {
        match self {
            Framing::Length(left) => {
                // More than the length said: send what it said, then close.
                let over = data.len() as u64 > *left;
                if over {
                    data.truncate(*left as usize);
                }
                *left -= data.len() as u64;
                out.put(data);
                if over {
                    self.fail();
                } else if *left == 0 {
                    *self = Framing::Done(true);
                }
            }
            Framing::Chunked if data.is_empty() => {}
            Framing::Chunked => {
                let mut line = [0u8; 18];
                let n = hex_line(&mut line, data.len());
                out.push(&line[..n]);
                out.put(data);
                out.push(b"\r\n");
            }
            Framing::Empty | Framing::Done(_) => {}
        }
    }

    fn end(&mut self, out: &mut Out) {
        *self = match self {
            Framing::Chunked => {
                out.push(b"0\r\n\r\n");
                Framing::Done(true)
            }
            Framing::Length(left) => Framing::Done(*left == 0),
            Framing::Empty => Framing::Done(true),
            Framing::Done(ok) => Framing::Done(*ok),
        };
    }
}

/// `{n:x}\r\n` into `line`; returns its length.
fn hex_line(line: &mut [u8; 18], mut n: usize) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = HEX[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - i;
    line[..len].copy_from_slice(&digits[i..]);
    line[len..len + 2].copy_from_slice(b"\r\n");
    len + 2
}

/// The status line and headers, as hyper's server writes them: the framing is the
/// response's Content-Length when it has one, else the body's exact size when it is known,
/// else chunked; a `date` when the response has none.
fn encode_head(w: &mut Vec<u8>, parts: &http::response::Parts, body: &ProxyBody, close: bool) -> Framing {
    let status = parts.status;
    w.extend_from_slice(b"HTTP/1.1 ");
    w.extend_from_slice(status.as_str().as_bytes());
    w.push(b' ');
    w.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    w.extend_from_slice(b"\r\n");
    let bodiless = status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED;
    let mut framing = None;
    for (k, v) in &parts.headers {
        if k == TRANSFER_ENCODING || k == CONNECTION {
            continue;
        }
        if k == CONTENT_LENGTH {
            if bodiless {
                // A 304 may carry the length of what it stands for; the others none.
                if status != http::StatusCode::NOT_MODIFIED {
                    continue;
                }
            } else {
                // The first valid one frames the body; others (and invalid ones) are dropped.
                match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
                    Some(n) if framing.is_none() => framing = Some(Framing::Length(n)),
                    _ => continue,
                }
            }
        }
        w.extend_from_slice(k.as_str().as_bytes());
        w.extend_from_slice(b": ");
        w.extend_from_slice(v.as_bytes());
        w.extend_from_slice(b"\r\n");
    }
    let framing = match framing {
        _ if bodiless => Framing::Empty,
        Some(f) => f,
        None => match body.size_hint().exact() {
            Some(n) => {
                w.extend_from_slice(b"content-length: ");
                push_decimal(w, n);
                w.extend_from_slice(b"\r\n");
                Framing::Length(n)
            }
            None => {
                w.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
        },
    };
    if !parts.headers.contains_key(DATE) {
        w.extend_from_slice(b"date: ");
        push_date(w);
        w.extend_from_slice(b"\r\n");
    }
    if close {
        w.extend_from_slice(b"connection: close\r\n");
    }
    w.extend_from_slice(b"\r\n");
    match framing {
        Framing::Length(0) => Framing::Done(true),
        f => f,
    }
}

/// The current time as an HTTP date, formatted once a second per thread.
fn push_date(w: &mut Vec<u8>) {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        w.extend_from_slice(c.1.as_bytes());
    });
}

/// Bytes waiting to be written to the client: small pieces copied into `buf`; one large
/// piece at a time kept as it is (`big`, written after `buf` with one vectored write), with
/// what follows it in `after`.
#[derive(Default)]
struct Out {
    buf: Vec<u8>,
    at: usize,
    big: Option<Bytes>,
    after: Vec<u8>,
}

impl Out {
    fn clear(&mut self) {
        self.buf.clear();
        self.at = 0;
        self.big = None;
        self.after.clear();
    }

    fn is_empty(&self) -> bool {
        self.at == self.buf.len() && self.big.is_none()
    }

    fn has_room(&self) -> bool {
        self.big.is_none() && self.buf.len() - self.at < MAX_QUEUED
    }

    fn push(&mut self, b: &[u8]) {
        if self.big.is_some() { self.after.extend_from_slice(b) } else { self.buf.extend_from_slice(b) }
    }

    fn put(&mut self, data: Bytes) {
        if data.len() >= BIG && self.big.is_none() {
            self.big = Some(data);
        } else {
            self.push(&data);
        }
    }

    fn advance(&mut self, mut n: usize) {
        let front = self.buf.len() - self.at;
        let step = n.min(front);
        self.at += step;
        n -= step;
        if let Some(big) = &mut self.big {
            big.advance(n.min(big.len()));
            if big.is_empty() {
                self.big = None;
                self.buf.clear();
                self.at = 0;
                std::mem::swap(&mut self.buf, &mut self.after);
            }
        }
        if self.at == self.buf.len() && self.big.is_none() {
            self.buf.clear();
            self.at = 0;
        }
    }

    fn poll_write(&mut self, s: &mut TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            let front = &self.buf[self.at..];
            let n = match &self.big {
                Some(big) if front.is_empty() => ready!(Pin::new(&mut *s).poll_write(cx, big))?,
                Some(big) => {
                    let bufs = [IoSlice::new(front), IoSlice::new(big)];
                    ready!(Pin::new(&mut *s).poll_write_vectored(cx, &bufs))?
                }
                None => ready!(Pin::new(&mut *s).poll_write(cx, front))?,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

/// The client's socket with the bytes already read from it in front, for hyper.
struct Prefixed {
    prefix: Bytes,
    stream: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Either, Full};

    const CHAT: &[u8] = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\
        Content-Type: application/json\r\nContent-Length: 5\r\n\r\nhello";

    fn fast(wire: &[u8]) -> (http::request::Parts, usize, bool, BytesMut) {
        let mut buf = BytesMut::from(wire);
        match parse(&mut buf, 1 << 20) {
            Parsed::Fast(p, len, close) => (p, len, close, buf),
            Parsed::Partial => panic!("partial: {:?}", String::from_utf8_lossy(wire)),
            Parsed::HandOff(r) => panic!("handed off ({r}): {:?}", String::from_utf8_lossy(wire)),
        }
    }

    fn handed_off(wire: &[u8], limit: u64) -> &'static str {
        let mut buf = BytesMut::from(wire);
        match parse(&mut buf, limit) {
            Parsed::HandOff(r) => {
                assert_eq!(&buf[..], wire, "a connection handed off keeps every byte for hyper");
                r
            }
            _ => panic!("not handed off: {:?}", String::from_utf8_lossy(wire)),
        }
    }

    #[test]
    fn plain_requests_are_served_here() {
        let (p, len, close, rest) = fast(CHAT);
        assert_eq!(p.method, Method::POST);
        assert_eq!(p.version, Version::HTTP_11);
        assert_eq!(p.uri.path(), "/v1/chat/completions");
        assert_eq!(p.uri.query(), Some("x=1"));
        let xa: Vec<_> = p.headers.get_all("x-a").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(xa, ["1", "2"]);
        assert_eq!(p.headers["host"], "h");
        assert_eq!(p.headers.len(), 5);
        assert_eq!((len, close), (5, false));
        assert_eq!(&rest[..], b"hello", "the body stays for read_body");
        let (_, len, close, _) =
            fast(b"POST /v1/completions HTTP/1.1\r\nconnection: keep-alive, Close\r\n\r\n");
        assert_eq!((len, close), (0, true));
    }

    #[test]
    fn a_head_in_any_number_of_pieces_then_the_next_one() {
        let two = [CHAT, CHAT].concat();
        for cut in 1..CHAT.len() - 5 {
            let mut buf = BytesMut::from(&two[..cut]);
            assert!(matches!(parse(&mut buf, 1 << 20), Parsed::Partial), "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
        let (_, len, _, mut rest) = fast(&two);
        let _ = rest.split_to(len);
        let (p, _, _, _) = fast(&rest);
        assert_eq!(p.uri.path(), "/v1/chat/completions");
    }

    #[test]
    fn everything_else_goes_to_hyper_untouched() {
        let cases: &[(&[u8], &str)] = &[
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "h2c"),
            (b"GET /v1/models HTTP/1.1\r\n\r\n", "not_metered"),
            (b"POST /v1/embeddings HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}", "not_metered"),
            (b"POST http://h/v1/chat/completions HTTP/1.1\r\n\r\n", "not_metered"),
            (b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}", "not_http11"),
            (b"POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", "framing"),
            (
                b"POST /v1/chat/completions HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
                "framing",
            ),
            (b"POST /v1/chat/completions HTTP/1.1\r\nupgrade: h2c\r\n\r\n", "framing"),
            (
                b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n{}",
                "framing",
            ),
            (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: +2\r\n\r\n{}", "invalid"),
            (
                b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
                "invalid",
            ),
            (b"POST /v1/chat/completions HTTP/1.1\r\nbad header\r\n\r\n", "invalid"),
            (b"POST /v1/chat/completions HTTP/1.1\r\nx: \x7f\r\n\r\n", "invalid"),
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "invalid"),
        ];
        for (wire, reason) in cases {
            assert_eq!(handed_off(wire, 1 << 20), *reason, "{:?}", String::from_utf8_lossy(wire));
        }
        assert_eq!(handed_off(CHAT, 4), "too_large");
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("x-{i}: 1\r\n")).collect();
        let wire = format!("POST /v1/chat/completions HTTP/1.1\r\n{many}\r\n");
        assert_eq!(handed_off(wire.as_bytes(), 1 << 20), "too_large");
    }

    #[test]
    fn mutated_heads_never_panic_and_fast_ones_reparse_the_same() {
        // Single-byte changes and truncations of a plain head: whatever parse decides, it
        // never panics, and a head it serves itself is one httparse reads the same way.
        for i in 0..CHAT.len() {
            for b in [b'\r', b'\n', b':', b' ', b'0', b'x', 0x80, 0] {
                let mut wire = CHAT.to_vec();
                wire[i] = b;
                let mut buf = BytesMut::from(&wire[..]);
                if let Parsed::Fast(p, len, _) = parse(&mut buf, 1 << 20) {
                    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let mut r = httparse::Request::new(&mut slots);
                    assert!(r.parse(&wire).unwrap().is_complete());
                    assert_eq!(r.path, Some(p.uri.to_string().as_str()));
                    let declared = r.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length"));
                    let declared =
                        declared.map_or(0, |h| std::str::from_utf8(h.value).unwrap().parse().unwrap());
                    assert_eq!(len, declared);
                    assert_eq!(p.headers.len(), r.headers.len());
                }
            }
        }
    }

    fn head(status: u16, headers: &[(&str, &str)], body: ProxyBody, close: bool) -> (String, Framing) {
        let mut r = Response::new(body);
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            r.headers_mut()
                .append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        let (parts, body) = r.into_parts();
        let mut w = Vec::new();
        let f = encode_head(&mut w, &parts, &body, close);
        (String::from_utf8(w).unwrap(), f)
    }

    fn full(s: &'static str) -> ProxyBody {
        Either::Right(Full::new(Bytes::from_static(s.as_bytes())))
    }

    #[test]
    fn heads_are_framed_as_hyper_frames_them() {
        let date = ("date", "Tue, 01 Dec 2026 00:00:00 GMT");
        let (h, f) = head(
            200,
            &[("content-type", "application/json"), ("content-length", "2"), date],
            full("{}"),
            false,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\
             date: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\n"
        );
        assert_eq!(f, Framing::Length(2));
        // No length header: the body's exact size; a date is added; close is said.
        let (h, f) = head(502, &[], full("oops"), true);
        assert!(h.starts_with("HTTP/1.1 502 Bad Gateway\r\ncontent-length: 4\r\ndate: "), "{h}");
        assert!(h.ends_with(" GMT\r\nconnection: close\r\n\r\n"), "{h}");
        assert_eq!(f, Framing::Length(4));
        let (h, f) = head(200, &[("content-length", "0")], full(""), false);
        assert!(h.contains("content-length: 0\r\n"));
        assert_eq!(f, Framing::Done(true));
        // Hop-by-hop framing from elsewhere is not repeated; an invalid length is dropped.
        let (h, _) =
            head(200, &[("content-length", "x"), ("transfer-encoding", "chunked"), date], full("ab"), false);
        assert_eq!(h, "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\ncontent-length: 2\r\n\r\n");
        let (h, f) = head(204, &[("content-length", "3"), date], full(""), false);
        assert_eq!(h, "HTTP/1.1 204 No Content\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\n");
        assert_eq!(f, Framing::Empty);
        let (h, _) = head(599, &[date], full(""), false);
        assert!(h.starts_with("HTTP/1.1 599 <none>\r\n"), "{h}");
    }

    /// Everything `out` holds, as it would be written.
    fn drain_out(out: &mut Out) -> Vec<u8> {
        let mut w = Vec::new();
        while !out.is_empty() {
            // Odd-sized writes, as a busy socket takes them.
            let front = &out.buf[out.at..];
            let n = if !front.is_empty() {
                let n = front.len().min(7);
                w.extend_from_slice(&front[..n]);
                n
            } else {
                let big = out.big.as_ref().unwrap();
                let n = big.len().min(5000);
                w.extend_from_slice(&big[..n]);
                n
            };
            out.advance(n);
        }
        w
    }

    #[test]
    fn chunked_and_length_bodies_encode_exactly() {
        let big: Bytes = (0..40_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
        let mut out = Out::default();
        let mut f = Framing::Chunked;
        f.data(Bytes::from_static(b"data: a\n\n"), &mut out);
        f.data(Bytes::new(), &mut out);
        f.data(big.clone(), &mut out);
        assert!(!out.has_room(), "a large piece stops the intake until it is written");
        f.data(Bytes::from_static(b"z"), &mut out);
        f.end(&mut out);
        let mut want = b"9\r\ndata: a\n\n\r\n9c40\r\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"\r\n1\r\nz\r\n0\r\n\r\n");
        assert_eq!(drain_out(&mut out), want);
        assert!(f.ok());
        assert!(out.has_room());

        let mut f = Framing::Length(6);
        f.data(Bytes::from_static(b"abc"), &mut out);
        assert_eq!(f, Framing::Length(3));
        f.data(Bytes::from_static(b"defg"), &mut out);
        assert_eq!(f, Framing::Done(false), "more than the length said closes the connection");
        assert_eq!(drain_out(&mut out), b"abcdef");
        let mut f = Framing::Length(6);
        f.data(Bytes::from_static(b"abc"), &mut out);
        f.end(&mut out);
        assert_eq!(f, Framing::Done(false), "less than the length said closes it too");
    }

    #[test]
    fn hex_lines() {
        for n in [0usize, 1, 9, 10, 15, 16, 255, 4096, 0x9c40, usize::MAX] {
            let mut line = [0u8; 18];
            let len = hex_line(&mut line, n);
            assert_eq!(&line[..len], format!("{n:x}\r\n").as_bytes());
        }
    }
}
