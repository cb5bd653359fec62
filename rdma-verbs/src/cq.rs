//! Completion queues: [`CompletionQueue`], and who holds one ([`CqHolder`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use crate::ffi;

use crate::completion_channel::{CompletionChannel, CompletionEvent};
use crate::context::Context;
use crate::cq_ex::LazyCq;
use crate::cq_holder::CqHolder;
use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::wait::deadline::Deadline;
use crate::wc::WorkCompletion;

impl Context {
    /// Creates a completion queue with room for at least `entries` completions, optionally
    /// reporting to `channel`: `ibv_create_cq()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 entries or more than the device's `max_cqe`;
    /// [`Error::Verb`] when creation fails.
    ///
    /// # References
    /// - [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html)
    #[doc(alias = "ibv_create_cq")]
    pub fn create_cq<'a>(
        &'a self,
        entries: u32,
        channel: Option<&'a CompletionChannel<'a>>,
    ) -> Result<CompletionQueue<'a>> {
        CompletionQueue::new(self, entries, channel.map(Parent::from))
    }
}

impl Context {
    /// Creates a completion queue with room for at least `entries` completions that reports to
    /// a completion channel of its own: `ibv_create_comp_channel()`, then `ibv_create_cq()`.
    /// Every wait on it sleeps once its spin budget is spent, and the rings and queues on it can
    /// be awaited (feature `tokio`; [`SendQueue::for_async`](crate::SendQueue::for_async),
    /// [`RecvRing::for_async`](crate::RecvRing::for_async)). The channel lives as long as the
    /// CQ. For several CQs on one channel, make the channel and pass it to
    /// [`create_cq`](Self::create_cq).
    ///
    /// # Errors
    /// As [`create_cq`](Self::create_cq) and
    /// [`create_completion_channel`](Self::create_completion_channel).
    ///
    /// # References
    /// - [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html)
    /// - [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html)
    #[doc(alias = "ibv_create_cq")]
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_cq_with_channel(&self, entries: u32) -> Result<CompletionQueue<'_>> {
        let channel = std::sync::Arc::new(CompletionChannel::new(self)?);
        CompletionQueue::new(self, entries, Some(Parent::from(channel)))
    }
}

/// The refusal of a queue or ring for async waits on a CQ without a completion channel: its
/// async waits could never sleep ([`SendQueue::for_async`](crate::SendQueue::for_async),
/// [`RecvRing::for_async`](crate::RecvRing::for_async)).
pub(crate) fn check_awaitable(verb: &'static str, cq: &CompletionQueue<'_>) -> Result<()> {
    match cq.channel() {
        Some(_) => Ok(()),
        None => Err(Error::invalid(
            verb,
            Some(cq.ctx.name()),
            "the CQ has no completion channel, so an async wait could never sleep: make it with \
             `Context::create_cq_with_channel` or `create_cq(n, Some(&channel))`",
        )),
    }
}

