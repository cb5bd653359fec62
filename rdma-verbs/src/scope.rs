//! The safe posting layer: [`QueuePair::scope`] and [`PostScope`].
//!
//! A scope borrows every memory region its requests name for the whole scope, and does not
//! return until each request it posted has completed: on normal exit, on error, and on panic.
//! So while a request may touch a region, Rust code cannot take a plain slice of it:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # use std::time::Duration;
//! # fn f(qp: &QueuePair<'_, Rc, ReadyToSend>, mut mr: MemoryRegion<'_>) -> Result<()> {
//! qp.scope(Duration::from_secs(1), |s| {
//!     let sge = [mr.sge(..)?];
//!     s.post_send(&mut [SendRequest::send(1, &sge)])?;
//!     mr.as_mut_slice()?[0] = 1; // error: `mr` is borrowed by the in-flight send
//!     Ok(())
//! })
//! # }
//! ```

use std::marker::PhantomData;
use std::time::Duration;

use crate::cq::CompletionQueue;
use crate::cq_holder::CqHolder;
use crate::cq_owner::CqOwner;
use crate::error::{Error, Result};
use crate::ffi;
use crate::qp::quiesce::{self, Quiesced};
use crate::qp::state::{CanPostRecv, ReadyToSend, Transport, TypeState};
use crate::qp::Inner;
use crate::qp::QueuePair;
use crate::wait::deadline::Deadline;
use crate::wait::{CqWaiter, WaitPolicy};
use crate::wc::WorkCompletion;
use crate::wr::{RecvRequest, SendRequest};
use crate::wr_id::{scope_tag, untag_scope, RESERVED_WR_ID_BITS, SCOPE_RECV, SCOPE_SEND};

/// Requests posted through a scope, all complete by the time the scope ends.
///
/// Every send posted in a scope is signaled, so each request, sent or received, yields exactly
/// one completion (success, error, or flush) that the scope counts. Completions are read with
/// [`poll`](PostScope::poll) and [`wait`](PostScope::wait), which give back the requests'
/// own `wr_id`s; those left when the closure returns are drained by the scope.
///
/// Completions of other QPs on the scope's CQs are returned by `poll` like any other, and
/// discarded by the drain.
///
/// # Which completions are the scope's
/// A scope tags the `wr_id` of every request it posts (bits 62 and 63, which requests must leave
/// clear) and counts only completions of its QP that carry its tag, so completions of requests
/// posted otherwise (raw posts, a shared receive queue's receives consumed through the QP) never
/// end it early. It owns its QP's completion queues while it runs: a second scope on the same
/// QP or CQs (nested, or on another thread) is refused with [`Error::Busy`], and so is
/// [`CompletionQueue::poll`](crate::CompletionQueue::poll) on them, which would take the
/// completions the scope waits for.
///
/// # Ending
/// When the closure returns (or panics), the scope waits for its requests up to its drain
/// timeout; past that it flushes them (QP to the error state) and waits for the flushed
/// completions, at least five seconds. Only if some never come (lost to a CQ that other QPs
/// overran) does it reset the QP, after that long in the error state (a reset that races a
/// packet in progress is not enough on rxe: see [`docs/safety.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/safety.md)); the reset removes every
/// request without a completion, and the QP's type then no longer tells its state
/// ([`QueuePair::state`] does). Only a device that refuses even the reset makes it abort the
/// process, rather than end the borrows while the NIC may write.
pub struct PostScope<'s, 'env: 's, T: Transport, S: TypeState> {
    qp: &'env QueuePair<'env, T, S>,
    sends: usize,
    recvs: usize,
    drain_timeout: Duration,
    wait_policy: WaitPolicy,
    /// A send scope ([`QueuePair::send_scope`]): it owns, polls and waits on the send CQ
    /// alone, and posts no receive.
    sends_only: bool,
    /// The thread that opened a batch ([`PostScope::batch`]) not yet completed or aborted. A
    /// live [`WrBatch`](crate::WrBatch) borrows the scope, so when the scope is used again with
    /// this set, the batch was forgotten (`mem::forget`): see
    /// [`end_forgotten_batch`](Self::end_forgotten_batch).
    pub(crate) open_batch: Option<std::thread::ThreadId>,
    /// Dropped after `Drop::drop` drained: the CQs are released last.
    _claim: CqClaim<'env>,
    /// Invariant in 's, like `std::thread::Scope`: borrows given to the scope last exactly 's.
    _scope: PhantomData<&'s mut &'s ()>,
}

