//! Completion channels: [`CompletionChannel`], and the [`CompletionEvent`]s read from one.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::wait::deadline::Deadline;
use crate::wait::fd::{set_nonblocking, wait_readable};

/// A completion channel (`struct ibv_comp_channel`): a file descriptor that becomes readable when
/// an armed completion queue gets a completion. Destroyed on drop; its CQs borrow it.
///
/// # References
/// - [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html)
/// - [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
#[doc(alias = "ibv_comp_channel")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct CompletionChannel<'ctx> {
    raw: NonNull<ffi::ibv_comp_channel>,
    ctx: Parent<'ctx, Context>,
    /// The CQs that report to it now.
    cqs: AtomicUsize,
    /// The threads asleep on it ([`CqWaiter`](crate::CqWaiter)).
    sleepers: crate::wait::sleepers::Sleepers,
    /// Events read from it so far, by anyone: a waiter that read every one of them since it
    /// armed its CQs knows which of its arms still stand ([`CqWaiter`](crate::CqWaiter)).
    reads: AtomicU64,
    /// Which channel this is, never reused in the process: what a registration kept across
    /// waits is keyed by (an address can be a new channel's, after this one was dropped).
    #[cfg(feature = "tokio")]
    serial: u64,
}

/// The serial of the next channel made.
#[cfg(feature = "tokio")]
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: ibv_get_cq_event on one channel from several threads is allowed by libibverbs; the
// struct is a pointer and a handle to a `Sync` context.
unsafe impl Send for CompletionChannel<'_> {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel<'_> {}

impl Context {
    /// Creates a completion channel: `ibv_create_comp_channel()`.
    ///
    /// # Errors
    /// [`Error::Verb`] with `errno`.
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_completion_channel(&self) -> Result<CompletionChannel<'_>> {
        CompletionChannel::new(self)
    }
}

impl<'ctx> CompletionChannel<'ctx> {
    /// Creates a completion channel of `ctx`, borrowed or shared (see [`Parent`]):
    /// `ibv_create_comp_channel()`. Its file descriptor is non-blocking.
    ///
    /// # Errors
    /// [`Error::Verb`] with `errno`.
    ///
    /// # References
    /// - [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html)
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn new(ctx: impl Into<Parent<'ctx, Context>>) -> Result<Self> {
        let ctx = ctx.into();
        // SAFETY: `as_raw()` is an open context, kept open by `ctx`.
        let raw = unsafe { ffi::ibv_create_comp_channel(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_comp_channel", Some(ctx.name())))?;
        ctx.registry().add(crate::registry::Kind::Channel, raw.as_ptr());
        let channel = CompletionChannel {
            raw,
            ctx,
            cqs: AtomicUsize::new(0),
            sleepers: Default::default(),
            reads: AtomicU64::new(0),
            #[cfg(feature = "tokio")]
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
        };
        // Non-blocking, so that a thread that lost an event to another (both saw the fd
        // readable) gets EAGAIN and waits again instead of blocking past its timeout.
        set_nonblocking(channel.as_fd(), "ibv_create_comp_channel", channel.ctx.name())?;
        Ok(channel)
    }
}

/// A completion event read from a [`CompletionChannel`]: which CQ it was for.
///
/// Compare it with a queue through [`is_for`](Self::is_for). It holds no reference to the CQ
/// and is acknowledged already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionEvent {
    cq: *mut ffi::ibv_cq,
}

// SAFETY: an address compared, never dereferenced.
unsafe impl Send for CompletionEvent {}
// SAFETY: as above.
unsafe impl Sync for CompletionEvent {}

impl CompletionEvent {
    /// The raw `struct ibv_cq *` the event named (for comparison only: the CQ may be gone).
    pub fn cq_raw(&self) -> *mut ffi::ibv_cq {
        self.cq
    }
}

impl<'ctx> CompletionChannel<'ctx> {
    /// Waits up to `timeout` for a completion event of a CQ of this channel
    /// (`poll(2)` then `ibv_get_cq_event()`), and acknowledges it (`ibv_ack_cq_events()`).
    ///
    /// Returns which CQ the event is for ([`CompletionEvent::is_for`]). The CQ must be armed
    /// again ([`CompletionQueue::arm`](crate::CompletionQueue::arm)) for the next event. Several threads may wait on one
    /// channel: each event goes to one of them, the others go on waiting until their timeout.
    /// [`Duration::MAX`] waits without a deadline (see [`Deadline`]).
    ///
    /// # Errors
    /// [`Error::Timeout`] when no event came in time; [`Error::Verb`] when waiting fails.
    ///
    /// # References
    /// - [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
    #[doc(alias = "ibv_get_cq_event")]
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn recv(&self, timeout: Duration) -> Result<CompletionEvent> {
        self.recv_until(Deadline::after(timeout))
    }

    /// [`recv`](Self::recv) until `until`: its `Timeout` reports the deadline's timeout.
    pub(crate) fn recv_until(&self, until: Deadline) -> Result<CompletionEvent> {
        loop {
            if let Some(event) = self.try_recv()? {
                return Ok(event);
            }
            wait_readable(self.as_fd(), until, "ibv_get_cq_event", self.ctx.name())?;
        }
    }