impl<'ctx> CompletionQueue<'ctx> {
    /// Creates a completion queue of `ctx` with room for at least `entries` completions,
    /// optionally reporting to `channel`; both parents borrowed or shared (see [`Parent`]):
    /// `ibv_create_cq()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 entries, more than the device's `max_cqe`, or a channel
    /// of another context; [`Error::Verb`] when creation fails.
    ///
    /// # References
    /// - [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html)
    #[doc(alias = "ibv_create_cq")]
    pub fn new(
        ctx: impl Into<Parent<'ctx, Context>>,
        entries: u32,
        channel: Option<Parent<'ctx, CompletionChannel<'ctx>>>,
    ) -> Result<Self> {
        let ctx = ctx.into();
        let max = ctx.attr().max_cqe;
        if entries == 0 || entries > max {
            return Err(Error::invalid(
                "ibv_create_cq",
                Some(ctx.name()),
                format!("{entries} entries: the device allows 1..={max}"),
            ));
        }
        if channel.as_ref().is_some_and(|c| !std::ptr::eq(c.context(), &*ctx)) {
            return Err(Error::invalid("ibv_create_cq", Some(ctx.name()), "the channel belongs to another context"));
        }
        let ch = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.as_raw());
        // SAFETY: open context; `ch` is NULL or a live channel that the CQ holds.
        let raw = unsafe { ffi::ibv_create_cq(ctx.as_raw(), entries as libc::c_int, std::ptr::null_mut(), ch, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_cq", Some(ctx.name())))?;
        Ok(Self::created(raw, ctx, channel, entries, None))
    }

    /// The wrapper of a CQ just created (classic, or extended with `lazy`).
    pub(crate) fn created(
        raw: NonNull<ffi::ibv_cq>,
        ctx: Parent<'ctx, Context>,
        channel: Option<Parent<'ctx, CompletionChannel<'ctx>>>,
        entries: u32,
        lazy: Option<LazyCq>,
    ) -> Self {
        // SAFETY: just created; `cqe` is the capacity the provider granted (at least `entries`).
        let capacity = u32::try_from(unsafe { raw.as_ref().cqe }).unwrap_or(entries).max(entries);
        ctx.registry().add(crate::registry::Kind::Cq, raw.as_ptr());
        if let Some(c) = &channel {
            c.cq_added();
        }
        let serial = NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CompletionQueue {
            raw,
            ctx,
            channel,
            capacity,
            users: AtomicUsize::new(0),
            holder: AtomicU8::new(0),
            lazy,
            serial,
        }
    }
}

/// The serial of the next CQ made.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A completion queue (`struct ibv_cq`), destroyed on drop.
///
/// # References
/// - [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html)
/// - [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
#[doc(alias = "ibv_cq")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct CompletionQueue<'ctx> {
    raw: NonNull<ffi::ibv_cq>,
    ctx: Parent<'ctx, Context>,
    channel: Option<Parent<'ctx, CompletionChannel<'ctx>>>,
    capacity: u32,
    /// Direct pollers right now, plus [`OWNED`] while an owner (`CqOwner`) holds the CQ.
    users: AtomicUsize,
    /// Who the owner is, while [`OWNED`] is set (a [`CqHolder`] as `u8`).
    holder: AtomicU8,
    /// An extended CQ's view and poller (`cq_ex.rs`); every poll of it is a lazy poll.
    pub(crate) lazy: Option<LazyCq>,
    /// Which CQ this is, never reused in the process (an address can be a new CQ's, after this
    /// one was dropped): what a [`CqWaiter`](crate::CqWaiter) knows of its arms is keyed by it.
    serial: u64,
}

/// The bit of `CompletionQueue::users` an owner holds.
const OWNED: usize = 1 << (usize::BITS - 1);

// SAFETY: libibverbs providers lock a CQ for polling, so `&CompletionQueue` may be used from
// several threads; the struct owns the pointer.
unsafe impl Send for CompletionQueue<'_> {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue<'_> {}

