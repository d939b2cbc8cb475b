//! The listener: hyper serves every client connection (HTTP/1.1 and h2c), each on its own
//! task, with `Proxy::handle` as the service. Limits that apply before a request exists live
//! here: the connection cap, the head read timeout and size, the send timeout, and graceful
//! drain on shutdown.

use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

use super::Proxy;
use super::rewake::Rewake;

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
        // Vectored writes (hyper's default) on purpose: writev(false) saves about 3% CPU per
        // SSE event, but copies every frame into a buffer that keeps its largest size for the
        // connection's life (200 idle connections held 87 MB more after 650 KB answers).
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(1024)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let metrics = proxy.metrics.clone();
    let rewake = super::rewake::wanted();
    tokio::pin!(shutdown);
    let accept_failed = super::error::Quiet::new();
    loop {
        let (stream, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning (the connection waits in
                    // the listen backlog), and say so once a second, not at every retry.
                    if let Some(more) = accept_failed.due() {
                        tracing::warn!(error = %e, more_since_last_line = more, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        if open.load(Ordering::Relaxed) >= limits.max_connections {
            metrics.rejected.with_label_values(&["max_connections"]).inc();
            refuse(stream, proxy.config.load().config.limits.retry_after_secs, &refusing);
            continue;
        }
        let _ = stream.set_nodelay(true);
        // A write that stays blocked this long fails the connection: hyper then drops the
        // answer's body, which cancels the upstream request. Only a write that waits arms it.
        let mut io = tokio_io_timeout::TimeoutStream::new(stream);
        io.set_write_timeout(Some(Duration::from_millis(proxy.config.load().config.limits.send_timeout_ms)));
        let slot = ConnSlot::take(&open, &metrics.client_connections);
        let p = proxy.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let p = p.clone();
            async move { Ok::<_, Infallible>(p.handle(req, Some(remote)).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(Box::pin(io)), svc).into_owned();
        // Counted by the graceful shutdown until the connection closes.
        let conn = Rewake::new(graceful.watch(conn), rewake);
        let send_timeouts = metrics.client_send_timeouts.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = conn.await {
                if timed_out(&*e) {
                    send_timeouts.inc();
                }
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    proxy.draining.store(true, Ordering::Relaxed);
    tracing::info!(connections = graceful.count(), "draining in-flight requests");
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "grace period over; closing the remaining connections");
    }
}

/// The connection failed because a write to the client waited `limits.send_timeout_ms`. The
/// timer's error carries no OS code; the kernel's ETIMEDOUT (a peer that acknowledged nothing)
/// does, and is not this counter's.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut && io.raw_os_error().is_none())
        {
            return true;
        }
        cause = c.source();
    }
    false
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

/// Answer a connection over limits.max_connections with 503 + Retry-After. hyper answers it, in
/// the connection's own protocol (an h2 client gets the 503 on its stream), and closes it after
/// the answer: HTTP/1.1 without keep-alive, h2 with a GOAWAY, so that the client knows the
/// close is deliberate and sends nothing more on it. A client that sends no request within
/// REFUSE_FOR is closed without one. At most MAX_REFUSING connections are answered at once;
/// past that a connection is simply closed.
fn refuse(stream: tokio::net::TcpStream, retry_after: u64, refusing: &Arc<AtomicUsize>) {
    const MAX_REFUSING: usize = 64;
    const REFUSE_FOR: Duration = Duration::from_millis(500);
    if refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        refusing.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let refusing = refusing.clone();
    let answered = Arc::new(tokio::sync::Notify::new());
    let told = answered.clone();
    let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
        told.notify_one();
        async move {
            let mut r = super::error_response(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "max_connections",
                "goodput is at limits.max_connections; retry later",
            );
            r.headers_mut().insert(http::header::RETRY_AFTER, retry_after.into());
            Ok::<_, Infallible>(r)
        }
    });
    tokio::spawn(async move {
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().keep_alive(false);
        builder.http2().max_concurrent_streams(4);
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        tokio::pin!(conn);
        let until = tokio::time::Instant::now() + REFUSE_FOR;
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = answered.notified() => {
                // The answers already asked for still go out.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout_at(until, conn).await;
            }
        }
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}
