//! The event channel: the file descriptor connection-manager events arrive on.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

use rdma_verbs::wait::Sleepers;
use rdma_verbs::Deadline;

use rdma_verbs::ffi;

use crate::error::{Error, Result};

/// The calling thread's `errno` (`EIO` when it holds none).
fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}
use crate::event::RawEvent;

/// An event channel (`struct rdma_event_channel`), destroyed on drop.
///
/// Every identifier of this crate owns one, so each connection has its own file descriptor:
/// blocking calls wait on it with `poll(2)` and a timeout, and an async runtime can register it
/// (it is non-blocking) and drive the `try_*` calls when it becomes readable.
///
/// # References
/// - [`rdma_create_event_channel(3)`](https://man7.org/linux/man-pages/man3/rdma_create_event_channel.3.html)
/// - [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html)
#[doc(alias = "rdma_event_channel")]
#[derive(Debug)]
pub(crate) struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
    /// The waits asleep on the channel, woken by whoever takes an event (boxed: a table of
    /// sixteen places would make every identifier, and every value that holds one, large).
    sleepers: Box<Sleepers>,
}

// SAFETY: the channel is a file descriptor; reading events from it is a `read(2)` that the
// kernel serialises, and librdmacm keeps no per-channel state beyond the fd.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Opens a channel: `rdma_create_event_channel()`, then makes its fd non-blocking.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when librdmacm cannot open `/dev/infiniband/rdma_cm` (`ENODEV`: no
    /// RDMA device or no `rdma_ucm` module), [`Error::Cm`] when it fails otherwise or the fd
    /// cannot be made non-blocking.
    #[doc(alias = "rdma_create_event_channel")]
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: no arguments; returns NULL with errno set on failure.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let channel = EventChannel {
            raw: NonNull::new(raw).ok_or_else(|| Error::no_cm_device("rdma_create_event_channel", last_errno()))?,
            sleepers: Box::new(Sleepers::new()),
        };
        // FIONBIO: the same flag as `O_NONBLOCK`.
        rustix::io::ioctl_fionbio(channel.as_fd(), true)
            .map_err(|e| Error::from_errno("fcntl(O_NONBLOCK)", e.raw_os_error()))?;
        Ok(channel)
    }

    /// The raw `struct rdma_event_channel *`; it stays owned by `self`.
    pub(crate) fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// Reads the next event if one is queued: `rdma_get_cm_event()` on the non-blocking fd.
    /// Taking one wakes every other wait asleep on the channel: the event may be what it waits
    /// for. (Each reader holds its own lock while it reads and records an event, so a woken
    /// wait's next look sees what was recorded.)
    pub(crate) fn try_get(&self) -> Result<Option<RawEvent>> {
        let mut event = std::ptr::null_mut();
        // SAFETY: live channel; `event` is a valid out-pointer.
        let rc = unsafe { ffi::rdma_get_cm_event(self.raw.as_ptr(), &mut event) };
        if rc == 0 {
            self.sleepers.wake_all();
            return match NonNull::new(event) {
                // SAFETY: a fresh event, acknowledged only by the returned value.
                Some(ev) => Ok(Some(unsafe { RawEvent::new(ev) })),
                None => Err(Error::Cm { verb: "rdma_get_cm_event", device: None, errno: libc::EIO }),
            };
        }
        let err = Error::last_os_error("rdma_get_cm_event");
        match err.errno() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        }
    }

    /// Takes `step` until it gives a value, sleeping on the fd until `until` whenever it gives
    /// `None`.
    ///
    /// `step` is one synchronous attempt: it reads what it needs from the channel and gives
    /// `Ok(None)` only when it found the channel empty (`EAGAIN`). Every blocking wait of the
    /// crate is this loop around a step, and its async form is
    /// [`wait_for_async`](Self::wait_for_async) around the same step. The `Timeout` error is
    /// built here, where the deadline is found passed: it names `what` and the deadline's
    /// timeout, and the callers pass it on as it is.
    pub(crate) fn wait_for<T>(
        &self,
        until: Deadline,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        self.wait_for_every(until, Duration::MAX, what, step)
    }

    /// [`wait_for`](Self::wait_for), taking `step` again at least every `every` while the
    /// channel stays quiet: for a step that also looks at something outside the channel.
    pub(crate) fn wait_for_every<T>(
        &self,
        until: Deadline,
        every: Duration,
        what: &'static str,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            // Registered before the step: an event another reader takes after it wakes us.
            let sleeper = self.sleepers.sleeper();
            if let Some(value) = step()? {
                return Ok(value);
            }
            if until.has_passed() {
                return Err(timed_out(what, until));
            }
            // At most `every` from now (no bound when the wait has none and `every` is too long
            // to be an instant); rdma-verbs' blocking wait on a shared fd.
            if let Err(e) = sleeper.sleep(self.as_fd(), until.min(Deadline::after(every))) {
                return Err(Error::from_errno("poll", e.raw_os_error().unwrap_or(libc::EIO)));
            }
        }
    }
}

