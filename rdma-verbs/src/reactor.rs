//! Waiting for a verbs file descriptor on the tokio reactor (feature `tokio`): the completion
//! channel's and the async-event fd's.
//!
//! One rule for all of them: each sleep registers its own duplicate of the fd with the reactor
//! of the runtime it runs on ([`Watch`]), and deregisters (and closes) it when it ends. So a
//! channel is never bound to a runtime: a ring used from one runtime, then from another, or
//! after its first runtime was dropped, waits on the runtime it is awaited in. Duplicates make
//! concurrent sleeps on one fd separate registrations (one fd can be registered with an epoll
//! instance only once), and the deregistration can never hit another file that reused the
//! number: the duplicate is closed only after it.

use std::os::fd::{BorrowedFd, OwnedFd};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;

use crate::error::{Error, Result};

/// One sleep's registration of a verbs fd with the current runtime's reactor.
#[derive(Debug)]
pub(crate) struct Watch {
    fd: AsyncFd<OwnedFd>,
    what: &'static str,
}

impl Watch {
    /// Registers a duplicate of `fd` (a non-blocking descriptor the caller keeps open for as
    /// long as the watch) with the current runtime, readable interest.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] (`what`, with the
    /// `errno`) when the fd cannot be duplicated or the reactor refuses it.
    ///
    /// # Panics
    /// As tokio's own IO types: in a runtime built without IO (`enable_io`).
    pub(crate) fn new(fd: BorrowedFd<'_>, what: &'static str, device: &str) -> Result<Self> {
        in_runtime(what)?;
        let dup = fd.try_clone_to_owned().map_err(|e| io_error(what, device, &e))?;
        let fd = AsyncFd::with_interest(dup, Interest::READABLE).map_err(|e| io_error(what, device, &e))?;
        Ok(Watch { fd, what })
    }

    /// Resolves when the fd is readable (or was, and that was not cleared).
    pub(crate) async fn readable(&self) -> Result<AsyncFdReadyGuard<'_, OwnedFd>> {
        self.fd.readable().await.map_err(|e| io_error(self.what, "", &e))
    }
}

/// `Ok` inside a tokio runtime, else [`Error::NoRuntime`]: checked by every async wait before
/// it touches the reactor or a timer (both panic without a runtime).
pub(crate) fn in_runtime(what: &'static str) -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::NoRuntime { what }),
    }
}

/// An error of the reactor while waiting for `what`: an OS error, or (none) the runtime going
/// away.
pub(crate) fn io_error(what: &'static str, device: &str, e: &std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => Error::from_errno(what, (!device.is_empty()).then_some(device), errno),
        None => Error::NoRuntime { what },
    }
}

/// Drops `value` on tokio's blocking pool and awaits it: for drops that wait for the device.
pub(crate) async fn drop_off_runtime<T: Send + 'static>(value: T) -> Result<()> {
    // A join error is a panic in the drop, which the pool caught: report it as one would
    // have been reported in place.
    tokio::task::spawn_blocking(move || drop(value)).await.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic())
        } else {
            Error::NoRuntime { what: "drop" }
        }
    })
}
