//! An h2 answer the client stops taking. The send timeout on the socket (`server`) catches a
//! client that takes nothing on its connection. An h2 client whose connection keeps reading but
//! that grants one stream no flow-control window (a hung application behind a live h2 library)
//! blocks no write: hyper just stops polling that stream's body, and nothing else would ever
//! end it, so the upstream request, its backend slot and the generation would be held for the
//! connection's life. As nginx applies `send_timeout` to an h2 stream, a watchdog task per h2
//! answer ends one that has waited `limits.send_timeout_ms` for the client: it drops the
//! metered body, which cancels the upstream request and files the record as cancelled, and
//! hyper resets the stream when it next polls it.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use prometheus::IntCounter;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

use super::error::BoxError;

/// How long an h2 answer may wait for its client, and where the endings are counted.
pub struct Policy {
    pub after: Duration,
    /// `goodput_client_send_timeouts_total`.
    pub counter: IntCounter,
}

impl Policy {
    /// Watch `body` (the metered answer) from now on, until it ends or is dropped.
    pub fn watch<B: Body + Send + 'static>(self, body: B) -> Watched<B> {
        let shared = Arc::new(Shared {
            body: Mutex::new(Some(body)),
            handed: AtomicU64::new(NOT_WAITING),
            base: Instant::now(),
            done: Notify::new(),
        });
        tokio::spawn(watchdog(shared.clone(), self));
        Watched { shared }
    }
}

/// `Shared::handed` while the body is not waiting for the client.
const NOT_WAITING: u64 = 0;

struct Shared<B> {
    /// Taken by the watchdog when it ends the answer. Held only while the body is polled
    /// (never across an await).
    body: Mutex<Option<B>>,
    /// When the body last handed hyper a frame that hyper has not asked past: nanoseconds since
    /// `base`, never 0; `NOT_WAITING` while the body is being polled or waits for its upstream
    /// (`idle_ms` bounds that wait).
    handed: AtomicU64,
    base: Instant,
    /// The answer is over (the body was dropped): the watchdog ends.
    done: Notify,
}

impl<B> Shared<B> {
    fn body(&self) -> MutexGuard<'_, Option<B>> {
        // A panic while polling leaves the body as it was; the watchdog may still end it.
        self.body.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn waiting_since(&self) -> Option<Instant> {
        match self.handed.load(Ordering::Acquire) {
            NOT_WAITING => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }
}

/// Wakes once per `after` while the answer lasts (one timer per answer, not per frame).
async fn watchdog<B>(shared: Arc<Shared<B>>, policy: Policy) {
    let mut due = Instant::now() + policy.after;
    loop {
        tokio::select! {
            _ = shared.done.notified() => return,
            _ = tokio::time::sleep_until(due.into()) => {}
        }
        let now = Instant::now();
        due = match shared.waiting_since() {
            Some(since) if now >= since + policy.after => {
                let mut body = shared.body();
                // Polled since the load: the client took it after all.
                if shared.waiting_since() != Some(since) {
                    continue;
                }
                let Some(b) = body.take() else { return };
                drop(body);
                policy.counter.inc();
                tracing::debug!(waited = ?now - since, "h2 answer ended: the client took none of it for limits.send_timeout_ms");
                drop(b);
                return;
            }
            Some(since) => since + policy.after,
            None => now + policy.after,
        };
    }
}

/// The answer ended because its client took none of it for `limits.send_timeout_ms`.
#[derive(Debug)]
pub struct SendTimeout;

impl std::fmt::Display for SendTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client took none of the answer for limits.send_timeout_ms")
    }
}

impl std::error::Error for SendTimeout {}