/// A posting scope's ownership of its QP's completion queues (one, or two when they differ).
struct CqClaim<'a> {
    _send: CqOwner<'a>,
    _recv: Option<CqOwner<'a>>,
}

impl<'a> CqClaim<'a> {
    /// Both CQs, or (`recv` `None`) the send CQ alone.
    fn take(send: &'a CompletionQueue<'a>, recv: Option<&'a CompletionQueue<'a>>, what: &'static str) -> Result<Self> {
        let _send = CqOwner::claim(send.into(), CqHolder::PostingScope, what)?;
        let _recv = if let Some(recv) = recv.filter(|recv| !std::ptr::eq(send, *recv)) {
            Some(CqOwner::claim(recv.into(), CqHolder::PostingScope, what)?)
        } else {
            None
        };
        Ok(CqClaim { _send, _recv })
    }
}

impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
    /// Runs `f` with a [`PostScope`] for posting requests safely, then waits until every request
    /// posted in it has completed.
    ///
    /// Memory regions named by the scope's requests stay borrowed until the scope returns, so no
    /// plain slice of them can exist while the NIC may use them. If requests are still
    /// outstanding when `f` returns (or panics), the scope polls for them up to
    /// `drain_timeout`, then flushes them (error state) and waits for the flushed completions,
    /// as long again but at least five seconds (the local device alone makes them), and resets
    /// the QP only if some never come (see the [`PostScope`] docs). [`Duration::MAX`] waits
    /// without a deadline. A short timeout is a decision to tear the connection down if
    /// requests are still in flight when `f` returns: with [`Duration::ZERO`] the scope looks
    /// once, then flushes.
    ///
    /// `f`'s error type is the scope's: anything an [`Error`] converts into (this crate's
    /// `Error`, `Box<dyn std::error::Error>`, `anyhow::Error`, ...).
    ///
    /// # Datagrams
    /// On a UD QP, receives still posted when `f` returns are normal (datagrams that did not
    /// come): once the scope's sends completed (up to `drain_timeout`), it cancels them at once
    /// instead of waiting for them. It flushes the QP (error state), takes every flushed
    /// completion (the device alone makes them, at once; it waits for them as above), and
    /// brings the QP back to the
    /// state its type names (RESET, then INIT with the port, P_Key index and Q_Key it had,
    /// and on: a UD QP needs nothing from a peer), so the scope returns `f`'s result and the
    /// QP takes requests again. Completions of those receives that `f` did not take are dropped,
    /// errors included: only a failed send is reported.
    ///
    /// # Errors
    /// `f`'s own error first, whatever the drain found. Otherwise: [`Error::Busy`] when another
    /// scope owns this QP's CQs (nothing ran); [`Error::WorkCompletion`] for the first failed
    /// request drained at the end (those `f` polled are its own to check);
    /// [`Error::Timeout`] when requests had to be flushed or the QP reset (on a UD QP: sends,
    /// not receives); [`Error::Verb`] when a UD QP cancelled its receives and could not be
    /// brought back to its state.
    pub fn scope<'env, R, E>(
        &'env self,
        drain_timeout: Duration,
        f: impl for<'s> FnOnce(&mut PostScope<'s, 'env, T, S>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>
    where
        E: From<Error>,
    {
        let claim = CqClaim::take(self.send_cq(), Some(self.recv_cq()), "QueuePair::scope")?;
        self.run_scope(claim, drain_timeout, false, f)
    }

    fn run_scope<'env, R, E>(
        &'env self,
        claim: CqClaim<'env>,
        drain_timeout: Duration,
        sends_only: bool,
        f: impl for<'s> FnOnce(&mut PostScope<'s, 'env, T, S>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>
    where
        E: From<Error>,
    {
        let mut scope = PostScope {
            qp: self,
            sends: 0,
            recvs: 0,
            drain_timeout,
            wait_policy: WaitPolicy::default(),
            sends_only,
            open_batch: None,
            _claim: claim,
            _scope: PhantomData,
        };
        let r = f(&mut scope);
        let drained = scope.drain();
        match (r, drained) {
            (Err(e), _) => Err(e),
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(d)) => Err(d.into()),
        }
    }
}

