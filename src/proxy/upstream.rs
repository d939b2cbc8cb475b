//! The upstream client: hyper's HTTP/1.1 client connections (`hyper::client::conn::http1`),
//! kept alive in a pool per origin and driven in the task of the request that uses them.
//!
//! hyper_util's pooled client runs each connection in a task of its own: a request is handed
//! to that task, and every chunk of the answer is read there and handed back, so on a busy
//! worker each waits behind whatever else is queued. Here the request's own task (hyper's
//! server connection, which polls the answer's body) polls the connection as well: the
//! request is written when it is sent, and a chunk is read, metered and written to the client
//! in one poll. hyper still does all of the framing; goodput only decides which task polls.
//!
//! A connection in the pool is polled by nobody, so a close the server sends while it is idle
//! is seen when it is next checked out (and by a sweep every `SWEEP_EVERY`). A request that a
//! closed connection refused before writing any byte of it goes out again on another one; a
//! request that may have been written is never sent twice.

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, header};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tower_service::Service;

use super::UpstreamBody;
use super::error::BoxError;
use crate::tls::Connector;

/// How long a connection may wait in the pool for its next request.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const MAX_IDLE_PER_ORIGIN: usize = 1024;
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Rounds of connection and body polls within one poll of the task, while they keep waking
/// each other; past that the task yields, so one busy stream cannot starve the worker.
const MAX_ROUNDS: usize = 8;

type Io = <Connector as Service<Uri>>::Response;
type Connection = http1::Connection<Io, UpstreamBody>;
type Origin = (Scheme, Authority);

/// Why a request got no answer.
#[derive(Debug)]
pub enum ClientError {
    /// No connection could be made: nothing was sent.
    Connect(BoxError),
    /// The connection failed with the request on it; `written` unless hyper gave the request
    /// back unsent.
    Send { error: hyper::Error, written: bool },
    /// The request's URI has no scheme or authority to connect to.
    Target(&'static str),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Connect(e) => write!(f, "connect: {e}"),
            ClientError::Send { error, .. } => error.fmt(f),
            ClientError::Target(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Connect(e) => Some(&**e),
            ClientError::Send { error, .. } => Some(error),
            ClientError::Target(_) => None,
        }
    }
}

pub struct Client {
    connector: Connector,
    pool: Arc<Pool>,
}

impl Client {
    /// A client that connects through `connector`. Within a tokio runtime, a task sweeps
    /// closed and expired connections out of the pool while the client lives.
    pub fn new(connector: Connector) -> Client {
        let pool = Arc::new(Pool::default());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&pool);
            rt.spawn(sweep(weak));
        }
        Client { connector, pool }
    }

    /// Send `req` (its URI absolute: the origin to connect to) and wait for the answer's head.
    /// The answer's body drives the connection; once read to its end, the connection goes
    /// back to the pool.
    pub async fn request(&self, mut req: Request<UpstreamBody>) -> Result<Response<Body>, ClientError> {
        let uri = req.uri().clone();
        let origin = match (uri.scheme(), uri.authority()) {
            (Some(s), Some(a)) => (s.clone(), a.clone()),
            _ => return Err(ClientError::Target("the upstream URI has no scheme or authority")),
        };
        if !req.headers().contains_key(header::HOST) {
            let host = match uri.port_u16() {
                Some(p) if Some(p) != default_port(&origin.0) => {
                    format!("{}:{p}", uri.host().unwrap_or_default())
                }
                _ => uri.host().unwrap_or_default().to_owned(),
            };
            let host = HeaderValue::from_str(&host)
                .map_err(|_| ClientError::Target("the upstream host is not a valid Host header"))?;
            req.headers_mut().insert(header::HOST, host);
        }
        *req.uri_mut() =
            Uri::from(uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
        loop {
            let (mut conn, reused) = match self.pool.checkout(&origin) {
                Some(c) => (c, true),
                None => (self.connect(&uri).await?, false),
            };
            let mut sending = std::pin::pin!(conn.send.try_send_request(req));
            let answer = std::future::poll_fn(|cx| conn.drive(cx, |cx| sending.as_mut().poll(cx))).await;
            match answer {
                Ok(resp) => {
                    let pool = Arc::downgrade(&self.pool);
                    return Ok(resp.map(|incoming| Body { incoming, conn: Some((conn, origin, pool)) }));
                }
                Err(mut e) => match e.take_message() {
                    // A pooled connection the server had closed: nothing was written.
                    Some(r) if reused => req = r,
                    unsent => {
                        return Err(ClientError::Send { written: unsent.is_none(), error: e.into_error() });
                    }
                },
            }
        }
    }

    async fn connect(&self, uri: &Uri) -> Result<Driven, ClientError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await.map_err(ClientError::Connect)?;
        let io = connector.call(uri.clone()).await.map_err(ClientError::Connect)?;
        let (send, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|error| ClientError::Send { error, written: false })?;
        Ok(Driven::new(send, conn))
    }
}