    /// Takes a pending completion event without waiting: `Ok(None)` when there is none.
    ///
    /// # Errors
    /// [`Error::Verb`] when reading the event fails.
    #[doc(alias = "ibv_get_cq_event")]
    pub fn try_recv(&self) -> Result<Option<CompletionEvent>> {
        let mut cq = std::ptr::null_mut();
        let mut cq_context = std::ptr::null_mut();
        // SAFETY: the channel is live and its fd non-blocking: the call returns at once.
        let rc = unsafe { ffi::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut cq_context) };
        if rc != 0 {
            let err = Error::last_os_error("ibv_get_cq_event", Some(self.ctx.name()));
            return match err.errno() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: `cq` is the live CQ the event is for (it cannot be destroyed before its
        // events are acknowledged, which happens here).
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        self.reads.fetch_add(1, Ordering::AcqRel);
        Ok(Some(CompletionEvent { cq }))
    }

    /// How many events have been read from the channel, by anyone, through
    /// [`try_recv`](Self::try_recv) and the waits built on it.
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Acquire)
    }

    /// How many CQs report to this channel now.
    pub fn cq_count(&self) -> usize {
        self.cqs.load(Ordering::Relaxed)
    }

    /// The threads asleep on the channel.
    pub(crate) fn sleepers(&self) -> &crate::wait::sleepers::Sleepers {
        &self.sleepers
    }

    /// A CQ reporting to the channel was made.
    pub(crate) fn cq_added(&self) {
        self.cqs.fetch_add(1, Ordering::Relaxed);
    }

    /// A CQ reporting to the channel was destroyed.
    pub(crate) fn cq_removed(&self) {
        self.cqs.fetch_sub(1, Ordering::Relaxed);
    }

    /// Which channel this is: unique in the process, never reused.
    #[cfg(feature = "tokio")]
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// Reads and acknowledges every pending event; `true` if there was one. When one was not
    /// `ours` (a CQ the wait does not wait for), the threads asleep on the channel (but `me`) are
    /// woken: the event may have been theirs. (The async waits' read: the reactor reports an fd
    /// readable once, so they must leave no event behind.)
    #[cfg(feature = "tokio")]
    pub(crate) fn drain_events(
        &self,
        mut ours: impl FnMut(&CompletionEvent) -> bool,
        me: Option<&crate::wait::sleepers::Kick>,
    ) -> Result<bool> {
        let (mut any, mut foreign) = (false, false);
        while let Some(event) = self.try_recv()? {
            any = true;
            foreign |= !ours(&event);
        }
        if foreign {
            self.sleepers.wake_all_but(me);
        }
        Ok(any)
    }

    /// A registration of the channel's fd with the current runtime's reactor, for one sleep.
    #[cfg(feature = "tokio")]
    pub(crate) fn watch(&self) -> Result<crate::wait::reactor::Watch> {
        crate::wait::reactor::Watch::new(self.as_fd(), "ibv_get_cq_event", self.ctx.name())
    }

    /// Awaits an event of the channel on the reactor of the current tokio runtime (the fd is
    /// registered for this wait only), for at most `recheck` when given; reads and
    /// acknowledges every event pending (waking the waits asleep on the channel: the events
    /// may be theirs). `true` when an event came. Several tasks may await one channel: each is
    /// woken.
    ///
    /// Cancellation-safe: it takes events only after its last await, and returns at once.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] when reading an event
    /// fails, or when the reactor refuses the fd or the `timerfd` of the `recheck`.
    ///
    /// # Panics
    /// As tokio's own IO types: in a runtime built without IO. (No timer of tokio's is used:
    /// a runtime without time is fine.)
    #[cfg(feature = "tokio")]
    pub async fn readable_async(&self, recheck: Option<Duration>) -> Result<bool> {
        self.readable_async_with(&self.watch()?, &mut None, |_| false, recheck).await
    }

    /// [`readable_async`](Self::readable_async) through `watch` (a registration of this
    /// channel's fd), for a wait on `ours`: only events of other CQs wake the other waits. A
    /// `recheck` rings `alarm`, made here if there is none yet.
    #[cfg(feature = "tokio")]
    pub(crate) async fn readable_async_with(
        &self,
        watch: &crate::wait::reactor::Watch,
        alarm: &mut Option<crate::wait::reactor::Alarm>,
        ours: impl FnMut(&CompletionEvent) -> bool,
        recheck: Option<Duration>,
    ) -> Result<bool> {
        let ready = watch.readable();
        let guard = match Deadline::after(recheck.unwrap_or(Duration::MAX)).instant() {
            None => ready.await,
            Some(at) => {
                let alarm = match alarm {
                    Some(alarm) => alarm,
                    None => alarm.insert(crate::wait::reactor::Alarm::new("ibv_get_cq_event", self.ctx.name())?),
                };
                alarm.set(at)?;
                match alarm.race(ready).await? {
                    Some(r) => r,
                    None => return Ok(false),
                }
            }
        };
        let guard = guard?;
        let woken = self.drain_events(ours, None)?;
        guard.clear();
        Ok(woken)
    }

    /// The raw `struct ibv_comp_channel *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// The context the channel belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl AsRawFd for CompletionChannel<'_> {
    /// The channel's file descriptor, for `poll`/`epoll`: readable when an event is pending.
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { self.raw.as_ref().fd }
    }
}

impl AsFd for CompletionChannel<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd stays open as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl Drop for CompletionChannel<'_> {
    #[doc(alias = "ibv_destroy_comp_channel")]
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_comp_channel`, destroyed only here, after every CQ
        // that borrows it.
        let _ = self
            .ctx
            .registry()
            .release(self.raw.as_ptr(), || unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) });
    }
}
