//! Serving one client connection until it ends, and finishing it gracefully at shutdown.
//!
//! The obvious `select!` between the connection and a shutdown future polls both every time the
//! connection's task wakes — several times per request — and polling a `watch` receiver takes the
//! channel's waiter lock, which every connection of every worker shares. [`Graceful`] gives the
//! shutdown future a waker of its own instead, so it is polled only when its signal fires, and
//! the request path touches nothing shared with other threads.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// The shutdown future's waker: marks the signal and wakes the connection's task.
#[derive(Default)]
struct Signal {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = task.as_ref() {
            w.wake_by_ref();
        }
    }
}

/// A client connection (`conn`) that is asked to finish (`shutdown`) once `stop` completes.
pub(crate) struct Graceful<'a, C, F, G> {
    conn: Pin<&'a mut C>,
    stop: Pin<&'a mut F>,
    shutdown: G,
    signal: Arc<Signal>,
    waker: Waker,
    /// Poll `stop` on the next poll (first poll, or its waker fired).
    check: bool,
    stopping: bool,
}

impl<'a, C, F, G> Graceful<'a, C, F, G>
where
    G: FnMut(Pin<&mut C>),
{
    pub(crate) fn new(conn: Pin<&'a mut C>, stop: Pin<&'a mut F>, shutdown: G) -> Self {
        let signal = Arc::new(Signal::default());
        Graceful {
            conn,
            stop,
            shutdown,
            waker: Waker::from(Arc::clone(&signal)),
            signal,
            check: true,
            stopping: false,
        }
    }
}

impl<C, F, G> Future for Graceful<'_, C, F, G>
where
    C: Future,
    F: Future<Output = ()>,
    G: FnMut(Pin<&mut C>) + Unpin,
{
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        if !this.stopping && (this.check || this.signal.fired.swap(false, Ordering::AcqRel)) {
            this.check = false;
            {
                let mut task = this
                    .signal
                    .task
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *task = Some(cx.waker().clone());
                }
            }
            let mut stop_cx = Context::from_waker(&this.waker);
            if this.stop.as_mut().poll(&mut stop_cx).is_ready() {
                this.stopping = true;
                (this.shutdown)(this.conn.as_mut());
            }
        }
        this.conn.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A stand-in connection: ends once asked to shut down and then polled `after` more times.
    struct Conn {
        polls: Rc<Cell<u32>>,
        shut_at: Option<u32>,
        after: u32,
    }

    impl Future for Conn {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            self.polls.set(self.polls.get() + 1);
            match self.shut_at {
                Some(at) if self.polls.get() >= at + self.after => Poll::Ready(self.polls.get()),
                _ => {
                    // Like a busy connection: it wakes itself again and again.
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        }
    }

    #[tokio::test]
    async fn stop_is_polled_only_when_signalled_and_shuts_the_connection_down_once() {
        let polls = Rc::new(Cell::new(0));
        let stop_polls = Rc::new(Cell::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let counted = Rc::clone(&stop_polls);
        let mut rx = rx;
        let stop = std::future::poll_fn(move |cx| {
            counted.set(counted.get() + 1);
            Pin::new(&mut rx).poll(cx).map(|_| ())
        });
        let conn = Conn {
            polls: Rc::clone(&polls),
            shut_at: None,
            after: 3,
        };
        let mut conn = std::pin::pin!(conn);
        let mut stop = std::pin::pin!(stop);
        let shutdowns = Rc::new(Cell::new(0));
        let s = Rc::clone(&shutdowns);
        let p = Rc::clone(&polls);
        let mut graceful = Graceful::new(
            conn.as_mut(),
            stop.as_mut(),
            move |mut c: Pin<&mut Conn>| {
                s.set(s.get() + 1);
                c.shut_at = Some(p.get());
            },
        );
        // Fifty busy wake-ups of the connection: the stop future was polled once, at the start.
        for _ in 0..50 {
            let mut cx = Context::from_waker(Waker::noop());
            assert!(
                Pin::new(&mut graceful).poll(&mut cx).is_pending(),
                "the connection ended early"
            );
        }
        assert_eq!(stop_polls.get(), 1);
        tx.send(()).unwrap();
        let ended_at = (&mut graceful).await;
        assert_eq!(shutdowns.get(), 1);
        assert_eq!(stop_polls.get(), 2);
        assert!(ended_at > 50);
    }
}