impl<'res, T: Transport> QueuePair<'res, T, ReadyToSend> {
    /// [`scope`](Self::scope) for sends only: the scope owns the QP's send CQ alone, so a
    /// [`RecvRing`](crate::RecvRing) (which owns the receive CQ) can run beside it on the same
    /// QP. The way a UD server answers what its ring receives: each reply a
    /// [`SendRequest::to`] the sender's address
    /// ([`AddressHandle::from_wc`](crate::AddressHandle::from_wc)), QP number and Q_Key.
    ///
    /// The QP needs its own send CQ (one CQ for both queues is the ring's, and the scope gets
    /// [`Error::Busy`]). [`PostScope::post_recv`] is refused; [`PostScope::poll`] and
    /// [`PostScope::wait`] look at the send CQ only. The drain is the scope's, but for one
    /// thing: a send that does not complete within `drain_timeout` is flushed by moving the QP
    /// to the error state, which flushes the ring's receives too.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use rdma_verbs::*;
    /// # fn f(qp: &QueuePair<'_, Ud, ReadyToSend>, ring: &mut RecvRing<'_>, mr: &MemoryRegion<'_>, qkey: u32) -> Result<()> {
    /// let msg = ring.recv(Duration::from_secs(5))?;
    /// msg.ok()?;
    /// let back = qp.pd().create_ah_from_wc(1, msg.completion(), msg.bytes())?;
    /// qp.send_scope(Duration::from_secs(1), |s| -> Result<()> {
    ///     let reply = [mr.sge(..5)?];
    ///     s.post_send(&mut [SendRequest::send(1, &reply).to(&back, msg.src_qp(), qkey)])?;
    ///     let mut wcs: [WorkCompletion; 1] = Default::default();
    ///     s.wait(1, &mut wcs, Duration::from_secs(1))?[0].ok()?;
    ///     Ok(())
    /// })?;
    /// ring.release(msg)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`scope`](Self::scope); [`Error::Busy`] when another layer owns the send CQ (a ring
    /// on a QP whose two queues share one CQ, say).
    pub fn send_scope<'env, R, E>(
        &'env self,
        drain_timeout: Duration,
        f: impl for<'s> FnOnce(&mut PostScope<'s, 'env, T, ReadyToSend>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>
    where
        E: From<Error>,
    {
        let claim = CqClaim::take(self.send_cq(), None, "QueuePair::send_scope")?;
        self.run_scope(claim, drain_timeout, true, f)
    }
}

impl<'s, 'env, T: Transport, S: TypeState> PostScope<'s, 'env, T, S> {
    /// Requests posted in this scope that have not completed yet.
    pub fn outstanding(&self) -> usize {
        self.sends + self.recvs
    }

    /// The queue pair the scope posts to.
    pub fn qp(&self) -> &'env QueuePair<'env, T, S> {
        self.qp
    }

