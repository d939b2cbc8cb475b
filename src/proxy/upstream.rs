//! The upstream client: hyper's HTTP/1 connections (`hyper::client::conn::http1`), kept idle per
//! endpoint and driven in the task of the request that uses them.
//!
//! Why not hyper-util's pooled client: it spawns each connection as a task of its own, so a
//! request is handed to that task through a channel and written when tokio next runs it. Under
//! load, on one worker, that is behind every stream whose chunk is queued, and each streamed
//! chunk cost two task polls (the connection's, then the client's). Here the request's own task
//! writes the request and reads the answer: the request is written in the poll that built it,
//! and a chunk is read, metered and written to the client in one poll. hyper does all of the
//! HTTP; this module only keeps connections and decides which may be reused.
//!
//! A connection goes back to the idle list only when its answer was read to the end and hyper
//! says it can take another request; any other drop (the client left, an error, a timeout)
//! closes it, which is how the upstream learns that the client left. An idle connection is
//! reused only within `pool_idle` of its last answer and closed after it.

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tower_service::Service;

use super::UpstreamBody;
use super::error::{Error, Kind};
use crate::tls::{Connector, UpstreamIo};

/// Idle connections kept per endpoint, at most.
const MAX_IDLE_PER_ENDPOINT: usize = 1024;

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    h1: http1::Builder,
    pool_idle: Duration,
    connect_ms: u64,
    /// Most recently used last: a request takes the warmest connection. Boxed, since a
    /// connection (hyper's buffers and state) moves between this list and a request's body.
    #[allow(clippy::vec_box)]
    idle: Mutex<HashMap<Key, Vec<Box<Conn>>, ahash::RandomState>>,
    /// Whether the task that closes expired idle connections runs.
    sweeping: std::sync::atomic::AtomicBool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    https: bool,
    authority: Authority,
}

/// One upstream connection: hyper's handle to send on it and the connection itself, which
/// whoever uses it polls.
struct Conn {
    key: Key,
    tx: http1::SendRequest<UpstreamBody>,
    /// `None` once it has ended (closed or failed).
    conn: Option<http1::Connection<UpstreamIo, UpstreamBody>>,
    idle_since: Instant,
}

impl Conn {
    /// Let hyper do what it can (write, read, notice a close); false once the connection is gone.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(c) = &mut self.conn
            && Pin::new(c).poll(cx).is_ready()
        {
            self.conn = None;
        }
        self.conn.is_some()
    }

    /// Whether it can take a request now: still open, and hyper is waiting for one. A close the
    /// upstream sent while it was idle is read here.
    fn reusable(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop())) && self.tx.is_ready()
    }
}

impl Client {
    pub fn new(connector: Connector, pool_idle: Duration, connect_ms: u64) -> Client {
        Client {
            inner: Arc::new(Inner {
                connector,
                h1: http1::Builder::new(),
                pool_idle,
                connect_ms,
                idle: Mutex::new(HashMap::default()),
                sweeping: Default::default(),
            }),
        }
    }

