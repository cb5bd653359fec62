//! The safe posting layer: [`QueuePair::scope`] and [`PostScope`].
//!
//! A scope borrows every memory region its requests name for the whole scope, and does not
//! return until each request it posted has completed: on normal exit, on error, and on panic.
//! So while a request may touch a region, Rust code cannot take a plain slice of it:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # use std::time::Duration;
//! # fn f(qp: &QueuePair<'_, Rc, ReadyToSend>, mut mr: MemoryRegion<'_>) {
//! qp.scope(Duration::from_secs(1), |s| {
//!     let sge = [mr.sge(..).unwrap()];
//!     s.post_send(&mut [SendRequest::send(1, &sge)]).unwrap();
//!     mr.as_mut_slice().unwrap()[0] = 1; // error: `mr` is borrowed by the in-flight send
//! });
//! # }
//! ```

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::qp::state::{CanPostRecv, ReadyToSend, State, Transport};
use crate::qp::QueuePair;
use crate::wc::WorkCompletion;
use crate::wr::{RecvRequest, SendRequest};

/// Requests posted through a scope, all complete by the time the scope ends.
///
/// Every send posted in a scope is signaled, so each request, sent or received, yields exactly
/// one completion (success, error, or flush) that the scope counts. Completions are read with
/// [`poll`](PostScope::poll); those left when the closure returns are drained by the scope.
///
/// The queue pair's CQs should serve only this QP while the scope runs: completions of other
/// QPs that the scope drains at its end are discarded.
pub struct PostScope<'s, 'env: 's, 'res, T: Transport, S: State> {
    qp: &'env QueuePair<'res, T, S>,
    outstanding: usize,
    drain_timeout: Duration,
    /// Invariant in 's, like `std::thread::Scope`: borrows given to the scope last exactly 's.
    _scope: PhantomData<&'s mut &'s ()>,
}

impl<'res, T: Transport, S: State> QueuePair<'res, T, S> {
    /// Runs `f` with a [`PostScope`] for posting requests safely, then waits until every request
    /// posted in it has completed.
    ///
    /// Memory regions named by the scope's requests stay borrowed until the scope returns, so no
    /// plain slice of them can exist while the NIC may use them. If requests are still
    /// outstanding when `f` returns (or panics), the scope polls for them up to
    /// `drain_timeout`; past that it moves the QP to the error state, which flushes them, and
    /// polls again. If even the flush does not complete them, it aborts the process rather than
    /// let the borrows end while the NIC may write.
    ///
    /// # Errors
    /// [`Error::Timeout`] when requests had to be flushed; [`Error::WorkCompletion`] for the
    /// first failed completion drained at the end (those `f` polled are its own to check).
    pub fn scope<'env, R>(
        &'env self,
        drain_timeout: Duration,
        f: impl for<'s> FnOnce(&mut PostScope<'s, 'env, 'res, T, S>) -> R,
    ) -> Result<R> {
        let mut scope = PostScope { qp: self, outstanding: 0, drain_timeout, _scope: PhantomData };
        let r = f(&mut scope);
        scope.drain()?;
        Ok(r)
    }
}