/// A metered h2 answer under a watchdog.
pub struct Watched<B> {
    shared: Arc<Shared<B>>,
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let shared = &*self.shared;
        let mut body = shared.body();
        shared.handed.store(NOT_WAITING, Ordering::Release);
        let Some(b) = body.as_mut() else {
            return Poll::Ready(Some(Err(Box::new(SendTimeout))));
        };
        let polled = Pin::new(b).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            // Until hyper polls again, the body waits for the client (for window, on h2).
            let ns = u64::try_from(shared.base.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
            shared.handed.store(ns, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared.body().as_ref().is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.shared.body().as_ref().map_or_else(SizeHint::default, Body::size_hint)
    }
}

impl<B> Drop for Watched<B> {
    fn drop(&mut self) {
        // The answer's end is the body's drop (the record, the upstream), here and not whenever
        // the watchdog next wakes.
        let body = self.shared.body().take();
        drop(body);
        self.shared.done.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A body with a frame whenever it is polled until `frames` are out, then silent, that
    /// says when it is dropped: the metered answer, whose drop cancels the upstream request.
    struct Upstream {
        frames: usize,
        dropped: Arc<AtomicBool>,
    }

    impl Body for Upstream {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            if self.frames == 0 {
                return Poll::Pending;
            }
            self.frames -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"data: {}\n\n")))))
        }
    }

    impl Drop for Upstream {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    const AFTER: Duration = Duration::from_millis(100);

    fn watched(frames: usize) -> (Watched<Upstream>, Arc<AtomicBool>, IntCounter) {
        let dropped = Arc::new(AtomicBool::new(false));
        let counter = IntCounter::new("t", "t").unwrap();
        let policy = Policy { after: AFTER, counter: counter.clone() };
        (policy.watch(Upstream { frames, dropped: dropped.clone() }), dropped, counter)
    }

    /// One poll, as hyper makes it when the client has window.
    async fn poll(w: &mut Watched<Upstream>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *w).poll_frame(cx))).await
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn an_answer_hyper_stops_polling_is_ended_after_the_timeout() {
        let (mut w, dropped, counter) = watched(usize::MAX);
        let t = Instant::now();
        assert!(matches!(poll(&mut w).await, Poll::Ready(Some(Ok(_)))));
        until("the stalled answer was never ended", || dropped.load(Ordering::SeqCst)).await;
        assert!(t.elapsed() >= AFTER, "ended after {:?}", t.elapsed());
        assert_eq!(counter.get(), 1);
        // hyper's next poll gets the error, and resets the stream.
        match poll(&mut w).await {
            Poll::Ready(Some(Err(e))) => assert!(e.is::<SendTimeout>(), "{e}"),
            _ => panic!("an ended answer must fail"),
        }
    }

    #[tokio::test]
    async fn an_answer_the_client_keeps_taking_is_never_ended() {
        let (mut w, dropped, counter) = watched(usize::MAX);
        let t = Instant::now();
        while t.elapsed() < AFTER * 5 {
            assert!(matches!(poll(&mut w).await, Poll::Ready(Some(Ok(_)))));
            tokio::time::sleep(AFTER / 5).await;
        }
        assert!(!dropped.load(Ordering::SeqCst));
        assert_eq!(counter.get(), 0);
    }

    #[tokio::test]
    async fn an_answer_waiting_for_its_upstream_is_not_the_clients_wait() {
        let (mut w, dropped, counter) = watched(1);
        assert!(matches!(poll(&mut w).await, Poll::Ready(Some(Ok(_)))));
        assert!(poll(&mut w).await.is_pending());
        tokio::time::sleep(AFTER * 4).await;
        assert!(!dropped.load(Ordering::SeqCst), "idle_ms bounds the upstream's silence, not this");
        assert_eq!(counter.get(), 0);
    }

    #[tokio::test]
    async fn an_answer_dropped_drops_its_body_at_once_and_ends_the_watchdog() {
        let (mut w, dropped, counter) = watched(usize::MAX);
        assert!(matches!(poll(&mut w).await, Poll::Ready(Some(Ok(_)))));
        let shared = Arc::downgrade(&w.shared);
        drop(w);
        assert!(dropped.load(Ordering::SeqCst));
        until("the watchdog outlived its answer", || shared.upgrade().is_none()).await;
        assert_eq!(counter.get(), 0);
    }
}