impl<'ctx> CompletionQueue<'ctx> {
    /// Polls up to `out.len()` completions into `out` and returns the filled part:
    /// `ibv_poll_cq()`, or `ibv_start_poll()` and its kin on an extended CQ. Never allocates.
    ///
    /// On a CQ made with `ibv_create_cq` it never blocks. An extended CQ
    /// ([`Context::create_cq_ex`](crate::Context::create_cq_ex)) is polled by one thread at a
    /// time, because the provider holds the CQ's lock from the start of a poll to its end: a poll
    /// that finds another thread's poll running waits for it, yielding then sleeping, for at
    /// most 10 ms, and then gives up with [`Error::Busy`]. Polls from a single thread never wait.
    ///
    /// While a posting scope ([`QueuePair::scope`](crate::QueuePair::scope)) runs on a QP of
    /// this CQ, or a [`SendQueue`](crate::SendQueue) or [`RecvRing`](crate::RecvRing) uses it,
    /// that owner owns it ([`CqHolder`]): polling here would take completions it waits for.
    /// Poll through the owner instead.
    ///
    /// # Errors
    /// [`Error::Busy`] while an owner holds the CQ, naming it, and on an extended CQ when
    /// another thread's poll kept it for 10 ms or this poll runs inside the CQ's own
    /// [`poll_each`](Self::poll_each) closure; [`Error::Verb`] when polling fails (a provider
    /// error, not a failed request: those are completions with an error
    /// [`status`](WorkCompletion::status)).
    ///
    /// # References
    /// - [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll<'o>(&self, out: &'o mut [WorkCompletion]) -> Result<&'o mut [WorkCompletion]> {
        self.poll_directly("ibv_poll_cq", || self.poll_owned(out))
    }

    /// Runs `poll` as a direct poller of the CQ: refused with `Error::Busy` while an owner
    /// holds it (an owner is not made while `poll` runs).
    pub(crate) fn poll_directly<R>(&self, what: &'static str, poll: impl FnOnce() -> Result<R>) -> Result<R> {
        /// Ends the direct poll, also when `poll` unwinds (a panic in `poll_each`'s closure):
        /// else the CQ would count a poller for good, and no owner could take it.
        struct Poller<'a>(&'a AtomicUsize);
        impl Drop for Poller<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        if self.users.fetch_add(1, Ordering::Acquire) & OWNED != 0 {
            self.users.fetch_sub(1, Ordering::Release);
            return Err(self.busy(what));
        }
        let _poller = Poller(&self.users);
        poll()
    }

    /// Waits up to `timeout` for completions and polls them into `out` (at least one, at most
    /// `out.len()`): polls, spinning for `policy`'s budget, then arms the CQ and sleeps on its
    /// completion channel ([`CqWaiter`](crate::CqWaiter)); a CQ without a channel can only
    /// spin. [`Duration::MAX`] waits without a deadline.
    ///
    /// Only one thread should wait on a CQ at a time, and on a channel only CQs waited for
    /// this way or by the queues of this crate: an event read by someone else's wait would
    /// leave this one asleep (see [`SHARED_CHANNEL_SLICE`](crate::SHARED_CHANNEL_SLICE) for
    /// channels shared by several CQs).
    ///
    /// # Errors
    /// [`Error::Timeout`] when nothing came in time; [`Error::InvalidArgument`] for an empty
    /// `out`; as [`poll`](Self::poll).
    #[doc(alias = "ibv_poll_cq")]
    #[doc(alias = "ibv_req_notify_cq")]
    pub fn poll_wait<'o>(
        &self,
        out: &'o mut [WorkCompletion],
        timeout: Duration,
        policy: crate::WaitPolicy,
    ) -> Result<&'o mut [WorkCompletion]> {
        if out.is_empty() {
            return Err(Error::invalid("ibv_poll_cq", Some(self.ctx.name()), "no room for a completion"));
        }
        let deadline = Deadline::after(timeout);
        let mut waiter = crate::CqWaiter::new(policy);
        let n = waiter.wait(&[self], deadline, || Ok(Some(self.poll(out)?.len()).filter(|&n| n > 0)))?;
        let n = n.ok_or(Error::Timeout { what: "completions", after: timeout })?;
        Ok(&mut out[..n])
    }

    /// Awaits completions and polls them into `out` (feature `tokio`): [`poll_wait`] for async
    /// code, with no timeout of its own. Cancellation-safe: completions are polled only in the
    /// step that returns them.
    ///
    /// # Errors
    /// As `poll_wait`; [`Error::InvalidArgument`] without a completion channel;
    /// [`Error::NoRuntime`] outside a tokio runtime.
    ///
    /// [`poll_wait`]: Self::poll_wait
    #[cfg(feature = "tokio")]
    pub async fn poll_async<'o>(
        &self,
        out: &'o mut [WorkCompletion],
        policy: crate::WaitPolicy,
    ) -> Result<&'o mut [WorkCompletion]> {
        if out.is_empty() {
            return Err(Error::invalid("ibv_poll_cq", Some(self.ctx.name()), "no room for a completion"));
        }
        let mut waiter = crate::CqWaiter::new(policy);
        // Without a deadline the wait ends only with completions (or an error).
        let n = loop {
            let step = || Ok(Some(self.poll(out)?.len()).filter(|&n| n > 0));
            if let Some(n) = waiter.wait_async(&[self], Deadline::never(), step).await? {
                break n;
            }
        };
        Ok(&mut out[..n])
    }

    /// Marks the CQ as owned by `holder` (see `CqOwner`); `Err` with the present owner's busy
    /// error if one holds it, or if a thread polling it directly does not stop (retried
    /// briefly).
    pub(crate) fn own(&self, holder: CqHolder, what: &'static str) -> Result<()> {
        for _ in 0..1000 {
            match self.users.compare_exchange(0, OWNED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => {
                    self.holder.store(holder as u8, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) if now & OWNED != 0 => return Err(self.busy(what)),
                Err(_) => std::thread::yield_now(),
            }
        }
        Err(Error::Busy { what, holder: None, device: Some(self.ctx.name().to_owned()) })
    }

    /// Ends the ownership [`own`](Self::own) took.
    pub(crate) fn disown(&self) {
        self.users.fetch_sub(OWNED, Ordering::Release);
    }

    /// The refusal of `what` while an owner holds the CQ, naming the owner.
    pub(crate) fn busy(&self, what: &'static str) -> Error {
        let holder = CqHolder::from_u8(self.holder.load(Ordering::Relaxed));
        Error::Busy { what, holder, device: Some(self.ctx.name().to_owned()) }
    }

    /// `ibv_poll_cq` for the CQ's owner, or for `poll` once it checked.
    #[inline]
    pub(crate) fn poll_owned<'o>(&self, out: &'o mut [WorkCompletion]) -> Result<&'o mut [WorkCompletion]> {
        if let Some(lazy) = &self.lazy {
            return lazy.poll_into(self.ctx.name(), out);
        }
        let n = libc::c_int::try_from(out.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `WorkCompletion` is `repr(transparent)` over `ibv_wc`, and `out` has room for
        // `n` of them; the CQ is live.
        let got = unsafe { ffi::ibv_poll_cq(self.raw.as_ptr(), n, out.as_mut_ptr().cast()) };
        if got < 0 {
            return Err(Error::from_errno("ibv_poll_cq", Some(self.ctx.name()), -got));
        }
        Ok(&mut out[..got as usize])
    }

    /// Which CQ this is: unique in the process, never reused.
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// Requests an event on the channel for the next completion (`solicited_only`: only for
    /// solicited ones): `ibv_req_notify_cq()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the CQ has no channel; [`Error::Verb`] on failure.
    #[doc(alias = "ibv_req_notify_cq")]
    pub fn arm(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::invalid("ibv_req_notify_cq", Some(self.ctx.name()), "the CQ has no completion channel"));
        }
        // SAFETY: the CQ is live.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.raw.as_ptr(), i32::from(solicited_only)) };
        Error::check("ibv_req_notify_cq", Some(self.ctx.name()), rc)
    }

    /// Arms the CQ, then waits up to `timeout` for its channel to report it. [`Duration::MAX`]
    /// waits without a deadline. Only for a CQ that has its channel to itself: an event read
    /// from a shared channel may be another CQ's, and could not be given back (its waiter would
    /// never wake), so with other CQs on the channel wait on the channel
    /// ([`CompletionChannel::recv`]) and dispatch by [`CompletionEvent::is_for`].
    ///
    /// Completions that arrived before arming raise no event: poll once after this returns a
    /// timeout, or poll before waiting, as `ibv_get_cq_event(3)` describes.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no event came in time; [`Error::InvalidArgument`] without a
    /// channel, or when other CQs report to the same channel.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let channel = self.channel.as_deref().ok_or_else(|| {
            Error::invalid("ibv_get_cq_event", Some(self.ctx.name()), "the CQ has no completion channel")
        })?;
        let sharing = channel.cq_count();
        if sharing > 1 {
            let reason = format!(
                "{sharing} CQs report to this channel: wait on the channel (CompletionChannel::recv), \
                 or another CQ's event would be lost"
            );
            return Err(Error::invalid("ibv_get_cq_event", Some(self.ctx.name()), reason));
        }
        self.arm(false)?;
        let deadline = Deadline::after(timeout);
        loop {
            match channel.recv_until(deadline)? {
                event if event.is_for(self) => return Ok(()),
                _ => continue,
            }
        }
    }

    /// How many completions the CQ holds (`cqe`: at least what was asked at creation).
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// [`capacity`](Self::capacity) as the verbs count it (`cqe`, a C `int`).
    pub(crate) fn cqe(&self) -> u32 {
        self.capacity
    }

    /// The channel this CQ reports to, if any.
    pub fn channel(&self) -> Option<&CompletionChannel<'ctx>> {
        self.channel.as_deref()
    }

    /// The context the CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw `struct ibv_cq *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.raw.as_ptr()
    }
}

impl CompletionEvent {
    /// Whether the event was raised by `cq`.
    pub fn is_for(&self, cq: &CompletionQueue<'_>) -> bool {
        self.cq_raw() == cq.as_raw()
    }
}

impl Drop for CompletionQueue<'_> {
    #[doc(alias = "ibv_destroy_cq")]
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed only here; QPs using it borrow it, and
        // every event of it was acknowledged when it was received (`CompletionChannel::recv`).
        let _ = self.ctx.registry().release(self.raw.as_ptr(), || unsafe { ffi::ibv_destroy_cq(self.raw.as_ptr()) });
        if let Some(c) = &self.channel {
            c.cq_removed();
        }
    }
}
