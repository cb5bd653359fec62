//! Posting with owned buffers: [`SendQueue`], [`SlotRequest`], [`SlotCompletion`].
//!
//! A [`SendQueue`] posts requests that *own* their [`Slot`]: the slot moves into the request,
//! so no Rust code can touch its bytes while the NIC may, and comes back in the request's
//! [`SlotCompletion`]. Send queues complete in order, so one signaled completion returns every slot
//! posted before it: a pipeline signals once per batch (the last request of each
//! [`submit`](SendQueue::submit) is signaled, unless it asks not to be:
//! [`SlotRequest::unsignaled`]), keeps hundreds of requests in flight, and allocates nothing per
//! request.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use rdma_verbs::*;
//! # fn f(qp: &QueuePair<'_, Rc, ReadyToSend>, pool: &SlotPool<'_>, peer: RemoteRegion) -> Result<()> {
//! let mut sq = SendQueue::new(qp, Duration::from_secs(1))?;
//! let mut slot = pool.try_take().expect("a free slot");
//! slot.as_mut_slice()?[..5].copy_from_slice(b"hello");
//! sq.push(SlotRequest::write(slot, 5, peer))?; // the slot is the request's now
//! sq.submit()?;                            // one doorbell for everything pushed
//! sq.wait(Duration::from_secs(1), |done| {
//!     done.ok().expect("written");
//!     let slot = done.slot.expect("the slot comes back"); // reuse it, or drop it into the pool
//! })?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi;

use crate::cq_holder::CqHolder;
use crate::cq_owner::CqOwner;
use crate::error::{Error, Result};
use crate::mr::AccessFlags;
use crate::pool::Slot;
use crate::qp::quiesce::{self, Quiesced};
use crate::qp::state::{Connected, ReadyToSend};
use crate::qp::{Inner, QueuePair};
use crate::request::{Op, PostError, Rejected, SlotCompletion, SlotRequest};
use crate::wait::deadline::Deadline;
use crate::wait::{CqWaiter, WaitPolicy};
use crate::wc::{WcStatus, WorkCompletion};
use crate::wr_id::{next_generation, untag, Space, LOW_MASK};

mod posting;
pub use posting::Posting;
use posting::Tail;

/// How many completions one poll takes.
pub(crate) const POLL_BATCH: usize = 32;

/// A request in flight: what it owns until its completion (or a later one) comes.
struct Held<'pd> {
    seq: u64,
    wr_id: u64,
    slot: Option<Slot<'pd>>,
    /// The device writes into the slot (an RDMA READ), rather than only reading it.
    device_writes: bool,
    /// A probe ([`SendQueue::probe`]).
    probe: bool,
}

