//! How a stream's operations wait: spin, arm, then sleep on the completion channel its two CQs
//! report to, and on the connection's CM events (a peer that leaves ends every wait at once).
//!
//! - **Blocking:** one thread at a time sleeps on the channel ([`CqWaiter::idle_with`], the
//!   only waiter of its channel); another thread of the same stream waits on a condition
//!   variable, woken after every step of the sleeper. Both look at the state after each wake.
//! - **Async:** each waiting task sleeps on its own registration of the channel and of the CM
//!   fd ([`CqWaiter::wait_async`], [`Readiness`]), and leaves its waker with the state: whoever
//!   takes a completion another task waits for wakes it.

#[cfg(feature = "tokio")]
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
#[cfg(feature = "tokio")]
use std::pin::Pin;
#[cfg(feature = "tokio")]
use std::sync::Arc;

use rdma_verbs::{CqWaiter, Deadline};

use std::task::Waker;

#[cfg(feature = "tokio")]
use crate::link::Op;
use crate::link::{Shared, State};

/// Wakes the wakers [`Shared::changed`] took (with the state unlocked).
pub(crate) fn wake(wakers: [Option<Waker>; 2]) {
    for waker in wakers.into_iter().flatten() {
        waker.wake();
    }
}

/// A boxed sleep of an async wait, kept by the half that waits between its polls.
#[cfg(feature = "tokio")]
pub(crate) type Sleep = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

impl Shared {
    /// Waits, blocking, until `ready` gives a result or `until` passes (`what` names the wait
    /// in the timeout).
    pub(crate) fn wait_blocking<R>(
        &self,
        until: Deadline,
        what: &'static str,
        mut ready: impl FnMut(&mut State) -> Option<io::Result<R>>,
    ) -> io::Result<R> {
        let mut st = self.state.lock();
        loop {
            if st.progress(&self.conn) {
                let wakers = self.changed(&mut st);
                if wakers.iter().any(Option::is_some) {
                    parking_lot::MutexGuard::unlocked(&mut st, || wake(wakers));
                }
            }
            if let Some(result) = ready(&mut st) {
                return result;
            }
            if until.has_passed() {
                return Err(crate::Error::TimedOut { what }.into());
            }
            if st.sleeping {
                match until.instant() {
                    Some(at) => {
                        self.turn.wait_until(&mut st, at);
                    }
                    None => self.turn.wait(&mut st),
                }
                continue;
            }
            st.sleeping = true;
            let mut waiter = st.waiter.take().unwrap_or_else(|| CqWaiter::new(self.policy));
            let idle = parking_lot::MutexGuard::unlocked(&mut st, || {
                waiter.idle_with(&[&self.send_cq, &self.recv_cq], until, &[self.conn.as_fd()])
            });
            st.waiter = Some(waiter);
            st.sleeping = false;
            st.cm_due = true;
            self.turn.notify_all();
            idle.map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e))?;
        }
    }

    /// Something changed: every waiter looks again. The blocking ones are told now; the async
    /// ones' wakers are returned, to be woken once the state is unlocked (a waker that polls
    /// at once must find it free).
    #[must_use = "the async waits' wakers must be woken"]
    pub(crate) fn changed(&self, st: &mut State) -> [Option<Waker>; 2] {
        if let Some(w) = st.waiter.as_mut() {
            w.reset();
        }
        self.turn.notify_all();
        st.take_wakers()
    }

    /// One poll of an async wait: `Ready` with `ready`'s result, or `Pending` with `cx`'s
    /// waker left with the state and the channel (`sleep` keeps the sleep between polls).
    #[cfg(feature = "tokio")]
    pub(crate) fn poll_wait<R>(
        self: &Arc<Self>,
        op: Op,
        sleep: &mut Option<Sleep>,
        cx: &mut std::task::Context<'_>,
        mut ready: impl FnMut(&mut State) -> Option<io::Result<R>>,
    ) -> std::task::Poll<io::Result<R>> {
        use std::task::Poll;
        loop {
            let (result, wakers) = {
                let mut st = self.state.lock();
                let wakers = if st.progress(&self.conn) { self.changed(&mut st) } else { [None, None] };
                let result = ready(&mut st);
                if result.is_none() {
                    st.register(op, cx.waker());
                }
                (result, wakers)
            };
            wake(wakers);
            if let Some(result) = result {
                *sleep = None;
                return Poll::Ready(result);
            }
            let fut = sleep.get_or_insert_with(|| Box::pin(Arc::clone(self).sleep_async()));
            let slept = fut.as_mut().poll(cx);
            if slept.is_ready() {
                self.state.lock().cm_due = true;
            }
            match slept {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => *sleep = None,
                Poll::Ready(Err(e)) => {
                    *sleep = None;
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// Sleeps until a completion (taken by this sleep's own progress) or a CM event: a
    /// completion taken by another task's progress wakes this task through its waker instead.
    #[cfg(feature = "tokio")]
    async fn sleep_async(self: Arc<Self>) -> io::Result<()> {
        use std::task::Poll;
        let cm = rdma_verbs::wait::Readiness::new(self.conn.as_fd())?;
        let mut waiter = CqWaiter::new(self.policy);
        let cqs = [&*self.send_cq, &*self.recv_cq];
        let step = || -> rdma_verbs::Result<Option<()>> {
            let mut st = self.state.lock();
            let changed = st.progress(&self.conn);
            let wakers = if changed { self.changed(&mut st) } else { [None, None] };
            drop(st);
            wake(wakers);
            Ok(changed.then_some(()))
        };
        let mut wait = std::pin::pin!(waiter.wait_async(&cqs, Deadline::never(), step));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(ready) = cm.poll_ready(cx) {
                // The event is read by the caller's next progress.
                ready?.clear();
                return Poll::Ready(Ok(()));
            }
            wait.as_mut().poll(cx).map(|r| r.map(|_| ()).map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e)))
        })
        .await
    }
}