    /// Send `req` (its URI absolute: the scheme and authority say where) and wait for the
    /// answer's head. The body of the answer drives the connection from then on.
    pub async fn send(&self, mut req: Request<UpstreamBody>) -> Result<Response<ResponseBody>, Error> {
        // hyper's connection writes the target as given: origin-form, as a server expects it.
        let target = req.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        let addr = std::mem::replace(req.uri_mut(), Uri::from(target));
        let (Some(scheme), Some(authority)) = (addr.scheme(), addr.authority()) else {
            return Err(Error::new(Kind::BadTarget, format!("not an absolute upstream URI: {addr}")));
        };
        let key = Key { https: *scheme == Scheme::HTTPS, authority: authority.clone() };
        if !req.headers().contains_key(header::HOST) {
            let host = HeaderValue::from_str(authority.as_str()).map_err(|e| {
                Error::new(Kind::BadTarget, "the upstream's authority is no Host value").with_source(e)
            })?;
            req.headers_mut().insert(header::HOST, host);
        }
        loop {
            let (mut conn, fresh) = match self.checkout(&key) {
                Some(c) => (c, false),
                None => (self.connect(key.clone(), addr.clone()).await?, true),
            };
            let answer = conn.tx.try_send_request(req);
            let mut answer = std::pin::pin!(answer);
            let got = poll_fn(|cx| {
                conn.drive(cx);
                answer.as_mut().poll(cx)
            })
            .await;
            match got {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let body = ResponseBody {
                        body,
                        conn: Some(conn),
                        pool: Arc::downgrade(&self.inner),
                        done: false,
                    };
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    // hyper had not begun to write it: the connection was closing (a pooled one
                    // the upstream had closed). Another connection may take it.
                    Some(back) if !fresh => req = back,
                    Some(_) => {
                        return Err(Error::new(Kind::UpstreamProtocol, "upstream connection closed at once")
                            .with_source(e.into_error()));
                    }
                    None => return Err(Error::from_send(e.into_error())),
                },
            }
        }
    }

    /// The warmest idle connection to `key` that can take a request; expired and closed ones
    /// met on the way are dropped (closed).
    fn checkout(&self, key: &Key) -> Option<Box<Conn>> {
        let now = Instant::now();
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(key)?;
        while let Some(mut c) = list.pop() {
            if now.duration_since(c.idle_since) < self.inner.pool_idle && c.reusable() {
                return Some(c);
            }
        }
        None
    }

    async fn connect(&self, key: Key, addr: Uri) -> Result<Box<Conn>, Error> {
        let mut connector = self.inner.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx)).await.map_err(|e| self.connect_error(e))?;
        let io = connector.call(addr).await.map_err(|e| self.connect_error(e))?;
        let (tx, conn) = self.inner.h1.handshake(io).await.map_err(|e| {
            Error::new(Kind::UpstreamConnect, "could not connect to the upstream").with_source(e)
        })?;
        Ok(Box::new(Conn { key, tx, conn: Some(conn), idle_since: Instant::now() }))
    }

    fn connect_error(&self, e: super::error::BoxError) -> Error {
        let timed_out = super::error::chain(&*e).any(|s| {
            s.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        });
        if timed_out {
            Error::new(
                Kind::UpstreamConnectTimeout,
                format!("could not connect to the upstream within {} ms", self.inner.connect_ms),
            )
            .with_source(e)
        } else {
            Error::new(Kind::UpstreamConnect, "could not connect to the upstream").with_source(e)
        }
    }
}

impl Inner {
    fn checkin(self: &Arc<Self>, mut conn: Box<Conn>) {
        if !conn.reusable() {
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry(conn.key.clone()).or_default();
        if list.len() < MAX_IDLE_PER_ENDPOINT {
            list.push(conn);
        }
        drop(idle);
        if !self.sweeping.swap(true, std::sync::atomic::Ordering::Relaxed)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(sweep(Arc::downgrade(self), self.pool_idle));
        }
    }
}

/// Close idle connections once they expire, so that none is held open past `pool_idle`
/// (checked every `pool_idle / 4`, at most every second); it ends with the client.
async fn sweep(pool: Weak<Inner>, pool_idle: Duration) {
    let every = (pool_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        // Closed outside the lock: dropping a connection shuts its socket down.
        let mut expired = Vec::new();
        {
            let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|_, list| {
                list.retain_mut(|c| {
                    let keep = now.duration_since(c.idle_since) < pool_idle && c.reusable();
                    if !keep {
                        expired.push(c.conn.take());
                    }
                    keep
                });
                !list.is_empty()
            });
        }
        drop(expired);
    }
}

/// The answer's body, which drives its connection: each poll lets hyper read from the upstream,
/// then takes what it decoded. Read to the end, the connection goes back to the idle list;
/// dropped before that, it is closed.
pub struct ResponseBody {
    body: Incoming,
    conn: Option<Box<Conn>>,
    pool: Weak<Inner>,
    done: bool,
}