fn default_port(scheme: &Scheme) -> Option<u16> {
    if *scheme == Scheme::HTTP {
        Some(80)
    } else if *scheme == Scheme::HTTPS {
        Some(443)
    } else {
        None
    }
}

/// The answer's body. Polling it polls the connection too; dropped before its end, it closes
/// the connection, which is how the upstream learns that the client has gone.
pub struct Body {
    incoming: Incoming,
    conn: Option<(Driven, Origin, Weak<Pool>)>,
}

impl Body {
    /// The body is read to its end: its connection goes back to the pool if it can take
    /// another request.
    fn release(&mut self) {
        if let Some((mut conn, origin, pool)) = self.conn.take() {
            conn.settle();
            if conn.reusable()
                && let Some(pool) = pool.upgrade()
            {
                pool.put(origin, conn);
            }
        }
    }
}

impl hyper::body::Body for Body {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let Some((conn, ..)) = this.conn.as_mut() else {
            return Pin::new(&mut this.incoming).poll_frame(cx);
        };
        let incoming = &mut this.incoming;
        let frame = conn.drive(cx, |cx| {
            Pin::new(&mut *incoming)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map(|f| f.map_data(|d| bytes::Bytes::copy_from_slice(&d)))))
        });
        if let Poll::Ready(None) = frame {
            this.release();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        // An answer without a body (204, HEAD, content-length 0) is never polled.
        if self.incoming.is_end_stream() {
            self.release();
        }
    }
}

/// A connection and the gate its wake-ups pass through.
struct Driven {
    send: http1::SendRequest<UpstreamBody>,
    /// None once the connection has ended.
    conn: Option<Connection>,
    gate: Arc<Gate>,
    waker: Waker,
    /// Not polled since it was made or checked out: the next `drive` polls it.
    fresh: bool,
}

impl Driven {
    fn new(send: http1::SendRequest<UpstreamBody>, conn: Connection) -> Driven {
        let gate = Arc::new(Gate::default());
        Driven { send, conn: Some(conn), waker: Waker::from(gate.clone()), gate, fresh: true }
    }

    /// Poll the connection, then `f` (the answer's head or body), in the caller's task.
    ///
    /// The two wake each other as they work: the connection wakes the body when it hands it a
    /// chunk, and the body wakes the connection when it takes one. Sent to the task, every such
    /// wake-up would poll it once more for nothing. So while they are polled here, wake-ups
    /// are only noted, and they are polled again while any was; a wake-up at any other time
    /// (the socket became readable) goes to the task. The connection is polled only after a
    /// wake-up: hyper polls a body again after each frame, which mostly finds nothing new.
    fn drive<T>(&mut self, cx: &mut Context<'_>, mut f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
        self.gate.task.register(cx.waker());
        let Driven { conn, gate, waker, fresh, .. } = self;
        let mut inner = Context::from_waker(waker);
        let mut held = None;
        for _ in 0..MAX_ROUNDS {
            gate.polling.store(true, SeqCst);
            let woken = gate.noted.swap(false, SeqCst);
            if woken || std::mem::take(fresh) {
                poll_conn(conn, &mut inner);
            }
            if held.is_none()
                && let Poll::Ready(t) = f(&mut inner)
            {
                held = Some(t);
            }
            gate.polling.store(false, SeqCst);
            if !gate.noted.load(SeqCst) {
                return held.map_or(Poll::Pending, Poll::Ready);
            }
        }
        cx.waker().wake_by_ref();
        held.map_or(Poll::Pending, Poll::Ready)
    }

