//! The event channel: the file descriptor connection-manager events arrive on.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

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
    pub(crate) fn try_get(&self) -> Result<Option<RawEvent>> {
        let mut event = std::ptr::null_mut();
        // SAFETY: live channel; `event` is a valid out-pointer.
        let rc = unsafe { ffi::rdma_get_cm_event(self.raw.as_ptr(), &mut event) };
        if rc == 0 {
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

    /// Takes `step` until it gives a value, waiting up to `timeout` (`poll(2)` on the fd)
    /// whenever it gives `None`.
    ///
    /// `step` is one synchronous attempt: it reads what it needs from the channel and gives
    /// `Ok(None)` only when it found the channel empty (`EAGAIN`). Every blocking wait of the
    /// crate is this loop around a step, and its async form is
    /// [`wait_for_async`](Self::wait_for_async) around the same step.
    pub(crate) fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        self.wait_for_every(timeout, Duration::MAX, what, step)
    }

    /// [`wait_for`](Self::wait_for), taking `step` again at least every `every` while the
    /// channel stays quiet: for a step that also looks at something outside the channel.
    pub(crate) fn wait_for_every<T>(
        &self,
        timeout: Duration,
        every: Duration,
        what: &'static str,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(value) = step()? {
                return Ok(value);
            }
            if deadline.has_passed() {
                return Err(Error::Timeout { what, device: None, after: timeout });
            }
            // At most `every` from now (no bound when the wait has none and `every` is too long
            // to be an instant); rdma-verbs' one blocking fd wait.
            if let Err(e) = rdma_verbs::wait::poll_readable(self.as_fd(), deadline.min(Deadline::after(every))) {
                return Err(Error::from_errno("poll", e.raw_os_error().unwrap_or(libc::EIO)));
            }
        }
    }
}

#[cfg(feature = "tokio")]
impl EventChannel {
    /// A registration of a duplicate of the fd with the current runtime's reactor, for one
    /// wait: a channel is never bound to a runtime (an identifier may be used from one runtime,
    /// then another, or after its first one was dropped), concurrent waits are separate
    /// registrations, and the duplicate is deregistered before it is closed, so no other
    /// file's registration can be hit.
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

    /// Takes `step` until it gives a value, awaiting the fd's readiness whenever it gives
    /// `None`: the async form of [`wait_for`](Self::wait_for), with the same step contract.
    ///
    /// Cancellation-safe: the only await is on readiness, which takes nothing from the channel;
    /// whatever a step takes, it returns at once or keeps (the step's own state).
    ///
    /// Each round first asks for readiness, then takes the step: a future that is pending is
    /// already among the fd's waiters when the step looks, so anything that happens after the
    /// step (an event, or another task changing what the step checks and consuming the event
    /// that did it) wakes it. Readiness is cleared only after a step found the channel empty
    /// while the fd was reported readable (tokio keeps readiness that arrived since).
    pub(crate) async fn wait_for_async<T>(
        &self,
        what: &'static str,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        use std::future::Future;
        use std::task::Poll;
        let reactor = self.watch(what)?;
        loop {
            let mut readable = std::pin::pin!(reactor.ready());
            let polled = std::future::poll_fn(|cx| Poll::Ready(readable.as_mut().poll(cx))).await;
            if let Some(value) = step()? {
                return Ok(value);
            }
            match polled {
                // Readable, yet the step found nothing: the readiness is stale.
                Poll::Ready(guard) => guard.map_err(|e| reactor_error(what, "epoll_wait", &e))?.clear(),
                // A waiter since before the step: wait; the next round takes the step again.
                Poll::Pending => drop(readable.await.map_err(|e| reactor_error(what, "epoll_wait", &e))?),
            }
        }
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