impl Body for ResponseBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Some(c) = &mut this.conn {
            c.drive(cx);
        }
        let r = Pin::new(&mut this.body).poll_frame(cx);
        match &r {
            Poll::Ready(None) => this.done = true,
            Poll::Ready(Some(Ok(_))) => this.done = this.body.is_end_stream(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // A body with a known length may end without a last poll (hyper stops at its length).
        if (self.done || self.body.is_end_stream())
            && let (Some(conn), Some(pool)) = (self.conn.take(), self.pool.upgrade())
        {
            pool.checkin(conn);
        }
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("upstream::ResponseBody").field("done", &self.done).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("upstream::Client").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Either, Full};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// What an upstream saw: connections accepted, and each request's head as it came.
    #[derive(Default)]
    struct Seen {
        connections: AtomicUsize,
        heads: Mutex<Vec<String>>,
    }

    /// An upstream that answers each request on a connection with what `answer` returns for
    /// the connection's n-th request (`None`: close without answering), and closes a
    /// connection once it has answered `close_after` requests.
    async fn upstream(
        answer: fn(usize) -> Option<&'static str>,
        close_after: usize,
    ) -> (std::net::SocketAddr, Arc<Seen>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                s.connections.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let mut n = 0;
                    while let Some(head) = read_head(&mut c).await {
                        s.heads.lock().unwrap().push(head);
                        let Some(a) = answer(n) else { return };
                        if c.write_all(a.as_bytes()).await.is_err() {
                            return;
                        }
                        n += 1;
                        if n == close_after {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn read_head(c: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if c.read(&mut b).await.ok()? == 0 {
                return None;
            }
            head.push(b[0]);
        }
        Some(String::from_utf8(head).unwrap())
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    fn client(pool_idle: Duration) -> Client {
        Client::new(crate::tls::connector(&[], Duration::from_secs(1)).unwrap(), pool_idle, 1000)
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> Request<UpstreamBody> {
        Request::get(format!("http://{addr}{path}")).body(Either::Left(Full::new(Bytes::new()))).unwrap()
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_is_reused_and_requests_go_in_origin_form() {
        let (addr, seen) = upstream(|_| Some(OK), usize::MAX).await;
        let c = client(Duration::from_secs(10));
        for path in ["/v1/models", "/v1/models?x=1"] {
            let body = c.send(get(addr, path)).await.unwrap().into_body().collect().await.unwrap();
            assert_eq!(body.to_bytes(), "ok");
        }
        // Read to its length and dropped without a last poll: back to the pool all the same.
        let resp = c.send(get(addr, "/")).await.unwrap();
        let mut body = resp.into_body();
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "ok");
        drop(body);
        c.send(get(addr, "/")).await.unwrap();
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
        let heads = seen.heads.lock().unwrap();
        assert!(heads[0].starts_with("GET /v1/models HTTP/1.1\r\n"), "{}", heads[0]);
        assert!(heads[1].starts_with("GET /v1/models?x=1 HTTP/1.1\r\n"), "{}", heads[1]);
        assert!(heads[0].to_ascii_lowercase().contains(&format!("host: {addr}\r\n")), "{}", heads[0]);
    }

    #[tokio::test]
    async fn an_answer_dropped_before_its_end_closes_its_connection() {
        let (addr, seen) =
            upstream(|_| Some("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"), usize::MAX).await;
        let c = client(Duration::from_secs(10));
        let resp = c.send(get(addr, "/")).await.unwrap();
        drop(resp);
        let resp = c.send(get(addr, "/")).await.unwrap();
        drop(resp);
        assert_eq!(
            seen.connections.load(Ordering::SeqCst),
            2,
            "a connection with an unread answer was reused"
        );
        assert!(c.inner.idle.lock().unwrap().values().all(Vec::is_empty));
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_is_not_used() {
        // Answers once per connection, then closes it, as a server does whose keep-alive ran out.
        let (addr, seen) = upstream(|_| Some(OK), 1).await;
        let c = client(Duration::from_secs(10));
        c.send(get(addr, "/")).await.unwrap().into_body().collect().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Written to that connection, the request would be lost (502): it goes on a new one.
        let body = c.send(get(addr, "/")).await.unwrap().into_body().collect().await.unwrap();
        assert_eq!(body.to_bytes(), "ok");
        assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_written_and_never_answered_is_an_error_that_was_sent() {
        let (addr, _) = upstream(|_| None, usize::MAX).await;
        let c = client(Duration::from_secs(10));
        let e = c.send(get(addr, "/")).await.unwrap_err();
        assert_eq!(e.kind, Kind::UpstreamProtocol);
        assert!(e.sent && !e.may_fail_over());
    }

    #[tokio::test]
    async fn a_refused_connection_sent_nothing() {
        let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let e = client(Duration::from_secs(10)).send(get(addr, "/")).await.unwrap_err();
        assert_eq!(e.kind, Kind::UpstreamConnect);
        assert!(e.may_fail_over());
    }

    #[tokio::test]
    async fn idle_connections_are_closed_once_expired() {
        let (addr, _) = upstream(|_| Some(OK), usize::MAX).await;
        let c = client(Duration::from_millis(100));
        c.send(get(addr, "/")).await.unwrap().into_body().collect().await.unwrap();
        assert_eq!(c.inner.idle.lock().unwrap().values().map(Vec::len).sum::<usize>(), 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(c.inner.idle.lock().unwrap().is_empty());
    }
}
