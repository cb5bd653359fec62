//! Asynchronous device events: [`AsyncEvent`], [`AsyncEvents`].

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::wait::deadline::Deadline;
use crate::wait::fd::wait_readable;

/// An asynchronous event of a device (`struct ibv_async_event`), already acknowledged.
///
/// Events about a QP name it by number (compare with [`QueuePair::qp_num`](crate::QueuePair::qp_num)).
///
/// # References
/// - [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html)
#[doc(alias = "ibv_async_event")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_PORT_ACTIVE`: the port became active.
    PortActive {
        /// The port.
        port: u8,
    },
    /// `IBV_EVENT_PORT_ERR`: the port left the active state (link down).
    PortError {
        /// The port.
        port: u8,
    },
    /// `IBV_EVENT_LID_CHANGE`, `IBV_EVENT_PKEY_CHANGE`, `IBV_EVENT_GID_CHANGE`,
    /// `IBV_EVENT_SM_CHANGE`, `IBV_EVENT_CLIENT_REREGISTER`: the port's configuration changed.
    PortChanged {
        /// The port.
        port: u8,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP hit an error it cannot report in a completion; it is in the
    /// error state.
    QpFatal {
        /// The QP's number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`: a request or access violation
    /// detected at the responder; the QP is in the error state.
    QpError {
        /// The QP's number.
        qp_num: u32,
    },
    /// `IBV_EVENT_COMM_EST`: a message arrived on a QP in `ReadyToReceive`.
    CommunicationEstablished {
        /// The QP's number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`, `IBV_EVENT_PATH_MIG`, `IBV_EVENT_PATH_MIG_ERR`,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: other QP events.
    QpOther {
        /// The QP's number.
        qp_num: u32,
        /// The raw `enum ibv_event_type` value.
        kind: u32,
    },
    /// `IBV_EVENT_CQ_ERR`: a CQ overran; its QPs are in the error state.
    CqError,
    /// `IBV_EVENT_SRQ_ERR`, `IBV_EVENT_SRQ_LIMIT_REACHED`.
    Srq {
        /// The raw `enum ibv_event_type` value.
        kind: u32,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device failed; every resource of the context is unusable.
    DeviceFatal,
    /// Any other event.
    Other {
        /// The raw `enum ibv_event_type` value.
        kind: u32,
    },
}

impl AsyncEvent {
    /// # Safety
    /// `kind` and `element` come from an event just returned by `ibv_get_async_event` and not
    /// yet acknowledged (so its QP, for QP events, is alive).
    unsafe fn from_raw(kind: u32, element: &crate::ffi_compat::AsyncEventElement) -> Self {
        use ffi::ibv_event_type::*;
        // Values are compared as `u32` (rdma-sys binds `enum ibv_event_type` as a Rust enum), so
        // an event this crate does not know is `Other`, never an invalid enum value.
        let is = |e: crate::ffi_compat::EventType| kind == crate::ffi_compat::event_type_value(e);
        // SAFETY: for port events the union holds the port number.
        let port = || unsafe { element.port_num } as u8;
        // SAFETY: for QP events it holds the QP, alive until the event is acknowledged.
        let qp_num = || unsafe { (*element.qp).qp_num };
        if is(IBV_EVENT_PORT_ACTIVE) {
            AsyncEvent::PortActive { port: port() }
        } else if is(IBV_EVENT_PORT_ERR) {
            AsyncEvent::PortError { port: port() }
        } else if [
            IBV_EVENT_LID_CHANGE,
            IBV_EVENT_PKEY_CHANGE,
            IBV_EVENT_GID_CHANGE,
            IBV_EVENT_SM_CHANGE,
            IBV_EVENT_CLIENT_REREGISTER,
        ]
        .into_iter()
        .any(is)
        {
            AsyncEvent::PortChanged { port: port() }
        } else if is(IBV_EVENT_QP_FATAL) {
            AsyncEvent::QpFatal { qp_num: qp_num() }
        } else if is(IBV_EVENT_QP_REQ_ERR) || is(IBV_EVENT_QP_ACCESS_ERR) {
            AsyncEvent::QpError { qp_num: qp_num() }
        } else if is(IBV_EVENT_COMM_EST) {
            AsyncEvent::CommunicationEstablished { qp_num: qp_num() }
        } else if [IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_QP_LAST_WQE_REACHED]
            .into_iter()
            .any(is)
        {
            AsyncEvent::QpOther { qp_num: qp_num(), kind }
        } else if is(IBV_EVENT_CQ_ERR) {
            AsyncEvent::CqError
        } else if is(IBV_EVENT_SRQ_ERR) || is(IBV_EVENT_SRQ_LIMIT_REACHED) {
            AsyncEvent::Srq { kind }
        } else if is(IBV_EVENT_DEVICE_FATAL) {
            AsyncEvent::DeviceFatal
        } else {
            AsyncEvent::Other { kind }
        }
    }
}

impl Context {
    /// Waits up to `timeout` for the device's next asynchronous event (`poll(2)` on the async
    /// fd, then `ibv_get_async_event()`), and acknowledges it (`ibv_ack_async_event()`).
    ///
    /// Several threads may wait at once: each event goes to one of them. [`Duration::MAX`]
    /// waits without a deadline (see [`Deadline`]).
    ///
    /// # Errors
    /// [`Error::Timeout`] when none came in time; [`Error::Verb`] when reading fails.
    ///
    /// # References
    /// - [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html)
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub fn recv_async_event(&self, timeout: Duration) -> Result<AsyncEvent> {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(event) = self.try_recv_async_event()? {
                return Ok(event);
            }
            wait_readable(self.async_event_fd(), deadline, "ibv_get_async_event", self.name())?;
        }
    }

    /// Awaits the device's next asynchronous event (feature `tokio`):
    /// [`recv_async_event`](Self::recv_async_event) for async code, with no timeout of its own.
    /// The async-event fd is registered with the current runtime's reactor by the library, for
    /// this wait. Several tasks may await at once: each event goes to one of them.
    ///
    /// Cancellation-safe: an event is read only in the step that returns it.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] when reading fails.
    ///
    /// # Panics
    /// In a runtime without IO enabled, as tokio's own types.
    #[cfg(feature = "tokio")]
    #[doc(alias = "ibv_get_async_event")]
    pub async fn recv_async_event_async(&self) -> Result<AsyncEvent> {
        let what = "ibv_get_async_event";
        let watch = crate::wait::reactor::Watch::new(self.async_event_fd(), what, self.name())?;
        loop {
            // Readiness is registered (the watch) before each look, so an event after the look
            // wakes this task.
            if let Some(event) = self.try_recv_async_event()? {
                return Ok(event);
            }
            watch.readable().await?.clear();
        }
    }

    /// Takes the next asynchronous event if one is pending, without waiting.
    ///
    /// # Errors
    /// [`Error::Verb`] when reading fails.
    #[doc(alias = "ibv_get_async_event")]
    pub fn try_recv_async_event(&self) -> Result<Option<AsyncEvent>> {
        // Kept uninitialised-typed: its `event_type` may hold a value the Rust enum lacks.
        let mut raw = std::mem::MaybeUninit::<ffi::ibv_async_event>::zeroed();
        let p = raw.as_mut_ptr();
        // SAFETY: open context; `p` is writable. The fd is non-blocking: it returns at once.
        let rc = unsafe { ffi::ibv_get_async_event(self.as_raw(), p) };
        if rc != 0 {
            let err = Error::last_os_error("ibv_get_async_event", Some(self.name()));
            return match err.errno() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: the verb filled the event; both fields are read through raw pointers as plain
        // data (the type as `u32`, never as the Rust enum).
        let (kind, element) = unsafe {
            (std::ptr::addr_of!((*p).event_type).cast::<u32>().read(), std::ptr::addr_of!((*p).element).read())
        };
        // SAFETY: just returned and not yet acknowledged.
        let event = unsafe { AsyncEvent::from_raw(kind, &element) };
        // SAFETY: acknowledged exactly once, after its QP pointer was read.
        unsafe { ffi::ibv_ack_async_event(p) };
        Ok(Some(event))
    }

    /// The events of this device as an iterator: each `next()` waits up to `timeout`, and the
    /// iterator ends at the first wait that times out.
    pub fn async_events(&self, timeout: Duration) -> AsyncEvents<'_> {
        AsyncEvents { ctx: self, timeout }
    }

    /// The file descriptor, non-blocking, that becomes readable when an asynchronous event is
    /// pending, borrowed for `poll`/`epoll` (or an async runtime's readiness API); then take
    /// the event with [`try_recv_async_event`](Self::try_recv_async_event).
    pub fn async_event_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the fd belongs to the open context and stays open as long as `self`.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.async_fd()) }
    }

    /// The file descriptor that becomes readable when an asynchronous event is pending, for
    /// `poll`/`epoll`.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: open context; `async_fd` is a plain field.
        unsafe { (*self.as_raw()).async_fd }
    }
}

/// An iterator over a device's asynchronous events; see [`Context::async_events`].
#[derive(Debug)]
pub struct AsyncEvents<'ctx> {
    ctx: &'ctx Context,
    timeout: Duration,
}

impl Iterator for AsyncEvents<'_> {
    type Item = Result<AsyncEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        let start = Instant::now();
        match self.ctx.recv_async_event(self.timeout) {
            Err(Error::Timeout { .. }) if start.elapsed() >= self.timeout => None,
            other => Some(other),
        }
    }
}