    /// Poll the connection once with its wake-ups going nowhere: at the end of an answer (to
    /// let it become idle) and before reuse (to see a close the server sent meanwhile).
    fn settle(&mut self) {
        self.gate.task.take();
        self.gate.polling.store(true, SeqCst);
        poll_conn(&mut self.conn, &mut Context::from_waker(&self.waker));
        self.gate.polling.store(false, SeqCst);
        self.gate.noted.store(false, SeqCst);
    }

    fn reusable(&self) -> bool {
        self.conn.is_some() && self.send.is_ready()
    }
}

fn poll_conn(conn: &mut Option<Connection>, cx: &mut Context<'_>) {
    if let Some(c) = conn.as_mut()
        && Pin::new(c).poll(cx).is_ready()
    {
        *conn = None;
    }
}

/// Where a driven connection's wake-ups go: noted while its driver polls it, else to the task.
#[derive(Default)]
struct Gate {
    task: atomic_waker::AtomicWaker,
    polling: AtomicBool,
    noted: AtomicBool,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted first, then sent unless the driver is polling: a driver that stops polling
        // after this note was made sees it (SeqCst), one that stopped before gets the wake-up.
        self.noted.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            self.task.wake();
        }
    }
}

#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Origin, Vec<(Driven, Instant)>>>,
}

impl Pool {
    /// The connection to `origin` idle the shortest time that can still take a request.
    fn checkout(&self, origin: &Origin) -> Option<Driven> {
        loop {
            let (mut conn, since) = self.idle.lock().expect("pool lock").get_mut(origin)?.pop()?;
            if since.elapsed() >= IDLE_TIMEOUT {
                // The rest have been idle longer.
                self.idle.lock().expect("pool lock").remove(origin);
                return None;
            }
            conn.settle();
            if conn.reusable() {
                conn.fresh = true;
                return Some(conn);
            }
        }
    }

    fn put(&self, origin: Origin, conn: Driven) {
        let mut idle = self.idle.lock().expect("pool lock");
        let list = idle.entry(origin).or_default();
        if list.len() < MAX_IDLE_PER_ORIGIN {
            list.push((conn, Instant::now()));
        }
    }

    /// Drop the connections that expired or that the server closed.
    fn sweep(&self) {
        let mut idle = self.idle.lock().expect("pool lock");
        for list in idle.values_mut() {
            list.retain_mut(|(conn, since)| {
                conn.settle();
                since.elapsed() < IDLE_TIMEOUT && conn.reusable()
            });
        }
        idle.retain(|_, list| !list.is_empty());
    }
}

