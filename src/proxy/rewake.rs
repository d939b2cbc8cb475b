//! A client connection's future that wakes itself while it is being polled is polled again at
//! once, instead of the wake going back to tokio as a yield.
//!
//! Why: hyper's h1 server reads a request body in the connection's task and hands it to the
//! service (running in that same task) through a channel whose receiver wakes the sender's
//! waker when it takes a chunk, even when the sender is gone. That waker is the task's own.
//! tokio treats a wake during the task's own poll as a yield: the task goes to the back of the
//! run queue and another worker is woken to steal it. Each request with a body so paid a futex
//! wake, between reading the client's request and writing it upstream, and the woken worker
//! competed for the CPU with the write (`strace -f` shows `recvfrom`, `futex(WAKE)`, `writev`
//! on every request). Polling again in place costs one more poll of the connection and no
//! thread. The fix belongs in hyper (wake the sender only when it waits):
//! docs/upstream/hyper-1.13-chan-wake-waiting-sender.patch, which does the same on its own;
//! with a hyper that carries it, this module can go.
//!
//! Fairness is kept: one poll from tokio polls the connection at most twice; a future that is
//! still awake after that (hyper yields on purpose after a long run of reads) is woken through
//! tokio as before. On a current-thread runtime (`--workers 1`) there is no other worker to
//! wake: a self-wake only queues the task behind the upstream connection's, which then writes
//! the request first, so there `Rewake` stays out of the way.

use atomic_waker::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

const IDLE: u8 = 0;
const POLLING: u8 = 1;
/// Woken while POLLING: the poll that is running goes round again.
const WOKEN: u8 = 2;
/// Polls of the inner future per poll from the runtime.
const POLLS: usize = 2;

pub struct Rewake<F> {
    inner: Pin<Box<F>>,
    /// Off on a current-thread runtime: polls pass straight through.
    on: bool,
    shared: Arc<Shared>,
    /// The waker the inner future sees, made once so that `will_wake` holds across polls.
    waker: Waker,
}

struct Shared {
    state: AtomicU8,
    /// The task's own waker, for wakes that come while the future is not being polled.
    task: AtomicWaker,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self.state.compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future> Rewake<F> {
    /// `on`: whether the runtime has other workers to wake (see [`wanted`]).
    pub fn new(inner: F, on: bool) -> Rewake<F> {
        let shared = Arc::new(Shared { state: AtomicU8::new(IDLE), task: AtomicWaker::new() });
        Rewake { inner: Box::pin(inner), on, waker: Waker::from(shared.clone()), shared }
    }
}

/// Whether the current runtime is one where a self-wake wakes another worker.
pub fn wanted() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl<F: Future> Future for Rewake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if !this.on {
            return this.inner.as_mut().poll(cx);
        }
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..POLLS {
            this.shared.state.store(POLLING, Ordering::Release);
            let out = this.inner.as_mut().poll(&mut inner_cx);
            let woken = this.shared.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
            if out.is_ready() || !woken {
                return out;
            }
        }
        // Still awake: let the runtime schedule it like any other wake.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes the runtime would see.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself during its first `self_wakes` polls, then is ready; keeps the waker it saw.
    struct SelfWaking {
        self_wakes: usize,
        polls: usize,
        kept: Option<Waker>,
    }
    impl Future for SelfWaking {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            self.kept = Some(cx.waker().clone());
            if self.polls <= self.self_wakes {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if self.polls == self.self_wakes + 1 { Poll::Pending } else { Poll::Ready(self.polls) }
        }
    }

    fn runtime_waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn a_self_wake_is_polled_again_in_place_not_through_the_runtime() {
        let (count, waker) = runtime_waker();
        let mut f = Rewake::new(SelfWaking { self_wakes: 1, polls: 0, kept: None }, true);
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner.polls, 2, "polled again after waking itself");
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the runtime was not woken");
    }

    #[test]
    fn off_it_passes_the_self_wake_to_the_runtime() {
        let (count, waker) = runtime_waker();
        let mut f = Rewake::new(SelfWaking { self_wakes: 1, polls: 0, kept: None }, false);
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner.polls, 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn wanted_only_where_a_self_wake_wakes_another_worker() {
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
        assert!(multi.block_on(async { wanted() }));
        let one = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(!one.block_on(async { wanted() }));
    }

    #[test]
    fn a_future_still_awake_after_the_second_poll_yields_through_the_runtime() {
        let (count, waker) = runtime_waker();
        let mut f = Rewake::new(SelfWaking { self_wakes: 5, polls: 0, kept: None }, true);
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(f.inner.polls, POLLS);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken through the runtime, once");
    }

    #[test]
    fn a_wake_between_polls_reaches_the_runtime_and_the_result_comes_through() {
        let (count, waker) = runtime_waker();
        let mut f = Rewake::new(SelfWaking { self_wakes: 0, polls: 0, kept: None }, true);
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // Another task (the upstream connection, the I/O driver) wakes it later.
        f.inner.kept.take().expect("waker kept").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(Pin::new(&mut f).poll(&mut cx), Poll::Ready(2));
    }

    #[test]
    fn a_wake_from_another_thread_during_the_poll_is_not_lost() {
        // The wake lands while the inner future is being polled: it must make the running
        // poll go round again (or reach the runtime), never vanish.
        struct WokenElsewhere {
            polls: usize,
        }
        impl Future for WokenElsewhere {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.polls += 1;
                if self.polls == 1 {
                    let w = cx.waker().clone();
                    std::thread::spawn(move || w.wake()).join().unwrap();
                    return Poll::Pending;
                }
                Poll::Ready(())
            }
        }
        let (count, waker) = runtime_waker();
        let mut f = Rewake::new(WokenElsewhere { polls: 0 }, true);
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut f).poll(&mut cx), Poll::Ready(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }
}