    /// Polls the QP's send and receive CQs (a send scope: the send CQ) into `out`:
    /// `ibv_poll_cq()`. Completions of this
    /// scope's requests count down [`outstanding`](Self::outstanding) and carry the `wr_id` they
    /// were posted with; other completions of the CQs are returned as they are.
    ///
    /// # Errors
    /// [`Error::Verb`] when polling fails.
    pub fn poll<'o>(&mut self, out: &'o mut [WorkCompletion]) -> Result<&'o mut [WorkCompletion]> {
        self.poll_counting(out, |_, _| ())
    }

    /// `poll`, calling `ours` with each of this scope's completions and whether it is a
    /// receive's.
    fn poll_counting<'o>(
        &mut self,
        out: &'o mut [WorkCompletion],
        mut ours: impl FnMut(&WorkCompletion, bool),
    ) -> Result<&'o mut [WorkCompletion]> {
        let (send_cq, recv_cq) = (self.qp.send_cq(), self.qp.recv_cq());
        let n = send_cq.poll_owned(out)?.len();
        let m = if self.sends_only || std::ptr::eq(send_cq, recv_cq) || n == out.len() {
            0
        } else {
            // A failure here must not lose the send completions already taken: report it on the
            // next poll instead.
            match recv_cq.poll_owned(&mut out[n..]) {
                Ok(got) => got.len(),
                Err(e) if n == 0 => return Err(e),
                Err(_) => 0,
            }
        };
        let got = &mut out[..n + m];
        let qpn = self.qp.qp_num();
        for wc in got.iter_mut() {
            let id = wc.wr_id();
            let Some(receive) = scope_tag(id).filter(|_| wc.qp_num() == qpn) else { continue };
            if receive {
                self.recvs = self.recvs.saturating_sub(1);
            } else {
                self.sends = self.sends.saturating_sub(1);
            }
            wc.set_wr_id(untag_scope(id));
            ours(wc, receive);
        }
        Ok(got)
    }

    /// Waits until `n` completions arrived or `timeout` passed, writing them into `out`
    /// (which must have room for `n`): polls, spinning for the scope's [`WaitPolicy`], then
    /// sleeps on the CQs' completion channel(s) ([`CqWaiter`]). [`Duration::MAX`] waits without
    /// a deadline.
    ///
    /// # Errors
    /// [`Error::Timeout`] when fewer came in time (those that came are lost to the caller but
    /// counted); [`Error::NothingToWaitFor`] as soon as more completions are still wanted than
    /// the scope has requests [outstanding](Self::outstanding) (at once when `n` is more than
    /// that to begin with; completions taken by then are lost to the caller but counted);
    /// [`Error::InvalidArgument`] if `out` is shorter than `n`.
    pub fn wait<'o>(
        &mut self,
        n: usize,
        out: &'o mut [WorkCompletion],
        timeout: Duration,
    ) -> Result<&'o mut [WorkCompletion]> {
        if out.len() < n {
            return Err(Error::invalid(
                "ibv_poll_cq",
                Some(self.qp.pd().context().name()),
                format!("room for {} completions, {n} wanted", out.len()),
            ));
        }
        let deadline = Deadline::after(timeout);
        let mut reflush = crate::recv_ring::Reflush::new();
        let mut waiter = CqWaiter::new(self.wait_policy);
        let qp = self.qp.shared();
        let cqs: [&CompletionQueue<'_>; 2] = [&qp.send_cq, &qp.recv_cq];
        let cqs = if self.sends_only { &cqs[..1] } else { &cqs[..] };
        let mut got = 0;
        while got < n {
            if n - got > self.outstanding() {
                return Err(Error::NothingToWaitFor { what: "completions of a posting scope" });
            }
            let until = if self.recvs > 0 { deadline.min(reflush.at()) } else { deadline };
            let step = || {
                // Receives posted to a QP in the error state complete only when it is moved to
                // error again, on rxe: see `reflush_if_in_error`.
                if reflush.due() && self.recvs > 0 {
                    qp.reflush_if_in_error();
                }
                let now = self.poll(&mut out[got..n])?.len();
                got += now;
                Ok((now > 0).then_some(()))
            };
            if waiter.wait(cqs, until, step)?.is_none() && deadline.has_passed() {
                return Err(Error::Timeout { what: "completions", after: timeout });
            }
        }
        Ok(&mut out[..n])
    }

    /// How the scope's waits wait: spin budget, then sleep on the CQs' channel(s) (see
    /// [`WaitPolicy`]; CQs without a channel can only spin).
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.wait_policy = policy;
    }

    /// Refuses `sends` + `recvs` more requests if the QP's queues or its CQs could not hold them
    /// with those already outstanding: a CQ that overflows loses completions, and the scope
    /// would wait for them forever.
    pub(crate) fn check_room(&self, sends: usize, recvs: usize) -> Result<()> {
        self.check_room_beside(0, sends, recvs)
    }

    /// [`check_room`](Self::check_room) beside `pending` sends an open batch holds, not yet
    /// posted: they take room as posted ones do, and an error counts them as in use.
    pub(crate) fn check_room_beside(&self, pending: usize, sends: usize, recvs: usize) -> Result<()> {
        let caps = self.qp.caps();
        let (send_cq, recv_cq) = (self.qp.send_cq(), self.qp.recv_cq());
        let full = |queue: &'static str, capacity: u32, outstanding: usize| Error::QueueFull {
            device: Some(self.qp.pd().context().name().to_owned()),
            queue,
            capacity,
            outstanding: u32::try_from(outstanding).unwrap_or(u32::MAX),
        };
        let fits = |have: usize, more: usize, cap: u32| have.saturating_add(more) <= cap as usize;
        let own_sends = self.sends + pending;
        if !fits(own_sends, sends, caps.max_send_wr) {
            return Err(full("send queue", caps.max_send_wr, own_sends));
        }
        if !fits(self.recvs, recvs, caps.max_recv_wr) {
            return Err(full("receive queue", caps.max_recv_wr, self.recvs));
        }
        if std::ptr::eq(send_cq, recv_cq) {
            let have = own_sends + self.recvs;
            if !fits(have, sends + recvs, send_cq.cqe()) {
                return Err(full("completion queue", send_cq.cqe(), have));
            }
        } else if !fits(own_sends, sends, send_cq.cqe()) {
            return Err(full("completion queue of sends", send_cq.cqe(), own_sends));
        } else if !fits(self.recvs, recvs, recv_cq.cqe()) {
            return Err(full("completion queue of receives", recv_cq.cqe(), self.recvs));
        }
        Ok(())
    }

    /// How many more sends [`check_room`](Self::check_room) would accept now: the rule it
    /// checks, as a count.
    pub(crate) fn send_room(&self) -> usize {
        let caps = self.qp.caps();
        let (send_cq, recv_cq) = (self.qp.send_cq(), self.qp.recv_cq());
        let left = |cap: u32, have: usize| (cap as usize).saturating_sub(have);
        let cq = if std::ptr::eq(send_cq, recv_cq) {
            left(send_cq.cqe(), self.sends + self.recvs)
        } else {
            left(send_cq.cqe(), self.sends)
        };
        left(caps.max_send_wr, self.sends).min(cq)
    }

    /// Checks a request a batch is about to add as `post_send` would, but for the queues' room
    /// (the batch counts it: [`send_room`](Self::send_room)).
    pub(crate) fn check_request(&self, wr: &SendRequest<'_, '_>) -> Result<()> {
        let device = || self.qp.pd().context().name();
        if wr.wr_id() & RESERVED_WR_ID_BITS != 0 {
            check_wr_ids(std::iter::once(wr.wr_id()), "ibv_wr_post", device())?;
        }
        crate::wr::check_send(wr, &self.qp.caps(), T::QP_TYPE, self.qp.pd().as_raw(), device)
    }

    /// Counts `n` sends a batch posted.
    pub(crate) fn count_sends(&mut self, n: usize) {
        self.sends += n;
    }

    /// Posts one signaled send-queue request through `post` (a verb of one request,
    /// `ibv_bind_mw`), which gets the scope-tagged `wr_id`, and counts it whether or not `post`
    /// succeeded: a provider may queue the request and then fail its doorbell (rxe's
    /// `ibv_bind_mw` is its `ibv_post_send`), so a failed post may still complete, and only a
    /// request counted keeps the scope's borrows alive until its completion or the drain.
    pub(crate) fn post_one(
        &mut self,
        wr_id: u64,
        verb: &'static str,
        post: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        self.end_forgotten_batch();
        check_wr_ids(std::iter::once(wr_id), verb, self.qp.pd().context().name())?;
        self.qp.shared().check_postable(verb)?;
        self.check_room(1, 0)?;
        let r = post(wr_id | SCOPE_SEND);
        self.sends += 1;
        r
    }

    /// Aborts a batch opened in this scope whose [`WrBatch`](crate::WrBatch) was forgotten
    /// (`mem::forget`), before the scope uses the QP again: an open batch holds the provider's
    /// send-queue lock (rxe, mlx5), so the next post to the QP, from this scope or any thread,
    /// would wait for it for ever. Nothing of the batch was posted, so aborting it loses no
    /// request the scope counted. A batch opened on another thread than this one's is left
    /// (the provider's lock is that thread's to release); the scope's end tries again.
    pub(crate) fn end_forgotten_batch(&mut self) {
        // The thread is asked only when a batch is open: never on the posting path itself.
        let Some(opener) = self.open_batch else { return };
        if opener != std::thread::current().id() {
            return;
        }
        self.open_batch = None;
        if let Some((qpx, _)) = self.qp.extended() {
            // SAFETY: this thread opened the batch on the scope's live extended QP, and neither
            // completed nor aborted it (its `WrBatch`, which would have, was forgotten).
            unsafe { crate::post::raw::abort(qpx) };
        }
    }

    /// Waits for, then flushes, then resets what is still outstanding (`qp/quiesce.rs`); on a
    /// UD QP, cancels the receives still posted once the sends are done
    /// ([`drain_datagrams`](Self::drain_datagrams)).
    fn drain(&mut self) -> Result<()> {
        self.end_forgotten_batch();
        if T::QP_TYPE == ffi::ibv_qp_type::IBV_QPT_UD && self.recvs > 0 {
            return self.drain_datagrams();
        }
        let mut first_error = None;
        let mut buf: [WorkCompletion; 16] = Default::default();
        let qp = self.qp.shared();
        let cqs: [&CompletionQueue<'_>; 2] = [&qp.send_cq, &qp.recv_cq];
        let cqs = if self.sends_only { &cqs[..1] } else { &cqs[..] };
        let outcome = quiesce::quiesce(
            qp,
            cqs,
            self.drain_timeout,
            false,
            || {
                // A polling error must not end the scope early (the borrows would end while the NIC
                // may still write): keep trying until the deadline, then escalate.
                let _ = self.poll_counting(&mut buf, |wc, _| {
                    if first_error.is_none() {
                        first_error = wc.ok().err();
                    }
                });
                self.outstanding() == 0
            },
            || false,
        );
        self.drained(outcome, first_error)
    }

    /// A UD QP's drain with receives still posted, which wait for datagrams that may never come:
    /// waits up to the drain timeout for the sends alone, then flushes the QP, takes every
    /// completion (the cancelled receives' too) and brings the QP back to its typed state. Only
    /// a failed send is an error; sends still outstanding after the drain timeout are flushed,
    /// a timeout as in every drain.
    fn drain_datagrams(&mut self) -> Result<()> {
        let mut first_error = None;
        let mut buf: [WorkCompletion; 16] = Default::default();
        let qp = self.qp.shared();
        let cqs: [&CompletionQueue<'_>; 2] = [&qp.send_cq, &qp.recv_cq];
        // What the QP is brought back with, read before the flush.
        let rearm = DatagramAttr::query(qp);
        let mut poll = |scope: &mut Self| {
            let _ = scope.poll_counting(&mut buf, |wc, receive| {
                if !receive && first_error.is_none() {
                    first_error = wc.ok().err();
                }
            });
        };
        let sent = quiesce::wait(&cqs, self.drain_timeout, &mut || {
            poll(self);
            self.sends == 0
        });
        let outcome = quiesce::quiesce(
            qp,
            &cqs,
            self.drain_timeout,
            true,
            || {
                poll(self);
                self.outstanding() == 0
            },
            || false,
        );
        if outcome == Quiesced::Flushed {
            if let Err(e) = rearm.and_then(|attr| attr.rearm(qp, S::QP_STATE)) {
                // Not in its typed state (ERR, RESET or part of the way up): posts are refused
                // until a typed transition, as after a drain's reset, or each later scope would
                // count them as maybe posted and wait out its drain.
                if !quiesce::reset(qp) {
                    qp.set_reset_by_drain(true);
                }
                return Err(e);
            }
            if !sent {
                return self.drained(Quiesced::Flushed, None);
            }
            return first_error.map_or(Ok(()), Err);
        }
        self.drained(outcome, first_error)
    }

    /// What a drain's `outcome` means for the scope; `first_error`: the first failed request
    /// it took.
    fn drained(&mut self, outcome: Quiesced, first_error: Option<Error>) -> Result<()> {
        let mut buf: [WorkCompletion; 16] = Default::default();
        let qp = self.qp.shared();
        match outcome {
            Quiesced::Completed => first_error.map_or(Ok(()), Err),
            Quiesced::Flushed => {
                Err(Error::Timeout { what: "draining a posting scope (flushed)", after: self.drain_timeout })
            }
            // Some completions were lost (a CQ overrun by other QPs): after `FLUSH_CONFIRM` in
            // the error state nothing is left in progress, so the reset removes only requests
            // the device no longer uses, rxe included.
            Quiesced::Lost { .. } if quiesce::reset(qp) => {
                self.sends = 0;
                self.recvs = 0;
                // Completions the flush produced before the reset must not be counted by a later
                // scope of this QP: take them now.
                while self.poll_counting(&mut buf, |_, _| ()).is_ok_and(|got| !got.is_empty()) {}
                Err(Error::Timeout { what: "draining a posting scope (QP reset)", after: self.drain_timeout })
            }
            Quiesced::Lost { .. } => {
                // The NIC may still write memory the scope borrowed; ending the borrows would be
                // unsound.
                eprintln!(
                    "rdma-verbs: {} request(s) of QP {} never completed, and the device refused to reset it; aborting",
                    self.outstanding(),
                    self.qp.qp_num()
                );
                std::process::abort();
            }
        }
    }
}

/// Refuses requests whose `wr_id` uses the bits a scope tags with.
fn check_wr_ids(ids: impl Iterator<Item = u64>, verb: &'static str, device: &str) -> Result<()> {
    for id in ids {
        if id & RESERVED_WR_ID_BITS != 0 {
            let reason = format!("wr_id {id:#x} uses bits 62-63, which a posting scope tags its requests with");
            return Err(Error::invalid(verb, Some(device), reason));
        }
    }
    Ok(())
}

impl<T: Transport, S: TypeState> Drop for PostScope<'_, '_, T, S> {
    fn drop(&mut self) {
        self.end_forgotten_batch();
        // Reached with requests outstanding only when the closure panicked.
        if self.outstanding() > 0 {
            let _ = self.drain();
        }
    }
}

impl<'s, 'env, T: Transport> PostScope<'s, 'env, T, ReadyToSend> {
    /// Posts a chain of send requests (one doorbell). Their memory regions stay borrowed until
    /// the scope ends; every request is made signaled.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and [`Error::QueueFull`] when the QP's send queue or a CQ
    /// could not hold the requests with those outstanding (nothing posted); a `wr_id` of
    /// 2^62 or more is an [`Error::InvalidArgument`]. Requests before one the provider
    /// refused were posted and are counted.
    pub fn post_send(&mut self, wrs: &mut [SendRequest<'_, 's>]) -> Result<()> {
        self.end_forgotten_batch();
        let device = self.qp.pd().context().name();
        check_wr_ids(wrs.iter().map(SendRequest::wr_id), "ibv_post_send", device)?;
        self.check_room(wrs.len(), 0)?;
        for wr in wrs.iter_mut() {
            wr.set_signaled();
            wr.set_wr_id(wr.wr_id() | SCOPE_SEND);
        }
        // SAFETY: every region the requests name is borrowed for 's, which lasts until this
        // scope has seen each request complete, or reset the QP (drain, also on panic): no
        // plain slice of those regions can be made meanwhile (that needs `&mut` to the region).
        let r = unsafe { self.qp.post_send_checked(wrs, true) };
        for wr in wrs.iter_mut() {
            wr.set_wr_id(untag_scope(wr.wr_id()));
        }
        // What may be posted stays outstanding until the drain (`post::raw`).
        let posted = r?;
        self.sends += posted.in_flight();
        posted.result("ibv_post_send", || device).map(drop)
    }
}

impl<'s, 'env, T: Transport, S: CanPostRecv> PostScope<'s, 'env, T, S> {
    /// Posts a chain of receive requests (one doorbell). Their memory regions stay borrowed
    /// until the scope ends.
    ///
    /// # Errors
    /// As [`QueuePair::post_recv`], and as [`post_send`](PostScope::post_send) for a full
    /// receive queue or CQ and for reserved `wr_id` bits; [`Error::InvalidArgument`] in a send
    /// scope ([`QueuePair::send_scope`]).
    pub fn post_recv(&mut self, wrs: &mut [RecvRequest<'_, 's>]) -> Result<()> {
        self.end_forgotten_batch();
        let device = self.qp.pd().context().name();
        if self.sends_only {
            let reason = "a send scope posts no receive: the QP's receives and their CQ are another layer's";
            return Err(Error::invalid("ibv_post_recv", Some(device), reason));
        }
        check_wr_ids(wrs.iter().map(RecvRequest::wr_id), "ibv_post_recv", device)?;
        if !self.qp.has_srq() {
            self.check_room(0, wrs.len())?;
        }
        for wr in wrs.iter_mut() {
            wr.set_wr_id(wr.wr_id() | SCOPE_RECV);
        }
        // SAFETY: as in `post_send`.
        let r = unsafe { self.qp.post_recv_checked(wrs, true) };
        for wr in wrs.iter_mut() {
            wr.set_wr_id(untag_scope(wr.wr_id()));
        }
        // As in `post_send`.
        let posted = r?;
        self.recvs += posted.in_flight();
        posted.result("ibv_post_recv", || device).map(drop)
    }
}

/// What a UD QP is brought back to its state with, after a scope cancelled its receives: the
/// attributes its INIT and RTS transitions took.
struct DatagramAttr {
    port: u8,
    pkey_index: u16,
    qkey: u32,
    sq_psn: u32,
}

impl DatagramAttr {
    const VERB: &'static str = "ibv_query_qp";

    /// `ibv_query_qp()` for them.
    fn query(qp: &Inner<'_>) -> Result<Self> {
        use ffi::ibv_qp_attr_mask as m;
        let mut attr = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RESET);
        // SAFETY: all-zero is a valid `ibv_qp_init_attr` (integers and null pointers).
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0 | m::IBV_QP_QKEY.0 | m::IBV_QP_SQ_PSN.0;
        // SAFETY: a live QP; both out-structs are valid and writable.
        let rc = unsafe { ffi::ibv_query_qp(qp.raw(), &mut attr, mask as libc::c_int, &mut init) };
        Error::check(Self::VERB, Some(qp.device()), rc)?;
        Ok(DatagramAttr { port: attr.port_num, pkey_index: attr.pkey_index, qkey: attr.qkey, sq_psn: attr.sq_psn })
    }

    /// RESET, then up to `target` (INIT, RTR, RTS) with these attributes: what a UD QP needs,
    /// no peer taking part.
    fn rearm(&self, qp: &Inner<'_>, target: ffi::ibv_qp_state::Type) -> Result<()> {
        use ffi::ibv_qp_attr_mask as m;
        use ffi::ibv_qp_state::{IBV_QPS_INIT, IBV_QPS_RESET, IBV_QPS_RTR, IBV_QPS_RTS};
        qp.set_state(IBV_QPS_RESET)?;
        for (state, mask) in [
            (IBV_QPS_INIT, m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0 | m::IBV_QP_QKEY.0),
            (IBV_QPS_RTR, 0),
            (IBV_QPS_RTS, m::IBV_QP_SQ_PSN.0),
        ] {
            if !reaches(target, state) {
                break;
            }
            let mut attr = zeroed_attr(state);
            attr.port_num = self.port;
            attr.pkey_index = self.pkey_index;
            attr.qkey = self.qkey;
            attr.sq_psn = self.sq_psn;
            // SAFETY: a live QP; `attr` holds every attribute the mask names.
            let rc = unsafe { ffi::ibv_modify_qp(qp.raw(), &mut attr, (m::IBV_QP_STATE.0 | mask) as libc::c_int) };
            Error::check("ibv_modify_qp", Some(qp.device()), rc)?;
        }
        Ok(())
    }
}

/// An `ibv_qp_attr` for a move to `state`, every other attribute zero.
fn zeroed_attr(state: ffi::ibv_qp_state::Type) -> ffi::ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is plain integers and structs of them: all-zero is valid.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = state;
    attr
}

/// Whether a QP on its way up to `target` passes through `state` (RESET < INIT < RTR < RTS).
fn reaches(target: ffi::ibv_qp_state::Type, state: ffi::ibv_qp_state::Type) -> bool {
    use ffi::ibv_qp_state::{IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
    let rank = |s| match s {
        IBV_QPS_INIT => 1,
        IBV_QPS_RTR => 2,
        IBV_QPS_RTS => 3,
        _ => 0,
    };
    rank(state) <= rank(target)
}