impl<'s, 'env, 'res, T: Transport, S: State> PostScope<'s, 'env, 'res, T, S> {
    /// Requests posted in this scope that have not completed yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Polls the QP's send and receive CQs into `out`: `ibv_poll_cq()`. Completions of this
    /// QP's requests count down [`outstanding`](Self::outstanding).
    ///
    /// # Errors
    /// [`Error::Verb`] when polling fails.
    pub fn poll<'o>(&mut self, out: &'o mut [WorkCompletion]) -> Result<&'o mut [WorkCompletion]> {
        let n = self.qp.send_cq().poll(out)?.len();
        let m = if std::ptr::eq(self.qp.send_cq(), self.qp.recv_cq()) || n == out.len() {
            0
        } else {
            self.qp.recv_cq().poll(&mut out[n..])?.len()
        };
        let got = &mut out[..n + m];
        let qpn = self.qp.qp_num();
        let ours = got.iter().filter(|wc| wc.qp_num() == qpn).count();
        self.outstanding = self.outstanding.saturating_sub(ours);
        Ok(got)
    }

    /// Polls until `n` completions arrived or `timeout` passed, writing them into `out`
    /// (which must have room for `n`).
    ///
    /// # Errors
    /// [`Error::Timeout`] when fewer came in time (those that came are lost to the caller but
    /// counted); [`Error::InvalidArgument`] if `out` is shorter than `n`.
    pub fn wait<'o>(
        &mut self,
        n: usize,
        out: &'o mut [WorkCompletion],
        timeout: Duration,
    ) -> Result<&'o mut [WorkCompletion]> {
        if out.len() < n {
            return Err(Error::invalid("ibv_poll_cq", None, format!("room for {} completions, {n} wanted", out.len())));
        }
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        while got < n {
            got += self.poll(&mut out[got..n])?.len();
            if got < n && Instant::now() >= deadline {
                return Err(Error::Timeout { what: "completions", after: timeout });
            }
        }
        Ok(&mut out[..n])
    }

    /// Counts what a post of `n` requests left outstanding: all, those before a refused one, or none.
    fn count_posted(&mut self, r: &Result<()>, n: usize) {
        self.outstanding += match r {
            Ok(()) => n,
            Err(Error::PostFailed { posted, .. }) => *posted,
            Err(_) => 0,
        };
    }

    fn drain(&mut self) -> Result<()> {
        let mut first_error = None;
        let mut buf: [WorkCompletion; 16] = Default::default();
        for flushed in [false, true] {
            let deadline = Instant::now() + self.drain_timeout;
            while self.outstanding > 0 && Instant::now() < deadline {
                // A polling error must not end the scope early (the borrows would end while the
                // NIC may still write): keep trying until the deadline, then flush, then abort.
                let Ok(got) = self.poll(&mut buf) else { continue };
                for wc in got.iter() {
                    if first_error.is_none() && wc.qp_num() == self.qp.qp_num() && !wc.is_success() {
                        first_error = wc.ok().err();
                    }
                }
            }
            if self.outstanding == 0 {
                return match (flushed, first_error) {
                    (true, _) => Err(Error::Timeout { what: "draining a posting scope", after: self.drain_timeout }),
                    (false, Some(e)) => Err(e),
                    (false, None) => Ok(()),
                };
            }
            if !flushed {
                // Outstanding requests did not complete in time: flush them.
                let _ = self.qp.flush();
            }
        }
        // The NIC may still write memory the scope borrowed; ending the borrows would be unsound.
        eprintln!(
            "rdma-verbs: {} request(s) of QP {} never completed, even flushed; aborting",
            self.outstanding,
            self.qp.qp_num()
        );
        std::process::abort();
    }
}

impl<T: Transport, S: State> Drop for PostScope<'_, '_, '_, T, S> {
    fn drop(&mut self) {
        // Reached with requests outstanding only when the closure panicked.
        if self.outstanding > 0 {
            let _ = self.drain();
        }
    }
}

impl<'s, 'env, 'res, T: Transport> PostScope<'s, 'env, 'res, T, ReadyToSend> {
    /// Posts a chain of send requests (one doorbell). Their memory regions stay borrowed until
    /// the scope ends; every request is made signaled.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`]; requests before a refused one were posted and are counted.
    pub fn post_send(&mut self, wrs: &mut [SendRequest<'_, 's>]) -> Result<()> {
        for wr in wrs.iter_mut() {
            wr.set_signaled();
        }
        // SAFETY: every region the requests name is borrowed for 's, which lasts until this
        // scope has seen each request complete (drain, also on panic): no plain slice of those
        // regions can be made meanwhile (that needs `&mut` to the region).
        let r = unsafe { self.qp.post_send(wrs) };
        self.count_posted(&r, wrs.len());
        r
    }
}

impl<'s, 'env, 'res, T: Transport, S: CanPostRecv> PostScope<'s, 'env, 'res, T, S> {
    /// Posts a chain of receive requests (one doorbell). Their memory regions stay borrowed
    /// until the scope ends.
    ///
    /// # Errors
    /// As [`QueuePair::post_recv`].
    pub fn post_recv(&mut self, wrs: &mut [RecvRequest<'_, 's>]) -> Result<()> {
        // SAFETY: as in `post_send`.
        let r = unsafe { self.qp.post_recv(wrs) };
        self.count_posted(&r, wrs.len());
        r
    }
}
