//! How a stream's operations wait: spin, arm, then sleep on the completion channel its two CQs
//! report to, and on the connection's CM events (a peer that leaves ends every wait at once).
//!
//! - **Blocking:** one thread at a time sleeps on the channel ([`CqWaiter::idle_with`], the
//!   only waiter of its channel); another thread of the same stream waits on a condition
//!   variable, woken after every step of the sleeper. Both look at the state after each wake.
//! - **Async:** each half (a stream's reads, its writes, or an owned half) sleeps on its own
//!   registrations of the channel and of the CM fd, made by its first sleep and kept
//!   ([`AsyncWait`]), and leaves its waker with the state: whoever takes a completion another
//!   task waits for wakes it.

#[cfg(feature = "tokio")]
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
#[cfg(feature = "tokio")]
use std::pin::Pin;
#[cfg(feature = "tokio")]
use std::sync::Arc;

use rdma_verbs::{CqWaiter, Deadline, Idle};

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

/// What one async half (a [`Stream`](crate::Stream)'s reads or writes, or an owned half) keeps
/// between its waits: the sleep under way, and the registrations every sleep of that half
/// reuses.
#[cfg(feature = "tokio")]
#[derive(Default)]
pub(crate) struct AsyncWait {
    sleep: Option<Sleep>,
    /// Where the registrations are between sleeps; a sleep borrows them and puts them back
    /// when it ends or is dropped.
    kept: Arc<parking_lot::Mutex<Option<Box<Registrations>>>>,
}

/// An async half's registrations with the reactor, made by its first sleep and kept until the
/// half is dropped: the completion channel's (inside the waiter) and the CM fd's. A stream
/// waits thousands of times a second, and registering at every sleep would cost a `fcntl`, an
/// `epoll_ctl` and a `close` per fd each time. They belong to the runtime of the first sleep,
/// as a `tokio::net::TcpStream` belongs to its runtime; a sleep that fails (that runtime shut
/// down) drops them, and the next sleep registers again on the runtime it runs on.
#[cfg(feature = "tokio")]
struct Registrations {
    waiter: CqWaiter,
    cm: rdma_verbs::wait::Readiness,
}

/// Registrations a sleep took from their [`AsyncWait`]: given back when the sleep ends or is
/// dropped (a wait whose result another task's progress brought drops its sleep unfinished),
/// unless the sleep failed with them.
#[cfg(feature = "tokio")]
struct Lent {
    regs: Option<Box<Registrations>>,
    home: Arc<parking_lot::Mutex<Option<Box<Registrations>>>>,
}

#[cfg(feature = "tokio")]
impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(mut regs) = self.regs.take() {
            // The next wait spins its whole budget again, as a wait that begins does.
            regs.waiter.reset();
            *self.home.lock() = Some(regs);
        }
    }
}

/// A boxed sleep of an async wait, kept by the half that waits between its polls; its output
/// says whether the CM's fd ended it.
#[cfg(feature = "tokio")]
type Sleep = Pin<Box<dyn Future<Output = io::Result<bool>> + Send>>;

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
            // The CM's fd ended the sleep: its event is read before the queues are polled. A
            // sleep a completion ended leaves the CM to the periodic read (and to the next
            // sleep, which the fd, still readable, ends at once).
            if matches!(idle, Ok(Idle::Signalled)) {
                st.cm_due = true;
            }
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
    /// waker left with the state and the channel (`wait` keeps the sleep between polls).
    #[cfg(feature = "tokio")]
    pub(crate) fn poll_wait<R>(
        self: &Arc<Self>,
        op: Op,
        wait: &mut AsyncWait,
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
                // A sleep under way ends here: its registrations stay for the next one.
                wait.sleep = None;
                return Poll::Ready(result);
            }
            let fut = match &mut wait.sleep {
                Some(fut) => fut,
                None => wait.sleep.insert(Box::pin(Arc::clone(self).sleep_async(Arc::clone(&wait.kept)))),
            };
            let slept = match fut.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(slept) => slept,
            };
            wait.sleep = None;
            if slept? {
                self.state.lock().cm_due = true;
            }
        }
    }

    /// Sleeps until a completion (taken by this sleep's own progress) or a CM event, `true` for
    /// the CM event: a completion taken by another task's progress wakes this task through its
    /// waker instead. Sleeps on the registrations kept in `home` (made here the first time).
    #[cfg(feature = "tokio")]
    async fn sleep_async(
        self: Arc<Self>,
        home: Arc<parking_lot::Mutex<Option<Box<Registrations>>>>,
    ) -> io::Result<bool> {
        let kept = home.lock().take();
        let mut lent = Lent { regs: kept, home };
        if lent.regs.is_none() {
            let cm = rdma_verbs::wait::Readiness::new(self.conn.as_fd())?;
            lent.regs = Some(Box::new(Registrations { waiter: CqWaiter::new(self.policy), cm }));
        }
        let regs = lent.regs.as_mut().expect("registered above");
        let cqs = [&*self.send_cq, &*self.recv_cq];
        let slept = loop {
            let changed = {
                let mut st = self.state.lock();
                let changed = st.progress(&self.conn);
                let wakers = if changed { self.changed(&mut st) } else { [None, None] };
                drop(st);
                wake(wakers);
                changed
            };
            if changed {
                break Ok(false);
            }
            match regs.waiter.idle_async_with(&cqs, None, &[&regs.cm]).await {
                // The event is read by the caller's next progress (its readiness is cleared).
                Ok(Idle::Signalled) => break Ok(true),
                Ok(_) => {}
                Err(e) => break Err(io::Error::new(io::ErrorKind::ConnectionReset, e)),
            }
        };
        if slept.is_err() {
            // Maybe registered on a runtime that is gone: the next sleep registers anew.
            lent.regs = None;
        }
        slept
    }

    /// One of the user's handles (the stream, its write half) is dropped. The last one, dropped
    /// inside a tokio runtime, hands the closing drain to a task of that runtime, so that no
    /// worker thread blocks on a peer that does not read (a `TcpStream`'s close does not block
    /// either). Outside a runtime, or if the runtime ends before the task has run, the drop of
    /// the last `Arc` drains as a blocking drop does.
    #[cfg(feature = "tokio")]
    pub(crate) fn release_handle(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(Arc::clone(self).close_async());
        }
    }

    /// The async form of the closing drain of [`Shared`]'s drop: ends this direction and
    /// waits, up to the drain timeout, until everything sent is acknowledged or never will be.
    #[cfg(feature = "tokio")]
    async fn close_async(self: Arc<Self>) {
        self.state.lock().shutdown();
        let mut wait = AsyncWait::default();
        let closing = std::future::poll_fn(|cx| self.poll_wait(Op::Write, &mut wait, cx, State::drained));
        let _ = rdma_verbs::wait::timeout_at(Deadline::after(self.drain), closing).await;
        drop(wait);
        self.state.lock().drained = true;
    }
}