/// The send queue of a ready-to-send RC or UC queue pair, posting requests that own their
/// [`Slot`]s and giving each slot back with its completion.
///
/// It owns the QP's send CQ while it lives (a posting scope or a direct
/// [`CompletionQueue::poll`](crate::CompletionQueue::poll) on it gets [`Error::Busy`]); give
/// the QP separate send and receive CQs to use a [`RecvRing`](crate::RecvRing) beside it.
/// Completions of other QPs on that CQ are discarded. It holds the QP (the verbs QP lives until
/// the queue is gone too), needs no borrow of it, and is `Send`: with shared parents (see
/// [`Parent`](crate::Parent)) it is `'static` and a thread can own it.
///
/// # Capacity
/// At most [`capacity`](Self::capacity) requests are pushed and in flight at once: the QP's
/// `max_send_wr`, or the CQ's capacity if smaller, so the CQ never overflows.
///
/// # Dropping
/// Requests pushed but not submitted are dropped (their slots return to the pool). Requests
/// in flight: if the queue is the QP's last holder, the QP is destroyed before the slots
/// return. Otherwise the queue waits for them up to its `drain_timeout`, then flushes the QP
/// (error state) and waits for the flushed completions (at least five seconds: the local device
/// alone makes them). A slot returns only with its completion: if some never come (a CQ overrun
/// by other QPs loses them), the QP is reset and those slots are leaked, not reused.
/// Forgetting the queue leaks the slots in flight (and their pool), and leaves the CQ owned.
///
/// # When another layer resets the QP
/// A drain that resets the QP (a posting scope's, a ring's, another queue's) removes this
/// queue's requests without completions: their slots stay held (never handed out); when this
/// queue is dropped they return only if it holds the QP's last handle (the QP is destroyed
/// first), and are leaked otherwise. The typed handle still says
/// `ReadyToSend`; posts are refused ([`Error::InvalidArgument`], nothing reaches the provider)
/// until a transition (`modify_with`) brings the QP out of RESET.
#[must_use = "dropping it at once releases what was just made"]
pub struct SendQueue<'res, T: Connected> {
    /// Dropped before `held`: when this is the last handle, the QP is destroyed before the
    /// slots it may use return to their pool.
    qp: Arc<Inner<'res>>,
    cq: CqOwner<'res>,
    generation: u64,
    next_seq: u64,
    /// One past the last request posted signaled: requests before it complete visibly (a
    /// signaled completion covers every earlier one). Requests from it on are unsignaled and
    /// complete silently when they succeed: after a chain the provider refused part of, or
    /// requests that asked for no completion ([`SlotRequest::unsignaled`]).
    covered_upto: u64,
    depth: usize,
    held: VecDeque<Held<'res>>,
    staged: Vec<SlotRequest<'res>>,
    /// Scratch for one doorbell, allocated once.
    wrs: Vec<ffi::ibv_send_wr>,
    sges: Vec<ffi::ibv_sge>,
    wcs: [WorkCompletion; POLL_BATCH],
    /// Completions taken from the CQ and not yet delivered (`wcs[wc_next..wc_len]`): kept
    /// if a callback panics, so none is lost.
    wc_next: usize,
    wc_len: usize,
    drain_timeout: Duration,
    wait_policy: WaitPolicy,
    posting: Posting,
    _transport: PhantomData<T>,
}

// SAFETY: the raw pointers in `wrs`/`sges` are scratch: each `post_chain` writes them afresh
// and uses them only until it returns, so no pointer in them is ever read on another thread;
// everything else (the QP's shared state, slots, the CQ handle) is `Send`.
unsafe impl<T: Connected> Send for SendQueue<'_, T> {}

impl<T: Connected> fmt::Debug for SendQueue<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueue")
            .field("qp_num", &self.qp.qp_num())
            .field("depth", &self.depth)
            .field("in_flight", &self.held.len())
            .field("staged", &self.staged.len())
            .finish()
    }
}

impl<'res, T: Connected> SendQueue<'res, T> {
    /// Takes over the send queue of `qp` (and its send CQ). `drain_timeout` bounds each phase
    /// of the drop's drain (see the type's docs); with [`Duration::MAX`] dropping the queue with
    /// requests in flight may wait without a deadline (a peer that never answers under
    /// `rnr_retry = 7`, say).
    ///
    /// # Errors
    /// [`Error::Busy`] when a posting scope, another `SendQueue` or a
    /// [`RecvRing`](crate::RecvRing) owns the QP's send CQ.
    pub fn new(qp: &QueuePair<'res, T, ReadyToSend>, drain_timeout: Duration) -> Result<Self> {
        Self::take_over(qp, drain_timeout, "SendQueue::new")
    }