/// The error of a wait for `what` that found `until` passed: built once, there.
pub(crate) fn timed_out(what: &'static str, until: Deadline) -> Error {
    Error::Timeout { what, device: None, after: until.timeout() }
}

#[cfg(feature = "tokio")]
impl EventChannel {
    /// A registration of a duplicate of the fd with the current runtime's reactor, for one
    /// poll of a wait (see [`wait_for_async`](Self::wait_for_async)): concurrent waits are
    /// separate registrations, and the duplicate is deregistered before it is closed, so no
    /// other file's registration can be hit.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime; [`Error::Cm`] when the fd cannot be
    /// duplicated or `epoll_ctl` refuses it. (A runtime built without `enable_io` panics inside
    /// tokio, as every tokio I/O type does.)
    fn watch(&self, what: &'static str) -> Result<rdma_verbs::wait::Readiness> {
        // Checked first, for the typed error.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what });
        }
        // rdma-verbs' one registration of a verbs-family fd with the reactor.
        rdma_verbs::wait::Readiness::new(self.as_fd()).map_err(|e| reactor_error(what, "epoll_ctl", &e))
    }

    /// Takes `step` until it gives a value, awaiting the fd's readiness or a wake-up from
    /// another reader whenever it gives `None`, until `until`: the async form of
    /// [`wait_for_every`](Self::wait_for_every), with the same step contract and the same
    /// `Timeout` error. The deadline (and `every`) is rdma-verbs' `timerfd` on the reactor
    /// (`rdma_verbs::wait::timeout_at`), so a runtime built without tokio's time
    /// driver works.
    ///
    /// Each poll registers the fd anew with the reactor of the runtime that polls it (and drops
    /// the last poll's registration), then enables a wake-up from the channel's other readers,
    /// then takes the step. So:
    /// - a channel is never bound to a runtime: a pending future polled in one runtime, then
    ///   awaited in another (while the first lives, idle, or after it was dropped), waits on the
    ///   runtime it is awaited in;
    /// - anything after the step (an event, or another reader taking one and recording what the
    ///   step checks) wakes the future, whoever reads it.
    ///
    /// A poll costs a duplicate of the fd and its registration (four system calls), the price of
    /// making the future anew in each round of a `select!` loop; CM waits are polled rarely.
    ///
    /// Cancellation-safe: a poll takes nothing but what its step takes, which the step returns
    /// at once or keeps (its own state).
    pub(crate) async fn wait_for_async<T>(
        &self,
        until: Deadline,
        every: Duration,
        what: &'static str,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            // Until the earlier of the deadline and the next look `every` asks for.
            let slice = until.min(Deadline::after(every));
            match rdma_verbs::wait::timeout_at(slice, self.steps_async(what, &mut step)).await {
                Ok(Some(done)) => return done,
                Ok(None) if until.has_passed() => return Err(timed_out(what, until)),
                // The slice ended first: take the step again.
                Ok(None) => {}
                Err(e) => return Err(reactor_error(what, "timerfd_create", &e)),
            }
        }
    }

    /// Takes `step` until it gives a value, awaiting the channel between tries, without a
    /// deadline (see [`wait_for_async`](Self::wait_for_async)).
    async fn steps_async<T>(&self, what: &'static str, step: &mut impl FnMut() -> Result<Option<T>>) -> Result<T> {
        use std::future::Future;
        use std::task::Poll;
        // What the last poll slept on, until the next poll replaces it.
        let mut asleep: Option<(rdma_verbs::wait::Readiness, rdma_verbs::wait::Woken<'_>)> = None;
        std::future::poll_fn(|cx| loop {
            asleep = None;
            let reactor = match self.watch(what) {
                Ok(reactor) => reactor,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let mut woken = self.sleepers.woken();
            let woke = std::pin::Pin::new(&mut woken).poll(cx).is_ready();
            let ready = match reactor.poll_ready(cx) {
                Poll::Ready(Ok(guard)) => Some(guard),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor_error(what, "epoll_wait", &e))),
                Poll::Pending => None,
            };
            match step() {
                Ok(Some(value)) => return Poll::Ready(Ok(value)),
                Err(e) => return Poll::Ready(Err(e)),
                Ok(None) => {}
            }
            match ready {
                // Readable, yet the step found nothing: the readiness is stale.
                Some(guard) => guard.clear(),
                // Woken since the wake-up was enabled: look again.
                None if woke => {}
                None => {
                    asleep = Some((reactor, woken));
                    return Poll::Pending;
                }
            }
        })
        .await
    }
}

/// An error of tokio's reactor: an OS error from `verb`, or (none) the runtime going away.
#[cfg(feature = "tokio")]
fn reactor_error(what: &'static str, verb: &'static str, e: &std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => Error::Cm { verb, device: None, errno },
        None => Error::NoRuntime { what },
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: live channel; `fd` is a plain field.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd stays open as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl Drop for EventChannel {
    #[doc(alias = "rdma_destroy_event_channel")]
    fn drop(&mut self) {
        // SAFETY: created by `rdma_create_event_channel`; every identifier on it was destroyed
        // first (identifiers own their channel and drop it after themselves).
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}