async fn sweep(pool: Weak<Pool>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        match pool.upgrade() {
            Some(p) => p.sweep(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Either, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn client() -> Client {
        Client::new(crate::tls::connector(&[], Duration::from_secs(2)).unwrap())
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> Request<UpstreamBody> {
        let mut r = Request::new(Either::Left(Full::new(Bytes::new())));
        *r.uri_mut() = format!("http://{addr}{path}").parse().unwrap();
        r
    }

    /// Reads one request head (this test server's requests have no body).
    async fn read_head(s: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await.ok()? == 0 {
                return None;
            }
            head.push(b[0]);
        }
        Some(String::from_utf8(head).unwrap())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sends_origin_form_with_host_and_reuses_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut accepted = 0;
            let mut heads = Vec::new();
            while heads.len() < 3 {
                let (mut s, _) = listener.accept().await.unwrap();
                accepted += 1;
                while let Some(h) = read_head(&mut s).await {
                    heads.push(h);
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.unwrap();
                    if heads.len() == 3 {
                        break;
                    }
                }
            }
            (accepted, heads)
        });
        let c = client();
        for _ in 0..3 {
            let resp = c.request(get(addr, "/v1/models?x=1")).await.unwrap();
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        let (accepted, heads) = server.await.unwrap();
        assert_eq!(accepted, 1, "one connection for three requests");
        assert!(heads[0].starts_with("GET /v1/models?x=1 HTTP/1.1\r\n"), "{}", heads[0]);
        assert!(heads[0].to_ascii_lowercase().contains(&format!("host: {addr}\r\n")), "{}", heads[0]);
    }

    /// Events written one at a time with pauses, and a burst in one write: every one arrives,
    /// and the pauses do not stall the body (a wake-up lost in the gate would hang here).
    #[tokio::test(flavor = "current_thread")]
    async fn a_paced_chunked_body_arrives_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_head(&mut s).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await.unwrap();
            for i in 0..20 {
                let data = format!("data: {i}\n\n");
                s.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut burst = String::new();
            for i in 20..40 {
                let data = format!("data: {i}\n\n");
                burst += &format!("{:x}\r\n{data}\r\n", data.len());
            }
            burst += "0\r\n\r\n";
            s.write_all(burst.as_bytes()).await.unwrap();
            // Keep the connection open: the end of the body is the chunked terminator.
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let resp = client().request(get(addr, "/")).await.unwrap();
        let body = tokio::time::timeout(Duration::from_secs(3), resp.into_body().collect())
            .await
            .expect("the body did not stall")
            .unwrap()
            .to_bytes();
        let want: String = (0..40).map(|i| format!("data: {i}\n\n")).collect();
        assert_eq!(body, want.as_bytes());
    }

    /// A pooled connection the server closed while idle costs no failed request; a request the
    /// server read and then dropped without answering is not sent again.
    #[tokio::test(flavor = "current_thread")]
    async fn retries_only_what_was_never_written() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // First connection: answers once, then closes while idle.
            let (mut s, _) = listener.accept().await.unwrap();
            read_head(&mut s).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            drop(s);
            // Second: answers the request the client sends after finding the first closed.
            let (mut s, _) = listener.accept().await.unwrap();
            read_head(&mut s).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            drop(s);
            // Third: reads the request and closes without an answer.
            let (mut s, _) = listener.accept().await.unwrap();
            read_head(&mut s).await.unwrap();
            drop(s);
            // Nothing more may come.
            tokio::time::timeout(Duration::from_millis(300), listener.accept()).await.is_err()
        });
        let c = client();
        assert_eq!(c.request(get(addr, "/")).await.unwrap().status(), 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            c.request(get(addr, "/")).await.unwrap().status(),
            200,
            "a closed idle connection is replaced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        match c.request(get(addr, "/")).await {
            Err(ClientError::Send { written: true, .. }) => {}
            other => panic!("expected a written request's failure, got {:?}", other.map(|r| r.status())),
        }
        assert!(server.await.unwrap(), "the written request was sent again");
    }

    /// A body dropped before its end closes the upstream connection (vLLM then aborts).
    #[tokio::test(flavor = "current_thread")]
    async fn dropping_the_body_closes_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_head(&mut s).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                .await
                .unwrap();
            let mut b = [0u8; 16];
            tokio::time::timeout(Duration::from_secs(3), s.read(&mut b)).await.map(|r| r.unwrap())
        });
        let c = client();
        let mut body = c.request(get(addr, "/")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "hello");
        drop(body);
        assert_eq!(server.await.unwrap(), Ok(0), "the server saw the connection close");
    }
}