    /// [`new`](Self::new), for a queue that will be awaited (`wait_async`, `drain_async`,
    /// `ready_async`): its send CQ must report to a completion channel, or an async wait could
    /// never sleep. Refused here, rather than at the first async wait.
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::InvalidArgument`] when the send CQ has no completion
    /// channel (make it with [`Context::create_cq_with_channel`](crate::Context::create_cq_with_channel)).
    pub fn for_async(qp: &QueuePair<'res, T, ReadyToSend>, drain_timeout: Duration) -> Result<Self> {
        crate::cq::check_awaitable("SendQueue::for_async", qp.send_cq())?;
        Self::take_over(qp, drain_timeout, "SendQueue::for_async")
    }

    fn take_over(qp: &QueuePair<'res, T, ReadyToSend>, drain_timeout: Duration, verb: &'static str) -> Result<Self> {
        let inner = Arc::clone(qp.shared());
        let cq = CqOwner::claim(inner.send_cq.clone(), CqHolder::SendQueue, verb)?;
        let depth = inner.caps.max_send_wr.min(cq.cq().cqe()) as usize;
        let posting = if inner.extended.is_some() { Posting::Batch } else { Posting::Chain };
        Ok(SendQueue {
            qp: inner,
            cq,
            generation: next_generation(),
            next_seq: 0,
            covered_upto: 0,
            depth,
            held: VecDeque::with_capacity(depth),
            staged: Vec::with_capacity(depth),
            wrs: Vec::with_capacity(depth + 1),
            sges: Vec::with_capacity(depth + 1),
            wcs: [WorkCompletion::default(); POLL_BATCH],
            wc_next: 0,
            wc_len: 0,
            drain_timeout,
            wait_policy: WaitPolicy::default(),
            posting,
            _transport: PhantomData,
        })
    }

    /// The most requests pushed and in flight at once.
    pub fn capacity(&self) -> usize {
        self.depth
    }

    /// Requests submitted whose completion has not come back yet.
    pub fn in_flight(&self) -> usize {
        self.held.len()
    }

    /// Requests pushed and not yet submitted.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// How many more requests can be pushed now.
    pub fn room(&self) -> usize {
        self.depth - self.held.len() - self.staged.len()
    }

    /// The send CQ this queue owns, to [`arm`](crate::CompletionQueue::arm) it and wait on its
    /// [channel](crate::CompletionQueue::channel)'s file descriptor (`poll`/`epoll`, or an
    /// async runtime) before calling [`poll`](Self::poll). Polling it directly is refused
    /// ([`Error::Busy`]) while the queue lives.
    pub fn cq(&self) -> &crate::CompletionQueue<'res> {
        self.cq.cq()
    }

    /// The QP's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Adds a request to the next doorbell, after checking it: nothing reaches the device
    /// until [`submit`](Self::submit). Allocates nothing.
    ///
    /// # Errors
    /// The request comes back in [`Rejected`] with [`Error::QueueFull`] when
    /// [`room`](Self::room) is 0, or [`Error::InvalidArgument`] when its length exceeds the slot
    /// or the remote region, the slot's pool is of another protection domain, or a READ is
    /// posted on UC or into a pool without `LOCAL_WRITE`.
    // The refused request comes back by value: boxing it would allocate on the refusal path.
    #[allow(clippy::result_large_err)]
    pub fn push(&mut self, request: SlotRequest<'res>) -> std::result::Result<(), Rejected<'res>> {
        match self.check(&request) {
            Ok(()) => {
                self.staged.push(request);
                Ok(())
            }
            Err(error) => Err(Rejected { error, request }),
        }
    }

    /// `QueueFull` when nothing more can be pushed.
    fn check_room(&self) -> Result<()> {
        if self.room() > 0 {
            return Ok(());
        }
        Err(Error::QueueFull {
            device: Some(self.qp.device().to_owned()),
            queue: "send queue",
            capacity: self.depth as u32,
            outstanding: (self.held.len() + self.staged.len()) as u32,
        })
    }

    fn check(&self, r: &SlotRequest<'_>) -> Result<()> {
        self.check_room()?;
        let device = self.qp.device();
        let bad = |reason: String| Err(Error::invalid("ibv_post_send", Some(device), reason));
        if r.len > r.slot.len() {
            return bad(format!("{} bytes do not fit a slot of {}", r.len, r.slot.len()));
        }
        if r.slot.pd_raw() != self.qp.pd.as_raw() {
            return bad("the slot's pool is registered with another protection domain".into());
        }
        // Refused here rather than by the provider in the middle of a chain: the requests
        // before it would then be posted unsignaled, with no completion to give their slots back.
        if r.len > 0 && self.qp.caps.max_send_sge == 0 {
            return bad(format!("{} bytes need one SGE: the QP takes none (max_send_sge 0)", r.len));
        }
        match r.op {
            Op::Send => {}
            Op::Write | Op::Read if r.len as u64 > r.remote.len => {
                return bad(format!("{} bytes do not fit the remote region of {}", r.len, r.remote.len));
            }
            Op::Write => {}
            Op::Read if T::QP_TYPE != ffi::ibv_qp_type::IBV_QPT_RC => {
                return bad("RDMA READ needs an RC queue pair".into());
            }
            Op::Read if !r.slot.access().contains(AccessFlags::LOCAL_WRITE) => {
                return bad("RDMA READ into a pool without LOCAL_WRITE".into());
            }
            Op::Read => {}
        }
        Ok(())
    }

    /// Posts every pushed request with one doorbell, the last signaled, as
    /// [`posting`](Self::posting) says: one `ibv_post_send()` of a chain, or one batch of
    /// `ibv_wr_*` builders (`ibv_wr_complete()`) on an extended QP. Returns how many were
    /// posted. Allocates nothing.
    ///
    /// # Errors
    /// [`Error::PostFailed`] when the provider refused a request: those before it are in
    /// flight, it and those after stay pushed (submit again, or drop the queue); when it did
    /// not say which (and for a refused batch) every request counts as maybe posted and stays
    /// in flight; [`Error::Unsupported`] when the provider lacks a builder a batch needs
    /// (nothing posted); [`Error::InvalidArgument`] when a drain reset the QP (see
    /// [`QueuePair::scope`](crate::QueuePair::scope)) and no transition has brought it back.
    #[doc(alias = "ibv_post_send")]
    pub fn submit(&mut self) -> Result<usize> {
        self.post_staged(None)
    }

    /// Pushes `request` and submits everything pushed.
    ///
    /// # Errors
    /// As [`push`](Self::push) (nothing posted, the request comes back), and as
    /// [`submit`](Self::submit): the request comes back if it is certainly not posted;
    /// when the provider did not say which request it refused, every request counts as
    /// maybe posted and stays in flight (its slot returns with a completion, or when the
    /// queue is dropped), and the error carries a request-less [`Error`] only.
    ///
    /// [`PostError`] converts with `?` into [`Error`] (the refused request is dropped: its slot
    /// goes back to the pool), and, for a queue of owned (`'static`) resources, into
    /// `Box<dyn std::error::Error + Send + Sync>` (keeping the request). A queue that borrows
    /// its resources gives a `PostError` that borrows them too, which no `'static` error type
    /// can hold: convert it with `map_err(rdma_verbs::Error::from)` first.
    ///
    /// ```no_run
    /// use rdma_verbs::{Rc, SendQueue, SlotPool, SlotRequest};
    ///
    /// fn send<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, bytes: &[u8]) -> rdma_verbs::Result<()> {
    ///     let mut slot = pool.try_take().expect("a free slot");
    ///     slot.write_at(0, bytes)?;
    ///     sq.post(SlotRequest::send(slot, bytes.len()))?;
    ///     Ok(())
    /// }
    ///
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    /// fn send_owned(sq: &mut SendQueue<'static, Rc>, pool: &SlotPool<'static>) -> Result<(), BoxError> {
    ///     let slot = pool.try_take().expect("a free slot");
    ///     sq.post(SlotRequest::send(slot, 0))?;
    ///     Ok(())
    /// }
    /// ```
    // The refused request comes back by value: boxing it would allocate on the refusal path.
    #[allow(clippy::result_large_err)]
    pub fn post(&mut self, request: SlotRequest<'res>) -> std::result::Result<(), PostError<'res>> {
        self.push(request).map_err(PostError::Rejected)?;
        match self.submit() {
            Ok(_) => Ok(()),
            Err(error) => match self.staged.pop() {
                Some(request) => Err(PostError::Rejected(Rejected { error, request })),
                None => Err(PostError::MaybePosted(error)),
            },
        }
    }

    /// Sends `data` as inline data (copied into the queue by the post; at most the QP's
    /// `max_inline_data` bytes), with optional immediate data, after everything pushed, in the
    /// same doorbell. Its [`SlotCompletion`] carries `wr_id` and no slot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is over the QP's inline limit; [`Error::QueueFull`]
    /// without room; as [`submit`](Self::submit).
    pub fn send_inline(&mut self, data: &[u8], imm: Option<u32>, wr_id: u64) -> Result<()> {
        let device = self.qp.device();
        let max = self.qp.caps.max_inline_data;
        if data.len() > max as usize {
            let reason = format!("{} bytes of inline data: the QP takes {max}", data.len());
            return Err(Error::invalid("ibv_post_send", Some(device), reason));
        }
        self.check_room()?;
        self.post_staged(Some(Tail::Send { data, imm, wr_id })).map(|_| ())
    }

    /// Polls the send CQ once (`ibv_poll_cq()`, never blocking) and calls `f` with each request
    /// that completed, in posting order: a signaled completion completes every request posted
    /// before it. Returns how many requests completed. Allocates nothing.
    ///
    /// # Errors
    /// [`Error::Verb`] when polling fails.
    #[doc(alias = "ibv_poll_cq")]
    pub fn poll(&mut self, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<usize> {
        if self.wc_next == self.wc_len {
            self.wc_next = 0;
            self.wc_len = 0;
            self.wc_len = self.cq.poll(&mut self.wcs)?.len();
        }
        let mut done = 0;
        while self.wc_next < self.wc_len {
            let wc = self.wcs[self.wc_next];
            if let Some(seq) = self.sequence_of(&wc) {
                while self.held.front().is_some_and(|h| h.seq <= seq) {
                    let h = self.held.pop_front().expect("checked");
                    let (status, vendor_err) =
                        if h.seq == seq { (wc.status(), wc.vendor_err()) } else { (WcStatus::Success, 0) };
                    done += 1;
                    // If `f` panics, this slot goes back to the pool (the device is done with
                    // it), and the completion stays in `wcs`: the next poll delivers the rest.
                    f(SlotCompletion { wr_id: h.wr_id, status, slot: h.slot, vendor_err });
                }
            }
            self.wc_next += 1;
        }
        Ok(done)
    }

    /// The sequence number a completion is for, if it is one of this queue's requests in flight.
    fn sequence_of(&self, wc: &WorkCompletion) -> Option<u64> {
        if wc.qp_num() != self.qp.qp_num() {
            return None;
        }
        let low = untag(Space::Send, wc.wr_id(), self.generation)?;
        let front = self.held.front()?;
        // The full number from its low bits: in flight means within 2^40 of the oldest held.
        let seq = front.seq + (low.wrapping_sub(front.seq) & LOW_MASK);
        (seq < self.next_seq).then_some(seq)
    }

    /// Waits until at least one request completed or `timeout` passed, calling `f` as
    /// [`poll`](Self::poll) does: polls, spinning for the queue's [`WaitPolicy`], then sleeps on
    /// the send CQ's completion channel ([`CqWaiter`]; without a channel it can only spin, see
    /// [`can_sleep`](Self::can_sleep)). [`Duration::MAX`] waits without a deadline.
    ///
    /// # Errors
    /// [`Error::Timeout`] when nothing completed in time; [`Error::NothingToWaitFor`] at once
    /// when nothing is in flight (requests pushed but not [submitted](Self::submit) cannot
    /// complete), or when only requests posted unsignaled are (after a [`submit`](Self::submit)
    /// the provider refused part of, or asked so with [`SlotRequest::unsignaled`]: they report
    /// only a failure; the next signaled request covers them);
    /// as `poll` and [`CqWaiter::idle`].
    pub fn wait(&mut self, timeout: Duration, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<usize> {
        let deadline = Deadline::after(timeout);
        // What has completed already is taken without setting up a wait.
        let n = self.poll_or_stop("send completions", &mut f)?;
        if n > 0 {
            return Ok(n);
        }
        let cq = self.cq.handle();
        let mut waiter = CqWaiter::new(self.wait_policy);
        let step = || Ok(Some(self.poll_or_stop("send completions", &mut f)?).filter(|&n| n > 0));
        waiter.wait(&[&cq], deadline, step)?.ok_or(Error::Timeout { what: "send completions", after: timeout })
    }

    /// Waits until nothing is in flight or `timeout` passed, calling `f` as
    /// [`poll`](Self::poll) does, waiting as [`wait`](Self::wait) does.
    ///
    /// # Errors
    /// [`Error::Timeout`] when requests are still in flight at the deadline;
    /// [`Error::NothingToWaitFor`] when those left were posted unsignaled (see
    /// [`wait`](Self::wait)); as `poll`.
    pub fn drain(&mut self, timeout: Duration, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<()> {
        let deadline = Deadline::after(timeout);
        if self.held.is_empty() {
            return Ok(());
        }
        let cq = self.cq.handle();
        let mut waiter = CqWaiter::new(self.wait_policy);
        let step = || {
            if self.held.is_empty() {
                return Ok(Some(()));
            }
            self.poll_or_stop("draining a send queue", &mut f)?;
            Ok(self.held.is_empty().then_some(()))
        };
        waiter.wait(&[&cq], deadline, step)?.ok_or(Error::Timeout { what: "draining a send queue", after: timeout })
    }

    /// Awaits at least one completion (feature `tokio`), calling `f` as [`poll`](Self::poll)
    /// does: [`wait`](Self::wait) for async code, with no timeout of its own (wrap it in
    /// `tokio::time::timeout`). The channel is registered with the current runtime by the library,
    /// for the wait.
    ///
    /// Cancellation-safe: completions are taken and handed to `f` only in a step that then
    /// returns, so a future dropped at its await has taken none; they stay for the next call.
    ///
    /// # Errors
    /// As `wait` (but no timeout); [`Error::InvalidArgument`] when the CQ has no completion
    /// channel; [`Error::NoRuntime`] outside a tokio runtime.
    ///
    /// # Panics
    /// In a runtime without IO enabled, as tokio's own types.
    #[cfg(feature = "tokio")]
    pub async fn wait_async(&mut self, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<usize> {
        let n = self.poll_or_stop("send completions", &mut f)?;
        if n > 0 {
            return Ok(n);
        }
        let cq = self.cq.handle();
        let mut waiter = CqWaiter::new(self.wait_policy);
        loop {
            let step = || Ok(Some(self.poll_or_stop("send completions", &mut f)?).filter(|&n| n > 0));
            // Without a deadline the wait ends only with completions (or an error).
            if let Some(n) = waiter.wait_async(&[&cq], Deadline::never(), step).await? {
                return Ok(n);
            }
        }
    }

    /// Awaits until nothing is in flight (feature `tokio`): [`drain`](Self::drain) for async
    /// code, as cancellation-safe as [`wait_async`](Self::wait_async).
    ///
    /// # Errors
    /// As `wait_async`.
    #[cfg(feature = "tokio")]
    pub async fn drain_async(&mut self, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<()> {
        while !self.held.is_empty() {
            self.wait_async(&mut f).await?;
        }
        Ok(())
    }

    /// Awaits room for `n` more requests (feature `tokio`): while the queue is full, awaits
    /// completions (handed to `f`) until [`room`](Self::room) is at least `n`. Then
    /// [`push`](Self::push) or [`post`](Self::post) cannot fail for want of room.
    ///
    /// Cancellation-safe as [`wait_async`](Self::wait_async); nothing is posted by it, so a
    /// dropped future leaves every request where it was.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `n` is more than the queue's
    /// [`capacity`](Self::capacity); as `wait_async` ([`Error::NothingToWaitFor`] when the
    /// queue is full of requests that cannot complete: staged ones are submitted first, so
    /// that does not happen through `push` alone).
    #[cfg(feature = "tokio")]
    pub async fn ready_async(&mut self, n: usize, mut f: impl FnMut(SlotCompletion<'res>)) -> Result<()> {
        if n > self.depth {
            return Err(Error::invalid(
                "ibv_post_send",
                Some(self.qp.device()),
                format!("room for {n} requests wanted, the queue holds {}", self.depth),
            ));
        }
        while self.room() < n {
            if !self.staged.is_empty() {
                self.submit()?;
            }
            self.wait_async(&mut f).await?;
        }
        Ok(())
    }

    /// One poll of a wait; [`Error::NothingToWaitFor`] (`what`) when nothing came and nothing
    /// in flight can complete.
    fn poll_or_stop(&mut self, what: &'static str, f: &mut impl FnMut(SlotCompletion<'res>)) -> Result<usize> {
        let n = self.poll(f)?;
        if n == 0 && !self.can_complete() {
            return Err(Error::NothingToWaitFor { what });
        }
        Ok(n)
    }

    /// How the queue's waits wait: spin budget, then sleep (see [`WaitPolicy`]).
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait_policy
    }

    /// Sets how the queue's waits wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.wait_policy = policy;
    }

    /// Whether the queue's waits can sleep: its send CQ has a completion channel. Without one
    /// they can only spin, a core each until a completion or the timeout.
    pub fn can_sleep(&self) -> bool {
        CqWaiter::can_sleep(&[self.cq.cq()])
    }

    /// Whether a completion will come for a request in flight even if all succeed: one of them
    /// was posted signaled, or is covered by one that was.
    fn can_complete(&self) -> bool {
        self.held.front().is_some_and(|h| h.seq < self.covered_upto)
    }

    /// Whether every request in flight is one no completion need come for (posted unsignaled
    /// after the last signaled one: it completed silently, or a flush completes it) whose slot
    /// the device only reads: after a flush, such requests are given
    /// [`FLUSH_GRACE`](crate::qp::quiesce::FLUSH_GRACE) rather than
    /// [`FLUSH_CONFIRM`](crate::qp::quiesce::FLUSH_CONFIRM), since one that completed silently
    /// never reports. A slot an RDMA READ writes into still waits for the proof.
    fn only_silent_reads_left(&self) -> bool {
        !self.can_complete() && self.held.iter().all(|h| !h.device_writes)
    }

    /// Makes sure the device no longer uses any slot in flight, so they may return to the pool
    /// (`qp/quiesce.rs`). `false` when that is not proven: the slots must then be leaked.
    fn quiesce(&mut self) -> bool {
        let last = quiesce::is_last_handle(&self.qp);
        let qp = Arc::clone(&self.qp);
        if last {
            // `qp` is dropped before `held`: the QP is destroyed before the slots return.
            quiesce::reset_before_destroy(&qp, || while self.poll(drop).is_ok_and(|n| n > 0) {});
            return true;
        }
        // Whether the requests left after the drain need no completion as proof (`FLUSH_GRACE`):
        // posted unsignaled after the last signaled one, and none an RDMA READ.
        let drain_timeout = self.drain_timeout;
        let held = std::cell::RefCell::new(self);
        let outcome = quiesce::quiesce(
            &qp,
            &[&qp.send_cq],
            drain_timeout,
            false,
            || {
                let mut queue = held.borrow_mut();
                let _ = queue.poll(drop);
                queue.held.is_empty()
            },
            || held.borrow().only_silent_reads_left(),
        );
        let this = held.into_inner();
        match outcome {
            Quiesced::Completed | Quiesced::Flushed => true,
            // Only requests posted unsignaled left, after the flush had `FLUSH_CONFIRM` (or
            // `FLUSH_GRACE`, when none is an RDMA READ) to complete them: a request still queued
            // would have been flushed with a completion (an error completes whatever the flags),
            // so these completed, silently, before.
            Quiesced::Lost { flushed: true } if !this.can_complete() => {
                this.held.clear();
                true
            }
            Quiesced::Lost { .. } => {
                // Stop the device, but do not take its word for it: leak the slots.
                let _ = quiesce::reset(&qp);
                false
            }
        }
    }
}

impl<'res> SendQueue<'res, crate::Rc> {
    /// Posts a zero-length RDMA WRITE after everything pushed, in the same doorbell: a probe.
    /// Its [`SlotCompletion`] carries `wr_id` and no slot.
    ///
    /// The responder acknowledges the probe and, with it, every request posted before it; or,
    /// when a packet before it was lost, answers with a sequence NAK, and the QP sends the lost
    /// packets again at once. Without it, a lost *last* packet (or its lost ACK) is recovered
    /// only when the QP's local ACK timeout fires. A caller that sees no completion for a while
    /// with requests in flight sends one (a tail-loss probe, as TCP's). It does not replace the
    /// timeout: a responder that has NAKed a gap once may answer nothing more until the gap is
    /// filled (rxe does so), and then only the timer resends.
    ///
    /// Returns whether a probe was posted. At most one is in flight: while one is, this posts
    /// nothing and returns `Ok(false)`, so that probes never take more than one entry of the
    /// queue (a caller that probes gives the QP one spare send request for it).
    ///
    /// The WRITE names no key and no address: a responder checks neither for a zero-length
    /// RDMA WRITE (InfiniBand Architecture Specification, C9-88), and no memory of the peer is
    /// touched. The peer's QP must allow remote writes
    /// ([`AccessFlags::REMOTE_WRITE`] in its [`InitAttr`](crate::InitAttr)): one that does not
    /// refuses the probe with a NAK, and this QP fails.
    ///
    /// # Errors
    /// [`Error::QueueFull`] without room; as [`submit`](Self::submit).
    ///
    /// # References
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "ibv_post_send")]
    pub fn probe(&mut self, wr_id: u64) -> Result<bool> {
        if self.held.iter().any(|h| h.probe) {
            return Ok(false);
        }
        self.check_room()?;
        self.post_staged(Some(Tail::Probe { wr_id })).map(|_| true)
    }
}

#[cfg(feature = "tokio")]
impl<T: Connected + 'static> SendQueue<'static, T> {
    /// Drops the queue without blocking the runtime (feature `tokio`): awaits the requests in
    /// flight for up to the drain timeout (their completions are discarded: call
    /// [`drain_async`](Self::drain_async) first to see them), and if some are still in flight,
    /// runs the blocking part of the drop (flush, wait, reset: see the type's docs) on tokio's
    /// blocking pool (`spawn_blocking`), awaiting it.
    ///
    /// Dropped before it finishes, the future drops the queue where it is: the plain drop,
    /// which may block the thread for the drain timeout.
    ///
    /// Needs no timer of tokio's: the drain timeout is a `timerfd` on the reactor, so a runtime
    /// built without time (`enable_io` only) is fine.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime (the queue is dropped, blocking).
    ///
    /// # Panics
    /// In a runtime without IO enabled, as tokio's own types.
    pub async fn close_async(mut self) -> Result<()> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what: "SendQueue::close_async" });
        }
        self.staged.clear();
        if self.can_complete() {
            // The drain's deadline is a `timerfd` on the reactor (no tokio timer: this works in
            // a runtime built without time, where `tokio::time::timeout` panicked). If the
            // alarm cannot be made, the blocking part below drains instead.
            let until = Deadline::after(self.drain_timeout);
            let device = self.qp.device().to_owned();
            let _ = crate::wait::reactor::until(until, self.drain_async(drop), "SendQueue::close_async", &device).await;
        }
        if self.held.is_empty() {
            return Ok(());
        }
        crate::wait::reactor::drop_off_runtime(self).await
    }
}

impl<T: Connected> Drop for SendQueue<'_, T> {
    fn drop(&mut self) {
        self.staged.clear();
        if !self.held.is_empty() && !self.quiesce() {
            for h in self.held.drain(..) {
                // The device may still use the slot: never hand it out again.
                std::mem::forget(h.slot);
            }
            // Their completions may still come: no later owner of the CQ may see them.
            self.cq.keep_forever();
        }
    }
}
